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

// When no candidate fits: the smallest GPU count at which a policy would, under one recomputation setting.
// The cluster grows by whole nodes (or is cut to fewer GPUs of one node); the micro-batch and the micro-batches
// per GPU per step stay, so the global batch grows with the data-parallel size.
struct FitAdvice {
  Policy policy;
  Recompute recompute;
  int nodes = 0;  // 0: fits at no size up to kMaxAdviceNodes
  int gpus = 0;
  MemoryBreakdown memory;  // per GPU at that size
};
inline constexpr int kMaxAdviceNodes = 4096;

struct Plan {
  std::vector<PlanCandidate> candidates;  // registry order; the scenario's own policy first if not a preset
  int best = -1;                          // fastest candidate that fits in memory, -1 if none fits
  std::vector<FitAdvice> would_fit;       // only when best is -1: per policy, per recomputation at least the scenario's
};

// The scenario with its policy replaced by `policy`'s preset sharding (overlap settings kept).
Result<Scenario> with_policy(const Scenario& scenario, Policy policy);

// Every preset, estimated and ranked; when none fits, `would_fit` says what would (what_would_fit).
Result<Plan> plan_presets(const Scenario& scenario);

// Per plan policy and per recomputation setting at least the scenario's: the fewest nodes (doubling up to
// kMaxAdviceNodes, then bisecting) on which it fits. Empty when the global batch does not split over the nodes.
Result<std::vector<FitAdvice>> what_would_fit(const Scenario& scenario);
std::string would_fit_table(const Scenario& scenario, const std::vector<FitAdvice>& advice);

// {"candidates": [...], "best": name | null} as documented in README.md.
nlohmann::json plan_to_json(const Scenario& scenario, const Plan& plan);
std::string plan_table(const Scenario& scenario, const Plan& plan);

}  // namespace hzp
