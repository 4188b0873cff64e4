// Calibrating compute from one node against closed forms: on one GPU a step is pure compute, so scaling both
// efficiencies by k divides it by exactly k; the fit reproduces the measurement in every unit it accepts and
// refuses what one node cannot tell (several nodes) or what the GPU cannot do (faster than its peak).
#include "shared/calibrate/compute_fit.h"

#include "shared/cost/collective_cost.h"
#include "shared/cost/duration_model.h"
#include "shared/trace/trace_format.h"
#include "tests/test_util.h"

using namespace hzp;
using namespace hzp::test;

namespace {

Scenario one_gpu() {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 1, "ddp", 4096);
  doc["cluster"]["gpus_per_node"] = 1;
  doc["cluster"]["nic"] = {{"per_node", 1}};
  return scenario_from(doc);
}

}  // namespace

TEST_CASE("calibrate: on one GPU the fitted factor is the ratio of step times", "[calibrate]") {
  const Scenario s = one_gpu();
  const double table_step = estimate_of(build(s)).step_time_s;
  const double measured = 1.25 * table_step;  // the run was 25 % slower than the table predicts
  auto fit = fit_compute_efficiency(s, {MeasureKind::kStepTimeS, measured});
  REQUIRE(fit.ok());
  CHECK(fit->table_step_s == Approx(table_step).epsilon(1e-12));
  CHECK(fit->scale == Approx(1 / 1.25).epsilon(1e-9));
  CHECK(fit->efficiency.gemm == Approx(s.cluster.efficiency.gemm / 1.25).epsilon(1e-9));
  CHECK(fit->efficiency.memory_bound == Approx(s.cluster.efficiency.memory_bound / 1.25).epsilon(1e-9));
  CHECK(fit->efficiency.inter_node == s.cluster.efficiency.inter_node);  // the network is not fitted
  CHECK(fit->fitted_step_s == Approx(measured).epsilon(1e-9));
}

TEST_CASE("calibrate: tokens/s/GPU and MFU measurements mean the same step", "[calibrate]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 1, "zero1", 4096, 32);
  const Scenario s = scenario_from(doc);
  const double tgs = 3500;
  auto by_tgs = fit_compute_efficiency(s, {MeasureKind::kTokensPerGpuPerS, tgs});
  REQUIRE(by_tgs.ok());
  const double step = 32.0 * 4096 / (8 * tgs);
  CHECK(by_tgs->measured_step_s == Approx(step).epsilon(1e-12));
  CHECK(by_tgs->fitted_step_s == Approx(step).epsilon(1e-9));
  // The fitted scenario, estimated again, gives the measurement back (and an MFU consistent with it).
  Scenario fitted = s;
  fitted.cluster.efficiency = by_tgs->efficiency;
  const Estimate e = estimate_of(build(fitted));
  CHECK(e.tokens_per_gpu_per_s == Approx(tgs).epsilon(1e-9));
  auto by_mfu = fit_compute_efficiency(s, {MeasureKind::kMfu, e.mfu});
  REQUIRE(by_mfu.ok());
  CHECK(by_mfu->efficiency.gemm == Approx(by_tgs->efficiency.gemm).epsilon(1e-9));
}

TEST_CASE("calibrate: refuses several nodes, impossible speeds and nonsense", "[calibrate]") {
  const Scenario multi = scenario_from(scenario_json("llama2-7b", "dgx-a100", 2, "zero1", 4096, 32));
  auto several = fit_compute_efficiency(multi, {MeasureKind::kTokensPerGpuPerS, 3000});
  REQUIRE_FALSE(several.ok());
  CHECK(several.status().code() == StatusCode::kInvalidInput);
  CHECK(several.status().message().find("cluster.nodes is 2") != std::string::npos);

  const Scenario s = one_gpu();
  auto too_fast = fit_compute_efficiency(s, {MeasureKind::kMfu, 0.99});  // above gemm = 1 with the norms' bytes
  REQUIRE_FALSE(too_fast.ok());
  CHECK(too_fast.status().message().find("faster than this GPU") != std::string::npos);
  for (double bad : {0.0, -1.0, std::nan("")})
    CHECK_FALSE(fit_compute_efficiency(s, {MeasureKind::kStepTimeS, bad}).ok());
  CHECK_FALSE(fit_compute_efficiency(s, {MeasureKind::kMfu, 1.5}).ok());
}

