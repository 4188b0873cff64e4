// Hugging Face config.json -> ModelSpec (hf_config.h).
#include "shared/scenario/hf_config.h"

#include <algorithm>
#include <numeric>
#include <optional>

#include "shared/base/json_io.h"
#include "shared/base/text.h"

namespace hzp {
namespace {

using nlohmann::json;

constexpr std::int64_t kMaxLayers = 4096;  // the scenario's model.layers range (scenarios/README.md)

Status bad(const std::string& path, const std::string& key, const std::string& what) {
  return Status::InvalidInput("model.from_hf_config: " + printable(path, 200) + ": " + key + ": " + what);
}

// The most any size read here may be: the largest of the scenario's ranges (scenarios/README.md, 2^24
// positions); each is checked against its own range once it is a field of the model (scenario_parser.cc).
// Bounded here so that nothing wraps to 32 bits on the way (2^32 + 8 heads is not 8 heads).
constexpr std::int64_t kMaxSize = std::int64_t{1} << 24;

// A positive integer at `key`, at most kMaxSize; `fallback` when absent and one is given.
Result<std::int64_t> positive(const json& config, const std::string& path, const char* key,
                              std::optional<std::int64_t> fallback = std::nullopt) {
  if (!config.contains(key) || config[key].is_null()) {
    if (fallback) return *fallback;
    return bad(path, key, "missing (a decoder config has it)");
  }
  const json& v = config[key];
  const bool too_large = v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxSize);
  if (!v.is_number_integer() || (!too_large && v.get<std::int64_t>() < 1))
    return bad(path, key, "expected a positive integer, got " + printable(v.dump(), 60));
  if (too_large || v.get<std::int64_t>() > kMaxSize)
    return bad(path, key, printable(v.dump(), 60) + " exceeds hzp's range (" + std::to_string(kMaxSize) + ")");
  return v.get<std::int64_t>();
}

// A non-negative integer at `key`; 0 when absent or null (DeepSeek's q_lora_rank, n_shared_experts).
Result<std::int64_t> count_or_zero(const json& config, const std::string& path, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return std::int64_t{0};
  const json& v = config[key];
  const bool too_large = v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(kMaxSize);
  if (!v.is_number_integer() || (!too_large && v.get<std::int64_t>() < 0))
    return bad(path, key, "expected a non-negative integer or null, got " + printable(v.dump(), 60));
  if (too_large || v.get<std::int64_t>() > kMaxSize)
    return bad(path, key, printable(v.dump(), 60) + " exceeds hzp's range (" + std::to_string(kMaxSize) + ")");
  return v.get<std::int64_t>();
}

// The MoE part of mixtral, qwen2_moe and deepseek_v2/v3 configs: which layers route, to how many experts.
Status read_moe(const json& config, const std::string& path, const std::string& type, ModelSpec& m) {
  const bool deepseek = type != "mixtral" && type != "qwen2_moe";
  const char* experts_key = type == "mixtral" ? "num_local_experts" : deepseek ? "n_routed_experts" : "num_experts";
  HZP_ASSIGN_OR_RETURN(const std::int64_t experts, positive(config, path, experts_key));
  HZP_ASSIGN_OR_RETURN(const std::int64_t top_k, positive(config, path, "num_experts_per_tok"));
  if (top_k > experts) return bad(path, "num_experts_per_tok", std::string("exceeds ") + experts_key);
  m.has_moe = true;
  m.moe.experts = static_cast<int>(experts);
  m.moe.top_k = static_cast<int>(top_k);
  m.moe.expert_ffn_hidden = m.ffn_hidden;  // Mixtral: every layer's MLP is the experts
  if (type == "mixtral") {
    m.moe.layers.resize(m.layers);
    std::iota(m.moe.layers.begin(), m.moe.layers.end(), 0);
    return Status::Ok();
  }
  HZP_ASSIGN_OR_RETURN(m.moe.expert_ffn_hidden, positive(config, path, "moe_intermediate_size"));
  if (deepseek) {
    // modeling_deepseek.py: layer i routes when i >= first_k_dense_replace and i % moe_layer_freq == 0.
    HZP_ASSIGN_OR_RETURN(const std::int64_t shared, count_or_zero(config, path, "n_shared_experts"));
    HZP_ASSIGN_OR_RETURN(const std::int64_t first_dense, count_or_zero(config, path, "first_k_dense_replace"));
    HZP_ASSIGN_OR_RETURN(const std::int64_t every, positive(config, path, "moe_layer_freq", 1));
    m.moe.shared_ffn_hidden = shared * m.moe.expert_ffn_hidden;
    for (int layer = 0; layer < m.layers; ++layer)
      if (layer >= first_dense && layer % every == 0) m.moe.layers.push_back(layer);
  } else {
    // modeling_qwen2_moe.py: layer i routes when it is not in mlp_only_layers and (i + 1) % decoder_sparse_step
    // == 0; its shared expert has its own width.
    HZP_ASSIGN_OR_RETURN(m.moe.shared_ffn_hidden, count_or_zero(config, path, "shared_expert_intermediate_size"));
    HZP_ASSIGN_OR_RETURN(const std::int64_t every, positive(config, path, "decoder_sparse_step", 1));
    std::vector<std::int64_t> dense_only;
    if (config.contains("mlp_only_layers") && !config["mlp_only_layers"].is_null()) {
      const json& v = config["mlp_only_layers"];
      if (!v.is_array() || v.size() > static_cast<std::size_t>(m.layers))
        return bad(path, "mlp_only_layers", "expected an array of layer indices");
      for (const json& i : v) {
        if (!i.is_number_integer()) return bad(path, "mlp_only_layers", "expected an array of layer indices");
        if (i.get<std::int64_t>() < 0 || i.get<std::int64_t>() >= m.layers)
          return bad(path, "mlp_only_layers",
                     printable(i.dump(), 30) + " is not a layer index (0 to " + std::to_string(m.layers - 1) + ")");
        dense_only.push_back(i.get<std::int64_t>());
      }
    }
    for (int layer = 0; layer < m.layers; ++layer)
      if ((layer + 1) % every == 0 && std::find(dense_only.begin(), dense_only.end(), layer) == dense_only.end())
        m.moe.layers.push_back(layer);
  }
  if (m.moe.layers.empty()) m.has_moe = false;  // every layer dense: a dense model
  return Status::Ok();
}

// DeepSeek's multi-head latent attention sizes (scenario.h MlaSpec, whose names are these keys).
Status read_mla(const json& config, const std::string& path, ModelSpec& m) {
  m.has_mla = true;
  HZP_ASSIGN_OR_RETURN(m.mla.q_lora_rank, count_or_zero(config, path, "q_lora_rank"));
  HZP_ASSIGN_OR_RETURN(m.mla.kv_lora_rank, positive(config, path, "kv_lora_rank"));
  HZP_ASSIGN_OR_RETURN(m.mla.qk_nope_head_dim, positive(config, path, "qk_nope_head_dim"));
  HZP_ASSIGN_OR_RETURN(m.mla.qk_rope_head_dim, positive(config, path, "qk_rope_head_dim"));
  HZP_ASSIGN_OR_RETURN(m.mla.v_head_dim, positive(config, path, "v_head_dim"));
  if (m.kv_heads != m.heads) return bad(path, "num_key_value_heads", "must equal num_attention_heads under MLA");
  return Status::Ok();
}

// Nemotron's MLP is down(act(up(x))), not gated; Hugging Face's NemotronConfig defaults hidden_act to relu2.
Result<MlpKind> nemotron_mlp(const json& config, const std::string& path) {
  if (!config.contains("hidden_act")) return MlpKind::kSquaredRelu;
  const json& act = config["hidden_act"];
  if (!act.is_string()) return bad(path, "hidden_act", "expected a string, got " + printable(act.dump(), 60));
  const std::string name = act.get<std::string>();
  if (name == "relu2") return MlpKind::kSquaredRelu;
  if (name == "gelu" || name == "gelu_new" || name == "gelu_pytorch_tanh") return MlpKind::kGelu;
  return bad(path, "hidden_act",
             "\"" + printable(name, 40) +
                 "\" is not supported for nemotron (supported: relu2, gelu, gelu_new, "
                 "gelu_pytorch_tanh)");
}

}  // namespace

