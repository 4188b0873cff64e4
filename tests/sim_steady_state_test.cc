// sim/steady_state.h: which steps are counted, and the extrapolation itself (without SimGrid: the two shorter
// runs against the full one are compared end to end by tests/sim_steady_state.sh).

#include "shared/cost/duration_model.h"
#include "shared/scenario/scenario_parser.h"
#include "sim/steady_state.h"
#include "tests/test_util.h"

using namespace hzp;
using namespace hzp::test;

TEST_CASE("steady state: counted only when the two shorter runs simulate fewer micro-batches", "[sim][steady]") {
  // 4 pipeline stages of one GPU: the period is 4, the shorter runs 8 and 12 micro-batches.
  const Scenario pipelined = scenario_from(idle_pipeline_json(4, 2, 20));
  sim::SimOptions options;
  sim::SteadyStatePlan plan = sim::plan_steady_state(pipelined, options);
  CHECK(plan.applies());
  CHECK(plan.micro_batches == 20);
  CHECK(plan.period == 4);
  CHECK(plan.first == 8);
  CHECK(plan.second == 12);
  CHECK_FALSE(sim::plan_steady_state(scenario_from(idle_pipeline_json(4, 2, 16)), options).applies());
  options.exact = true;
  plan = sim::plan_steady_state(pipelined, options);
  CHECK_FALSE(plan.applies());
  CHECK(plan.why_not == "--exact");
  // Without a pipeline the period is one micro-batch: 2 and 3 simulated, from 5 on.
  options.exact = false;
  const Scenario flat = scenario_from(scenario_json("llama2-7b", "a800", 2, "zero3", 4096, 16 * 5));
  plan = sim::plan_steady_state(flat, options);
  CHECK(plan.applies());
  CHECK(plan.period == 1);
  CHECK(plan.first == 2);
  CHECK(plan.second == 3);
  CHECK_FALSE(
      sim::plan_steady_state(scenario_from(scenario_json("llama2-7b", "a800", 2, "zero3", 4096, 16 * 4)), options)
          .applies());
  // A replay's recorded durations are per op: never counted.
  const RooflineDurations roofline(flat.cluster);
  options.durations = &roofline;
  CHECK_FALSE(sim::plan_steady_state(flat, options).applies());
}

TEST_CASE("steady state: the shorter scenario differs in its micro-batches alone", "[sim][steady]") {
  const Scenario s = scenario_from(scenario_json("llama2-7b", "a800", 2, "zero3", 4096, 16 * 7));
  const Scenario shorter = sim::with_micro_batches(s, 3);
  CHECK(shorter.grad_accum_steps() == 3);
  CHECK(shorter.data_parallel() == s.data_parallel());
  CHECK(shorter.training.micro_batch == s.training.micro_batch);
  CHECK(scenario_to_json(shorter)["training"]["seq_len"] == scenario_to_json(s)["training"]["seq_len"]);
}

namespace {

// A point whose every per-step quantity is a + b·M (what a steady state gives), memory fixed.
sim::SteadyPoint linear_point(long long m) {
  sim::SteadyPoint p;
  sim::SimResult& r = p.result;
  r.steps = 1;
  r.total_time_s = r.step_time_s = 1.5 + 0.25 * static_cast<double>(m);
  r.compute_s = 1.0 + 0.2 * static_cast<double>(m);
  r.comm_s = 0.5 + 0.125 * static_cast<double>(m);
  r.comm_bytes_intra_node = 1e9 * static_cast<double>(m);
  r.comm_bytes_inter_node = 3e8 + 2e8 * static_cast<double>(m);
  r.ops_executed = 100 + 40 * m;
  r.ops_simulated = 10 + 4 * m;
  r.collectives = 7 + 3 * m;
  r.collectives_with_flows = 2 + m;
  r.memory = {1e9, 2e9, 3e9, 4e9 + 123, 5e8};
  p.breakdown.step_s = r.step_time_s;
  p.breakdown.forward_s = 0.1 * static_cast<double>(m);
  p.breakdown.backward_s = 0.2 * static_cast<double>(m);
  p.breakdown.idle_s = 0.75 - 0.05 * static_cast<double>(m);
  p.breakdown.comm[2] = {0.3 + 0.01 * static_cast<double>(m), 0.02 * static_cast<double>(m)};
  return p;
}

}  // namespace

