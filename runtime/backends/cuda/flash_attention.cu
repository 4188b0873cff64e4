// Causal GQA attention on tensor cores (launch.h): flash attention's tiling (Dao 2023) with the WMMA API, for
// bf16 and fp16 with head dimensions 16..128 in steps of 16. A block owns a 64-row tile (4 warps of 16 rows);
// products run on 16x16x16 fragments from shared memory with fp32 accumulators; softmax statistics and the
// output accumulator stay in fp32. Probabilities (and the backward's dS) are rounded to the operand type before
// their products, as flash attention does. Nothing is kept between forward and backward but the log-sum-exp.
//
// Forward: block (query tile, head, batch) walks the key tiles up to the diagonal with the online softmax.
// Backward, without atomics: block (query tile, head, batch) recomputes P and dS and sums dQ; block (key tile,
// kv head, batch) recomputes them for every query head of its group and sums dK, dV. attention.cu falls back to
// its simple kernels for fp32, other head dimensions, unaligned buffers and HZP_CUDA_ATTENTION=simple. Head
// dimensions 64 and 128 of standard attention run flash_mma.cu's faster kernels instead, unless
// HZP_CUDA_ATTENTION=wmma.
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "runtime/backends/cpu/attention_reference.h"
#include "runtime/backends/cuda/cuda_common.cuh"
#include "runtime/backends/cuda/launch.h"

namespace hzp::runtime::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = 64;  // query rows and keys per tile
constexpr int kWarps = kTile / 16;
constexpr int kFlashThreads = kWarps * 32;
constexpr unsigned kFull = 0xffffffffu;

using Flash = AttentionGeometry;

using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <typename T, typename Layout>
using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, Layout>;
template <typename T, typename Layout>
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, Layout>;

// Rows r0 .. r0+rows-1 of head `head` in a [batch*seq x width] activation into a [rows x d] tile; rows past the
// sequence are zeros, or the last row when `repeat_last` (PASA's padded key block). 16-byte copies (the host
// checked the alignment).
template <typename T>
__device__ void load_tile(T* tile, const T* src, std::int64_t b, std::int64_t r0, std::int64_t width, std::int64_t head,
                          const Flash& g, int rows = kTile, bool repeat_last = false) {
  const int chunks = static_cast<int>(g.d / 8);
  for (int e = threadIdx.x; e < rows * chunks; e += blockDim.x) {
    const int r = e / chunks, c = (e % chunks) * 8;
    std::int64_t t = r0 + r;
    if (repeat_last && t >= g.seq) t = g.seq - 1;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (t < g.seq) value = *reinterpret_cast<const uint4*>(src + (b * g.seq + t) * width + head * g.d + c);
    *reinterpret_cast<uint4*>(tile + r * g.d + c) = value;
  }
}

// The warp's 16 rows of x[64 x Cols] (fp32, row-major) = a[64 x d] b[Cols x d]^T, from row-major tiles.
template <typename T, int Cols = kTile>
__device__ void rows_times_transposed(float* x, const T* a, const T* b, int warp, int d) {
  for (int cb = 0; cb < Cols / 16; ++cb) {
    Acc acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < d; kk += 16) {
      FragA<T, wmma::row_major> fa;
      FragB<T, wmma::col_major> fb;
      wmma::load_matrix_sync(fa, a + warp * 16 * d + kk, d);
      wmma::load_matrix_sync(fb, b + cb * 16 * d + kk, d);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(x + warp * 16 * Cols + cb * 16, acc, Cols, wmma::mem_row_major);
  }
}

