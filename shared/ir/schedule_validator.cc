// Schedule validation: structure, pools, per-group collective order, and an abstract run for deadlocks.
#include "shared/ir/schedule_validator.h"

#include <algorithm>
#include <map>
#include <string>

namespace hzp {
namespace {

std::string describe(const Schedule& s, int rank, int op_index) {
  const Op& op = s.program_of(rank).ops[op_index];
  std::string out =
      "rank " + std::to_string(rank) + " op " + std::to_string(op_index) + " [" + to_string(s.streams[op.stream]) + "]";
  if (const auto* c = std::get_if<CollectiveOp>(&op.body))
    out += std::string(" ") + to_string(c->kind) + " role=" + to_string(s.roles[c->role]) +
           " unit=" + std::to_string(c->unit) + " mb=" + std::to_string(c->micro_batch) +
           " bytes=" + std::to_string(c->bytes);
  return out;
}

Status check_structure(const Schedule& s) {
  if (static_cast<int>(s.rank_program.size()) != s.world_size || static_cast<int>(s.rank_groups.size()) != s.world_size)
    return Status::Internal("schedule: rank tables do not cover world size " + std::to_string(s.world_size));
  // Membership of every (rank, role) binding, in one pass over the groups' member lists: linear in the
  // total group size (a search per rank would be quadratic for world-sized groups).
  const size_t roles = s.roles.size();
  std::vector<char> member(static_cast<size_t>(s.world_size) * roles, 0);
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const size_t role = std::find(s.roles.begin(), s.roles.end(), s.groups[g].role) - s.roles.begin();
    if (role == roles) return Status::Internal("schedule: group " + std::to_string(g) + " has an unknown role");
    for (int r : s.groups[g].ranks) {
      if (r < 0 || r >= s.world_size)
        return Status::Internal("schedule: group " + std::to_string(g) + " names rank " + std::to_string(r));
      if (s.rank_groups[r].size() == roles && s.rank_groups[r][role] == static_cast<int>(g))
        member[r * roles + role] = 1;
    }
  }
  for (int r = 0; r < s.world_size; ++r) {
    if (s.rank_program[r] < 0 || s.rank_program[r] >= static_cast<int>(s.programs.size()))
      return Status::Internal("schedule: rank " + std::to_string(r) + " runs a program that does not exist");
    if (s.rank_groups[r].size() != roles)
      return Status::Internal("schedule: rank " + std::to_string(r) + " does not bind every group role");
    for (size_t role = 0; role < roles; ++role)
      if (!member[r * roles + role])
        return Status::Internal("schedule: rank " + std::to_string(r) + " is bound to group " +
                                std::to_string(s.rank_groups[r][role]) + " for role " + to_string(s.roles[role]) +
                                " but is not a member");
  }
  for (size_t p = 0; p < s.programs.size(); ++p) {
    const std::vector<Op>& ops = s.programs[p].ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      const std::string where = "schedule: program " + std::to_string(p) + " op " + std::to_string(i);
      if (op.stream < 0 || op.stream >= static_cast<int>(s.streams.size()))
        return Status::Internal(where + ": no such stream");
      for (int d : op.deps)
        if (d < 0 || d >= static_cast<int>(i))
          return Status::Internal(where + ": dependency " + std::to_string(d) + " is not an earlier op");
      for (int d : op.prev_step_deps)
        if (d < 0 || d >= static_cast<int>(ops.size()))
          return Status::Internal(where + ": previous-step dependency " + std::to_string(d) + " does not exist");
      if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
        if (c->role < 0 || c->role >= static_cast<int>(s.roles.size()))
          return Status::Internal(where + ": no such group role");
        if (c->bytes < 0) return Status::Internal(where + ": negative byte count");
      }
    }
  }
  return Status::Ok();
}

