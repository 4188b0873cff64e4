// What the CUDA attention kernels index by, apart from launch.h so that code compiled without CUDA (the
// tensor-core kernels on tests/mma_emulator.h) sees the same struct: activation rows are wq = heads * d
// (q, out) or wkv = kv_heads * d (k, v) wide; query head h reads kv head h / group.
#pragma once

#include <cmath>
#include <cstdint>

#include "runtime/device/kernels.h"

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

}  // namespace hzp::runtime::cuda
