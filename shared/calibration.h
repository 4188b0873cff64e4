// The calibration table: per GPU type, the hardware numbers and achievable efficiencies the estimator and
// the simulator use. Every number carries its source (see calibration.cc); only single-node facts are used
// for calibration (datasheets and single-node measurements) — published multi-node results are the validation set,
// never an input.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shared/scenario.h"
#include "shared/status.h"

namespace hzp {

struct CalibrationEntry {
  std::string gpu_type;        // e.g. "a100-80gb"
  GpuSpec gpu;                 // peak, memory, HBM bandwidth
  Efficiency efficiency;       // achievable fractions
  double intra_latency_s = 0;  // per ring step inside a node (NCCL-like base + hardware latency)
  double nic_latency_s = 0;    // per inter-node ring step
  std::string source;          // where each number comes from, human-readable
};

Result<CalibrationEntry> calibration_for(std::string_view gpu_type);
const std::vector<CalibrationEntry>& calibration_table();

}  // namespace hzp
