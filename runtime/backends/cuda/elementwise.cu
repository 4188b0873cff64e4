// Element-wise kernels of the CUDA backend (launch.h): fill, cast, scale, add, the gradient norm and clipping,
// multi-tensor AdamW, embedding, rotary positions and SwiGLU. Arithmetic and rounding follow the CPU
// reference (runtime/backends/cpu/cpu_kernels.cc): fp32 math, one round-to-nearest-even per result.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "runtime/backends/cuda/cuda_common.cuh"
#include "runtime/backends/cuda/launch.h"

namespace hzp::runtime::cuda {
namespace {

// fp64 joins the tensor types for fill / cast / scale (through fp32, as the CPU reference converts).
__device__ __forceinline__ float ld(double x) {
  return static_cast<float>(x);
}
using hzp::runtime::cuda::ld;
template <typename T>
__device__ __forceinline__ T st_any(float f) {
  if constexpr (std::is_same_v<T, double>)
    return static_cast<double>(f);
  else
    return st<T>(f);
}

template <typename F>
void on_float_type(ScalarType t, F&& f) {
  if (t == ScalarType::kFp64)
    f(double{});
  else
    on_type(t, f);
}

// --- fill, cast, scale, add --------------------------------------------------------------------------------

template <typename T>
__global__ void fill_kernel(T* x, std::int64_t n, T value) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    x[i] = value;
}

template <typename S, typename D>
__global__ void cast_kernel(const S* in, D* out, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<S, double> && std::is_same_v<D, double>)
      out[i] = in[i];
    else
      out[i] = st_any<D>(ld(in[i]));
  }
}

template <typename T>
__global__ void scale_kernel(T* x, std::int64_t n, float alpha) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (std::is_same_v<T, double>)
      x[i] *= alpha;
    else
      x[i] = st<T>(ld(x[i]) * alpha);
  }
}

template <typename S, typename D>
__global__ void add_kernel(const S* a, D* b, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    b[i] = st<D>(ld(b[i]) + ld(a[i]));
}

// --- The gradient norm ---------------------------------------------------------------------------------------

template <typename T>
__global__ void sum_squares_kernel(const T* x, std::int64_t n, double replicas, double* acc) {
  __shared__ double shared[32];
  double sum = 0;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float v = ld(x[i]);
    sum += static_cast<double>(v) * v;
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) atomicAdd(acc, sum / replicas);
}

__global__ void clip_coefficient_kernel(const float* norm_sq, double max_norm, double inv_scale, double* norm,
                                        float* coef) {
  const double n = sqrt(static_cast<double>(norm_sq[0])) * inv_scale;
  norm[0] = n;
  const double clip = max_norm > 0 ? fmin(1.0, max_norm / (n + 1e-6)) : 1.0;
  coef[0] = static_cast<float>(clip * inv_scale);
}

// --- AdamW: up to kAdamChunk tensors per launch, blockIdx.y picks the tensor ----------------------------------

constexpr int kAdamChunk = 24;

struct AdamTensorArg {
  void* param;
  float* master;  // null: param is fp32 and its own master
  const void* grad;
  float* m;
  float* v;
  std::int64_t n;
  double decay;  // lr * weight_decay, or 0
};
struct AdamLaunch {
  AdamTensorArg t[kAdamChunk];
};

template <typename P, typename G>
__global__ void adamw_kernel(AdamLaunch args, double lr, double b1, double b2, double eps, double c1, double c2,
                             const float* coef, const double* skip_if_nonfinite) {
  if (skip_if_nonfinite != nullptr && !isfinite(skip_if_nonfinite[0])) return;
  const AdamTensorArg& a = args.t[blockIdx.y];
  P* p = static_cast<P*>(a.param);
  const G* g = static_cast<const G*>(a.grad);
  const float c = coef[0];
  for (std::int64_t e = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; e < a.n;
       e += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const double grad = static_cast<double>(ld(g[e]) * c);
    const double mm = b1 * a.m[e] + (1 - b1) * grad;
    const double vv = b2 * a.v[e] + (1 - b2) * grad * grad;
    a.m[e] = static_cast<float>(mm);
    a.v[e] = static_cast<float>(vv);
    double w = a.master != nullptr ? a.master[e] : ld(p[e]);
    w -= a.decay * w;
    w -= lr * (mm / c1) / (sqrt(vv / c2) + eps);
    const float wf = static_cast<float>(w);
    if (a.master != nullptr) a.master[e] = wf;
    p[e] = st<P>(wf);
  }
}