TEST_CASE("steady state: every per-step quantity extrapolates to the full step's", "[sim][steady]") {
  const Scenario s = scenario_from(idle_pipeline_json(4, 2, 40));
  const Compiled c = build(s);
  const sim::SteadyStatePlan plan = sim::plan_steady_state(s, {});
  REQUIRE(plan.applies());
  // Through the child's report, as the CLI passes the first point.
  auto first = sim::steady_point_from_json(sim::steady_point_json(linear_point(plan.first)));
  REQUIRE(first.ok());
  auto whole = sim::extrapolate(plan, s, c.cost, *first, linear_point(plan.second));
  REQUIRE(whole.ok());
  const sim::SteadyPoint expected = linear_point(40);
  const sim::SimResult& r = whole->result;
  CHECK(r.step_time_s == Approx(expected.result.step_time_s).epsilon(1e-12));
  CHECK(r.total_time_s == Approx(expected.result.total_time_s).epsilon(1e-12));
  CHECK(r.compute_s == Approx(expected.result.compute_s).epsilon(1e-12));
  CHECK(r.comm_s == Approx(expected.result.comm_s).epsilon(1e-12));
  CHECK(r.comm_bytes_intra_node == Approx(expected.result.comm_bytes_intra_node).epsilon(1e-12));
  CHECK(r.comm_bytes_inter_node == Approx(expected.result.comm_bytes_inter_node).epsilon(1e-12));
  CHECK(r.ops_executed == expected.result.ops_executed);
  CHECK(r.ops_simulated == expected.result.ops_simulated);
  CHECK(r.collectives == expected.result.collectives);
  CHECK(r.collectives_with_flows == expected.result.collectives_with_flows);
  CHECK(r.memory.total() == expected.result.memory.total());
  CHECK(whole->breakdown.forward_s == Approx(expected.breakdown.forward_s).epsilon(1e-12));
  CHECK(whole->breakdown.backward_s == Approx(expected.breakdown.backward_s).epsilon(1e-12));
  CHECK(whole->breakdown.idle_s == Approx(expected.breakdown.idle_s).epsilon(1e-12));
  CHECK(whole->breakdown.comm[2].transfer_s == Approx(expected.breakdown.comm[2].transfer_s).epsilon(1e-12));
  CHECK(whole->breakdown.comm[2].exposed_s == Approx(expected.breakdown.comm[2].exposed_s).epsilon(1e-12));
  // Performance is the full scenario's: its tokens over the extrapolated step.
  CHECK(r.tokens_per_s == Approx(40.0 * 2048 / expected.result.step_time_s).epsilon(1e-12));
  CHECK(r.exposed_comm_s == Approx(expected.result.step_time_s - expected.result.compute_s).epsilon(1e-12));
  CHECK(r.steady_state.micro_batches == 40);
  CHECK(r.steady_state.first == plan.first);
  CHECK(r.steady_state.second == plan.second);
  CHECK(sim::summary_json(s, r)["steady_state"]["simulated"] == nlohmann::json::array({8, 12}));
}

TEST_CASE("steady state: runs whose memory differ are refused, not extrapolated", "[sim][steady]") {
  const Scenario s = scenario_from(idle_pipeline_json(4, 2, 40));
  const Compiled c = build(s);
  const sim::SteadyStatePlan plan = sim::plan_steady_state(s, {});
  sim::SteadyPoint second = linear_point(plan.second);
  second.result.memory.activations += 1;
  auto whole = sim::extrapolate(plan, s, c.cost, linear_point(plan.first), second);
  REQUIRE_FALSE(whole.ok());
  CHECK(whole.status().message().find("activations memory differs") != std::string::npos);
  CHECK(whole.status().message().find("--exact") != std::string::npos);
  // A report missing a field is an error that names it.
  nlohmann::json report = sim::steady_point_json(linear_point(plan.first));
  report.erase("collectives");
  auto read = sim::steady_point_from_json(report);
  REQUIRE_FALSE(read.ok());
  CHECK(read.status().message().find("\"collectives\"") != std::string::npos);
}
