// The LLaMA-style dense and MoE models of the runtime (model.h): configuration checks, parameter layouts,
// deterministic initialisation, and each module's forward and backward on the fp32 kernels (kernels.h).
#include "runtime/model/model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <numbers>
#include <string>

#include "runtime/model/kernels.h"

namespace hzp::runtime {

// ---------------------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------------------

namespace {

constexpr std::int64_t kByteVocab = 256;

Status invalid(const std::string& path, const std::string& what) {
  return Status::InvalidInput(path + ": " + what);
}

}  // namespace

Result<ModelConfig> model_config(const ModelSpec& m) {
  if (m.family != ModelFamily::kLlama) return invalid("model.family", "the runtime trains llama models, not gpt");
  if (m.position != PositionEmbedding::kRope) {
    const char* name = m.position == PositionEmbedding::kLearned ? "learned" : "alibi";
    return invalid("model.position", std::string("the runtime supports rotary positions (rope) only, not ") + name);
  }
  if (m.tied_embeddings)
    return invalid("model.tied_embeddings", "the runtime needs an untied output head (tied_embeddings false)");
  if (m.layers < 1) return invalid("model.layers", "must be at least 1, got " + std::to_string(m.layers));
  if (m.hidden < 1) return invalid("model.hidden", "must be at least 1, got " + std::to_string(m.hidden));
  if (m.heads < 1) return invalid("model.heads", "must be at least 1, got " + std::to_string(m.heads));
  if (m.kv_heads != m.heads)
    return invalid("model.kv_heads", "the runtime supports multi-head attention only (kv_heads == heads = " +
                                         std::to_string(m.heads) + "), not " + std::to_string(m.kv_heads));
  if (m.hidden % m.heads != 0)
    return invalid("model.heads",
                   "must divide hidden (" + std::to_string(m.hidden) + "), got " + std::to_string(m.heads));
  if (m.head_dim() % 2 != 0)
    return invalid("model.heads",
                   "rotary positions need an even head dimension, hidden / heads = " + std::to_string(m.head_dim()));
  if (m.vocab != kByteVocab)
    return invalid("model.vocab",
                   "the runtime's byte-level tokenizer has 256 tokens, the model says " + std::to_string(m.vocab));

  ModelConfig c;
  c.vocab = m.vocab;
  c.hidden = m.hidden;
  c.heads = m.heads;
  c.ffn = m.ffn_hidden;
  c.layers = m.layers;
  c.moe_layer.resize(static_cast<std::size_t>(m.layers));
  bool any_dense = false;
  bool any_moe = false;
  for (int l = 0; l < m.layers; ++l) {
    c.moe_layer[static_cast<std::size_t>(l)] = m.is_moe_layer(l);
    (m.is_moe_layer(l) ? any_moe : any_dense) = true;
  }
  if (any_dense && m.ffn_hidden < 1)
    return invalid("model.ffn_hidden", "must be at least 1, got " + std::to_string(m.ffn_hidden));
  if (any_moe) {
    if (m.moe.experts < 1)
      return invalid("model.moe.experts", "must be at least 1, got " + std::to_string(m.moe.experts));
    if (m.moe.top_k < 1 || m.moe.top_k > m.moe.experts)
      return invalid("model.moe.top_k", "must be in [1, experts = " + std::to_string(m.moe.experts) + "], got " +
                                            std::to_string(m.moe.top_k));
    if (m.moe.expert_ffn_hidden < 1)
      return invalid("model.moe.expert_ffn_hidden",
                     "must be at least 1, got " + std::to_string(m.moe.expert_ffn_hidden));
    c.experts = m.moe.experts;
    c.top_k = m.moe.top_k;
    c.expert_ffn = m.moe.expert_ffn_hidden;
  }
  return c;
}

// ---------------------------------------------------------------------------------------------------------
// Layouts
// ---------------------------------------------------------------------------------------------------------

namespace {

// Appends tensors one after another; norms are vectors without weight decay, matrices decay.
class LayoutBuilder {
 public:
  LayoutBuilder& norm(const std::string& name, std::int64_t size) { return add(name, size, 1, false); }
  LayoutBuilder& matrix(const std::string& name, std::int64_t rows, std::int64_t cols) {
    return add(name, rows, cols, true);
  }
  Layout done() { return std::move(layout_); }

