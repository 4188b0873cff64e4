// `hzp simulate`'s simulation of a scenario: every micro-batch, or the steady state counted
// (sim/steady_state.h) from two shorter simulations run side by side (SimGrid allows one per process, so the
// shorter one runs in a forked child while this process runs the longer one).
#pragma once

#include <optional>

#include "shared/base/status.h"
#include "shared/compile/compile.h"
#include "sim/breakdown.h"
#include "sim/executor.h"
#include "sim/steady_state.h"

namespace hzp::cli {

struct Simulation {
  sim::SimResult result;          // of the scenario (extrapolated when its steady state was counted)
  sim::StepBreakdown breakdown;   // GPU 0's
  std::optional<Compiled> drawn;  // the shorter scenario whose spans `result` holds; none: the scenario's
  const Schedule& schedule(const Compiled& full) const { return drawn ? drawn->schedule : full.schedule; }
};

// Simulates `compiled`; its steady state is counted when `plan` applies.
Result<Simulation> simulate_scenario(const Compiled& compiled, const sim::SteadyStatePlan& plan,
                                     const sim::SimOptions& options);

}  // namespace hzp::cli
