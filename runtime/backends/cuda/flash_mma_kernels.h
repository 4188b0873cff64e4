// The tensor-core attention kernels of flash_mma.cu (its opening comment describes them), apart from their
// primitives so that the same source runs on the GPU and on the CPU: flash_mma.cu defines the primitives as
// PTX and CUDA built-ins, tests/mma_emulator.h as an emulation of a block's 128 threads, and either includes
// this file after them. They are, in namespace hzp::runtime::cuda::flash_mma:
//   HZP_DEVICE, HZP_KERNEL            qualifiers of a device function (inlined) and of a kernel
//   threadIdx, blockIdx, blockDim, gridDim   (CUDA's built-in variables; macros in the emulator)
//   shared_memory()                   the block's dynamic shared memory, 128-byte aligned
//   sync_threads()                    __syncthreads
//   shfl_xor(x, mask)                 __shfl_xor_sync over the full warp
//   mma<T>(c, a, b0, b1)              mma.sync.m16n8k16 with fp32 accumulators, T bf16 or fp16
//   ldmatrix_x4(r, p), ldmatrix_x4_trans(r, p)   ldmatrix.x4 (.trans) from shared memory
//   cp_async16(dst, src, valid), cp_async_commit(), cp_async_wait_all()   cp.async of 16 bytes, zeros if !valid
//   pack2<T>(lo, hi)                  two floats rounded to T in one operand register
//   unpack2<T>(r, lo, hi)             the two T of a register as floats (lo: the lower half)
//   round_fp16(x)                     x rounded to fp16 (nearest even, overflow to infinity), as a float
// and expf, exp2f, logf, fmaxf and INFINITY as in <cmath>.
#pragma once

#if !defined(HZP_DEVICE) || !defined(HZP_KERNEL)
#error "flash_mma_kernels.h: define its primitives first (flash_mma.cu, tests/mma_emulator.h)"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "runtime/backends/cuda/attention_geometry.h"

