// `hzp plan --search`: the planner's exhaustive search, analytic ranking, SimGrid verification.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "shared/scenario/scenario.h"

namespace hzp::cli {

// Returns the exit code. `top_k` candidates (plus every fitting preset) are simulated, `jobs` at a time,
// each in its own `hzp simulate` process. `out_dir` receives plan.json, best.json and candidates/.
// `budget_flags` (--max-sim-seconds S, --max-sim-GiB G) go to every candidate's simulation; the search itself
// is refused up front (exit 2) when its estimate passes `max_search_seconds` (the --max-sim-seconds value; 0:
// no limit).
int run_plan_search(const Scenario& scenario, int top_k, int jobs, const std::string& out_dir,
                    const std::vector<std::string>& budget_flags, double max_search_seconds);

// One `hzp simulate` of `scenario` into `out` (its scenario.json, summary.json, timeline, stdout.txt and
// stderr.txt), in a child process: one SimGrid engine per process.
struct ChildSimulation {
  Scenario scenario;
  std::filesystem::path out;  // exists
  std::string error;          // set when the simulation could not run or failed
  bool refused = false;       // it exited 2: its input, or its cost past the budget, was refused
};
// Runs them `jobs` at a time, each `hzp simulate ... FLAGS` (a budget: --max-sim-seconds S); `done(i)` is
// called as each ends (in this thread). A failed run's error ends with the last line it wrote on stderr.
void simulate_in_children(std::vector<ChildSimulation>& runs, int jobs, const std::function<void(std::size_t)>& done,
                          const std::vector<std::string>& flags = {});

}  // namespace hzp::cli
