// The calibration table: one entry per GPU type, every number with its source.
//
// Rules: only single-node public facts are inputs (datasheets, single-node measurements). Anything else is marked
// either as a vendor datasheet value or as an "assumption" with its reasoning. Published multi-node results are the
// validation set and must never be used to set a number here.
//
// Latencies are per ring step, taken from NCCL's own cost model (src/graph/tuning.cc, NVIDIA/nccl 2.20.3 at
// commit b6475625 and unchanged through 2.26.2 at f44ac759, the `hwLat` table, Ring algorithm, Simple protocol — the
// protocol NCCL picks for the multi-MB messages of ZeRO collectives): NVLINK 3.4 us per intra-node step, NET 14.0 us
// per inter-node step. NCCL adds a per-collective `baseLat` of 8.4 us (Ring/Simple) that has no field here. Older NCCL
// releases used NET 9.6 us; LL128 uses 1.9 / 4.0 us for small messages.
#include "shared/scenario/calibration.h"

#include <algorithm>
#include <cmath>

namespace hzp {
namespace {

constexpr double kTflops = 1e12;
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kGBps = 1e9;
constexpr double kUsPerS = 1e6;  // divide, as the scenario parser does, so "latency_us": 3.4 gives the same double

constexpr double kNcclRingSimpleNvlinkLatency = 3.4 / kUsPerS;
constexpr double kNcclRingSimpleNetLatency = 14.0 / kUsPerS;

// Hopper's fixed cost per GEMM kernel (GpuSpec::gemm_overhead_s): fitted with its GEMM rate to the 96 bf16
// products of transformer layers (134 M to 70 B, 4 k and 16 k tokens) timed on one H100 80GB HBM3
// (scenarios/validation/h100_kernels.json; `python3 tools/gemm_overhead_fit.py` on it prints 6.75 and how well
// it fits; tests/gemm_overhead_fit.sh holds the two equal). One number per chip: the H800 and the H200 are the
// same GH100 compute.
constexpr double kHopperGemmOverhead = 6.75 / kUsPerS;

// Hopper's FP8 GEMMs (GpuSpec::fp8_gemm_vs_bf16): the dev-row models' products timed on one H200 in FP8
// (tensorwise torch._scaled_mm, forward) and bf16 (bench/gpu/results/2026-11-27b-h200/gemm_shapes.jsonl), each
// dtype's whole products of 50 us or more as one GEMM rate with the fixed cost above: 0.695 of the FP8 peak
// against 0.765 of the bf16 peak (`python3 tools/gemm_overhead_fit.py --min-us 50 --fp8-vs-bf16 6.75` on it;
// tests/gemm_overhead_fit.sh holds the two equal). FP8 products run at 1.82x bf16's rate, not 2x.
constexpr double kHopperFp8GemmVsBf16 = 0.908;

// Hopper's causal flash attention (GpuSpec::flash_rates): PyTorch 2.11's SDPA, bf16, timed on one H200 in the
// same run as the dev-row models' GEMMs (bench/gpu/results/2026-11-27b-h200/: attention.jsonl, gemm_shapes.jsonl),
// as multiples of that run's GEMM rate (0.765 of peak with the 6.75 us above). `python3
// tools/flash_rate_table.py` prints these rows, and checks them against the H100 table's four attention rows
// (scenarios/validation/h100_kernels.json, the same kernels on an H100): within 3 % at 4 k keys, 8 % below at
// 2 k, 16 - 24 % below at head_dim 64 and 1 k (tests/flash_rate_table.sh holds the rows to the tool's).
// One table per chip, as for the fixed cost.
const std::vector<FlashRate>& hopper_flash_rates() {
  static const std::vector<FlashRate> rates = {
      {64, 1024, 0.325, 0.260},  {64, 2048, 0.464, 0.365},  {64, 4096, 0.532, 0.456},   {64, 8192, 0.562, 0.523},
      {64, 16384, 0.593, 0.586}, {64, 32768, 0.627, 0.560}, {128, 1024, 0.561, 0.373},  {128, 2048, 0.681, 0.501},
      {128, 4096, 0.770, 0.618}, {128, 8192, 0.814, 0.695}, {128, 16384, 0.839, 0.774}, {128, 32768, 0.866, 0.736},
  };
  return rates;
}

// Shared by every entry unless stated otherwise.
constexpr double kMemoryBoundEff = 0.80;  // assumption, see sources
constexpr double kIntraNodeEff = 0.82;  // 370 / 450 GB/s: ring busbw of 8xH100 (NCCL maintainer, NVIDIA/nccl-tests#212)
constexpr double kInterNodeEff = 0.90;  // assumption, see sources
// Calibrated: the analytic estimator gives 63.0 % MFU for ZeRO-1 LLaMA-7B, seq 4096, micro-batch 1, one
// micro-batch per step, on one 8xA800 node (AMSP §II; the paper does not state its global batch — with more
// micro-batches per step the optimizer's share shrinks and the same efficiency gives ~1 % more MFU), with
// the default overlap slowdown (kOverlapSlowdown: the gradient all-reduce slows the backward beside it;
// without it, 0.683 gave the same 63 %).
// Reproduce: tests/calibration_test.cc, or `hzp plan` with "efficiency": {"gemm": x} overrides.
constexpr double kAmpereGemmEff = 0.700;

constexpr const char* kCommonSources =
    " memory_bound 0.80: assumption (typical achieved fraction of HBM bandwidth by elementwise/norm/optimizer "
    "kernels). inter_node 0.90: assumption (protocol and NIC overheads; not fitted to any multi-node training "
    "result). intra latency 3.4 us / NIC latency 14.0 us: NCCL src/graph/tuning.cc hwLat Ring/Simple "
    "NVLINK / NET (commit b6475625, unchanged in 2.26.2). arch: the GPU's compute capability class (NCCL's "
    "per-architecture tables). FP8 (training.fp8): GEMMs at fp8_gemm_vs_bf16 times the fraction of the FP8 "
    "peak that bf16 GEMMs reach of the bf16 peak, checked from bf16 to FP8 on one node by tools/fp8_transfer.py; "
    "no FP8 peak: none known, or no FP8 tensor cores (Ampere). overlap_slowdown 0.189 (a scenario's default for every "
    "GPU type, kOverlapSlowdown in calibration.h): Lee et al., arXiv 2507.03114 (2025), compute slowed by "
    "18.9 % on average while collectives run beside it on 4-GPU A100, H100, MI250 and MI210 nodes. "
    "gemm_overhead 6.75 us per GEMM kernel (H100, H800, H200): fitted with the GEMM rate to 96 bf16 products "
    "timed on one H100 (scenarios/validation/h100_kernels.json, tools/gemm_overhead_fit.py: |error| median 2.8 %, "
    "p90 9.8 %, against 4.8 % and 20.0 % without it); none known for the other GPU types (0). "
    "fp8_gemm_vs_bf16 0.908 (H100, H800, H200): FP8 GEMMs' fraction of the FP8 peak over bf16 GEMMs' fraction of "
    "the bf16 peak, the dev-row models' products timed in both on one H200 (bench/gpu/results/2026-11-27b-h200, "
    "tools/gemm_overhead_fit.py --fp8-vs-bf16); 1 for the others (none measured). "
    "flash_attention_vs_gemm (H100, H800, H200): PyTorch SDPA's causal attention timed on one H200 beside the "
    "GEMMs of the same run (bench/gpu/results/2026-11-27b-h200, tools/flash_rate_table.py), as multiples of "
    "that run's GEMM rate; none known for the other GPU types (the kernel then at half the GEMM rate on its "
    "executed FLOPs).";

// Long because: one row per GPU type, each with the sources of its numbers; the table reads best whole.
std::vector<CalibrationEntry> build_table() {
  std::vector<CalibrationEntry> t;

  t.push_back(
      {"a100-80gb",
       {"a100-80gb", 312 * kTflops, 80 * kGiB, 2039 * kGBps, 0, GpuArch::kAmpere},
       {kAmpereGemmEff, kMemoryBoundEff, kIntraNodeEff, kInterNodeEff},
       kNcclRingSimpleNvlinkLatency,
       kNcclRingSimpleNetLatency,
       std::string("peak 312 TFLOP/s dense bf16: NVIDIA A100 datasheet. 80 GiB, 2039 GB/s HBM2e: NVIDIA A100 80GB SXM "
                   "datasheet. gemm 0.700: calibrated so that the analytic estimator "
                   "reproduces 63 % MFU for ZeRO-1 LLaMA-7B seq 4096 on one 8xA800 node (AMSP §II); "
                   "checked by tests/calibration_test.cc (same chip as A800). intra_node 0.82: NVIDIA/nccl-tests#212 "
                   "value measured on 8xH100, assumed to hold for NVLink3 too.") +
           kCommonSources});

  t.push_back(
      {"a800-80gb",
       {"a800-80gb", 312 * kTflops, 80 * kGiB, 2039 * kGBps, 0, GpuArch::kAmpere},
       {kAmpereGemmEff, kMemoryBoundEff, kIntraNodeEff, kInterNodeEff},
       kNcclRingSimpleNvlinkLatency,
       kNcclRingSimpleNetLatency,
       std::string("peak 312 TFLOP/s dense bf16: NVIDIA A800 datasheet. 80 GiB, 2039 GB/s: assumption (the A800 is the "
                   "A100 80GB chip with NVLink capped at 400 GB/s bidirectional, so its A100 datasheet "
                   "memory numbers). gemm 0.700: calibrated so that the analytic estimator reproduces 63 % "
                   "MFU for ZeRO-1 LLaMA-7B seq 4096 on one 8xA800 node (AMSP §II); checked by "
                   "tests/calibration_test.cc. intra_node 0.82: the ring busbw fraction measured on 8xH100 "
                   "(NVIDIA/nccl-tests#212), assumed "
                   "to hold for NVLink3 too.") +
           kCommonSources});

  t.push_back({"h100-sxm",
               {"h100-sxm", 989 * kTflops, 80 * kGiB, 3350 * kGBps, 1979 * kTflops, GpuArch::kHopper,
                kHopperGemmOverhead, hopper_flash_rates(), kHopperFp8GemmVsBf16},
               {0.60, kMemoryBoundEff, kIntraNodeEff, kInterNodeEff},
               kNcclRingSimpleNvlinkLatency,
               kNcclRingSimpleNetLatency,
               std::string("peak 989 TFLOP/s dense bf16, 1979 dense FP8: NVIDIA H100 datasheet. 80 GiB, 3350 GB/s "
                           "HBM3: NVIDIA H100 SXM "
                           "datasheet. gemm 0.60: assumption (Hopper's peak grew 3.2x over A100 "
                           "while HBM bandwidth grew 1.6x, so end-to-end training reaches a smaller fraction of "
                           "peak than on A100; no single-node H100 MFU fact to calibrate against yet). "
                           "intra_node 0.82: 370 of 450 GB/s ring busbw on 8xH100 (NVIDIA/nccl-tests#212).") +
                   kCommonSources});

  t.push_back(
      {"h800-sxm",
       {"h800-sxm", 989 * kTflops, 80 * kGiB, 3350 * kGBps, 1979 * kTflops, GpuArch::kHopper, kHopperGemmOverhead,
        hopper_flash_rates(), kHopperFp8GemmVsBf16},
       {0.60, kMemoryBoundEff, kIntraNodeEff, kInterNodeEff},
       kNcclRingSimpleNvlinkLatency,
       kNcclRingSimpleNetLatency,
       std::string(
           "peak 989 TFLOP/s (FP8 1979), 80 GiB, 3350 GB/s: assumption (the H800 is the H100 SXM chip with "
           "NVLink capped at 400 GB/s bidirectional, so H100 compute and memory numbers). gemm "
           "0.60: assumption, same reasoning as h100-sxm. intra_node 0.82: the 8xH100 ring fraction (nccl-tests#212) "
           "measured on 8xH100, assumed to hold at the lower NVLink rate.") +
           kCommonSources});

  t.push_back(
      {"h200-sxm",
       {"h200-sxm", 989 * kTflops, 141e9, 4800 * kGBps, 1979 * kTflops, GpuArch::kHopper, kHopperGemmOverhead,
        hopper_flash_rates(), kHopperFp8GemmVsBf16},
       {0.60, kMemoryBoundEff, kIntraNodeEff, kInterNodeEff},
       kNcclRingSimpleNvlinkLatency,
       kNcclRingSimpleNetLatency,
       std::string(
           "peak 989 TFLOP/s dense bf16 (1979 with sparsity), 1979 dense FP8, 141 GB HBM3e, 4.8 TB/s: NVIDIA H200 "
           "datasheet (the H100's compute with more, faster memory). gemm 0.60: assumption, same "
           "reasoning as h100-sxm. intra_node 0.82: the 8xH100 ring fraction (nccl-tests#212), same "
           "NVLink4.") +
           kCommonSources});

  t.push_back(
      {"b200",
       {"b200", 2250 * kTflops, 180e9, 8000 * kGBps, 4500 * kTflops, GpuArch::kBlackwell},
       {0.60, kMemoryBoundEff, kIntraNodeEff, kInterNodeEff},
       kNcclRingSimpleNvlinkLatency,
       kNcclRingSimpleNetLatency,
       std::string("peak 2250 TFLOP/s dense bf16 (4.5 PFLOP/s dense FP8): NVIDIA Blackwell B200 figures "
                   "(DGX B200 datasheet: 72 PFLOP/s FP8 training for 8 GPUs, with sparsity). 180 GB, 8 TB/s "
                   "HBM3e per GPU: DGX B200 datasheet (1440 GB, 64 TB/s for 8 GPUs). gemm 0.60: assumption "
                   "(the Hopper value; no single-node B200 MFU fact to calibrate against yet). intra_node 0.82: "
                   "the 8xH100 ring fraction (nccl-tests#212), assumed for NVLink5.") +
           kCommonSources});

  t.push_back(
      {"npu-910b",
       {"npu-910b", 320 * kTflops, 64 * kGiB, 1600 * kGBps, 0, GpuArch::kAmpere},
       {0.60, kMemoryBoundEff, kIntraNodeEff, kInterNodeEff},
       kNcclRingSimpleNvlinkLatency,
       kNcclRingSimpleNetLatency,
       std::string("AsyncHZP-like accelerator; ALL numbers are assumptions (no public datasheet). peak "
                   "320 TFLOP/s: assumption (the dense fp16/bf16 figure commonly reported for Ascend 910B). "
                   "64 GiB, 1600 GB/s: assumption (commonly reported 64 GB HBM2e at ~1.6 TB/s). gemm "
                   "0.60: assumption (no single-node MFU fact; set to the Hopper value pending "
                   "calibration). intra_node 0.82: assumption (the 8xH100 NVLink measurement of nccl-tests#212 applied "
                   "to the full mesh). Latencies: assumption (NCCL's NVLINK/NET values applied to the full "
                   "mesh and RoCE; HCCL's cost model is not public). arch ampere: assumption (NCCL's Ampere "
                   "LL cap stands in for HCCL's).") +
           kCommonSources});
  return t;
}

}  // namespace

const std::vector<CalibrationEntry>& calibration_table() {
  static const std::vector<CalibrationEntry> table = build_table();
  return table;
}

double flash_vs_gemm(const GpuSpec& gpu, bool backward, double head_dim, double seq) {
  const std::vector<FlashRate>& t = gpu.flash_rates;
  if (t.empty()) return kNoFlashTable;
  // Along the sequence, at one head dimension: linear in log2(seq), clamped.
  auto along_seq = [&](int hd) {
    const FlashRate *below = nullptr, *above = nullptr;
    for (const FlashRate& p : t) {
      if (p.head_dim != hd) continue;
      if (p.seq <= seq && (below == nullptr || p.seq > below->seq)) below = &p;
      if (p.seq >= seq && (above == nullptr || p.seq < above->seq)) above = &p;
    }
    const FlashRate& lo = below != nullptr ? *below : *above;
    const FlashRate& hi = above != nullptr ? *above : *below;
    const double a = backward ? lo.bwd : lo.fwd, b = backward ? hi.bwd : hi.fwd;
    if (hi.seq <= lo.seq) return a;
    return a + (b - a) * std::log2(seq / lo.seq) / std::log2(hi.seq / lo.seq);
  };
  // The nearest head dimensions at or below and at or above, then linear in log2(head_dim) between them.
  int below = 0, above = 0;
  for (const FlashRate& p : t) {
    if (p.head_dim <= head_dim && (below == 0 || p.head_dim > below)) below = p.head_dim;
    if (p.head_dim >= head_dim && (above == 0 || p.head_dim < above)) above = p.head_dim;
  }
  if (below == 0) below = above;
  if (above == 0) above = below;
  const double lo = along_seq(below);
  if (above == below) return lo;
  return lo + (along_seq(above) - lo) * std::log2(head_dim / below) / std::log2(static_cast<double>(above) / below);
}

Result<CalibrationEntry> calibration_for(std::string_view gpu_type) {
  const auto& table = calibration_table();
  auto it = std::find_if(table.begin(), table.end(), [&](const CalibrationEntry& e) { return e.gpu_type == gpu_type; });
  if (it != table.end()) return *it;
  std::string known;
  for (const auto& e : table) known += (known.empty() ? "" : ", ") + e.gpu_type;
  return Status::InvalidInput("unknown GPU type \"" + std::string(gpu_type) + "\"; known: " + known);
}

}  // namespace hzp