// The gather slot an op names (ComputeOp / CollectiveOp::gather_slot) is held when the op is issued, by
// an acquire for the op's own unit; and with a param_gather pool every compute op and parameter gather
// names one (the executors read the parameters from it).
Status check_gather_slot(const Schedule& s, const std::vector<Op>& ops, const std::vector<std::vector<int>>& holder,
                         int gather_pool, std::size_t i, const std::string& where) {
  int slot = -1, unit = 0;
  bool needs = false;
  if (const auto* c = std::get_if<ComputeOp>(&ops[i].body)) {
    slot = c->gather_slot, unit = c->unit, needs = true;
  } else if (const auto* c = std::get_if<CollectiveOp>(&ops[i].body)) {
    slot = c->gather_slot, unit = c->unit;
    needs = c->purpose == CollectivePurpose::kGatherParams || c->purpose == CollectivePurpose::kGatherSecondary;
  } else {
    return Status::Ok();
  }
  if (slot < 0) {
    if (needs && gather_pool >= 0) return Status::Internal(where + ": names no gather slot");
    return Status::Ok();
  }
  if (gather_pool < 0 || slot >= s.pools[gather_pool].slots)
    return Status::Internal(where + ": names gather slot " + std::to_string(slot) + ", which does not exist");
  const int acquire = holder[gather_pool][slot];
  if (acquire < 0) return Status::Internal(where + ": reads gather slot " + std::to_string(slot) + ", not held");
  if (std::get<BufferAcquireOp>(ops[acquire].body).unit != unit)
    return Status::Internal(where + ": reads gather slot " + std::to_string(slot) + ", held for another unit (op " +
                            std::to_string(acquire) + ")");
  return Status::Ok();
}

Status check_pools(const Schedule& s) {
  int gather_pool = -1;
  for (std::size_t k = 0; k < s.pools.size(); ++k)
    if (s.pools[k].kind == PoolKind::kParamGather) gather_pool = static_cast<int>(k);
  for (size_t p = 0; p < s.programs.size(); ++p) {
    std::vector<std::vector<int>> holder(s.pools.size());  // acquire op holding each slot, -1 free
    std::vector<std::vector<int>> last_release(s.pools.size());
    for (size_t k = 0; k < s.pools.size(); ++k) {
      holder[k].assign(s.pools[k].slots, -1);
      last_release[k].assign(s.pools[k].slots, -1);
    }
    const std::vector<Op>& ops = s.programs[p].ops;
    for (size_t i = 0; i < ops.size(); ++i) {
      const std::string where = "schedule: program " + std::to_string(p) + " op " + std::to_string(i);
      auto slot_ok = [&](int pool, int slot) {
        return pool >= 0 && pool < static_cast<int>(s.pools.size()) && slot >= 0 && slot < s.pools[pool].slots;
      };
      if (const auto* a = std::get_if<BufferAcquireOp>(&ops[i].body)) {
        if (!slot_ok(a->pool, a->slot)) return Status::Internal(where + ": acquire of a slot that does not exist");
        if (holder[a->pool][a->slot] >= 0)
          return Status::Internal(where + ": acquires " + s.pools[a->pool].name + " slot " + std::to_string(a->slot) +
                                  " still held by op " + std::to_string(holder[a->pool][a->slot]));
        const int prev = last_release[a->pool][a->slot];
        if (prev >= 0 && std::find(ops[i].deps.begin(), ops[i].deps.end(), prev) == ops[i].deps.end() &&
            ops[prev].stream != ops[i].stream)
          return Status::Internal(where + ": acquire does not wait for the previous release (op " +
                                  std::to_string(prev) + ")");
        holder[a->pool][a->slot] = static_cast<int>(i);
      } else if (const auto* r = std::get_if<BufferReleaseOp>(&ops[i].body)) {
        if (!slot_ok(r->pool, r->slot)) return Status::Internal(where + ": release of a slot that does not exist");
        if (holder[r->pool][r->slot] < 0) return Status::Internal(where + ": releases a slot it does not hold");
        holder[r->pool][r->slot] = -1;
        last_release[r->pool][r->slot] = static_cast<int>(i);
      } else {
        HZP_RETURN_IF_ERROR(check_gather_slot(s, ops, holder, gather_pool, i, where));
      }
    }
  }
  return Status::Ok();
}

// The collectives a program issues on one role, in program (= issue) order.
std::vector<int> collectives_on_role(const Program& program, int role) {
  std::vector<int> out;
  for (size_t i = 0; i < program.ops.size(); ++i)
    if (const auto* c = std::get_if<CollectiveOp>(&program.ops[i].body); c && c->role == role)
      out.push_back(static_cast<int>(i));
  return out;
}

