// Attention algorithms of the CPU reference, one causal head at a time, with honest low-precision arithmetic:
// the exact softmax attention in fp64; flash attention (online softmax over blocks of keys) with every score,
// statistic and accumulator rounded to a chosen type; and PASA (Cheng et al., "PASA: ... pseudo-average
// shifting attention", arXiv 2503.01873), flash attention made safe for fp16 by shifting each key block by its
// pseudo-average and recovering the shift in the online-softmax bookkeeping. docs/pasa.md explains the
// algorithm; bench/pasa_bench.cc reproduces the paper's overflow / accuracy findings with these functions.
//
// The arithmetic model ("as a GPU or NPU kernel would"): a product of two matrices (Q K^T, M K, P V) multiplies
// stored (rounded) operands and accumulates in fp32, then rounds its result once to the storage type (tensor
// cores, cube units); every element-wise operation (subtract, exp, multiply, add, divide) and every reduction
// (row max, row sum, row mean: accumulated in fp32) rounds its result to the storage type. fp16 overflows to
// infinity past 65504, and an infinity becomes NaN where it meets another (inf - inf).
//
// Standard flash attention computes a score as the product Q K^T, rounds it, then multiplies by 1/sqrt(d):
// the order NPU kernels use, and the one in which fp16 overflows first. PASA scales Q first and multiplies by
// the shifted keys K' = M K. (The paper's reference code folds 1/sqrt(d) into its shifting matrix M; keeping M
// unscaled keeps its rounding the one beta was chosen for.)
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/device/numeric.h"

namespace hzp::runtime::reference {

// One head: row t of q, k, v starts at q + t * ldq (k, v: ldkv); causal (query t sees keys 0..t). For the
// low-precision algorithms the inputs are stored values: representable in the algorithm's type (round them
// with numeric.h first).
struct Head {
  const float* q;
  const float* k;
  const float* v;
  std::int64_t seq = 0, d = 0, ldq = 0, ldkv = 0;
};

// out[seq x d] (row stride ldo) and lse[seq]: the log-sum-exp of each row's scaled scores (what the backward
// needs: P = exp(q k^T / sqrt(d) - lse)).
void exact_attention(const Head& h, double* out, std::int64_t ldo, double* lse);

// Flash attention with key blocks of `block` keys, every quantity stored in `type` (fp32: plain float).
void flash_attention(const Head& h, ScalarType type, std::int64_t block, float* out, std::int64_t ldo, float* lse);

// PASA with key blocks of `block` keys and shifting strength beta (0 < beta < 1), every quantity stored in
// `type`. lse is recovered: the row's log-sum-exp of the true scaled scores, m + log l + beta/(1-beta) * A.
void pasa_attention(const Head& h, ScalarType type, std::int64_t block, double beta, float* out, std::int64_t ldo,
                    float* lse);

// The paper's rounding-aware choice of beta for blocks of n keys in `type`: the fixed point of
// beta / (1 - beta) = f(beta) with b = -round(-beta/n), a = round(1 - beta/n) + b, f = b n / (a (a - b n)) +
// (1 - a) / a, iterated in fp64 from beta0 (the reference code starts from 1 - 2^-4, 1 - 2^-5, 1 - 2^-6).
double pasa_beta(ScalarType type, std::int64_t n, double beta0);

// PASA's defaults: key blocks of 128 and beta = pasa_beta(fp16, 128, 1 - 2^-6) = 0.984497.
inline constexpr std::int64_t kPasaBlock = 128;
double pasa_default_beta();

}  // namespace hzp::runtime::reference
