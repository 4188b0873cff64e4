// DDP, ZeRO-1/2/3, FSDP, HSDP/MiCS and explicit AMSP sharding: one scheduler, different groups (presets.cc).
#include "policies.h"
#include "schedule_builder.h"

namespace hzp::policies {

Result<Schedule> data_parallel(const Scenario& scenario, const ModelCost& cost) {
  return build_data_parallel_schedule(scenario, cost, scenario.policy.preset);
}

}  // namespace hzp::policies
