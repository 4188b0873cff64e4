// MoE kernels of the CUDA backend (launch.h): router top-k, the load-balancing loss, token permutation and
// its weighted inverse, their backward, and grouping received rows by local expert (the expert GEMMs are
// cuBLAS products: cuda_kernels.cc).
// These kernels keep every row count on the device: they read offsets and counts from device memory and blocks past the
// live rows exit. Orders are deterministic and the CPU reference's: rows by (expert, token, slot), groups by
// (local expert, source, arrival).
#include <algorithm>

#include "runtime/backends/cuda/cuda_common.cuh"
#include "runtime/backends/cuda/launch.h"

namespace hzp::runtime::cuda {
namespace {

// Exclusive prefix sum of v over the block (blockDim.x a multiple of 32); `total` gets the block's sum.
// `shared` holds 32 ints. Ends with a barrier.
__device__ int block_exclusive_scan(int v, int* shared, int* total) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  int inclusive = v;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int n = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += n;
  }
  if (lane == 31) shared[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    int w = lane < warps ? shared[lane] : 0;
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int n = __shfl_up_sync(0xffffffffu, w, offset);
      if (lane >= offset) w += n;
    }
    if (lane < warps) shared[lane] = w;  // inclusive sums of the warps
  }
  __syncthreads();
  const int before = warp == 0 ? 0 : shared[warp - 1];
  *total = shared[warps - 1];
  __syncthreads();
  return before + inclusive - v;
}

// --- Router ----------------------------------------------------------------------------------------------------

// One thread per token: the k largest probabilities, best first, ties to the lower index (insertion into the
// sorted list of the best so far, strict >), written straight into `selected`.
__global__ void topk_kernel(const float* probs, std::int32_t* selected, float* weight, float* psum,
                            unsigned long long* count, std::int64_t t, std::int64_t e, std::int64_t k) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= t) return;
  const float* p = probs + i * e;
  std::int32_t* sel = selected + i * k;
  std::int64_t filled = 0;
  for (std::int64_t j = 0; j < e; ++j) {
    if (filled == k && !(p[j] > p[sel[k - 1]])) continue;
    std::int64_t pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && p[j] > p[sel[pos - 1]]) {
      sel[pos] = sel[pos - 1];
      --pos;
    }
    sel[pos] = static_cast<std::int32_t>(j);
  }
  float sum = 0;
  for (std::int64_t s = 0; s < k; ++s) sum += p[sel[s]];
  psum[i] = sum;
  for (std::int64_t s = 0; s < k; ++s) {
    weight[i * k + s] = p[sel[s]] / sum;
    atomicAdd(count + sel[s], 1ull);
  }
}

// Block e: fraction[e] = count[e] / (t k), and term[e] = fraction[e] * mean_t probs[t][e].
__global__ void aux_terms_kernel(const float* probs, const std::int64_t* count, float* fraction, double* term,
                                 std::int64_t t, std::int64_t e, std::int64_t k) {
  __shared__ double shared[32];
  const std::int64_t j = blockIdx.x;
  double sum = 0;
  for (std::int64_t i = threadIdx.x; i < t; i += blockDim.x) sum += probs[i * e + j];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) {
    const float f = static_cast<float>(static_cast<double>(count[j]) / static_cast<double>(t * k));
    fraction[j] = f;
    term[j] = static_cast<double>(f) * sum / static_cast<double>(t);
  }
}

__global__ void aux_sum_kernel(const double* term, std::int64_t e, double* aux_sum) {
  double aux = 0;
  for (std::int64_t j = 0; j < e; ++j) aux += term[j];
  aux_sum[0] += aux * static_cast<double>(e);
}

// --- Permutation -------------------------------------------------------------------------------------------------

// Block e: the assignments (token, slot) routed to expert e, in order, get rows offset(e), offset(e) + 1, ...
__global__ void permute_rows_kernel(const std::int32_t* selected, const std::int64_t* count, std::int64_t* send_row,
                                    std::int64_t assignments) {
  __shared__ int shared[32];
  __shared__ std::int64_t base;
  const std::int32_t e = static_cast<std::int32_t>(blockIdx.x);
  if (threadIdx.x == 0) {
    std::int64_t b = 0;
    for (std::int32_t j = 0; j < e; ++j) b += count[j];
    base = b;
  }
  __syncthreads();
  std::int64_t next = base;
  for (std::int64_t start = 0; start < assignments; start += blockDim.x) {
    const std::int64_t a = start + threadIdx.x;
    const int mine = a < assignments && selected[a] == e;
    int total = 0;
    const int before = block_exclusive_scan(mine, shared, &total);
    if (mine) send_row[a] = next + before;
    next += total;
  }
}

