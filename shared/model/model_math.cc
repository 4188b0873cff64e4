// Model math per module: parameter counts, FLOPs, memory-bound bytes and saved activations of one
// micro-batch on one GPU. The derivation, the sources and what is simplified are in docs/model_math.md;
// the section names there match the functions here.
#include "shared/model/model_math.h"

#include <algorithm>

namespace hzp {

bool ModelSpec::is_moe_layer(int layer) const {
  return has_moe && std::binary_search(moe.layers.begin(), moe.layers.end(), layer);
}

const char* to_string(ModuleKind kind) {
  switch (kind) {
    case ModuleKind::kEmbedding:
      return "embedding";
    case ModuleKind::kAttention:
      return "attention";
    case ModuleKind::kMlp:
      return "mlp";
    case ModuleKind::kMoe:
      return "moe";
    case ModuleKind::kHead:
      return "head";
  }
  return "unknown";
}

namespace {

// ---------------------------------------------------------------------------------------------------------
// Parameters
// ---------------------------------------------------------------------------------------------------------

bool has_biases(const ModelSpec& m) {
  return m.family == ModelFamily::kGpt;
}

// RMSNorm has a weight only; LayerNorm a weight and a bias.
std::int64_t norm_params(const ModelSpec& m) {
  return has_biases(m) ? 2 * m.hidden : m.hidden;
}

std::int64_t linear_params(const ModelSpec& m, std::int64_t in, std::int64_t out) {
  return in * out + (has_biases(m) ? out : 0);
}

// One MLP (dense, or one expert) of the model's type, without its pre-norm.
std::int64_t mlp_params(const ModelSpec& m, std::int64_t width) {
  if (m.gated_mlp())
    return 2 * linear_params(m, m.hidden, width) + linear_params(m, width, m.hidden);  // gate, up, down
  return linear_params(m, m.hidden, width) + linear_params(m, width, m.hidden);
}

// Parameter tensors, as a framework that owns whole tensors counts them (a weight and a bias are two).
int norm_tensors(const ModelSpec& m) {
  return has_biases(m) ? 2 : 1;
}
int linear_tensors(const ModelSpec& m) {
  return has_biases(m) ? 2 : 1;
}
int mlp_tensors(const ModelSpec& m) {
  return m.mlp_matrices() * linear_tensors(m);
}
int large(std::int64_t elements) {
  return elements >= kLargeTensorElements ? 1 : 0;
}
// Weight matrices of one MLP (biases and norms are never large).
int mlp_large_tensors(const ModelSpec& m, std::int64_t width) {
  return m.mlp_matrices() * large(m.hidden * width);
}

std::int64_t embedding_params(const ModelSpec& m) {
  const std::int64_t positions = m.position == PositionEmbedding::kLearned ? m.max_positions * m.hidden : 0;
  return m.vocab * m.hidden + positions;
}

// Multi-head latent attention (scenario.h MlaSpec, DeepSeek-V2 §2.1; no biases): the query down-projection
// and its latent norm (or, without a query latent, one query projection), the joint key/value down-projection
// that also yields the shared rotary key, the key/value latent norm, the up-projection to every head's
// unrotated key and value, and the output projection from the value heads.
struct MlaParams {
  std::int64_t replicated = 0;  // down-projections and latent norms: whole on every tensor rank
  std::int64_t split = 0;       // the per-head projections, split by heads over tensor ranks
};
MlaParams mla_params(const ModelSpec& m) {
  const MlaSpec& a = m.mla;
  const std::int64_t heads = m.heads;
  MlaParams p;
  p.replicated = m.hidden * (a.kv_lora_rank + a.qk_rope_head_dim) + a.kv_lora_rank;
  p.split = a.kv_lora_rank * heads * (a.qk_nope_head_dim + a.v_head_dim) + heads * a.v_head_dim * m.hidden;
  if (a.q_lora_rank > 0) {
    p.replicated += m.hidden * a.q_lora_rank + a.q_lora_rank;
    p.split += a.q_lora_rank * heads * a.qk_head_dim();
  } else {
    p.split += m.hidden * heads * a.qk_head_dim();
  }
  return p;
}

std::int64_t attention_params(const ModelSpec& m) {
  if (m.has_mla) return norm_params(m) + mla_params(m).replicated + mla_params(m).split;
  const std::int64_t q_width = m.heads * m.head_dim();
  const std::int64_t kv_width = m.kv_heads * m.head_dim();
  return norm_params(m) + linear_params(m, m.hidden, q_width) + 2 * linear_params(m, m.hidden, kv_width) +
         linear_params(m, q_width, m.hidden);
}

std::int64_t dense_mlp_params(const ModelSpec& m) {
  return norm_params(m) + mlp_params(m, m.ffn_hidden);
}

// The router has no bias in either family (Mixtral, Switch; DeepSeek-V3's routing bias, one number per
// expert, is left out). Shared experts are one MLP of their summed width (scenario.h MoeSpec).
std::int64_t shared_expert_params(const ModelSpec& m) {
  return m.moe.shared_ffn_hidden > 0 ? mlp_params(m, m.moe.shared_ffn_hidden) : 0;
}
std::int64_t moe_params(const ModelSpec& m) {
  return norm_params(m) + m.hidden * m.moe.experts + m.moe.experts * mlp_params(m, m.moe.expert_ffn_hidden) +
         shared_expert_params(m);
}

// A tied head shares the embedding matrix, so it owns only the final norm.
std::int64_t head_params(const ModelSpec& m) {
  return norm_params(m) + (m.tied_embeddings ? 0 : m.vocab * m.hidden);
}

// ---------------------------------------------------------------------------------------------------------
// Costs
// ---------------------------------------------------------------------------------------------------------

// The scenario's sizes as doubles: FLOPs and bytes overflow int64 for long sequences and big batches.
struct Dims {
  Dims(const ModelSpec& m, const TrainingSpec& t, const ParallelSpec& par)
      : model(m),
        b(static_cast<double>(t.micro_batch)),
        s(static_cast<double>(t.seq_len)),
        s_local(s / par.context),
        ring_context(par.context > 1 && par.context_comm == ContextComm::kRing),
        tokens(b * s_local),
        h(static_cast<double>(m.hidden)),
        heads(m.heads),
        kv_heads(m.kv_heads),
        qk_head(static_cast<double>(m.qk_head_dim())),
        v_head(static_cast<double>(m.v_head_dim())),
        q_width(heads * qk_head),
        k_width(kv_heads * qk_head),
        v_width(kv_heads * v_head),
        o_width(heads * v_head),
        vocab(static_cast<double>(m.vocab)),
        e(t.precision == Precision::kFp32 ? 4.0 : 2.0),
        flash(t.flash_attention),
        pasa(t.attention == AttentionAlgorithm::kPasa),
        eager(t.kernels == KernelFusion::kEager),
        attention_dropout(t.attention_dropout > 0),
        hidden_dropout(t.hidden_dropout > 0),
        fp8(t.fp8),
        recompute(t.recompute),
        tensor(par.tensor),
        split(1.0 / par.tensor),
        outside(par.sequence_parallel ? 1.0 / par.tensor : 1.0) {}

