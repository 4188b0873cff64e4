// One scheduling policy per file in this folder, all behind one signature; policy_registry.cc lists them.
#pragma once

#include "model_math.h"
#include "scenario.h"
#include "schedule.h"
#include "status.h"

namespace hzp::policies {

// DDP, ZeRO-1/2/3, FSDP, HSDP/MiCS, amsp: the sharded data-parallel scheduler as is (their groups differ).
Result<Schedule> data_parallel(const Scenario& scenario, const ModelCost& cost);
// ZeRO++ hpZ: ZeRO-3 plus a secondary parameter copy sharded inside the node for backward all-gathers.
Result<Schedule> zeropp(const Scenario& scenario, const ModelCost& cost);
// AsyncHZP: one stream per communication kind, module-granular backward prefetch.
Result<Schedule> asynchzp(const Scenario& scenario, const ModelCost& cost);

}  // namespace hzp::policies
