// Models from Hugging Face config.json (shared/scenario/hf_config.h) and the presets of today's models:
// checked against the published configs, written out here as Hugging Face serves them, and against the
// parameter counts their model cards publish.
#include "tests/test_util.h"

#include <filesystem>
#include <fstream>
#include <vector>

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

// deepseek-ai/DeepSeek-V3/config.json (rope_scaling and the quantization config left out)
const char* kDeepSeekV3 = R"({
  "architectures": ["DeepseekV3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "aux_loss_alpha": 0.001, "bos_token_id": 0, "eos_token_id": 1, "ep_size": 1, "first_k_dense_replace": 3,
  "hidden_act": "silu", "hidden_size": 7168, "initializer_range": 0.02, "intermediate_size": 18432,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v3",
  "moe_intermediate_size": 2048, "moe_layer_freq": 1, "n_group": 8, "n_routed_experts": 256,
  "n_shared_experts": 1, "norm_topk_prob": true, "num_attention_heads": 128, "num_experts_per_tok": 8,
  "num_hidden_layers": 61, "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
  "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06, "rope_theta": 10000,
  "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "seq_aux": true, "tie_word_embeddings": false,
  "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "use_cache": true, "v_head_dim": 128,
  "vocab_size": 129280})";

// deepseek-ai/DeepSeek-V2-Lite/config.json: no query latent (q_lora_rank null)
const char* kDeepSeekV2Lite = R"({
  "architectures": ["DeepseekV2ForCausalLM"], "attention_bias": false, "aux_loss_alpha": 0.001,
  "first_k_dense_replace": 1, "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944,
  "kv_lora_rank": 512, "max_position_embeddings": 163840, "model_type": "deepseek_v2",
  "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64, "n_shared_experts": 2,
  "norm_topk_prob": false, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
  "num_key_value_heads": 16, "q_lora_rank": null, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
  "rms_norm_eps": 1e-06, "rope_theta": 10000, "routed_scaling_factor": 1.0, "scoring_func": "softmax",
  "tie_word_embeddings": false, "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128,
  "vocab_size": 102400})";

// Qwen/Qwen1.5-MoE-A2.7B/config.json: 60 routed experts and one shared expert of its own width
const char* kQwenMoe = R"({
  "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "decoder_sparse_step": 1,
  "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192,
  "max_window_layers": 21, "model_type": "qwen2_moe", "moe_intermediate_size": 1408, "norm_topk_prob": false,
  "num_attention_heads": 16, "num_experts": 60, "num_experts_per_tok": 4, "num_hidden_layers": 24,
  "num_key_value_heads": 16, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "shared_expert_intermediate_size": 5632,
  "sliding_window": 32768, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_sliding_window": false,
  "vocab_size": 151936})";

// Nemotron-4 15B's shape (arXiv 2402.16819, Table 1) in Hugging Face's NemotronConfig keys, as
// nvidia/Minitron-8B-Base/config.json writes them
const char* kNemotron = R"({
  "architectures": ["NemotronForCausalLM"], "attention_bias": false, "head_dim": 128, "hidden_act": "relu2",
  "hidden_size": 6144, "intermediate_size": 24576, "max_position_embeddings": 4096, "model_type": "nemotron",
  "norm_eps": 1e-05, "num_attention_heads": 48, "num_hidden_layers": 32, "num_key_value_heads": 8,
  "partial_rotary_factor": 0.5, "rope_theta": 10000, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "vocab_size": 256000})";

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

