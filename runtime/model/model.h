// The models the runtime trains: a LLaMA-style decoder (token embedding, RMSNorm, causal attention with
// rotary positions and grouped-query heads, SwiGLU MLP, untied output head) and its MoE variant (top-k
// softmax router, E SwiGLU experts, load-balancing auxiliary loss), in fp32, bf16 or fp16.
//
// The model never mentions sharding, nor a backend: it calls the kernel interface (runtime/device/kernels.h)
// on device buffers. Each module reads its parameters from one flat buffer laid out as its *_layout() says
// (the runtime gathers that buffer before the module runs) and accumulates (+=) its parameter gradients into
// a flat buffer of the same layout. The per-module parameter counts equal the core's (shared/model/model_math.h)
// for the llama family, so the executor's buffers match the core's memory model.
//
// Types: parameters and activations are ModelConfig::act (fp32, bf16 or fp16), parameter gradients
// ModelConfig::grad (the activation type, or fp32 when gradients are kept in fp32); statistics are fp32.
//
// Activations are x[T x h] with T = batch * seq tokens (sequence-major: token t of sequence b is row b * seq
// + t). Blocks update x in place (residual): forward x <- x + f(x); backward takes dL/d(x out) in dx and
// leaves dL/d(x in) there. Each block object owns the activations it saves for backward ("activations" in
// the memory pool); they are allocated once, so one object serves one layer for every micro-batch (forward
// of a micro-batch, then its backward, then the next micro-batch). Backward scratch is one Workspace shared
// by the dense blocks, which run one at a time on the compute stream.
//
// Every call returns the kernels' status: Ok, or the first kernel error.
//
// Conventions (the PyTorch reference tools/torch_reference.py implements the same):
//   matrices are [in x out] row-major and applied as y = x W;
//   RMSNorm y = x / sqrt(mean(x^2) + 1e-5) * w;
//   rotary: rotate-half (HF LLaMA) on q and k, theta 10000, position t within its sequence;
//   attention: causal softmax(q k^T / sqrt(d_head)) v per head; query head i reads kv head i / (heads /
//   kv_heads) (kv_heads == heads is multi-head attention);
//   SwiGLU: down( silu(x Wg) * (x Wu) );
//   router: p = softmax(x_norm Wr) over E; the top-k experts by p (ties: lower index), weights = their p
//   renormalised to sum 1 (Mixtral); aux loss = E * sum_e f_e * P_e with f_e = fraction of the T*k
//   assignments that went to e and P_e = mean over tokens of p_e (Switch Transformer), computed over the
//   micro-batch's tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/kernels.h"
#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp::runtime {

struct ModelConfig {
  std::int64_t vocab = 256;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;  // 0 = heads
  std::int64_t ffn = 0;       // dense MLP width
  int layers = 0;
  std::vector<bool> moe_layer;  // size layers
  std::int64_t experts = 0;     // E (0 when no MoE layer)
  std::int64_t top_k = 0;
  std::int64_t expert_ffn = 0;
  double aux_loss_coef = 0.01;
  ScalarType act = ScalarType::kFp32;                            // parameters and activations
  ScalarType grad = ScalarType::kFp32;                           // parameter gradients
  AttentionAlgorithm attention = AttentionAlgorithm::kStandard;  // training.attention
  std::int64_t head_dim() const { return hidden / heads; }
  std::int64_t kv() const { return kv_heads > 0 ? kv_heads : heads; }
  std::int64_t kv_width() const { return kv() * head_dim(); }
};

// The runtime supports the llama family with rotary positions and an untied head; anything else is an error
// naming the offending field (e.g. "model.family: the runtime trains llama models, not gpt"). The types come
// from training.precision and policy.comm.grad_reduce_in_fp32.
Result<ModelConfig> model_config(const ModelSpec& model);
Result<ModelConfig> model_config(const Scenario& scenario);

// One tensor inside a module's flat parameter buffer: rows x cols elements at `offset` (cols = 1 for vectors).
struct TensorInfo {
  std::string name;
  std::int64_t offset = 0;
  std::int64_t rows = 0;
  std::int64_t cols = 1;
  bool decay = false;  // weight decay applies (matrices yes, norm weights no)
  std::int64_t size() const { return rows * cols; }
};
using Layout = std::vector<TensorInfo>;
std::int64_t layout_size(const Layout& layout);

Layout embedding_layout(const ModelConfig& c);                    // wte [V x h]
Layout attention_layout(const ModelConfig& c);                    // norm [h], wq [h x h], wk, wv [h x kv*d],
                                                                  // wo [h x h]
Layout mlp_layout(const ModelConfig& c);                          // norm [h], w_gate, w_up [h x f], w_down [f x h]
Layout moe_router_layout(const ModelConfig& c);                   // norm [h], router [h x E]
Layout experts_layout(const ModelConfig& c, std::int64_t count);  // per expert, consecutively: gate, up
                                                                  // [h x fe], down [fe x h]
