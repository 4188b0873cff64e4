// The SimGrid executor: one actor per (rank, stream) replaying the schedule IR (see executor.h).
#include "sim/executor.h"

#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/ConditionVariable.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Mutex.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <variant>

#include "shared/cost/collective_cost.h"
#include "sim/collective.h"
#include "sim/collectives/actor_pool.h"
#include "sim/platform.h"
#include "sim/symmetry.h"

namespace hzp::sim {
namespace sg4 = simgrid::s4u;
namespace {

bool g_engine_used = false;  // SimGrid keeps one clock per process: one simulation per process.

// One collective call in flight: members arrive, the last one runs the flows, everyone leaves.
struct Instance {
  int arrived = 0;
  int left = 0;
  int pending = 0;  // symmetric: groups of the class still transferring
  bool done = false;
  double start = 0;
  sg4::MutexPtr mutex = sg4::Mutex::create();
  sg4::ConditionVariablePtr cv = sg4::ConditionVariable::create();
};

struct RankState {
  std::vector<int> completed_step;  // per op: the last step in which it completed (-1: never)
  std::vector<int> collective_seq;  // per role: collectives this rank has issued on it
  sg4::MutexPtr mutex = sg4::Mutex::create();
  // Per stream: the op (and step) it is blocked on, if any, and the condition variable it waits on; an op
  // completing wakes only a stream blocked on that op (a broadcast to every stream of the rank cost one
  // wake-up per op per waiting stream).
  struct Waiter {
    bool blocked = false;
    int op = -1;
    int step = 0;
    sg4::ConditionVariablePtr cv = sg4::ConditionVariable::create();
  };
  std::vector<Waiter> waiters;
  double live_activations = 0;
  double peak_activations = 0;
  double compute_busy = 0;
  double comm_busy = 0;
  bool recorded = false;
  // cluster.overlap_slowdown: collectives of this GPU transferring, and compute ops waiting on `rate_cv` for
  // that count to change between none and some (their speed changes then).
  int comm_in_flight = 0;
  int computing = 0;
  sg4::ConditionVariablePtr rate_cv = sg4::ConditionVariable::create();
};

class Executor {
 public:
  Executor(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule, const SimOptions& options,
           const Platform& platform, const SymmetryPlan& symmetry)
      : symmetry_(symmetry),
        scenario_(scenario),
        cost_(cost),
        schedule_(schedule),
        options_(options),
        platform_(platform),
        roofline_(scenario.cluster),
        spread_(options.durations ? *options.durations : roofline_, scenario.cluster.compute_spread),
        durations_(scenario.cluster.compute_spread > 0 ? spread_
                   : options.durations                 ? *options.durations
                                                       : roofline_) {
    const ClusterSpec& c = scenario.cluster;
    for (const ProcessGroup& g : schedule.groups) shapes_.push_back(group_shape(c, g));
    ranks_.resize(schedule.world_size);
    for (int r = 0; r < schedule.world_size; ++r) {
      ranks_[r].completed_step.assign(schedule.program_of(r).ops.size(), -1);
      ranks_[r].collective_seq.assign(schedule.roles.size(), 0);
      ranks_[r].waiters.resize(schedule.streams.size());
    }
    result_.timeline_ranks = timeline_sample(schedule.world_size, schedule.gpus_per_node, options.timeline_max_ranks);
    // Pipelined, every stage shows: its first GPU is recorded too.
    if (schedule.programs.size() > 1) {
      std::vector<int> first(schedule.programs.size(), -1);
      for (int r = 0; r < schedule.world_size; ++r)
        if (first[schedule.rank_program[r]] < 0) first[schedule.rank_program[r]] = r;
      std::vector<int>& sample = result_.timeline_ranks;
      for (int r : first)
        if (r >= 0 && std::find(sample.begin(), sample.end(), r) == sample.end()) sample.push_back(r);
      std::sort(sample.begin(), sample.end());
    }
    for (int r : result_.timeline_ranks) ranks_[rep(r)].recorded = true;
    // Activation bytes per (unit, module kind), in the core's unit numbering (ComputeOp::unit).
    for (const ModuleCost& m : cost.modules)
      activation_of_[{unit_of_module(m, scenario.model.layers), static_cast<int>(m.kind)}] += m.activation_bytes;
    // Per program, each stream's ops in program order.
    for (const Program& p : schedule.programs) {
      std::vector<std::vector<int>> per_stream(schedule.streams.size());
      for (size_t i = 0; i < p.ops.size(); ++i) per_stream[p.ops[i].stream].push_back(static_cast<int>(i));
      stream_ops_.push_back(std::move(per_stream));
    }
  }