// --- Embedding ------------------------------------------------------------------------------------------------

template <typename T>
__global__ void embedding_forward_kernel(const T* table, const std::int32_t* ids, T* out, std::int64_t tokens,
                                         std::int64_t h, std::int64_t vocab) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < tokens * h;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / h, c = i % h;
    const std::int32_t id = ids[t];
    out[i] = id >= 0 && id < vocab ? table[static_cast<std::int64_t>(id) * h + c] : st<T>(NAN);
  }
}

// The backward groups tokens by id without atomics on the table: count each id's tokens, scan the counts into
// segment offsets, scatter token indices into their id's segment (in any order), then one block per id sorts its
// segment by token index (rank sort) and adds the tokens' rows in token order (fp32, from the row's value,
// rounded once): the CPU reference's order, deterministic, O(tokens x hidden) work. Workspace ints:
// counts/offsets [vocab + 1], cursors [vocab], the scattered segment [tokens], the sorted segment [tokens].
__global__ void embedding_count_kernel(const std::int32_t* ids, std::int64_t tokens, std::int64_t vocab,
                                       std::int64_t* count) {
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t id = ids[t];
    if (id >= 0 && id < vocab) atomicAdd(reinterpret_cast<unsigned long long*>(count + id), 1ull);
  }
}

// One block: offsets[i] = count[0] + ... + count[i - 1] in place, offsets[vocab] = the total.
__global__ void embedding_scan_kernel(std::int64_t* offsets, std::int64_t vocab) {
  __shared__ std::int64_t partial[kThreads];
  const std::int64_t chunk = (vocab + blockDim.x - 1) / blockDim.x;
  const std::int64_t begin = threadIdx.x * chunk, end = begin + chunk < vocab ? begin + chunk : vocab;
  std::int64_t sum = 0;
  for (std::int64_t i = begin; i < end; ++i) sum += offsets[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::int64_t run = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) {
      const std::int64_t c = partial[i];
      partial[i] = run;
      run += c;
    }
    offsets[vocab] = run;
  }
  __syncthreads();
  std::int64_t run = partial[threadIdx.x];
  for (std::int64_t i = begin; i < end; ++i) {
    const std::int64_t c = offsets[i];
    offsets[i] = run;
    run += c;
  }
}

__global__ void embedding_scatter_kernel(const std::int32_t* ids, std::int64_t tokens, std::int64_t vocab,
                                         const std::int64_t* offsets, std::int64_t* cursor, std::int64_t* segment) {
  for (std::int64_t t = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; t < tokens;
       t += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int32_t id = ids[t];
    if (id < 0 || id >= vocab) continue;
    const auto slot = atomicAdd(reinterpret_cast<unsigned long long*>(cursor + id), 1ull);
    segment[offsets[id] + static_cast<std::int64_t>(slot)] = t;
  }
}

template <typename D, typename W>
__global__ void embedding_backward_kernel(const D* dout, const std::int64_t* offsets, const std::int64_t* segment,
                                          std::int64_t* sorted, W* dtable, std::int64_t h) {
  const std::int64_t id = blockIdx.x, begin = offsets[id], n = offsets[id + 1] - begin;
  if (n == 0) return;
  for (std::int64_t e = threadIdx.x; e < n; e += blockDim.x) {  // token indices are distinct: rank = place
    const std::int64_t t = segment[begin + e];
    std::int64_t rank = 0;
    for (std::int64_t f = 0; f < n; ++f) rank += segment[begin + f] < t;
    sorted[begin + rank] = t;
  }
  __syncthreads();
  W* row = dtable + id * h;
  for (std::int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    float acc = ld(row[c]);
    for (std::int64_t e = 0; e < n; ++e) acc += ld(dout[sorted[begin + e] * h + c]);
    row[c] = st<W>(acc);
  }
}