Layout head_layout(const ModelConfig& c);                         // norm [h], w_out [h x V]

// Deterministic initialisation on the host, independent of sharding: the values depend only on (seed,
// tensor_id, index inside the layout). Norm weights 1; matrices N(0, 0.02), the residual-output ones (wo,
// w_down) scaled by 1/sqrt(2 * layers). Use a distinct tensor_id per module (e.g. unit * 8 + module) and,
// for experts, one per global expert so that expert e has the same weights whichever rank holds it.
// (For experts that means one call per expert with experts_layout(c, 1), writing at that expert's offset in
// the local buffer: the values depend on the index inside the layout passed.)
void init_parameters(const ModelConfig& c, const Layout& layout, std::uint64_t seed, std::uint64_t tensor_id,
                     float* out);

// Backward scratch of the dense blocks (attention, MLP, head), shared because they run one at a time: each
// block says what it needs when it is made, then allocate() takes the largest need from the pool.
class Workspace {
 public:
  void need(std::int64_t elements) { need_ = std::max(need_, elements); }
  Status allocate(MemoryPool& pool, ScalarType type);
  // Consecutive pieces of the scratch: take(n) after take(m) starts at m. reset() before each use.
  void reset() { used_ = 0; }
  Buffer take(std::int64_t n);

 private:
  std::int64_t need_ = 0, used_ = 0;
  Buffer buffer_;
};

// Per-micro-batch inputs and fp64 accumulators shared by the modules: token ids and targets (int32 [T]),
// the sum of token cross-entropies and of MoE aux losses (fp64 [1] each; the caller zeroes them).
struct Batch {
  Buffer ids, targets;
  Buffer loss_sum, aux_sum;
};

class Embedding {
 public:
  explicit Embedding(const ModelConfig& c) : c_(c) {}
  Status forward(Kernels& k, const Buffer& params, const Buffer& ids, const Buffer& x);     // x = wte[ids]
  Status backward(Kernels& k, const Buffer& dx, const Buffer& ids, const Buffer& dparams);  // dwte += scatter
 private:
  ModelConfig c_;
};

class AttentionBlock {
 public:
  static Result<std::unique_ptr<AttentionBlock>> create(const ModelConfig& c, std::int64_t batch, std::int64_t seq,
                                                        const Kernels& k, MemoryPool& pool, Workspace& ws);
  Status forward(Kernels& k, const Buffer& params, const Buffer& x);
  Status backward(Kernels& k, const Buffer& params, const Buffer& dx, const Buffer& dparams);

 private:
  AttentionBlock() = default;
  ModelConfig c_;
  AttentionShape shape_;
  std::int64_t t_ = 0;
  bool tables_ready_ = false;
  // Saved by forward: the block input, norm statistics and output, rotated q and k, v, the attention output
  // (the wo input), its log-sum-exp and the backend's reserve.
  Buffer x_in_, rstd_, xn_, q_, k_, v_, attn_, lse_, reserve_;
  Buffer cos_, sin_;
  Workspace* ws_ = nullptr;
};

class MlpBlock {
 public:
  static Result<std::unique_ptr<MlpBlock>> create(const ModelConfig& c, std::int64_t batch, std::int64_t seq,
                                                  MemoryPool& pool, Workspace& ws);
  Status forward(Kernels& k, const Buffer& params, const Buffer& x);
  Status backward(Kernels& k, const Buffer& params, const Buffer& dx, const Buffer& dparams);

 private:
  MlpBlock() = default;
  ModelConfig c_;
  std::int64_t t_ = 0;
  Buffer x_in_, rstd_, xn_, gate_, up_, act_;  // saved by forward
  Workspace* ws_ = nullptr;
};

// The output head and the loss. forward adds the SUM of the micro-batch's token cross-entropies (nats) to
// batch.loss_sum; backward seeds dL/dlogits = scale * (softmax - onehot) (scale = loss scale / tokens of the
// whole global batch), writes (overwrites) dL/dx and accumulates the head's parameter gradients.
class Head {
 public:
  static Result<std::unique_ptr<Head>> create(const ModelConfig& c, std::int64_t tokens, const Kernels& k,
                                              MemoryPool& pool, Workspace& ws);
  Status forward(Kernels& k, const Buffer& params, const Buffer& x, const Batch& batch);
  Status backward(Kernels& k, const Buffer& params, float scale, const Buffer& dx, const Buffer& dparams);

 private:
  Head() = default;
  ModelConfig c_;
  std::int64_t t_ = 0;
  Buffer x_in_, rstd_, xn_, logits_, reserve_, targets_;  // saved by forward (logits doubles as dlogits)
  Workspace* ws_ = nullptr;
};

