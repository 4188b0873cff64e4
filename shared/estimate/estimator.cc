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

namespace {

// The collectives a program has scheduled so far, for cluster.overlap_slowdown, kept by end time: a compute op
// starting at t only meets those ending after t, a handful, where a list of all of them made the estimate
// quadratic in the ops per rank (1024 micro-batches of ZeRO-3 took minutes).
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

}  // namespace

double op_duration(const Scenario& scenario, const Schedule& schedule, int rank, const Op& op) {
  return op_duration(scenario, schedule, rank, op, RooflineDurations(scenario.cluster));
}

namespace {

// Whether a collective of `program` on `group` has members running another program (a pipeline transfer,
// the world's gradient-norm all-reduce under pipelining).
bool spans_programs(const Schedule& schedule, const ProcessGroup& group, int program) {
  for (int r : group.ranks)
    if (schedule.rank_program[r] != program) return true;
  return false;
}

// Several programs that wait on each other (pipeline stages): one representative rank per program (its
// first rank), all run together by list scheduling over stream heads. A collective whose group spans
// programs starts when every representative in it has it at the head of a stream with its dependencies
// done; members that are not representatives run a representative's program and are assumed ready with it.
Result<Estimate> estimate_programs(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule,
                                   const DurationModel& source) {
  const int programs = static_cast<int>(schedule.programs.size());
  const int streams = static_cast<int>(schedule.streams.size());
  std::vector<int> rep(programs, -1);
  for (int r = 0; r < schedule.world_size; ++r)
    if (rep[schedule.rank_program[r]] < 0) rep[schedule.rank_program[r]] = r;
  struct State {
    std::vector<OpTiming> t;
    std::vector<char> done;
    std::vector<std::vector<int>> stream_ops;
    std::vector<std::size_t> head;
    std::vector<double> stream_free;
    InFlight in_flight;  // collectives, for cluster.overlap_slowdown
    double end = 0, compute = 0, comm = 0, bytes = 0, intra = 0, inter = 0;
  };
  std::vector<State> st(programs);
  long long remaining = 0;
  for (int p = 0; p < programs; ++p) {
    if (rep[p] < 0) return Status::Internal("estimate: program " + std::to_string(p) + " has no rank");
    const std::vector<Op>& ops = schedule.programs[p].ops;
    st[p].t.assign(ops.size(), {});
    st[p].done.assign(ops.size(), 0);
    st[p].stream_ops.assign(streams, {});
    st[p].head.assign(streams, 0);
    st[p].stream_free.assign(streams, 0.0);
    for (std::size_t i = 0; i < ops.size(); ++i) st[p].stream_ops[ops[i].stream].push_back(static_cast<int>(i));
    remaining += static_cast<long long>(ops.size());
  }
  const double slowdown = scenario.cluster.overlap_slowdown;
  // The time op `i` of program `p` could start, or -1 while a dependency is not done.
  auto ready_at = [&](int p, int i) {
    const Op& op = schedule.programs[p].ops[i];
    double start = st[p].stream_free[op.stream];
    for (int d : op.deps) {
      if (!st[p].done[d]) return -1.0;
      start = std::max(start, st[p].t[d].end);
    }
    return start;
  };
  auto finish = [&](int p, int i, double start, double dur) {
    State& s = st[p];
    const Op& op = schedule.programs[p].ops[i];
    s.t[i] = {start, start + dur};
    s.done[i] = 1;
    ++s.head[op.stream];
    s.stream_free[op.stream] = start + dur;
    s.end = std::max(s.end, start + dur);
    --remaining;
    if (std::holds_alternative<ComputeOp>(op.body) || std::holds_alternative<OptimizerStepOp>(op.body))
      s.compute += dur;
    if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      if (slowdown > 0 && dur > 0) s.in_flight.add(start, start + dur);
      const ProcessGroup& g = schedule.group_of(rep[p], c->role);
      const double sent =
          collective_bytes_sent(c->kind, static_cast<double>(c->bytes), static_cast<int>(g.ranks.size()));
      s.comm += dur;
      s.bytes += sent;
      const double inter_share = g.nodes > 1 ? static_cast<double>(g.nodes) / g.ranks.size() : 0.0;
      s.inter += sent * inter_share;
      s.intra += sent * (1 - inter_share);
    }
  };
  bool progress = true;
  while (progress && remaining > 0) {
    progress = false;
    for (int p = 0; p < programs; ++p)
      for (int stream = 0; stream < streams; ++stream)
        while (st[p].head[stream] < st[p].stream_ops[stream].size()) {
          const int i = st[p].stream_ops[stream][st[p].head[stream]];
          double start = ready_at(p, i);
          if (start < 0) break;
          const Op& op = schedule.programs[p].ops[i];
          const double dur = op_duration(scenario, schedule, rep[p], op, source);
          const auto* c = std::get_if<CollectiveOp>(&op.body);
          const int group = c ? schedule.rank_groups[rep[p]][c->role] : -1;
          if (c && spans_programs(schedule, schedule.groups[group], p)) {
            // Every other program's representative in the group must have its op on this group ready.
            std::vector<std::pair<int, int>> partners;
            bool all_ready = true;
            for (int member : schedule.groups[group].ranks) {
              const int q = schedule.rank_program[member];
              if (q == p || rep[q] != member) continue;
              int found = -1;
              for (int ms = 0; ms < streams && found < 0; ++ms) {
                if (st[q].head[ms] >= st[q].stream_ops[ms].size()) continue;
                const int j = st[q].stream_ops[ms][st[q].head[ms]];
                const auto* mc = std::get_if<CollectiveOp>(&schedule.programs[q].ops[j].body);
                if (mc && schedule.rank_groups[member][mc->role] == group) found = j;
              }
              const double partner_start = found < 0 ? -1.0 : ready_at(q, found);
              if (partner_start < 0) {
                all_ready = false;
                break;
              }
              start = std::max(start, partner_start);
              partners.emplace_back(q, found);
            }
            if (!all_ready) break;
            for (const auto& [q, j] : partners) finish(q, j, start, dur);
            finish(p, i, start, dur);
            progress = true;
            continue;
          }
          double d = dur;
          if (slowdown > 0 &&
              (std::holds_alternative<ComputeOp>(op.body) || std::holds_alternative<OptimizerStepOp>(op.body))) {
            d = slowed_compute_end(start, dur, st[p].in_flight.ending_after(start), slowdown) - start;
          }
          finish(p, i, start, d);
          progress = true;
        }
  }
  if (remaining > 0)
    return Status::Internal("estimate: " + std::to_string(remaining) +
                            " ops never became ready (a deadlock the validator did not catch)");
  Estimate est;
  int slowest = 0;
  for (int p = 1; p < programs; ++p)
    if (st[p].end > st[slowest].end) slowest = p;
  const State& s = st[slowest];
  est.step_time_s = s.end;
  est.compute_s = s.compute;
  est.comm_s = s.comm;
  est.comm_bytes_per_gpu = s.bytes;
  est.comm_bytes_intra = s.intra;
  est.comm_bytes_inter = s.inter;
  est.timings = std::move(st[0].t);
  est.memory = memory_per_gpu(scenario, cost, schedule);
  derive_performance(scenario, cost, est);
  return est;
}

}  // namespace