namespace {

// A trace of `s`'s schedule (2 steps) whose ops took the roofline times of `truth`'s efficiencies,
// each op's time times `noise(i)`.
Trace roofline_trace(const Scenario& s, const Schedule& schedule, Efficiency truth, double (*noise)(int) = nullptr) {
  ClusterSpec c = s.cluster;
  c.efficiency = truth;
  const RooflineDurations roofline(c);
  Trace t = trace_header(s, schedule);
  double at = 0;
  int i = 0;
  for (int step = 0; step < 2; ++step)
    for (int rank = 0; rank < schedule.world_size; ++rank) {
      const auto& ops = schedule.program_of(rank).ops;
      for (int k = 0; k < static_cast<int>(ops.size()); ++k) {
        double d = -1;
        if (const auto* op = std::get_if<ComputeOp>(&ops[k].body)) d = roofline.compute_s(rank, *op);
        if (const auto* op = std::get_if<OptimizerStepOp>(&ops[k].body)) d = roofline.optimizer_s(rank, *op);
        if (d < 0) continue;
        if (noise != nullptr) d *= noise(i++);
        t.events.push_back(trace_event(schedule, rank, k, step, ops[k].stream, at * 1e6, (at + d) * 1e6, -1));
        at += d;
      }
    }
  return t;
}

}  // namespace

TEST_CASE("calibrate --trace: recovers the efficiencies that timed the ops, and the step", "[calibrate]") {
  const Scenario s = one_gpu();
  const Compiled b = build(s);
  const Schedule& schedule = b.schedule;
  Efficiency truth = s.cluster.efficiency;
  truth.gemm = 0.31;
  truth.memory_bound = 0.57;
  auto fit = fit_compute_to_trace(b, roofline_trace(s, schedule, truth));
  REQUIRE(fit.ok());
  CHECK(fit->both);
  CHECK(fit->efficiency.gemm == Approx(0.31).epsilon(1e-9));
  CHECK(fit->efficiency.memory_bound == Approx(0.57).epsilon(1e-9));
  CHECK(fit->efficiency.inter_node == s.cluster.efficiency.inter_node);
  CHECK(fit->fitted_s == Approx(fit->recorded_s).epsilon(1e-12));
  // The fitted scenario's estimated step (pure compute on one GPU) is the recorded compute per step.
  Scenario fitted = s;
  fitted.cluster.efficiency = fit->efficiency;
  CHECK(estimate_of(build(fitted)).compute_s == Approx(fit->recorded_s).epsilon(1e-9));

  // Noisy times: the total per step still matches exactly, the efficiencies come out near the truth.
  auto noisy =
      fit_compute_to_trace(b, roofline_trace(s, schedule, truth, [](int i) { return i % 2 == 0 ? 1.05 : 0.97; }));
  REQUIRE(noisy.ok());
  CHECK(noisy->fitted_s == Approx(noisy->recorded_s).epsilon(1e-12));
  CHECK(noisy->efficiency.gemm == Approx(0.31).epsilon(0.06));
  CHECK(noisy->efficiency.memory_bound == Approx(0.57).epsilon(0.06));
}

TEST_CASE("calibrate --trace: a trace the GPU's peak cannot explain is refused", "[calibrate]") {
  const Scenario s = one_gpu();
  const Compiled b = build(s);
  const Schedule& schedule = b.schedule;
  Efficiency impossible = s.cluster.efficiency;
  impossible.gemm = 3;  // three times the peak
  impossible.memory_bound = 3;
  auto fit = fit_compute_to_trace(b, roofline_trace(s, schedule, impossible));
  REQUIRE_FALSE(fit.ok());
  CHECK(fit.status().message().find("set cluster.gpu") != std::string::npos);
  CHECK(fit_compute_to_trace(b, trace_header(s, schedule)).status().message().find("no compute") != std::string::npos);
}
