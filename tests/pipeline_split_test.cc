// Uneven pipeline stages (shared/scenario/pipeline_split.h): the split against Megatron-core's
// get_num_layers_to_build on the recipes it exists for, the parser's errors, and schedules that follow it —
// each stage computes and holds its own layers, and an "uneven" split equal to the even one changes nothing.
#include <algorithm>
#include <numeric>

#include "shared/scenario/pipeline_split.h"
#include "tests/test_util.h"

using namespace hzp;
using namespace hzp::test;

namespace {

ParallelSpec pipeline(int p, int v, int first = 0, int last = 0, bool embedding = false, bool loss = false) {
  ParallelSpec s;
  s.pipeline = p;
  s.virtual_stages = v;
  s.layers_in_first_stage = first;
  s.layers_in_last_stage = last;
  s.account_for_embedding_in_split = embedding;
  s.account_for_loss_in_split = loss;
  return s;
}

std::vector<int> split(int layers, const ParallelSpec& p) {
  auto r = chunk_layers(layers, p);
  if (!r.ok()) FAIL(r.status().message());
  return *r;
}

std::string error(int layers, const ParallelSpec& p) {
  auto r = chunk_layers(layers, p);
  return r.ok() ? "" : r.status().message();
}

// The idle 16-layer pipeline of test_util.h with policy.parallel's split fields set.
nlohmann::json uneven_json(int p, int layers, const nlohmann::json& fields, long long micro_batches = 8) {
  nlohmann::json doc = idle_pipeline_json(p, 1, micro_batches);
  doc["model"]["layers"] = layers;
  for (const auto& [k, v] : fields.items()) doc["policy"]["parallel"][k] = v;
  return doc;
}

// Forward FLOPs of a stage's transformer layers (attention and MLP), one micro-batch.
double layer_flops(const Schedule& s, int program) {
  double f = 0;
  for (const Op& op : s.programs[program].ops)
    if (const auto* c = std::get_if<ComputeOp>(&op.body))
      if (c->phase == Phase::kForward && c->micro_batch == 0 && c->layer >= 0 &&
          (c->module == ModuleKind::kAttention || c->module == ModuleKind::kMlp))
        f += c->flops;
  return f;
}

}  // namespace

TEST_CASE("pipeline split: even, first/last stage layers, and embedding/loss counted as layers, as Megatron",
          "[nd][pipeline_split]") {
  CHECK(split(32, pipeline(4, 1)) == std::vector<int>{8, 8, 8, 8});
  CHECK(split(32, pipeline(4, 2)) == std::vector<int>(8, 4));
  // LLaMA-3.1 405B (126 layers) over 16 stages: the embedding and the loss each count as a layer (128 / 16),
  // so the first and last stages hold 7 (the Llama 3 paper's "one layer fewer on the first and last stage").
  std::vector<int> llama(16, 8);
  llama.front() = llama.back() = 7;
  CHECK(split(126, pipeline(16, 1, 0, 0, true, true)) == llama);
  // Over 8 stages x 2 virtual: 128 / 16 chunks; the first chunk (stage 0, virtual 0) and the last (stage 7,
  // virtual 1) lose the layer.
  CHECK(split(126, pipeline(8, 2, 0, 0, true, true)) == llama);
  // As the Llama 3 paper ran it, 16 stages x 8 virtual: one layer per chunk, the embedding alone in the
  // first chunk and the output layer alone in the last.
  std::vector<int> llama_chunks(128, 1);
  llama_chunks.front() = llama_chunks.back() = 0;
  CHECK(split(126, pipeline(16, 8, 0, 0, true, true)) == llama_chunks);
  CHECK(split(127, pipeline(16, 1, 0, 0, true, false)).front() == 7);
  CHECK(split(127, pipeline(16, 1, 0, 0, false, true)).back() == 7);
  // DeepSeek-V3 (61 layers) over 16 stages: 3 in the first, 2 in the last, (61 - 5) / 14 = 4 in each other.
  std::vector<int> deepseek(16, 4);
  deepseek.front() = 3;
  deepseek.back() = 2;
  CHECK(split(61, pipeline(16, 1, 3, 2)) == deepseek);
  // With virtual stages a stage's layers split over its chunks: chunk k is stage k % p's virtual k / p.
  CHECK(split(30, pipeline(4, 2, 6, 8)) == std::vector<int>{3, 4, 4, 4, 3, 4, 4, 4});
  CHECK(split(10, pipeline(2, 1, 4)) == std::vector<int>{4, 6});
  CHECK(split(10, pipeline(2, 1, 0, 3)) == std::vector<int>{7, 3});
  // Each split covers the model.
  for (const auto& [layers, p] : {std::pair{126, pipeline(8, 2, 0, 0, true, true)}, {61, pipeline(16, 1, 3, 2)}}) {
    const std::vector<int> chunks = split(layers, p);
    CHECK(std::accumulate(chunks.begin(), chunks.end(), 0) == layers);
    int stages = 0;
    for (int s = 0; s < p.pipeline; ++s) stages += stage_layers(chunks, p.pipeline, s);
    CHECK(stages == layers);
  }
}

