// AsyncHZP (arXiv 2510.20111): parameters, gradients and optimizer states each sharded over their own
// group (default P, G in the node, OS over all GPUs: presets.cc), and asynchronous scheduling — parameter
// all-gathers, gradient reduce-scatters, the cross-replica sync and the parameter refresh each on a
// dedicated stream (the paper's background threads), a fixed pool of gather/reduce slots sized once from
// the largest layer, forward prefetch of the next layer(s), backward prefetch of the next module.
// The paper's ablation switches: policy.overlap.separate_streams = false (everything on one stream) and
// policy.overlap.prefetch_depth = 0 (no prefetch, layer-granular gathers); with both off the schedule is
// the synchronous one of the same sharding (tested).
#include "policies.h"
#include "schedule_builder.h"

namespace hzp::policies {

Result<Schedule> asynchzp(const Scenario& scenario, const ModelCost& cost) {
  return build_data_parallel_schedule(scenario, cost, "asynchzp",
                                      SchedulerOptions{.dedicated_refresh_stream = true, .backward_module_gather = true});
}

}  // namespace hzp::policies