Result<ModelSpec> model_from_hf_config(const json& config, const std::string& path) {
  if (!config.is_object()) return bad(path, "(document)", "not a JSON object");
  if (config.contains("model_type") && !config["model_type"].is_string())
    return bad(path, "model_type", "expected a string, got " + printable(config["model_type"].dump(), 60));
  const std::string type = config.value("model_type", "");
  const bool nemotron = type == "nemotron";  // a two-matrix MLP (up, down) with squared ReLU
  const bool dense = type == "llama" || type == "mistral" || type == "qwen2" || nemotron;
  const bool deepseek = type == "deepseek_v2" || type == "deepseek_v3";
  const bool moe = type == "mixtral" || type == "qwen2_moe" || deepseek;
  if (!dense && !moe)
    return bad(path, "model_type",
               (type.empty() ? std::string("missing") : "\"" + printable(type, 40) + "\" is not supported") +
                   " (supported: llama, mistral, qwen2, nemotron, mixtral, qwen2_moe, deepseek_v2, deepseek_v3)");
  ModelSpec m;
  m.name = "custom";
  m.family = ModelFamily::kLlama;
  m.position = PositionEmbedding::kRope;
  HZP_ASSIGN_OR_RETURN(const std::int64_t layers, positive(config, path, "num_hidden_layers"));
  HZP_ASSIGN_OR_RETURN(m.hidden, positive(config, path, "hidden_size"));
  HZP_ASSIGN_OR_RETURN(const std::int64_t heads, positive(config, path, "num_attention_heads"));
  HZP_ASSIGN_OR_RETURN(const std::int64_t kv_heads, positive(config, path, "num_key_value_heads", heads));
  HZP_ASSIGN_OR_RETURN(const std::int64_t ffn, positive(config, path, "intermediate_size"));
  HZP_ASSIGN_OR_RETURN(m.vocab, positive(config, path, "vocab_size"));
  HZP_ASSIGN_OR_RETURN(m.max_positions, positive(config, path, "max_position_embeddings", 2048));
  // Checked here, before the layer lists are built; every other size against the scenario's ranges later.
  if (layers > kMaxLayers)
    return bad(path, "num_hidden_layers", "exceeds hzp's range (" + std::to_string(kMaxLayers) + ")");
  m.layers = static_cast<int>(layers);
  m.heads = static_cast<int>(heads);
  m.kv_heads = static_cast<int>(kv_heads);
  m.ffn_hidden = ffn;
  if (m.hidden % m.heads != 0) return bad(path, "num_attention_heads", "must divide hidden_size");
  if (!deepseek && config.contains("head_dim") && !config["head_dim"].is_null()) {
    HZP_ASSIGN_OR_RETURN(const std::int64_t head_dim, positive(config, path, "head_dim"));
    if (head_dim * m.heads != m.hidden)
      return bad(path, "head_dim",
                 std::to_string(head_dim) + " x " + std::to_string(m.heads) +
                     " heads is not hidden_size: hzp's attention has hidden_size / heads per head");
  }
  if (config.contains("tie_word_embeddings")) {
    if (!config["tie_word_embeddings"].is_boolean()) return bad(path, "tie_word_embeddings", "expected true or false");
    m.tied_embeddings = config["tie_word_embeddings"].get<bool>();
  }
  if (nemotron) {
    HZP_ASSIGN_OR_RETURN(m.mlp, nemotron_mlp(config, path));
  }
  if (moe) HZP_RETURN_IF_ERROR(read_moe(config, path, type, m));
  if (deepseek) HZP_RETURN_IF_ERROR(read_mla(config, path, m));
  return m;
}

Result<ModelSpec> load_hf_config(const std::string& path) {
  auto doc = load_json_file(path, 1 << 20);
  if (!doc.ok()) return Status::InvalidInput("model.from_hf_config: " + doc.status().message());
  return model_from_hf_config(*doc, path);
}

}  // namespace hzp