Result<Estimate> estimate(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule,
                          const DurationModel* durations) {
  if (schedule.programs.empty()) return Status::Internal("estimate: schedule has no program");
  if (schedule.programs.size() > 1) {
    const RooflineDurations roofline(scenario.cluster);
    return estimate_programs(scenario, cost, schedule, durations ? *durations : roofline);
  }
  const RooflineDurations roofline(scenario.cluster);
  const DurationModel& source = durations ? *durations : roofline;
  Estimate est;
  for (size_t p = 0; p < schedule.programs.size(); ++p) {
    const int rank =
        static_cast<int>(std::find(schedule.rank_program.begin(), schedule.rank_program.end(), static_cast<int>(p)) -
                         schedule.rank_program.begin());
    const std::vector<Op>& ops = schedule.programs[p].ops;
    std::vector<OpTiming> t(ops.size());
    std::vector<double> stream_free(schedule.streams.size(), 0.0);
    double end = 0, compute = 0, comm = 0, bytes = 0, intra = 0, inter = 0;
    // Collectives scheduled so far (program order), for cluster.overlap_slowdown: compute overlapping one
    // issued earlier in program order is slowed; one issued later is not seen (a list schedule's limit).
    InFlight in_flight;
    const double slowdown = scenario.cluster.overlap_slowdown;
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      double start = stream_free[op.stream];
      for (int d : op.deps) start = std::max(start, t[d].end);
      double dur = op_duration(scenario, schedule, rank, op, source);
      const bool is_compute =
          std::holds_alternative<ComputeOp>(op.body) || std::holds_alternative<OptimizerStepOp>(op.body);
      if (slowdown > 0 && is_compute) {
        dur = slowed_compute_end(start, dur, in_flight.ending_after(start), slowdown) - start;
      }
      t[i] = {start, start + dur};
      if (slowdown > 0 && std::holds_alternative<CollectiveOp>(op.body) && dur > 0) in_flight.add(t[i].start, t[i].end);
      stream_free[op.stream] = t[i].end;
      end = std::max(end, t[i].end);
      if (is_compute) compute += dur;
      if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
        const ProcessGroup& g = schedule.group_of(rank, c->role);
        const double sent =
            collective_bytes_sent(c->kind, static_cast<double>(c->bytes), static_cast<int>(g.ranks.size()));
        comm += dur;
        bytes += sent;
        // In a ring spanning n nodes, n of the p hops cross a NIC.
        const double inter_share = g.nodes > 1 ? static_cast<double>(g.nodes) / g.ranks.size() : 0.0;
        inter += sent * inter_share;
        intra += sent * (1 - inter_share);
      }
    }
    if (p == 0 || end > est.step_time_s) {
      est.step_time_s = end;
      est.compute_s = compute;
      est.comm_s = comm;
      est.comm_bytes_per_gpu = bytes;
      est.comm_bytes_intra = intra;
      est.comm_bytes_inter = inter;
    }
    if (p == 0) est.timings = std::move(t);
  }
  est.memory = memory_per_gpu(scenario, cost, schedule);
  derive_performance(scenario, cost, est);
  return est;
}

}  // namespace hzp