namespace hzp::runtime::cuda::flash_mma {

constexpr int kRows = 64;  // query rows (forward, dQ) or keys (dK, dV) per block, 16 per warp
constexpr int kKeys = 64;  // keys per tile (forward, dQ)
constexpr int kMmaThreads = 128;
constexpr float kLog2e = 1.4426950408889634f;

// ---- tiles -----------------------------------------------------------------------------------------------

template <int D>
struct Tile {
  static constexpr int kStride = D + 8;  // elements per row in shared memory
};

// Rows r0 .. r0+rows-1 of head `head` in a [batch*seq x width] activation into a [rows x D] tile (row stride
// D + 8), by cp.async; rows past the sequence are zeros, or copies of the last row when `repeat_last` (PASA's
// padded key block).
template <typename T, int D>
HZP_DEVICE void async_tile(T* tile, const T* src, std::int64_t b, std::int64_t r0, std::int64_t width,
                           std::int64_t head, std::int64_t seq, int rows, bool repeat_last = false) {
  constexpr int chunks = D / 8;
  for (int e = threadIdx.x; e < rows * chunks; e += blockDim.x) {
    const int r = e / chunks, c = (e % chunks) * 8;
    const std::int64_t t = r0 + r < seq ? r0 + r : (repeat_last ? seq - 1 : -1);
    const bool valid = t >= 0;
    cp_async16(tile + r * Tile<D>::kStride + c, src + (b * seq + (valid ? t : 0)) * width + head * D + c, valid);
  }
}

// The A operand (16 rows from `r0`, the 16 columns from `k0`) of a row-major tile.
template <int D, typename T>
HZP_DEVICE void load_a(std::uint32_t (&a)[4], const T* tile, int r0, int k0, int lane) {
  ldmatrix_x4(a, tile + (r0 + (lane % 16)) * Tile<D>::kStride + k0 + (lane / 16) * 8);
}

// The B operands of two 8-column tiles n0 and n0 + 8 over k0 .. k0+15, where B[k][n] = tile[n][k] (the tile's
// rows are B's columns: K in Q K^T): b[0], b[1] for n0; b[2], b[3] for n0 + 8.
template <int D, typename T>
HZP_DEVICE void load_b_rows(std::uint32_t (&b)[4], const T* tile, int n0, int k0, int lane) {
  ldmatrix_x4(b, tile + (n0 + (lane / 16) * 8 + lane % 8) * Tile<D>::kStride + k0 + ((lane / 8) % 2) * 8);
}

// The same where B[k][n] = tile[k][n] (the tile's rows are B's rows: V in P V), by the transposing load.
template <int D, typename T>
HZP_DEVICE void load_b_cols(std::uint32_t (&b)[4], const T* tile, int k0, int n0, int lane) {
  ldmatrix_x4_trans(b, tile + (k0 + ((lane / 8) % 2) * 8 + lane % 8) * Tile<D>::kStride + n0 + (lane / 16) * 8);
}

// acc[16 x 8*N] (N 8-column tiles) = rows r0.. of `a` (16 x D) times the rows of `b` (8*N x D) transposed.
template <int D, int N, typename T>
HZP_DEVICE void product_rows(float (&acc)[N][4], const T* a, int r0, const T* b, int lane) {
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
  for (int k0 = 0; k0 < D; k0 += 16) {
    std::uint32_t fa[4];
    load_a<D>(fa, a, r0, k0, lane);
#pragma unroll
    for (int n = 0; n < N; n += 2) {
      std::uint32_t fb[4];
      load_b_rows<D>(fb, b, n * 8, k0, lane);
      mma<T>(acc[n], fa, fb[0], fb[1]);
      mma<T>(acc[n + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc[16 x D] += p[16 x 8*N] (accumulator layout, rounded to T here) times `b` (8*N x D, row-major).
template <int D, int N, typename T>
HZP_DEVICE void accumulate_product(float (&acc)[D / 8][4], const float (&p)[N][4], const T* b, int lane) {
#pragma unroll
  for (int kc = 0; kc < N / 2; ++kc) {
    const std::uint32_t fa[4] = {pack2<T>(p[2 * kc][0], p[2 * kc][1]), pack2<T>(p[2 * kc][2], p[2 * kc][3]),
                                 pack2<T>(p[2 * kc + 1][0], p[2 * kc + 1][1]),
                                 pack2<T>(p[2 * kc + 1][2], p[2 * kc + 1][3])};
#pragma unroll
    for (int n0 = 0; n0 < D; n0 += 16) {
      std::uint32_t fb[4];
      load_b_cols<D>(fb, b, kc * 16, n0, lane);
      mma<T>(acc[n0 / 8], fa, fb[0], fb[1]);
      mma<T>(acc[n0 / 8 + 1], fa, fb[2], fb[3]);
    }
  }
}

HZP_DEVICE float quad_max(float x) {  // over the 4 threads that share a row
  x = fmaxf(x, shfl_xor(x, 1));
  return fmaxf(x, shfl_xor(x, 2));
}
HZP_DEVICE float quad_sum(float x) {
  x += shfl_xor(x, 1);
  return x + shfl_xor(x, 2);
}

// Rows r and r + 8 of a [16 x D] accumulator (times `mul`) into row-major global rows, 2 elements at a time.
template <typename T, int D>
HZP_DEVICE void store_rows(T* dst, std::int64_t row_a, std::int64_t row_b, std::int64_t seq, std::int64_t stride,
                           const float (&acc)[D / 8][4], float mul_a, float mul_b, int lane) {
  const int col = 2 * (lane % 4);
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    if (row_a < seq)
      *reinterpret_cast<std::uint32_t*>(dst + row_a * stride + n * 8 + col) =
          pack2<T>(acc[n][0] * mul_a, acc[n][1] * mul_a);
    if (row_b < seq)
      *reinterpret_cast<std::uint32_t*>(dst + row_b * stride + n * 8 + col) =
          pack2<T>(acc[n][2] * mul_b, acc[n][3] * mul_b);
  }
}

// The block's query tile (forward, dQ): the longest first (the grid's x reversed), so the last wave is short;
// this thread's two rows of its warp's 16.
struct QueryTile {
  std::int64_t i0, hd, b, kvh;
  int warp, lane, r0;
  std::int64_t row_a, row_b;
  int key_tiles;  // causal: up to the diagonal tile
};

HZP_DEVICE QueryTile query_tile(const AttentionGeometry& g) {
  QueryTile t;
  t.i0 = (gridDim.x - 1 - blockIdx.x) * static_cast<std::int64_t>(kRows);
  t.hd = blockIdx.y, t.b = blockIdx.z, t.kvh = t.hd / g.group;
  t.warp = static_cast<int>(threadIdx.x / 32), t.lane = static_cast<int>(threadIdx.x % 32);
  t.r0 = t.warp * 16;
  t.row_a = t.i0 + t.r0 + t.lane / 4, t.row_b = t.row_a + 8;
  t.key_tiles = static_cast<int>(t.i0 / kKeys) + 1;
  return t;
}

// Key tile `jt` of K and V into buffer jt % 2 of ks, vs ([2][64 x D + 8] each), by cp.async (not committed).
template <typename T, int D>
HZP_DEVICE void async_key_tile(T* ks, T* vs, const T* k, const T* v, const QueryTile& t, int jt,
                               const AttentionGeometry& g) {
  constexpr int S = Tile<D>::kStride;
  const int nb = jt % 2;
  async_tile<T, D>(ks + nb * kKeys * S, k, t.b, jt * std::int64_t{kKeys}, g.wkv, t.kvh, g.seq, kKeys);
  async_tile<T, D>(vs + nb * kKeys * S, v, t.b, jt * std::int64_t{kKeys}, g.wkv, t.kvh, g.seq, kKeys);
}

// ---- forward ---------------------------------------------------------------------------------------------

template <typename T, int D>
HZP_KERNEL void mma_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, AttentionGeometry g) {
  unsigned char* smem = shared_memory();
  constexpr int S = Tile<D>::kStride;
  T* qs = reinterpret_cast<T*>(smem);  // [64 x S]
  T* ks = qs + kRows * S;              // [2][64 x S]
  T* vs = ks + 2 * kKeys * S;          // [2][64 x S]
  const QueryTile t = query_tile(g);
  const std::int64_t i0 = t.i0, hd = t.hd, b = t.b, row_a = t.row_a, row_b = t.row_b;
  const int lane = t.lane, r0 = t.r0, tiles = t.key_tiles;
  const float sc = g.scale * kLog2e;  // scores to base-2 exponents

  async_tile<T, D>(qs, q, b, i0, g.wq, hd, g.seq, kRows);
  async_key_tile<T, D>(ks, vs, k, v, t, 0, g);
  cp_async_commit();

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;  // l: this thread's part of the row sums
  for (int jt = 0; jt < tiles; ++jt) {
    cp_async_wait_all();
    sync_threads();  // tile jt has landed, and every warp is done with tile jt - 1's buffer
    if (jt + 1 < tiles) {
      async_key_tile<T, D>(ks, vs, k, v, t, jt + 1, g);
      cp_async_commit();
    }
    const T* kt = ks + (jt % 2) * kKeys * S;
    const T* vt = vs + (jt % 2) * kKeys * S;
    float s[kKeys / 8][4];
    product_rows<D, kKeys / 8>(s, qs, r0, kt, lane);
    const std::int64_t j0 = jt * std::int64_t{kKeys};
    if (jt == tiles - 1) {  // the diagonal tile: keys after the row (and past the sequence) are masked
#pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const std::int64_t key = j0 + n * 8 + 2 * (lane % 4) + (e % 2), row = e < 2 ? row_a : row_b;
          if (key > row || key >= g.seq) s[n][e] = -INFINITY;
        }
    }
    float mx_a = m_a, mx_b = m_b;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      mx_a = fmaxf(mx_a, fmaxf(s[n][0], s[n][1]));
      mx_b = fmaxf(mx_b, fmaxf(s[n][2], s[n][3]));
    }
    mx_a = quad_max(mx_a), mx_b = quad_max(mx_b);  // finite: key 0 is in every row's first tile
    const float alpha_a = exp2f((m_a - mx_a) * sc), alpha_b = exp2f((m_b - mx_b) * sc);  // 0 on the first tile
    m_a = mx_a, m_b = mx_b;
    float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n) {
      s[n][0] = exp2f((s[n][0] - mx_a) * sc), s[n][1] = exp2f((s[n][1] - mx_a) * sc);
      s[n][2] = exp2f((s[n][2] - mx_b) * sc), s[n][3] = exp2f((s[n][3] - mx_b) * sc);
      sum_a += s[n][0] + s[n][1];
      sum_b += s[n][2] + s[n][3];
    }
    l_a = l_a * alpha_a + sum_a, l_b = l_b * alpha_b + sum_b;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[n][0] *= alpha_a, o[n][1] *= alpha_a, o[n][2] *= alpha_b, o[n][3] *= alpha_b;
    accumulate_product<D, kKeys / 8, T>(o, s, vt, lane);
  }
  l_a = quad_sum(l_a), l_b = quad_sum(l_b);
  store_rows<T, D>(out + b * g.seq * g.wq + hd * D, row_a, row_b, g.seq, g.wq, o, 1.0f / l_a, 1.0f / l_b, lane);
  if (lane % 4 == 0) {
    float* row_lse = lse + (b * g.heads + hd) * g.seq;
    if (row_a < g.seq) row_lse[row_a] = m_a * g.scale + logf(l_a);
    if (row_b < g.seq) row_lse[row_b] = m_b * g.scale + logf(l_b);
  }
}

// ---- PASA forward (fp16) ------------------------------------------------------------------------------------
//
// PASA (docs/pasa.md) on the same fragments: the CPU reference's recurrences (runtime/backends/cpu/
// attention_reference.cc, pasa_attention) with its fp16 roundings, so the two agree to fp16 rounding order, as
// flash_attention.cu's WMMA version does. A block of 64 query rows walks key blocks of kPasaKeys = 128 (the
// last padded by repeating the last key, because beta is chosen for n = 128): K' = M K in shared memory
// (M = I - beta/n 1 1^T: K'_jc = (diag - off) K_jc + off sum_i K_ic, one rounding), Q / sqrt(d) rounded once
// before the product, S' = Q K'^T stored in fp16, the pseudo-average a over the whole padded block, and the
// online state (m, l, the running average A, the output) in the shifted frame, every result rounded to fp16.
// P V is summed over the whole block before its rounding, one 16-column slice of the output at a time, from P
// packed as operands (so the 128 scores need not stay in registers beside the output).

constexpr int kPasaKeys = 128;

// The online state of one query row (every thread of the row's quad holds it).
struct PasaRow {
  float m = -60000.0f, l = 0.0f, avg = 0.0f;  // m starts finite, as in the paper's code
  // Takes block `blocks` (0-based) with pseudo-average a, shifted maximum mj and numerator sum lj; returns the
  // factors of the old state (alpha) and of the block's P V (beta).
  HZP_DEVICE void update(float a, float mj, float lj, float blocks, float c, float& alpha, float& beta) {
    const float old_avg = blocks == 0.0f ? a : avg;
    const float new_avg =
        round_fp16(round_fp16(a / (blocks + 1.0f)) + round_fp16(old_avg * round_fp16(blocks / (blocks + 1.0f))));
    const float shift_j = round_fp16(c * round_fp16(a - new_avg));
    const float shift_old = round_fp16(c * round_fp16(old_avg - new_avg));
    const float mn = fmaxf(round_fp16(mj + shift_j), round_fp16(m + shift_old));
    alpha = round_fp16(expf(round_fp16(round_fp16(m - mn) + shift_old)));
    beta = round_fp16(expf(round_fp16(round_fp16(mj - mn) + shift_j)));
    l = round_fp16(round_fp16(alpha * l) + round_fp16(beta * lj));
    m = mn;
    avg = new_avg;
  }
};

template <typename T, int D>
HZP_KERNEL void mma_pasa_forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, AttentionGeometry g,
                                        PasaShift shift) {
  unsigned char* smem = shared_memory();
  constexpr int S = Tile<D>::kStride;
  constexpr int N = kPasaKeys / 8;                              // 8-key column tiles of a block's scores
  constexpr int kPairs = D / 2, kParts = kMmaThreads / kPairs;  // the column sums: kParts threads per pair
  T* qs = reinterpret_cast<T*>(smem);                           // [64 x S]
  T* ks = qs + kRows * S;                                       // [128 x S], shifted in place
  T* vs = ks + kPasaKeys * S;                                   // [128 x S]
  float* part = reinterpret_cast<float*>(vs + kPasaKeys * S);   // [kParts][D]: partial column sums of K
  const QueryTile t = query_tile(g);
  const std::int64_t i0 = t.i0, hd = t.hd, b = t.b, row_a = t.row_a, row_b = t.row_b;
  const int lane = t.lane, r0 = t.r0;
  const int tid = static_cast<int>(threadIdx.x), pair = tid % kPairs, slice = tid / kPairs;
  auto word = [&](T* tile, int r, int pr) { return reinterpret_cast<std::uint32_t*>(tile + r * S + 2 * pr); };

  async_tile<T, D>(qs, q, b, i0, g.wq, hd, g.seq, kRows);
  cp_async_commit();
  cp_async_wait_all();
  sync_threads();
  for (int e = tid; e < kRows * kPairs; e += kMmaThreads) {  // Q / sqrt(d), rounded once
    float x0, x1;
    unpack2<T>(*word(qs, e / kPairs, e % kPairs), x0, x1);
    *word(qs, e / kPairs, e % kPairs) = pack2<T>(x0 * shift.scale, x1 * shift.scale);
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  PasaRow st_a, st_b;
  const std::int64_t last = (i0 + kRows < g.seq ? i0 + kRows : g.seq) - 1;  // the tile's last real row
  for (std::int64_t j0 = 0; j0 <= last; j0 += kPasaKeys) {
    sync_threads();  // every warp is done with the previous block (and with Q's scaling)
    async_tile<T, D>(ks, k, b, j0, g.wkv, t.kvh, g.seq, kPasaKeys, true);
    async_tile<T, D>(vs, v, b, j0, g.wkv, t.kvh, g.seq, kPasaKeys);
    cp_async_commit();
    cp_async_wait_all();
    sync_threads();
    float c0 = 0.0f, c1 = 0.0f;  // K' = M K: the column sums, then every element
    for (int r = slice; r < kPasaKeys; r += kParts) {
      float x0, x1;
      unpack2<T>(*word(ks, r, pair), x0, x1);
      c0 += x0, c1 += x1;
    }
    part[slice * D + 2 * pair] = c0, part[slice * D + 2 * pair + 1] = c1;
    sync_threads();
    for (int e = tid; e < kPasaKeys * kPairs; e += kMmaThreads) {
      const int r = e / kPairs, pr = e % kPairs;
      float sum0 = 0.0f, sum1 = 0.0f;
      for (int p = 0; p < kParts; ++p) sum0 += part[p * D + 2 * pr], sum1 += part[p * D + 2 * pr + 1];
      float x0, x1;
      unpack2<T>(*word(ks, r, pr), x0, x1);
      *word(ks, r, pr) =
          pack2<T>((shift.diag - shift.off) * x0 + shift.off * sum0, (shift.diag - shift.off) * x1 + shift.off * sum1);
    }
    sync_threads();
    float s[N][4];
    product_rows<D, N>(s, qs, r0, ks, lane);  // S' = (Q / sqrt(d)) K'^T
    float sum_a = 0.0f, sum_b = 0.0f, mj_a = -INFINITY, mj_b = -INFINITY;
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[n][e] = round_fp16(s[n][e]);  // stored in fp16
        const std::int64_t key = j0 + n * 8 + 2 * (lane % 4) + (e % 2), row = e < 2 ? row_a : row_b;
        (e < 2 ? sum_a : sum_b) += s[n][e];  // the pseudo-average spans the whole padded block
        if (key <= row) (e < 2 ? mj_a : mj_b) = fmaxf(e < 2 ? mj_a : mj_b, s[n][e]);
      }
    sum_a = quad_sum(sum_a), sum_b = quad_sum(sum_b);
    mj_a = quad_max(mj_a), mj_b = quad_max(mj_b);  // finite for a real row: key j0 <= row
    float lj_a = 0.0f, lj_b = 0.0f;
    std::uint32_t pa[N / 2][4];  // P as the A operands of P V, 16 keys each
#pragma unroll
    for (int n = 0; n < N; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const std::int64_t key = j0 + n * 8 + 2 * (lane % 4) + (e % 2), row = e < 2 ? row_a : row_b;
        const float mj = e < 2 ? mj_a : mj_b;
        s[n][e] = key <= row && row < g.seq ? round_fp16(expf(round_fp16(s[n][e] - mj))) : 0.0f;
        (e < 2 ? lj_a : lj_b) += s[n][e];
      }
      pa[n / 2][2 * (n % 2)] = pack2<T>(s[n][0], s[n][1]);
      pa[n / 2][2 * (n % 2) + 1] = pack2<T>(s[n][2], s[n][3]);
    }
    lj_a = round_fp16(quad_sum(lj_a)), lj_b = round_fp16(quad_sum(lj_b));
    const float blocks = static_cast<float>(j0 / kPasaKeys);
    float alpha_a = 1.0f, beta_a = 0.0f, alpha_b = 1.0f, beta_b = 0.0f;  // rows past the sequence keep theirs
    if (row_a < g.seq)
      st_a.update(round_fp16(round_fp16(sum_a) / kPasaKeys), mj_a, lj_a, blocks, shift.c, alpha_a, beta_a);
    if (row_b < g.seq)
      st_b.update(round_fp16(round_fp16(sum_b) / kPasaKeys), mj_b, lj_b, blocks, shift.c, alpha_b, beta_b);
#pragma unroll
    for (int n0 = 0; n0 < D; n0 += 16) {  // O = alpha O + beta (P V), one 16-column slice at a time
      float pv[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
      for (int kc = 0; kc < N / 2; ++kc) {
        std::uint32_t fb[4];
        load_b_cols<D>(fb, vs, kc * 16, n0, lane);
        mma<T>(pv[0], pa[kc], fb[0], fb[1]);
        mma<T>(pv[1], pa[kc], fb[2], fb[3]);
      }
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float alpha = e < 2 ? alpha_a : alpha_b, beta = e < 2 ? beta_a : beta_b;
          float& x = o[n0 / 8 + h][e];
          x = round_fp16(round_fp16(alpha * x) + round_fp16(beta * round_fp16(pv[h][e])));
        }
    }
  }
  store_rows<T, D>(out + b * g.seq * g.wq + hd * D, row_a, row_b, g.seq, g.wq, o, 1.0f / st_a.l, 1.0f / st_b.l, lane);
  if (lane % 4 == 0) {
    float* row_lse = lse + (b * g.heads + hd) * g.seq;
    if (row_a < g.seq) row_lse[row_a] = st_a.m + logf(st_a.l) + shift.c * st_a.avg;
    if (row_b < g.seq) row_lse[row_b] = st_b.m + logf(st_b.l) + shift.c * st_b.avg;
  }
}

