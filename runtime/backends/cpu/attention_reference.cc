// The CPU reference's attention algorithms (attention_reference.h): exact, flash and PASA, one causal head at a
// time, row by row (every statistic of both online softmaxes is per query row, so a row at a time computes
// exactly what a block of rows would).
#include "runtime/backends/cpu/attention_reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace hzp::runtime::reference {
namespace {

// Rounding to the storage type: every stored quantity goes through it.
struct Round {
  ScalarType type;
  float operator()(float x) const { return round_to(type, x); }
  float operator()(double x) const { return round_to(type, static_cast<float>(x)); }
};

// A stored product entry: the fp32 dot product of two stored rows, rounded once.
float dot(const float* a, const float* b, std::int64_t d, const Round& r) {
  float acc = 0;
  for (std::int64_t c = 0; c < d; ++c) acc += a[c] * b[c];
  return r(acc);
}

}  // namespace

void exact_attention(const Head& h, double* out, std::int64_t ldo, double* lse) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.d));
  std::vector<double> s(static_cast<std::size_t>(h.seq));
  for (std::int64_t t = 0; t < h.seq; ++t) {
    double m = -std::numeric_limits<double>::infinity();
    for (std::int64_t k = 0; k <= t; ++k) {
      double acc = 0;
      for (std::int64_t c = 0; c < h.d; ++c)
        acc += static_cast<double>(h.q[t * h.ldq + c]) * static_cast<double>(h.k[k * h.ldkv + c]);
      s[k] = acc * scale;
      m = std::max(m, s[k]);
    }
    double sum = 0;
    for (std::int64_t k = 0; k <= t; ++k) {
      s[k] = std::exp(s[k] - m);
      sum += s[k];
    }
    for (std::int64_t c = 0; c < h.d; ++c) {
      double acc = 0;
      for (std::int64_t k = 0; k <= t; ++k) acc += s[k] * static_cast<double>(h.v[k * h.ldkv + c]);
      out[t * ldo + c] = acc / sum;
    }
    lse[t] = m + std::log(sum);
  }
}

void flash_attention(const Head& h, ScalarType type, std::int64_t block, float* out, std::int64_t ldo, float* lse) {
  const Round r{type};
  const float scale = r(1.0 / std::sqrt(static_cast<double>(h.d)));
  std::vector<float> s(static_cast<std::size_t>(block)), o(static_cast<std::size_t>(h.d)),
      pv(static_cast<std::size_t>(h.d));
  for (std::int64_t t = 0; t < h.seq; ++t) {
    float m = -std::numeric_limits<float>::infinity(), l = 0;
    std::fill(o.begin(), o.end(), 0.0f);
    for (std::int64_t b0 = 0; b0 <= t; b0 += block) {
      const std::int64_t n = std::min(block, t + 1 - b0);  // the keys of the block this row sees
      // Step 1: scores S = Q K^T (rounded: where fp16 overflows), then scaled.
      float mj = -std::numeric_limits<float>::infinity();
      for (std::int64_t k = 0; k < n; ++k) {
        s[k] = r(dot(h.q + t * h.ldq, h.k + (b0 + k) * h.ldkv, h.d, r) * scale);
        mj = std::max(mj, s[k]);
        if (std::isnan(s[k])) mj = s[k];
      }
      // Step 2: the block's softmax numerators, their sum, and P V.
      float lj = 0;
      std::fill(pv.begin(), pv.end(), 0.0f);
      for (std::int64_t k = 0; k < n; ++k) {
        s[k] = r(std::exp(r(s[k] - mj)));
        lj += s[k];
        for (std::int64_t c = 0; c < h.d; ++c) pv[c] += s[k] * h.v[(b0 + k) * h.ldkv + c];
      }
      lj = r(lj);
      // Step 3: the online update, rescaling what came before to the new maximum.
      const float mn = std::max(m, mj);
      const float alpha = r(std::exp(r(m - mn))), beta = r(std::exp(r(mj - mn)));
      l = r(r(alpha * l) + r(beta * lj));
      for (std::int64_t c = 0; c < h.d; ++c) o[c] = r(r(alpha * o[c]) + r(beta * r(pv[c])));
      m = std::isnan(mj) ? mj : mn;
    }
    for (std::int64_t c = 0; c < h.d; ++c) out[t * ldo + c] = r(o[c] / l);
    lse[t] = m + std::log(l);
  }
}