  void spawn() {
    for (int r = 0; r < schedule_.world_size; ++r)
      for (size_t s = 0; s < schedule_.streams.size() && rep(r) == r; ++s) {
        if (stream_ops_[schedule_.rank_program[r]][s].empty()) continue;
        sg4::Actor::create("r" + std::to_string(r) + "." + to_string(schedule_.streams[s]), platform_.gpus[r],
                           [this, r, s] { run_stream(r, static_cast<int>(s)); });
      }
  }

  SimResult finish(double wall_s) {
    SimResult& out = result_;
    const double steps = options_.steps;
    const int world = schedule_.world_size;
    out.gpus = world;
    out.steps = options_.steps;
    out.total_time_s = sg4::Engine::get_clock();
    out.step_time_s = out.total_time_s / steps;
    double comm_sum = 0;
    for (int rank = 0; rank < world; ++rank) {
      const RankState& r = ranks_[rep(rank)];
      out.compute_s = std::max(out.compute_s, r.compute_busy / steps);
      comm_sum += r.comm_busy / steps;
    }
    out.comm_s = comm_sum / world;
    out.comm_bytes_intra_node = traffic_.intra_node_bytes / world / steps;
    out.comm_bytes_inter_node = traffic_.inter_node_bytes / world / steps;
    // Memory: states and pools are allocated once (core memory model, per pipeline stage); activations as
    // measured.
    std::vector<MemoryBreakdown> fixed;
    for (std::size_t p = 0; p < schedule_.programs.size(); ++p)
      fixed.push_back(memory_of_program(cost_, schedule_, static_cast<int>(p)));
    double worst = -1;
    for (int r = 0; r < world; ++r) {
      MemoryBreakdown m = fixed[schedule_.rank_program[r]];
      m.activations = ranks_[rep(r)].peak_activations + cost_.transient_bytes;
      if (m.total() > worst) {
        worst = m.total();
        out.memory = m;
        out.peak_memory_rank = r;
      }
    }
    derive_performance(scenario_, cost_, out);
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    const double capacity = scenario_.cluster.gpu.memory_bytes;
    char verdict[256];
    std::snprintf(verdict, sizeof verdict, "%s: rank %d peaks at %.2f GiB of %.2f GiB",
                  out.fits_memory ? "fits" : "OUT OF MEMORY", out.peak_memory_rank, worst / GiB, capacity / GiB);
    out.memory_verdict = verdict;
    out.sim_wall_s = wall_s;
    out.ops_simulated = ops_simulated_;
    out.symmetric = symmetry_.enabled;
    // A rank that followed its representative has its timeline.
    if (symmetry_.enabled) {
      const std::size_t recorded = out.spans.size();
      for (int r : out.timeline_ranks)
        if (rep(r) != r)
          for (std::size_t i = 0; i < recorded; ++i)
            if (out.spans[i].rank == rep(r)) {
              out.spans.push_back(out.spans[i]);
              out.spans.back().rank = r;
            }
    }
    return std::move(out);
  }