TEST_CASE("hf config: DeepSeek and Qwen-MoE configs read as the presets and their model cards", "[scenario][hf]") {
  auto v3 = model_from_hf_config(json::parse(kDeepSeekV3), "config.json");
  REQUIRE(v3.ok());
  CHECK(model_section(*v3) == model_section(preset("deepseek-v3")));
  CHECK(v3->moe.layers.front() == 3);  // first_k_dense_replace
  CHECK(v3->moe.layers.size() == 58);
  auto lite = model_from_hf_config(json::parse(kDeepSeekV2Lite), "config.json");
  REQUIRE(lite.ok());
  CHECK(model_section(*lite) == model_section(preset("deepseek-v2-lite")));
  CHECK(lite->mla.q_lora_rank == 0);
  CHECK(lite->moe.shared_ffn_hidden == 2 * 1408);
  auto qwen = model_from_hf_config(json::parse(kQwenMoe), "config.json");
  REQUIRE(qwen.ok());
  CHECK_FALSE(qwen->has_mla);
  CHECK(qwen->moe.shared_ffn_hidden == 5632);
  CHECK(qwen->moe.layers.size() == 24);
  // Qwen1.5-MoE-A2.7B: "14.3B parameters in total" (its model card); hzp leaves out the q/k/v biases and the
  // shared-expert gate, L (h + 2 kv_heads d + h) = 24 · 4·2048 parameters.
  CHECK(static_cast<double>(parameter_count(*qwen)) == Approx(14.3e9 - 24 * 4 * 2048).epsilon(0.005));

  json sparse = json::parse(kQwenMoe);
  sparse["decoder_sparse_step"] = 2;
  sparse["mlp_only_layers"] = {1, 3};
  auto every_other = model_from_hf_config(sparse, "config.json");
  REQUIRE(every_other.ok());
  CHECK(every_other->moe.layers == std::vector<int>{5, 7, 9, 11, 13, 15, 17, 19, 21, 23});  // (i + 1) % 2 == 0
  sparse["mlp_only_layers"] = {-5, 99};  // not layers of this model: refused, not ignored
  CHECK(model_from_hf_config(sparse, "config.json").status().message().find("-5 is not a layer index") !=
        std::string::npos);
  json dense_only = json::parse(kDeepSeekV2Lite);
  dense_only["first_k_dense_replace"] = 27;
  auto all_dense = model_from_hf_config(dense_only, "config.json");
  REQUIRE(all_dense.ok());
  CHECK_FALSE(all_dense->has_moe);

  json bad_rank = json::parse(kDeepSeekV3);
  bad_rank["q_lora_rank"] = -1;
  CHECK(model_from_hf_config(bad_rank, "c.json").status().message().find("q_lora_rank") != std::string::npos);
  json no_kv = json::parse(kDeepSeekV3);
  no_kv.erase("kv_lora_rank");
  CHECK(model_from_hf_config(no_kv, "c.json").status().message().find("kv_lora_rank: missing") != std::string::npos);
  json huge = json::parse(kDeepSeekV3);
  huge["num_hidden_layers"] = 2000000000;  // refused before any per-layer list is built
  CHECK(model_from_hf_config(huge, "c.json").status().message().find("num_hidden_layers") != std::string::npos);
  // Found by the attack of issue 35: a model_type that is not a string aborted; sizes past 2^31 wrapped to 32
  // bits (2^32 + 8 experts read as 8).
  for (const json& type : {json(0), json::array(), json::object(), json(true), json(nullptr)}) {
    json odd = json::parse(kMixtral);
    odd["model_type"] = type;
    const auto r = model_from_hf_config(odd, "c.json");
    INFO(type.dump());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().message().find("model_type") != std::string::npos);
  }
  for (const char* key : {"num_local_experts", "num_key_value_heads", "num_attention_heads", "hidden_size"})
    for (const json& v :
         {json((std::int64_t{1} << 32) + 8), json(std::int64_t{1} << 31), json(18446744073709551615ull)}) {
      json wide = json::parse(kMixtral);
      wide[key] = v;
      const auto r = model_from_hf_config(wide, "c.json");
      INFO(key << " = " << v.dump());
      REQUIRE_FALSE(r.ok());
      CHECK(r.status().message().find(key) != std::string::npos);
    }
}

