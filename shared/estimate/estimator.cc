// Analytic step-time estimate by list scheduling a program (see estimator.h).
#include "shared/estimate/estimator.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "shared/cost/collective_cost.h"

namespace hzp {

double op_duration(const Scenario& scenario, const Schedule& schedule, int rank, const Op& op,
                   const DurationModel& durations) {
  const ClusterSpec& c = scenario.cluster;
  if (const auto* comp = std::get_if<ComputeOp>(&op.body)) return durations.compute_s(rank, *comp);
  if (const auto* opt = std::get_if<OptimizerStepOp>(&op.body)) return durations.optimizer_s(rank, *opt);
  if (const auto* coll = std::get_if<CollectiveOp>(&op.body)) {
    return collective_time(c, coll->kind, static_cast<double>(coll->bytes),
                           group_shape(c, schedule.group_of(rank, coll->role)));
  }
  return 0;  // buffer acquire / release: bookkeeping only
}

double slowed_compute_end(double start, double work, std::vector<std::pair<double, double>> comm, double slowdown) {
  std::sort(comm.begin(), comm.end());
  double t = start;
  for (const auto& [s, e] : comm) {
    if (e <= t) continue;
    if (s > t) {  // alone until this collective starts
      if (t + work <= s) return t + work;
      work -= s - t;
      t = s;
    }
    const double slowed = (e - t) / (1 + slowdown);  // work done while it runs
    if (work <= slowed) return t + work * (1 + slowdown);
    work -= slowed;
    t = e;
  }
  return t + work;
}

double op_duration(const Scenario& scenario, const Schedule& schedule, int rank, const Op& op) {
  return op_duration(scenario, schedule, rank, op, RooflineDurations(scenario.cluster));
}

namespace {

// List scheduling of every program of the schedule together: one representative rank per program (its first
// rank) runs it. Within a program the next op taken is the ready stream head of smallest index — with one
// program that is program order, so the collectives a compute op sees in flight (cluster.overlap_slowdown)
// are those issued before it. A collective whose group spans programs (a pipeline transfer, the gradient
// norm under pipelining) starts when every other program's representative in the group has it at the head
// of a stream with its dependencies done; members that are not representatives run a representative's
// program and are assumed ready with it.
class ListScheduler {
 public:
  ListScheduler(const Scenario& scenario, const Schedule& schedule, const DurationModel& durations)
      : scenario_(scenario), schedule_(schedule), durations_(durations), slowdown_(scenario.cluster.overlap_slowdown) {}

  Status run() {
    const int programs = static_cast<int>(schedule_.programs.size());
    const int streams = static_cast<int>(schedule_.streams.size());
    rep_.assign(programs, -1);
    for (int r = 0; r < schedule_.world_size; ++r)
      if (rep_[schedule_.rank_program[r]] < 0) rep_[schedule_.rank_program[r]] = r;
    st_.resize(programs);
    for (int p = 0; p < programs; ++p) {
      if (rep_[p] < 0) return Status::Internal("estimate: program " + std::to_string(p) + " has no rank");
      const std::vector<Op>& ops = schedule_.programs[p].ops;
      State& s = st_[p];
      s.t.assign(ops.size(), {});
      s.done.assign(ops.size(), 0);
      s.stream_ops.assign(streams, {});
      s.head.assign(streams, 0);
      s.stream_free.assign(streams, 0.0);
      for (std::size_t i = 0; i < ops.size(); ++i) s.stream_ops[ops[i].stream].push_back(static_cast<int>(i));
      remaining_ += static_cast<long long>(ops.size());
    }
    bool progress = true;
    while (progress && remaining_ > 0) {
      progress = false;
      for (int p = 0; p < programs; ++p)
        while (step(p)) progress = true;
    }
    if (remaining_ > 0)
      return Status::Internal("estimate: " + std::to_string(remaining_) +
                              " ops never became ready (a deadlock the validator did not catch)");
    return Status::Ok();
  }

