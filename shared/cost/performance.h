// What one training step achieved: the result type the estimator (Estimate) and the simulator (SimResult)
// share, with every derived number (MFU, TFLOP/s, tokens/s, overlap, memory verdict) computed in one place.
#pragma once

#include <nlohmann/json.hpp>

#include "shared/model/model_math.h"
#include "shared/scenario/scenario.h"
#include "shared/schedule/sharding.h"

namespace hzp {

struct StepPerformance {
  int gpus = 0;
  // Measured by the executor (per step):
  double step_time_s = 0;
  double compute_s = 0;    // busy time of compute and optimizer ops (the busiest rank)
  double comm_s = 0;       // time collectives were running (overlapped or not)
  MemoryBreakdown memory;  // per GPU (the simulator: of the rank with the highest peak)
  // Derived by derive_performance():
  double exposed_comm_s = 0;    // step_time - compute: time compute waits on communication
  double overlap_fraction = 0;  // 1 - exposed / comm (1 when there is no communication)
  double model_flops_per_gpu = 0;
  double mfu = 0;             // model FLOPs / (step time · the GPU's peak)
  double tflops_per_gpu = 0;  // model TFLOP/s achieved per GPU
  double tokens_per_s = 0;    // whole cluster
  double tokens_per_gpu_per_s = 0;
  bool fits_memory = false;  // memory.total() within the GPU's memory
};

// Fills the derived fields from step_time_s, compute_s, comm_s and memory.
void derive_performance(const Scenario& scenario, const ModelCost& cost, StepPerformance& perf);

// {"params", "grads", "optimizer", "activations", "buffers"} in bytes: summary.json's peak_memory_breakdown_bytes.
nlohmann::json memory_breakdown_json(const MemoryBreakdown& m);

}  // namespace hzp
