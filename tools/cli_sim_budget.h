// --max-sim-seconds S and --max-sim-GiB G, the budget of every command that runs a simulation (sim/cost.h).
#pragma once

#include <optional>
#include <string>

#include "sim/cost.h"
#include "tools/cli_flags.h"

namespace hzp::cli {

// A macro, so that commands' help literals can end with it.
#define HZP_SIM_BUDGET_HELP                                                                                   \
  "--max-sim-seconds S and --max-sim-GiB G set what the simulation may cost to run: it is estimated before\n" \
  "it starts (wall time on a 2-core reference machine, resident memory) and refused past the budget with\n"   \
  "the estimate (default: 600 s, and 3/4 of this machine's memory or its cgroup / ulimit limits; 0 s: no\n"   \
  "time limit); past 60 s a note says what to expect (sim/README.md, \"What a simulation costs\").\n"

// `get` answers a flag's value (Args::get, ParsedArgs::get).
template <typename Get>
Result<sim::SimBudget> read_sim_budget(const Get& get) {
  sim::SimBudget budget;
  if (std::optional<std::string> v = get("--max-sim-seconds")) {
    HZP_ASSIGN_OR_RETURN(budget.max_seconds, parse_number_flag("--max-sim-seconds", *v, 0, 1e9));
  }
  if (std::optional<std::string> v = get("--max-sim-GiB")) {
    HZP_ASSIGN_OR_RETURN(const double gib, parse_number_flag("--max-sim-GiB", *v, 0.001, 1e6));
    budget.max_bytes = gib * 1024 * 1024 * 1024;
  }
  return budget;
}

}  // namespace hzp::cli
