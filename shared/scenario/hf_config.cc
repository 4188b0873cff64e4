// Hugging Face config.json -> ModelSpec (hf_config.h).
#include "shared/scenario/hf_config.h"

#include <numeric>
#include <optional>

#include "shared/base/json_io.h"
#include "shared/base/text.h"

namespace hzp {
namespace {

using nlohmann::json;

Status bad(const std::string& path, const std::string& key, const std::string& what) {
  return Status::InvalidInput("model.from_hf_config: " + printable(path, 200) + ": " + key + ": " + what);
}

// A positive integer at `key`; `fallback` when absent and one is given.
Result<std::int64_t> positive(const json& config, const std::string& path, const char* key,
                              std::optional<std::int64_t> fallback = std::nullopt) {
  if (!config.contains(key) || config[key].is_null()) {
    if (fallback) return *fallback;
    return bad(path, key, "missing (a decoder config has it)");
  }
  const json& v = config[key];
  if (!v.is_number_integer() || v.get<std::int64_t>() < 1)
    return bad(path, key, "expected a positive integer, got " + printable(v.dump(), 60));
  return v.get<std::int64_t>();
}

}  // namespace

Result<ModelSpec> model_from_hf_config(const json& config, const std::string& path) {
  if (!config.is_object()) return bad(path, "(document)", "not a JSON object");
  const std::string type = config.value("model_type", "");
  const bool dense = type == "llama" || type == "mistral" || type == "qwen2";
  const bool moe = type == "mixtral";
  if (type == "qwen2_moe" || type == "deepseek_v2" || type == "deepseek_v3")
    return bad(path, "model_type",
               "\"" + type + "\" has shared experts" +
                   (type == "qwen2_moe" ? std::string() : " and multi-head latent attention") +
                   ", which hzp's model math does not cover; write the model out instead");
  if (!dense && !moe)
    return bad(path, "model_type",
               (type.empty() ? std::string("missing") : "\"" + printable(type, 40) + "\" is not supported") +
                   " (supported: llama, mistral, qwen2, mixtral)");
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
  m.layers = static_cast<int>(layers);
  m.heads = static_cast<int>(heads);
  m.kv_heads = static_cast<int>(kv_heads);
  m.ffn_hidden = ffn;
  if (m.hidden % m.heads != 0) return bad(path, "num_attention_heads", "must divide hidden_size");
  if (config.contains("head_dim") && !config["head_dim"].is_null()) {
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
  if (moe) {
    HZP_ASSIGN_OR_RETURN(const std::int64_t experts, positive(config, path, "num_local_experts"));
    HZP_ASSIGN_OR_RETURN(const std::int64_t top_k, positive(config, path, "num_experts_per_tok"));
    if (top_k > experts) return bad(path, "num_experts_per_tok", "exceeds num_local_experts");
    m.has_moe = true;
    m.moe.experts = static_cast<int>(experts);
    m.moe.top_k = static_cast<int>(top_k);
    m.moe.expert_ffn_hidden = ffn;  // Mixtral: every layer's MLP is the experts
    m.moe.layers.resize(m.layers);
    std::iota(m.moe.layers.begin(), m.moe.layers.end(), 0);
  }
  return m;
}

Result<ModelSpec> load_hf_config(const std::string& path) {
  auto doc = load_json_file(path, 1 << 20);
  if (!doc.ok()) return Status::InvalidInput("model.from_hf_config: " + doc.status().message());
  return model_from_hf_config(*doc, path);
}

}  // namespace hzp
