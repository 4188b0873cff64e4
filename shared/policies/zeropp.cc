// ZeRO++ hpZ (Wang et al. 2023): ZeRO-3's sharding (presets.cc) plus a secondary copy of the parameters
// sharded among the GPUs of each node, built from the forward all-gather, so that backward all-gathers stay
// on the intra-node links. Costs Ψ·param_bytes/R more memory per GPU. (qwZ/qgZ quantisation not modelled.)
#include "policies.h"
#include "schedule_builder.h"

namespace hzp::policies {

Result<Schedule> zeropp(const Scenario& scenario, const ModelCost& cost) {
  return build_data_parallel_schedule(scenario, cost, "zeropp", SchedulerOptions{.secondary_param_copy = true});
}

}  // namespace hzp::policies