  const ModelSpec& model;
  // Context parallelism: this GPU keeps s_local = s / context of each sequence's tokens (its queries, and
  // everything token-wise); attention's keys span the whole sequence s. Causal work is balanced by Megatron's
  // two-chunk split, so the attention core's share is s_local·s as well.
  double b, s, s_local;
  bool ring_context;  // ring attention: each kernel call sees s_local of the keys
  double tokens, h, heads, kv_heads;
  // Per-head widths of queries and keys, and of values (different under MLA), and the widths of Q, K, V and
  // the attention output (the output projection's input) over all heads.
  double qk_head, v_head, q_width, k_width, v_width, o_width;
  double vocab;
  double e;  // bytes per activation element
  bool flash;
  bool pasa;               // PASA's shifted keys (TrainingSpec::attention)
  bool eager;              // PyTorch eager's unfused norms, rotary embedding, gated activation and loss
  bool attention_dropout;  // only whether there is dropout changes the cost, not its probability
  bool hidden_dropout;
  bool fp8;                  // the linear layers' GEMMs in FP8 (TrainingSpec::fp8)
  double local_experts = 0;  // experts whose weights this GPU holds (experts / expert parallelism)
  Recompute recompute;
  // Tensor parallelism (docs/model_math.md "Tensor and sequence parallelism"): the share of one GPU in the
  // work inside the tensor-parallel region (matmuls, attention core, activation functions), and in the work
  // outside it (norms, residual adds, router, the tensors they save) — replicated unless sequence parallel.
  int tensor;
  double split;
  double outside;
  // Parameters per GPU: `replicated` (norms, router, learned positions) on every tensor rank, the rest split.
  std::int64_t per_gpu(std::int64_t total, std::int64_t replicated) const {
    return replicated + (total - replicated + tensor - 1) / tensor;
  }
};

// Forward and backward HBM bytes of one memory-bound kernel (read + write).
struct Traffic {
  double fwd = 0;
  double bwd = 0;
};

// A norm reads x and writes y; its backward reads x and dy and writes dx (the weight-gradient reduction
// happens in the same pass). The per-row statistics are a few bytes per token and are ignored.
//
// Eager (TrainingSpec::kernels), bytes per element as PyTorch runs torchtitan's RMSNorm (models/norms.py:
// `self._norm(x.float()).type_as(x) * self.weight`, `_norm(x) = x * torch.rsqrt(x.pow(2).mean(-1,
// keepdim=True) + eps)`), one kernel per operation, e bytes per activation element and 4 per fp32 one:
//   forward   x.float() e+4, pow 8, mean 4, x * rsqrt 8, type_as 4+e, * weight 2e            = 28 + 4e
//   backward  (autograd's formulas, in reverse) * weight: dx 2e and dweight = sum(dy * y) 4e; type_as e+4;
//             x * rsqrt: its dx 8 and drsqrt = sum(g * x) 16; mean's expanded gradient 4; pow's
//             grad * (2 * x.pow(1)) 28; the two gradients of x summed 12; x.float() 4+e  = 76 + 8e
// The row statistics (rsqrt, the eps add) are per row and ignored, as above.
Traffic norm_traffic(const Dims& d) {
  const double elements = d.tokens * d.h;
  if (d.eager) return {(28 + 4 * d.e) * elements, (76 + 8 * d.e) * elements};
  return {2 * elements * d.e, 3 * elements * d.e};
}

// Residual add reads two streams and writes one; in backward the block's input gradient is summed into the
// skip path's gradient, which is the same shape of traffic.
Traffic residual_traffic(const Dims& d) {
  return {3 * d.tokens * d.h * d.e, 3 * d.tokens * d.h * d.e};
}

// Hidden dropout after a block, fused into the residual add (Megatron's bias-dropout-add): forward also
// writes a 1-byte mask, backward reads it. The mask is kept for backward.
Traffic hidden_dropout_traffic(const Dims& d) {
  if (!d.hidden_dropout) return {};
  return {d.tokens * d.h, d.tokens * d.h};
}
double hidden_dropout_mask_bytes(const Dims& d) {
  return d.hidden_dropout ? d.tokens * d.h * d.outside : 0;
}

// SwiGLU reads gate and up and writes their product; backward reads both and dy, writes both gradients.
// GELU and squared ReLU read one and write one; backward reads x and dy, writes dx. Eager (torchtitan's
// `F.silu(self.w1(x)) * self.w3(x)`): silu 2e and the product 3e forward; backward the product's two
// gradients 3e each and silu's 3e. A single-operation activation is the same kernel either way.
Traffic activation_fn_traffic(const Dims& d, double elements) {
  if (d.model.gated_mlp() && d.eager) return {5 * elements * d.e, 9 * elements * d.e};
  if (d.model.gated_mlp()) return {3 * elements * d.e, 5 * elements * d.e};
  return {2 * elements * d.e, 3 * elements * d.e};
}

// `share`: this GPU's share of the kernel's work (Dims::split or Dims::outside).
void add_traffic(ModuleCost& cost, Traffic t, double share) {
  cost.fwd_mem_bytes += t.fwd * share;
  cost.bwd_mem_bytes += t.bwd * share;
}

// `rows` rows through a (k x n) matrix: 2·rows·k·n forward; backward computes both the input gradient and
// the weight gradient, 2x forward. `in_model_flops` is false for matmuls the MFU count (docs/model_math.md) leaves out.
void add_matmul(ModuleCost& cost, double share, double rows, double k, double n, bool in_model_flops = true) {
  const double fwd = 2 * rows * k * n * share;
  cost.fwd_flops += fwd;
  cost.bwd_flops += 2 * fwd;
  if (in_model_flops) cost.model_flops += 3 * fwd;
}

// The GEMM kernels of a matmul through `weights` k x n matrices (ModuleCost::fwd_gemms): one per weight
// forward, two backward (the input gradient and the weight gradient), each moving its operands once: forward
// reads rows x k and the weights and writes rows x n; backward reads and writes as much again per product.
// `share` is this GPU's part, as for the FLOPs (exact for the weights; the whole input or output of a tensor
// split is counted split too, which matters only where the weights dominate: few rows per expert).
void add_gemm_kernels(ModuleCost& cost, const Dims& d, double share, double rows, double k, double n,
                      double weights = 1) {
  const double bytes = (rows * k + weights * k * n + rows * n) * d.e * share;
  const int kernels = static_cast<int>(weights);
  cost.fwd_gemms += kernels;
  cost.bwd_gemms += 2 * kernels;
  cost.fwd_gemm_bytes += bytes;
  cost.bwd_gemm_bytes += 2 * bytes;
}

// A linear layer's matmul (QKV, attention output, MLP, experts): the GEMMs FP8 training runs in FP8
// (Transformer Engine's fp8_autocast covers TE's Linear modules; torchtitan's Float8Linear every nn.Linear
// but the output layer). The attention core, the router and the LM head go through add_matmul alone.
// FP8 GEMMs take FP8 operands, and Hopper's take them in one layout only, so each 16-bit operand is cast
// once into an FP8 copy and an FP8 transposed copy (Transformer Engine's cast_transpose): the input and the
// weight in forward, the output gradient in backward; read e bytes, write 2 per element. The weight is cast
// every micro-batch (torchtitan; Transformer Engine can cache it across micro-batches, not modelled).
// `weights`: how many k x n weights the rows go through (the experts a GPU holds; 1 for a dense layer).
void add_linear(ModuleCost& cost, const Dims& d, double share, double rows, double k, double n, double weights = 1) {
  add_matmul(cost, share, rows, k, n);
  add_gemm_kernels(cost, d, share, rows, k, n, weights);
  if (!d.fp8) return;
  const double fwd = 2 * rows * k * n * share;
  cost.fwd_fp8_flops += fwd;
  cost.bwd_fp8_flops += 2 * fwd;
  add_traffic(cost, {(rows * k + weights * k * n) * (d.e + 2), rows * n * (d.e + 2)}, share);
}

// Full recompute: the module's whole forward runs again before its backward.
void recompute_whole_forward(ModuleCost& cost) {
  cost.recompute_flops = cost.fwd_flops;
  cost.recompute_fp8_flops = cost.fwd_fp8_flops;
  cost.recompute_core_flops = cost.fwd_core_flops;
  cost.recompute_core_bytes = cost.fwd_core_bytes;
  cost.recompute_flash_flops = cost.fwd_flash_flops;
  cost.recompute_mem_bytes = cost.fwd_mem_bytes;
  cost.recompute_gemms = cost.fwd_gemms;
  cost.recompute_gemm_bytes = cost.fwd_gemm_bytes;
}

// Activations an MLP of the model's type saves after its input: SwiGLU keeps gate, up and their product
// (the down projection's input); GELU and squared ReLU keep their input and output.
double mlp_saved_bytes(const Dims& d, double rows, double width) {
  const double tensors = d.model.mlp_matrices();
  return tensors * rows * width * d.e;
}

ModuleCost embedding_cost(const Dims& d) {
  ModuleCost cost;
  cost.kind = ModuleKind::kEmbedding;
  // Vocabulary-parallel: each tensor rank holds V / T rows; learned positions are replicated.
  cost.params = d.per_gpu(embedding_params(d.model), embedding_params(d.model) - d.model.vocab * d.model.hidden);
  cost.tensors = d.model.position == PositionEmbedding::kLearned ? 2 : 1;
  cost.large_tensors =
      large(d.model.vocab * d.model.hidden) +
      (d.model.position == PositionEmbedding::kLearned ? large(d.model.max_positions * d.model.hidden) : 0);
  // Gather of token rows; backward scatter-adds dy into the gradient rows (read dy, read + write rows).
  add_traffic(cost, {2 * d.tokens * d.h * d.e, 3 * d.tokens * d.h * d.e}, d.outside);
  if (d.model.position == PositionEmbedding::kLearned) add_traffic(cost, residual_traffic(d), d.outside);
  // Backward needs only the token ids: a few bytes per token, ignored.
  cost.activation_bytes = 0;
  return cost;
}

// The attention core's work (QKᵀ, core.softmax, P·V) on `cost`, flash or unfused; what the activations need.
struct AttentionCore {
  double qk_flops = 0;       // QKᵀ's FLOPs
  double pv_flops = 0;       // P·V's (== QKᵀ's unless values are narrower than keys, as under MLA)
  double scores = 0;         // score elements: queries x keys x heads
  Traffic softmax;           // the unfused softmax (and attention dropout) pass
  double dropout_saved = 0;  // attention dropout's output and mask, kept for P·V's backward
};

AttentionCore add_attention_core(ModuleCost& cost, const Dims& d) {
  AttentionCore core;
  // Attention core as two batched matmuls per head: QKᵀ (s x d)·(d x s), then P·V (s x s)·(s x d).
  // In the model FLOPs in full although causal: the Megatron convention of the MFU numerator.
  const double head_rows = d.b * d.heads * d.s_local;  // this GPU's queries against all s keys
  core.qk_flops = 2 * head_rows * d.qk_head * d.s * d.split;
  core.pv_flops = 2 * head_rows * d.s * d.v_head * d.split;
  core.scores = d.b * d.heads * d.s_local * d.s;
  if (d.flash) {
    // A causal flash kernel skips the key blocks past each query block's: it executes half the products
    // (Megatron's two-chunk split keeps that half under context parallelism too). FlashAttention-2 never
    // writes P to HBM, so its backward recomputes QKᵀ tile by tile: hardware work, not model work. Attention
    // dropout happens inside the kernel (its backward regenerates the mask from the RNG state): no traffic,
    // nothing saved. The kernel's rate depends on its head dimension and on the keys one call sees: the
    // sequence, or a ring step's s / context under ring context parallelism.
    const double executed = (core.qk_flops + core.pv_flops) / 2;
    cost.model_flops += 3 * (core.qk_flops + core.pv_flops);
    cost.fwd_flash_flops = executed;
    cost.bwd_flash_flops = 2 * executed + core.qk_flops / 2;
    cost.fwd_flops += cost.fwd_flash_flops;
    cost.bwd_flops += cost.bwd_flash_flops;
    cost.flash_head_dim = static_cast<int>(d.qk_head);
    cost.flash_seq = d.ring_context ? d.s_local : d.s;
    if (d.pasa) {
      // PASA shifts every block of n = 128 keys once per forward, K' = M K with M = (I - beta/n 1 1^T) /
      // sqrt(d): an (n x n)·(n x head_dim) GEMM per block, 2·n·head_dim FLOPs per key row and kv head. Its
      // other work (each block's row mean of the scores, one more exponent per row and block) stays in
      // registers. Hardware work, not model work; the backward works from the recovered log-sum-exp and the
      // unshifted keys, as flash attention's does.
      constexpr double kPasaBlock = 128;
      const double key_rows = d.b * d.kv_heads * d.s;
      cost.fwd_flops += 2 * key_rows * kPasaBlock * d.qk_head * d.split;
    }
  } else {
    add_matmul(cost, d.split, head_rows, d.qk_head, d.s);
    add_matmul(cost, d.split, head_rows, d.s, d.v_head);
    // Unfused, the core is 2 batched GEMMs forward (QKᵀ writes the scores S, P·V reads P) and 4 backward
    // (dP = dO·Vᵀ writes dP, dV = Pᵀ·dO reads P, dQ = dS·K and dK = dSᵀ·Q read dS): each moves one s x s
    // matrix besides its s x d operands, for 2·s²·d FLOPs per head, i.e. e / (2d) bytes per FLOP and more — at or
    // above the ridge of an A100 (0.0077 at its table efficiencies) for d <= 128: memory-bound.
    const double keys = d.b * d.heads * d.s;             // K and V rows: every key, whatever the context split
    const double head_dim = (d.qk_head + d.v_head) / 2;  // Q and K feed one GEMM, V and O the other
    const double core_gemm_bytes = (core.scores + (head_rows + keys) * head_dim) * d.e * d.split;
    cost.fwd_core_flops = core.qk_flops + core.pv_flops;
    cost.fwd_core_bytes = 2 * core_gemm_bytes;
    cost.bwd_core_flops = 2 * (core.qk_flops + core.pv_flops);
    cost.bwd_core_bytes = 4 * core_gemm_bytes;
    // Unfused: scale + mask + softmax reads the scores and writes P; backward reads P and dP, writes dS.
    core.softmax = {2 * core.scores * d.e * d.split, 3 * core.scores * d.e * d.split};
    if (d.attention_dropout) {
      // A separate pass: reads P, writes the dropped P' and a 1-byte mask; backward reads dP' and the mask,
      // writes dP. P·V then reads P' (and keeps it) instead of P.
      core.softmax.fwd += core.scores * (2 * d.e + 1) * d.split;
      core.softmax.bwd += core.scores * (2 * d.e + 1) * d.split;
      core.dropout_saved = core.scores * (d.e + 1) * d.split;
    }
    add_traffic(cost, core.softmax, 1);
  }
  return core;
}

// What attention saves for backward, and what recomputation redoes (training.recompute).
void attention_activations(ModuleCost& cost, const Dims& d, const AttentionCore& core) {
  const double t = d.tokens;
  // Saved for backward with nothing recomputed (Korthikanti et al. §4.1): the norm input (= the layer input),
  // the QKV input, Q and K after rotation, V, the attention output (the projection input; flash also reads
  // it back), for the core either P (and the attention dropout's output and mask) or flash's logsumexp, and
  // the hidden dropout's mask. Tensor parallelism splits the core's tensors and Q, K, V, O but not the layer
  // input, the QKV input or the dropout mask (Korthikanti et al. §4.2.2); sequence parallelism those too.
  const double layer_input = t * d.h * d.e * d.outside;
  const double probs = d.flash ? 0 : core.scores * d.e * d.split;
  const double logsumexp = d.flash ? d.b * d.heads * d.s_local * 4 * d.split : 0;  // fp32, one per query row per head
  const double qkv_input = t * d.h * d.e * d.outside;
  const double q_k_v_o = t * (d.q_width + d.k_width + d.v_width + d.o_width) * d.e * d.split;
  // MLA's latents (scenario.h MlaSpec): the query latent and its normed copy (the up-projection's input), the
  // joint key/value down-projection's output (latent and shared rotary key) and the normed latent. The
  // down-projections are whole on every tensor rank (mla_projections), so are these.
  double latents = 0;
  if (d.model.has_mla) {
    const MlaSpec& a = d.model.mla;
    latents = t * static_cast<double>(2 * a.q_lora_rank + 2 * a.kv_lora_rank + a.qk_rope_head_dim) * d.e;
  }
  const double saved_all = layer_input + qkv_input + latents + q_k_v_o + probs + core.dropout_saved + logsumexp +
                           hidden_dropout_mask_bytes(d);
  switch (d.recompute) {
    case Recompute::kNone:
      cost.activation_bytes = saved_all;
      break;
    case Recompute::kSelective:
      // Drop the O(s²) probabilities (and dropout's output and mask) and redo QKᵀ + softmax (+ dropout) + PV
      // before backward. Flash keeps nothing quadratic and already recomputes inside its backward, so
      // selective costs it nothing.
      cost.activation_bytes = saved_all - probs - core.dropout_saved;
      if (!d.flash) {
        cost.recompute_flops = core.qk_flops + core.pv_flops;
        cost.recompute_mem_bytes = core.softmax.fwd;
        cost.recompute_core_flops = cost.fwd_core_flops;
        cost.recompute_core_bytes = cost.fwd_core_bytes;
      }
      break;
    case Recompute::kFull:
      // Only the layer input is checkpointed (attributed to this, the layer's first block); the whole
      // forward runs again before backward.
      cost.activation_bytes = layer_input;
      recompute_whole_forward(cost);
      break;
  }
}

// Grouped-query attention's projections before the core: Q, K and V in one GEMM, then rotary positions.
void gqa_projections(ModuleCost& cost, const Dims& d) {
  const ModelSpec& m = d.model;
  cost.params = d.per_gpu(attention_params(m), norm_params(m));
  cost.tensors = norm_tensors(m) + 4 * linear_tensors(m);
  {
    const std::int64_t q = m.heads * m.head_dim(), kv = m.kv_heads * m.head_dim();
    cost.large_tensors = 2 * large(m.hidden * q) + 2 * large(m.hidden * kv);
  }
  const double t = d.tokens;
  add_linear(cost, d, d.split, t, d.h, d.q_width + d.k_width + d.v_width);  // bias fused into the GEMM epilogue
  if (m.position == PositionEmbedding::kRope) {
    // Rotates Q and K in place; backward rotates their gradients back. Eager (torchtitan's apply_rotary_emb:
    // `view_as_complex(xq.float() ...) * freqs_cis`, then `.type_as(xq)`): the upcast e+4, the complex
    // product 8 and the cast back 4+e per element, and the same three passes backward.
    const double qk = t * (d.q_width + d.k_width);
    const double pass = d.eager ? 16 + 2 * d.e : 2 * d.e;
    add_traffic(cost, {pass * qk, pass * qk}, d.split);
  }
}

// Multi-head latent attention's projections before the core (mla_params). Tensor parallelism splits the
// up-projections by heads and keeps the down-projections and latent norms whole on every rank, which runs
// them on all of its tokens (Megatron-Core's MLA: "duplicated" down-projections).
void mla_projections(ModuleCost& cost, const Dims& d) {
  const ModelSpec& m = d.model;
  const MlaSpec& a = m.mla;
  const MlaParams p = mla_params(m);
  cost.params = norm_params(m) + p.replicated + (p.split + d.tensor - 1) / d.tensor;
  const bool q_latent = a.q_lora_rank > 0;
  // input norm; q_a, q_a_norm, q_b (or q); kv_a, kv_a_norm, kv_b; o
  cost.tensors = norm_tensors(m) + (q_latent ? 3 : 1) + 3 + 1;
  cost.large_tensors = large(m.hidden * (a.kv_lora_rank + a.qk_rope_head_dim)) +
                       large(a.kv_lora_rank * m.heads * (a.qk_nope_head_dim + a.v_head_dim)) +
                       large(m.heads * a.v_head_dim * m.hidden) +
                       (q_latent ? large(m.hidden * a.q_lora_rank) + large(a.q_lora_rank * m.heads * a.qk_head_dim())
                                 : large(m.hidden * m.heads * a.qk_head_dim()));
  const double t = d.tokens;
  const auto q_rank = static_cast<double>(a.q_lora_rank);
  const auto kv_rank = static_cast<double>(a.kv_lora_rank);
  const auto rope = static_cast<double>(a.qk_rope_head_dim);
  // Every tensor rank runs the down-projections, but the MFU numerator counts their FLOPs once: 1/T each.
  const auto duplicated = [&](double k, double n) {
    const double before = cost.model_flops;
    add_linear(cost, d, 1, t, k, n);
    cost.model_flops = before + (cost.model_flops - before) * d.split;
  };
  if (q_latent) {
    duplicated(d.h, q_rank);
    add_traffic(cost, {2 * t * q_rank * d.e, 3 * t * q_rank * d.e}, 1);  // the query latent's norm
    add_linear(cost, d, d.split, t, q_rank, d.q_width);
  } else {
    add_linear(cost, d, d.split, t, d.h, d.q_width);
  }
  duplicated(d.h, kv_rank + rope);
  add_traffic(cost, {2 * t * kv_rank * d.e, 3 * t * kv_rank * d.e}, 1);  // the key/value latent's norm
  add_linear(cost, d, d.split, t, kv_rank, d.heads * static_cast<double>(a.qk_nope_head_dim) + d.v_width);
  // Rotates every query head's rotary part and the one shared rotary key, then concatenates each head's key
  // (its unrotated part and the shared rotary part): a copy of K.
  const double rotated = t * (d.heads * rope * d.split + rope) * d.e;
  add_traffic(cost, {2 * rotated + 2 * t * d.k_width * d.e * d.split, 2 * rotated + 2 * t * d.k_width * d.e * d.split},
              1);
}

ModuleCost attention_cost(const Dims& d, int layer) {
  ModuleCost cost;
  cost.kind = ModuleKind::kAttention;
  cost.layer = layer;
  const double t = d.tokens;

  add_traffic(cost, norm_traffic(d), d.outside);
  if (d.model.has_mla) {
    mla_projections(cost, d);
  } else {
    gqa_projections(cost, d);
  }

  const AttentionCore core = add_attention_core(cost, d);
  add_linear(cost, d, d.split, t, d.o_width, d.h);  // output projection
  add_traffic(cost, residual_traffic(d), d.outside);
  add_traffic(cost, hidden_dropout_traffic(d), d.outside);
  attention_activations(cost, d, core);
  return cost;
}

ModuleCost dense_mlp_cost(const Dims& d, int layer) {
  ModuleCost cost;
  cost.kind = ModuleKind::kMlp;
  cost.layer = layer;
  cost.params = d.per_gpu(dense_mlp_params(d.model), norm_params(d.model));
  cost.tensors = norm_tensors(d.model) + mlp_tensors(d.model);
  cost.large_tensors = mlp_large_tensors(d.model, d.model.ffn_hidden);
  const double t = d.tokens;
  const double f = static_cast<double>(d.model.ffn_hidden);
  const bool swiglu = d.model.gated_mlp();

  add_traffic(cost, norm_traffic(d), d.outside);
  add_linear(cost, d, d.split, t, d.h, swiglu ? 2 * f : f);  // gate + up, or fc1
  add_traffic(cost, activation_fn_traffic(d, t * f), d.split);
  add_linear(cost, d, d.split, t, f, d.h);  // down, or fc2
  add_traffic(cost, residual_traffic(d), d.outside);
  add_traffic(cost, hidden_dropout_traffic(d), d.outside);

  // Norm input, norm output (the first matmul's input), the MLP's intermediates, the hidden dropout's mask.
  const double saved_all =
      2 * t * d.h * d.e * d.outside + mlp_saved_bytes(d, t, f) * d.split + hidden_dropout_mask_bytes(d);
  if (d.recompute == Recompute::kFull) {
    // The layer input saved by the attention block is all this layer keeps.
    cost.activation_bytes = 0;
    recompute_whole_forward(cost);
  } else {
    cost.activation_bytes = saved_all;  // selective recompute targets attention only
  }
  return cost;
}

ModuleCost moe_cost(const Dims& d, int layer) {
  ModuleCost cost;
  cost.kind = ModuleKind::kMoe;
  cost.layer = layer;
  cost.params = d.per_gpu(moe_params(d.model), norm_params(d.model) + d.model.hidden * d.model.moe.experts);
  const std::int64_t shared_f = d.model.moe.shared_ffn_hidden;
  cost.tensors = norm_tensors(d.model) + 1 + d.model.moe.experts * mlp_tensors(d.model) +
                 (shared_f > 0 ? mlp_tensors(d.model) : 0);
  cost.large_tensors = large(d.model.hidden * d.model.moe.experts) +
                       d.model.moe.experts * mlp_large_tensors(d.model, d.model.moe.expert_ffn_hidden) +
                       (shared_f > 0 ? mlp_large_tensors(d.model, shared_f) : 0);
  cost.expert_params = d.per_gpu(d.model.moe.experts * mlp_params(d.model, d.model.moe.expert_ffn_hidden), 0);
  const double t = d.tokens;
  const double experts = d.model.moe.experts;
  const double k = d.model.moe.top_k;
  const double f = static_cast<double>(d.model.moe.expert_ffn_hidden);
  const bool swiglu = d.model.gated_mlp();
  const double routed = t * k;  // token copies processed by experts

  add_traffic(cost, norm_traffic(d), d.outside);
  // Router: logits, then softmax + top-k in fp32 (read logits, write probabilities). Real work but outside
  // the MFU numerator of docs/model_math.md, so fwd/bwd FLOPs only.
  add_matmul(cost, d.outside, t, d.h, experts, /*in_model_flops=*/false);
  add_gemm_kernels(cost, d, d.outside, t, d.h, experts);
  add_traffic(cost, {2 * t * experts * 4, 3 * t * experts * 4}, d.outside);
  // Permute: each token is copied to its k experts' contiguous input buffers; backward moves the gradients
  // back the same way. (The all-to-all between GPUs is communication, scheduled elsewhere.)
  add_traffic(cost, {2 * routed * d.h * d.e, 2 * routed * d.h * d.e}, d.outside);

  // Each expert is the model's MLP; together they see t·k rows.
  add_linear(cost, d, d.split, routed, d.h, swiglu ? 2 * f : f, d.local_experts);
  add_traffic(cost, activation_fn_traffic(d, routed * f), d.split);
  add_linear(cost, d, d.split, routed, f, d.h, d.local_experts);

  // Shared experts: a dense MLP of every token, beside the routed ones (split by tensor parallelism like a
  // dense MLP, never by expert parallelism); its output is added in the combine.
  const double fs = static_cast<double>(shared_f);
  if (shared_f > 0) {
    add_linear(cost, d, d.split, t, d.h, swiglu ? 2 * fs : fs);
    add_traffic(cost, activation_fn_traffic(d, t * fs), d.split);
    add_linear(cost, d, d.split, t, fs, d.h);
    add_traffic(cost, {t * d.h * d.e, 0}, d.outside);  // read once more by the combine's sum
  }

  // Combine: gate-weighted sum of each token's k expert outputs. Backward reads dy and the expert outputs
  // (for the gate gradient) and writes the k output gradients.
  add_traffic(cost, {routed * d.h * d.e + t * d.h * d.e, t * d.h * d.e + 2 * routed * d.h * d.e}, d.outside);
  add_traffic(cost, residual_traffic(d), d.outside);
  add_traffic(cost, hidden_dropout_traffic(d), d.outside);

  // Norm input, norm output (router input), fp32 router probabilities, the permuted expert inputs, the
  // experts' intermediates, and their outputs (the combine's gate gradient needs them). Routing indices
  // are a few bytes per token and ignored.
  const double saved_all = (2 * t * d.h * d.e + t * experts * 4 + 2 * routed * d.h * d.e) * d.outside +
                           mlp_saved_bytes(d, routed, f) * d.split + mlp_saved_bytes(d, t, fs) * d.split +
                           hidden_dropout_mask_bytes(d);
  if (d.recompute == Recompute::kFull) {
    cost.activation_bytes = 0;
    recompute_whole_forward(cost);
  } else {
    cost.activation_bytes = saved_all;
  }
  return cost;
}

ModuleCost head_cost(const Dims& d) {
  ModuleCost cost;
  cost.kind = ModuleKind::kHead;
  cost.params = d.per_gpu(head_params(d.model), norm_params(d.model));  // vocabulary-parallel
  cost.tensors = norm_tensors(d.model) + (d.model.tied_embeddings ? 0 : 1);
  cost.large_tensors = d.model.tied_embeddings ? 0 : large(d.model.vocab * d.model.hidden);
  const double t = d.tokens;

  add_traffic(cost, norm_traffic(d), d.outside);
  add_matmul(cost, d.split, t, d.h, d.vocab);
  add_gemm_kernels(cost, d, d.split, t, d.h, d.vocab);
  // Cross-entropy in fp32 over t x V logits: forward reads them and writes log-probabilities; backward reads
  // those and writes the logit gradients. Eager (torchtitan's `cross_entropy(pred.flatten(0, 1).float(),
  // ...)`): the upcast e+4, then log-softmax reads its input three times (maximum, sum, output) and writes
  // once, 16; backward nll_loss's dense gradient 4, log-softmax's 16 and the cast back 4+e.
  const double logits = t * d.vocab;
  if (d.eager)
    add_traffic(cost, {(20 + d.e) * logits, (24 + d.e) * logits}, d.split);
  else
    add_traffic(cost, {8 * logits, 8 * logits}, d.split);

  // Final-norm input and the logits matmul input. The head is never checkpointed; its fp32 logits live only
  // from the loss to the head's backward and are counted in ModelCost::transient_bytes.
  cost.activation_bytes = 2 * t * d.h * d.e * d.outside;
  return cost;
}

ModuleCost mlp_or_moe_cost(const Dims& d, int layer) {
  return d.model.is_moe_layer(layer) ? moe_cost(d, layer) : dense_mlp_cost(d, layer);
}

}  // namespace

std::int64_t parameter_count(const ModelSpec& model) {
  std::int64_t params = embedding_params(model) + head_params(model);
  for (int layer = 0; layer < model.layers; ++layer) {
    params += attention_params(model) + (model.is_moe_layer(layer) ? moe_params(model) : dense_mlp_params(model));
  }
  return params;
}

ModelCost model_cost(const ModelSpec& model, const TrainingSpec& training, const ParallelSpec& parallel,
                     int expert_parallel) {
  Dims d(model, training, parallel);
  d.local_experts = model.has_moe ? std::max(1.0, static_cast<double>(model.moe.experts) / expert_parallel) : 0;
  ModelCost out;
  out.modules.push_back(embedding_cost(d));
  for (int layer = 0; layer < model.layers; ++layer) {
    out.modules.push_back(attention_cost(d, layer));
    out.modules.push_back(mlp_or_moe_cost(d, layer));
  }
  out.modules.push_back(head_cost(d));

  for (const ModuleCost& m : out.modules) {
    out.params += m.params;
    out.model_flops += m.model_flops;
    out.activation_bytes += m.activation_bytes;
  }

  // Scratch that exists only while one module runs backward: the fp32 logits between loss and head
  // backward; under full recompute, one layer's rebuilt activations (all but the checkpointed input);
  // under selective recompute without flash, one layer's rebuilt probabilities.
  double transient = d.tokens * d.vocab * 4 * d.split;
  if (training.recompute != Recompute::kNone) {
    TrainingSpec no_recompute = training;
    no_recompute.recompute = Recompute::kNone;
    const Dims full_set(model, no_recompute, parallel);
    for (int layer = 0; layer < model.layers; ++layer) {
      const double attention_all = attention_cost(full_set, layer).activation_bytes;
      const double rebuilt =
          training.recompute == Recompute::kFull
              ? attention_all + mlp_or_moe_cost(full_set, layer).activation_bytes - d.tokens * d.h * d.e
              : attention_all - attention_cost(d, layer).activation_bytes;
      transient = std::max(transient, rebuilt);
    }
  }
  out.transient_bytes = transient;
  return out;
}

ModelCost scenario_cost(const Scenario& scenario) {
  return model_cost(scenario.model, scenario.training, scenario.policy.parallel, scenario.policy.expert_parallel);
}

double model_flops_formula(const ModelSpec& model, std::int64_t sequences, std::int64_t seq_len) {
  const double big_b = static_cast<double>(sequences);
  const double s = static_cast<double>(seq_len);
  const double layers = model.layers;
  const double h = static_cast<double>(model.hidden);
  const double n_h = model.heads;
  const double n_kv = model.kv_heads;
  const double d_head = static_cast<double>(model.head_dim());
  const double d_qk = static_cast<double>(model.qk_head_dim());
  const double d_v = static_cast<double>(model.v_head_dim());
  const double vocab = static_cast<double>(model.vocab);
  // The closed form writes (3/2) for SwiGLU's three matrices; GELU's or squared ReLU's two give (2/2), so the
  // closed form also holds for two-matrix MLPs.
  const double matrices = model.mlp_matrices();

  // (f/h)·topk·(matrices/2) averaged over layers: dense layers use (ffn_hidden, 1), MoE layers
  // (expert_ffn_hidden, top_k).
  double mlp_term = 0;
  for (int layer = 0; layer < model.layers; ++layer) {
    const bool moe = model.is_moe_layer(layer);
    const double f = static_cast<double>(moe ? model.moe.expert_ffn_hidden : model.ffn_hidden);
    const double topk = moe ? model.moe.top_k : 1;
    mlp_term += (f / h) * topk * (matrices / 2);
    if (moe) mlp_term += (static_cast<double>(model.moe.shared_ffn_hidden) / h) * (matrices / 2);
  }
  if (model.layers > 0) mlp_term /= layers;

  double attention_term = (1 + n_kv / n_h + s / h) * (n_h * d_head / h);
  if (model.has_mla) {
    // Per token and layer, 6x the projections' weights (fwd 2, bwd 4 FLOPs per weight) plus the core's 6·s·n_h·(d_qk
    // + d_v), over the 12·h² the bracket is in units of.
    const MlaSpec& a = model.mla;
    const double q_rank = static_cast<double>(a.q_lora_rank), kv_rank = static_cast<double>(a.kv_lora_rank);
    const double rope = static_cast<double>(a.qk_rope_head_dim), nope = static_cast<double>(a.qk_nope_head_dim);
    const double q_weights = q_rank > 0 ? h * q_rank + q_rank * n_h * d_qk : h * n_h * d_qk;
    const double weights = q_weights + h * (kv_rank + rope) + kv_rank * n_h * (nope + d_v) + n_h * d_v * h;
    attention_term = (6 * weights + 6 * s * n_h * (d_qk + d_v)) / (12 * h * h);
  }
  return 12 * big_b * s * layers * h * h * (attention_term + mlp_term + vocab / (2 * layers * h));
}

}  // namespace hzp