  // The slowest program's times, program 0's op timings.
  Estimate result() {
    int slowest = 0;
    for (int p = 1; p < static_cast<int>(st_.size()); ++p)
      if (st_[p].end > st_[slowest].end) slowest = p;
    const State& s = st_[slowest];
    Estimate est;
    est.step_time_s = s.end;
    est.compute_s = s.compute;
    est.comm_s = s.comm;
    est.comm_bytes_per_gpu = s.bytes;
    est.comm_bytes_intra = s.intra;
    est.comm_bytes_inter = s.inter;
    est.timings = std::move(st_[0].t);
    return est;
  }

 private:
  // The collectives a program has scheduled so far, for cluster.overlap_slowdown, kept by end time: a compute
  // op starting at t only meets those ending after t, a handful, where a list of all of them made the
  // estimate quadratic in the ops per rank (1024 micro-batches of ZeRO-3 took minutes).
  class InFlight {
   public:
    void add(double start, double end) { by_end_.emplace(end, start); }
    std::vector<std::pair<double, double>> ending_after(double t) const {
      std::vector<std::pair<double, double>> out;
      for (auto it = by_end_.upper_bound(t); it != by_end_.end(); ++it) out.emplace_back(it->second, it->first);
      return out;
    }

   private:
    std::multimap<double, double> by_end_;  // end -> start
  };

  struct State {
    std::vector<OpTiming> t;
    std::vector<char> done;
    std::vector<std::vector<int>> stream_ops;
    std::vector<std::size_t> head;
    std::vector<double> stream_free;
    std::size_t first_open = 0;  // the smallest op index not done
    InFlight in_flight;
    double end = 0, compute = 0, comm = 0, bytes = 0, intra = 0, inter = 0;
  };

  // The time op `i` of program `p` could start, or -1 while it is not at its stream's head or a dependency
  // is not done.
  double ready_at(int p, int i) const {
    const State& s = st_[p];
    const Op& op = schedule_.programs[p].ops[i];
    const std::vector<int>& queue = s.stream_ops[op.stream];
    if (s.head[op.stream] >= queue.size() || queue[s.head[op.stream]] != i) return -1;
    double start = s.stream_free[op.stream];
    for (int d : op.deps) {
      if (!s.done[d]) return -1;
      start = std::max(start, s.t[d].end);
    }
    return start;
  }

  // Runs one op of program `p` if one can run: the smallest-index ready stream head that can start now.
  bool step(int p) {
    State& s = st_[p];
    const std::vector<Op>& ops = schedule_.programs[p].ops;
    while (s.first_open < ops.size() && s.done[s.first_open]) ++s.first_open;
    if (s.first_open == ops.size()) return false;
    // The common case (always with one program): the first open op is ready.
    if (try_run(p, static_cast<int>(s.first_open))) return true;
    std::vector<int> heads;
    for (std::size_t stream = 0; stream < s.head.size(); ++stream)
      if (s.head[stream] < s.stream_ops[stream].size()) heads.push_back(s.stream_ops[stream][s.head[stream]]);
    std::sort(heads.begin(), heads.end());
    for (int i : heads)
      if (i != static_cast<int>(s.first_open) && try_run(p, i)) return true;
    return false;
  }

  bool try_run(int p, int i) {
    double start = ready_at(p, i);
    if (start < 0) return false;
    const Op& op = schedule_.programs[p].ops[i];
    const double dur = op_duration(scenario_, schedule_, rep_[p], op, durations_);
    const auto* c = std::get_if<CollectiveOp>(&op.body);
    const int group = c ? schedule_.rank_groups[rep_[p]][c->role] : -1;
    if (c && spans_programs(schedule_.groups[group], p)) {
      // Every other program's representative in the group must have its op on this group ready.
      std::vector<std::pair<int, int>> partners;
      for (int member : schedule_.groups[group].ranks) {
        const int q = schedule_.rank_program[member];
        if (q == p || rep_[q] != member) continue;
        const int j = head_on_group(q, member, group);
        const double partner_start = j < 0 ? -1.0 : ready_at(q, j);
        if (partner_start < 0) return false;
        start = std::max(start, partner_start);
        partners.emplace_back(q, j);
      }
      for (const auto& [q, j] : partners) finish(q, j, start, dur);
      finish(p, i, start, dur);
      return true;
    }
    double d = dur;
    if (slowdown_ > 0 && is_compute(op))
      d = slowed_compute_end(start, dur, st_[p].in_flight.ending_after(start), slowdown_) - start;
    finish(p, i, start, d);
    return true;
  }

