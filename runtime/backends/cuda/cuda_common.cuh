// What every CUDA kernel file of the backend shares: element access for the three tensor types (ld widens
// to fp32, st<T> rounds to nearest even, as the CPU reference's numeric.h does), type dispatch from a
// Buffer's ScalarType, block reductions, and launch geometry. Device code only; no hzp interface beyond
// Buffer and ScalarType.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "runtime/device/device.h"

namespace hzp::runtime::cuda {

// --- Element access ---------------------------------------------------------------------------------------

__device__ __forceinline__ float ld(float x) {
  return x;
}
__device__ __forceinline__ float ld(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
__device__ __forceinline__ float ld(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T st(float f);
template <>
__device__ __forceinline__ float st<float>(float f) {
  return f;
}
template <>
__device__ __forceinline__ __nv_bfloat16 st<__nv_bfloat16>(float f) {
  return __float2bfloat16_rn(f);
}
template <>
__device__ __forceinline__ __half st<__half>(float f) {
  return __float2half_rn(f);
}

// Calls f(T{}) with T the device storage type of a tensor buffer (fp32, bf16, fp16).
template <typename F>
void on_type(ScalarType t, F&& f) {
  switch (t) {
    case ScalarType::kBf16:
      f(__nv_bfloat16{});
      return;
    case ScalarType::kFp16:
      f(__half{});
      return;
    default:
      f(float{});
      return;
  }
}

template <typename F>
void on_types(ScalarType a, ScalarType b, F&& f) {
  on_type(a, [&](auto ta) { on_type(b, [&](auto tb) { f(ta, tb); }); });
}

// --- Reductions -------------------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum of v over the block (blockDim.x a multiple of 32, at most 1024), returned to every thread.
// `shared` holds 32 elements. Ends with a barrier, so it may be called again at once.
template <typename T>
__device__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_sum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  total = warp_sum(total);
  __syncthreads();
  return total;
}

__device__ inline float block_max(float v, float* shared) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = warp_max(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  float m = lane < warps ? shared[lane] : -INFINITY;
  m = warp_max(m);
  __syncthreads();
  return m;
}

// --- Geometry ---------------------------------------------------------------------------------------------

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n elements (capped: the loop covers the rest).
inline unsigned blocks_for(std::int64_t n) {
  const std::int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65535 * 4 ? 65535 * 4 : b));
}

}  // namespace hzp::runtime::cuda
