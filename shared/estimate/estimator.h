// The analytic estimator: runs a schedule's program on paper — roofline compute, α–β collectives, streams
// overlapping, no network contention beyond the symmetric NIC share of collective_cost.h. The planner's
// fast path and the simulator's sanity check.
//
// Every op starts when its stream's previous op and all its dependencies have finished (list scheduling in
// program order, exact for the IR's semantics). With one program, collectives are assumed to find all
// members ready, which holds for the symmetric programs of data parallelism. With several (pipeline
// stages), one rank per program runs and a collective spanning programs starts when all of them reach it,
// so the pipeline's bubble is in the estimate; the slowest program's times are reported.
#pragma once

#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"
#include "shared/cost/duration_model.h"
#include "shared/cost/performance.h"
#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/scenario/scenario.h"
#include "shared/schedule/sharding.h"

namespace hzp {

struct OpTiming {
  double start = 0;
  double end = 0;
};

struct Estimate : StepPerformance {
  double comm_bytes_per_gpu = 0;  // bytes sent per GPU per step (ring), summed over collectives
  double comm_bytes_intra = 0;    // ... of which over intra-node links
  double comm_bytes_inter = 0;    // ... of which over NICs
  std::vector<OpTiming> timings;  // per op of program 0
};

// The estimate under summary.json's keys (scenario, policy, gpus, step_time_s, tokens_per_s,
// tokens_per_gpu_per_s, mfu, tflops_per_gpu, compute_s, comm_s, exposed_comm_s, overlap_fraction,
// peak_memory_bytes, peak_memory_breakdown_bytes, gpu_memory_bytes, fits_memory, comm_bytes {per_gpu,
// intra_node_per_gpu, inter_node_per_gpu}): what hzp compare and the Python module's estimate show.
nlohmann::json estimate_to_json(const Scenario& scenario, const Estimate& e);

// Compute and optimizer ops take the time `durations` gives (the roofline when null).
Result<Estimate> estimate(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule,
                          const DurationModel* durations = nullptr);

// Duration of one op on `rank` under the analytic model.
// When compute needing `work` seconds alone, started at `start`, ends if it runs at 1 / (1 + slowdown) of
// its speed wherever one of the collectives `comm` ([start, end) intervals on the same GPU, any order,
// possibly overlapping) is in flight (cluster.overlap_slowdown; both executors use this rule).
double slowed_compute_end(double start, double work, std::vector<std::pair<double, double>> comm, double slowdown);

double op_duration(const Scenario& scenario, const Schedule& schedule, int rank, const Op& op,
                   const DurationModel& durations);
// ... with the roofline.
double op_duration(const Scenario& scenario, const Schedule& schedule, int rank, const Op& op);

}  // namespace hzp
