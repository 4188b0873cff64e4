// The kernel interface: every numeric operation the models (runtime/model/) and the optimizer need, on typed
// device buffers, issued on one stream. The CPU backend (runtime/backends/cpu/cpu_kernels.*) is the
// reference implementation: exact IEEE rounding of every 16-bit result, so another backend's kernels can be
// compared with it element by element (tests/kernels_test.cc runs the same checks against any backend).
//
// Calls are made in stream order: from the work of the Kernels' stream (Stream::submit), or from the host
// while nothing else runs on it. The CPU backend computes at once; a GPU backend enqueues on its stream.
//
// Conventions, for every kernel:
//   - Matrices are row-major, `rows x cols`; activations are [tokens x features] with tokens sequence-major
//     (token t of sequence b is row b * seq + t); heads sit side by side in the feature dimension.
//   - "Tensor" buffers (parameters, activations, gradients) are fp32, bf16 or fp16; the arithmetic is fp32
//     (fp64 where a reduction says so) and each result is rounded once to its buffer's type, ties to even.
//     A kernel that accumulates into a buffer (`+=`) starts from the buffer's value and rounds once at the end.
//   - Statistics saved for backward (RMSNorm's rstd, attention's log-sum-exp, the router's probabilities) are
//     fp32; loss and norm accumulators are fp64 scalars ([1]); token ids and expert choices int32; counts,
//     offsets and row maps int64.
//   - Sizes are checked against the buffers on every call: a call whose buffers are too small or of the
//     wrong type is not run, and its error (naming the kernel and the buffer) becomes status(). The first
//     error sticks, like a CUDA error: later calls do nothing, and the caller returns status() at its next
//     check (each module does at its end).
//   - "Reserve" buffers hold what a backend saves between a forward and its backward beyond the documented
//     outputs (cuDNN's reserve space): *_reserve() says how many fp32 elements a backend wants (0 is
//     allowed), the caller allocates them with the activations and passes the same buffer to both calls.
//     Attention also accepts an empty reserve (its backward then works from the log-sum-exp alone).
//   - MoE buffers sized by routing are capacities: the live row count is in device memory (an offsets
//     buffer), never on the host.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp::runtime {

