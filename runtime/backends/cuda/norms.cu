// Row-wise kernels of the CUDA backend (launch.h): RMSNorm, row softmax and softmax cross-entropy, one block
// per row with block reductions. fp32 math, one rounding per result; sums run in a different order than the
// CPU reference's (a tree instead of a left-to-right loop), which the kernel tests' tolerances allow.
#include <algorithm>

#include "runtime/backends/cuda/cuda_common.cuh"
#include "runtime/backends/cuda/launch.h"

namespace hzp::runtime::cuda {
namespace {

constexpr int kRowThreads = 256;

// --- RMSNorm --------------------------------------------------------------------------------------------------

template <typename T>
__global__ void rmsnorm_forward_kernel(const T* x, const T* w, T* y, float* rstd, std::int64_t h) {
  __shared__ float shared[32];
  const T* xr = x + blockIdx.x * h;
  T* yr = y + blockIdx.x * h;
  float sum_sq = 0;
  for (std::int64_t i = threadIdx.x; i < h; i += blockDim.x) {
    const float v = ld(xr[i]);
    sum_sq += v * v;
  }
  sum_sq = block_sum(sum_sq, shared);
  const float s = rsqrtf(sum_sq / static_cast<float>(h) + Kernels::kNormEps);
  if (threadIdx.x == 0) rstd[blockIdx.x] = s;
  for (std::int64_t i = threadIdx.x; i < h; i += blockDim.x) yr[i] = st<T>(ld(xr[i]) * s * ld(w[i]));
}

// dx = r * (dy * w) - r^3 / h * x * sum_i(dy_i w_i x_i) per row; block b adds its rows' dy * x * r into its own
// row of `partial` (fp32 [blocks x h]), summed over blocks into dw by rmsnorm_dw_kernel.
template <typename T>
__global__ void rmsnorm_backward_kernel(const T* x, const T* w, const float* rstd, const T* dy, T* dx, float* partial,
                                        std::int64_t rows, std::int64_t h, bool accumulate) {
  __shared__ float shared[32];
  float* mine = partial + blockIdx.x * h;
  for (std::int64_t i = threadIdx.x; i < h; i += blockDim.x) mine[i] = 0;
  for (std::int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * h;
    const T* dyr = dy + r * h;
    T* dxr = dx + r * h;
    const float s = rstd[r];
    float dot = 0;
    for (std::int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      const float xv = ld(xr[i]), g = ld(dyr[i]);
      dot += g * ld(w[i]) * xv;
      mine[i] += g * xv * s;
    }
    dot = block_sum(dot, shared);
    const float c = dot * s * s * s / static_cast<float>(h);
    for (std::int64_t i = threadIdx.x; i < h; i += blockDim.x) {
      const float g = s * ld(dyr[i]) * ld(w[i]) - c * ld(xr[i]);
      dxr[i] = st<T>(accumulate ? ld(dxr[i]) + g : g);
    }
  }
}

template <typename W>
__global__ void rmsnorm_dw_kernel(const float* partial, int blocks, W* dw, std::int64_t h) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < h;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    float acc = ld(dw[i]);
    for (int b = 0; b < blocks; ++b) acc += partial[b * h + i];
    dw[i] = st<W>(acc);
  }
}

// --- Row softmax --------------------------------------------------------------------------------------------------

template <typename X, typename P>
__global__ void softmax_rows_kernel(const X* x, P* p, std::int64_t n) {
  __shared__ float shared[32];
  const X* xr = x + blockIdx.x * n;
  P* pr = p + blockIdx.x * n;
  float mx = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) mx = fmaxf(mx, ld(xr[i]));
  mx = block_max(mx, shared);
  float sum = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += expf(ld(xr[i]) - mx);
  sum = block_sum(sum, shared);
  const float inv = 1.0f / sum;
  // p may be x: every thread has read its elements of x above, and writes only those.
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) pr[i] = st<P>(expf(ld(xr[i]) - mx) * inv);
}

template <typename P, typename D, typename X>
__global__ void softmax_rows_backward_kernel(const P* p, const D* dp, X* dx, std::int64_t n) {
  __shared__ float shared[32];
  const P* pr = p + blockIdx.x * n;
  const D* dpr = dp + blockIdx.x * n;
  X* dxr = dx + blockIdx.x * n;
  float dot = 0;
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) dot += ld(pr[i]) * ld(dpr[i]);
  dot = block_sum(dot, shared);
  for (std::int64_t i = threadIdx.x; i < n; i += blockDim.x) dxr[i] = st<X>(ld(pr[i]) * (ld(dpr[i]) - dot));
}

// --- Cross-entropy: reserve = [lse (rows) | token loss (rows)] -----------------------------------------------------

