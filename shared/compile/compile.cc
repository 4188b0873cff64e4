// The one compile step (compile.h).
#include "shared/compile/compile.h"

#include <utility>

#include "shared/compile/search.h"
#include "shared/ir/schedule_validator.h"
#include "shared/schedule/schedule_builder.h"

namespace hzp {

Result<Scenario> resolve(Scenario scenario) {
  if (!scenario.policy.auto_sharding) return scenario;
  Scenario fixed = scenario;
  fixed.policy.auto_sharding = false;
  HZP_ASSIGN_OR_RETURN(SearchResult found, search_policies(fixed, SearchOptions{}));
  if (found.ranked.empty())
    return Status::InvalidInput("policy.sharding: \"auto\" found no sharding that fits in GPU memory");
  scenario.policy = found.ranked.front().scenario.policy;
  scenario.policy.preset = Policy::kAmsp;
  scenario.policy.auto_sharding = false;
  return scenario;
}

Result<Compiled> compile(Scenario scenario) {
  Compiled out;
  out.auto_resolved = scenario.policy.auto_sharding;
  HZP_ASSIGN_OR_RETURN(out.scenario, resolve(std::move(scenario)));
  out.cost = scenario_cost(out.scenario);
  HZP_ASSIGN_OR_RETURN(out.schedule, build_schedule(out.scenario, out.cost));
  HZP_RETURN_IF_ERROR(validate_schedule(out.schedule));
  return out;
}

Result<Estimate> evaluate(const Scenario& scenario) {
  HZP_ASSIGN_OR_RETURN(const Compiled c, compile(scenario));
  return estimate(c.scenario, c.cost, c.schedule);
}

}  // namespace hzp
