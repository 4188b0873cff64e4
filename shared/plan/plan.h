// `hzp plan`: every preset policy on the scenario, estimated analytically, ranked.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"
#include "shared/estimate/estimator.h"
#include "shared/scenario/scenario.h"

namespace hzp {

struct PlanCandidate {
  Policy policy;
  ShardingSpec sharding;
  Estimate estimate;
};

struct Plan {
  std::vector<PlanCandidate> candidates;  // registry order; the scenario's own policy first if not a preset
  int best = -1;                          // fastest candidate that fits in memory, -1 if none fits
};

// The scenario with its policy replaced by `policy`'s preset sharding (overlap settings kept).
Result<Scenario> with_policy(const Scenario& scenario, Policy policy);

Result<Plan> plan_presets(const Scenario& scenario);

// {"candidates": [...], "best": name | null} as documented in README.md.
nlohmann::json plan_to_json(const Scenario& scenario, const Plan& plan);
std::string plan_table(const Scenario& scenario, const Plan& plan);

}  // namespace hzp