template <typename T>
__global__ void copy_rows_kernel(const T* x, const std::int64_t* send_row, T* rows, std::int64_t assignments,
                                 std::int64_t k, std::int64_t h) {
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < assignments * h;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t a = idx / h, c = idx % h;
    rows[send_row[a] * h + c] = x[(a / k) * h + c];
  }
}

template <typename R, typename X>
__global__ void combine_kernel(const R* rows, const std::int64_t* send_row, const float* weight, X* x, std::int64_t t,
                               std::int64_t k, std::int64_t h, bool accumulate) {
  for (std::int64_t idx = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; idx < t * h;
       idx += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const std::int64_t i = idx / h, c = idx % h;
    float acc = accumulate ? ld(x[idx]) : 0.0f;
    for (std::int64_t s = 0; s < k; ++s) {
      const float w = weight != nullptr ? weight[i * k + s] : 1.0f;
      acc += w * ld(rows[send_row[i * k + s] * h + c]);
    }
    x[idx] = st<X>(acc);
  }
}

// Block (token, slot): grad row = weight * dx[token]; dweight = <dx[token], rows[send_row]>.
template <typename X, typename R, typename G>
__global__ void combine_backward_kernel(const X* dx, const R* rows, const std::int64_t* send_row, const float* weight,
                                        G* grad_rows, float* dweight, std::int64_t k, std::int64_t h) {
  __shared__ float shared[32];
  const std::int64_t a = blockIdx.x, i = a / k, r = send_row[a];
  const float w = weight[a];
  float dot = 0;
  for (std::int64_t c = threadIdx.x; c < h; c += blockDim.x) {
    const float d = ld(dx[i * h + c]);
    grad_rows[r * h + c] = st<G>(w * d);
    dot += d * ld(rows[r * h + c]);
  }
  dot = block_sum(dot, shared);
  if (threadIdx.x == 0) dweight[a] = dot;
}

__global__ void router_backward_kernel(const float* dweight, const float* weight, const std::int32_t* selected,
                                       const float* psum, const float* fraction, float aux_coef, float* dp,
                                       std::int64_t t, std::int64_t e, std::int64_t k) {
  const std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (i >= t) return;
  float* row = dp + i * e;
  for (std::int64_t j = 0; j < e; ++j) row[j] = aux_coef * fraction[j];
  float gw = 0;
  for (std::int64_t s = 0; s < k; ++s) gw += dweight[i * k + s] * weight[i * k + s];
  for (std::int64_t s = 0; s < k; ++s) row[selected[i * k + s]] += (dweight[i * k + s] - gw) / psum[i];
}

// --- Grouping by local expert -----------------------------------------------------------------------------------

// One thread: offsets[l] (first grouped row of expert l), and per run (source j, expert l) in received order
// its first received row run_start[j*local + l] (run_start[runs] = the live rows) and its first grouped row
// dest[j*local + l].
__global__ void group_tables_kernel(const std::int64_t* counts, std::int64_t sources, std::int64_t local,
                                    std::int64_t* offsets, std::int64_t* run_start, std::int64_t* dest) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  offsets[0] = 0;
  for (std::int64_t l = 0; l < local; ++l) {
    std::int64_t n = 0;
    for (std::int64_t j = 0; j < sources; ++j) n += counts[j * local + l] > 0 ? counts[j * local + l] : 0;
    offsets[l + 1] = offsets[l] + n;
  }
  std::int64_t received = 0;
  for (std::int64_t j = 0; j < sources; ++j)
    for (std::int64_t l = 0; l < local; ++l) {
      std::int64_t before = offsets[l];
      for (std::int64_t jj = 0; jj < j; ++jj) before += counts[jj * local + l];
      run_start[j * local + l] = received;
      dest[j * local + l] = before;
      received += counts[j * local + l] > 0 ? counts[j * local + l] : 0;
    }
  run_start[sources * local] = received;
}