TEST_CASE("DeepSeek presets: total and activated parameters as the papers publish them", "[scenario][hf]") {
  // Total and activated per token (DeepSeek-V3 arXiv 2412.19437 §4.2; DeepSeek-V2 arXiv 2405.04434 §3.1.2 and
  // App. B). Activated = total - the (experts - top_k) routed experts a token does not visit, less the input
  // embedding table, which the papers' activated counts leave out; the totals include it.
  const struct {
    const char* preset;
    double total, activated;
  } rows[] = {{"deepseek-v3", 671e9, 37e9}, {"deepseek-v2", 236e9, 21e9}, {"deepseek-v2-lite", 15.7e9, 2.4e9}};
  for (const auto& row : rows) {
    INFO(row.preset);
    const ModelSpec m = preset(row.preset);
    const auto total = static_cast<double>(parameter_count(m));
    const double unvisited = static_cast<double>(m.moe.layers.size()) * (m.moe.experts - m.moe.top_k) * 3.0 *
                             static_cast<double>(m.hidden * m.moe.expert_ffn_hidden);
    const double activated = total - unvisited - static_cast<double>(m.vocab * m.hidden);
    CHECK(total == Approx(row.total).epsilon(0.005));
    CHECK(activated == Approx(row.activated).epsilon(0.03));
  }
}

TEST_CASE("hf config: nemotron reads a two-matrix squared-ReLU MLP", "[scenario][hf]") {
  json config = json::parse(kNemotron);
  auto m = model_from_hf_config(config, "n/config.json");
  REQUIRE(m.ok());
  CHECK(m->mlp == MlpKind::kSquaredRelu);
  CHECK(m->kv_heads == 8);
  CHECK_FALSE(m->tied_embeddings);
  config["hidden_act"] = "gelu";
  CHECK(model_from_hf_config(config, "n/config.json")->mlp == MlpKind::kGelu);
  config["hidden_act"] = "swish";
  auto refused = model_from_hf_config(config, "n/config.json");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("hidden_act") != std::string::npos);
  CHECK(refused.status().message().find("swish") != std::string::npos);
  CHECK(model_from_hf_config(json::parse(kLlama3_8b), "c.json")->mlp == MlpKind::kSwiGlu);
}

TEST_CASE("hf config: unsupported architectures and bad files are refused with the reason", "[scenario][hf]") {
  json other = json::parse(kLlama3_8b);
  other["model_type"] = "gemma2";
  auto refused = model_from_hf_config(other, "g/config.json");
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().message().find("\"gemma2\" is not supported") != std::string::npos);
  CHECK(refused.status().message().find("g/config.json") != std::string::npos);
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
  // A size past the scenario's range names the model field and its value, not only the file.
  json big = json::parse(kLlama3_8b);
  big["vocab_size"] = 5000000;
  std::ofstream(dir / "models" / "big.json") << big.dump();
  doc["model"] = {{"from_hf_config", "models/big.json"}};
  std::ofstream(dir / "big.json") << doc.dump();
  auto past = load_scenario_file((dir / "big.json").string());
  REQUIRE_FALSE(past.ok());
  CHECK(past.status().message().find("vocab 5000000, past hzp's range") != std::string::npos);
  big["vocab_size"] = 128256;
  big["max_position_embeddings"] = 16777217;  // past the config reader's bound: said so, not "not positive"
  CHECK(model_from_hf_config(big, "c.json").status().message().find("16777217 exceeds hzp's range") !=
        std::string::npos);
  // A NUL byte in the path would have open() read models/config.json (issue 35's tenth attack).
  doc["model"] = {{"from_hf_config", std::string("models/config.json\0x", 19)}};
  std::ofstream(dir / "nul.json") << doc.dump();
  auto nul = load_scenario_file((dir / "nul.json").string());
  REQUIRE_FALSE(nul.ok());
  CHECK(nul.status().message().find("the path contains a NUL byte") != std::string::npos);
  std::filesystem::remove_all(dir);
}
