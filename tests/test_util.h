// Helpers shared by the tests: scenarios from JSON literals, schedule + estimate in one call.
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "shared/compile/compile.h"
#include "shared/cost/duration_model.h"
#include "shared/estimate/estimator.h"
#include "shared/ir/schedule_validator.h"
#include "shared/model/model_math.h"
#include "shared/plan/plan.h"
#include "shared/policy/policy_registry.h"
#include "shared/scenario/scenario_parser.h"

namespace hzp::test {

// A scenario from JSON; fails the test (with the parser's message) when it does not parse.
inline Scenario scenario_from(const nlohmann::json& doc) {
  auto s = parse_scenario(doc, "test");
  INFO(doc.dump());
  if (!s.ok()) FAIL(s.status().message());
  return *s;
}

// model preset on `nodes` x cluster preset, one micro-batch per GPU unless `global_sequences` is given.
inline nlohmann::json scenario_json(const std::string& model, const std::string& cluster, int nodes,
                                    const std::string& policy, long long seq_len, long long global_sequences = 0) {
  nlohmann::json doc = {{"model", {{"preset", model}}},
                        {"cluster", {{"preset", cluster}, {"nodes", nodes}}},
                        {"training", {{"seq_len", seq_len}, {"micro_batch", 1}}},
                        {"policy", {{"preset", policy}}}};
  if (global_sequences > 0) doc["training"]["global_batch_sequences"] = global_sequences;
  return doc;
}

// A LLaMA-shaped model whose embedding and head are negligible (so every stage computes the same), on
// `stages` nodes of one GPU with links fast enough that pipeline transfers take microseconds.
inline nlohmann::json idle_pipeline_json(int stages, int virtual_stages, long long micro_batches) {
  nlohmann::json doc = {
      {"model",
       {{"layers", 16}, {"hidden", 4096}, {"heads", 32}, {"kv_heads", 32}, {"ffn_hidden", 11008}, {"vocab", 128}}},
      {"cluster",
       {{"preset", "dgx-a100"},
        {"nodes", stages},
        {"gpus_per_node", 1},
        {"intra_node", {{"bandwidth_GBps", 1e5}, {"latency_us", 0}}},
        {"nic", {{"bandwidth_Gbps", 1e5}, {"latency_us", 0}}}}},
      {"training", {{"seq_len", 2048}, {"micro_batch", 1}, {"global_batch_sequences", micro_batches}}},
      {"policy", {{"preset", "ddp"}, {"parallel", {{"pipeline", stages}, {"virtual_stages", virtual_stages}}}}}};
  return doc;
}

// A scenario compiled (compile/compile.h); fails the test with the first stage's message.
using Built = Compiled;
inline Compiled build(const Scenario& scenario) {
  auto compiled = compile(scenario);
  if (!compiled.ok()) FAIL(compiled.status().message());
  return std::move(compiled).value();
}

inline Estimate estimate_of(const Built& b) {
  auto e = estimate(b.scenario, b.cost, b.schedule);
  if (!e.ok()) FAIL(e.status().message());
  return *e;
}

// A duration source other than the roofline: every compute op `factor` times slower, optimizer steps
// unchanged. Both executors must take their op times from whatever DurationModel they are given.
class ScaledComputeDurations : public RooflineDurations {
 public:
  ScaledComputeDurations(const ClusterSpec& cluster, double factor) : RooflineDurations(cluster), factor_(factor) {}
  double compute_s(int rank, const ComputeOp& op) const override {
    return factor_ * RooflineDurations::compute_s(rank, op);
  }
  const char* name() const override { return "scaled roofline"; }

 private:
  double factor_;
};

// Sum of compute-op times of program 0 under `durations`.
inline double compute_ops_time(const Built& b, const DurationModel& durations) {
  double t = 0;
  for (const Op& op : b.schedule.programs[0].ops)
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) t += durations.compute_s(0, *c);
  return t;
}

}  // namespace hzp::test
