// Fitting compute efficiencies to a one-node measurement (see compute_fit.h).
#include "shared/calibrate/compute_fit.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <variant>
#include <vector>

#include "shared/cost/collective_cost.h"
#include "shared/cost/duration_model.h"
#include "shared/estimate/estimator.h"
#include "shared/model/model_math.h"
#include "shared/trace/trace_replay.h"

namespace hzp {
namespace {

// The schedule does not depend on efficiencies: built once, timed at each trial factor.
Result<Estimate> step_with(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule, double scale) {
  Scenario s = scenario;
  s.cluster.efficiency.gemm *= scale;
  s.cluster.efficiency.memory_bound *= scale;
  return estimate(s, cost, schedule);
}

std::string number(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

}  // namespace

Result<ComputeFit> fit_compute_efficiency(const Scenario& one_node, const OneNodeMeasurement& measured) {
  const ClusterSpec& c = one_node.cluster;
  if (c.nodes != 1)
    return Status::InvalidInput("calibrate: cluster.nodes is " + std::to_string(c.nodes) +
                                "; calibrate from a one-node measurement (set cluster.nodes to 1 and the batch of "
                                "that run), so that the multi-node prediction comes from the network model alone");
  if (!(measured.value > 0) || !std::isfinite(measured.value))
    return Status::InvalidInput("calibrate: the measurement must be a positive number, got " + number(measured.value));
  if (measured.kind == MeasureKind::kMfu && measured.value >= 1)
    return Status::InvalidInput("calibrate: --mfu is a fraction below 1, got " + number(measured.value));

  HZP_ASSIGN_OR_RETURN(const Compiled compiled, compile(one_node));
  const ModelCost& cost = compiled.cost;
  const Schedule& schedule = compiled.schedule;
  ComputeFit fit;
  const double gpus = c.world_size();
  const double tokens = static_cast<double>(one_node.training.global_batch * one_node.training.seq_len);
  const double flops = cost.model_flops * static_cast<double>(one_node.grad_accum_steps());
  switch (measured.kind) {
    case MeasureKind::kTokensPerGpuPerS:
      fit.measured_step_s = tokens / (gpus * measured.value);
      break;
    case MeasureKind::kStepTimeS:
      fit.measured_step_s = measured.value;
      break;
    case MeasureKind::kMfu:
      fit.measured_step_s = flops / (measured.value * c.gpu.peak_flops);
      break;
  }

  // With per-GPU variability the measured node ran at its slowest GPU's pace, which the simulator applies
  // on top of the efficiencies: fit them to the step of a GPU of average speed.
  double target = fit.measured_step_s;
  if (c.compute_spread > 0) {
    const RooflineDurations roofline(c);
    const SpreadDurations spread(roofline, c.compute_spread);
    double slowest = 0;
    for (int r = 0; r < c.world_size(); ++r) slowest = std::max(slowest, spread.speed_factor(r));
    target /= slowest;
  }
  HZP_ASSIGN_OR_RETURN(Estimate table, step_with(one_node, cost, schedule, 1));
  fit.table_step_s = table.step_time_s;
  // The step time falls monotonically as both efficiencies grow; the largest factor keeps both at most 1.
  const double max_scale = std::min(1 / c.efficiency.gemm, 1 / c.efficiency.memory_bound);
  HZP_ASSIGN_OR_RETURN(Estimate fastest, step_with(one_node, cost, schedule, max_scale));
  if (target < fastest.step_time_s * (1 - 1e-9))
    return Status::InvalidInput("calibrate: the measurement (a step of " + number(fit.measured_step_s) +
                                " s) is faster than this GPU can compute the scenario even at 100 % of peak FLOP/s "
                                "and HBM bandwidth (" +
                                number(fastest.step_time_s) +
                                " s): check cluster.gpu, the model and the batch of the measured run");
  // Bisection on log(scale): 200 halvings of [1e-4, max_scale] reach double precision.
  double lo = 1e-4, hi = max_scale;
  HZP_ASSIGN_OR_RETURN(Estimate slowest, step_with(one_node, cost, schedule, lo));
  if (target > slowest.step_time_s)
    return Status::InvalidInput("calibrate: the measurement (a step of " + number(fit.measured_step_s) +
                                " s) is over 10,000 times slower than the roofline (" + number(slowest.step_time_s) +
                                " s at 1/10,000 of the table's efficiencies)");
  Estimate at;
  for (int i = 0; i < 200 && hi / lo > 1 + 1e-12; ++i) {
    const double mid = std::sqrt(lo * hi);
    HZP_ASSIGN_OR_RETURN(at, step_with(one_node, cost, schedule, mid));
    (at.step_time_s > target ? lo : hi) = mid;
  }
  fit.scale = std::sqrt(lo * hi);
  HZP_ASSIGN_OR_RETURN(at, step_with(one_node, cost, schedule, fit.scale));
  fit.fitted_step_s = at.step_time_s;
  fit.exposed_comm_s = at.exposed_comm_s;
  fit.efficiency = c.efficiency;
  fit.efficiency.gemm *= fit.scale;
  fit.efficiency.memory_bound *= fit.scale;
  return fit;
}

namespace {

// One timed op: x = seconds at 100 % of peak FLOP/s, y = seconds at 100 % of HBM bandwidth, `fixed` = seconds
// no efficiency scales (the GEMM kernels' fixed cost), t = recorded.
struct Point {
  double x, y, fixed, t;
};

// The trace's compute and optimizer ops as points; `steps` the steps they span.
std::vector<Point> timed_points(const ClusterSpec& c, const Schedule& schedule, const Trace& trace,
                                std::int64_t& steps) {
  std::vector<Point> points;
  for (const TraceEvent& e : trace.events) {
    const Op& op = schedule.program_of(e.rank).ops[e.op];
    const double t = (e.end_us - e.start_us) * 1e-6;
    if (const auto* k = std::get_if<ComputeOp>(&op.body)) {
      // The unfused attention core's max(FLOPs, bytes), and the other GEMMs', are linear on either side of
      // their ridge: each joins the FLOPs or the bytes by the side the table's efficiencies put it on. The
      // fixed cost per GEMM kernel is no efficiency's: the fit leaves it as it is.
      auto bytes_bound = [&](double x, double y) { return y / c.efficiency.memory_bound > x / c.efficiency.gemm; };
      const double core_x = k->core_flops / c.gpu.peak_flops, core_y = k->core_bytes / c.gpu.hbm_bytes_per_s;
      const double linear_x = (k->flops - k->fp8_flops - k->core_flops - k->flash_flops) / c.gpu.peak_flops +
                              (k->fp8_flops > 0 ? k->fp8_flops / c.gpu.fp8_gemm_peak() : 0);
      const double linear_y = k->gemm_bytes / c.gpu.hbm_bytes_per_s;
      const double flash_x = flash_at_gemm_rate(c.gpu, *k) / c.gpu.peak_flops;  // scales with the GEMM rate
      const bool core_b = bytes_bound(core_x, core_y), linear_b = bytes_bound(linear_x, linear_y);
      points.push_back({(linear_b ? 0 : linear_x) + (core_b ? 0 : core_x) + flash_x,
                        k->mem_bytes / c.gpu.hbm_bytes_per_s + (linear_b ? linear_y : 0) + (core_b ? core_y : 0),
                        k->gemms * c.gpu.gemm_overhead_s, t});
    } else if (const auto* o = std::get_if<OptimizerStepOp>(&op.body))
      points.push_back({0, o->mem_bytes / c.gpu.hbm_bytes_per_s, 0, t});
    else
      continue;
    steps = std::max(steps, e.step + 1);
  }
  return points;
}

}  // namespace

Result<TraceFit> fit_compute_to_trace(const Compiled& compiled, const Trace& trace) {
  const Scenario& recorded = compiled.scenario;
  HZP_RETURN_IF_ERROR(check_trace_against(trace, compiled.schedule));
  const ClusterSpec& c = recorded.cluster;
  std::int64_t steps = 0;
  const std::vector<Point> points = timed_points(c, compiled.schedule, trace, steps);
  double total_t = 0, total_table = 0, total_fixed = 0;
  for (const Point& p : points) {
    total_t += p.t;
    total_fixed += p.fixed;
    total_table += p.x / c.efficiency.gemm + p.y / c.efficiency.memory_bound + p.fixed;
  }
  if (points.empty() || !(total_t > 0) || !(total_table > 0))
    return Status::InvalidInput("calibrate --trace: the trace times no compute or optimizer op");
  if (!(total_t - total_fixed > 0.05 * total_t))
    return Status::InvalidInput("calibrate --trace: the trace's compute (" + number(total_t) +
                                " s) leaves under 5 % to fit once the GEMM "
                                "kernels' fixed cost (" +
                                number(total_fixed) + " s: cluster.gpu.gemm_overhead_us " +
                                number(c.gpu.gemm_overhead_s * 1e6) +
                                " per kernel) is taken out: set cluster.gpu.gemm_overhead_us to the "
                                "device that recorded the trace");
  TraceFit fit;
  fit.points = static_cast<long long>(points.size());
  const double per_step = static_cast<double>(trace.world_size) * static_cast<double>(steps);
  fit.recorded_s = total_t / per_step;
  fit.table_s = total_table / per_step;

  // t - fixed ~ a x + b y, a = 1/gemm, b = 1/memory_bound; weights 1/t^2 (relative error).
  double sxx = 0, sxy = 0, syy = 0, sxt = 0, syt = 0;
  for (const Point& p : points) {
    if (!(p.t > 0)) continue;
    const double w = 1 / (p.t * p.t), scaled = p.t - p.fixed;
    sxx += w * p.x * p.x;
    sxy += w * p.x * p.y;
    syy += w * p.y * p.y;
    sxt += w * p.x * scaled;
    syt += w * p.y * scaled;
  }
  const double det = sxx * syy - sxy * sxy;
  double a = 0, b = 0;
  if (det > 1e-12 * sxx * syy) {
    a = (sxt * syy - syt * sxy) / det;
    b = (syt * sxx - sxt * sxy) / det;
  }
  auto in_range = [](double e) { return e >= 0.01 && e <= 1; };
  auto finish = [&](double ga, double gb) {  // scaled so that the total matches exactly
    double total = 0;
    for (const Point& p : points) total += ga * p.x + gb * p.y;
    const double s = (total_t - total_fixed) / total;
    fit.efficiency = c.efficiency;
    fit.efficiency.gemm = 1 / (ga * s);
    fit.efficiency.memory_bound = 1 / (gb * s);
  };
  if (a > 0 && b > 0) finish(a, b);
  if (!(a > 0 && b > 0) || !in_range(fit.efficiency.gemm) || !in_range(fit.efficiency.memory_bound)) {
    fit.both = false;
    finish(1 / c.efficiency.gemm, 1 / c.efficiency.memory_bound);
  }
  for (const double e : {fit.efficiency.gemm, fit.efficiency.memory_bound})
    if (!in_range(e))
      return Status::InvalidInput(
          "calibrate --trace: the trace's compute runs at " + number(total_table / total_t) +
          " x the speed the scenario's table gives cluster.gpu (" + recorded.cluster.gpu.type +
          "), which needs an efficiency of " + number(e) +
          ", outside the [0.01, 1] a scenario accepts: set cluster.gpu (peak_tflops, hbm_GBps) to the device "
          "that recorded the trace");
  double fitted = 0;
  for (const Point& p : points) fitted += p.x / fit.efficiency.gemm + p.y / fit.efficiency.memory_bound + p.fixed;
  fit.fitted_s = fitted / per_step;
  return fit;
}

}  // namespace hzp