// The warp's 16 rows of acc[64 x d] (fp32) += p[64 x Keys] b[Keys x d]; p read transposed when `Transposed`
// (p is then [Keys x 64] and acc row r takes column r of p: dV = P^T dO).
template <typename T, bool Transposed, int Keys = kTile>
__device__ void rows_accumulate(float* acc_tile, const T* p, const T* b, int warp, int d) {
  using LayoutA = typename std::conditional<Transposed, wmma::col_major, wmma::row_major>::type;
  constexpr int ld = Transposed ? kTile : Keys;
  for (int cb = 0; cb < d / 16; ++cb) {
    Acc acc;
    float* out = acc_tile + warp * 16 * d + cb * 16;
    wmma::load_matrix_sync(acc, out, d, wmma::mem_row_major);
    for (int kk = 0; kk < Keys; kk += 16) {
      FragA<T, LayoutA> fa;
      FragB<T, wmma::row_major> fb;
      wmma::load_matrix_sync(fa, Transposed ? p + kk * ld + warp * 16 : p + warp * 16 * ld + kk, ld);
      wmma::load_matrix_sync(fb, b + kk * d + cb * 16, d);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out, acc, d, wmma::mem_row_major);
  }
}

__device__ __forceinline__ void zero(float* x, int n) {
  for (int e = threadIdx.x; e < n; e += blockDim.x) x[e] = 0.0f;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = 16; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFull, x, o));
  return x;
}
__device__ __forceinline__ float warp_sum(float x) {
  for (int o = 16; o > 0; o /= 2) x += __shfl_xor_sync(kFull, x, o);
  return x;
}

// The warp's rows of the forward's result: out = O / l, lse = m + log l (+ c A: PASA's recovery when `avg`).
template <typename T>
__device__ void store_rows(T* out, float* lse, const float* os, const float (&m)[16], const float (&l)[16],
                           const float* avg, float c, std::int64_t i0, std::int64_t hd, std::int64_t b, int warp,
                           int lane, const Flash& g) {
  const int d = static_cast<int>(g.d);
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    const int row = warp * 16 + r;
    const std::int64_t i = i0 + row;
    if (i >= g.seq) continue;
    T* orow = out + (b * g.seq + i) * g.wq + hd * d;
    for (int col = lane; col < d; col += 32) orow[col] = st<T>(os[row * d + col] / l[r]);
    if (lane == 0) lse[(b * g.heads + hd) * g.seq + i] = m[r] + logf(l[r]) + (avg != nullptr ? c * avg[r] : 0.0f);
  }
}

// A warp owns rows 16 * warp .. 16 * warp + 15 of each tile; row by row, lane l reads columns l and l + 32 (no
// bank conflicts) and the warp reduces across lanes.
template <typename T>
__global__ void __launch_bounds__(kFlashThreads)
    flash_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, Flash g) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int d = static_cast<int>(g.d);
  T* qs = reinterpret_cast<T*>(smem);  // [64 x d] each
  T* ks = qs + kTile * d;
  T* vs = ks + kTile * d;
  T* ps = vs + kTile * d;                                    // [64 x 64]
  float* ss = reinterpret_cast<float*>(ps + kTile * kTile);  // [64 x 64]
  float* os = ss + kTile * kTile;                            // [64 x d]
  const std::int64_t i0 = blockIdx.x * static_cast<std::int64_t>(kTile), hd = blockIdx.y, b = blockIdx.z;
  const std::int64_t kvh = hd / g.group;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  load_tile(qs, q, b, i0, g.wq, hd, g);
  zero(os, kTile * d);
  float m[16], l[16];  // the warp's rows' running max and sum (every lane holds them)