void pasa_attention(const Head& h, ScalarType type, std::int64_t block, double beta, float* out, std::int64_t ldo,
                    float* lse) {
  const Round r{type};
  const double scale = 1.0 / std::sqrt(static_cast<double>(h.d));
  const float c = r(beta / (1.0 - beta));  // the recovery factor: S = S' + c * rowmean(S')
  // Step 0: every key block shifted once, K'_j = M K_j with M = I - beta/n 1 1^T stored in `type` (a product:
  // fp32 accumulation, one rounding per element). beta is chosen for exactly this rounding of M's two values
  // (pasa_beta), so the recovery factor c matches the stored M's inverse. The 1/sqrt(d) scale goes on Q
  // instead (before the product, so no unscaled score is ever stored): folded into M, as the paper's code
  // does, it would round M's entries differently and lose that match (measured here: the recovered
  // log-sum-exp off by ~100 at a bias of 30); applied after the product, the unscaled shifted scores overflow
  // where the amplitude, not the bias, is large. Every block has n = `block` keys: the last one is padded by
  // repeating the last key (as the paper's code does), because beta is chosen for n; the padded keys count in
  // the pseudo-average and are never attended to.
  const std::int64_t padded = (h.seq + block - 1) / block * block;
  const float diag = r(1.0 - beta / static_cast<double>(block));
  const float off = r(-beta / static_cast<double>(block));
  const float scaled = r(scale);
  auto key = [&](std::int64_t row, std::int64_t col) { return h.k[std::min(row, h.seq - 1) * h.ldkv + col]; };
  std::vector<float> kshift(static_cast<std::size_t>(padded * h.d));
  for (std::int64_t b0 = 0; b0 < padded; b0 += block)
    for (std::int64_t col = 0; col < h.d; ++col)
      for (std::int64_t i = 0; i < block; ++i) {
        float acc = 0;
        for (std::int64_t j = 0; j < block; ++j) acc += (i == j ? diag : off) * key(b0 + j, col);
        kshift[(b0 + i) * h.d + col] = r(acc);
      }
  std::vector<float> s(static_cast<std::size_t>(block)), o(static_cast<std::size_t>(h.d)),
      pv(static_cast<std::size_t>(h.d));
  std::vector<float> qs(static_cast<std::size_t>(h.d));
  for (std::int64_t t = 0; t < h.seq; ++t) {
    for (std::int64_t col = 0; col < h.d; ++col) qs[col] = r(h.q[t * h.ldq + col] * scaled);  // Q / sqrt(d)
    float m = r(-60000.0f), l = 0, avg = 0;  // the running max starts finite, as in the paper's code
    std::fill(o.begin(), o.end(), 0.0f);
    std::int64_t blocks = 0;
    for (std::int64_t b0 = 0; b0 <= t; b0 += block, ++blocks) {
      const std::int64_t n = block;                       // the block's keys, padded: the pseudo-average's span
      const std::int64_t seen = std::min(n, t + 1 - b0);  // the ones this row may attend to
      // Step 1: shifted scores S' = Q K'^T and their pseudo-average a = rowmean(S') over the whole block.
      float sum = 0, mj = -std::numeric_limits<float>::infinity();
      for (std::int64_t k = 0; k < n; ++k) {
        const float sk = dot(qs.data(), kshift.data() + (b0 + k) * h.d, h.d, r);
        sum += sk;
        if (k < seen) {
          s[k] = sk;
          mj = std::max(mj, sk);
        }
      }
      const float a = r(r(sum) / static_cast<float>(n));
      // Step 2: the block's numerators in the shifted frame, their sum and P V.
      float lj = 0;
      std::fill(pv.begin(), pv.end(), 0.0f);
      for (std::int64_t k = 0; k < seen; ++k) {
        s[k] = r(std::exp(r(s[k] - mj)));
        lj += s[k];
        for (std::int64_t col = 0; col < h.d; ++col) pv[col] += s[k] * h.v[(b0 + k) * h.ldkv + col];
      }
      lj = r(lj);
      // Step 3: global recovering. The state lives in a frame shifted by c times the running average A of the
      // blocks' pseudo-averages; block j's true scores are S' + c a_j, so it enters at c (a_j - A_new) and the
      // state so far moves by c (A_old - A_new). Only these differences are ever formed.
      const float k1 = static_cast<float>(blocks);
      const float old_avg = blocks == 0 ? a : avg;
      const float new_avg = r(r(a / (k1 + 1)) + r(old_avg * r(k1 / (k1 + 1))));
      const float shift_j = r(c * r(a - new_avg)), shift_old = r(c * r(old_avg - new_avg));
      const float mn = std::max(r(mj + shift_j), r(m + shift_old));
      const float alpha = r(std::exp(r(r(m - mn) + shift_old))), beta_j = r(std::exp(r(r(mj - mn) + shift_j)));
      l = r(r(alpha * l) + r(beta_j * lj));
      for (std::int64_t col = 0; col < h.d; ++col) o[col] = r(r(alpha * o[col]) + r(beta_j * r(pv[col])));
      m = mn;
      avg = new_avg;
    }
    for (std::int64_t col = 0; col < h.d; ++col) out[t * ldo + col] = r(o[col] / l);
    lse[t] = static_cast<float>(static_cast<double>(m) + std::log(static_cast<double>(l)) +
                                static_cast<double>(c) * static_cast<double>(avg));
  }
}

double pasa_beta(ScalarType type, std::int64_t n, double beta0) {
  const Round r{type};
  const double nn = static_cast<double>(n);
  double beta = beta0;
  for (int i = 0; i < 200; ++i) {
    const double b = -static_cast<double>(r(-beta / nn));
    const double a = static_cast<double>(r(1.0 - beta / nn)) + b;
    const double f = b * nn / (a * (a - b * nn)) + (1.0 - a) / a;
    const double next = f / (1.0 + f);  // beta / (1 - beta) = f
    if (next == beta) break;
    beta = next;
  }
  return beta;
}

double pasa_default_beta() {
  static const double beta = pasa_beta(ScalarType::kFp16, kPasaBlock, 1.0 - 1.0 / 64);
  return beta;
}

}  // namespace hzp::runtime::reference
