// The fp32 CPU kernels of the models (kernels.h): OpenBLAS sgemm for every matmul, plain loops for the rest.
#include "runtime/model/kernels.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>

namespace hzp::runtime::kernels {

// --- Matmuls ----------------------------------------------------------------------------------------------

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // sgemm with k == 0 still scales C by beta; do the same without calling it.
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
              static_cast<blasint>(m), static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c, static_cast<blasint>(ldc));
}

void matmul(const float* x, const float* w, float* y, std::int64_t m, std::int64_t k, std::int64_t n, bool accumulate) {
  gemm(false, false, m, n, k, 1.0f, x, k, w, n, accumulate ? 1.0f : 0.0f, y, n);
}

void matmul_dx(const float* dy, const float* w, float* dx, std::int64_t m, std::int64_t k, std::int64_t n,
               bool accumulate) {
  gemm(false, true, m, k, n, 1.0f, dy, n, w, n, accumulate ? 1.0f : 0.0f, dx, k);
}

void matmul_dw(const float* x, const float* dy, float* dw, std::int64_t m, std::int64_t k, std::int64_t n) {
  gemm(true, false, k, n, m, 1.0f, x, k, dy, n, 1.0f, dw, n);
}

// --- RMSNorm ----------------------------------------------------------------------------------------------

void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::int64_t rows, std::int64_t h) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    float* yr = y + r * h;
    double sum_sq = 0;
    for (std::int64_t i = 0; i < h; ++i) sum_sq += static_cast<double>(xr[i]) * xr[i];
    const float s = static_cast<float>(1.0 / std::sqrt(sum_sq / static_cast<double>(h) + kNormEps));
    rstd[r] = s;
    for (std::int64_t i = 0; i < h; ++i) yr[i] = xr[i] * s * w[i];
  }
}

// With n = x * r (r = rstd): y = n * w, so dw += dy * n and
// dx = r * (dy * w) - r^3 / h * x * sum_i(dy_i * w_i * x_i).
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      std::int64_t rows, std::int64_t h, bool accumulate) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * h;
    const float* dyr = dy + r * h;
    float* dxr = dx + r * h;
    const float s = rstd[r];
    double dot = 0;
    for (std::int64_t i = 0; i < h; ++i) {
      dot += static_cast<double>(dyr[i]) * w[i] * xr[i];
      dw[i] += dyr[i] * xr[i] * s;
    }
    const float c = static_cast<float>(dot) * s * s * s / static_cast<float>(h);
    for (std::int64_t i = 0; i < h; ++i) {
      const float g = s * dyr[i] * w[i] - c * xr[i];
      dxr[i] = accumulate ? dxr[i] + g : g;
    }
  }
}

// --- Rotary positions -------------------------------------------------------------------------------------

void rope_tables(std::int64_t seq, std::int64_t d, float* cos_table, float* sin_table) {
  const std::int64_t half = d / 2;
  for (std::int64_t t = 0; t < seq; ++t) {
    for (std::int64_t i = 0; i < half; ++i) {
      const double inv_freq = std::pow(10000.0, -2.0 * static_cast<double>(i) / static_cast<double>(d));
      const double angle = static_cast<double>(t) * inv_freq;
      cos_table[t * half + i] = static_cast<float>(std::cos(angle));
      sin_table[t * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

namespace {

// Rotates every head of every row by +angle (sign = 1) or -angle (sign = -1, the transpose).
void rope_apply(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                const float* cos_table, const float* sin_table, float sign) {
  const std::int64_t half = d / 2;
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* c = cos_table + (r % seq) * half;
    const float* s = sin_table + (r % seq) * half;
    for (std::int64_t hd = 0; hd < heads; ++hd) {
      float* a = x + (r * heads + hd) * d;
      float* b = a + half;
      for (std::int64_t i = 0; i < half; ++i) {
        const float ai = a[i];
        const float bi = b[i];
        const float si = sign * s[i];
        a[i] = ai * c[i] - bi * si;
        b[i] = bi * c[i] + ai * si;
      }
    }
  }
}

}  // namespace

void rope_forward(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                  const float* cos_table, const float* sin_table) {
  rope_apply(x, rows, seq, heads, d, cos_table, sin_table, 1.0f);
}

void rope_backward(float* dx, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                   const float* cos_table, const float* sin_table) {
  rope_apply(dx, rows, seq, heads, d, cos_table, sin_table, -1.0f);
}

// --- Attention --------------------------------------------------------------------------------------------

void attention_forward(const float* q, const float* k, const float* v, float* probs, float* out, std::int64_t batch,
                       std::int64_t seq, std::int64_t heads, std::int64_t d) {
  const std::int64_t h = heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t hd = 0; hd < heads; ++hd) {
      const std::int64_t base = b * seq * h + hd * d;
      float* p = probs + (b * heads + hd) * seq * seq;
      // Step 1: scores = q k^T / sqrt(d) for the whole [seq x seq] block (the mask comes next).
      gemm(false, true, seq, seq, d, scale, q + base, h, k + base, h, 0.0f, p, seq);
      // Step 2: causal softmax per query row i over keys j <= i; the masked part becomes 0.
      for (std::int64_t i = 0; i < seq; ++i) {
        float* row = p + i * seq;
        float mx = row[0];
        for (std::int64_t j = 1; j <= i; ++j) mx = std::max(mx, row[j]);
        float sum = 0;
        for (std::int64_t j = 0; j <= i; ++j) {
          row[j] = std::exp(row[j] - mx);
          sum += row[j];
        }
        const float inv = 1.0f / sum;
        for (std::int64_t j = 0; j <= i; ++j) row[j] *= inv;
        for (std::int64_t j = i + 1; j < seq; ++j) row[j] = 0.0f;
      }
      // Step 3: out = P v.
      gemm(false, false, seq, d, seq, 1.0f, p, seq, v + base, h, 0.0f, out + base, h);
    }
  }
}

// With S = q k^T * scale and P = softmax(S): dP = dO v^T, dv = P^T dO, dS = P * (dP - rowsum(P * dP)),
// dq = scale * dS k, dk = scale * dS^T q.
void attention_backward(const float* q, const float* k, const float* v, const float* probs, const float* dout,
                        float* dq, float* dk, float* dv, float* scratch, std::int64_t batch, std::int64_t seq,
                        std::int64_t heads, std::int64_t d) {
  const std::int64_t h = heads * d;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t hd = 0; hd < heads; ++hd) {
      const std::int64_t base = b * seq * h + hd * d;
      const float* p = probs + (b * heads + hd) * seq * seq;
      float* ds = scratch;
      gemm(false, true, seq, seq, d, 1.0f, dout + base, h, v + base, h, 0.0f, ds, seq);  // dP
      gemm(true, false, seq, d, seq, 1.0f, p, seq, dout + base, h, 0.0f, dv + base, h);  // dv
      for (std::int64_t i = 0; i < seq; ++i) {
        const float* pr = p + i * seq;
        float* dr = ds + i * seq;
        float dot = 0;
        for (std::int64_t j = 0; j <= i; ++j) dot += pr[j] * dr[j];
        for (std::int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot);
        for (std::int64_t j = i + 1; j < seq; ++j) dr[j] = 0.0f;
      }
      gemm(false, false, seq, d, seq, scale, ds, seq, k + base, h, 0.0f, dq + base, h);  // dq
      gemm(true, false, seq, d, seq, scale, ds, seq, q + base, h, 0.0f, dk + base, h);   // dk
    }
  }
}