// C[m x n] = alpha op(A) op(B) + beta C, op = transpose where asked, `batch` times with the given element
// strides between items. lda/ldb/ldc are the row strides of A, B, C as stored, so a head's slice of a
// [T x h] activation is `buffer.slice(head * d)` with ld = h. A and B have one tensor type; C is that type
// or fp32; the products accumulate in fp32. The fused epilogue is alpha, beta (beta = 1 is the residual add
// and the gradient accumulation) and the rounding to C's type.
struct MatmulArgs {
  bool trans_a = false, trans_b = false;
  std::int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  Buffer a, b, c;
  std::int64_t lda = 0, ldb = 0, ldc = 0;
  std::int64_t batch = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Causal attention of `heads` query heads over `kv_heads` key/value heads (GQA: query head i reads kv head
// i / (heads / kv_heads)), scores scaled by 1/sqrt(head_dim). q and out are [batch*seq x heads*head_dim],
// k and v [batch*seq x kv_heads*head_dim]; lse is fp32 [batch x heads x seq] (the log-sum-exp of each
// query row's scaled scores, what the backward needs).
//
// `algorithm`: kStandard is flash attention's online softmax; kPasa is PASA (docs/pasa.md): every block of 128
// keys shifted by its pseudo-average and the shift recovered in the online softmax, the same output and
// log-sum-exp mathematically, whose fp16 scores do not overflow. The backward is flash attention's for both,
// from the (recovered) log-sum-exp.
struct AttentionShape {
  std::int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  AttentionAlgorithm algorithm = AttentionAlgorithm::kStandard;
};

// One tensor of a multi-tensor AdamW: `param` (the working copy, any tensor type), `master` (its fp32 master
// copy, or empty when param is fp32 and is its own master), `grad` (any tensor type), Adam moments m, v
// (fp32); all of the same count. Weight decay applies when `decay`.
struct AdamWTensor {
  Buffer param, master, grad, m, v;
  bool decay = false;
};

// AdamW (Loshchilov & Hutter 2019) with bias correction, in fp64 arithmetic on fp32 storage:
//   g' = g * coef;  m <- b1 m + (1-b1) g';  v <- b2 v + (1-b2) g'^2;
//   w <- w - lr wd w (decay tensors only) - lr (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps),
// w being the master (or the fp32 param), then param = round(w). `coef` is an fp32 device scalar (global-norm
// clipping times 1 / loss scale: clip_coefficient() writes it). When `skip_if_nonfinite` (an fp64 scalar,
// e.g. the gradient norm) holds Inf or NaN the step leaves every tensor unchanged (a loss-scale overflow).
struct AdamWHyper {
  double lr = 0, beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0;
  std::int64_t step = 1;  // optimizer steps taken, this one included
  Buffer coef;
  Buffer skip_if_nonfinite;  // optional
};

// Grouped GEMM over a MoE layer's local experts: rows [offsets[g], offsets[g+1]) of `a` and `c` belong to
// expert g < groups, whose matrix W_g is stored [w_rows x w_cols] at w.slice(g * w_stride).
//   expert_gemm:    c_g (+)= a_g op(W_g), op(W) = W or W^T (trans_w)
//   expert_gemm_dw: W_g += a_g^T c_g   (the weight gradient; `w` is the gradient buffer, of a's type or fp32)
struct ExpertGemmArgs {
  Buffer a, w, c;
  Buffer offsets;  // int64 [groups + 1], on the device
  std::int64_t groups = 0, w_rows = 0, w_cols = 0, w_stride = 0;
  bool trans_w = false;
  bool accumulate = false;
};

// The largest calls a Kernels will see, so that a backend can size its scratch before the first step (a GPU
// backend allocates nothing inside a step): rows x width of a row-wise kernel (RMSNorm), batch x heads x seq
// of attention, experts and (sources x local experts) of the MoE kernels, the embedding table's rows.
struct KernelLimits {
  std::int64_t rows = 0, width = 0;
  std::int64_t vocab = 0;
  std::int64_t attention_rows = 0;
  std::int64_t experts = 0, moe_runs = 0;
};

class Kernels {
 public:
  explicit Kernels(Stream& stream) : stream_(stream) {}
  virtual ~Kernels() = default;
  Kernels(const Kernels&) = delete;
  Kernels& operator=(const Kernels&) = delete;

  Stream& stream() const { return stream_; }
  virtual std::string backend() const = 0;
  // The first error of any call (bad arguments or a failed launch); Ok while there is none.
  const Status& status() const { return status_; }
  // Sizes the backend's scratch for calls up to `limits` (call once, before the first step; a call beyond what
  // was prepared fails naming its kernel). The CPU backend needs nothing.
  virtual Status prepare(const KernelLimits& limits) {
    (void)limits;
    return Status::Ok();
  }

  // --- Memory ---------------------------------------------------------------------------------------------
  void fill(const Buffer& x, double value);
  void copy(const Buffer& src, const Buffer& dst);  // same type and count (device to device)
  void cast(const Buffer& src, const Buffer& dst);  // floating types, same count
  // Whole buffers between host and device memory, in stream order; the host side holds dst.bytes() /
  // src.bytes() bytes and stays valid until the stream reaches the copy (copy_to_host: read it after a
  // synchronisation).
  void copy_from_host(const void* src, const Buffer& dst);
  void copy_to_host(const Buffer& src, void* dst);

  // --- Element-wise, norms, the optimizer -----------------------------------------------------------------
  void scale(const Buffer& x, float alpha);        // x *= alpha
  void add(const Buffer& src, const Buffer& dst);  // dst += src (tensor types, same count)
  // acc[0] += sum(x^2) / replicas, the sum in fp64 (acc: fp64 [1]); `replicas` ranks hold the same x, so a
  // sum over ranks counts it once.
  void sum_squares(const Buffer& x, std::int64_t replicas, const Buffer& acc);
  // From the all-reduced squared gradient norm (fp32 [1]) of gradients scaled by 1 / inv_loss_scale:
  //   norm[0] (fp64) = sqrt(norm_sq) * inv_loss_scale,
  //   coef[0] (fp32) = min(1, max_norm / (norm + 1e-6)) * inv_loss_scale   (max_norm <= 0: no clipping).
  void clip_coefficient(const Buffer& norm_sq, double max_norm, double inv_loss_scale, const Buffer& norm,
                        const Buffer& coef);
  void adamw(const AdamWHyper& hyper, const std::vector<AdamWTensor>& tensors);

  // --- Matmuls ----------------------------------------------------------------------------------------------
  void matmul(const MatmulArgs& args);
  // The model's forms. y[m x n] (+)= x[m x k] W[k x n];  dx[m x k] (+)= dy[m x n] W^T;  dW[k x n] += x^T dy.
  void linear(const Buffer& x, const Buffer& w, const Buffer& y, std::int64_t m, std::int64_t k, std::int64_t n,
              bool accumulate = false);
  void linear_dx(const Buffer& dy, const Buffer& w, const Buffer& dx, std::int64_t m, std::int64_t k, std::int64_t n,
                 bool accumulate = false);
  void linear_dw(const Buffer& x, const Buffer& dy, const Buffer& dw, std::int64_t m, std::int64_t k, std::int64_t n);

  // --- Embedding: out[t] = table[ids[t]] (table [V x hidden]); backward dtable[ids[t]] += dout[t] -------------
  void embedding_forward(const Buffer& table, const Buffer& ids, const Buffer& out, std::int64_t hidden);
  void embedding_backward(const Buffer& dout, const Buffer& ids, const Buffer& dtable, std::int64_t hidden);

  // --- RMSNorm: y = x / sqrt(mean(x^2) + 1e-5) * w per row of h; rstd[row] (fp32) saved for backward --------
  static constexpr float kNormEps = 1e-5f;
  void rmsnorm_forward(const Buffer& x, const Buffer& w, const Buffer& y, const Buffer& rstd, std::int64_t rows,
                       std::int64_t h);
  // dx = (or +=, accumulate) dL/dx; dw += dL/dw.
  void rmsnorm_backward(const Buffer& x, const Buffer& w, const Buffer& rstd, const Buffer& dy, const Buffer& dx,
                        const Buffer& dw, std::int64_t rows, std::int64_t h, bool accumulate);

  // --- Rotary positions (rotate-half, HF LLaMA), theta 10000 -------------------------------------------------
  // cos/sin tables fp32 [seq x d/2]: angle(t, i) = t * 10000^(-2i/d).
  void rope_tables(const Buffer& cos, const Buffer& sin, std::int64_t seq, std::int64_t d);
  // In place on [rows x heads*d], position = row % seq: y[i] = x[i] cos - x[i+d/2] sin, y[i+d/2] = x[i+d/2]
  // cos + x[i] sin; the backward applies the transpose (the inverse rotation) to the gradient.
  void rope_forward(const Buffer& x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                    const Buffer& cos, const Buffer& sin);
  void rope_backward(const Buffer& dx, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                     const Buffer& cos, const Buffer& sin);

  // --- SwiGLU: act = silu(gate) * up on [rows x width]; backward writes dgate and dup ----------------------
  // row_limit (optional, int64 device scalar): only the first min(rows, row_limit[0]) rows (MoE capacities).
  void swiglu_forward(const Buffer& gate, const Buffer& up, const Buffer& act, std::int64_t rows, std::int64_t width,
                      const Buffer& row_limit = {});
  void swiglu_backward(const Buffer& gate, const Buffer& up, const Buffer& dact, const Buffer& dgate, const Buffer& dup,
                       std::int64_t rows, std::int64_t width, const Buffer& row_limit = {});

  // --- Row softmax (the router): p = softmax(x) per row of n (p may be x); dx = p * (dp - sum(p * dp)) ---------
  void softmax_rows(const Buffer& x, const Buffer& p, std::int64_t rows, std::int64_t n);
  void softmax_rows_backward(const Buffer& p, const Buffer& dp, const Buffer& dx, std::int64_t rows, std::int64_t n);

  // --- Causal attention with GQA ---------------------------------------------------------------------------
  virtual std::int64_t attention_reserve(const AttentionShape& shape) const = 0;
  void attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                         const Buffer& out, const Buffer& lse, const Buffer& reserve);
  // Writes (overwrites) dq, dk, dv (dk, dv summed over the query heads sharing a kv head).
  void attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                          const Buffer& out, const Buffer& dout, const Buffer& lse, const Buffer& reserve,
                          const Buffer& dq, const Buffer& dk, const Buffer& dv);

