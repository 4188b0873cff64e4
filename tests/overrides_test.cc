// Overrides on a resolved scenario (shared/scenario/overrides.h) resolve as the same fields would in the
// scenario file: checked against the file itself, edited and parsed.
#include "tests/test_util.h"

#include "shared/scenario/overrides.h"

using namespace hzp;
using namespace hzp::test;
using nlohmann::json;

namespace {

// A scenario file as a user writes it: presets and a few fields.
json file() {
  return json::parse(R"({
    "model": {"preset": "llama2-7b"},
    "cluster": {"preset": "dgx-h100", "nodes": 16},
    "training": {"seq_len": 4096, "micro_batch": 1, "global_batch_sequences": 256, "precision": "bf16"},
    "policy": {"preset": "zero3", "comm": {"framework": "megatron"}}})");
}

// The overrides applied to the file's resolved form (what a trace records), as a scenario.
json through_resolved(const json& overrides) {
  auto merged = apply_overrides(scenario_to_json(scenario_from(file())), overrides);
  REQUIRE(merged.ok());
  return scenario_to_json(scenario_from(*merged));
}

// The same overrides written into the file.
json through_file(const json& overrides) {
  json edited = file();
  edited.merge_patch(overrides);
  return scenario_to_json(scenario_from(edited));
}

}  // namespace

TEST_CASE("overrides on a resolved scenario resolve as in the scenario file", "[scenario][overrides]") {
  // A plain merge patch keeps the recorded H100's numbers under a new preset: what hzp replay did.
  json patched = scenario_to_json(scenario_from(file()));
  patched.merge_patch(json::parse(R"({"cluster": {"preset": "dgx-b200", "nodes": 16}})"));
  CHECK(scenario_from(patched).cluster.gpu.type == "h100-sxm");

  const char* cases[] = {
      R"({"cluster": {"preset": "dgx-b200", "nodes": 16}})",  // a new cluster preset
      R"({"cluster": {"preset": "dgx-b200"}})",               // ... with the preset's own node count
      R"({"cluster": {"gpu": {"type": "b200"}}})",            // a new GPU type: its numbers and efficiencies
      R"({"cluster": {"gpu": {"type": "b200"}, "efficiency": {"gemm": 0.5}}})",
      R"({"cluster": {"nodes": 32}, "training": {"global_batch_sequences": 512}})",
      R"({"model": {"preset": "llama2-13b"}})",
      R"({"policy": {"preset": "hsdp"}})",  // the preset's sharding, not the recorded zero3 groups
      R"({"policy": {"preset": "amsp", "sharding": {"params": [8, 1], "grads": [8, 1], "optimizer": [8, 16]}}})",
      R"({"policy": {"comm": {"framework": "deepspeed"}}})",  // its collectives and bucket size
      R"({"training": {"precision": "fp16"}})",  // megatron reduces fp16 gradients in fp16, bf16 ones in fp32
  };
  for (const char* text : cases) {
    INFO(text);
    const json overrides = json::parse(text);
    CHECK(through_resolved(overrides) == through_file(overrides));
  }
  // Tokens replace the recorded sequences (a file holds one or the other).
  CHECK(through_resolved(json::parse(R"({"training": {"global_batch_tokens": 2097152}})")) ==
        through_file(json::parse(R"({"training": {"global_batch_sequences": 512}})")));
  const json b200 = through_resolved(json::parse(cases[0]));
  CHECK(b200["cluster"]["gpu"]["type"] == "b200");
  CHECK(b200["cluster"]["nodes"] == 16);
  CHECK(b200["cluster"]["gpus_per_node"] == 8);
}

TEST_CASE("overrides that are not objects where the scenario has one are refused", "[scenario][overrides]") {
  const json resolved = scenario_to_json(scenario_from(file()));
  auto not_object = apply_overrides(resolved, json::array());
  REQUIRE_FALSE(not_object.ok());
  CHECK_THAT(not_object.status().message(), Catch::Contains("must be a JSON object"));
  auto bad_section = apply_overrides(resolved, json::parse(R"({"cluster": 5})"));
  REQUIRE_FALSE(bad_section.ok());
  CHECK(bad_section.status().code() == StatusCode::kInvalidInput);
  CHECK_THAT(bad_section.status().message(), Catch::StartsWith("cluster: must be an object"));
  // null deletes, as in a merge patch: the sharding then comes from the preset again.
  auto reset = apply_overrides(resolved, json::parse(R"({"policy": {"sharding": null}})"));
  REQUIRE(reset.ok());
  CHECK(scenario_from(*reset).policy.sharding == scenario_from(file()).policy.sharding);
}

TEST_CASE("set: --set edits the scenario as written: the same as the field in the file", "[scenario][overrides]") {
  json doc = file();
  REQUIRE(apply_set(doc, "training.micro_batch=2").ok());
  REQUIRE(apply_set(doc, "policy.preset=zero1").ok());              // not JSON: a string
  REQUIRE(apply_set(doc, "model.preset=\"llama2-13b\"").ok());      // quoted JSON string
  REQUIRE(apply_set(doc, "policy.overlap.prefetch_depth=2").ok());  // a section created where missing
  REQUIRE(apply_set(doc, "policy.comm=null").ok());                 // null deletes
  REQUIRE(apply_set(doc, "run.lr=3e-4").ok());
  json expected = file();
  expected["training"]["micro_batch"] = 2;
  expected["policy"]["preset"] = "zero1";
  expected["model"]["preset"] = "llama2-13b";
  expected["policy"]["overlap"] = {{"prefetch_depth", 2}};
  expected["policy"].erase("comm");
  expected["run"] = {{"lr", 3e-4}};
  CHECK(doc == expected);
  // model.moe=null and model.mla=null mean what they mean in a file: the preset's MoE or MLA removed.
  json deepseek = file();
  deepseek["model"] = {{"preset", "deepseek-v3"}, {"layers", 4}};
  REQUIRE(apply_set(deepseek, "model.mla=null").ok());
  REQUIRE(apply_set(deepseek, "model.moe=null").ok());
  CHECK(deepseek["model"]["mla"].is_null());
  auto plain = parse_scenario(deepseek, "test");
  REQUIRE(plain.ok());
  CHECK_FALSE(plain->model.has_mla);
  CHECK_FALSE(plain->model.has_moe);
  // Resolved: the new model preset and the policy preset's sharding, as if written in the file.
  const Scenario s = scenario_from(doc);
  CHECK(s.model.name == "llama2-13b");
  CHECK(s.policy.preset == Policy::kZero1);
  CHECK(s.training.micro_batch == 2);
}

TEST_CASE("a bad --set names the assignment", "[scenario][overrides]") {
  json doc = file();
  for (const char* bad : {"training.micro_batch", "=3", "training..micro_batch=2", "model.preset.layers=2"}) {
    INFO(bad);
    const Status s = apply_set(doc, bad);
    CHECK(s.code() == StatusCode::kInvalidInput);
    CHECK(s.message().find("--set") == 0);
  }
  CHECK(apply_set(doc, "model.preset.layers=2").message().find("model.preset is \"llama2-7b\"") != std::string::npos);
  CHECK(doc == file());  // a refused --set changes nothing
}