// ---- backward --------------------------------------------------------------------------------------------

// P = exp(S scale - lse) and dS = P (dP - delta) of one 16-row slice, in place (s becomes P, dp becomes dS);
// `masked(n, e)` says which elements are outside the causal triangle.
template <int N, typename Lse, typename Delta, typename Masked>
HZP_DEVICE void softmax_backward(float (&s)[N][4], float (&dp)[N][4], float sc, Lse lse2, Delta delta, Masked masked) {
#pragma unroll
  for (int n = 0; n < N; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float p = masked(n, e) ? 0.0f : exp2f(s[n][e] * sc - lse2(n, e));
      s[n][e] = p;
      dp[n][e] = p * (dp[n][e] - delta(n, e));
    }
}

template <typename T, int D>
HZP_KERNEL void mma_dq_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta,
                              T* dq, AttentionGeometry g) {
  unsigned char* smem = shared_memory();
  constexpr int S = Tile<D>::kStride;
  T* qs = reinterpret_cast<T*>(smem);  // [64 x S] each
  T* dos = qs + kRows * S;
  T* ks = dos + kRows * S;     // [2][64 x S]
  T* vs = ks + 2 * kKeys * S;  // [2][64 x S]
  const QueryTile t = query_tile(g);
  const std::int64_t i0 = t.i0, hd = t.hd, b = t.b, row_a = t.row_a, row_b = t.row_b;
  const int lane = t.lane, r0 = t.r0, tiles = t.key_tiles;
  const float sc = g.scale * kLog2e;
  const std::int64_t stats = (b * g.heads + hd) * g.seq;
  const float lse_a = row_a < g.seq ? lse[stats + row_a] * kLog2e : 0.0f;
  const float lse_b = row_b < g.seq ? lse[stats + row_b] * kLog2e : 0.0f;
  const float delta_a = row_a < g.seq ? delta[stats + row_a] : 0.0f;
  const float delta_b = row_b < g.seq ? delta[stats + row_b] : 0.0f;

  async_tile<T, D>(qs, q, b, i0, g.wq, hd, g.seq, kRows);
  async_tile<T, D>(dos, dout, b, i0, g.wq, hd, g.seq, kRows);
  async_key_tile<T, D>(ks, vs, k, v, t, 0, g);
  cp_async_commit();

  float acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
  for (int jt = 0; jt < tiles; ++jt) {
    cp_async_wait_all();
    sync_threads();
    if (jt + 1 < tiles) {
      async_key_tile<T, D>(ks, vs, k, v, t, jt + 1, g);
      cp_async_commit();
    }
    const T* kt = ks + (jt % 2) * kKeys * S;
    const T* vt = vs + (jt % 2) * kKeys * S;
    float s[kKeys / 8][4], dp[kKeys / 8][4];
    product_rows<D, kKeys / 8>(s, qs, r0, kt, lane);
    product_rows<D, kKeys / 8>(dp, dos, r0, vt, lane);
    const std::int64_t j0 = jt * std::int64_t{kKeys};
    const bool diagonal = jt == tiles - 1;
    softmax_backward<kKeys / 8>(
        s, dp, sc, [&](int, int e) { return e < 2 ? lse_a : lse_b; },
        [&](int, int e) { return e < 2 ? delta_a : delta_b; },
        [&](int n, int e) {
          const std::int64_t key = j0 + n * 8 + 2 * (lane % 4) + (e % 2);
          return diagonal && key > (e < 2 ? row_a : row_b);
        });
    // dQ += dS K: K's rows are the product's inner dimension (B[k][n] = K[k][n]).
    accumulate_product<D, kKeys / 8, T>(acc, dp, kt, lane);
  }
  store_rows<T, D>(dq + b * g.seq * g.wq + hd * D, row_a, row_b, g.seq, g.wq, acc, g.scale, g.scale, lane);
}