template <typename T>
__global__ void group_rows_kernel(const T* recv, const std::int64_t* run_start, const std::int64_t* dest,
                                  std::int64_t runs, std::int64_t capacity, T* grouped, std::int64_t* order,
                                  std::int64_t h) {
  const std::int64_t live = run_start[runs] < capacity ? run_start[runs] : capacity;
  for (std::int64_t r = blockIdx.x; r < live; r += gridDim.x) {
    // The last run starting at or before r holds it (empty runs share their start with the next one).
    std::int64_t lo = 0, hi = runs - 1;
    while (lo < hi) {
      const std::int64_t mid = (lo + hi + 1) / 2;
      if (run_start[mid] <= r)
        lo = mid;
      else
        hi = mid - 1;
    }
    const std::int64_t pos = dest[lo] + (r - run_start[lo]);
    if (threadIdx.x == 0) order[pos] = r;
    for (std::int64_t c = threadIdx.x; c < h; c += blockDim.x) grouped[pos * h + c] = recv[r * h + c];
  }
}

template <typename T>
__global__ void ungroup_rows_kernel(const T* grouped, const std::int64_t* order, const std::int64_t* offsets,
                                    std::int64_t local, T* out, std::int64_t width) {
  const std::int64_t live = offsets[local];
  for (std::int64_t p = blockIdx.x; p < live; p += gridDim.x)
    for (std::int64_t c = threadIdx.x; c < width; c += blockDim.x) out[order[p] * width + c] = grouped[p * width + c];
}

__global__ void sum_counts_kernel(const std::int64_t* counts, std::int64_t* out, std::int64_t n, std::int64_t local,
                                  std::int64_t multiplier) {
  const std::int64_t j = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  if (j >= n) return;
  std::int64_t sum = 0;
  for (std::int64_t l = 0; l < local; ++l) sum += counts[j * local + l];
  out[j] = sum * multiplier;
}

}  // namespace

void moe_topk(const Buffer& probs, const Buffer& selected, const Buffer& weight, const Buffer& psum,
              const Buffer& expert_count, std::int64_t t, std::int64_t experts, std::int64_t k, cudaStream_t s) {
  cudaMemsetAsync(expert_count.data, 0, static_cast<std::size_t>(expert_count.bytes()), s);
  if (t == 0) return;
  topk_kernel<<<blocks_for(t), kThreads, 0, s>>>(probs.as<const float>(), selected.as<std::int32_t>(),
                                                 weight.as<float>(), psum.as<float>(),
                                                 static_cast<unsigned long long*>(expert_count.data), t, experts, k);
}

void moe_aux_loss(const Buffer& probs, const Buffer& expert_count, const Buffer& fraction, const Buffer& aux_sum,
                  std::int64_t t, std::int64_t experts, std::int64_t k, const Workspace& ws, cudaStream_t s) {
  aux_terms_kernel<<<static_cast<unsigned>(experts), kThreads, 0, s>>>(
      probs.as<const float>(), expert_count.as<const std::int64_t>(), fraction.as<float>(), ws.doubles, t, experts, k);
  aux_sum_kernel<<<1, 1, 0, s>>>(ws.doubles, experts, aux_sum.as<double>());
}

void moe_permute(const Buffer& x, const Buffer& selected, const Buffer& expert_count, const Buffer& rows,
                 const Buffer& send_row, std::int64_t t, std::int64_t experts, std::int64_t k, std::int64_t h,
                 cudaStream_t s) {
  if (t == 0) return;
  permute_rows_kernel<<<static_cast<unsigned>(experts), 1024, 0, s>>>(
      selected.as<const std::int32_t>(), expert_count.as<const std::int64_t>(), send_row.as<std::int64_t>(), t * k);
  on_type(x.type, [&](auto tag) {
    using T = decltype(tag);
    copy_rows_kernel<<<blocks_for(t * k * h), kThreads, 0, s>>>(x.as<const T>(), send_row.as<const std::int64_t>(),
                                                                rows.as<T>(), t * k, k, h);
  });
}

