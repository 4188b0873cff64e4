// Derived step metrics, computed once for the estimator and the simulator (see performance.h).
#include "shared/cost/performance.h"

#include <algorithm>

namespace hzp {

void derive_performance(const Scenario& scenario, const ModelCost& cost, StepPerformance& perf) {
  perf.gpus = scenario.cluster.world_size();
  perf.exposed_comm_s = std::max(0.0, perf.step_time_s - perf.compute_s);
  perf.overlap_fraction = perf.comm_s > 0 ? std::clamp(1 - perf.exposed_comm_s / perf.comm_s, 0.0, 1.0) : 1.0;
  // cost.model_flops is a tensor rank's share of one micro-batch through the whole model; a pipeline stage
  // runs 1 / pipeline of the model.
  perf.model_flops_per_gpu =
      cost.model_flops * static_cast<double>(scenario.grad_accum_steps()) / scenario.mesh.pipeline;
  if (perf.step_time_s > 0) {
    perf.tflops_per_gpu = perf.model_flops_per_gpu / perf.step_time_s / 1e12;
    perf.mfu = perf.model_flops_per_gpu / (perf.step_time_s * scenario.cluster.gpu.peak_flops);
    perf.tokens_per_s =
        static_cast<double>(scenario.training.global_batch * scenario.training.seq_len) / perf.step_time_s;
    perf.tokens_per_gpu_per_s = perf.tokens_per_s / std::max(1, perf.gpus);
  }
  perf.fits_memory = perf.memory.total() <= scenario.cluster.gpu.memory_bytes;
}

nlohmann::json memory_breakdown_json(const MemoryBreakdown& m) {
  return {{"params", m.params},
          {"grads", m.grads},
          {"optimizer", m.optimizer},
          {"activations", m.activations},
          {"buffers", m.buffers}};
}

}  // namespace hzp