#pragma unroll
  for (int r = 0; r < 16; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  for (std::int64_t j0 = 0; j0 <= i0; j0 += kTile) {  // causal: key tiles up to the diagonal one
    __syncthreads();                                  // every warp is done with the previous K, V
    load_tile(ks, k, b, j0, g.wkv, kvh, g);
    load_tile(vs, v, b, j0, g.wkv, kvh, g);
    __syncthreads();
    rows_times_transposed(ss, qs, ks, warp, d);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int row = warp * 16 + r;
      const std::int64_t i = i0 + row, ja = j0 + lane, jb = ja + 32;
      const float* srow = ss + row * kTile;
      const float sa = ja <= i && ja < g.seq ? srow[lane] * g.scale : -INFINITY;
      const float sb = jb <= i && jb < g.seq ? srow[lane + 32] * g.scale : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(fmaxf(sa, sb)));  // finite: key 0 is in every row's first tile
      const float alpha = m[r] == -INFINITY ? 0.0f : expf(m[r] - m_new);
      const float pa = expf(sa - m_new), pb = expf(sb - m_new);
      ps[row * kTile + lane] = st<T>(pa);
      ps[row * kTile + lane + 32] = st<T>(pb);
      l[r] = l[r] * alpha + warp_sum(pa + pb);
      m[r] = m_new;
      for (int c = lane; c < d; c += 32) os[row * d + c] *= alpha;
    }
    __syncwarp();
    rows_accumulate<T, false>(os, ps, vs, warp, d);
    __syncwarp();
  }
  store_rows(out, lse, os, m, l, nullptr, 0.0f, i0, hd, b, warp, lane, g);
}

// PASA (docs/pasa.md), fp16: each block of 128 keys (the last padded by repeating the last key) is shifted
// once, K' = M K with M = I - beta/128 1 1^T stored in fp16 (diag, off), Q is scaled by 1/sqrt(d) before the
// product, and the scores S' = Q K'^T are stored in fp16: a common bias or resonance no longer overflows. The
// online state (m, l, the running average A of the blocks' row means a_j, the output) follows the CPU
// reference's recurrences and rounds each result to fp16 as it does (runtime/backends/cpu/attention_reference.cc),
// so the two agree to fp16 rounding order; the recovered lse = m + log l + c A feeds flash attention's backward.
constexpr int kPasaKeys = 128;
static_assert(kPasaKeys == reference::kPasaBlock, "the CPU reference's block, for which beta is chosen");

__device__ __forceinline__ float rh(float x) {
  return __half2float(__float2half_rn(x));
}

