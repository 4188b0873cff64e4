// Causal GQA attention on tensor cores with register-resident tiles (launch.h): flash attention 2's kernels
// (Dao 2023) on mma.sync m16n8k16, for bf16 and fp16 with head dimensions 64 and 128, the ones models use, and
// PASA's fp16 forward (flash_mma_kernels.h says how it differs).
// flash_attention.cu's WMMA kernels keep scores and the output accumulator in shared memory, because a WMMA
// fragment's element layout is opaque; measured on an H200 they run at 12-17 TFLOP/s against PyTorch SDPA's
// 250-650 (bench/README.md). Here the layout is PTX's, so every score, probability and accumulator stays in
// the registers of the thread that holds it, and a block of scores becomes the next product's operand
// without leaving them (the accumulator of S = Q K^T is, two 8-column tiles at a time, the A operand of P V).
//
// The layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with g = lane / 4 and t = lane % 4:
//   A 16x16 (row): 4 registers of 2 elements: (g, 2t..2t+1), (g+8, 2t..), (g, 8+2t..), (g+8, 8+2t..)
//   B 16x8 (col):  2 registers: (k = 2t..2t+1, n = g), (k = 8+2t.., n = g)
//   C 16x8 fp32:   4 floats: (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)
// ldmatrix.x4 loads four 8x8 matrices, lane l giving the address of row l % 8 of matrix l / 8; thread l
// receives element (l / 4, 2 (l % 4) ..) of each (of its transpose with .trans). Tiles in shared memory have
// rows of D + 8 elements, so the 8 rows one ldmatrix reads fall on distinct banks.
//
// Forward: block (query tile of 64, head, batch), 4 warps of 16 rows, walks the key tiles of 64 up to the
// diagonal with the online softmax; K and V double-buffered with cp.async. Backward, without atomics (as the
// WMMA kernels): block (query tile, head) sums dQ over key tiles; block (key tile of 64, kv head), 4 warps of
// 16 keys, sums dK and dV over the query tiles (of 64, 32 at D = 128 for registers) of every head of its group,
// working on the transposed scores S^T = K Q^T so that its rows are its keys.
//
// The kernels themselves are in flash_mma_kernels.h, written against the primitives defined here (PTX and
// CUDA built-ins), so that tests/mma_emulator_test.cc runs the same source on the CPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "runtime/backends/cuda/cuda_common.cuh"
#include "runtime/backends/cuda/launch.h"

namespace hzp::runtime::cuda::flash_mma {

// ---- PTX wrappers ----------------------------------------------------------------------------------------

template <typename T>
__device__ __forceinline__ void mma(float (&c)[4], const std::uint32_t (&a)[4], std::uint32_t b0, std::uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

__device__ __forceinline__ std::uint32_t smem_address(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_address(p)));
}

// 16 bytes global -> shared without passing through registers; zeros when !valid (src is then not read).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.wait_group 0;\n" ::: "memory");
}

// Two floats rounded to T, packed as one operand register (the lower half is the lower column).
template <typename T>
__device__ __forceinline__ std::uint32_t pack2(float lo, float hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&v);
  } else {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<std::uint32_t*>(&v);
  }
}

// The two T of an operand register as floats (the lower half is the lower column).
template <typename T>
__device__ __forceinline__ void unpack2(std::uint32_t r, float& lo, float& hi) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&r));
    lo = f.x, hi = f.y;
  } else {
    const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&r));
    lo = f.x, hi = f.y;
  }
}

__device__ __forceinline__ float round_fp16(float x) {
  return __half2float(__float2half_rn(x));
}

// ---- the rest of the primitives (flash_mma_kernels.h) --------------------------------------------------

#define HZP_DEVICE __device__ __forceinline__
#define HZP_KERNEL __global__ __launch_bounds__(kMmaThreads)

__device__ __forceinline__ unsigned char* shared_memory() {
  extern __shared__ __align__(128) unsigned char smem[];
  return smem;
}
__device__ __forceinline__ void sync_threads() {
  __syncthreads();
}
__device__ __forceinline__ float shfl_xor(float x, int mask) {
  return __shfl_xor_sync(0xffffffffu, x, mask);
}

}  // namespace hzp::runtime::cuda::flash_mma