void moe_combine(const Buffer& rows, const Buffer& send_row, const Buffer& weight, const Buffer& x, std::int64_t t,
                 std::int64_t k, std::int64_t h, bool accumulate, cudaStream_t s) {
  if (t == 0) return;
  on_types(rows.type, x.type, [&](auto tr, auto tx) {
    using R = decltype(tr);
    using X = decltype(tx);
    combine_kernel<<<blocks_for(t * h), kThreads, 0, s>>>(rows.as<const R>(), send_row.as<const std::int64_t>(),
                                                          weight.empty() ? nullptr : weight.as<const float>(),
                                                          x.as<X>(), t, k, h, accumulate);
  });
}

void moe_combine_backward(const Buffer& dx, const Buffer& rows, const Buffer& send_row, const Buffer& weight,
                          const Buffer& grad_rows, const Buffer& dweight, std::int64_t t, std::int64_t k,
                          std::int64_t h, cudaStream_t s) {
  if (t == 0) return;
  on_types(dx.type, rows.type, [&](auto tx, auto tr) {
    on_type(grad_rows.type, [&](auto tg) {
      using X = decltype(tx);
      using R = decltype(tr);
      using G = decltype(tg);
      combine_backward_kernel<<<static_cast<unsigned>(t * k), 128, 0, s>>>(
          dx.as<const X>(), rows.as<const R>(), send_row.as<const std::int64_t>(), weight.as<const float>(),
          grad_rows.as<G>(), dweight.as<float>(), k, h);
    });
  });
}

void moe_router_backward(const Buffer& dweight, const Buffer& weight, const Buffer& selected, const Buffer& psum,
                         const Buffer& fraction, float aux_coef, const Buffer& dp, std::int64_t t, std::int64_t experts,
                         std::int64_t k, cudaStream_t s) {
  if (t == 0) return;
  router_backward_kernel<<<blocks_for(t), kThreads, 0, s>>>(
      dweight.as<const float>(), weight.as<const float>(), selected.as<const std::int32_t>(), psum.as<const float>(),
      fraction.as<const float>(), aux_coef, dp.as<float>(), t, experts, k);
}

void moe_group(const Buffer& recv, const Buffer& counts, const Buffer& grouped, const Buffer& order,
               const Buffer& offsets, std::int64_t sources, std::int64_t local, std::int64_t h, const Workspace& ws,
               cudaStream_t s) {
  const std::int64_t runs = sources * local;
  std::int64_t* run_start = ws.ints;        // [runs + 1]
  std::int64_t* dest = ws.ints + runs + 1;  // [runs]; the caller checked that the int scratch holds both
  group_tables_kernel<<<1, 1, 0, s>>>(counts.as<const std::int64_t>(), sources, local, offsets.as<std::int64_t>(),
                                      run_start, dest);
  const std::int64_t capacity = recv.count / h;
  if (capacity == 0) return;
  on_type(recv.type, [&](auto tag) {
    using T = decltype(tag);
    group_rows_kernel<<<static_cast<unsigned>(std::min<std::int64_t>(capacity, 65535)), 128, 0, s>>>(
        recv.as<const T>(), run_start, dest, runs, capacity, grouped.as<T>(), order.as<std::int64_t>(), h);
  });
}

void moe_ungroup(const Buffer& grouped, const Buffer& order, const Buffer& offsets, const Buffer& out,
                 std::int64_t local, std::int64_t width, cudaStream_t s) {
  const std::int64_t capacity = grouped.count / width;
  if (capacity == 0) return;
  on_type(grouped.type, [&](auto tag) {
    using T = decltype(tag);
    ungroup_rows_kernel<<<static_cast<unsigned>(std::min<std::int64_t>(capacity, 65535)), 128, 0, s>>>(
        grouped.as<const T>(), order.as<const std::int64_t>(), offsets.as<const std::int64_t>(), local, out.as<T>(),
        width);
  });
}

void sum_counts(const Buffer& counts, const Buffer& out, std::int64_t n, std::int64_t local, std::int64_t multiplier,
                cudaStream_t s) {
  sum_counts_kernel<<<blocks_for(n), kThreads, 0, s>>>(counts.as<const std::int64_t>(), out.as<std::int64_t>(), n,
                                                       local, multiplier);
}

}  // namespace hzp::runtime::cuda