__global__ void __launch_bounds__(kFlashThreads) pasa_forward_kernel(const __half* q, const __half* k, const __half* v,
                                                                     __half* out, float* lse, Flash g, PasaShift pc) {
  extern __shared__ __align__(128) unsigned char smem[];
  using T = __half;
  const int d = static_cast<int>(g.d);
  T* qs = reinterpret_cast<T*>(smem);                            // [64 x d]
  T* ks = qs + kTile * d;                                        // [128 x d], shifted in place
  T* vs = ks + kPasaKeys * d;                                    // [128 x d]
  T* ps = vs + kPasaKeys * d;                                    // [64 x 128]
  float* ss = reinterpret_cast<float*>(ps + kTile * kPasaKeys);  // [64 x 128]: S', then P V as [64 x d]
  float* os = ss + kTile * kPasaKeys;                            // [64 x d]
  float* colsum = os + kTile * d;                                // [d]
  const std::int64_t i0 = blockIdx.x * static_cast<std::int64_t>(kTile), hd = blockIdx.y, b = blockIdx.z;
  const std::int64_t kvh = hd / g.group;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  load_tile(qs, q, b, i0, g.wq, hd, g);
  __syncthreads();
  for (int e = threadIdx.x; e < kTile * d; e += blockDim.x) qs[e] = st<T>(ld(qs[e]) * pc.scale);  // Q / sqrt(d)
  zero(os, kTile * d);
  float m[16], l[16], avg[16];
#pragma unroll
  for (int r = 0; r < 16; ++r) m[r] = -60000.0f, l[r] = 0.0f, avg[r] = 0.0f;  // m starts finite, as the paper's
  const std::int64_t last = (i0 + kTile < g.seq ? i0 + kTile : g.seq) - 1;    // the tile's last real row
  for (std::int64_t j0 = 0; j0 <= last; j0 += kPasaKeys) {
    __syncthreads();  // every warp is done with the previous block
    load_tile(ks, k, b, j0, g.wkv, kvh, g, kPasaKeys, true);
    load_tile(vs, v, b, j0, g.wkv, kvh, g, kPasaKeys, false);
    __syncthreads();
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
      float sum = 0.0f;
      for (int j = 0; j < kPasaKeys; ++j) sum += ld(ks[j * d + c]);
      colsum[c] = sum;
    }
    __syncthreads();
    // K'_jc = diag K_jc + off sum_{i != j} K_ic: the product M K, fp32 accumulation, one rounding.
    for (int e = threadIdx.x; e < kPasaKeys * d; e += blockDim.x)
      ks[e] = st<T>((pc.diag - pc.off) * ld(ks[e]) + pc.off * colsum[e % d]);
    __syncthreads();
    rows_times_transposed<T, kPasaKeys>(ss, qs, ks, warp, d);
    __syncwarp();
    const float blocks = static_cast<float>(j0 / kPasaKeys);
    float alpha[16], beta[16];
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int row = warp * 16 + r;
      const std::int64_t i = i0 + row;
      T* prow = ps + row * kPasaKeys;
      float* srow = ss + row * kPasaKeys;
      alpha[r] = 1.0f, beta[r] = 0.0f;
      if (i >= g.seq || j0 > i) {  // the row does not see this block (uniform across the warp)
        for (int c = lane; c < kPasaKeys; c += 32) prow[c] = st<T>(0.0f);
        continue;
      }
      float sk[kPasaKeys / 32], sum = 0.0f, mj = -INFINITY;
#pragma unroll
      for (int u = 0; u < kPasaKeys / 32; ++u) {
        sk[u] = rh(srow[lane + 32 * u]);  // S' stored in fp16
        sum += sk[u];
        if (j0 + lane + 32 * u <= i) mj = fmaxf(mj, sk[u]);
      }
      sum = warp_sum(sum);
      mj = warp_max(mj);
      const float a = rh(rh(sum) / static_cast<float>(kPasaKeys));  // the pseudo-average over the whole block
      float lj = 0.0f;
#pragma unroll
      for (int u = 0; u < kPasaKeys / 32; ++u) {
        const float p = j0 + lane + 32 * u <= i ? rh(expf(rh(sk[u] - mj))) : 0.0f;
        prow[lane + 32 * u] = st<T>(p);
        lj += p;
      }
      lj = rh(warp_sum(lj));
      const float old_avg = blocks == 0.0f ? a : avg[r];
      const float new_avg = rh(rh(a / (blocks + 1.0f)) + rh(old_avg * rh(blocks / (blocks + 1.0f))));
      const float shift_j = rh(pc.c * rh(a - new_avg)), shift_old = rh(pc.c * rh(old_avg - new_avg));
      const float mn = fmaxf(rh(mj + shift_j), rh(m[r] + shift_old));
      alpha[r] = rh(expf(rh(rh(m[r] - mn) + shift_old)));
      beta[r] = rh(expf(rh(rh(mj - mn) + shift_j)));
      l[r] = rh(rh(alpha[r] * l[r]) + rh(beta[r] * lj));
      m[r] = mn;
      avg[r] = new_avg;
    }
    // S' is spent: P V [64 x d] goes there. Below d = 128 a warp's rows of P V overlay other warps' rows of S',
    // so every warp must be done reading S' (a warp whose rows are past the sequence gets here first).
    __syncthreads();
    float* pv = ss;
    for (int r = 0; r < 16; ++r)
      for (int c = lane; c < d; c += 32) pv[(warp * 16 + r) * d + c] = 0.0f;
    __syncwarp();
    rows_accumulate<T, false, kPasaKeys>(pv, ps, vs, warp, d);
    __syncwarp();
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int row = warp * 16 + r;
      for (int c = lane; c < d; c += 32)
        os[row * d + c] = rh(rh(alpha[r] * os[row * d + c]) + rh(beta[r] * rh(pv[row * d + c])));
    }
    __syncwarp();
  }
  store_rows(out, lse, os, m, l, avg, pc.c, i0, hd, b, warp, lane, g);
}

