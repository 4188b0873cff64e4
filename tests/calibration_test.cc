// Calibration from single-node facts only: ZeRO-1 on LLaMA-7B, one 8xA800 node, seq 4096
// reaches 63 % MFU (AMSP §II). The GEMM efficiency in calibration.cc is set so the analytic estimator
// reproduces it; multi-node results are never used to calibrate.
#include "tests/test_util.h"

#include "shared/scenario/calibration.h"

using namespace hzp;
using namespace hzp::test;

TEST_CASE("ZeRO-1 LLaMA-7B on one 8xA800 node, seq 4096: 63 % MFU", "[calibration]") {
  const Built b = build(scenario_from(scenario_json("llama2-7b", "a800", 1, "zero1", 4096)));
  const Estimate e = estimate_of(b);
  CHECK(e.mfu == Approx(0.63).margin(0.01));
}

TEST_CASE("every calibration entry is complete and sourced", "[calibration]") {
  for (const CalibrationEntry& c : calibration_table()) {
    INFO(c.gpu_type);
    CHECK(c.gpu.peak_flops > 0);
    CHECK(c.gpu.memory_bytes > 0);
    CHECK(c.gpu.hbm_bytes_per_s > 0);
    for (double eff :
         {c.efficiency.gemm, c.efficiency.memory_bound, c.efficiency.intra_node, c.efficiency.inter_node}) {
      CHECK(eff > 0);
      CHECK(eff <= 1);
    }
    CHECK(c.intra_latency_s > 0);
    CHECK(c.nic_latency_s > 0);
    CHECK(c.source.size() > 40);
  }
}