 private:
  // The first dependency of `op` (in `step`) not yet complete, as (op index, the step it must reach).
  std::optional<std::pair<int, int>> unmet_dep(const RankState& st, const Op& op, int step) const {
    for (int d : op.deps)
      if (st.completed_step[d] < step) return std::pair{d, step};
    for (int d : op.prev_step_deps)
      if (st.completed_step[d] < step - 1) return std::pair{d, step - 1};
    return std::nullopt;
  }

  void run_stream(int rank, int stream) {
    RankState& st = ranks_[rank];
    const Program& program = schedule_.program_of(rank);
    const std::vector<int>& ops = stream_ops_[schedule_.rank_program[rank]][stream];
    const auto started = std::chrono::steady_clock::now();
    auto last_progress = started;
    for (int step = 0; step < options_.steps; ++step) {
      for (size_t k = 0; k < ops.size(); ++k) {
        const int index = ops[k];
        const Op& op = program.ops[index];
        // Wait for dependencies on other streams of this rank, one at a time: the op blocked on notifies this
        // stream when it completes. Actors run one at a time and only yield inside simcalls, so the
        // unlocked check cannot race.
        if (auto blocker = unmet_dep(st, op, step)) {
          RankState::Waiter& w = st.waiters[stream];
          std::unique_lock<sg4::Mutex> lock(*st.mutex);
          for (; blocker; blocker = unmet_dep(st, op, step)) {
            w.blocked = true;
            w.op = blocker->first;
            w.step = blocker->second;
            while (st.completed_step[w.op] < w.step) w.cv->wait(lock);
          }
          w.blocked = false;
        }
        const double start = sg4::Engine::get_clock();
        const double transfer_start = execute(rank, op, start);
        ops_executed_ += symmetry_.enabled ? symmetry_.ranks_of_program[schedule_.rank_program[rank]] : 1;
        ++ops_simulated_;
        if (st.recorded) result_.spans.push_back({rank, index, step, start, sg4::Engine::get_clock(), transfer_start});
        st.completed_step[index] = step;
        for (RankState::Waiter& w : st.waiters)
          if (w.blocked && w.op == index && step >= w.step) w.cv->notify_one();
        if (options_.progress && rank == 0 && stream == 0 && k % 256 == 0) {
          const auto now = std::chrono::steady_clock::now();
          if (std::chrono::duration<double>(now - last_progress).count() > options_.progress_interval_s) {
            last_progress = now;
            // Rank 0's compute stream stands for the whole: the ETA assumes the rest runs at the rate so far.
            const double elapsed = std::chrono::duration<double>(now - started).count();
            const double done = (static_cast<double>(step) * static_cast<double>(ops.size()) + static_cast<double>(k)) /
                                (static_cast<double>(options_.steps) * static_cast<double>(ops.size()));
            std::fprintf(stderr,
                         "sim: step %d/%d, rank 0 op %zu/%zu, simulated %.3f s, %lld ops executed, elapsed %.0f s, "
                         "ETA %.0f s\n",
                         step + 1, options_.steps, k, ops.size(), sg4::Engine::get_clock(), ops_executed_, elapsed,
                         done > 0 ? elapsed * (1 - done) / done : 0.0);
          }
        }
      }
    }
  }

  // Executes one op from the calling stream actor; returns when it is complete. For collectives, returns
  // the time its flows started (the last member's arrival).
  double execute(int rank, const Op& op, double start) {
    RankState& st = ranks_[rank];
    if (const auto* comp = std::get_if<ComputeOp>(&op.body)) {
      st.compute_busy += run_compute(st, durations_.compute_s(rank, *comp));
      const double act = activation(comp->unit, comp->module);
      if (comp->phase == Phase::kForward) st.live_activations += act;
      if (comp->phase == Phase::kBackward) st.live_activations -= act;
      st.peak_activations = std::max(st.peak_activations, st.live_activations);
      return start;
    }
    if (const auto* opt = std::get_if<OptimizerStepOp>(&op.body)) {
      st.compute_busy += run_compute(st, durations_.optimizer_s(rank, *opt));
      return start;
    }
    if (const auto* coll = std::get_if<CollectiveOp>(&op.body)) return collective(rank, *coll);
    return start;  // buffer acquire / release: the pool is allocated once; nothing to wait for
  }