// P and dS of the warp's rows from S (ss) and dP (dps) of the (query tile i0, key tile j0) pair, P only when
// `ps` is given; rows past the sequence and keys after the query are 0. lse and delta are [seq] of this head.
template <typename T>
__device__ void probabilities(const float* ss, const float* dps, T* ps, T* dss, std::int64_t i0, std::int64_t j0,
                              int warp, int lane, const float* lse, const float* delta, const Flash& g) {
  for (int r = 0; r < 16; ++r) {
    const int row = warp * 16 + r;
    const std::int64_t i = i0 + row;
    const float lse_i = i < g.seq ? lse[i] : 0.0f, delta_i = i < g.seq ? delta[i] : 0.0f;
    for (int c = lane; c < kTile; c += 32) {
      const std::int64_t j = j0 + c;
      const int at = row * kTile + c;
      const float p = i < g.seq && j <= i ? expf(ss[at] * g.scale - lse_i) : 0.0f;  // j <= i < seq
      if (ps != nullptr) ps[at] = st<T>(p);
      dss[at] = st<T>(p * (dps[at] - delta_i));
    }
  }
}

template <typename T>
__global__ void __launch_bounds__(kFlashThreads) flash_dq_kernel(const T* q, const T* k, const T* v, const T* dout,
                                                                 const float* lse, const float* delta, T* dq, Flash g) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int d = static_cast<int>(g.d);
  T* qs = reinterpret_cast<T*>(smem);  // [64 x d] each
  T* dos = qs + kTile * d;
  T* ks = dos + kTile * d;
  T* vs = ks + kTile * d;
  T* dss = vs + kTile * d;                                    // [64 x 64]
  float* ss = reinterpret_cast<float*>(dss + kTile * kTile);  // [64 x 64] each
  float* dps = ss + kTile * kTile;
  float* dqs = dps + kTile * kTile;  // [64 x d]
  const std::int64_t i0 = blockIdx.x * static_cast<std::int64_t>(kTile), hd = blockIdx.y, b = blockIdx.z;
  const std::int64_t kvh = hd / g.group;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const std::int64_t stats = (b * g.heads + hd) * g.seq;
  load_tile(qs, q, b, i0, g.wq, hd, g);
  load_tile(dos, dout, b, i0, g.wq, hd, g);
  zero(dqs, kTile * d);
  for (std::int64_t j0 = 0; j0 <= i0; j0 += kTile) {
    __syncthreads();
    load_tile(ks, k, b, j0, g.wkv, kvh, g);
    load_tile(vs, v, b, j0, g.wkv, kvh, g);
    __syncthreads();
    rows_times_transposed(ss, qs, ks, warp, d);
    rows_times_transposed(dps, dos, vs, warp, d);
    __syncwarp();
    probabilities<T>(ss, dps, nullptr, dss, i0, j0, warp, lane, lse + stats, delta + stats, g);
    __syncwarp();
    rows_accumulate<T, false>(dqs, dss, ks, warp, d);
    __syncwarp();
  }
  for (int r = 0; r < 16; ++r) {
    const int row = warp * 16 + r;
    const std::int64_t i = i0 + row;
    if (i >= g.seq) continue;
    T* out = dq + (b * g.seq + i) * g.wq + hd * d;
    for (int c = lane; c < d; c += 32) out[c] = st<T>(dqs[row * d + c] * g.scale);
  }
}