  // --- Softmax cross-entropy over logits [rows x vocab], targets int32 [rows] ---------------------------------
  virtual std::int64_t cross_entropy_reserve(std::int64_t rows, std::int64_t vocab) const = 0;
  // loss_sum[0] (fp64) += sum over rows of -log softmax(logits)[target].
  void cross_entropy_forward(const Buffer& logits, const Buffer& targets, const Buffer& reserve, const Buffer& loss_sum,
                             std::int64_t rows, std::int64_t vocab);
  // dlogits = scale * (softmax(logits) - onehot(target)); dlogits may be the logits buffer itself.
  void cross_entropy_backward(const Buffer& logits, const Buffer& targets, const Buffer& reserve, float scale,
                              const Buffer& dlogits, std::int64_t rows, std::int64_t vocab);

  // --- MoE routing (t tokens, E experts, top k; see runtime/model/model.h for the block) ------------------
  // The k largest probabilities of each row (descending; ties: lower index first) into selected (int32
  // [t x k]), their renormalised weights (fp32 [t x k]) and sum psum (fp32 [t]); expert_count (int64 [E]) =
  // rows routed to each expert.
  void moe_topk(const Buffer& probs, const Buffer& selected, const Buffer& weight, const Buffer& psum,
                const Buffer& expert_count, std::int64_t t, std::int64_t experts, std::int64_t k);
  // Switch Transformer's load-balancing loss: fraction[e] = expert_count[e] / (t k) (fp32 [E]) and
  // aux_sum[0] (fp64) += E * sum_e fraction[e] * mean_t probs[t][e].
  void moe_aux_loss(const Buffer& probs, const Buffer& expert_count, const Buffer& fraction, const Buffer& aux_sum,
                    std::int64_t t, std::int64_t experts, std::int64_t k);
  // Token permutation: rows (tensor [t*k x h]) = x[token] for every (token, slot), ordered by (expert, token,
  // slot); send_row (int64 [t x k]) = where (token, slot) went.
  void moe_permute(const Buffer& x, const Buffer& selected, const Buffer& expert_count, const Buffer& rows,
                   const Buffer& send_row, std::int64_t t, std::int64_t experts, std::int64_t k, std::int64_t h);
  // Its inverse, weighted: x[token] (+)= sum_slot weight[token][slot] * rows[send_row[token][slot]] (weight
  // fp32 [t x k], or empty for weights of 1).
  void moe_combine(const Buffer& rows, const Buffer& send_row, const Buffer& weight, const Buffer& x, std::int64_t t,
                   std::int64_t k, std::int64_t h, bool accumulate);
  // Backward of the weighted combine: grad_rows[send_row[token][slot]] = weight * dx[token] and dweight
  // (fp32 [t x k]) = <dx[token], rows[send_row[token][slot]]>.
  void moe_combine_backward(const Buffer& dx, const Buffer& rows, const Buffer& send_row, const Buffer& weight,
                            const Buffer& grad_rows, const Buffer& dweight, std::int64_t t, std::int64_t k,
                            std::int64_t h);
  // dL/dprobs (fp32 [t x E]) through the renormalised top-k weights and the aux loss:
  //   dp[e] = aux_coef * fraction[e] + (selected slots s only) (dweight[s] - sum_r dweight[r] weight[r]) / psum.
  void moe_router_backward(const Buffer& dweight, const Buffer& weight, const Buffer& selected, const Buffer& psum,
                           const Buffer& fraction, float aux_coef, const Buffer& dp, std::int64_t t,
                           std::int64_t experts, std::int64_t k);
  // Received rows (capacity [cap x h]) come from `sources` ranks, each sorted by its `local` experts with
  // counts (int64 [sources x local]): grouped = the same rows ordered by (local expert, source, arrival);
  // order (int64 [cap]) = grouped position -> received row; offsets (int64 [local + 1]) = each expert's first
  // grouped row (offsets[local] = the live rows).
  void moe_group(const Buffer& recv, const Buffer& counts, const Buffer& grouped, const Buffer& order,
                 const Buffer& offsets, std::int64_t sources, std::int64_t local, std::int64_t h);
  // out[order[p]] = grouped[p] for the live rows p < offsets[local] (rows of `width`).
  void moe_ungroup(const Buffer& grouped, const Buffer& order, const Buffer& offsets, const Buffer& out,
                   std::int64_t local, std::int64_t width);
  // out[j] = multiplier * sum_l counts[j][l] for j < n (int64; counts [n x local]): rows per rank -> elements.
  void sum_counts(const Buffer& counts, const Buffer& out, std::int64_t n, std::int64_t local, std::int64_t multiplier);
  void expert_gemm(const ExpertGemmArgs& args);
  void expert_gemm_dw(const ExpertGemmArgs& args);

