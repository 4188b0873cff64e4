// compile(): a scenario into what an executor runs, in one step. It is the only way hzp gets a schedule —
// the CLI commands, the planner, the trainer, calibration, replay and the tests all call it:
//
//   resolve   "sharding": "auto" -> the sharding search's analytic pick (search.h)
//   cost      per-module parameters, FLOPs, bytes and activations (model/model_math.h)
//   schedule  the policy's scheduler (schedule/schedule_builder.h), on the mesh the parser computed
//   validate  structure, pool discipline, collective order, deadlocks (ir/schedule_validator.h)
//
// A failing stage's status is returned as is: kInvalidInput for a scenario the scheduler refuses,
// kUnimplemented for a combination no scheduler builds yet (hzp validate reports it as a note).
#pragma once

#include "shared/base/status.h"
#include "shared/estimate/estimator.h"
#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/scenario/scenario.h"

namespace hzp {

struct Compiled {
  Scenario scenario;           // resolved: its sharding is explicit ("auto" replaced)
  ModelCost cost;              // of scenario
  Schedule schedule;           // validated
  bool auto_resolved = false;  // the sharding was "auto" and compile() picked it (callers may say what)

  const ParallelMesh& mesh() const { return scenario.mesh; }  // computed once, by the parser
};

Result<Compiled> compile(Scenario scenario);

// The resolve stage alone, for callers that need the scenario's final policy but none of its schedule
// (`hzp plan` compares the presets on it). A no-op without "auto"; kInvalidInput when no sharding fits.
Result<Scenario> resolve(Scenario scenario);

// compile(), then the analytic estimate of the schedule: what the searches rank candidates by.
Result<Estimate> evaluate(const Scenario& scenario);

}  // namespace hzp
