// Helpers shared by the tests: scenarios from JSON literals, schedule + estimate in one call.
#pragma once

#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>
#include <string>

#include "shared/estimator.h"
#include "shared/model_math.h"
#include "shared/plan.h"
#include "shared/policy_registry.h"
#include "shared/scenario_parser.h"
#include "shared/schedule_validator.h"

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

struct Built {
  Scenario scenario;
  ModelCost cost;
  Schedule schedule;
};

inline Built build(const Scenario& scenario) {
  Built b{scenario, model_cost(scenario.model, scenario.training), {}};
  auto schedule = build_schedule(scenario, b.cost);
  if (!schedule.ok()) FAIL(schedule.status().message());
  b.schedule = std::move(schedule).value();
  Status valid = validate_schedule(b.schedule);
  if (!valid.ok()) FAIL(valid.message());
  return b;
}

inline Estimate estimate_of(const Built& b) {
  auto e = estimate(b.scenario, b.cost, b.schedule);
  if (!e.ok()) FAIL(e.status().message());
  return *e;
}

}  // namespace hzp::test