// --- SwiGLU -----------------------------------------------------------------------------------------------

void swiglu_forward(const float* gate, const float* up, float* act, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    act[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

// silu'(g) = sig(g) * (1 + g * (1 - sig(g))).
void swiglu_backward(const float* gate, const float* up, const float* dact, float* dgate, float* dup, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    const float sig = 1.0f / (1.0f + std::exp(-g));
    const float silu = g * sig;
    dup[i] = dact[i] * silu;
    dgate[i] = dact[i] * up[i] * sig * (1.0f + g * (1.0f - sig));
  }
}

// --- Softmax, cross-entropy, top-k ------------------------------------------------------------------------

namespace {
// p = softmax(l) over n entries; returns log(sum(exp(l))), computed stably.
double softmax_row(const float* l, float* p, std::int64_t n) {
  const float mx = *std::max_element(l, l + n);
  double sum = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    p[i] = std::exp(l[i] - mx);
    sum += p[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (std::int64_t i = 0; i < n; ++i) p[i] *= inv;
  return std::log(sum) + mx;
}
}  // namespace

void softmax_rows(const float* logits, float* p, std::int64_t rows, std::int64_t n) {
  for (std::int64_t r = 0; r < rows; ++r) softmax_row(logits + r * n, p + r * n, n);
}

void softmax_rows_backward(const float* p, const float* dp, float* dlogits, std::int64_t rows, std::int64_t n) {
  for (std::int64_t r = 0; r < rows; ++r) {
    const float* pr = p + r * n;
    const float* dpr = dp + r * n;
    double dot = 0;
    for (std::int64_t i = 0; i < n; ++i) dot += static_cast<double>(pr[i]) * dpr[i];
    for (std::int64_t i = 0; i < n; ++i) dlogits[r * n + i] = pr[i] * (dpr[i] - static_cast<float>(dot));
  }
}

double cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs, std::int64_t rows,
                             std::int64_t vocab) {
  double total = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    // -log softmax(l)[target] = logsumexp(l) - l[target].
    const double lse = softmax_row(logits + r * vocab, probs + r * vocab, vocab);
    total += lse - static_cast<double>(logits[r * vocab + targets[r]]);
  }
  return total;
}

void cross_entropy_backward(const float* probs, const std::int32_t* targets, float scale, float* dlogits,
                            std::int64_t rows, std::int64_t vocab) {
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t i = 0; i < vocab; ++i) dlogits[r * vocab + i] = scale * probs[r * vocab + i];
    dlogits[r * vocab + targets[r]] -= scale;
  }
}

// Insertion into a sorted list of the best k so far; strict > keeps the lower index first on ties.
void top_k(const float* p, std::int64_t n, std::int64_t k, std::int32_t* index) {
  std::int64_t filled = 0;
  for (std::int64_t j = 0; j < n; ++j) {
    if (filled == k && !(p[j] > p[index[k - 1]])) continue;
    std::int64_t pos = filled < k ? filled++ : k - 1;
    while (pos > 0 && p[j] > p[index[pos - 1]]) {
      index[pos] = index[pos - 1];
      --pos;
    }
    index[pos] = static_cast<std::int32_t>(j);
  }
}

}  // namespace hzp::runtime::kernels
