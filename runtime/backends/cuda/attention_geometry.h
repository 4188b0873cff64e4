// What the CUDA attention kernels index by, apart from launch.h so that code compiled without CUDA (the
// tensor-core kernels on tests/mma_emulator.h) sees the same struct: activation rows are wq = heads * d
// (q, out) or wkv = kv_heads * d (k, v) wide; query head h reads kv head h / group.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/backends/cpu/attention_reference.h"
#include "runtime/device/kernels.h"
#include "runtime/device/numeric.h"

namespace hzp::runtime::cuda {

struct AttentionGeometry {
  std::int64_t batch, seq, heads, kv_heads, d, wq, wkv, group;
  float scale;  // 1 / sqrt(d)
};
inline AttentionGeometry attention_geometry(const AttentionShape& s) {
  return {s.batch,
          s.seq,
          s.heads,
          s.kv_heads,
          s.head_dim,
          s.heads * s.head_dim,
          s.kv_heads * s.head_dim,
          s.heads / s.kv_heads,
          1.0f / std::sqrt(static_cast<float>(s.head_dim))};
}

// PASA's constants for the fp16 kernels (docs/pasa.md), each rounded to fp16 as the CPU reference rounds
// them: the shifting matrix M = I - beta/n 1 1^T's diagonal and off-diagonal values for key blocks of n =
// reference::kPasaBlock, the recovery factor c = beta / (1 - beta), and 1 / sqrt(d) (applied to Q).
struct PasaShift {
  float diag, off, c, scale;
};
inline PasaShift pasa_shift(std::int64_t head_dim) {
  const double beta = reference::pasa_default_beta(), n = static_cast<double>(reference::kPasaBlock);
  auto fp16 = [](double x) { return round_to(ScalarType::kFp16, static_cast<float>(x)); };
  return {fp16(1.0 - beta / n), fp16(-beta / n), fp16(beta / (1.0 - beta)),
          fp16(1.0 / std::sqrt(static_cast<double>(head_dim)))};
}

}  // namespace hzp::runtime::cuda
