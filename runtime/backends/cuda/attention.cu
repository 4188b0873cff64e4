// Causal attention with GQA for the CUDA backend (launch.h). bf16 / fp16 with the usual head dimensions run
// flash_attention.cu's tensor-core kernels; everything else runs the simple, correct version here. One block per
// query row (forward, dq) or per key row (dk, dv); scores live in shared memory; everything in fp32 and
// rounded once to the output type. No probabilities are kept between forward and backward: the backward
// recomputes them from q, k and the saved log-sum-exp (flash attention's backward, with D_i = dO_i . O_i), so
// the backend's attention reserve is 0. O(seq^2 * head_dim) work like any exact attention, but it reads K/V
// once per row instead of once per tile: fast fused kernels are a later step, measured against this one.
#include <algorithm>
#include <cmath>

#include "runtime/backends/cuda/cuda_common.cuh"
#include "runtime/backends/cuda/launch.h"

namespace hzp::runtime::cuda {
namespace {

constexpr int kAttnThreads = 128;

using Geometry = AttentionGeometry;

// Element c of row t (token t of sequence b) of head `head` in a [batch*seq x width] activation.
__device__ __forceinline__ std::int64_t at(std::int64_t b, std::int64_t t, std::int64_t seq, std::int64_t width,
                                           std::int64_t head, std::int64_t d) {
  return (b * seq + t) * width + head * d;
}

// Block (i, head, b): scores of query row i over keys j <= i in shared memory, then out_i = softmax . V.
template <typename T>
__global__ void attention_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, Geometry g) {
  extern __shared__ float smem[];
  __shared__ float red[32];
  const std::int64_t i = blockIdx.x, hd = blockIdx.y, b = blockIdx.z, kvh = hd / g.group;
  float* qi = smem;           // [d]
  float* score = smem + g.d;  // [i + 1]
  const T* qrow = q + at(b, i, g.seq, g.wq, hd, g.d);
  for (std::int64_t c = threadIdx.x; c < g.d; c += blockDim.x) qi[c] = ld(qrow[c]);
  __syncthreads();
  float mx = -INFINITY;
  for (std::int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const T* krow = k + at(b, j, g.seq, g.wkv, kvh, g.d);
    float s = 0;
    for (std::int64_t c = 0; c < g.d; ++c) s += qi[c] * ld(krow[c]);
    s *= g.scale;
    score[j] = s;
    mx = fmaxf(mx, s);
  }
  mx = block_max(mx, red);
  float sum = 0;
  for (std::int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const float e = expf(score[j] - mx);
    score[j] = e;
    sum += e;
  }
  sum = block_sum(sum, red);  // ends with a barrier: every score is written
  const float inv = 1.0f / sum;
  T* orow = out + at(b, i, g.seq, g.wq, hd, g.d);
  for (std::int64_t c = threadIdx.x; c < g.d; c += blockDim.x) {
    float acc = 0;
    for (std::int64_t j = 0; j <= i; ++j) acc += score[j] * ld(v[at(b, j, g.seq, g.wkv, kvh, g.d) + c]);
    orow[c] = st<T>(acc * inv);
  }
  if (threadIdx.x == 0) lse[(b * g.heads + hd) * g.seq + i] = mx + logf(sum);
}

// D[b, head, i] = dO_i . O_i (the row sums of P * dP that the softmax backward needs).
template <typename T>
__global__ void attention_delta_kernel(const T* out, const T* dout, float* delta, Geometry g) {
  __shared__ float red[32];
  const std::int64_t i = blockIdx.x, hd = blockIdx.y, b = blockIdx.z;
  const std::int64_t base = at(b, i, g.seq, g.wq, hd, g.d);
  float s = 0;
  for (std::int64_t c = threadIdx.x; c < g.d; c += blockDim.x) s += ld(out[base + c]) * ld(dout[base + c]);
  s = block_sum(s, red);
  if (threadIdx.x == 0) delta[(b * g.heads + hd) * g.seq + i] = s;
}

// Block (i, head, b): dS_ij = P_ij (dO_i . v_j - D_i) for j <= i, then dq_i = scale * sum_j dS_ij k_j.
template <typename T>
__global__ void attention_dq_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                    const float* delta, T* dq, Geometry g) {
  extern __shared__ float smem[];
  const std::int64_t i = blockIdx.x, hd = blockIdx.y, b = blockIdx.z, kvh = hd / g.group;
  float* qi = smem;            // [d]
  float* doi = smem + g.d;     // [d]
  float* ds = smem + 2 * g.d;  // [i + 1]
  const std::int64_t row = at(b, i, g.seq, g.wq, hd, g.d);
  for (std::int64_t c = threadIdx.x; c < g.d; c += blockDim.x) {
    qi[c] = ld(q[row + c]);
    doi[c] = ld(dout[row + c]);
  }
  __syncthreads();
  const float m = lse[(b * g.heads + hd) * g.seq + i], di = delta[(b * g.heads + hd) * g.seq + i];
  for (std::int64_t j = threadIdx.x; j <= i; j += blockDim.x) {
    const std::int64_t kv = at(b, j, g.seq, g.wkv, kvh, g.d);
    float s = 0, dp = 0;
    for (std::int64_t c = 0; c < g.d; ++c) {
      s += qi[c] * ld(k[kv + c]);
      dp += doi[c] * ld(v[kv + c]);
    }
    const float p = expf(s * g.scale - m);
    ds[j] = p * (dp - di);
  }
  __syncthreads();
  for (std::int64_t c = threadIdx.x; c < g.d; c += blockDim.x) {
    float acc = 0;
    for (std::int64_t j = 0; j <= i; ++j) acc += ds[j] * ld(k[at(b, j, g.seq, g.wkv, kvh, g.d) + c]);
    dq[row + c] = st<T>(acc * g.scale);
  }
}

