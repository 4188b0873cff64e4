// Analytic step-time estimate by list scheduling a program (see estimator.h).
#include "shared/estimator.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "shared/collective_cost.h"

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

Result<Estimate> estimate(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule,
                          const DurationModel* durations) {
  if (schedule.programs.empty()) return Status::Internal("estimate: schedule has no program");
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
    std::vector<std::pair<double, double>> in_flight;
    const double slowdown = scenario.cluster.overlap_slowdown;
    for (size_t i = 0; i < ops.size(); ++i) {
      const Op& op = ops[i];
      double start = stream_free[op.stream];
      for (int d : op.deps) start = std::max(start, t[d].end);
      double dur = op_duration(scenario, schedule, rank, op, source);
      const bool is_compute =
          std::holds_alternative<ComputeOp>(op.body) || std::holds_alternative<OptimizerStepOp>(op.body);
      if (slowdown > 0 && is_compute) {
        std::vector<std::pair<double, double>> overlapping;
        for (const auto& iv : in_flight)
          if (iv.second > start) overlapping.push_back(iv);
        dur = slowed_compute_end(start, dur, std::move(overlapping), slowdown) - start;
      }
      t[i] = {start, start + dur};
      if (slowdown > 0 && std::holds_alternative<CollectiveOp>(op.body) && dur > 0)
        in_flight.emplace_back(t[i].start, t[i].end);
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
