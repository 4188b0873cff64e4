// The calibration table: per GPU type, the hardware numbers and achievable efficiencies the estimator and
// the simulator use. Every number carries its source (see calibration.cc); only single-node facts are used
// for calibration (datasheets and single-node measurements) — published multi-node results are the validation set,
// never an input.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp {

struct CalibrationEntry {
  std::string gpu_type;        // e.g. "a100-80gb"
  GpuSpec gpu;                 // peak, memory, HBM bandwidth
  Efficiency efficiency;       // achievable fractions
  double intra_latency_s = 0;  // per ring step inside a node (NCCL-like base + hardware latency)
  double nic_latency_s = 0;    // per inter-node ring step
  std::string source;          // where each number comes from, human-readable
};

// Compute slowed while a collective of the same GPU transfers (ClusterSpec::overlap_slowdown): the default of
// every cluster a scenario describes. Lee et al., "Characterizing Compute-Communication Overlap in
// GPU-Accelerated Distributed Deep Learning" (arXiv 2507.03114, 2025): 18.9 % on average, 40 % at most, over
// 4-GPU A100, H100, MI250 and MI210 nodes. One number for every GPU type, known or not: the paper's average
// across two vendors and three generations (its per-GPU values are not used).
inline constexpr double kOverlapSlowdown = 0.189;

// A causal flash-attention kernel without a measured table (GpuSpec::flash_rates empty): half the GEMM rate on
// its executed FLOPs, i.e. the full, unhalved count at the GEMM rate (hzp's model before the tables).
inline constexpr double kNoFlashTable = 0.5;

// GpuSpec::flash_rates at `head_dim` and `seq` keys, forward (and recompute) or backward: linear in log2(seq)
// between a head dimension's points, then in log2(head_dim) between the two nearest head dimensions, each
// clamped at its ends (tools/flash_rate_table.py interpolates the same way); kNoFlashTable for an empty table.
double flash_vs_gemm(const GpuSpec& gpu, bool backward, double head_dim, double seq);

Result<CalibrationEntry> calibration_for(std::string_view gpu_type);
const std::vector<CalibrationEntry>& calibration_table();

}  // namespace hzp
