// A model from a Hugging Face `config.json` (`model.from_hf_config`): the architectures hzp's model math
// covers — LLaMA-style decoders (llama, mistral, qwen2; nemotron, whose MLP has two matrices and squared
// ReLU), their mixture-of-experts forms (mixtral; qwen2_moe
// with its shared expert) and DeepSeek's (deepseek_v2, deepseek_v3: multi-head latent attention, dense first
// layers, routed and shared experts) — read into a ModelSpec. Anything else is refused with the reason.
// Left out, as small or outside one training step's shape: qwen2's q/k/v biases and qwen2_moe's shared-expert
// gate (h parameters a layer each), DeepSeek-V3's routing bias (one per expert) and its multi-token-prediction
// layers (num_nextn_predict_layers; DeepSeek's 671 B count leaves them out too), nemotron's LayerNorm bias
// (h parameters a layer) and its partial rotary (no parameters).
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp {

// `config` as read from `path` (named in errors: "PATH: num_hidden_layers: ..."). The name is "custom".
Result<ModelSpec> model_from_hf_config(const nlohmann::json& config, const std::string& path);

// Reads the file (at most 1 MiB) and converts it.
Result<ModelSpec> load_hf_config(const std::string& path);

}  // namespace hzp
