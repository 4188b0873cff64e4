// Calibrating compute from one node against closed forms: on one GPU a step is pure compute, so scaling both
// efficiencies by k divides it by exactly k; the fit reproduces the measurement in every unit it accepts and
// refuses what one node cannot tell (several nodes) or what the GPU cannot do (faster than its peak).
#include "shared/compute_fit.h"

#include "shared/collective_cost.h"
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