  // Runs `work` seconds of compute (its time alone) and returns the time it took: slowed to 1 / (1 +
  // cluster.overlap_slowdown) of its speed while a collective of this GPU is transferring.
  double run_compute(RankState& st, double work) {
    const double slowdown = scenario_.cluster.overlap_slowdown;
    if (slowdown <= 0) {
      sg4::this_actor::sleep_for(work);
      return work;
    }
    const double begin = sg4::Engine::get_clock();
    while (work > 0) {
      // The rate is read once this op counts as computing: taking the lock is a simcall, and a collective
      // starting meanwhile notifies only ops that count (reading it first lost that change).
      std::unique_lock<sg4::Mutex> lock(*st.mutex);
      ++st.computing;
      const double rate = st.comm_in_flight > 0 ? 1 / (1 + slowdown) : 1;
      const double from = sg4::Engine::get_clock();
      const std::cv_status status = st.rate_cv->wait_for(lock, work / rate);
      --st.computing;
      if (status == std::cv_status::timeout) break;
      work -= (sg4::Engine::get_clock() - from) * rate;
    }
    return sg4::Engine::get_clock() - begin;
  }

  // A collective's transfer starts (+1) or ends (-1) on every member: compute running meanwhile changes
  // speed. Counted from the transfer's start, not from a member's arrival: a member waiting for its peers
  // holds only its kernel's few spinning SMs, where the measured slowdown comes from data moving (SM copies,
  // HBM and link traffic).
  void comm_in_flight(const ProcessGroup& group, int delta) {
    if (scenario_.cluster.overlap_slowdown <= 0) return;
    for (int r : group.ranks) {
      RankState& st = ranks_[r];
      const bool was = st.comm_in_flight > 0;
      st.comm_in_flight += delta;
      if (was != (st.comm_in_flight > 0) && st.computing > 0) st.rate_cv->notify_all();
    }
  }

  // A collective's flows on `group_index` (the calling actor runs them).
  CollectiveTraffic run_group(int group_index, const CollectiveOp& op) {
    const double bytes = static_cast<double>(op.bytes);
    const GroupShape& shape = shapes_[group_index];
    const CollectiveAlgorithm algorithm = choose_algorithm(scenario_.cluster, op.kind, bytes, shape);
    return run_collective(platform_, {op.kind, bytes, &schedule_.groups[group_index], algorithm,
                                      choose_protocol(scenario_.cluster, algorithm, op.kind, bytes, shape), op.root});
  }

  // The instance of `key`, created on first use. Creating its SimGrid mutex and condition variable are
  // simcalls: other actors may run meanwhile and create the same instance. Build it first, then look again
  // before inserting.
  Instance& instance(long long key) {
    auto it = instances_.find(key);
    if (it == instances_.end()) {
      Instance fresh;
      it = instances_.find(key);
      if (it == instances_.end()) it = instances_.emplace(key, std::move(fresh)).first;
    }
    return it->second;
  }

  int rep(int rank) const { return symmetry_.enabled ? symmetry_.rep_of[rank] : rank; }