  // Whether a collective of `program` on `group` has members running another program.
  bool spans_programs(const ProcessGroup& group, int program) const {
    for (int r : group.ranks)
      if (schedule_.rank_program[r] != program) return true;
    return false;
  }

  // The op at a stream head of program `q` that is a collective on `group` (as `member` binds it), or -1.
  int head_on_group(int q, int member, int group) const {
    const State& s = st_[q];
    for (std::size_t stream = 0; stream < s.head.size(); ++stream) {
      if (s.head[stream] >= s.stream_ops[stream].size()) continue;
      const int j = s.stream_ops[stream][s.head[stream]];
      const auto* mc = std::get_if<CollectiveOp>(&schedule_.programs[q].ops[j].body);
      if (mc && schedule_.rank_groups[member][mc->role] == group) return j;
    }
    return -1;
  }

  static bool is_compute(const Op& op) {
    return std::holds_alternative<ComputeOp>(op.body) || std::holds_alternative<OptimizerStepOp>(op.body);
  }

  void finish(int p, int i, double start, double dur) {
    State& s = st_[p];
    const Op& op = schedule_.programs[p].ops[i];
    s.t[i] = {start, start + dur};
    s.done[i] = 1;
    ++s.head[op.stream];
    s.stream_free[op.stream] = start + dur;
    s.end = std::max(s.end, start + dur);
    --remaining_;
    if (is_compute(op)) s.compute += dur;
    if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      if (slowdown_ > 0 && dur > 0) s.in_flight.add(start, start + dur);
      const ProcessGroup& g = schedule_.group_of(rep_[p], c->role);
      const double sent =
          collective_bytes_sent(c->kind, static_cast<double>(c->bytes), static_cast<int>(g.ranks.size()));
      s.comm += dur;
      s.bytes += sent;
      // In a ring spanning n nodes, n of the p hops cross a NIC.
      const double inter_share = g.nodes > 1 ? static_cast<double>(g.nodes) / g.ranks.size() : 0.0;
      s.inter += sent * inter_share;
      s.intra += sent * (1 - inter_share);
    }
  }

  const Scenario& scenario_;
  const Schedule& schedule_;
  const DurationModel& durations_;
  const double slowdown_;
  std::vector<int> rep_;  // per program: the rank that runs it
  std::vector<State> st_;
  long long remaining_ = 0;
};

}  // namespace

Result<Estimate> estimate(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule,
                          const DurationModel* durations) {
  if (schedule.programs.empty()) return Status::Internal("estimate: schedule has no program");
  const RooflineDurations roofline(scenario.cluster);
  ListScheduler scheduler(scenario, schedule, durations ? *durations : roofline);
  HZP_RETURN_IF_ERROR(scheduler.run());
  Estimate est = scheduler.result();
  est.memory = memory_per_gpu(scenario, cost, schedule);
  derive_performance(scenario, cost, est);
  return est;
}

nlohmann::json estimate_to_json(const Scenario& scenario, const Estimate& e) {
  return {
      {"scenario", scenario.name},
      {"policy", to_string(scenario.policy.preset)},
      {"gpus", e.gpus},
      {"step_time_s", e.step_time_s},
      {"tokens_per_s", e.tokens_per_s},
      {"tokens_per_gpu_per_s", e.tokens_per_gpu_per_s},
      {"mfu", e.mfu},
      {"tflops_per_gpu", e.tflops_per_gpu},
      {"compute_s", e.compute_s},
      {"comm_s", e.comm_s},
      {"exposed_comm_s", e.exposed_comm_s},
      {"overlap_fraction", e.overlap_fraction},
      {"peak_memory_bytes", e.memory.total()},
      {"peak_memory_breakdown_bytes", memory_breakdown_json(e.memory)},
      {"gpu_memory_bytes", scenario.cluster.gpu.memory_bytes},
      {"fits_memory", e.fits_memory},
      {"comm_bytes",
       {{"per_gpu", e.comm_bytes_per_gpu},
        {"intra_node_per_gpu", e.comm_bytes_intra},
        {"inter_node_per_gpu", e.comm_bytes_inter}}},
  };
}

}  // namespace hzp
