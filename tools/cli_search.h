// `hzp plan --search`: the planner's exhaustive search, analytic ranking, SimGrid verification.
#pragma once

#include <optional>
#include <string>

#include "shared/scenario/scenario.h"

namespace hzp::cli {

// Returns the exit code. `top_k` candidates (plus every fitting preset) are simulated, `jobs` at a time,
// each in its own `hzp simulate` process. `out_dir` receives plan.json, best.json and candidates/.
int run_plan_search(const Scenario& scenario, int top_k, int jobs, const std::string& out_dir);

}  // namespace hzp::cli
