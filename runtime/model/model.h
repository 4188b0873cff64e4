// The models the runtime trains: a LLaMA-style decoder (token embedding, RMSNorm, causal multi-head
// attention with rotary positions, SwiGLU MLP, untied output head) and its MoE variant (top-k softmax
// router, E SwiGLU experts, load-balancing auxiliary loss). fp32 on the CPU, matmuls through OpenBLAS.
//
// The model never mentions sharding. Each module reads its parameters from one flat fp32 buffer laid out
// as its *_layout() says (the runtime gathers that buffer before the module runs) and accumulates (+=) its
// parameter gradients into a flat buffer of the same layout. The per-module parameter counts equal the
// core's (shared/model_math.h) for the llama family, so the executor's buffers match the core's memory model.
//
// Activations are x[T x h] row-major with T = batch * seq tokens (sequence-major: token t of sequence b is
// row b * seq + t). Blocks update x in place (residual): forward x <- x + f(x); backward takes dL/d(x out)
// in dx and leaves dL/d(x in) there. Each block object owns the activations it saves for backward; they
// are allocated once in its constructor, so one object serves one layer for every micro-batch (forward of
// a micro-batch, then its backward, then the next micro-batch).
//
// Conventions (the PyTorch reference tools/torch_reference.py implements the same):
//   matrices are [in x out] row-major and applied as y = x W;
//   RMSNorm y = x / sqrt(mean(x^2) + 1e-5) * w;
//   rotary: rotate-half (HF LLaMA) on q and k, theta 10000, position t within its sequence;
//   attention: causal softmax(q k^T / sqrt(d_head)) v per head; kv_heads == heads;
//   SwiGLU: down( silu(x Wg) * (x Wu) );
//   router: p = softmax(x_norm Wr) over E; the top-k experts by p (ties: lower index), weights = their p
//   renormalised to sum 1 (Mixtral); aux loss = E * sum_e f_e * P_e with f_e = fraction of the T*k
//   assignments that went to e and P_e = mean over tokens of p_e (Switch Transformer), computed over the
//   micro-batch's tokens.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/scenario.h"
#include "shared/status.h"

namespace hzp::runtime {

struct ModelConfig {
  std::int64_t vocab = 256;
  std::int64_t hidden = 0;
  std::int64_t heads = 0;
  std::int64_t ffn = 0;  // dense MLP width
  int layers = 0;
  std::vector<bool> moe_layer;  // size layers
  std::int64_t experts = 0;     // E (0 when no MoE layer)
  std::int64_t top_k = 0;
  std::int64_t expert_ffn = 0;
  double aux_loss_coef = 0.01;
  std::int64_t head_dim() const { return hidden / heads; }
};

// The runtime supports the llama family with rotary positions, untied head and kv_heads == heads; anything
// else is an error naming the offending field (e.g. "model.family: the runtime trains llama models, not gpt").
Result<ModelConfig> model_config(const ModelSpec& model);

// One tensor inside a module's flat parameter buffer: rows x cols floats at `offset` (cols = 1 for vectors).
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
Layout attention_layout(const ModelConfig& c);                    // norm [h], wq, wk, wv [h x h], wo [h x h]
Layout mlp_layout(const ModelConfig& c);                          // norm [h], w_gate, w_up [h x f], w_down [f x h]
Layout moe_router_layout(const ModelConfig& c);                   // norm [h], router [h x E]
Layout experts_layout(const ModelConfig& c, std::int64_t count);  // per expert, consecutively: gate, up
                                                                  // [h x fe], down [fe x h]
Layout head_layout(const ModelConfig& c);                         // norm [h], w_out [h x V]

// Deterministic initialisation, independent of sharding: the values depend only on (seed, tensor_id, index
// inside the layout). Norm weights 1; matrices N(0, 0.02), the residual-output ones (wo, w_down) scaled by
// 1/sqrt(2 * layers). Use a distinct tensor_id per module (e.g. unit * 8 + module) and, for experts, one per
// global expert so that expert e has the same weights whichever rank holds it.
// (For experts that means one call per expert with experts_layout(c, 1), writing at that expert's offset in
// the local buffer: the values depend on the index inside the layout passed.)
void init_parameters(const ModelConfig& c, const Layout& layout, std::uint64_t seed, std::uint64_t tensor_id,
                     float* out);

class Embedding {
 public:
  Embedding(const ModelConfig& c, std::int64_t tokens);
  void forward(const float* params, const std::int32_t* ids, float* x);     // x = wte[ids]
  void backward(const float* dx, const std::int32_t* ids, float* dparams);  // dwte += scatter
 private:
  ModelConfig c_;
  std::int64_t tokens_;
};

class AttentionBlock {
 public:
  AttentionBlock(const ModelConfig& c, std::int64_t batch, std::int64_t seq);
  ~AttentionBlock();
  AttentionBlock(const AttentionBlock&) = delete;
  AttentionBlock& operator=(const AttentionBlock&) = delete;
  void forward(const float* params, float* x);
  void backward(const float* params, float* dx, float* dparams);

