// The SimGrid executor: runs a schedule IR on the simulated cluster and reports what happened.
//
// Every (rank, stream) is one SimGrid actor that executes its ops in program order, like a CUDA stream:
// an op starts when the previous op of its stream is done and its dependencies (same step) and
// loop-carried dependencies (previous step) are done. Compute and optimizer ops take the time of the
// DurationModel (shared/cost/duration_model.h; the roofline unless SimOptions names another) on their GPU (one compute
// stream per GPU: nothing to share). A collective starts when every member of its group has reached it (NCCL
// semantics); the last member to arrive runs its flows (sim/collective.h), which share links with every other flow in
// flight — including collectives of other streams of the same GPU. The executor never re-decides what the IR says.
// Unless SimOptions::exact, ranks that run one program are simulated once and the others follow (symmetry.h).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"
#include "shared/compile/compile.h"
#include "shared/cost/duration_model.h"
#include "shared/cost/performance.h"
#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/scenario/scenario.h"
#include "shared/schedule/sharding.h"
#include "sim/cost.h"

namespace hzp::sim {

struct SimOptions {
  int steps = 1;                             // training steps run back to back
  int timeline_max_ranks = 64;               // ranks recorded for the timeline (all of them up to this many)
  bool progress = false;                     // progress lines on stderr for long simulations
  double progress_interval_s = 2;            // at most one line per this many wall seconds
  const DurationModel* durations = nullptr;  // compute and optimizer op times (the roofline when null)
  // Collectives it has a time for take that time from the last member's arrival instead of running flows
  // (a replayed trace); the others are simulated.
  const CollectiveDurations* collectives = nullptr;
  SimBudget budget;    // what the simulation may cost to run (cost.h); refused before it starts when past it
  bool exact = false;  // every rank simulated; else one per program where that is exact (symmetry.h)
};

// A step whose steady state was counted (steady_state.h): its micro-batches, the period, and the two shorter
// runs simulated. micro_batches 0: every micro-batch simulated.
struct SteadyStateRun {
  long long micro_batches = 0;
  long long period = 0;
  long long first = 0;
  long long second = 0;
};

// One executed op of a recorded rank.
struct OpSpan {
  int rank = 0;
  int op = 0;
  int step = 0;
  double start = 0;  // the stream reached the op (collectives: may wait for peers)
  double end = 0;
  double transfer_start = 0;  // collectives: when the last member arrived and flows started
};

struct SimResult : StepPerformance {  // memory: of the rank with the highest peak
  int steps = 0;
  double total_time_s = 0;           // step_time_s = total / steps; compute_s: the busiest rank's;
                                     // comm_s: averaged over ranks, time collectives were transferring
  double comm_bytes_intra_node = 0;  // per GPU per step, bytes put on intra-node links
  double comm_bytes_inter_node = 0;  // per GPU per step, bytes put through NICs
  int peak_memory_rank = 0;
  std::string memory_verdict;
  double sim_wall_s = 0;
  SimCost cost_estimate;                 // what it was expected to cost before it ran (cost.h)
  long long ops_executed = 0;            // by every rank (a symmetric simulation counts its ranks' ops too)
  long long ops_simulated = 0;           // by actors: ops_executed, or the representatives' when symmetric
  bool symmetric = false;                // one rank per program simulated (symmetry.h)
  std::string symmetry_note;             // why not, when it could not be
  long long collectives = 0;             // group collective instances, every group of every rank
  long long collectives_with_flows = 0;  // of which ran flows (symmetric: the others counted, symmetry.h)
  SteadyStateRun steady_state;           // the spans are then the second shorter run's
  std::vector<int> timeline_ranks;
  std::vector<OpSpan> spans;
};

// Runs the simulation. One SimGrid engine per process: a second call in the same process is refused.
// Runs a compiled scenario (compile/compile.h): its schedule on its cluster.
Result<SimResult> simulate(const Compiled& compiled, const SimOptions& options);

// The ranks recorded in the timeline: all up to `max_ranks`; above, every GPU of node 0 and then the
// first GPU of evenly spaced nodes, `max_ranks` in all.
std::vector<int> timeline_sample(int world, int gpus_per_node, int max_ranks);

// summary.json (documented in sim/README.md).
nlohmann::json summary_json(const Scenario& scenario, const SimResult& result);

// Chrome / Perfetto trace as JSON text: one process per recorded GPU, one thread per stream, ts/dur in µs.
std::string timeline_text(const Scenario& scenario, const Schedule& schedule, const SimResult& result);

}  // namespace hzp::sim