// Block (j, kv head, b): over the group's query heads and the rows i >= j that see key j,
// dv_j = sum P_ij dO_i and dk_j = scale * sum dS_ij q_i, summed in fp32 and rounded once.
template <typename T>
__global__ void attention_dkv_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse,
                                     const float* delta, T* dk, T* dv, Geometry g) {
  extern __shared__ float smem[];
  const std::int64_t j = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
  const std::int64_t rows = g.seq - j;  // queries i = j .. seq-1
  float* kj = smem;                     // [d]
  float* vj = smem + g.d;               // [d]
  float* acc_k = smem + 2 * g.d;        // [d]
  float* acc_v = smem + 3 * g.d;        // [d]
  float* p = smem + 4 * g.d;            // [rows]
  float* ds = smem + 4 * g.d + rows;    // [rows]
  const std::int64_t kv = at(b, j, g.seq, g.wkv, kvh, g.d);
  for (std::int64_t c = threadIdx.x; c < g.d; c += blockDim.x) {
    kj[c] = ld(k[kv + c]);
    vj[c] = ld(v[kv + c]);
    acc_k[c] = 0;
    acc_v[c] = 0;
  }
  __syncthreads();
  for (std::int64_t hd = kvh * g.group; hd < (kvh + 1) * g.group; ++hd) {
    for (std::int64_t r = threadIdx.x; r < rows; r += blockDim.x) {
      const std::int64_t i = j + r;
      const std::int64_t qrow = at(b, i, g.seq, g.wq, hd, g.d);
      float s = 0, dp = 0;
      for (std::int64_t c = 0; c < g.d; ++c) {
        s += ld(q[qrow + c]) * kj[c];
        dp += ld(dout[qrow + c]) * vj[c];
      }
      const std::int64_t stat = (b * g.heads + hd) * g.seq + i;
      const float pij = expf(s * g.scale - lse[stat]);
      p[r] = pij;
      ds[r] = pij * (dp - delta[stat]);
    }
    __syncthreads();
    for (std::int64_t c = threadIdx.x; c < g.d; c += blockDim.x) {
      float sk = 0, sv = 0;
      for (std::int64_t r = 0; r < rows; ++r) {
        const std::int64_t qrow = at(b, j + r, g.seq, g.wq, hd, g.d);
        sv += p[r] * ld(dout[qrow + c]);
        sk += ds[r] * ld(q[qrow + c]);
      }
      acc_v[c] += sv;
      acc_k[c] += sk * g.scale;
    }
    __syncthreads();  // p and ds are rewritten for the next head
  }
  for (std::int64_t c = threadIdx.x; c < g.d; c += blockDim.x) {
    dk[kv + c] = st<T>(acc_k[c]);
    dv[kv + c] = st<T>(acc_v[c]);
  }
}