// MoE block x <- x + sum_k w_k * expert_k(norm(x)), in stages so that expert parallelism can move tokens
// between them. With `ep` ranks holding E/ep experts each (rank j holds experts [j*E/ep, (j+1)*E/ep)), the
// routed rows are ordered by global expert, so the rows for rank j are contiguous and sorted by its local
// experts.
//
// Forward:  route_forward      norm, router, top-k, aux loss; send_rows() = routed rows (h each), and
//                              expert_count() = rows per global expert = [ep x local] rows per (rank, expert)
//           -- exchange: the counts (all-to-all) into recv_count(), rows per rank into send_elems() /
//              recv_elems() (count_elements), then send_rows() -> recv_rows() (all-to-all-v)
//           experts_forward    on the holder: out_rows() = expert(recv_rows()), in received order
//           -- exchange: out_rows() -> returned() (all-to-all-v with the counts swapped)
//           combine_forward    x += sum_k w_k * returned()
// Backward: combine_backward   send_rows() = dL/d(expert output) per routed row, in send order
//           -- exchange: send_rows() -> recv_rows()
//           experts_backward   on the holder: out_rows() = dL/d(expert input), dexperts +=
//           -- exchange: out_rows() -> returned_grad()
//           route_backward     from returned_grad(): dx += dL/dx through the norm and the router (incl. the
//                              aux loss, weighted by aux_grad_scale), drouter +=
// aux_grad_scale is dL/d(aux loss of this micro-batch): aux_loss_coef, times whatever averaging over
// micro-batches the caller applies. With ep == 1 forward()/backward() run the stages back to back (the rows
// stay where they are). The local expert buffers hold E/ep experts in experts_layout(c, E/ep) order.
// Buffers sized by routing (recv_rows, out_rows) are capacities: every rank may send all its tokens here.
class MoeBlock {
 public:
  static Result<std::unique_ptr<MoeBlock>> create(const ModelConfig& c, std::int64_t batch, std::int64_t seq, int ep,
                                                  MemoryPool& pool);
  Status forward(Kernels& k, const Buffer& router, const Buffer& experts, const Buffer& x, const Buffer& aux_sum);
  Status backward(Kernels& k, const Buffer& router, const Buffer& experts, float aux_grad_scale, const Buffer& dx,
                  const Buffer& drouter, const Buffer& dexperts);

  Status route_forward(Kernels& k, const Buffer& router, const Buffer& x, const Buffer& aux_sum);
  // send_elems() / recv_elems() = elements per rank of the row exchanges, from expert_count() / recv_count().
  Status count_elements(Kernels& k);
  Status experts_forward(Kernels& k, const Buffer& experts);
  Status combine_forward(Kernels& k, const Buffer& x);
  Status combine_backward(Kernels& k, const Buffer& dx);
  Status experts_backward(Kernels& k, const Buffer& experts, const Buffer& dexperts);
  Status route_backward(Kernels& k, const Buffer& router, float aux_grad_scale, const Buffer& dx,
                        const Buffer& drouter);

  const Buffer& expert_count() const { return expert_count_; }    // int64 [E] = [ep x local]
  const Buffer& recv_count() const { return recv_count_; }        // int64 [ep x local]
  const Buffer& send_elems() const { return send_elems_; }        // int64 [ep]
  const Buffer& recv_elems() const { return recv_elems_; }        // int64 [ep]
  const Buffer& send_rows() const { return send_rows_; }          // [t*k x h]
  const Buffer& recv_rows() const { return recv_rows_; }          // capacity [ep*t*min(k, local) x h]
  const Buffer& out_rows() const { return out_rows_; }            // capacity, as recv_rows
  const Buffer& returned() const { return returned_; }            // [t*k x h], saved for backward
  const Buffer& returned_grad() const { return returned_grad_; }  // [t*k x h]

 private:
  MoeBlock() = default;

  ModelConfig c_;
  std::int64_t t_ = 0, ep_ = 1, local_ = 0, capacity_ = 0;
  // Route stage (this rank's tokens), saved by route_forward.
  Buffer x_in_, rstd_, xn_, logits_, probs_, selected_, weight_, psum_, send_row_, fraction_;
  Buffer expert_count_, recv_count_, send_elems_, recv_elems_;
  Buffer send_rows_, returned_, returned_grad_, dweight_, dxn_, dp_;
  // Expert stage (rows received from every rank), saved by experts_forward: grouped inputs and the SwiGLU
  // intermediates, the grouping, and scratch.
  Buffer recv_rows_, out_rows_, xe_, gate_, up_, act_, order_, offsets_;
  Buffer ye_, dact_, dgate_, dup_;
};

}  // namespace hzp::runtime