template <typename T>
__global__ void __launch_bounds__(kFlashThreads)
    flash_dkv_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta, T* dk,
                     T* dv, Flash g) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int d = static_cast<int>(g.d);
  T* ks = reinterpret_cast<T*>(smem);  // [64 x d] each
  T* vs = ks + kTile * d;
  T* qs = vs + kTile * d;
  T* dos = qs + kTile * d;
  T* ps = dos + kTile * d;  // [64 x 64] each
  T* dss = ps + kTile * kTile;
  float* ss = reinterpret_cast<float*>(dss + kTile * kTile);  // [64 x 64] each
  float* dps = ss + kTile * kTile;
  float* dks = dps + kTile * kTile;  // [64 x d] each
  float* dvs = dks + kTile * d;
  const std::int64_t j0 = blockIdx.x * static_cast<std::int64_t>(kTile), kvh = blockIdx.y, b = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  load_tile(ks, k, b, j0, g.wkv, kvh, g);
  load_tile(vs, v, b, j0, g.wkv, kvh, g);
  zero(dks, kTile * d);
  zero(dvs, kTile * d);
  for (std::int64_t hd = kvh * g.group; hd < (kvh + 1) * g.group; ++hd) {
    for (std::int64_t i0 = j0; i0 < g.seq; i0 += kTile) {  // causal: query tiles from the diagonal one
      __syncthreads();                                     // every warp is done with the previous Q, dO, P, dS
      load_tile(qs, q, b, i0, g.wq, hd, g);
      load_tile(dos, dout, b, i0, g.wq, hd, g);
      __syncthreads();
      rows_times_transposed(ss, qs, ks, warp, d);
      rows_times_transposed(dps, dos, vs, warp, d);
      __syncwarp();
      const std::int64_t stats = (b * g.heads + hd) * g.seq;
      probabilities<T>(ss, dps, ps, dss, i0, j0, warp, lane, lse + stats, delta + stats, g);
      __syncthreads();  // the transposed products read every warp's rows
      rows_accumulate<T, true>(dvs, ps, dos, warp, d);
      rows_accumulate<T, true>(dks, dss, qs, warp, d);
    }
  }
  __syncwarp();  // the warp's own rows of dK, dV
  for (int r = 0; r < 16; ++r) {
    const int row = warp * 16 + r;
    const std::int64_t j = j0 + row;
    if (j >= g.seq) continue;
    const std::int64_t at = (b * g.seq + j) * g.wkv + kvh * d;
    for (int c = lane; c < d; c += 32) {
      dk[at + c] = st<T>(dks[row * d + c] * g.scale);
      dv[at + c] = st<T>(dvs[row * d + c]);
    }
  }
}

std::size_t forward_smem(std::int64_t d, std::size_t e) {
  return (3 * kTile * d + kTile * kTile) * e + (kTile * kTile + kTile * d) * sizeof(float);
}
std::size_t dq_smem(std::int64_t d, std::size_t e) {
  return (4 * kTile * d + kTile * kTile) * e + (2 * kTile * kTile + kTile * d) * sizeof(float);
}
std::size_t pasa_smem(std::int64_t d, std::size_t e) {
  return (kTile * d + 2 * kPasaKeys * d + kTile * kPasaKeys) * e + (kTile * kPasaKeys + kTile * d + d) * sizeof(float);
}
std::size_t dkv_smem(std::int64_t d, std::size_t e) {
  return (4 * kTile * d + 2 * kTile * kTile) * e + (2 * kTile * kTile + 2 * kTile * d) * sizeof(float);
}

template <typename Kernel>
void opt_in(Kernel kernel, std::size_t bytes) {
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

dim3 tiles(std::int64_t seq, std::int64_t heads, std::int64_t batch) {
  return dim3(static_cast<unsigned>((seq + kTile - 1) / kTile), static_cast<unsigned>(heads),
              static_cast<unsigned>(batch));
}

bool aligned16(const Buffer& x) {
  return reinterpret_cast<std::uintptr_t>(x.data) % 16 == 0;
}

}  // namespace

const char* attention_kernel_choice() {
  const char* e = std::getenv("HZP_CUDA_ATTENTION");  // read per call: the kernel tests run every choice
  return e == nullptr ? "" : e;
}