#include "runtime/backends/cuda/flash_mma_kernels.h"

namespace hzp::runtime::cuda {
namespace {

using namespace flash_mma;

template <typename Kernel>
void shared_bytes(Kernel kernel, std::size_t bytes) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

dim3 grid(std::int64_t seq, std::int64_t heads, std::int64_t batch) {
  return dim3(static_cast<unsigned>(row_tiles(seq)), static_cast<unsigned>(heads), static_cast<unsigned>(batch));
}

// Calls f.template operator()<T, D>() for the shape's type and head dimension (both checked by the caller).
template <typename F>
void dispatch(ScalarType type, std::int64_t d, F&& f) {
  const bool bf16 = type == ScalarType::kBf16;
  if (d == 64)
    bf16 ? f.template operator()<__nv_bfloat16, 64>() : f.template operator()<__half, 64>();
  else
    bf16 ? f.template operator()<__nv_bfloat16, 128>() : f.template operator()<__half, 128>();
}

}  // namespace

bool mma_attention_supported(const AttentionShape& s) {
  return s.head_dim == 64 || s.head_dim == 128;  // PASA: fp16 (flash_attention_supported checks)
}

std::size_t mma_attention_shared_bytes(std::int64_t head_dim) {
  std::size_t most = 0;
  dispatch(ScalarType::kBf16, head_dim, [&]<typename T, int D>() {
    most = std::max({forward_bytes<T, D>(), pasa_forward_bytes<T, D>(), dq_bytes<T, D>(), dkv_bytes<T, D>()});
  });
  return most;
}

void mma_attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                           const Buffer& out, const Buffer& lse, cudaStream_t s) {
  const AttentionGeometry g = attention_geometry(shape);
  if (shape.algorithm == AttentionAlgorithm::kPasa) {  // fp16
    const PasaShift shift = pasa_shift(g.d);
    return dispatch(ScalarType::kFp16, g.d, [&]<typename T, int D>() {
      const std::size_t bytes = pasa_forward_bytes<T, D>();
      shared_bytes(mma_pasa_forward_kernel<T, D>, bytes);
      mma_pasa_forward_kernel<T, D><<<grid(g.seq, g.heads, g.batch), kMmaThreads, bytes, s>>>(
          q.as<const T>(), k.as<const T>(), v.as<const T>(), out.as<T>(), lse.as<float>(), g, shift);
    });
  }
  dispatch(q.type, g.d, [&]<typename T, int D>() {
    const std::size_t bytes = forward_bytes<T, D>();
    shared_bytes(mma_forward_kernel<T, D>, bytes);
    mma_forward_kernel<T, D><<<grid(g.seq, g.heads, g.batch), kMmaThreads, bytes, s>>>(
        q.as<const T>(), k.as<const T>(), v.as<const T>(), out.as<T>(), lse.as<float>(), g);
  });
}

void mma_attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                            const Buffer& dout, const Buffer& lse, const float* delta, const Buffer& dq,
                            const Buffer& dk, const Buffer& dv, cudaStream_t s) {
  const AttentionGeometry g = attention_geometry(shape);
  dispatch(q.type, g.d, [&]<typename T, int D>() {
    const std::size_t bytes_q = dq_bytes<T, D>(), bytes_kv = dkv_bytes<T, D>();
    shared_bytes(mma_dq_kernel<T, D>, bytes_q);
    mma_dq_kernel<T, D><<<grid(g.seq, g.heads, g.batch), kMmaThreads, bytes_q, s>>>(
        q.as<const T>(), k.as<const T>(), v.as<const T>(), dout.as<const T>(), lse.as<const float>(), delta, dq.as<T>(),
        g);
    constexpr int Q = dkv_queries<D>();
    shared_bytes(mma_dkv_kernel<T, D, Q>, bytes_kv);
    mma_dkv_kernel<T, D, Q><<<grid(g.seq, g.kv_heads, g.batch), kMmaThreads, bytes_kv, s>>>(
        q.as<const T>(), k.as<const T>(), v.as<const T>(), dout.as<const T>(), lse.as<const float>(), delta, dk.as<T>(),
        dv.as<T>(), g);
  });
}

}  // namespace hzp::runtime::cuda
