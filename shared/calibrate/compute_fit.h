// Calibrating compute from one node: a user has one measurement of their model on one node (a throughput,
// a step time or an MFU) and wants the cluster. fit_compute_efficiency scales the scenario's two compute
// efficiencies (GEMM fraction of peak, memory-bound fraction of HBM bandwidth) by one common factor until
// the analytic step time of the one-node scenario equals the measurement. The multi-node prediction then
// comes from the schedule and the network model alone: nothing here looks at more than one node.
//
// One number fixes one unknown, so the ratio of the two efficiencies is kept from the calibration table;
// the fit refuses a measurement the GPU's peak cannot reach (a factor that would push an efficiency past 1).
#pragma once

#include "shared/base/status.h"
#include "shared/compile/compile.h"
#include "shared/ir/schedule.h"
#include "shared/scenario/scenario.h"
#include "shared/trace/trace_format.h"

namespace hzp {

enum class MeasureKind { kTokensPerGpuPerS, kStepTimeS, kMfu };

struct OneNodeMeasurement {
  MeasureKind kind = MeasureKind::kTokensPerGpuPerS;
  double value = 0;
};

struct ComputeFit {
  Efficiency efficiency;       // the scenario's, with gemm and memory_bound scaled
  double scale = 1;            // the common factor applied
  double measured_step_s = 0;  // the measurement as a step time of the scenario
  double table_step_s = 0;     // the analytic step time with the table's efficiencies
  double fitted_step_s = 0;    // ... with the fitted ones (equals measured_step_s to 1e-9)
  double exposed_comm_s = 0;   // of the fitted step: communication the one node does not hide
};

// `one_node` must have cluster.nodes == 1 (the error says why otherwise).
Result<ComputeFit> fit_compute_efficiency(const Scenario& one_node, const OneNodeMeasurement& measured);

// Calibrating compute from a recorded trace (`hzp calibrate --trace`): every compute and optimizer op the
// trace timed is one data point of the roofline the simulator uses, t = FLOPs / (peak x gemm) + bytes /
// (HBM x memory_bound). The two efficiencies are fitted by least squares on the relative error over all
// points (so small ops count as much as large ones), then scaled together so that the fitted compute per
// step equals the recorded one exactly. When the points do not separate the two (all ops alike, or a
// result outside (0, 1]) both are scaled by one common factor from the scenario's table instead (`both`
// false). Communication is not in the points: the fit holds on any number of nodes.
struct TraceFit {
  Efficiency efficiency;  // the scenario's, with gemm and memory_bound fitted
  bool both = true;       // false: one common factor on the table's two efficiencies
  long long points = 0;   // ops of the trace used
  double recorded_s = 0;  // compute + optimizer time per rank and step in the trace (mean over ranks)
  double table_s = 0;     // the same ops with the table's efficiencies
  double fitted_s = 0;    // ... with the fitted ones (equals recorded_s)
};

// `recorded` and `schedule` are the trace's own (its scenario_config, rebuilt); the trace is checked
// against the schedule first. Errors: no compute op in the trace; efficiencies outside the [0.01, 1] a
// scenario accepts (the trace ran faster than cluster.gpu's peak, or at under 1 % of it).
Result<TraceFit> fit_compute_to_trace(const Compiled& recorded, const Trace& trace);

}  // namespace hzp
