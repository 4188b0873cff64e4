// Calibrating compute from one node: a user has one measurement of their model on one node (a throughput,
// a step time or an MFU) and wants the cluster. fit_compute_efficiency scales the scenario's two compute
// efficiencies (GEMM fraction of peak, memory-bound fraction of HBM bandwidth) by one common factor until
// the analytic step time of the one-node scenario equals the measurement. The multi-node prediction then
// comes from the schedule and the network model alone: nothing here looks at more than one node.
//
// One number fixes one unknown, so the ratio of the two efficiencies is kept from the calibration table;
// the fit refuses a measurement the GPU's peak cannot reach (a factor that would push an efficiency past 1).
#pragma once

#include "shared/scenario.h"
#include "shared/status.h"

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

}  // namespace hzp