 protected:
  // What a backend implements: the same operations, arguments already checked.
  virtual void do_fill(const Buffer& x, double value) = 0;
  virtual void do_copy(const Buffer& src, const Buffer& dst) = 0;
  virtual void do_cast(const Buffer& src, const Buffer& dst) = 0;
  virtual void do_copy_from_host(const void* src, const Buffer& dst) = 0;
  virtual void do_copy_to_host(const Buffer& src, void* dst) = 0;
  virtual void do_scale(const Buffer& x, float alpha) = 0;
  virtual void do_add(const Buffer& src, const Buffer& dst) = 0;
  virtual void do_sum_squares(const Buffer& x, std::int64_t replicas, const Buffer& acc) = 0;
  virtual void do_clip_coefficient(const Buffer& norm_sq, double max_norm, double inv_loss_scale, const Buffer& norm,
                                   const Buffer& coef) = 0;
  virtual void do_adamw(const AdamWHyper& hyper, const std::vector<AdamWTensor>& tensors) = 0;
  virtual void do_matmul(const MatmulArgs& args) = 0;
  virtual void do_embedding_forward(const Buffer& table, const Buffer& ids, const Buffer& out, std::int64_t hidden) = 0;
  virtual void do_embedding_backward(const Buffer& dout, const Buffer& ids, const Buffer& dtable,
                                     std::int64_t hidden) = 0;
  virtual void do_rmsnorm_forward(const Buffer& x, const Buffer& w, const Buffer& y, const Buffer& rstd,
                                  std::int64_t rows, std::int64_t h) = 0;
  virtual void do_rmsnorm_backward(const Buffer& x, const Buffer& w, const Buffer& rstd, const Buffer& dy,
                                   const Buffer& dx, const Buffer& dw, std::int64_t rows, std::int64_t h,
                                   bool accumulate) = 0;
  virtual void do_rope_tables(const Buffer& cos, const Buffer& sin, std::int64_t seq, std::int64_t d) = 0;
  virtual void do_rope(const Buffer& x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
                       const Buffer& cos, const Buffer& sin, bool inverse) = 0;
  virtual void do_swiglu_forward(const Buffer& gate, const Buffer& up, const Buffer& act, std::int64_t rows,
                                 std::int64_t width, const Buffer& row_limit) = 0;
  virtual void do_swiglu_backward(const Buffer& gate, const Buffer& up, const Buffer& dact, const Buffer& dgate,
                                  const Buffer& dup, std::int64_t rows, std::int64_t width,
                                  const Buffer& row_limit) = 0;
  virtual void do_softmax_rows(const Buffer& x, const Buffer& p, std::int64_t rows, std::int64_t n) = 0;
  virtual void do_softmax_rows_backward(const Buffer& p, const Buffer& dp, const Buffer& dx, std::int64_t rows,
                                        std::int64_t n) = 0;
  virtual void do_attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                                    const Buffer& out, const Buffer& lse, const Buffer& reserve) = 0;
  virtual void do_attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                                     const Buffer& out, const Buffer& dout, const Buffer& lse, const Buffer& reserve,
                                     const Buffer& dq, const Buffer& dk, const Buffer& dv) = 0;
  virtual void do_cross_entropy_forward(const Buffer& logits, const Buffer& targets, const Buffer& reserve,
                                        const Buffer& loss_sum, std::int64_t rows, std::int64_t vocab) = 0;
  virtual void do_cross_entropy_backward(const Buffer& logits, const Buffer& targets, const Buffer& reserve,
                                         float scale, const Buffer& dlogits, std::int64_t rows, std::int64_t vocab) = 0;
  virtual void do_moe_topk(const Buffer& probs, const Buffer& selected, const Buffer& weight, const Buffer& psum,
                           const Buffer& expert_count, std::int64_t t, std::int64_t experts, std::int64_t k) = 0;
  virtual void do_moe_aux_loss(const Buffer& probs, const Buffer& expert_count, const Buffer& fraction,
                               const Buffer& aux_sum, std::int64_t t, std::int64_t experts, std::int64_t k) = 0;
  virtual void do_moe_permute(const Buffer& x, const Buffer& selected, const Buffer& expert_count, const Buffer& rows,
                              const Buffer& send_row, std::int64_t t, std::int64_t experts, std::int64_t k,
                              std::int64_t h) = 0;
  virtual void do_moe_combine(const Buffer& rows, const Buffer& send_row, const Buffer& weight, const Buffer& x,
                              std::int64_t t, std::int64_t k, std::int64_t h, bool accumulate) = 0;
  virtual void do_moe_combine_backward(const Buffer& dx, const Buffer& rows, const Buffer& send_row,
                                       const Buffer& weight, const Buffer& grad_rows, const Buffer& dweight,
                                       std::int64_t t, std::int64_t k, std::int64_t h) = 0;
  virtual void do_moe_router_backward(const Buffer& dweight, const Buffer& weight, const Buffer& selected,
                                      const Buffer& psum, const Buffer& fraction, float aux_coef, const Buffer& dp,
                                      std::int64_t t, std::int64_t experts, std::int64_t k) = 0;
  virtual void do_moe_group(const Buffer& recv, const Buffer& counts, const Buffer& grouped, const Buffer& order,
                            const Buffer& offsets, std::int64_t sources, std::int64_t local, std::int64_t h) = 0;
  virtual void do_moe_ungroup(const Buffer& grouped, const Buffer& order, const Buffer& offsets, const Buffer& out,
                              std::int64_t local, std::int64_t width) = 0;
  virtual void do_sum_counts(const Buffer& counts, const Buffer& out, std::int64_t n, std::int64_t local,
                             std::int64_t multiplier) = 0;
  virtual void do_expert_gemm(const ExpertGemmArgs& args) = 0;
  virtual void do_expert_gemm_dw(const ExpertGemmArgs& args) = 0;

  // A backend reports a failure found while running (a failed launch, an out-of-range token id) here.
  void fail(Status status);

 private:
  // Runs `body` when no error is pending and every check passed; otherwise records the first error.
  bool ready() const { return status_.ok(); }
  bool check(bool ok, const char* kernel, const std::string& what);
  bool check_type(const Buffer& b, const char* kernel, const char* name, bool (*allowed)(ScalarType),
                  const char* expected);
  bool check_is(const Buffer& b, ScalarType type, const char* kernel, const char* name);
  bool check_count(const Buffer& b, std::int64_t at_least, const char* kernel, const char* name);
  bool check_matrix(const Buffer& b, std::int64_t rows, std::int64_t cols, std::int64_t ld, std::int64_t batch,
                    std::int64_t stride, const char* kernel, const char* name);

  Stream& stream_;
  Status status_;
};

}  // namespace hzp::runtime