// Block (key tile j0 of 64, kv head, batch); warp w owns keys j0 + 16 w .. + 15. For every query head of the
// group and every query tile of Q rows from j0 on: S^T = K Q^T and dP^T = V dO^T (rows = keys), P^T and dS^T
// from the queries' lse and delta, then dV += P^T dO and dK += dS^T Q.
template <typename T, int D, int Q>
HZP_KERNEL void mma_dkv_kernel(const T* q, const T* k, const T* v, const T* dout, const float* lse, const float* delta,
                               T* dk, T* dv, AttentionGeometry g) {
  unsigned char* smem = shared_memory();
  constexpr int S = Tile<D>::kStride;
  T* ks = reinterpret_cast<T*>(smem);  // [64 x S] each
  T* vs = ks + kRows * S;
  T* qs = vs + kRows * S;                                   // [2][Q x S]
  T* dos = qs + 2 * Q * S;                                  // [2][Q x S]
  float* stat = reinterpret_cast<float*>(dos + 2 * Q * S);  // [2][2][Q]: lse * log2(e), delta
  // Key tiles in grid order: the first has the most query tiles after it, so it starts first.
  const std::int64_t j0 = blockIdx.x * static_cast<std::int64_t>(kRows), kvh = blockIdx.y, b = blockIdx.z;
  const int warp = static_cast<int>(threadIdx.x / 32), lane = static_cast<int>(threadIdx.x % 32);
  const int r0 = warp * 16;
  const std::int64_t key_a = j0 + r0 + lane / 4, key_b = key_a + 8;
  const float sc = g.scale * kLog2e;
  const int per_head = static_cast<int>((g.seq - j0 + Q - 1) / Q);  // query tiles from j0 to the end
  const int steps = static_cast<int>(g.group) * per_head;
  // Step i: query head kvh * group + i / per_head, query tile j0 + Q (i % per_head), into buffer i % 2.
  auto issue = [&](int i) {
    const std::int64_t hd = kvh * g.group + i / per_head, i0 = j0 + std::int64_t{Q} * (i % per_head);
    const int nb = i % 2;
    async_tile<T, D>(qs + nb * Q * S, q, b, i0, g.wq, hd, g.seq, Q);
    async_tile<T, D>(dos + nb * Q * S, dout, b, i0, g.wq, hd, g.seq, Q);
    cp_async_commit();
    float* st = stat + nb * 2 * Q;
    const std::int64_t base = (b * g.heads + hd) * g.seq;
    for (int r = threadIdx.x; r < Q; r += blockDim.x) {
      const std::int64_t i_q = i0 + r;
      st[r] = i_q < g.seq ? lse[base + i_q] * kLog2e : 0.0f;
      st[Q + r] = i_q < g.seq ? delta[base + i_q] : 0.0f;
    }
  };
  async_tile<T, D>(ks, k, b, j0, g.wkv, kvh, g.seq, kRows);
  async_tile<T, D>(vs, v, b, j0, g.wkv, kvh, g.seq, kRows);
  issue(0);  // commits K and V with the first query tile

  float dk_acc[D / 8][4], dv_acc[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk_acc[n][e] = dv_acc[n][e] = 0.0f;
  for (int i = 0; i < steps; ++i) {
    cp_async_wait_all();
    sync_threads();  // step i's tiles and statistics are in, and every warp is done with step i - 1's buffer
    if (i + 1 < steps) issue(i + 1);
    const int nb = i % 2;
    const T* qt = qs + nb * Q * S;
    const T* dot = dos + nb * Q * S;
    const float* st = stat + nb * 2 * Q;
    const std::int64_t i0 = j0 + std::int64_t{Q} * (i % per_head);
    float s[Q / 8][4], dp[Q / 8][4];
    product_rows<D, Q / 8>(s, ks, r0, qt, lane);    // S^T: rows keys, columns queries
    product_rows<D, Q / 8>(dp, vs, r0, dot, lane);  // dP^T
    const bool diagonal = i0 < j0 + kRows;          // some query of the tile precedes some key of the block
    const int col = 2 * (lane % 4);
    softmax_backward<Q / 8>(
        s, dp, sc, [&](int n, int e) { return st[n * 8 + col + e % 2]; },
        [&](int n, int e) { return st[Q + n * 8 + col + e % 2]; },
        [&](int n, int e) {
          const std::int64_t query = i0 + n * 8 + col + (e % 2);
          return query >= g.seq || (diagonal && query < (e < 2 ? key_a : key_b));
        });
    // dV += P^T dO and dK += dS^T Q: the queries are the inner dimension (B[k][n] = dO[k][n], Q[k][n]).
    accumulate_product<D, Q / 8, T>(dv_acc, s, dot, lane);
    accumulate_product<D, Q / 8, T>(dk_acc, dp, qt, lane);
  }
  store_rows<T, D>(dk + b * g.seq * g.wkv + kvh * D, key_a, key_b, g.seq, g.wkv, dk_acc, g.scale, g.scale, lane);
  store_rows<T, D>(dv + b * g.seq * g.wkv + kvh * D, key_a, key_b, g.seq, g.wkv, dv_acc, 1.0f, 1.0f, lane);
}

// ---- launch sizes ------------------------------------------------------------------------------------------

template <int D>
constexpr int dkv_queries() {
  return D > 64 ? 32 : 64;  // registers: dK and dV accumulators take 2 D / 8 * 4 of them per thread
}
template <typename T, int D>
constexpr std::size_t forward_bytes() {
  return std::size_t{5} * kRows * Tile<D>::kStride * sizeof(T);
}
template <typename T, int D>
constexpr std::size_t pasa_forward_bytes() {
  return std::size_t{kRows + 2 * kPasaKeys} * Tile<D>::kStride * sizeof(T) +
         std::size_t{kMmaThreads / (D / 2)} * D * sizeof(float);
}
template <typename T, int D>
constexpr std::size_t dq_bytes() {
  return std::size_t{6} * kRows * Tile<D>::kStride * sizeof(T);
}
template <typename T, int D>
constexpr std::size_t dkv_bytes() {
  constexpr int Q = dkv_queries<D>();
  return (std::size_t{2} * kRows + 4 * Q) * Tile<D>::kStride * sizeof(T) + std::size_t{4} * Q * sizeof(float);
}

// Blocks along a grid's x: tiles of kRows queries (forward, dQ) or keys (dK, dV).
constexpr std::int64_t row_tiles(std::int64_t seq) {
  return (seq + kRows - 1) / kRows;
}

}  // namespace hzp::runtime::cuda::flash_mma
