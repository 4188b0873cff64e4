// A model from a Hugging Face `config.json` (`model.from_hf_config`): the architectures hzp's model math
// covers — LLaMA-style decoders (llama, mistral, qwen2) and their mixture-of-experts form (mixtral) — read
// into a ModelSpec. Architectures whose layers it does not model (shared experts, multi-head latent
// attention: qwen2_moe, deepseek_v2/v3; anything else) are refused with the reason, never approximated.
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
