// The runtime's models (model.h): configuration checks, parameter layouts and deterministic initialisation.
// The modules' forwards and backwards are in dense_blocks.cc and moe_block.cc.
#include "runtime/model/model.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <string>
#include <thread>
#include <vector>

namespace hzp::runtime {

// ---------------------------------------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------------------------------------

namespace {

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
  if (m.mlp != MlpKind::kSwiGlu)
    return invalid("model.mlp", std::string("the runtime trains swiglu MLPs only, not ") + to_string(m.mlp) +
                                    " (estimated and simulated only)");
  if (m.has_mla)
    return invalid("model.mla",
                   "the runtime trains grouped-query attention; multi-head latent attention is estimated and "
                   "simulated only (set model.mla to null to train the model with grouped-query attention)");
  if (m.has_moe && m.moe.shared_ffn_hidden > 0)
    return invalid("model.moe.shared_ffn_hidden",
                   "the runtime trains routed experts only; shared experts are "
                   "estimated and simulated only (set it to 0 to train without them)");
  if (m.tied_embeddings)
    return invalid("model.tied_embeddings", "the runtime needs an untied output head (tied_embeddings false)");
  if (m.layers < 1) return invalid("model.layers", "must be at least 1, got " + std::to_string(m.layers));
  if (m.hidden < 1) return invalid("model.hidden", "must be at least 1, got " + std::to_string(m.hidden));
  if (m.heads < 1) return invalid("model.heads", "must be at least 1, got " + std::to_string(m.heads));
  if (m.kv_heads < 1 || m.kv_heads > m.heads || m.heads % m.kv_heads != 0)
    return invalid("model.kv_heads", "must divide heads (" + std::to_string(m.heads) +
                                         ") for grouped-query "
                                         "attention, got " +
                                         std::to_string(m.kv_heads));
  if (m.hidden % m.heads != 0)
    return invalid("model.heads",
                   "must divide hidden (" + std::to_string(m.hidden) + "), got " + std::to_string(m.heads));
  if (m.head_dim() % 2 != 0)
    return invalid("model.heads",
                   "rotary positions need an even head dimension, hidden / heads = " + std::to_string(m.head_dim()));
  if (m.vocab < 1) return invalid("model.vocab", "must be at least 1, got " + std::to_string(m.vocab));

  ModelConfig c;
  c.vocab = m.vocab;
  c.hidden = m.hidden;
  c.heads = m.heads;
  c.kv_heads = m.kv_heads;
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

Result<ModelConfig> model_config(const Scenario& scenario) {
  HZP_ASSIGN_OR_RETURN(ModelConfig c, model_config(scenario.model));
  switch (scenario.training.precision) {
    case Precision::kFp32:
      c.act = ScalarType::kFp32;
      break;
    case Precision::kBf16:
      c.act = ScalarType::kBf16;
      break;
    case Precision::kFp16:
      c.act = ScalarType::kFp16;
      break;
  }
  // Gradients in the working precision, or in fp32 where the policy keeps and reduces them so (Megatron-LM's
  // main_grad, FSDP's reduce_dtype): the same rule as the core's memory model (shared/schedule/sharding.h).
  c.grad = scenario.policy.comm.grad_reduce_in_fp32 ? ScalarType::kFp32 : c.act;
  c.attention = scenario.training.attention;
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
      .matrix("wk", h, c.kv_width())
      .matrix("wv", h, c.kv_width())
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

// fill(i0, i1) over [0, n) in slices, on up to the machine's cores (16 at most: ranks share a machine) when n
// is large enough to pay for the threads.
void fill_in_parallel(std::int64_t n, const std::function<void(std::int64_t, std::int64_t)>& fill) {
  constexpr std::int64_t kPerThread = std::int64_t{1} << 20;
  const std::int64_t cores = std::min<std::int64_t>(std::thread::hardware_concurrency(), 16);
  const std::int64_t threads = std::min(cores, n / kPerThread);
  if (threads <= 1) return fill(0, n);
  std::vector<std::thread> pool;
  for (std::int64_t t = 1; t < threads; ++t) pool.emplace_back(fill, n * t / threads, n * (t + 1) / threads);
  fill(0, n / threads);
  for (std::thread& th : pool) th.join();
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
    // Each element is a function of its index alone, so threads fill the tensor in slices with the same
    // result; on one thread they took ~30 ns an element (perf: 46 % of a 333 M model's start-up).
    fill_in_parallel(t.size(), [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i)
        p[i] = static_cast<float>(std * normal(seed, tensor_id, static_cast<std::uint64_t>(t.offset + i)));
    });
  }
}

}  // namespace hzp::runtime