 private:
  struct Impl;
  Impl* impl_;
};

class MlpBlock {
 public:
  MlpBlock(const ModelConfig& c, std::int64_t batch, std::int64_t seq);
  ~MlpBlock();
  MlpBlock(const MlpBlock&) = delete;
  MlpBlock& operator=(const MlpBlock&) = delete;
  void forward(const float* params, float* x);
  void backward(const float* params, float* dx, float* dparams);

 private:
  struct Impl;
  Impl* impl_;
};

// The output head and the loss. forward returns the SUM of token cross-entropies (nats) of the micro-batch;
// backward seeds dL/dlogits = scale * (softmax - onehot) (scale = 1 / tokens of the whole global batch),
// writes (overwrites) dL/dx and accumulates the head's parameter gradients.
class Head {
 public:
  Head(const ModelConfig& c, std::int64_t tokens);
  ~Head();
  Head(const Head&) = delete;
  Head& operator=(const Head&) = delete;
  double forward(const float* params, const float* x, const std::int32_t* targets);
  void backward(const float* params, float scale, float* dx, float* dparams);

 private:
  struct Impl;
  Impl* impl_;
};

// MoE block x <- x + sum_k w_k * expert_k(norm(x)), in three stages so that expert parallelism can move
// tokens between stages (all-to-all). With `ep` ranks holding E/ep experts each (rank j holds experts
// [j*E/ep, (j+1)*E/ep)), the routed rows are grouped by the rank that holds their expert.
//
// A routed row is h + 1 floats: the normed token, then the expert's index local to its holder (as a float).
// Forward:  route_forward(router, x, send, counts)      rows to send, counts[j] floats for rank j
//           experts_forward(experts, recv, out)          on the holder: out row i = expert(recv row i), h floats
//           combine_forward(returned, x)                 returned = the out rows sent back, in send order
// Backward: combine_backward(dx, send_grad, counts)      dL/d(expert output) per routed row (h floats each),
//                                                        in send order, counts[j] floats for rank j
//           experts_backward(experts, recv_grad, out_grad, dexperts)  on the holder: recv_grad in the order
//                                                        of its experts_forward rows; out_grad = dL/d(input
//                                                        row), h floats per row; dexperts += ...
//           route_backward(router, returned_grad, aux_grad_scale, dx, drouter)  returned_grad in send order;
//                                                        dx += dL/dx through the norm and the router (incl.
//                                                        the aux loss, weighted by aux_grad_scale)
// aux_grad_scale is dL/d(aux_loss()): the loss is taken to contain aux_grad_scale * aux_loss() of this
// micro-batch (aux_loss_coef, times whatever averaging over micro-batches the caller applies).
// With ep == 1 forward()/backward() run the stages back to back. The local expert buffers hold E/ep experts
// in experts_layout(c, E/ep) order.
class MoeBlock {
 public:
  MoeBlock(const ModelConfig& c, std::int64_t batch, std::int64_t seq, int ep = 1);
  ~MoeBlock();
  MoeBlock(const MoeBlock&) = delete;
  MoeBlock& operator=(const MoeBlock&) = delete;
  void forward(const float* router, const float* experts, float* x);
  void backward(const float* router, const float* experts, float aux_grad_scale, float* dx, float* drouter,
                float* dexperts);

  void route_forward(const float* router, const float* x, std::vector<float>& send, std::vector<std::int64_t>& counts);
  void experts_forward(const float* experts, const std::vector<float>& recv, std::vector<float>& out);
  void combine_forward(const std::vector<float>& returned, float* x);
  void combine_backward(const float* dx, std::vector<float>& send_grad, std::vector<std::int64_t>& counts);
  void experts_backward(const float* experts, const std::vector<float>& recv_grad, std::vector<float>& out_grad,
                        float* dexperts);
  void route_backward(const float* router, const std::vector<float>& returned_grad, float aux_grad_scale, float* dx,
                      float* drouter);
  double aux_loss() const;  // of the last route_forward (without the coefficient)

 private:
  struct Impl;
  Impl* impl_;
};

}  // namespace hzp::runtime
