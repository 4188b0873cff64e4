// The fp32 CPU kernels the models are built from: matmuls (OpenBLAS sgemm), RMSNorm, rotary positions,
// causal softmax attention, SwiGLU, row softmax, cross-entropy and top-k, each forward with its backward.
//
// Conventions: matrices are row-major; `rows x cols` everywhere. Backward kernels that produce parameter
// gradients accumulate (+=) into them; what they do with input gradients is stated per function. No kernel
// allocates or starts threads (OpenBLAS's thread count is the caller's business).
#pragma once

#include <cstdint>

namespace hzp::runtime::kernels {

// --- Matmuls ----------------------------------------------------------------------------------------------

// C[m x n] = alpha * op(A) op(B) + beta * C, op = transpose where asked; lda/ldb/ldc are the row strides of
// A, B, C as stored (so a head's slice of a [T x h] activation is `ptr + head * d` with ld = h).
void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc);

// y[m x n] = x[m x k] W[k x n]  (accumulate: y += x W)
void matmul(const float* x, const float* w, float* y, std::int64_t m, std::int64_t k, std::int64_t n,
            bool accumulate = false);
// dx[m x k] = dy[m x n] W^T  (W is [k x n]; accumulate: dx += dy W^T)
void matmul_dx(const float* dy, const float* w, float* dx, std::int64_t m, std::int64_t k, std::int64_t n,
               bool accumulate = false);
// dW[k x n] += x[m x k]^T dy[m x n]  (always accumulates: parameter gradient)
void matmul_dw(const float* x, const float* dy, float* dw, std::int64_t m, std::int64_t k, std::int64_t n);

// --- RMSNorm: y = x / sqrt(mean(x^2) + eps) * w, per row of h ------------------------------------------------

constexpr float kNormEps = 1e-5f;

// Writes y and rstd[row] = 1 / sqrt(mean(x^2) + eps) (saved for backward).
void rmsnorm_forward(const float* x, const float* w, float* y, float* rstd, std::int64_t rows, std::int64_t h);
// dx += dL/dx (accumulate) or dx = dL/dx; dw += dL/dw.
void rmsnorm_backward(const float* x, const float* w, const float* rstd, const float* dy, float* dx, float* dw,
                      std::int64_t rows, std::int64_t h, bool accumulate);

// --- Rotary positions (rotate-half, HF LLaMA), theta 10000 ---------------------------------------------------

// cos/sin tables [seq x d/2]: angle(t, i) = t * 10000^(-2i/d).
void rope_tables(std::int64_t seq, std::int64_t d, float* cos_table, float* sin_table);
// In place on a [batch*seq x heads*d] activation; position = row % seq. For each head and i < d/2:
//   y[i] = x[i] cos - x[i + d/2] sin;  y[i + d/2] = x[i + d/2] cos + x[i] sin.
void rope_forward(float* x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                  const float* cos_table, const float* sin_table);
// The transpose of the rotation (the inverse rotation), applied in place to the gradient.
void rope_backward(float* dx, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                   const float* cos_table, const float* sin_table);

// --- Causal softmax attention, heads side by side in [batch*seq x heads*d] activations ---------------------

// out = softmax(mask(q k^T / sqrt(d))) v per (sequence, head). probs [batch*heads x seq x seq] is saved for
// backward (entries above the diagonal are 0).
void attention_forward(const float* q, const float* k, const float* v, float* probs, float* out, std::int64_t batch,
                       std::int64_t seq, std::int64_t heads, std::int64_t d);
// Writes (overwrites) dq, dk, dv. scratch holds seq*seq floats.
void attention_backward(const float* q, const float* k, const float* v, const float* probs, const float* dout,
                        float* dq, float* dk, float* dv, float* scratch, std::int64_t batch, std::int64_t seq,
                        std::int64_t heads, std::int64_t d);

// --- SwiGLU: act = silu(gate) * up, silu(g) = g * sigmoid(g) ------------------------------------------------

void swiglu_forward(const float* gate, const float* up, float* act, std::int64_t n);
// Writes (overwrites) dgate and dup.
void swiglu_backward(const float* gate, const float* up, const float* dact, float* dgate, float* dup, std::int64_t n);

// --- Softmax, cross-entropy, top-k ---------------------------------------------------------------------------

// p = softmax(logits) per row of n (p may alias logits).
void softmax_rows(const float* logits, float* p, std::int64_t rows, std::int64_t n);
// dlogits = p * (dp - sum(p * dp)) per row (overwrites).
void softmax_rows_backward(const float* p, const float* dp, float* dlogits, std::int64_t rows, std::int64_t n);

// probs = softmax(logits) per row; returns the SUM over rows of -log probs[row][target[row]] (nats, in double).
double cross_entropy_forward(const float* logits, const std::int32_t* targets, float* probs, std::int64_t rows,
                             std::int64_t vocab);
// dlogits = scale * (probs - onehot(target)) (overwrites).
void cross_entropy_backward(const float* probs, const std::int32_t* targets, float scale, float* dlogits,
                            std::int64_t rows, std::int64_t vocab);

// The k largest of p[0..n) in descending order (ties: lower index first) into index[0..k).
void top_k(const float* p, std::int64_t n, std::int64_t k, std::int32_t* index);

}  // namespace hzp::runtime::kernels