  double collective(int rank, const CollectiveOp& op) {
    RankState& st = ranks_[rank];
    const int group_index = schedule_.rank_groups[rank][op.role];
    const ProcessGroup& group = schedule_.groups[group_index];
    const long long seq = st.collective_seq[op.role]++;
    if (group.ranks.size() <= 1) return sg4::Engine::get_clock();
    if (symmetry_.enabled) return symmetric_collective(rank, op, group_index, seq);
    const long long key = static_cast<long long>(group_index) << 32 | seq;
    Instance& inst = instance(key);
    ++inst.arrived;
    if (inst.arrived == static_cast<int>(group.ranks.size())) {
      // Last to arrive: every member is at the head of its stream, so the collective runs now.
      inst.start = sg4::Engine::get_clock();
      comm_in_flight(group, +1);
      const std::optional<double> recorded =
          options_.collectives ? options_.collectives->transfer_s(group_index, seq) : std::nullopt;
      CollectiveTraffic t;
      if (recorded)
        sg4::this_actor::sleep_for(*recorded);
      else
        t = run_group(group_index, op);
      traffic_.intra_node_bytes += t.intra_node_bytes;
      traffic_.inter_node_bytes += t.inter_node_bytes;
      ++result_.collectives;
      if (!recorded) ++result_.collectives_with_flows;
      comm_in_flight(group, -1);
      inst.done = true;
      inst.cv->notify_all();
    }
    return leave(st, inst, key, static_cast<int>(group.ranks.size()));
  }

  // A member leaves a collective instance once it is done (waiting for it unless it ran it): its transfer
  // time is counted, and the last of `members` to leave drops the instance. Returns the transfer's start.
  double leave(RankState& st, Instance& inst, long long key, int members) {
    if (!inst.done) {
      std::unique_lock<sg4::Mutex> lock(*inst.mutex);
      while (!inst.done) inst.cv->wait(lock);
    }
    const double transfer_start = inst.start;
    st.comm_busy += sg4::Engine::get_clock() - transfer_start;
    if (++inst.left == members) instances_.erase(key);
    return transfer_start;
  }

  // symmetry.h: the n-th collective of a group class starts when the representatives of its programs have
  // arrived; every group of the class transfers at once (one helper actor per group past the first), and
  // the representatives leave when the last group is done.
  double symmetric_collective(int rank, const CollectiveOp& op, int group_index, long long seq) {
    RankState& st = ranks_[rank];
    const int cls = symmetry_.group_class[group_index];
    const int expected = symmetry_.class_arrivals[cls];
    const long long key = static_cast<long long>(cls) << 32 | seq;
    Instance& inst = instance(key);
    if (++inst.arrived == expected) {
      inst.start = sg4::Engine::get_clock();
      const std::vector<std::pair<int, int>>& groups = symmetry_.simulated[cls];
      for (const auto& [g, count] : groups) comm_in_flight(schedule_.groups[g], +1);
      inst.pending = static_cast<int>(groups.size());
      const auto transfer = [this, &inst, op](int g, int count) {
        const CollectiveTraffic t = run_group(g, op);
        traffic_.intra_node_bytes += t.intra_node_bytes * count;  // and the left-out groups it stands for
        traffic_.inter_node_bytes += t.inter_node_bytes * count;
        if (--inst.pending == 0) inst.cv->notify_all();
      };
      for (std::size_t i = 1; i < groups.size(); ++i) {
        const auto [g, count] = groups[i];
        helpers_.run(platform_.gpus.front(), [transfer, g, count] { transfer(g, count); });
      }
      transfer(groups.front().first, groups.front().second);
      {
        std::unique_lock<sg4::Mutex> lock(*inst.mutex);
        while (inst.pending > 0) inst.cv->wait(lock);
      }
      result_.collectives += static_cast<long long>(symmetry_.class_groups[cls].size());
      result_.collectives_with_flows += static_cast<long long>(groups.size());
      for (const auto& [g, count] : groups) comm_in_flight(schedule_.groups[g], -1);
      inst.done = true;
      inst.cv->notify_all();
    }
    return leave(st, inst, key, expected);
  }

  double activation(int unit, ModuleKind kind) const {
    auto it = activation_of_.find({unit, static_cast<int>(kind)});
    return it == activation_of_.end() ? 0 : it->second;
  }

