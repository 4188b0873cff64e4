// The policies hzp knows, one row each: the sharding of each model state, the scheduler's options, a
// one-line description and whether `hzp plan` compares it. Every policy runs on the sharded data-parallel
// scheduler (schedule_builder.h); what makes a policy is its row. Adding one: a row here (and, for new
// behaviour, a SchedulerOptions switch), a golden dump in tests/golden/, memory and communication tests.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shared/model_math.h"
#include "shared/scenario.h"
#include "shared/schedule.h"
#include "shared/schedule_builder.h"
#include "shared/status.h"

namespace hzp {

// Where a state is sharded, for a cluster of R GPUs per node and N nodes.
enum class ShardScope {
  kReplica,   // (1, 1): every GPU holds the whole state
  kNode,      // (R, 1): sharded inside the node, replicated across nodes
  kFull,      // (R, N): sharded over every GPU
  kExplicit,  // no default: the scenario gives the groups (or "auto": the planner picks them)
};

struct PolicyEntry {
  const char* name;
  const char* description;
  ShardScope params, grads, optimizer;
  SchedulerOptions options;
  bool in_plan;    // compared by `hzp plan` (aliases and explicit-sharding policies are not)
  bool is_preset;  // may be named as policy.preset ("custom" is what a policy without a preset is called)
};

const std::vector<PolicyEntry>& policy_registry();
const PolicyEntry* find_policy(std::string_view name);

// The schedule for the scenario's policy (its preset name; "custom" = explicit sharding).
Result<Schedule> build_schedule(const Scenario& scenario, const ModelCost& cost);

}  // namespace hzp
