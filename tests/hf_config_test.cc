// Models from Hugging Face config.json (shared/scenario/hf_config.h) and the presets of today's models:
// checked against the published configs, written out here as Hugging Face serves them, and against the
// parameter counts their model cards publish.
#include "tests/test_util.h"

#include <filesystem>
#include <fstream>

#include "shared/model/model_math.h"
#include "shared/scenario/hf_config.h"
#include "shared/scenario/presets.h"

using namespace hzp;
using namespace hzp::test;
using nlohmann::json;

namespace {

// meta-llama/Meta-Llama-3-8B/config.json
const char* kLlama3_8b = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
  "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
  "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 500000.0,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
  "use_cache": true, "vocab_size": 128256})";

// mistralai/Mixtral-8x7B-v0.1/config.json
const char* kMixtral = R"({
  "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
  "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
  "output_router_logits": false, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
  "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
  "vocab_size": 32000})";

json model_section(const ModelSpec& m) {
  Scenario s = scenario_from(scenario_json("llama2-7b", "dgx-h100", 1, "zero3", 4096));
  s.model = m;
  json j = scenario_to_json(s)["model"];
  j.erase("name");
  return j;
}

ModelSpec preset(const char* name) {
  auto m = model_preset(name);
  if (!m.ok()) FAIL(m.status().message());
  return *m;
}

}  // namespace

TEST_CASE("hf config: LLaMA-3 and Mixtral configs read as the presets", "[scenario][hf]") {
  auto llama = model_from_hf_config(json::parse(kLlama3_8b), "config.json");
  REQUIRE(llama.ok());
  CHECK(model_section(*llama) == model_section(preset("llama3-8b")));
  auto mixtral = model_from_hf_config(json::parse(kMixtral), "config.json");
  REQUIRE(mixtral.ok());
  CHECK(model_section(*mixtral) == model_section(preset("mixtral-8x7b")));
}

TEST_CASE("model presets: parameter counts as their model cards publish them", "[scenario][hf]") {
  // Qwen2.5 has a bias on q, k and v, which hzp leaves out: L (h + 2 kv_heads d) parameters.
  const struct {
    const char* preset;
    double published;
    double bias;
  } rows[] = {{"llama3-8b", 8'030'261'248, 0},
              {"llama3-70b", 70'553'706'496, 0},
              {"llama3.1-405b", 405'853'388'800, 0},
              {"mixtral-8x7b", 46'702'792'704, 0},
              {"mixtral-8x22b", 140'620'634'112, 0},
              {"qwen2.5-7b", 7'615'616'512, 28 * (3584 + 2 * 4 * 128)},
              {"qwen2.5-72b", 72'706'203'648, 80 * (8192 + 2 * 8 * 128)}};
  for (const auto& row : rows) {
    INFO(row.preset);
    CHECK(static_cast<double>(parameter_count(preset(row.preset))) == Approx(row.published - row.bias).epsilon(1e-9));
  }
}

TEST_CASE("hf config: unsupported architectures and bad files are refused with the reason", "[scenario][hf]") {
  json deepseek = json::parse(kLlama3_8b);
  deepseek["model_type"] = "deepseek_v3";
  auto refused = model_from_hf_config(deepseek, "ds/config.json");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("shared experts") != std::string::npos);
  CHECK(refused.status().message().find("ds/config.json") != std::string::npos);
  json missing = json::parse(kLlama3_8b);
  missing.erase("num_hidden_layers");
  CHECK(model_from_hf_config(missing, "c.json").status().message().find("num_hidden_layers: missing") !=
        std::string::npos);
  json odd_head = json::parse(kLlama3_8b);
  odd_head["head_dim"] = 256;
  CHECK_FALSE(model_from_hf_config(odd_head, "c.json").ok());
  CHECK(load_hf_config("/nonexistent/config.json").status().code() == StatusCode::kInvalidInput);
}

TEST_CASE("model.from_hf_config in a scenario: next to the file, overridable, exclusive with preset",
          "[scenario][hf]") {
  const auto dir = std::filesystem::temp_directory_path() / ("hzp_hf_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir / "models");
  std::ofstream(dir / "models" / "config.json") << kLlama3_8b;
  json doc = scenario_json("llama2-7b", "dgx-h100", 1, "zero3", 4096);
  doc["model"] = {{"from_hf_config", "models/config.json"}, {"layers", 16}};
  std::ofstream(dir / "s.json") << doc.dump();
  auto s = load_scenario_file((dir / "s.json").string());
  REQUIRE(s.ok());
  CHECK(s->model.layers == 16);  // an explicit field overrides the config, as it does a preset
  CHECK(s->model.vocab == 128256);
  CHECK(s->model.kv_heads == 8);
  doc["model"]["preset"] = "llama3-8b";
  std::ofstream(dir / "both.json") << doc.dump();
  auto both = load_scenario_file((dir / "both.json").string());
  REQUIRE_FALSE(both.ok());
  CHECK(both.status().message().find("model.from_hf_config") != std::string::npos);
  std::filesystem::remove_all(dir);
}