// Dynamic shared memory above the 48 KiB default needs an opt-in per kernel.
template <typename Kernel>
void allow_shared(Kernel kernel, std::size_t bytes) {
  if (bytes > 48 * 1024)
    cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

}  // namespace

void attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                       const Buffer& out, const Buffer& lse, cudaStream_t s) {
  if (flash_attention_supported(shape, q, k, v, out)) return flash_attention_forward(shape, q, k, v, out, lse, s);
  const Geometry g = attention_geometry(shape);
  const dim3 grid(static_cast<unsigned>(g.seq), static_cast<unsigned>(g.heads), static_cast<unsigned>(shape.batch));
  const std::size_t smem = static_cast<std::size_t>(g.d + g.seq) * sizeof(float);
  on_type(q.type, [&](auto tag) {
    using T = decltype(tag);
    allow_shared(attention_forward_kernel<T>, smem);
    attention_forward_kernel<T><<<grid, kAttnThreads, smem, s>>>(q.as<const T>(), k.as<const T>(), v.as<const T>(),
                                                                 out.as<T>(), lse.as<float>(), g);
  });
}

void attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                        const Buffer& out, const Buffer& dout, const Buffer& lse, const Buffer& dq, const Buffer& dk,
                        const Buffer& dv, const Workspace& ws, cudaStream_t s) {
  const Geometry g = attention_geometry(shape);
  float* delta = ws.floats;  // [batch x heads x seq]; the interface checked the workspace's size
  const dim3 rows(static_cast<unsigned>(g.seq), static_cast<unsigned>(g.heads), static_cast<unsigned>(shape.batch));
  const dim3 keys(static_cast<unsigned>(g.seq), static_cast<unsigned>(g.kv_heads), static_cast<unsigned>(shape.batch));
  const std::size_t dq_smem = static_cast<std::size_t>(2 * g.d + g.seq) * sizeof(float);
  const std::size_t dkv_smem = static_cast<std::size_t>(4 * g.d + 2 * g.seq) * sizeof(float);
  const bool flash = flash_attention_supported(shape, q, k, v, dout);
  on_type(q.type, [&](auto tag) {
    using T = decltype(tag);
    attention_delta_kernel<T><<<rows, 32, 0, s>>>(out.as<const T>(), dout.as<const T>(), delta, g);
    if (flash) return flash_attention_backward(shape, q, k, v, dout, lse, delta, dq, dk, dv, s);
    allow_shared(attention_dq_kernel<T>, dq_smem);
    attention_dq_kernel<T><<<rows, kAttnThreads, dq_smem, s>>>(q.as<const T>(), k.as<const T>(), v.as<const T>(),
                                                               dout.as<const T>(), lse.as<const float>(), delta,
                                                               dq.as<T>(), g);
    allow_shared(attention_dkv_kernel<T>, dkv_smem);
    attention_dkv_kernel<T><<<keys, kAttnThreads, dkv_smem, s>>>(q.as<const T>(), k.as<const T>(), v.as<const T>(),
                                                                 dout.as<const T>(), lse.as<const float>(), delta,
                                                                 dk.as<T>(), dv.as<T>(), g);
  });
}

}  // namespace hzp::runtime::cuda
