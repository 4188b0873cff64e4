// The kernel interface's argument checks (kernels.h), shared by every backend: a call runs only when its
// buffers have the right types and hold what the sizes say; otherwise it records an error naming the kernel
// and the buffer, and every later call does nothing.
#include "runtime/device/kernels.h"

#include <limits>

namespace hzp::runtime {

namespace {

bool tensor_type(ScalarType t) {
  return is_tensor_type(t);
}
bool floating_type(ScalarType t) {
  return is_floating(t);
}

// a * b, or -1 when it overflows int64 (so a size check fails instead of wrapping).
std::int64_t mul(std::int64_t a, std::int64_t b) {
  if (a < 0 || b < 0) return -1;
  if (a != 0 && b > std::numeric_limits<std::int64_t>::max() / a) return -1;
  return a * b;
}

std::string dims(std::int64_t a, std::int64_t b) {
  return std::to_string(a) + " x " + std::to_string(b);
}

}  // namespace

// --- Checks ---------------------------------------------------------------------------------------------------

void Kernels::fail(Status status) {
  if (status_.ok() && !status.ok()) status_ = std::move(status);
}

bool Kernels::check(bool ok, const char* kernel, const std::string& what) {
  if (!status_.ok()) return false;
  if (!ok) status_ = Status::InvalidInput(std::string("kernel ") + kernel + " (" + backend() + "): " + what);
  return ok;
}

bool Kernels::check_type(const Buffer& b, const char* kernel, const char* name, bool (*allowed)(ScalarType),
                         const char* expected) {
  return check(allowed(b.type), kernel, std::string(name) + " is " + to_string(b.type) + ", expected " + expected);
}

bool Kernels::check_is(const Buffer& b, ScalarType type, const char* kernel, const char* name) {
  return check(b.type == type, kernel,
               std::string(name) + " is " + to_string(b.type) + ", expected " + to_string(type));
}

bool Kernels::check_count(const Buffer& b, std::int64_t at_least, const char* kernel, const char* name) {
  if (!check(at_least >= 0, kernel, std::string("the size of ") + name + " overflows or is negative")) return false;
  return check(b.count >= at_least && (b.count == 0 || b.data != nullptr), kernel,
               std::string(name) + " holds " + std::to_string(b.count) + " elements" +
                   (b.data == nullptr && b.count > 0 ? " at a null address" : "") + ", needs " +
                   std::to_string(at_least));
}

// A [rows x cols] matrix with row stride ld, `batch` times `stride` apart: the last element must be inside.
bool Kernels::check_matrix(const Buffer& b, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                           std::int64_t stride, const char* kernel, const char* name) {
  if (!check(rows >= 0 && cols >= 0 && batch >= 1 && stride >= 0, kernel,
             std::string(name) + ": negative size or no batch"))
    return false;
  if (rows == 0 || cols == 0) return true;
  if (!check(ld >= cols, kernel,
             std::string(name) + ": row stride " + std::to_string(ld) + " < " + std::to_string(cols) + " columns"))
    return false;
  const std::int64_t last_item = mul(batch - 1, stride);
  const std::int64_t last_row = mul(rows - 1, ld);
  const std::int64_t need = last_item < 0 || last_row < 0 ? -1 : last_item + last_row + cols;
  return check_count(b, need, kernel, name);
}

// --- Memory -----------------------------------------------------------------------------------------------

void Kernels::fill(const Buffer& x, double value) {
  if (ready()) do_fill(x, value);
}

void Kernels::copy(const Buffer& src, const Buffer& dst) {
  constexpr const char* k = "copy";
  if (!check(src.type == dst.type && src.count == dst.count, k,
             "src " + std::to_string(src.count) + " " + to_string(src.type) + " into dst " + std::to_string(dst.count) +
                 " " + to_string(dst.type)))
    return;
  do_copy(src, dst);
}

void Kernels::cast(const Buffer& src, const Buffer& dst) {
  constexpr const char* k = "cast";
  if (!check_type(src, k, "src", floating_type, "a floating type") ||
      !check_type(dst, k, "dst", floating_type, "a floating type") ||
      !check(src.count == dst.count, k,
             "src holds " + std::to_string(src.count) + ", dst " + std::to_string(dst.count)))
    return;
  do_cast(src, dst);
}

void Kernels::copy_from_host(const void* src, const Buffer& dst) {
  if (!check(src != nullptr || dst.count == 0, "copy_from_host", "null host pointer")) return;
  do_copy_from_host(src, dst);
}

void Kernels::copy_to_host(const Buffer& src, void* dst) {
  if (!check(dst != nullptr || src.count == 0, "copy_to_host", "null host pointer")) return;
  do_copy_to_host(src, dst);
}

// --- Element-wise, norms, the optimizer ---------------------------------------------------------------------

void Kernels::scale(const Buffer& x, float alpha) {
  if (check_type(x, "scale", "x", floating_type, "a floating type")) do_scale(x, alpha);
}

void Kernels::add(const Buffer& src, const Buffer& dst) {
  constexpr const char* k = "add";
  if (!check_type(src, k, "src", tensor_type, "fp32/bf16/fp16") ||
      !check_type(dst, k, "dst", tensor_type, "fp32/bf16/fp16") ||
      !check(src.count == dst.count, k,
             "src holds " + std::to_string(src.count) + ", dst " + std::to_string(dst.count)))
    return;
  do_add(src, dst);
}

void Kernels::sum_squares(const Buffer& x, std::int64_t replicas, const Buffer& acc) {
  constexpr const char* k = "sum_squares";
  if (!check_type(x, k, "x", tensor_type, "fp32/bf16/fp16") || !check_is(acc, ScalarType::kFp64, k, "acc") ||
      !check_count(acc, 1, k, "acc") || !check(replicas >= 1, k, "replicas must be at least 1"))
    return;
  do_sum_squares(x, replicas, acc);
}

void Kernels::clip_coefficient(const Buffer& norm_sq, double max_norm, double inv_loss_scale, const Buffer& norm,
                               const Buffer& coef) {
  constexpr const char* k = "clip_coefficient";
  if (!check_is(norm_sq, ScalarType::kFp32, k, "norm_sq") || !check_count(norm_sq, 1, k, "norm_sq") ||
      !check_is(norm, ScalarType::kFp64, k, "norm") || !check_count(norm, 1, k, "norm") ||
      !check_is(coef, ScalarType::kFp32, k, "coef") || !check_count(coef, 1, k, "coef") ||
      !check(inv_loss_scale > 0, k, "inv_loss_scale must be positive"))
    return;
  do_clip_coefficient(norm_sq, max_norm, inv_loss_scale, norm, coef);
}

void Kernels::adamw(const AdamWHyper& hyper, const std::vector<AdamWTensor>& tensors) {
  constexpr const char* k = "adamw";
  if (!check_is(hyper.coef, ScalarType::kFp32, k, "coef") || !check_count(hyper.coef, 1, k, "coef") ||
      !check(hyper.step >= 1, k, "step must be at least 1"))
    return;
  if (!hyper.skip_if_nonfinite.empty() && !check_is(hyper.skip_if_nonfinite, ScalarType::kFp64, k, "skip_if_nonfinite"))
    return;
  for (const AdamWTensor& t : tensors) {
    const std::int64_t n = t.param.count;
    if (!check_type(t.param, k, "param", tensor_type, "fp32/bf16/fp16") ||
        !check_type(t.grad, k, "grad", tensor_type, "fp32/bf16/fp16") || !check_is(t.m, ScalarType::kFp32, k, "m") ||
        !check_is(t.v, ScalarType::kFp32, k, "v") ||
        !check(t.grad.count == n && t.m.count == n && t.v.count == n, k,
               "param, grad, m, v hold " + std::to_string(n) + ", " + std::to_string(t.grad.count) + ", " +
                   std::to_string(t.m.count) + ", " + std::to_string(t.v.count) + " elements"))
      return;
    if (t.master.empty()) {
      if (!check(t.param.type == ScalarType::kFp32 || n == 0, k, "a 16-bit param needs an fp32 master copy")) return;
    } else if (!check_is(t.master, ScalarType::kFp32, k, "master") ||
               !check(t.master.count == n, k,
                      "master holds " + std::to_string(t.master.count) + ", param " + std::to_string(n))) {
      return;
    }
  }
  do_adamw(hyper, tensors);
}

// --- Matmuls ------------------------------------------------------------------------------------------------

void Kernels::matmul(const MatmulArgs& a) {
  constexpr const char* k = "matmul";
  if (!check(a.m >= 0 && a.n >= 0 && a.k >= 0 && a.batch >= 1, k,
             "bad sizes m " + std::to_string(a.m) + ", n " + std::to_string(a.n) + ", k " + std::to_string(a.k) +
                 ", batch " + std::to_string(a.batch)) ||
      !check_type(a.a, k, "A", tensor_type, "fp32/bf16/fp16") ||
      !check(a.b.type == a.a.type, k,
             std::string("B is ") + to_string(a.b.type) + ", A is " + to_string(a.a.type) + " (they must match)") ||
      !check(a.c.type == a.a.type || a.c.type == ScalarType::kFp32, k,
             std::string("C is ") + to_string(a.c.type) + ", expected " + to_string(a.a.type) + " or fp32"))
    return;
  // As stored: A is [m x k] (or [k x m] transposed), B [k x n] (or [n x k]), C [m x n].
  if (!check_matrix(a.a, a.trans_a ? a.k : a.m, a.trans_a ? a.m : a.k, a.lda, a.batch, a.stride_a, k, "A") ||
      !check_matrix(a.b, a.trans_b ? a.n : a.k, a.trans_b ? a.k : a.n, a.ldb, a.batch, a.stride_b, k, "B") ||
      !check_matrix(a.c, a.m, a.n, a.ldc, a.batch, a.stride_c, k, "C"))
    return;
  do_matmul(a);
}

void Kernels::linear(const Buffer& x, const Buffer& w, const Buffer& y, std::int64_t m, std::int64_t k, std::int64_t n,
                     bool accumulate) {
  MatmulArgs a;
  a.m = m, a.n = n, a.k = k;
  a.a = x, a.lda = k;
  a.b = w, a.ldb = n;
  a.c = y, a.ldc = n;
  a.beta = accumulate ? 1.0f : 0.0f;
  matmul(a);
}

void Kernels::linear_dx(const Buffer& dy, const Buffer& w, const Buffer& dx, std::int64_t m, std::int64_t k,
                        std::int64_t n, bool accumulate) {
  MatmulArgs a;
  a.trans_b = true;
  a.m = m, a.n = k, a.k = n;
  a.a = dy, a.lda = n;
  a.b = w, a.ldb = n;
  a.c = dx, a.ldc = k;
  a.beta = accumulate ? 1.0f : 0.0f;
  matmul(a);
}

void Kernels::linear_dw(const Buffer& x, const Buffer& dy, const Buffer& dw, std::int64_t m, std::int64_t k,
                        std::int64_t n) {
  MatmulArgs a;
  a.trans_a = true;
  a.m = k, a.n = n, a.k = m;
  a.a = x, a.lda = k;
  a.b = dy, a.ldb = n;
  a.c = dw, a.ldc = n;
  a.beta = 1.0f;
  matmul(a);
}

// --- Embedding, RMSNorm, rotary, SwiGLU, softmax ----------------------------------------------------------------

void Kernels::embedding_forward(const Buffer& table, const Buffer& ids, const Buffer& out, std::int64_t hidden) {
  constexpr const char* k = "embedding_forward";
  if (!check(hidden >= 1, k, "hidden must be at least 1") ||
      !check_type(table, k, "table", tensor_type, "fp32/bf16/fp16") || !check_is(ids, ScalarType::kInt32, k, "ids") ||
      !check(out.type == table.type, k, "out and table types differ") ||
      !check_count(out, mul(ids.count, hidden), k, "out"))
    return;
  do_embedding_forward(table, ids, out, hidden);
}

void Kernels::embedding_backward(const Buffer& dout, const Buffer& ids, const Buffer& dtable, std::int64_t hidden) {
  constexpr const char* k = "embedding_backward";
  if (!check(hidden >= 1, k, "hidden must be at least 1") ||
      !check_type(dout, k, "dout", tensor_type, "fp32/bf16/fp16") ||
      !check_type(dtable, k, "dtable", tensor_type, "fp32/bf16/fp16") || !check_is(ids, ScalarType::kInt32, k, "ids") ||
      !check_count(dout, mul(ids.count, hidden), k, "dout"))
    return;
  do_embedding_backward(dout, ids, dtable, hidden);
}

void Kernels::rmsnorm_forward(const Buffer& x, const Buffer& w, const Buffer& y, const Buffer& rstd, std::int64_t rows,
                              std::int64_t h) {
  constexpr const char* k = "rmsnorm_forward";
  const std::int64_t n = mul(rows, h);
  if (!check(h >= 1, k, "h must be at least 1") || !check_type(x, k, "x", tensor_type, "fp32/bf16/fp16") ||
      !check(w.type == x.type && y.type == x.type, k, "x, w and y must have one type") || !check_count(x, n, k, "x") ||
      !check_count(w, h, k, "w") || !check_count(y, n, k, "y") || !check_is(rstd, ScalarType::kFp32, k, "rstd") ||
      !check_count(rstd, rows, k, "rstd"))
    return;
  do_rmsnorm_forward(x, w, y, rstd, rows, h);
}

void Kernels::rmsnorm_backward(const Buffer& x, const Buffer& w, const Buffer& rstd, const Buffer& dy, const Buffer& dx,
                               const Buffer& dw, std::int64_t rows, std::int64_t h, bool accumulate) {
  constexpr const char* k = "rmsnorm_backward";
  const std::int64_t n = mul(rows, h);
  if (!check(h >= 1, k, "h must be at least 1") || !check_type(x, k, "x", tensor_type, "fp32/bf16/fp16") ||
      !check(w.type == x.type && dy.type == x.type && dx.type == x.type, k, "x, w, dy and dx must have one type") ||
      !check_type(dw, k, "dw", tensor_type, "fp32/bf16/fp16") || !check_count(x, n, k, "x") ||
      !check_count(w, h, k, "w") || !check_count(dy, n, k, "dy") || !check_count(dx, n, k, "dx") ||
      !check_count(dw, h, k, "dw") || !check_is(rstd, ScalarType::kFp32, k, "rstd") ||
      !check_count(rstd, rows, k, "rstd"))
    return;
  do_rmsnorm_backward(x, w, rstd, dy, dx, dw, rows, h, accumulate);
}

void Kernels::rope_tables(const Buffer& cos, const Buffer& sin, std::int64_t seq, std::int64_t d) {
  constexpr const char* k = "rope_tables";
  if (!check(seq >= 1 && d >= 2 && d % 2 == 0, k, "needs seq >= 1 and an even d >= 2") ||
      !check_is(cos, ScalarType::kFp32, k, "cos") || !check_is(sin, ScalarType::kFp32, k, "sin") ||
      !check_count(cos, mul(seq, d / 2), k, "cos") || !check_count(sin, mul(seq, d / 2), k, "sin"))
    return;
  do_rope_tables(cos, sin, seq, d);
}

void Kernels::rope_forward(const Buffer& x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                           const Buffer& cos, const Buffer& sin) {
  constexpr const char* k = "rope";
  if (!check(seq >= 1 && heads >= 1 && d >= 2 && d % 2 == 0, k, "needs seq, heads >= 1 and an even d") ||
      !check_type(x, k, "x", tensor_type, "fp32/bf16/fp16") || !check_count(x, mul(rows, mul(heads, d)), k, "x") ||
      !check_count(cos, mul(std::min(rows, seq), d / 2), k, "cos") ||
      !check_count(sin, mul(std::min(rows, seq), d / 2), k, "sin") || !check_is(cos, ScalarType::kFp32, k, "cos") ||
      !check_is(sin, ScalarType::kFp32, k, "sin"))
    return;
  do_rope(x, rows, seq, heads, d, cos, sin, /*inverse=*/false);
}

void Kernels::rope_backward(const Buffer& dx, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                            const Buffer& cos, const Buffer& sin) {
  constexpr const char* k = "rope";
  if (!check(seq >= 1 && heads >= 1 && d >= 2 && d % 2 == 0, k, "needs seq, heads >= 1 and an even d") ||
      !check_type(dx, k, "dx", tensor_type, "fp32/bf16/fp16") || !check_count(dx, mul(rows, mul(heads, d)), k, "dx") ||
      !check_count(cos, mul(std::min(rows, seq), d / 2), k, "cos") ||
      !check_count(sin, mul(std::min(rows, seq), d / 2), k, "sin") || !check_is(cos, ScalarType::kFp32, k, "cos") ||
      !check_is(sin, ScalarType::kFp32, k, "sin"))
    return;
  do_rope(dx, rows, seq, heads, d, cos, sin, /*inverse=*/true);
}

void Kernels::swiglu_forward(const Buffer& gate, const Buffer& up, const Buffer& act, std::int64_t rows,
                             std::int64_t width, const Buffer& row_limit) {
  constexpr const char* k = "swiglu_forward";
  const std::int64_t n = mul(rows, width);
  if (!check_type(gate, k, "gate", tensor_type, "fp32/bf16/fp16") ||
      !check(up.type == gate.type && act.type == gate.type, k, "gate, up and act must have one type") ||
      !check_count(gate, n, k, "gate") || !check_count(up, n, k, "up") || !check_count(act, n, k, "act") ||
      (!row_limit.empty() && !check_is(row_limit, ScalarType::kInt64, k, "row_limit")))
    return;
  do_swiglu_forward(gate, up, act, rows, width, row_limit);
}

void Kernels::swiglu_backward(const Buffer& gate, const Buffer& up, const Buffer& dact, const Buffer& dgate,
                              const Buffer& dup, std::int64_t rows, std::int64_t width, const Buffer& row_limit) {
  constexpr const char* k = "swiglu_backward";
  const std::int64_t n = mul(rows, width);
  if (!check_type(gate, k, "gate", tensor_type, "fp32/bf16/fp16") ||
      !check(up.type == gate.type && dact.type == gate.type && dgate.type == gate.type && dup.type == gate.type, k,
             "gate, up, dact, dgate and dup must have one type") ||
      !check_count(gate, n, k, "gate") || !check_count(up, n, k, "up") || !check_count(dact, n, k, "dact") ||
      !check_count(dgate, n, k, "dgate") || !check_count(dup, n, k, "dup") ||
      (!row_limit.empty() && !check_is(row_limit, ScalarType::kInt64, k, "row_limit")))
    return;
  do_swiglu_backward(gate, up, dact, dgate, dup, rows, width, row_limit);
}

void Kernels::softmax_rows(const Buffer& x, const Buffer& p, std::int64_t rows, std::int64_t n) {
  constexpr const char* k = "softmax_rows";
  if (!check(n >= 1, k, "n must be at least 1") || !check_type(x, k, "x", tensor_type, "fp32/bf16/fp16") ||
      !check_type(p, k, "p", tensor_type, "fp32/bf16/fp16") || !check_count(x, mul(rows, n), k, "x") ||
      !check_count(p, mul(rows, n), k, "p"))
    return;
  do_softmax_rows(x, p, rows, n);
}

void Kernels::softmax_rows_backward(const Buffer& p, const Buffer& dp, const Buffer& dx, std::int64_t rows,
                                    std::int64_t n) {
  constexpr const char* k = "softmax_rows_backward";
  if (!check(n >= 1, k, "n must be at least 1") || !check_type(p, k, "p", tensor_type, "fp32/bf16/fp16") ||
      !check_type(dp, k, "dp", tensor_type, "fp32/bf16/fp16") ||
      !check_type(dx, k, "dx", tensor_type, "fp32/bf16/fp16") || !check_count(p, mul(rows, n), k, "p") ||
      !check_count(dp, mul(rows, n), k, "dp") || !check_count(dx, mul(rows, n), k, "dx"))
    return;
  do_softmax_rows_backward(p, dp, dx, rows, n);
}

// --- Attention, cross-entropy ---------------------------------------------------------------------------------

namespace {
struct AttentionSizes {
  std::int64_t q = -1, kv = -1, lse = -1;
};
AttentionSizes attention_sizes(const AttentionShape& s) {
  const std::int64_t tokens = mul(s.batch, s.seq);
  return {mul(tokens, mul(s.heads, s.head_dim)), mul(tokens, mul(s.kv_heads, s.head_dim)),
          mul(s.batch, mul(s.heads, s.seq))};
}
}  // namespace

void Kernels::attention_forward(const AttentionShape& s, const Buffer& q, const Buffer& k, const Buffer& v,
                                const Buffer& out, const Buffer& lse, const Buffer& reserve) {
  constexpr const char* kn = "attention_forward";
  const AttentionSizes n = attention_sizes(s);
  if (!check(s.batch >= 1 && s.seq >= 1 && s.head_dim >= 1 && s.kv_heads >= 1 && s.heads >= s.kv_heads &&
                 s.heads % s.kv_heads == 0,
             kn, "bad shape (heads must be a multiple of kv_heads)") ||
      !check_type(q, kn, "q", tensor_type, "fp32/bf16/fp16") ||
      !check(k.type == q.type && v.type == q.type && out.type == q.type, kn, "q, k, v and out must have one type") ||
      !check_count(q, n.q, kn, "q") || !check_count(k, n.kv, kn, "k") || !check_count(v, n.kv, kn, "v") ||
      !check_count(out, n.q, kn, "out") || !check_is(lse, ScalarType::kFp32, kn, "lse") ||
      !check_count(lse, n.lse, kn, "lse") || !check_is(reserve, ScalarType::kFp32, kn, "reserve") ||
      (!reserve.empty() && !check_count(reserve, attention_reserve(s), kn, "reserve")))
    return;
  do_attention_forward(s, q, k, v, out, lse, reserve);
}

void Kernels::attention_backward(const AttentionShape& s, const Buffer& q, const Buffer& k, const Buffer& v,
                                 const Buffer& out, const Buffer& dout, const Buffer& lse, const Buffer& reserve,
                                 const Buffer& dq, const Buffer& dk, const Buffer& dv) {
  constexpr const char* kn = "attention_backward";
  const AttentionSizes n = attention_sizes(s);
  if (!check(s.batch >= 1 && s.seq >= 1 && s.head_dim >= 1 && s.kv_heads >= 1 && s.heads >= s.kv_heads &&
                 s.heads % s.kv_heads == 0,
             kn, "bad shape (heads must be a multiple of kv_heads)") ||
      !check_type(q, kn, "q", tensor_type, "fp32/bf16/fp16") ||
      !check(k.type == q.type && v.type == q.type && out.type == q.type && dout.type == q.type && dq.type == q.type &&
                 dk.type == q.type && dv.type == q.type,
             kn, "q, k, v, out, dout, dq, dk and dv must have one type") ||
      !check_count(q, n.q, kn, "q") || !check_count(k, n.kv, kn, "k") || !check_count(v, n.kv, kn, "v") ||
      !check_count(out, n.q, kn, "out") || !check_count(dout, n.q, kn, "dout") || !check_count(dq, n.q, kn, "dq") ||
      !check_count(dk, n.kv, kn, "dk") || !check_count(dv, n.kv, kn, "dv") ||
      !check_is(lse, ScalarType::kFp32, kn, "lse") || !check_count(lse, n.lse, kn, "lse") ||
      !check_is(reserve, ScalarType::kFp32, kn, "reserve") ||
      (!reserve.empty() && !check_count(reserve, attention_reserve(s), kn, "reserve")))
    return;
  do_attention_backward(s, q, k, v, out, dout, lse, reserve, dq, dk, dv);
}

void Kernels::cross_entropy_forward(const Buffer& logits, const Buffer& targets, const Buffer& reserve,
                                    const Buffer& loss_sum, std::int64_t rows, std::int64_t vocab) {
  constexpr const char* k = "cross_entropy_forward";
  if (!check(vocab >= 1, k, "vocab must be at least 1") ||
      !check_type(logits, k, "logits", tensor_type, "fp32/bf16/fp16") ||
      !check_count(logits, mul(rows, vocab), k, "logits") || !check_is(targets, ScalarType::kInt32, k, "targets") ||
      !check_count(targets, rows, k, "targets") || !check_is(reserve, ScalarType::kFp32, k, "reserve") ||
      !check_count(reserve, cross_entropy_reserve(rows, vocab), k, "reserve") ||
      !check_is(loss_sum, ScalarType::kFp64, k, "loss_sum") || !check_count(loss_sum, 1, k, "loss_sum"))
    return;
  do_cross_entropy_forward(logits, targets, reserve, loss_sum, rows, vocab);
}

void Kernels::cross_entropy_backward(const Buffer& logits, const Buffer& targets, const Buffer& reserve, float scale,
                                     const Buffer& dlogits, std::int64_t rows, std::int64_t vocab) {
  constexpr const char* k = "cross_entropy_backward";
  if (!check(vocab >= 1, k, "vocab must be at least 1") ||
      !check_type(logits, k, "logits", tensor_type, "fp32/bf16/fp16") ||
      !check(dlogits.type == logits.type, k, "dlogits and logits types differ") ||
      !check_count(logits, mul(rows, vocab), k, "logits") || !check_count(dlogits, mul(rows, vocab), k, "dlogits") ||
      !check_is(targets, ScalarType::kInt32, k, "targets") || !check_count(targets, rows, k, "targets") ||
      !check_is(reserve, ScalarType::kFp32, k, "reserve") ||
      !check_count(reserve, cross_entropy_reserve(rows, vocab), k, "reserve"))
    return;
  do_cross_entropy_backward(logits, targets, reserve, scale, dlogits, rows, vocab);
}

// --- MoE ------------------------------------------------------------------------------------------------------

void Kernels::moe_topk(const Buffer& probs, const Buffer& selected, const Buffer& weight, const Buffer& psum,
                       const Buffer& expert_count, std::int64_t t, std::int64_t e, std::int64_t topk) {
  constexpr const char* k = "moe_topk";
  if (!check(e >= 1 && topk >= 1 && topk <= e, k, "needs 1 <= k <= experts") ||
      !check_is(probs, ScalarType::kFp32, k, "probs") || !check_count(probs, mul(t, e), k, "probs") ||
      !check_is(selected, ScalarType::kInt32, k, "selected") || !check_count(selected, mul(t, topk), k, "selected") ||
      !check_is(weight, ScalarType::kFp32, k, "weight") || !check_count(weight, mul(t, topk), k, "weight") ||
      !check_is(psum, ScalarType::kFp32, k, "psum") || !check_count(psum, t, k, "psum") ||
      !check_is(expert_count, ScalarType::kInt64, k, "expert_count") ||
      !check_count(expert_count, e, k, "expert_count"))
    return;
  do_moe_topk(probs, selected, weight, psum, expert_count, t, e, topk);
}

void Kernels::moe_aux_loss(const Buffer& probs, const Buffer& expert_count, const Buffer& fraction,
                           const Buffer& aux_sum, std::int64_t t, std::int64_t e, std::int64_t topk) {
  constexpr const char* k = "moe_aux_loss";
  if (!check(t >= 1 && e >= 1 && topk >= 1, k, "needs t, experts, k >= 1") ||
      !check_is(probs, ScalarType::kFp32, k, "probs") || !check_count(probs, mul(t, e), k, "probs") ||
      !check_is(expert_count, ScalarType::kInt64, k, "expert_count") ||
      !check_count(expert_count, e, k, "expert_count") || !check_is(fraction, ScalarType::kFp32, k, "fraction") ||
      !check_count(fraction, e, k, "fraction") || !check_is(aux_sum, ScalarType::kFp64, k, "aux_sum") ||
      !check_count(aux_sum, 1, k, "aux_sum"))
    return;
  do_moe_aux_loss(probs, expert_count, fraction, aux_sum, t, e, topk);
}

void Kernels::moe_permute(const Buffer& x, const Buffer& selected, const Buffer& expert_count, const Buffer& rows,
                          const Buffer& send_row, std::int64_t t, std::int64_t e, std::int64_t topk, std::int64_t h) {
  constexpr const char* k = "moe_permute";
  if (!check(e >= 1 && topk >= 1 && h >= 1, k, "needs experts, k, h >= 1") ||
      !check_type(x, k, "x", tensor_type, "fp32/bf16/fp16") ||
      !check(rows.type == x.type, k, "rows and x types differ") || !check_count(x, mul(t, h), k, "x") ||
      !check_count(rows, mul(mul(t, topk), h), k, "rows") || !check_is(selected, ScalarType::kInt32, k, "selected") ||
      !check_count(selected, mul(t, topk), k, "selected") ||
      !check_is(expert_count, ScalarType::kInt64, k, "expert_count") ||
      !check_count(expert_count, e, k, "expert_count") || !check_is(send_row, ScalarType::kInt64, k, "send_row") ||
      !check_count(send_row, mul(t, topk), k, "send_row"))
    return;
  do_moe_permute(x, selected, expert_count, rows, send_row, t, e, topk, h);
}

void Kernels::moe_combine(const Buffer& rows, const Buffer& send_row, const Buffer& weight, const Buffer& x,
                          std::int64_t t, std::int64_t topk, std::int64_t h, bool accumulate) {
  constexpr const char* k = "moe_combine";
  if (!check(topk >= 1 && h >= 1, k, "needs k, h >= 1") ||
      !check_type(rows, k, "rows", tensor_type, "fp32/bf16/fp16") ||
      !check_type(x, k, "x", tensor_type, "fp32/bf16/fp16") || !check_count(rows, mul(mul(t, topk), h), k, "rows") ||
      !check_count(x, mul(t, h), k, "x") || !check_is(send_row, ScalarType::kInt64, k, "send_row") ||
      !check_count(send_row, mul(t, topk), k, "send_row") ||
      (!weight.empty() &&
       (!check_is(weight, ScalarType::kFp32, k, "weight") || !check_count(weight, mul(t, topk), k, "weight"))))
    return;
  do_moe_combine(rows, send_row, weight, x, t, topk, h, accumulate);
}

void Kernels::moe_combine_backward(const Buffer& dx, const Buffer& rows, const Buffer& send_row, const Buffer& weight,
                                   const Buffer& grad_rows, const Buffer& dweight, std::int64_t t, std::int64_t topk,
                                   std::int64_t h) {
  constexpr const char* k = "moe_combine_backward";
  if (!check(topk >= 1 && h >= 1, k, "needs k, h >= 1") || !check_type(dx, k, "dx", tensor_type, "fp32/bf16/fp16") ||
      !check_type(rows, k, "rows", tensor_type, "fp32/bf16/fp16") ||
      !check_type(grad_rows, k, "grad_rows", tensor_type, "fp32/bf16/fp16") || !check_count(dx, mul(t, h), k, "dx") ||
      !check_count(rows, mul(mul(t, topk), h), k, "rows") ||
      !check_count(grad_rows, mul(mul(t, topk), h), k, "grad_rows") ||
      !check_is(send_row, ScalarType::kInt64, k, "send_row") || !check_count(send_row, mul(t, topk), k, "send_row") ||
      !check_is(weight, ScalarType::kFp32, k, "weight") || !check_count(weight, mul(t, topk), k, "weight") ||
      !check_is(dweight, ScalarType::kFp32, k, "dweight") || !check_count(dweight, mul(t, topk), k, "dweight"))
    return;
  do_moe_combine_backward(dx, rows, send_row, weight, grad_rows, dweight, t, topk, h);
}

void Kernels::moe_router_backward(const Buffer& dweight, const Buffer& weight, const Buffer& selected,
                                  const Buffer& psum, const Buffer& fraction, float aux_coef, const Buffer& dp,
                                  std::int64_t t, std::int64_t e, std::int64_t topk) {
  constexpr const char* k = "moe_router_backward";
  if (!check(e >= 1 && topk >= 1 && topk <= e, k, "needs 1 <= k <= experts") ||
      !check_is(dweight, ScalarType::kFp32, k, "dweight") || !check_count(dweight, mul(t, topk), k, "dweight") ||
      !check_is(weight, ScalarType::kFp32, k, "weight") || !check_count(weight, mul(t, topk), k, "weight") ||
      !check_is(selected, ScalarType::kInt32, k, "selected") || !check_count(selected, mul(t, topk), k, "selected") ||
      !check_is(psum, ScalarType::kFp32, k, "psum") || !check_count(psum, t, k, "psum") ||
      !check_is(fraction, ScalarType::kFp32, k, "fraction") || !check_count(fraction, e, k, "fraction") ||
      !check_is(dp, ScalarType::kFp32, k, "dp") || !check_count(dp, mul(t, e), k, "dp"))
    return;
  do_moe_router_backward(dweight, weight, selected, psum, fraction, aux_coef, dp, t, e, topk);
}

void Kernels::moe_group(const Buffer& recv, const Buffer& counts, const Buffer& grouped, const Buffer& order,
                        const Buffer& offsets, std::int64_t sources, std::int64_t local, std::int64_t h) {
  constexpr const char* k = "moe_group";
  if (!check(sources >= 1 && local >= 1 && h >= 1, k, "needs sources, local, h >= 1") ||
      !check_type(recv, k, "recv", tensor_type, "fp32/bf16/fp16") ||
      !check(grouped.type == recv.type, k, "grouped and recv types differ") ||
      !check(grouped.count >= recv.count && recv.count % h == 0, k,
             "recv must be whole rows of h and fit in grouped") ||
      !check_is(counts, ScalarType::kInt64, k, "counts") || !check_count(counts, mul(sources, local), k, "counts") ||
      !check_is(order, ScalarType::kInt64, k, "order") || !check_count(order, recv.count / h, k, "order") ||
      !check_is(offsets, ScalarType::kInt64, k, "offsets") || !check_count(offsets, local + 1, k, "offsets"))
    return;
  do_moe_group(recv, counts, grouped, order, offsets, sources, local, h);
}

void Kernels::moe_ungroup(const Buffer& grouped, const Buffer& order, const Buffer& offsets, const Buffer& out,
                          std::int64_t local, std::int64_t width) {
  constexpr const char* k = "moe_ungroup";
  if (!check(local >= 1 && width >= 1, k, "needs local, width >= 1") ||
      !check_type(grouped, k, "grouped", tensor_type, "fp32/bf16/fp16") ||
      !check(out.type == grouped.type, k, "out and grouped types differ") ||
      !check(grouped.count % width == 0 && out.count >= grouped.count, k,
             "grouped must be whole rows and fit in out") ||
      !check_is(order, ScalarType::kInt64, k, "order") || !check_count(order, grouped.count / width, k, "order") ||
      !check_is(offsets, ScalarType::kInt64, k, "offsets") || !check_count(offsets, local + 1, k, "offsets"))
    return;
  do_moe_ungroup(grouped, order, offsets, out, local, width);
}

void Kernels::sum_counts(const Buffer& counts, const Buffer& out, std::int64_t n, std::int64_t local,
                         std::int64_t multiplier) {
  constexpr const char* k = "sum_counts";
  if (!check(n >= 1 && local >= 1, k, "needs n, local >= 1") || !check_is(counts, ScalarType::kInt64, k, "counts") ||
      !check_count(counts, mul(n, local), k, "counts") || !check_is(out, ScalarType::kInt64, k, "out") ||
      !check_count(out, n, k, "out"))
    return;
  do_sum_counts(counts, out, n, local, multiplier);
}

namespace {
// The widths of a and c in an expert GEMM, from W's stored shape: c_g = a_g op(W_g).
std::pair<std::int64_t, std::int64_t> expert_widths(const ExpertGemmArgs& a) {
  return a.trans_w ? std::make_pair(a.w_cols, a.w_rows) : std::make_pair(a.w_rows, a.w_cols);
}
}  // namespace

void Kernels::expert_gemm(const ExpertGemmArgs& a) {
  constexpr const char* k = "expert_gemm";
  const auto [in_width, out_width] = expert_widths(a);
  if (!check(a.groups >= 1 && a.w_rows >= 1 && a.w_cols >= 1 && a.w_stride >= a.w_rows * a.w_cols, k,
             "bad groups or W shape " + dims(a.w_rows, a.w_cols) + " with stride " + std::to_string(a.w_stride)) ||
      !check_type(a.a, k, "a", tensor_type, "fp32/bf16/fp16") ||
      !check(a.w.type == a.a.type && a.c.type == a.a.type, k, "a, w and c must have one type") ||
      !check_count(a.w, mul(a.groups - 1, a.w_stride) + a.w_rows * a.w_cols, k, "w") ||
      !check(a.a.count % in_width == 0 && a.c.count / out_width >= a.a.count / in_width, k,
             "a must be whole rows of " + std::to_string(in_width) + " and c hold as many rows of " +
                 std::to_string(out_width)) ||
      !check_is(a.offsets, ScalarType::kInt64, k, "offsets") || !check_count(a.offsets, a.groups + 1, k, "offsets"))
    return;
  do_expert_gemm(a);
}

void Kernels::expert_gemm_dw(const ExpertGemmArgs& a) {
  constexpr const char* k = "expert_gemm_dw";
  if (!check(a.groups >= 1 && a.w_rows >= 1 && a.w_cols >= 1 && a.w_stride >= a.w_rows * a.w_cols, k,
             "bad groups or W shape " + dims(a.w_rows, a.w_cols) + " with stride " + std::to_string(a.w_stride)) ||
      !check_type(a.a, k, "a", tensor_type, "fp32/bf16/fp16") ||
      !check(a.c.type == a.a.type, k, "a and c types differ") ||
      !check(a.w.type == a.a.type || a.w.type == ScalarType::kFp32, k,
             "w (the gradient) must be a's type or fp32, as matmul's c") ||
      !check_count(a.w, mul(a.groups - 1, a.w_stride) + a.w_rows * a.w_cols, k, "w") ||
      !check(a.a.count % a.w_rows == 0 && a.c.count % a.w_cols == 0 && a.a.count / a.w_rows == a.c.count / a.w_cols, k,
             "a [rows x " + std::to_string(a.w_rows) + "] and c [rows x " + std::to_string(a.w_cols) +
                 "] must have the same rows") ||
      !check_is(a.offsets, ScalarType::kInt64, k, "offsets") || !check_count(a.offsets, a.groups + 1, k, "offsets"))
    return;
  do_expert_gemm_dw(a);
}

}  // namespace hzp::runtime
