// The steady state of a step counted instead of simulated (issue 36).
//
// Between a pipeline's warm-up and its cool-down every micro-batch runs the same ops on the same links as
// the one before it, and without a pipeline every micro-batch but the first and the last does. What a step
// costs therefore grows linearly with its micro-batches once there are enough of them:
//   f(M) = f(M2) + (M - M2) · (f(M2) - f(M1)) / (M2 - M1)
// for every per-step quantity f: times, the breakdown, traffic, op and collective counts. A step of M
// micro-batches is simulated as two shorter ones, M1 = 2·P and M2 = 3·P (P: the pipeline's depth, whose
// multiples an interleaved schedule needs; 1 without a pipeline), and extrapolated. Memory is the shorter
// runs' (the micro-batches in flight peak within the warm-up; both runs must agree). It applies when
// M >= M1 + M2, so the two runs together simulate fewer micro-batches than the full one would, and never to a
// replay (recorded per-op times). `hzp simulate --exact` simulates every micro-batch.
//
// Measured (bench/README.md): the Grok-1-like recipe at 1024 H100s, 128 micro-batches, extrapolated from 16
// and 24 gives the full simulation's step time to rounding (3e-14), its ops and collectives exactly.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"
#include "shared/model/model_math.h"
#include "shared/scenario/scenario.h"
#include "sim/breakdown.h"
#include "sim/executor.h"

namespace hzp::sim {

struct SteadyStatePlan {
  std::int64_t micro_batches = 0;  // M: the scenario's, per GPU per step
  std::int64_t period = 1;         // P
  std::int64_t first = 0;          // M1 = 2·P
  std::int64_t second = 0;         // M2 = 3·P
  std::string why_not;             // empty when it applies
  bool applies() const { return why_not.empty(); }
};

SteadyStatePlan plan_steady_state(const Scenario& scenario, const SimOptions& options);

// The scenario with `micro_batches` per GPU per step (training.global_batch scaled; nothing else changes).
Scenario with_micro_batches(const Scenario& scenario, std::int64_t micro_batches);

// What one of the shorter runs tells: its result (the second run's keeps its spans, for the timeline) and
// GPU 0's breakdown.
struct SteadyPoint {
  SimResult result;
  StepBreakdown breakdown;
};

// A point's per-step numbers and memory as JSON, and back (how the first run, in a child process, reports).
nlohmann::json steady_point_json(const SteadyPoint& point);
Result<SteadyPoint> steady_point_from_json(const nlohmann::json& json);

// The step of plan.micro_batches from the runs of plan.first and plan.second micro-batches: `second` with
// every per-step quantity extrapolated and the performance derived for `scenario` (the full one). An error
// when the two runs' memory differ (not a steady state: simulate with --exact).
Result<SteadyPoint> extrapolate(const SteadyStatePlan& plan, const Scenario& scenario, const ModelCost& cost,
                                const SteadyPoint& first, SteadyPoint second);

}  // namespace hzp::sim