 private:
  LayoutBuilder& add(const std::string& name, std::int64_t rows, std::int64_t cols, bool decay) {
    layout_.push_back(TensorInfo{name, offset_, rows, cols, decay});
    offset_ += rows * cols;
    return *this;
  }
  Layout layout_;
  std::int64_t offset_ = 0;
};

// Offsets of one expert's matrices inside an experts buffer (experts_layout order).
struct ExpertOffsets {
  std::int64_t gate, up, down;
};
ExpertOffsets expert_offsets(std::int64_t hidden, std::int64_t expert_ffn, std::int64_t expert) {
  const std::int64_t m = hidden * expert_ffn;
  return {expert * 3 * m, expert * 3 * m + m, expert * 3 * m + 2 * m};
}

}  // namespace

std::int64_t layout_size(const Layout& layout) {
  std::int64_t size = 0;
  for (const TensorInfo& t : layout) size = std::max(size, t.offset + t.size());
  return size;
}

Layout embedding_layout(const ModelConfig& c) {
  return LayoutBuilder().matrix("wte", c.vocab, c.hidden).done();
}

Layout attention_layout(const ModelConfig& c) {
  const std::int64_t h = c.hidden;
  return LayoutBuilder()
      .norm("norm", h)
      .matrix("wq", h, h)
      .matrix("wk", h, h)
      .matrix("wv", h, h)
      .matrix("wo", h, h)
      .done();
}

Layout mlp_layout(const ModelConfig& c) {
  return LayoutBuilder()
      .norm("norm", c.hidden)
      .matrix("w_gate", c.hidden, c.ffn)
      .matrix("w_up", c.hidden, c.ffn)
      .matrix("w_down", c.ffn, c.hidden)
      .done();
}

Layout moe_router_layout(const ModelConfig& c) {
  return LayoutBuilder().norm("norm", c.hidden).matrix("router", c.hidden, c.experts).done();
}

Layout experts_layout(const ModelConfig& c, std::int64_t count) {
  LayoutBuilder b;
  for (std::int64_t e = 0; e < count; ++e) {
    const std::string prefix = "expert" + std::to_string(e) + ".";
    b.matrix(prefix + "w_gate", c.hidden, c.expert_ffn)
        .matrix(prefix + "w_up", c.hidden, c.expert_ffn)
        .matrix(prefix + "w_down", c.expert_ffn, c.hidden);
  }
  return b.done();
}

Layout head_layout(const ModelConfig& c) {
  return LayoutBuilder().norm("norm", c.hidden).matrix("w_out", c.hidden, c.vocab).done();
}

// ---------------------------------------------------------------------------------------------------------
// Initialisation
// ---------------------------------------------------------------------------------------------------------

namespace {

// splitmix64's finaliser: a bijective mix, so distinct (seed, tensor, index, stream) give unrelated bits.
std::uint64_t mix(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in (0, 1] from the counter (seed, tensor_id, index, stream).
double uniform(std::uint64_t seed, std::uint64_t tensor_id, std::uint64_t index, std::uint64_t stream) {
  const std::uint64_t bits = mix(mix(mix(seed) ^ tensor_id) ^ (2 * index + stream));
  return (static_cast<double>(bits >> 11) + 1.0) * 0x1.0p-53;
}

// Standard normal by Box-Muller from two counter-based uniforms: element `index` alone decides its value.
double normal(std::uint64_t seed, std::uint64_t tensor_id, std::uint64_t index) {
  const double u1 = uniform(seed, tensor_id, index, 0);
  const double u2 = uniform(seed, tensor_id, index, 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

void init_parameters(const ModelConfig& c, const Layout& layout, std::uint64_t seed, std::uint64_t tensor_id,
                     float* out) {
  constexpr double kStd = 0.02;
  const double residual_scale = 1.0 / std::sqrt(2.0 * c.layers);
  for (const TensorInfo& t : layout) {
    float* p = out + t.offset;
    if (!t.decay) {  // norm weights
      for (std::int64_t i = 0; i < t.size(); ++i) p[i] = 1.0f;
      continue;
    }
    const bool residual_out = t.name == "wo" || ends_with(t.name, "w_down");
    const double std = residual_out ? kStd * residual_scale : kStd;
    for (std::int64_t i = 0; i < t.size(); ++i)
      p[i] = static_cast<float>(std * normal(seed, tensor_id, static_cast<std::uint64_t>(t.offset + i)));
  }
}

// ---------------------------------------------------------------------------------------------------------
// Embedding
// ---------------------------------------------------------------------------------------------------------

Embedding::Embedding(const ModelConfig& c, std::int64_t tokens) : c_(c), tokens_(tokens) {}

void Embedding::forward(const float* params, const std::int32_t* ids, float* x) {
  const std::int64_t h = c_.hidden;
  for (std::int64_t t = 0; t < tokens_; ++t) {
    assert(ids[t] >= 0 && ids[t] < c_.vocab);
    std::memcpy(x + t * h, params + static_cast<std::int64_t>(ids[t]) * h, sizeof(float) * h);
  }
}

void Embedding::backward(const float* dx, const std::int32_t* ids, float* dparams) {
  const std::int64_t h = c_.hidden;
  for (std::int64_t t = 0; t < tokens_; ++t) {
    float* row = dparams + static_cast<std::int64_t>(ids[t]) * h;
    for (std::int64_t i = 0; i < h; ++i) row[i] += dx[t * h + i];
  }
}

// ---------------------------------------------------------------------------------------------------------
// Attention block: x <- x + wo(attention(rope(norm(x) wq), rope(norm(x) wk), norm(x) wv))
// ---------------------------------------------------------------------------------------------------------

struct AttentionBlock::Impl {
  Impl(const ModelConfig& c, std::int64_t batch, std::int64_t seq)
      : b(batch), s(seq), t(batch * seq), h(c.hidden), heads(c.heads), d(c.head_dim()) {
    const auto th = static_cast<std::size_t>(t * h);
    for (auto* buf : {&x_in, &xn, &q, &k, &v, &attn, &dattn, &dq, &dk, &dv, &dxn}) buf->resize(th);
    rstd.resize(static_cast<std::size_t>(t));
    probs.resize(static_cast<std::size_t>(b * heads * s * s));
    scratch.resize(static_cast<std::size_t>(s * s));
    cos_table.resize(static_cast<std::size_t>(s * d / 2));
    sin_table.resize(cos_table.size());
    kernels::rope_tables(s, d, cos_table.data(), sin_table.data());
  }

  std::int64_t b, s, t, h, heads, d;
  // Saved by forward: the block input, norm statistics and output, rotated q and k, v, P and the
  // attention output (the wo input).
  std::vector<float> x_in, rstd, xn, q, k, v, probs, attn;
  // Backward scratch.
  std::vector<float> dattn, dq, dk, dv, dxn, scratch;
  std::vector<float> cos_table, sin_table;
};

AttentionBlock::AttentionBlock(const ModelConfig& c, std::int64_t batch, std::int64_t seq)
    : impl_(new Impl(c, batch, seq)) {}
AttentionBlock::~AttentionBlock() {
  delete impl_;
}

namespace {
// The tensors of attention_layout() inside one flat buffer (parameters or their gradients).
template <typename T>
struct AttentionTensors {
  AttentionTensors(T* base, std::int64_t h)
      : norm(base), wq(base + h), wk(wq + h * h), wv(wk + h * h), wo(wv + h * h) {}
  T *norm, *wq, *wk, *wv, *wo;
};
}  // namespace

void AttentionBlock::forward(const float* params, float* x) {
  Impl& m = *impl_;
  const std::int64_t h = m.h;
  const auto [norm, wq, wk, wv, wo] = AttentionTensors<const float>(params, h);

  std::memcpy(m.x_in.data(), x, sizeof(float) * m.t * h);
  kernels::rmsnorm_forward(x, norm, m.xn.data(), m.rstd.data(), m.t, h);
  kernels::matmul(m.xn.data(), wq, m.q.data(), m.t, h, h);
  kernels::matmul(m.xn.data(), wk, m.k.data(), m.t, h, h);
  kernels::matmul(m.xn.data(), wv, m.v.data(), m.t, h, h);
  kernels::rope_forward(m.q.data(), m.t, m.s, m.heads, m.d, m.cos_table.data(), m.sin_table.data());
  kernels::rope_forward(m.k.data(), m.t, m.s, m.heads, m.d, m.cos_table.data(), m.sin_table.data());
  kernels::attention_forward(m.q.data(), m.k.data(), m.v.data(), m.probs.data(), m.attn.data(), m.b, m.s, m.heads, m.d);
  kernels::matmul(m.attn.data(), wo, x, m.t, h, h, /*accumulate=*/true);  // residual
}

void AttentionBlock::backward(const float* params, float* dx, float* dparams) {
  Impl& m = *impl_;
  const std::int64_t h = m.h;
  const auto [norm, wq, wk, wv, wo] = AttentionTensors<const float>(params, h);
  const auto [dnorm, dwq, dwk, dwv, dwo] = AttentionTensors<float>(dparams, h);

  // dx holds dL/dy; the residual passes it through unchanged, the branch adds its part at the end.
  kernels::matmul_dw(m.attn.data(), dx, dwo, m.t, h, h);
  kernels::matmul_dx(dx, wo, m.dattn.data(), m.t, h, h);
  kernels::attention_backward(m.q.data(), m.k.data(), m.v.data(), m.probs.data(), m.dattn.data(), m.dq.data(),
                              m.dk.data(), m.dv.data(), m.scratch.data(), m.b, m.s, m.heads, m.d);
  kernels::rope_backward(m.dq.data(), m.t, m.s, m.heads, m.d, m.cos_table.data(), m.sin_table.data());
  kernels::rope_backward(m.dk.data(), m.t, m.s, m.heads, m.d, m.cos_table.data(), m.sin_table.data());
  kernels::matmul_dw(m.xn.data(), m.dq.data(), dwq, m.t, h, h);
  kernels::matmul_dw(m.xn.data(), m.dk.data(), dwk, m.t, h, h);
  kernels::matmul_dw(m.xn.data(), m.dv.data(), dwv, m.t, h, h);
  kernels::matmul_dx(m.dq.data(), wq, m.dxn.data(), m.t, h, h);
  kernels::matmul_dx(m.dk.data(), wk, m.dxn.data(), m.t, h, h, /*accumulate=*/true);
  kernels::matmul_dx(m.dv.data(), wv, m.dxn.data(), m.t, h, h, /*accumulate=*/true);
  kernels::rmsnorm_backward(m.x_in.data(), norm, m.rstd.data(), m.dxn.data(), dx, dnorm, m.t, h, /*accumulate=*/true);
}

// ---------------------------------------------------------------------------------------------------------
// SwiGLU MLP on rows (shared by the dense block and each expert)
// ---------------------------------------------------------------------------------------------------------

namespace {

// Pointers to one SwiGLU MLP's matrices: gate, up [h x f], down [f x h].
struct SwiGlu {
  const float* gate;
  const float* up;
  const float* down;
};
struct SwiGluGrad {
  float* gate;
  float* up;
  float* down;
};

// y[rows x h] = down(silu(x gate) * (x up)); gate, up and act [rows x f] are kept for backward.
void swiglu_mlp_forward(SwiGlu w, const float* x, float* gate, float* up, float* act, float* y, std::int64_t rows,
                        std::int64_t h, std::int64_t f, bool accumulate) {
  kernels::matmul(x, w.gate, gate, rows, h, f);
  kernels::matmul(x, w.up, up, rows, h, f);
  kernels::swiglu_forward(gate, up, act, rows * f);
  kernels::matmul(act, w.down, y, rows, f, h, accumulate);
}

// dx[rows x h] = dL/dx (overwritten); parameter gradients accumulate. dact, dgate, dup: [rows x f] scratch.
void swiglu_mlp_backward(SwiGlu w, SwiGluGrad dw, const float* x, const float* gate, const float* up, const float* act,
                         const float* dy, float* dact, float* dgate, float* dup, float* dx, std::int64_t rows,
                         std::int64_t h, std::int64_t f) {
  kernels::matmul_dw(act, dy, dw.down, rows, f, h);
  kernels::matmul_dx(dy, w.down, dact, rows, f, h);
  kernels::swiglu_backward(gate, up, dact, dgate, dup, rows * f);
  kernels::matmul_dw(x, dgate, dw.gate, rows, h, f);
  kernels::matmul_dw(x, dup, dw.up, rows, h, f);
  kernels::matmul_dx(dgate, w.gate, dx, rows, h, f);
  kernels::matmul_dx(dup, w.up, dx, rows, h, f, /*accumulate=*/true);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Dense MLP block: x <- x + swiglu(norm(x))
// ---------------------------------------------------------------------------------------------------------

struct MlpBlock::Impl {
  Impl(const ModelConfig& c, std::int64_t batch, std::int64_t seq) : t(batch * seq), h(c.hidden), f(c.ffn) {
    for (auto* v : {&x_in, &xn, &dxn}) v->resize(static_cast<std::size_t>(t * h));
    for (auto* v : {&gate, &up, &act, &dact, &dgate, &dup}) v->resize(static_cast<std::size_t>(t * f));
    rstd.resize(static_cast<std::size_t>(t));
  }
  std::int64_t t, h, f;
  std::vector<float> x_in, rstd, xn, gate, up, act;  // saved by forward
  std::vector<float> dxn, dact, dgate, dup;          // backward scratch
};

MlpBlock::MlpBlock(const ModelConfig& c, std::int64_t batch, std::int64_t seq) : impl_(new Impl(c, batch, seq)) {}
MlpBlock::~MlpBlock() {
  delete impl_;
}

void MlpBlock::forward(const float* params, float* x) {
  Impl& m = *impl_;
  const float* norm = params;
  const SwiGlu w{norm + m.h, norm + m.h + m.h * m.f, norm + m.h + 2 * m.h * m.f};
  std::memcpy(m.x_in.data(), x, sizeof(float) * m.t * m.h);
  kernels::rmsnorm_forward(x, norm, m.xn.data(), m.rstd.data(), m.t, m.h);
  swiglu_mlp_forward(w, m.xn.data(), m.gate.data(), m.up.data(), m.act.data(), x, m.t, m.h, m.f,
                     /*accumulate=*/true);  // residual
}

void MlpBlock::backward(const float* params, float* dx, float* dparams) {
  Impl& m = *impl_;
  const float* norm = params;
  const SwiGlu w{norm + m.h, norm + m.h + m.h * m.f, norm + m.h + 2 * m.h * m.f};
  float* dnorm = dparams;
  const SwiGluGrad dw{dnorm + m.h, dnorm + m.h + m.h * m.f, dnorm + m.h + 2 * m.h * m.f};
  swiglu_mlp_backward(w, dw, m.xn.data(), m.gate.data(), m.up.data(), m.act.data(), dx, m.dact.data(), m.dgate.data(),
                      m.dup.data(), m.dxn.data(), m.t, m.h, m.f);
  kernels::rmsnorm_backward(m.x_in.data(), norm, m.rstd.data(), m.dxn.data(), dx, dnorm, m.t, m.h, /*accumulate=*/true);
}

// ---------------------------------------------------------------------------------------------------------
// Head: logits = norm(x) w_out, loss = sum of token cross-entropies
// ---------------------------------------------------------------------------------------------------------

struct Head::Impl {
  Impl(const ModelConfig& c, std::int64_t tokens) : t(tokens), h(c.hidden), v(c.vocab) {
    for (auto* b : {&x_in, &xn, &dxn}) b->resize(static_cast<std::size_t>(t * h));
    for (auto* b : {&logits, &probs}) b->resize(static_cast<std::size_t>(t * v));
    rstd.resize(static_cast<std::size_t>(t));
    targets.resize(static_cast<std::size_t>(t));
  }
  std::int64_t t, h, v;
  std::vector<float> x_in, rstd, xn, probs;  // saved by forward
  std::vector<std::int32_t> targets;
  std::vector<float> logits, dxn;  // scratch; logits doubles as dL/dlogits in backward
};

Head::Head(const ModelConfig& c, std::int64_t tokens) : impl_(new Impl(c, tokens)) {}
Head::~Head() {
  delete impl_;
}

double Head::forward(const float* params, const float* x, const std::int32_t* targets) {
  Impl& m = *impl_;
  const float* norm = params;
  const float* w_out = norm + m.h;
  std::memcpy(m.x_in.data(), x, sizeof(float) * m.t * m.h);
  std::memcpy(m.targets.data(), targets, sizeof(std::int32_t) * m.t);
  kernels::rmsnorm_forward(x, norm, m.xn.data(), m.rstd.data(), m.t, m.h);
  kernels::matmul(m.xn.data(), w_out, m.logits.data(), m.t, m.h, m.v);
  return kernels::cross_entropy_forward(m.logits.data(), m.targets.data(), m.probs.data(), m.t, m.v);
}

void Head::backward(const float* params, float scale, float* dx, float* dparams) {
  Impl& m = *impl_;
  const float* norm = params;
  const float* w_out = norm + m.h;
  float* dnorm = dparams;
  float* dw_out = dnorm + m.h;
  float* dlogits = m.logits.data();
  kernels::cross_entropy_backward(m.probs.data(), m.targets.data(), scale, dlogits, m.t, m.v);
  kernels::matmul_dw(m.xn.data(), dlogits, dw_out, m.t, m.h, m.v);
  kernels::matmul_dx(dlogits, w_out, m.dxn.data(), m.t, m.h, m.v);
  kernels::rmsnorm_backward(m.x_in.data(), norm, m.rstd.data(), m.dxn.data(), dx, dnorm, m.t, m.h,
                            /*accumulate=*/false);
}

// ---------------------------------------------------------------------------------------------------------
// MoE block
// ---------------------------------------------------------------------------------------------------------
//
// Routed rows are ordered by global expert, then token, then slot: the rows for rank j are then contiguous
// (rank j holds a contiguous range of experts), and send_row[t * k + s] remembers where the routed copy
// (token t, slot s) went, which is all combine and route need to map returned rows back.
//
// The holder sorts the rows it receives (possibly from several ranks) by local expert so that each expert
// runs as one matmul over its rows; `order` maps that grouped position back to the received row.

struct MoeBlock::Impl {
  Impl(const ModelConfig& c, std::int64_t batch, std::int64_t seq, int ep_ranks)
      : t(batch * seq),
        h(c.hidden),
        e(c.experts),
        top(c.top_k),
        f(c.expert_ffn),
        ep(ep_ranks),
        local(c.experts / ep_ranks) {
    assert(ep >= 1 && e % ep == 0);
    const auto th = static_cast<std::size_t>(t * h);
    const auto te = static_cast<std::size_t>(t * e);
    const auto tk = static_cast<std::size_t>(t * top);
    for (auto* v : {&x_in, &xn, &dxn}) v->resize(th);
    rstd.resize(static_cast<std::size_t>(t));
    for (auto* v : {&probs, &dp, &dlogits}) v->resize(te);
    selected.resize(tk);
    weight.resize(tk);
    dweight.resize(tk);
    send_row.resize(tk);
    psum.resize(static_cast<std::size_t>(t));
    fraction.resize(static_cast<std::size_t>(e));
    expert_rows.resize(static_cast<std::size_t>(e));
    returned.resize(tk * static_cast<std::size_t>(h));
    local_begin.resize(static_cast<std::size_t>(local + 1));
    local_next.resize(static_cast<std::size_t>(local));

    // Worst case at a holder: every rank sends each of its t tokens to min(top, local) of this rank's experts
    // (a token's experts are distinct).
    const auto rows = static_cast<std::size_t>(ep * t * std::min<std::int64_t>(top, local));
    order.reserve(rows);
    for (auto* v : {&xe, &ye, &dxe}) v->reserve(rows * static_cast<std::size_t>(h));
    for (auto* v : {&gate, &up, &act, &dact, &dgate, &dup}) v->reserve(rows * static_cast<std::size_t>(f));
    if (ep == 1) {
      send.reserve(tk * static_cast<std::size_t>(h + 1));
      for (auto* v : {&out, &send_grad, &out_grad}) v->reserve(tk * static_cast<std::size_t>(h));
    }
  }

  // Local expert i's matrices inside an experts_layout(c, local) buffer.
  SwiGlu expert(const float* experts, std::int64_t i) const {
    const ExpertOffsets o = expert_offsets(h, f, i);
    return {experts + o.gate, experts + o.up, experts + o.down};
  }
  SwiGluGrad expert_grad(float* dexperts, std::int64_t i) const {
    const ExpertOffsets o = expert_offsets(h, f, i);
    return {dexperts + o.gate, dexperts + o.up, dexperts + o.down};
  }

  std::int64_t t, h, e, top, f, ep, local;

  // Route stage (this rank's tokens), saved by route_forward.
  std::vector<float> x_in, rstd, xn, probs;
  std::vector<std::int32_t> selected;  // [t x top] global expert ids, best first
  std::vector<float> weight;           // [t x top] renormalised gate weights
  std::vector<float> psum;             // [t] sum of the selected probabilities
  std::vector<std::int64_t> send_row;  // [t x top] row of (token, slot) in send order
  std::vector<float> fraction;         // [e] f_e of the aux loss
  std::vector<std::int64_t> expert_rows;
  double aux = 0;
  std::vector<float> returned;          // [t*top x h] expert outputs in send order (combine_forward)
  std::vector<float> dweight;           // [t x top] dL/dweight (combine_backward)
  std::vector<float> dxn, dp, dlogits;  // route_backward scratch

  // Expert stage (rows received from every rank), saved by experts_forward.
  std::int64_t rows_in = 0;
  std::vector<std::int64_t> order;               // grouped position -> received row
  std::vector<std::int64_t> local_begin;         // [local + 1] first grouped position of each local expert
  std::vector<std::int64_t> local_next;          // [local] counting-sort cursor
  std::vector<float> xe, gate, up, act;          // grouped inputs and SwiGLU intermediates
  std::vector<float> ye, dact, dgate, dup, dxe;  // scratch

  // ep == 1: the "sent" buffers of forward()/backward().
  std::vector<float> send, out, send_grad, out_grad;
  std::vector<std::int64_t> counts;
};

MoeBlock::MoeBlock(const ModelConfig& c, std::int64_t batch, std::int64_t seq, int ep)
    : impl_(new Impl(c, batch, seq, ep)) {}
MoeBlock::~MoeBlock() {
  delete impl_;
}

double MoeBlock::aux_loss() const {
  return impl_->aux;
}

void MoeBlock::forward(const float* router, const float* experts, float* x) {
  Impl& m = *impl_;
  assert(m.ep == 1);
  route_forward(router, x, m.send, m.counts);
  experts_forward(experts, m.send, m.out);
  combine_forward(m.out, x);
}

void MoeBlock::backward(const float* router, const float* experts, float aux_grad_scale, float* dx, float* drouter,
                        float* dexperts) {
  Impl& m = *impl_;
  assert(m.ep == 1);
  combine_backward(dx, m.send_grad, m.counts);
  experts_backward(experts, m.send_grad, m.out_grad, dexperts);
  route_backward(router, m.out_grad, aux_grad_scale, dx, drouter);
}

void MoeBlock::route_forward(const float* router, const float* x, std::vector<float>& send,
                             std::vector<std::int64_t>& counts) {
  Impl& m = *impl_;
  const std::int64_t t = m.t, h = m.h, e = m.e, top = m.top;
  const float* norm = router;
  const float* wr = norm + h;

  // Step 1: norm, router probabilities p = softmax(x_norm Wr).
  std::memcpy(m.x_in.data(), x, sizeof(float) * t * h);
  kernels::rmsnorm_forward(x, norm, m.xn.data(), m.rstd.data(), t, h);
  kernels::matmul(m.xn.data(), wr, m.probs.data(), t, h, e);
  kernels::softmax_rows(m.probs.data(), m.probs.data(), t, e);

  // Step 2: top-k per token, weights renormalised over the selected experts.
  std::fill(m.expert_rows.begin(), m.expert_rows.end(), 0);
  for (std::int64_t i = 0; i < t; ++i) {
    const float* p = m.probs.data() + i * e;
    std::int32_t* sel = m.selected.data() + i * top;
    kernels::top_k(p, e, top, sel);
    float sum = 0;
    for (std::int64_t s = 0; s < top; ++s) sum += p[sel[s]];
    m.psum[i] = sum;
    for (std::int64_t s = 0; s < top; ++s) {
      m.weight[i * top + s] = p[sel[s]] / sum;
      ++m.expert_rows[sel[s]];
    }
  }

  // Step 3: aux = E * sum_e f_e * P_e over this micro-batch.
  m.aux = 0;
  for (std::int64_t j = 0; j < e; ++j) {
    m.fraction[j] = static_cast<float>(static_cast<double>(m.expert_rows[j]) / static_cast<double>(t * top));
    double mean_p = 0;
    for (std::int64_t i = 0; i < t; ++i) mean_p += m.probs[i * e + j];
    m.aux += static_cast<double>(m.fraction[j]) * mean_p / static_cast<double>(t);
  }
  m.aux *= static_cast<double>(e);

  // Step 4: rows in (expert, token, slot) order; the row carries the normed token and the local expert id.
  std::vector<std::int64_t>& next = m.expert_rows;  // becomes each expert's next free row
  std::int64_t row = 0;
  for (std::int64_t j = 0; j < e; ++j) {
    const std::int64_t n = next[j];
    next[j] = row;
    row += n;
  }
  send.resize(static_cast<std::size_t>(t * top * (h + 1)));
  counts.assign(static_cast<std::size_t>(m.ep), 0);
  for (std::int64_t i = 0; i < t; ++i) {
    for (std::int64_t s = 0; s < top; ++s) {
      const std::int32_t expert = m.selected[i * top + s];
      const std::int64_t r = next[expert]++;
      m.send_row[i * top + s] = r;
      float* dst = send.data() + r * (h + 1);
      std::memcpy(dst, m.xn.data() + i * h, sizeof(float) * h);
      dst[h] = static_cast<float>(expert % m.local);
      counts[expert / m.local] += h + 1;
    }
  }
}

void MoeBlock::experts_forward(const float* experts, const std::vector<float>& recv, std::vector<float>& out) {
  Impl& m = *impl_;
  const std::int64_t h = m.h, f = m.f;
  const std::int64_t rows = static_cast<std::int64_t>(recv.size()) / (h + 1);
  m.rows_in = rows;

  // Step 1: group the received rows by local expert (counting sort, stable).
  std::fill(m.local_begin.begin(), m.local_begin.end(), 0);
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto j = static_cast<std::int64_t>(recv[r * (h + 1) + h]);
    assert(j >= 0 && j < m.local);
    ++m.local_begin[j + 1];
  }
  for (std::int64_t j = 0; j < m.local; ++j) m.local_begin[j + 1] += m.local_begin[j];
  m.order.resize(static_cast<std::size_t>(rows));
  m.xe.resize(static_cast<std::size_t>(rows * h));
  std::copy(m.local_begin.begin(), m.local_begin.end() - 1, m.local_next.begin());
  for (std::int64_t r = 0; r < rows; ++r) {
    const auto j = static_cast<std::int64_t>(recv[r * (h + 1) + h]);
    const std::int64_t pos = m.local_next[j]++;
    m.order[pos] = r;
    std::memcpy(m.xe.data() + pos * h, recv.data() + r * (h + 1), sizeof(float) * h);
  }

  // Step 2: each expert on its rows.
  for (auto* v : {&m.gate, &m.up, &m.act}) v->resize(static_cast<std::size_t>(rows * f));
  m.ye.resize(static_cast<std::size_t>(rows * h));
  for (std::int64_t j = 0; j < m.local; ++j) {
    const std::int64_t b = m.local_begin[j];
    const std::int64_t n = m.local_begin[j + 1] - b;
    if (n == 0) continue;
    swiglu_mlp_forward(m.expert(experts, j), m.xe.data() + b * h, m.gate.data() + b * f, m.up.data() + b * f,
                       m.act.data() + b * f, m.ye.data() + b * h, n, h, f, /*accumulate=*/false);
  }

  // Step 3: outputs back in the received order.
  out.resize(static_cast<std::size_t>(rows * h));
  for (std::int64_t pos = 0; pos < rows; ++pos)
    std::memcpy(out.data() + m.order[pos] * h, m.ye.data() + pos * h, sizeof(float) * h);
}

void MoeBlock::combine_forward(const std::vector<float>& returned, float* x) {
  Impl& m = *impl_;
  const std::int64_t h = m.h, top = m.top;
  assert(static_cast<std::int64_t>(returned.size()) == m.t * top * h);
  std::memcpy(m.returned.data(), returned.data(), sizeof(float) * m.t * top * h);
  for (std::int64_t i = 0; i < m.t; ++i) {
    float* xi = x + i * h;
    for (std::int64_t s = 0; s < top; ++s) {
      const float w = m.weight[i * top + s];
      const float* y = returned.data() + m.send_row[i * top + s] * h;
      for (std::int64_t c = 0; c < h; ++c) xi[c] += w * y[c];
    }
  }
}

void MoeBlock::combine_backward(const float* dx, std::vector<float>& send_grad, std::vector<std::int64_t>& counts) {
  Impl& m = *impl_;
  const std::int64_t h = m.h, top = m.top;
  send_grad.resize(static_cast<std::size_t>(m.t * top * h));
  counts.assign(static_cast<std::size_t>(m.ep), 0);
  for (std::int64_t i = 0; i < m.t; ++i) {
    const float* dxi = dx + i * h;
    for (std::int64_t s = 0; s < top; ++s) {
      const std::int64_t r = m.send_row[i * top + s];
      const float w = m.weight[i * top + s];
      const float* y = m.returned.data() + r * h;
      float* g = send_grad.data() + r * h;
      double dot = 0;
      for (std::int64_t c = 0; c < h; ++c) {
        g[c] = w * dxi[c];
        dot += static_cast<double>(dxi[c]) * y[c];
      }
      m.dweight[i * top + s] = static_cast<float>(dot);
      counts[m.selected[i * top + s] / m.local] += h;
    }
  }
}

void MoeBlock::experts_backward(const float* experts, const std::vector<float>& recv_grad, std::vector<float>& out_grad,
                                float* dexperts) {
  Impl& m = *impl_;
  const std::int64_t h = m.h, f = m.f, rows = m.rows_in;
  assert(static_cast<std::int64_t>(recv_grad.size()) == rows * h);

  // Step 1: gradients into the grouped order of experts_forward (ye is free scratch now).
  for (std::int64_t pos = 0; pos < rows; ++pos)
    std::memcpy(m.ye.data() + pos * h, recv_grad.data() + m.order[pos] * h, sizeof(float) * h);

  // Step 2: each expert's backward.
  for (auto* v : {&m.dact, &m.dgate, &m.dup}) v->resize(static_cast<std::size_t>(rows * f));
  m.dxe.resize(static_cast<std::size_t>(rows * h));
  for (std::int64_t j = 0; j < m.local; ++j) {
    const std::int64_t b = m.local_begin[j];
    const std::int64_t n = m.local_begin[j + 1] - b;
    if (n == 0) continue;
    swiglu_mlp_backward(m.expert(experts, j), m.expert_grad(dexperts, j), m.xe.data() + b * h, m.gate.data() + b * f,
                        m.up.data() + b * f, m.act.data() + b * f, m.ye.data() + b * h, m.dact.data() + b * f,
                        m.dgate.data() + b * f, m.dup.data() + b * f, m.dxe.data() + b * h, n, h, f);
  }

  // Step 3: input gradients back in the received order.
  out_grad.resize(static_cast<std::size_t>(rows * h));
  for (std::int64_t pos = 0; pos < rows; ++pos)
    std::memcpy(out_grad.data() + m.order[pos] * h, m.dxe.data() + pos * h, sizeof(float) * h);
}

void MoeBlock::route_backward(const float* router, const std::vector<float>& returned_grad, float aux_grad_scale,
                              float* dx, float* drouter) {
  Impl& m = *impl_;
  const std::int64_t t = m.t, h = m.h, e = m.e, top = m.top;
  const float* norm = router;
  const float* wr = norm + h;
  float* dnorm = drouter;
  float* dwr = dnorm + h;
  assert(static_cast<std::int64_t>(returned_grad.size()) == t * top * h);

  // Step 1: dL/dx_norm through the experts: the sum over the token's routed copies.
  std::fill(m.dxn.begin(), m.dxn.end(), 0.0f);
  for (std::int64_t i = 0; i < t; ++i) {
    float* d = m.dxn.data() + i * h;
    for (std::int64_t s = 0; s < top; ++s) {
      const float* g = returned_grad.data() + m.send_row[i * top + s] * h;
      for (std::int64_t c = 0; c < h; ++c) d[c] += g[c];
    }
  }

  // Step 2: dL/dp. Gates w_s = p_s / S (S = sum of the selected p) give dL/dp_s = (g_s - sum_r g_r w_r) / S;
  // the aux loss E * sum_e f_e * mean_t p_te gives aux_grad_scale * E * f_e / T for every token (f_e is a
  // count, not differentiable).
  const float aux_coef = aux_grad_scale * static_cast<float>(e) / static_cast<float>(t);
  for (std::int64_t i = 0; i < t; ++i) {
    float* dp = m.dp.data() + i * e;
    for (std::int64_t j = 0; j < e; ++j) dp[j] = aux_coef * m.fraction[j];
    float gw = 0;
    for (std::int64_t s = 0; s < top; ++s) gw += m.dweight[i * top + s] * m.weight[i * top + s];
    for (std::int64_t s = 0; s < top; ++s) dp[m.selected[i * top + s]] += (m.dweight[i * top + s] - gw) / m.psum[i];
  }

  // Step 3: through the softmax and the router matmul, then the norm (dx += : the residual keeps its part).
  kernels::softmax_rows_backward(m.probs.data(), m.dp.data(), m.dlogits.data(), t, e);
  kernels::matmul_dw(m.xn.data(), m.dlogits.data(), dwr, t, h, e);
  kernels::matmul_dx(m.dlogits.data(), wr, m.dxn.data(), t, h, e, /*accumulate=*/true);
  kernels::rmsnorm_backward(m.x_in.data(), norm, m.rstd.data(), m.dxn.data(), dx, dnorm, t, h, /*accumulate=*/true);
}

}  // namespace hzp::runtime
