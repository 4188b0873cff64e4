// The analytic estimator: runs a schedule's program on paper — roofline compute, α–β collectives, streams
// overlapping, no network contention beyond the symmetric NIC share of collective_cost.h. The planner's
// fast path and the simulator's sanity check.
//
// Every op starts when its stream's previous op and all its dependencies have finished (list scheduling in
// program order, exact for the IR's semantics). Collectives are assumed to find all members ready, which
// holds for the symmetric programs of data parallelism; with several programs each is timed alone and the
// slowest counts.
#pragma once

#include <vector>

#include "model_math.h"
#include "scenario.h"
#include "schedule.h"
#include "sharding.h"
#include "status.h"

namespace hzp {

struct OpTiming {
  double start = 0;
  double end = 0;
};

struct Estimate {
  double step_time_s = 0;
  double compute_s = 0;          // busy time of compute and optimizer ops
  double comm_s = 0;             // sum of collective durations (overlapped or not)
  double exposed_comm_s = 0;     // step_time - compute_s: time compute waits on communication
  double overlap_fraction = 0;   // 1 - exposed / comm (1 when there is no communication)
  double comm_bytes_per_gpu = 0; // bytes sent per GPU per step (ring), summed over collectives
  double comm_bytes_intra = 0;   // ... of which over intra-node links
  double comm_bytes_inter = 0;   // ... of which over NICs
  double model_flops_per_gpu = 0;
  double mfu = 0;
  double tflops_per_gpu = 0;     // model TFLOP/s achieved per GPU
  double tokens_per_s = 0;       // whole cluster
  MemoryBreakdown memory;
  bool fits_memory = false;
  std::vector<OpTiming> timings; // per op of program 0
};

Result<Estimate> estimate(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule);

// Duration of one op on `rank` under the analytic model.
double op_duration(const Scenario& scenario, const Schedule& schedule, int rank, const Op& op);

}  // namespace hzp
