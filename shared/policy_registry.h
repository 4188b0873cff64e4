// The registry of scheduling policies: one explicit table (no static self-registration), name ->
// the scheduler that builds its schedule. Sharding presets live in presets.h; this says *how* a policy runs.
#pragma once

#include <string>
#include <vector>

#include "model_math.h"
#include "scenario.h"
#include "schedule.h"
#include "status.h"

namespace hzp {

struct PolicyEntry {
  const char* name;
  const char* description;
  // nullptr: the policy parses and resolves, but its scheduler is not built yet (kUnimplemented).
  Result<Schedule> (*build)(const Scenario& scenario, const ModelCost& cost);
  bool in_plan;  // compared by `hzp plan` (aliases such as fsdp/mics are not listed twice)
};

const std::vector<PolicyEntry>& policy_registry();

// The schedule for the scenario's policy (its preset name; "custom" = explicit sharding).
Result<Schedule> build_schedule(const Scenario& scenario, const ModelCost& cost);

}  // namespace hzp