  const SymmetryPlan& symmetry_;
  const Scenario& scenario_;
  const ModelCost& cost_;
  const Schedule& schedule_;
  const SimOptions& options_;
  const Platform& platform_;
  const RooflineDurations roofline_;
  const SpreadDurations spread_;  // cluster.compute_spread > 0: per-GPU speed on top of the source
  const DurationModel& durations_;
  std::vector<GroupShape> shapes_;
  std::vector<RankState> ranks_;
  std::vector<std::vector<std::vector<int>>> stream_ops_;  // [program][stream] -> op indices
  std::map<std::pair<int, int>, double> activation_of_;    // (unit, module kind) -> bytes
  std::unordered_map<long long, Instance> instances_;
  ActorPool helpers_{"collective-helper"};  // run the transfers of a symmetric collective's other groups
  CollectiveTraffic traffic_;
  long long ops_executed_ = 0;
  long long ops_simulated_ = 0;
  SimResult result_;

 public:
  long long ops_executed() const { return ops_executed_; }
};

}  // namespace

std::vector<int> timeline_sample(int world, int gpus_per_node, int max_ranks) {
  std::vector<int> ranks;
  if (world <= max_ranks) {
    for (int r = 0; r < world; ++r) ranks.push_back(r);
    return ranks;
  }
  for (int r = 0; r < std::min(gpus_per_node, max_ranks); ++r) ranks.push_back(r);
  const int nodes = world / gpus_per_node;
  const int more = max_ranks - static_cast<int>(ranks.size());
  for (int i = 1; i <= more && nodes > 1; ++i) {
    const int node = static_cast<int>(static_cast<long long>(i) * (nodes - 1) / more);
    const int rank = std::max(node, 1) * gpus_per_node;
    if (std::find(ranks.begin(), ranks.end(), rank) == ranks.end()) ranks.push_back(rank);
  }
  return ranks;
}

namespace {

// The counts of cost.h a schedule gives before there is a platform: ops executed, actors and the ops the
// timeline records (of the sampled ranks), exactly.
// Flows known before the platform is built, at least: a collective whose group spans k nodes connects them,
// so it starts k - 1 inter-node flows or more whatever its algorithm (each instance once: the most
// collectives any simulated member of the group runs on it). Only collectives of at least 1 KiB per member
// count, so that no flow of the bound is one a dry run drops as under a byte. At 131,072 GPUs the build
// took ~40 s before its flows refused the simulation; this bound refuses it before the build.
void add_flow_lower_bound(SimCost& cost, const Schedule& schedule, int steps, const SymmetryPlan& symmetry) {
  std::map<int, std::map<int, int>> per_group;  // group -> simulated member -> its collectives on the group
  for (int r = 0; r < schedule.world_size; ++r) {
    if (symmetry.enabled && symmetry.rep_of[r] != r) continue;
    for (const Op& op : schedule.program_of(r).ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
        const int g = schedule.rank_groups[r][c->role];
        if (g >= 0 && c->bytes >= 1024 * static_cast<std::int64_t>(schedule.groups[g].ranks.size())) ++per_group[g][r];
      }
  }
  double flows = 0, instances = 0;
  for (const auto& [g, members] : per_group) {
    std::set<int> nodes;
    for (int rank : schedule.groups[g].ranks) nodes.insert(rank / schedule.gpus_per_node);
    int most = 0;
    for (const auto& [rank, n] : members) most = std::max(most, n);
    instances += most;
    flows += static_cast<double>(most) * static_cast<double>(nodes.size() - 1);
  }
  if (flows <= 0) return;
  cost.collectives = instances * steps;
  cost.flows = flows * steps;
  cost.flows_at_least = true;
}

SimCost schedule_counts(const Schedule& schedule, int steps, int timeline_max_ranks, const SymmetryPlan& symmetry) {
  SimCost cost;
  for (int r : timeline_sample(schedule.world_size, schedule.gpus_per_node, timeline_max_ranks))
    cost.recorded_ops += static_cast<double>(schedule.program_of(r).ops.size()) * steps;
  for (int r = 0; r < schedule.world_size; ++r) {
    if (symmetry.enabled && symmetry.rep_of[r] != r) continue;  // follows its representative
    const Program& p = schedule.program_of(r);
    std::vector<char> used(schedule.streams.size(), 0);
    for (const Op& op : p.ops) used[op.stream] = 1;
    cost.ops += static_cast<double>(p.ops.size()) * steps;
    cost.actors += static_cast<double>(std::count(used.begin(), used.end(), 1));
  }
  add_flow_lower_bound(cost, schedule, steps, symmetry);
  return cost;
}

// Adds the flows of a dry run of each distinct collective (group, kind, algorithm, root, size) on the built
// platform, for the groups whose flows run (a symmetric simulation's SymmetryPlan::simulated, else all).
// Every group of a role is taken to run its collectives at the same time as the others (the symmetric load
// of a schedule), so a role's flows in flight are its groups' together.
void add_flow_counts(SimCost& cost, const Schedule& schedule, const ClusterSpec& cluster, const Platform& platform,
                     const SymmetryPlan& symmetry, int steps) {
  std::vector<char> runs(schedule.groups.size(), symmetry.enabled ? 0 : 1);
  for (const auto& groups : symmetry.simulated)
    for (const auto& [g, stands_for] : groups) runs[g] = 1;
  std::vector<double> groups_of_role(schedule.roles.size(), 0);
  {
    std::vector<char> seen(schedule.groups.size(), 0);
    for (int r = 0; r < schedule.world_size; ++r)
      for (size_t role = 0; role < schedule.roles.size(); ++role) {
        const int g = schedule.rank_groups[r][role];
        if (g >= 0 && runs[g] && !seen[g]) {
          seen[g] = 1;
          ++groups_of_role[role];
        }
      }
  }
  std::map<std::tuple<int, int, int, int, std::int64_t>, FlowTally> tallies;
  std::vector<std::optional<GroupShape>> shapes(schedule.groups.size());  // group_shape is O(p log p): once each
  SimCost one_step;
  for (int r = 0; r < schedule.world_size; ++r)
    for (const Op& op : schedule.program_of(r).ops) {
      const auto* c = std::get_if<CollectiveOp>(&op.body);
      if (c == nullptr) continue;
      const int g = schedule.rank_groups[r][c->role];
      const ProcessGroup& group = schedule.groups[g];
      if (group.ranks.size() <= 1 || group.ranks.front() != r || !runs[g])
        continue;  // one instance, counted by its first member
      const double bytes = static_cast<double>(c->bytes);
      if (!shapes[g]) shapes[g] = group_shape(cluster, group);
      const GroupShape& shape = *shapes[g];
      const CollectiveAlgorithm algorithm = choose_algorithm(cluster, c->kind, bytes, shape);
      // The size is part of the key: a protocol's chunks, and which flows are under a byte, depend on it.
      const auto key = std::make_tuple(g, static_cast<int>(c->kind), static_cast<int>(algorithm), c->root, c->bytes);
      auto it = tallies.find(key);
      if (it == tallies.end()) {
        FlowTally t;
        run_collective(platform, {c->kind, bytes, &group, algorithm,
                                  choose_protocol(cluster, algorithm, c->kind, bytes, shape), c->root, &t});
        it = tallies.emplace(key, t).first;
      }
      const double concurrent = std::max(1.0, groups_of_role[c->role]);
      one_step.collectives += 1;
      one_step.flows += it->second.flows;
      one_step.peak_flows = std::max(one_step.peak_flows, it->second.peak * concurrent);
      one_step.pair_work += it->second.pair_work;
      one_step.ecmp_pair_work += it->second.ecmp_pair_work * concurrent;
    }
  cost.collectives = one_step.collectives * steps;
  cost.flows = one_step.flows * steps;
  cost.peak_flows = one_step.peak_flows;
  cost.pair_work = one_step.pair_work * steps;
  cost.ecmp_pair_work = one_step.ecmp_pair_work * steps;
}

Result<SimResult> simulate_here(const Compiled& compiled, const SimOptions& options) {
  const Scenario& scenario = compiled.scenario;
  const ModelCost& cost = compiled.cost;
  const Schedule& schedule = compiled.schedule;
  if (g_engine_used) return Status::Internal("simulate: one SimGrid simulation per process (SimGrid keeps its clock)");
  if (options.steps < 1)
    return Status::InvalidInput("--steps: must be at least 1, got " + std::to_string(options.steps));
  g_engine_used = true;
  int argc = 2;
  char arg0[] = "hzp";
  char arg1[] = "--log=root.thresh:warning";
  char* argv[] = {arg0, arg1, nullptr};
  sg4::Engine engine(&argc, argv);
  configure_engine(engine);
  // The budget (cost.h) twice: on what the schedule and the cluster's shape tell before the platform is
  // built (building it is quadratic in its hosts), then with the platform's own counts and the flows.
  // One rank per program where nothing is per rank (symmetry.h).
  SymmetryPlan symmetry;
  if (options.exact)
    symmetry.why_not = "--exact";
  else if (scenario.cluster.compute_spread > 0)
    symmetry.why_not = "cluster.compute_spread gives every GPU its own speed";
  else if (options.durations != nullptr || options.collectives != nullptr)
    symmetry.why_not = "recorded durations are per rank";
  else if (scenario.cluster.inter.routing == Routing::kEcmp)
    symmetry.why_not = "ECMP hashes each group's flows onto its own paths";  // 3.8 % apart with a pipeline
  else
    symmetry = plan_symmetry(schedule);
  SimCost estimate = schedule_counts(schedule, options.steps, options.timeline_max_ranks, symmetry);
  add_platform_estimate(estimate, scenario.cluster);
  estimate_cost(estimate);
  HZP_RETURN_IF_ERROR(check_budget(estimate, options.budget));
  announce_platform_build(estimate);
  HZP_ASSIGN_OR_RETURN(Platform platform, build_platform(engine, scenario.cluster));
  SimBudget after_build = options.budget;
  if (estimate.seconds > options.budget.warn_seconds) after_build.warn_seconds = 1e300;  // said once already
  if (symmetry.enabled) choose_simulated_groups(schedule, platform, symmetry);
  add_flow_counts(estimate, schedule, scenario.cluster, platform, symmetry, options.steps);
  estimate.flows_at_least = false;  // counted now
  estimate.hosts = static_cast<double>(engine.get_host_count());
  estimate.links = static_cast<double>(engine.get_link_count());
  estimate_cost(estimate);
  HZP_RETURN_IF_ERROR(check_budget(estimate, after_build));
  Executor executor(scenario, cost, schedule, options, platform, symmetry);
  executor.spawn();
  const auto t0 = std::chrono::steady_clock::now();
  engine.run();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const long long expected = [&] {
    long long n = 0;
    for (int r = 0; r < schedule.world_size; ++r) n += static_cast<long long>(schedule.program_of(r).ops.size());
    return n * options.steps;
  }();
  if (executor.ops_executed() != expected)
    return Status::Internal("simulate: the simulation stopped after " + std::to_string(executor.ops_executed()) +
                            " of " + std::to_string(expected) + " ops (a deadlock the validator did not catch)");
  SimResult result = executor.finish(wall);
  result.ops_executed = expected;
  result.symmetry_note = symmetry.why_not;
  result.cost_estimate = estimate;
  return result;
}

}  // namespace

Result<SimResult> simulate(const Compiled& compiled, const SimOptions& options) {
  Result<SimResult> result = Status::Internal("simulate: the simulation thread returned nothing");
  HZP_RETURN_IF_ERROR(run_on_simulation_stack([&] { result = simulate_here(compiled, options); }));
  return result;
}

}  // namespace hzp::sim