template <typename T>
__global__ void cross_entropy_forward_kernel(const T* logits, const std::int32_t* targets, float* reserve,
                                             std::int64_t rows, std::int64_t vocab) {
  __shared__ float shared[32];
  const T* l = logits + blockIdx.x * vocab;
  float mx = -INFINITY;
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, ld(l[i]));
  mx = block_max(mx, shared);
  float sum = 0;
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) sum += expf(ld(l[i]) - mx);
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const float lse = mx + logf(sum);
    const std::int32_t target = targets[blockIdx.x];
    reserve[blockIdx.x] = lse;
    reserve[rows + blockIdx.x] = target >= 0 && target < vocab ? lse - ld(l[target]) : NAN;
  }
}

// loss_sum += the rows' token losses, summed in fp64 by one block (deterministic).
__global__ void sum_losses_kernel(const float* losses, std::int64_t rows, double* loss_sum) {
  __shared__ double shared[32];
  double sum = 0;
  for (std::int64_t i = threadIdx.x; i < rows; i += blockDim.x) sum += losses[i];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) loss_sum[0] += sum;
}

template <typename T>
__global__ void cross_entropy_backward_kernel(const T* logits, const std::int32_t* targets, const float* lse,
                                              float scale, T* dlogits, std::int64_t vocab) {
  const T* l = logits + blockIdx.x * vocab;
  T* dl = dlogits + blockIdx.x * vocab;
  const float m = lse[blockIdx.x];
  const std::int32_t target = targets[blockIdx.x];
  // dlogits may be logits: each element is read, then written, by the same thread.
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    float g = scale * expf(ld(l[i]) - m);
    if (i == target) g -= scale;
    dl[i] = st<T>(g);
  }
}

}  // namespace

void rmsnorm_forward(const Buffer& x, const Buffer& w, const Buffer& y, const Buffer& rstd, std::int64_t rows,
                     std::int64_t h, cudaStream_t s) {
  if (rows == 0) return;
  on_type(x.type, [&](auto tag) {
    using T = decltype(tag);
    rmsnorm_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(x.as<const T>(), w.as<const T>(),
                                                                               y.as<T>(), rstd.as<float>(), h);
  });
}

void rmsnorm_backward(const Buffer& x, const Buffer& w, const Buffer& rstd, const Buffer& dy, const Buffer& dx,
                      const Buffer& dw, std::int64_t rows, std::int64_t h, bool accumulate, const Workspace& ws,
                      cudaStream_t s) {
  if (rows == 0) return;
  // As many row blocks as the fp32 scratch holds partial rows of dw (at most 256).
  const int blocks =
      static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>({rows, 256, ws.float_count / h})));
  on_types(x.type, dw.type, [&](auto tx, auto tw) {
    using T = decltype(tx);
    using W = decltype(tw);
    rmsnorm_backward_kernel<<<blocks, kRowThreads, 0, s>>>(x.as<const T>(), w.as<const T>(), rstd.as<const float>(),
                                                           dy.as<const T>(), dx.as<T>(), ws.floats, rows, h,
                                                           accumulate);
    rmsnorm_dw_kernel<<<blocks_for(h), kThreads, 0, s>>>(ws.floats, blocks, dw.as<W>(), h);
  });
}

void softmax_rows(const Buffer& x, const Buffer& p, std::int64_t rows, std::int64_t n, cudaStream_t s) {
  if (rows == 0) return;
  on_types(x.type, p.type, [&](auto tx, auto tp) {
    using X = decltype(tx);
    using P = decltype(tp);
    softmax_rows_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(x.as<const X>(), p.as<P>(), n);
  });
}

void softmax_rows_backward(const Buffer& p, const Buffer& dp, const Buffer& dx, std::int64_t rows, std::int64_t n,
                           cudaStream_t s) {
  if (rows == 0) return;
  on_types(p.type, dx.type, [&](auto tp, auto tx) {
    on_type(dp.type, [&](auto td) {
      using P = decltype(tp);
      using D = decltype(td);
      using X = decltype(tx);
      softmax_rows_backward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(p.as<const P>(),
                                                                                       dp.as<const D>(), dx.as<X>(), n);
    });
  });
}

void cross_entropy_forward(const Buffer& logits, const Buffer& targets, const Buffer& reserve, const Buffer& loss_sum,
                           std::int64_t rows, std::int64_t vocab, cudaStream_t s) {
  if (rows == 0) return;
  on_type(logits.type, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_forward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(
        logits.as<const T>(), targets.as<const std::int32_t>(), reserve.as<float>(), rows, vocab);
  });
  sum_losses_kernel<<<1, 1024, 0, s>>>(reserve.as<const float>() + rows, rows, loss_sum.as<double>());
}

void cross_entropy_backward(const Buffer& logits, const Buffer& targets, const Buffer& reserve, float scale,
                            const Buffer& dlogits, std::int64_t rows, std::int64_t vocab, cudaStream_t s) {
  if (rows == 0) return;
  on_type(logits.type, [&](auto tag) {
    using T = decltype(tag);
    cross_entropy_backward_kernel<<<static_cast<unsigned>(rows), kRowThreads, 0, s>>>(
        logits.as<const T>(), targets.as<const std::int32_t>(), reserve.as<const float>(), scale, dlogits.as<T>(),
        vocab);
  });
}

}  // namespace hzp::runtime::cuda