bool same_collective(const CollectiveOp& a, const CollectiveOp& b) {
  return a.kind == b.kind && a.purpose == b.purpose && a.bytes == b.bytes && a.dtype == b.dtype &&
         a.payload == b.payload && a.unit == b.unit && a.micro_batch == b.micro_batch;
}

Status check_collective_order(const Schedule& s) {
  std::map<std::pair<int, int>, std::vector<int>> seq;  // (program, role) -> op indices
  for (size_t g = 0; g < s.groups.size(); ++g) {
    const ProcessGroup& group = s.groups[g];
    if (group.ranks.size() < 2) continue;
    const int role = static_cast<int>(std::find(s.roles.begin(), s.roles.end(), group.role) - s.roles.begin());
    const int first = group.ranks.front();
    auto sequence = [&](int rank) -> const std::vector<int>& {
      auto key = std::make_pair(s.rank_program[rank], role);
      auto it = seq.find(key);
      if (it == seq.end()) it = seq.emplace(key, collectives_on_role(s.program_of(rank), role)).first;
      return it->second;
    };
    const std::vector<int>& ref = sequence(first);
    for (int rank : group.ranks) {
      if (s.rank_program[rank] == s.rank_program[first]) continue;
      const std::vector<int>& mine = sequence(rank);
      const size_t n = std::min(ref.size(), mine.size());
      for (size_t k = 0; k <= n; ++k) {
        if (k == n) {
          if (ref.size() == mine.size()) break;
          return Status::Internal("deadlock: group " + std::to_string(g) + " (" + to_string(group.role) + "): rank " +
                                  std::to_string(first) + " issues " + std::to_string(ref.size()) +
                                  " collectives on it but rank " + std::to_string(rank) + " issues " +
                                  std::to_string(mine.size()));
        }
        const auto& a = std::get<CollectiveOp>(s.program_of(first).ops[ref[k]].body);
        const auto& b = std::get<CollectiveOp>(s.program_of(rank).ops[mine[k]].body);
        if (!same_collective(a, b))
          return Status::Internal("deadlock: group " + std::to_string(g) + " (" + to_string(group.role) +
                                  ") collective #" + std::to_string(k) + ": " + describe(s, first, ref[k]) + " but " +
                                  describe(s, rank, mine[k]) +
                                  " — members must issue the same collectives in the "
                                  "same order");
      }
    }
  }
  return Status::Ok();
}

// Abstract execution with zero durations. `ranks` are the ranks executed; collectives of groups with
// members outside `ranks` are treated as matched (valid when those members run an identical program).
class AbstractRun {
 public:
  AbstractRun(const Schedule& s, const std::vector<int>& ranks, bool lockstep)
      : s_(s), ranks_(ranks), lockstep_(lockstep), st_(ranks.size()) {
    for (size_t i = 0; i < ranks.size(); ++i) {
      const Program& prog = s.program_of(ranks[i]);
      slot_of_rank_[ranks[i]] = static_cast<int>(i);
      st_[i].done.assign(prog.ops.size(), 0);
      st_[i].stream_ops.assign(s.streams.size(), {});
      st_[i].head.assign(s.streams.size(), 0);
      st_[i].remaining = prog.ops.size();
      for (size_t k = 0; k < prog.ops.size(); ++k) st_[i].stream_ops[prog.ops[k].stream].push_back(static_cast<int>(k));
    }
  }

  // Runs every stream head whose dependencies are done (a collective: once every executed member has it
  // ready too) until nothing moves; then names the first rank left with ops, and what it waits for.
  Status run() {
    bool progress = true;
    while (progress) {
      progress = false;
      for (size_t i = 0; i < ranks_.size(); ++i)
        for (size_t stream = 0; stream < s_.streams.size(); ++stream)
          while (st_[i].head[stream] < st_[i].stream_ops[stream].size() && step(i, stream)) progress = true;
    }
    for (size_t i = 0; i < ranks_.size(); ++i) {
      if (st_[i].remaining == 0) continue;
      std::string blocked;
      for (size_t stream = 0; stream < s_.streams.size(); ++stream)
        if (st_[i].head[stream] < st_[i].stream_ops[stream].size())
          blocked += "\n  waiting: " + describe(s_, ranks_[i], head_op(i, stream));
      return Status::Internal("deadlock: rank " + std::to_string(ranks_[i]) + " cannot finish (" +
                              std::to_string(st_[i].remaining) + " ops left)" + blocked);
    }
    return Status::Ok();
  }