// --- Rotary positions -------------------------------------------------------------------------------------------

__global__ void rope_tables_kernel(float* cos_table, float* sin_table, std::int64_t seq, std::int64_t d) {
  const std::int64_t half = d / 2;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < seq * half;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t t = i / half, j = i % half;
    const double inv_freq = pow(10000.0, -2.0 * static_cast<double>(j) / static_cast<double>(d));
    const double angle = static_cast<double>(t) * inv_freq;
    cos_table[i] = static_cast<float>(cos(angle));
    sin_table[i] = static_cast<float>(sin(angle));
  }
}

template <typename T>
__global__ void rope_kernel(T* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                            const float* cos_table, const float* sin_table, float sign) {
  const std::int64_t half = d / 2;
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < rows * heads * half;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = idx % half, rh = idx / half, r = rh / heads;
    T* a = x + rh * d;
    T* b = a + half;
    const float c = cos_table[(r % seq) * half + i];
    const float s = sign * sin_table[(r % seq) * half + i];
    const float ai = ld(a[i]), bi = ld(b[i]);
    a[i] = st<T>(ai * c - bi * s);
    b[i] = st<T>(bi * c + ai * s);
  }
}

// --- SwiGLU -----------------------------------------------------------------------------------------------------

__device__ __forceinline__ std::int64_t live_elements(std::int64_t rows, std::int64_t width,
                                                      const std::int64_t* limit) {
  if (limit == nullptr) return rows * width;
  const std::int64_t r = limit[0] < 0 ? 0 : (limit[0] > rows ? rows : limit[0]);
  return r * width;
}

template <typename T>
__global__ void swiglu_forward_kernel(const T* gate, const T* up, T* act, std::int64_t rows, std::int64_t width,
                                      const std::int64_t* limit) {
  const std::int64_t n = live_elements(rows, width, limit);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = ld(gate[i]);
    act[i] = st<T>(g / (1.0f + expf(-g)) * ld(up[i]));
  }
}

template <typename T>
__global__ void swiglu_backward_kernel(const T* gate, const T* up, const T* dact, T* dgate, T* dup, std::int64_t rows,
                                       std::int64_t width, const std::int64_t* limit) {
  const std::int64_t n = live_elements(rows, width, limit);
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = ld(gate[i]);
    const float sig = 1.0f / (1.0f + expf(-g));
    const float da = ld(dact[i]);
    dup[i] = st<T>(da * g * sig);
    dgate[i] = st<T>(da * ld(up[i]) * sig * (1.0f + g * (1.0f - sig)));
  }
}

}  // namespace

// --- Launchers ------------------------------------------------------------------------------------------------

void fill(const Buffer& x, double value, cudaStream_t s) {
  if (x.count == 0) return;
  switch (x.type) {
    case ScalarType::kInt32:
      fill_kernel<<<blocks_for(x.count), kThreads, 0, s>>>(x.as<std::int32_t>(), x.count,
                                                           static_cast<std::int32_t>(value));
      return;
    case ScalarType::kInt64:
      fill_kernel<<<blocks_for(x.count), kThreads, 0, s>>>(x.as<std::int64_t>(), x.count,
                                                           static_cast<std::int64_t>(value));
      return;
    case ScalarType::kFp64:
      fill_kernel<<<blocks_for(x.count), kThreads, 0, s>>>(x.as<double>(), x.count, value);
      return;
    case ScalarType::kBf16:
      fill_kernel<<<blocks_for(x.count), kThreads, 0, s>>>(x.as<__nv_bfloat16>(), x.count,
                                                           __float2bfloat16_rn(static_cast<float>(value)));
      return;
    case ScalarType::kFp16:
      fill_kernel<<<blocks_for(x.count), kThreads, 0, s>>>(x.as<__half>(), x.count,
                                                           __float2half_rn(static_cast<float>(value)));
      return;
    case ScalarType::kFp32:
      fill_kernel<<<blocks_for(x.count), kThreads, 0, s>>>(x.as<float>(), x.count, static_cast<float>(value));
      return;
  }
}