namespace {

int shared_limit() {
  int device = 0, limit = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
  return limit;
}

// flash_mma.cu's kernels, unless HZP_CUDA_ATTENTION=wmma asks for this file's (flash_attention_supported said
// yes already).
bool use_mma(const AttentionShape& s) {
  return std::strcmp(attention_kernel_choice(), "wmma") != 0 && mma_attention_supported(s) &&
         mma_attention_shared_bytes(s.head_dim) <= static_cast<std::size_t>(shared_limit());
}

}  // namespace

bool flash_attention_supported(const AttentionShape& s, const Buffer& q, const Buffer& k, const Buffer& v,
                               const Buffer& out) {
  const bool pasa = s.algorithm == AttentionAlgorithm::kPasa;
  if (pasa ? q.type != ScalarType::kFp16
           : std::strcmp(attention_kernel_choice(), "simple") == 0 ||
                 (q.type != ScalarType::kBf16 && q.type != ScalarType::kFp16))
    return false;
  if (s.head_dim % 16 != 0 || s.head_dim < 16 || s.head_dim > 128) return false;
  if (!aligned16(q) || !aligned16(k) || !aligned16(v) || !aligned16(out)) return false;
  const std::size_t need = std::max(dkv_smem(s.head_dim, 2), pasa ? pasa_smem(s.head_dim, 2) : 0);
  return need <= static_cast<std::size_t>(shared_limit());  // the largest of the kernels the shape runs
}

void flash_attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                             const Buffer& out, const Buffer& lse, cudaStream_t s) {
  if (use_mma(shape)) return mma_attention_forward(shape, q, k, v, out, lse, s);
  const Flash g = attention_geometry(shape);
  if (shape.algorithm == AttentionAlgorithm::kPasa) {  // fp16 (flash_attention_supported checked)
    const PasaShift pc = pasa_shift(g.d);
    const std::size_t smem = pasa_smem(g.d, sizeof(__half));
    opt_in(pasa_forward_kernel, smem);
    pasa_forward_kernel<<<tiles(g.seq, g.heads, g.batch), kFlashThreads, smem, s>>>(
        q.as<const __half>(), k.as<const __half>(), v.as<const __half>(), out.as<__half>(), lse.as<float>(), g, pc);
    return;
  }
  on_type(q.type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      const std::size_t smem = forward_smem(g.d, sizeof(T));
      opt_in(flash_forward_kernel<T>, smem);
      flash_forward_kernel<T><<<tiles(g.seq, g.heads, g.batch), kFlashThreads, smem, s>>>(
          q.as<const T>(), k.as<const T>(), v.as<const T>(), out.as<T>(), lse.as<float>(), g);
    }
  });
}

void flash_attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                              const Buffer& dout, const Buffer& lse, const float* delta, const Buffer& dq,
                              const Buffer& dk, const Buffer& dv, cudaStream_t s) {
  if (use_mma(shape)) return mma_attention_backward(shape, q, k, v, dout, lse, delta, dq, dk, dv, s);
  const Flash g = attention_geometry(shape);
  on_type(q.type, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (!std::is_same_v<T, float>) {
      const std::size_t smem_q = dq_smem(g.d, sizeof(T)), smem_kv = dkv_smem(g.d, sizeof(T));
      opt_in(flash_dq_kernel<T>, smem_q);
      flash_dq_kernel<T><<<tiles(g.seq, g.heads, g.batch), kFlashThreads, smem_q, s>>>(
          q.as<const T>(), k.as<const T>(), v.as<const T>(), dout.as<const T>(), lse.as<const float>(), delta,
          dq.as<T>(), g);
      opt_in(flash_dkv_kernel<T>, smem_kv);
      flash_dkv_kernel<T><<<tiles(g.seq, g.kv_heads, g.batch), kFlashThreads, smem_kv, s>>>(
          q.as<const T>(), k.as<const T>(), v.as<const T>(), dout.as<const T>(), lse.as<const float>(), delta,
          dk.as<T>(), dv.as<T>(), g);
    }
  });
}

}  // namespace hzp::runtime::cuda