 private:
  struct RankState {
    std::vector<char> done;
    std::vector<std::vector<int>> stream_ops;  // op indices per stream
    std::vector<size_t> head;                  // next position per stream
    size_t remaining = 0;
  };

  int head_op(size_t i, size_t stream) const { return st_[i].stream_ops[stream][st_[i].head[stream]]; }
  bool deps_done(size_t i, int op) const {
    for (int d : s_.program_of(ranks_[i]).ops[op].deps)
      if (!st_[i].done[d]) return false;
    return true;
  }
  void complete(size_t i, size_t stream) {
    st_[i].done[head_op(i, stream)] = 1;
    ++st_[i].head[stream];
    --st_[i].remaining;
  }
  // The stream of executed rank j (global rank `member`) whose head is a collective on `group`, or -1.
  int stream_on_group(size_t j, int member, int group) const {
    for (size_t ms = 0; ms < s_.streams.size(); ++ms) {
      if (st_[j].head[ms] >= st_[j].stream_ops[ms].size()) continue;
      const auto* mc = std::get_if<CollectiveOp>(&s_.program_of(member).ops[head_op(j, ms)].body);
      if (mc && s_.rank_groups[member][mc->role] == group) return static_cast<int>(ms);
    }
    return -1;
  }

  // Runs the head of (rank i, stream) if it can run now.
  bool step(size_t i, size_t stream) {
    const int op = head_op(i, stream);
    if (!deps_done(i, op)) return false;
    const auto* c = std::get_if<CollectiveOp>(&s_.program_of(ranks_[i]).ops[op].body);
    if (c != nullptr && !lockstep_) {
      // Every member executed here must have this same collective ready at the head of its stream.
      const int group = s_.rank_groups[ranks_[i]][c->role];
      std::vector<std::pair<size_t, int>> members;  // (executed rank, stream)
      for (int member : s_.groups[group].ranks) {
        auto it = slot_of_rank_.find(member);
        if (it == slot_of_rank_.end() || it->second == static_cast<int>(i)) continue;
        const size_t j = it->second;
        const int ms = stream_on_group(j, member, group);
        if (ms < 0 || !deps_done(j, head_op(j, ms))) return false;
        members.emplace_back(j, ms);
      }
      for (const auto& [j, ms] : members) complete(j, ms);  // the collective completes on every member at once
    }
    complete(i, stream);
    return true;
  }

  const Schedule& s_;
  const std::vector<int>& ranks_;
  const bool lockstep_;
  std::vector<RankState> st_;
  std::map<int, int> slot_of_rank_;  // global rank -> index in ranks_
};

Status check_progress(const Schedule& s, const std::vector<int>& ranks, bool lockstep) {
  return AbstractRun(s, ranks, lockstep).run();
}

}  // namespace

Status validate_schedule(const Schedule& s) {
  HZP_RETURN_IF_ERROR(check_structure(s));
  HZP_RETURN_IF_ERROR(check_pools(s));
  HZP_RETURN_IF_ERROR(check_collective_order(s));
  if (s.programs.size() == 1) return check_progress(s, {0}, /*lockstep=*/true);
  // One rank per program: ranks that share a program are interchangeable (every layout is a product of
  // identical blocks, e.g. pipeline stages of tensor x data ranks), so the others move as their program's
  // representative does, and their collectives with it are matched.
  std::vector<int> first(s.programs.size(), -1);
  for (int r = 0; r < s.world_size; ++r)
    if (first[s.rank_program[r]] < 0) first[s.rank_program[r]] = r;
  std::vector<int> ranks;
  for (int r : first)
    if (r >= 0) ranks.push_back(r);
  return check_progress(s, ranks, /*lockstep=*/false);
}

}  // namespace hzp