void cast(const Buffer& src, const Buffer& dst, cudaStream_t s) {
  if (src.count == 0) return;
  on_float_type(src.type, [&](auto ts) {
    on_float_type(dst.type, [&](auto td) {
      using S = decltype(ts);
      using D = decltype(td);
      cast_kernel<<<blocks_for(src.count), kThreads, 0, s>>>(src.as<const S>(), dst.as<D>(), src.count);
    });
  });
}

void scale(const Buffer& x, float alpha, cudaStream_t s) {
  if (x.count == 0) return;
  on_float_type(x.type, [&](auto tag) {
    using T = decltype(tag);
    scale_kernel<<<blocks_for(x.count), kThreads, 0, s>>>(x.as<T>(), x.count, alpha);
  });
}

void add(const Buffer& src, const Buffer& dst, cudaStream_t s) {
  if (src.count == 0) return;
  on_types(src.type, dst.type, [&](auto ts, auto td) {
    using S = decltype(ts);
    using D = decltype(td);
    add_kernel<<<blocks_for(src.count), kThreads, 0, s>>>(src.as<const S>(), dst.as<D>(), src.count);
  });
}

void sum_squares(const Buffer& x, std::int64_t replicas, const Buffer& acc, cudaStream_t s) {
  if (x.count == 0) return;
  on_type(x.type, [&](auto tag) {
    using T = decltype(tag);
    const unsigned blocks = std::min<unsigned>(blocks_for(x.count), 1024);
    sum_squares_kernel<<<blocks, kThreads, 0, s>>>(x.as<const T>(), x.count, static_cast<double>(replicas),
                                                   acc.as<double>());
  });
}

void clip_coefficient(const Buffer& norm_sq, double max_norm, double inv_loss_scale, const Buffer& norm,
                      const Buffer& coef, cudaStream_t s) {
  clip_coefficient_kernel<<<1, 1, 0, s>>>(norm_sq.as<const float>(), max_norm, inv_loss_scale, norm.as<double>(),
                                          coef.as<float>());
}

void adamw(const AdamWHyper& hp, const std::vector<AdamWTensor>& tensors, cudaStream_t s) {
  const double c1 = 1 - std::pow(hp.beta1, static_cast<double>(hp.step));
  const double c2 = 1 - std::pow(hp.beta2, static_cast<double>(hp.step));
  const double* skip = hp.skip_if_nonfinite.empty() ? nullptr : hp.skip_if_nonfinite.as<const double>();
  // Launch the tensors in runs of one (param type, grad type), kAdamChunk at a time.
  for (std::size_t first = 0; first < tensors.size();) {
    const ScalarType pt = tensors[first].param.type, gt = tensors[first].grad.type;
    AdamLaunch args{};
    int count = 0;
    std::int64_t largest = 0;
    std::size_t i = first;
    for (; i < tensors.size() && count < kAdamChunk && tensors[i].param.type == pt && tensors[i].grad.type == gt; ++i) {
      const AdamWTensor& t = tensors[i];
      if (t.param.count == 0) continue;
      args.t[count++] = AdamTensorArg{t.param.data,
                                      t.master.empty() ? nullptr : t.master.as<float>(),
                                      t.grad.data,
                                      t.m.as<float>(),
                                      t.v.as<float>(),
                                      t.param.count,
                                      t.decay ? hp.lr * hp.weight_decay : 0.0};
      largest = std::max(largest, t.param.count);
    }
    first = i;
    if (count == 0) continue;
    const dim3 grid(std::min<unsigned>(blocks_for(largest), 512), static_cast<unsigned>(count));
    on_types(pt, gt, [&](auto tp, auto tg) {
      using P = decltype(tp);
      using G = decltype(tg);
      adamw_kernel<P, G>
          <<<grid, kThreads, 0, s>>>(args, hp.lr, hp.beta1, hp.beta2, hp.eps, c1, c2, hp.coef.as<const float>(), skip);
    });
  }
}