TEST_CASE("pipeline split: what cannot be split is refused, naming the field", "[nd][pipeline_split]") {
  CHECK(error(126, pipeline(16, 1))
            .find("policy.parallel.pipeline: pipeline 16 (16 chunks) must divide the 126 "
                  "layers; uneven stages:") == 0);
  CHECK(error(126, pipeline(8, 3)).find("policy.parallel.virtual_stages:") == 0);
  CHECK(error(126, pipeline(16, 1, 0, 0, true)).find("with the embedding or loss counted (127)") != std::string::npos);
  CHECK(error(61, pipeline(16, 1, 3, 3))
            .find("policy.parallel.layers_in_first_stage: leaves 55 of the 61 layers "
                  "for the other 14 stages") == 0);
  CHECK(error(30, pipeline(4, 2, 5, 9)).find("stage 0 holds 5 layers, which its virtual_stages (2) must split") !=
        std::string::npos);
  CHECK(error(8, pipeline(2, 1, 4, 5)).find("leaves -1 of the 8 layers") != std::string::npos);
  CHECK(error(8, pipeline(2, 1, 4, 3)).find("leaves 1 of the 8 layers for the other 0 stages") != std::string::npos);
  CHECK(error(32, pipeline(1, 1, 8)).find("policy.parallel.layers_in_first_stage: needs pipeline > 1") == 0);
  CHECK(error(32, pipeline(4, 1, 8, 0, true)).find("is not combined with account_for_embedding_in_split") !=
        std::string::npos);
  // Through the parser: the same message, and the fields read back from the resolved form.
  auto odd = parse_scenario(uneven_json(4, 18, {}), "t");
  REQUIRE_FALSE(odd.ok());
  CHECK(odd.status().message().find("policy.parallel.pipeline: pipeline 4 (4 chunks) must divide the 18 layers") == 0);
  const Scenario s = scenario_from(uneven_json(4, 18, {{"layers_in_first_stage", 3}, {"layers_in_last_stage", 3}}));
  CHECK(scenario_from(scenario_to_json(s)).policy.parallel == s.policy.parallel);
  auto bad = parse_scenario(uneven_json(4, 16, {{"layers_in_first_stage", -1}}), "t");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().find("policy.parallel.layers_in_first_stage") == 0);
}

TEST_CASE("uneven stages: each stage computes and holds its own layers, and the even split stated is the even split",
          "[nd][pipeline_split]") {
  // 18 layers over 4 stages: 3, 6, 6, 3.
  const Built uneven =
      build(scenario_from(uneven_json(4, 18, {{"layers_in_first_stage", 3}, {"layers_in_last_stage", 3}})));
  const std::vector<int> layers = {3, 6, 6, 3};
  const double per_layer = layer_flops(uneven.schedule, 1) / 6;
  REQUIRE(per_layer > 0);
  for (int s = 0; s < 4; ++s) {
    INFO("stage " << s);
    CHECK(layer_flops(uneven.schedule, s) == Approx(layers[s] * per_layer).epsilon(1e-12));
  }
  // Parameters: a stage of 6 layers holds twice the layer parameters of one of 3 (the embedding and head are
  // 128 x 4096 each here, under 0.1 % of a layer).
  CHECK(uneven.schedule.state_bytes[1].params / uneven.schedule.state_bytes[0].params == Approx(2).epsilon(2e-3));
  // On an idle network the step is bounded by the slowest stage: m x its time plus at most p - 1 more.
  const Estimate e = estimate_of(uneven);
  const Built even6 = build(scenario_from(uneven_json(4, 24, {})));  // 6 layers on every stage
  const double t6 = estimate_of(even6).step_time_s;                  // (m + p - 1) x a 6-layer stage's time
  CHECK(e.step_time_s <= t6 * 1.0001);
  CHECK(e.step_time_s >= t6 * 8 / (8 + 3) * 0.9999);
  // 16 layers stated as 4 first and 4 last: the even split, op for op.
  const Built stated =
      build(scenario_from(uneven_json(4, 16, {{"layers_in_first_stage", 4}, {"layers_in_last_stage", 4}})));
  const Built even = build(scenario_from(uneven_json(4, 16, {})));
  for (int s = 0; s < 4; ++s) CHECK(stated.schedule.programs[s].ops.size() == even.schedule.programs[s].ops.size());
  CHECK(estimate_of(stated).step_time_s == estimate_of(even).step_time_s);
  // Embedding and loss counted: 14 layers over 4 stages as 3, 4, 4, 3.
  const Built counted = build(scenario_from(
      uneven_json(4, 14, {{"account_for_embedding_in_split", true}, {"account_for_loss_in_split", true}})));
  CHECK(layer_flops(counted.schedule, 0) == Approx(3 * per_layer).epsilon(1e-12));
  CHECK(layer_flops(counted.schedule, 2) == Approx(4 * per_layer).epsilon(1e-12));
  // An embedding-only first chunk and a head-only last one (14 layers, 4 stages x 4 virtual: 16 chunks of
  // one counted layer) build, validate and run: stage 0 computes 3 layers, the last 3.
  nlohmann::json ends =
      uneven_json(4, 14, {{"account_for_embedding_in_split", true}, {"account_for_loss_in_split", true}});
  ends["policy"]["parallel"]["virtual_stages"] = 4;
  const Built alone = build(scenario_from(ends));
  CHECK(layer_flops(alone.schedule, 0) == Approx(3 * per_layer).epsilon(1e-12));
  CHECK(layer_flops(alone.schedule, 1) == Approx(4 * per_layer).epsilon(1e-12));
  CHECK(layer_flops(alone.schedule, 3) == Approx(3 * per_layer).epsilon(1e-12));
  CHECK(estimate_of(alone).step_time_s > 0);
}