void embedding_forward(const Buffer& table, const Buffer& ids, const Buffer& out, std::int64_t hidden, cudaStream_t s) {
  if (ids.count == 0) return;
  on_type(table.type, [&](auto tag) {
    using T = decltype(tag);
    embedding_forward_kernel<<<blocks_for(ids.count * hidden), kThreads, 0, s>>>(
        table.as<const T>(), ids.as<const std::int32_t>(), out.as<T>(), ids.count, hidden, table.count / hidden);
  });
}

void embedding_backward(const Buffer& dout, const Buffer& ids, const Buffer& dtable, std::int64_t hidden,
                        const Workspace& ws, cudaStream_t s) {
  if (ids.count == 0) return;
  const std::int64_t tokens = ids.count, vocab = dtable.count / hidden;
  std::int64_t* offsets = ws.ints;  // [vocab + 1], first the counts
  std::int64_t* cursor = offsets + vocab + 1;
  std::int64_t* segment = cursor + vocab;
  std::int64_t* sorted = segment + tokens;
  cudaMemsetAsync(offsets, 0, static_cast<std::size_t>(2 * vocab + 1) * sizeof(std::int64_t), s);
  const std::int32_t* id = ids.as<const std::int32_t>();
  embedding_count_kernel<<<blocks_for(tokens), kThreads, 0, s>>>(id, tokens, vocab, offsets);
  embedding_scan_kernel<<<1, kThreads, 0, s>>>(offsets, vocab);
  embedding_scatter_kernel<<<blocks_for(tokens), kThreads, 0, s>>>(id, tokens, vocab, offsets, cursor, segment);
  on_types(dout.type, dtable.type, [&](auto td, auto tw) {
    using D = decltype(td);
    using W = decltype(tw);
    embedding_backward_kernel<<<static_cast<unsigned>(vocab), kThreads, 0, s>>>(dout.as<const D>(), offsets, segment,
                                                                                sorted, dtable.as<W>(), hidden);
  });
}

void rope_tables(const Buffer& cos, const Buffer& sin, std::int64_t seq, std::int64_t d, cudaStream_t s) {
  rope_tables_kernel<<<blocks_for(seq * d / 2), kThreads, 0, s>>>(cos.as<float>(), sin.as<float>(), seq, d);
}

void rope(const Buffer& x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d, const Buffer& cos,
          const Buffer& sin, bool inverse, cudaStream_t s) {
  if (rows == 0) return;
  on_type(x.type, [&](auto tag) {
    using T = decltype(tag);
    rope_kernel<<<blocks_for(rows * heads * (d / 2)), kThreads, 0, s>>>(
        x.as<T>(), rows, seq, heads, d, cos.as<const float>(), sin.as<const float>(), inverse ? -1.0f : 1.0f);
  });
}

void swiglu_forward(const Buffer& gate, const Buffer& up, const Buffer& act, std::int64_t rows, std::int64_t width,
                    const Buffer& row_limit, cudaStream_t s) {
  if (rows * width == 0) return;
  on_type(gate.type, [&](auto tag) {
    using T = decltype(tag);
    swiglu_forward_kernel<<<blocks_for(rows * width), kThreads, 0, s>>>(
        gate.as<const T>(), up.as<const T>(), act.as<T>(), rows, width,
        row_limit.empty() ? nullptr : row_limit.as<const std::int64_t>());
  });
}

void swiglu_backward(const Buffer& gate, const Buffer& up, const Buffer& dact, const Buffer& dgate, const Buffer& dup,
                     std::int64_t rows, std::int64_t width, const Buffer& row_limit, cudaStream_t s) {
  if (rows * width == 0) return;
  on_type(gate.type, [&](auto tag) {
    using T = decltype(tag);
    swiglu_backward_kernel<<<blocks_for(rows * width), kThreads, 0, s>>>(
        gate.as<const T>(), up.as<const T>(), dact.as<const T>(), dgate.as<T>(), dup.as<T>(), rows, width,
        row_limit.empty() ? nullptr : row_limit.as<const std::int64_t>());
  });
}

}  // namespace hzp::runtime::cuda
