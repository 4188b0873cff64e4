// Memory per GPU of every preset against the closed forms of the ZeRO and AMSP papers:
// model states = 2Ψ/s_p + 2Ψ/s_g + 12Ψ/s_os (bf16 + AdamW): DDP 16Ψ, ZeRO-1 4Ψ + 12Ψ/D,
// ZeRO-2 2Ψ + 14Ψ/D, ZeRO-3 16Ψ/D, HSDP 16Ψ/R.
#include "tests/test_util.h"

#include "shared/schedule/sharding.h"

using namespace hzp;
using namespace hzp::test;

TEST_CASE("model-state memory per GPU equals the closed form for every preset", "[memory]") {
  for (int nodes : {1, 4}) {
    const double R = 8, D = 8.0 * nodes;
    struct Case {
      const char* policy;
      double bytes_per_param;  // model-state bytes per parameter, per GPU
    } cases[] = {
        {"ddp", 16},      {"zero1", 4 + 12 / D}, {"zero2", 2 + 14 / D}, {"zero3", 16 / D},
        {"fsdp", 16 / D}, {"hsdp", 16 / R},      {"mics", 16 / R},
    };
    for (const Case& c : cases) {
      INFO(c.policy << " on " << nodes << " nodes");
      Built b = build(scenario_from(scenario_json("llama2-7b", "dgx-a100", nodes, c.policy, 4096)));
      const MemoryBreakdown m = memory_per_gpu(b.scenario, b.cost, b.schedule);
      const double psi = static_cast<double>(b.cost.params);
      CHECK(psi == 6738415616.0);
      CHECK(m.params + m.grads + m.optimizer == Approx(c.bytes_per_param * psi).epsilon(1e-12));
    }
  }
}

TEST_CASE("explicit AMSP sharding follows 2Ψ/s_p + 2Ψ/s_g + 12Ψ/s_os", "[memory]") {
  nlohmann::json doc = scenario_json("llama2-13b", "a800", 4, "amsp", 4096);
  doc["policy"]["sharding"] = {{"params", {2, 1}}, {"grads", {2, 1}}, {"optimizer", {8, 4}}};
  Built b = build(scenario_from(doc));
  const MemoryBreakdown m = memory_per_gpu(b.scenario, b.cost, b.schedule);
  const double psi = static_cast<double>(b.cost.params);
  CHECK(m.params == Approx(2 * psi / 2).epsilon(1e-12));
  CHECK(m.grads == Approx(2 * psi / 2).epsilon(1e-12));
  CHECK(m.optimizer == Approx(12 * psi / 32).epsilon(1e-12));
}

TEST_CASE("fp32 training keeps 4-byte params and grads and 8 bytes of Adam moments", "[memory]") {
  nlohmann::json doc = scenario_json("tiny-dense", "dgx-a100", 1, "ddp", 64);
  doc["training"]["precision"] = "fp32";
  Built b = build(scenario_from(doc));
  const MemoryBreakdown m = memory_per_gpu(b.scenario, b.cost, b.schedule);
  CHECK(m.params + m.grads + m.optimizer == Approx(16.0 * b.cost.params));
  CHECK(m.params == Approx(4.0 * b.cost.params));
}

TEST_CASE("buffers are the schedule's fixed pools: prefetch depth + 1 gathered layers", "[memory]") {
  for (int depth : {0, 1, 2}) {
    nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 2, "zero3", 4096);
    doc["policy"]["overlap"] = {{"prefetch_depth", depth}};
    Built b = build(scenario_from(doc));
    const MemoryBreakdown m = memory_per_gpu(b.scenario, b.cost, b.schedule);
    // Largest unit of llama2-7b is a layer: 4h² + 3hf + 2h = 202,383,360 params (embedding: 131,072,000).
    const double largest = 4.0 * 4096 * 4096 + 3.0 * 4096 * 11008 + 2 * 4096;
    const double gather = (depth + 1) * 2 * largest;
    const double reduce = 2 * 2 * largest;  // double-buffered gradient reduce-scatter slots
    CHECK(m.buffers == Approx(gather + reduce));
    CHECK(m.activations == Approx(b.cost.activation_bytes + b.cost.transient_bytes));
  }
}

TEST_CASE("process groups: intra-node groups are contiguous local ranks, deterministic", "[memory][groups]") {
  nlohmann::json doc = scenario_json("tiny-dense", "dgx-a100", 2, "amsp", 64);
  doc["policy"]["sharding"] = {{"params", {4, 1}}, {"grads", {4, 1}}, {"optimizer", {8, 2}}};
  Built b = build(scenario_from(doc));
  const Schedule& s = b.schedule;
  auto members = [&](int rank, GroupRole role) { return s.group_of(rank, static_cast<int>(role)).ranks; };
  CHECK(members(5, GroupRole::kParamShard) == std::vector<int>{4, 5, 6, 7});
  CHECK(members(9, GroupRole::kGradShard) == std::vector<int>{8, 9, 10, 11});
  // q = s_os / s_p = 4: the ranks of my 16-GPU optimizer block holding the same parameter shard.
  CHECK(members(5, GroupRole::kParamRefresh) == std::vector<int>{1, 5, 9, 13});
  CHECK(members(0, GroupRole::kOsReplica) == std::vector<int>{0});
  CHECK(s.group_of(5, static_cast<int>(GroupRole::kParamShard)).intra_node);
  CHECK(s.group_of(5, static_cast<int>(GroupRole::kParamRefresh)).nodes == 2);
}

TEST_CASE("expert parallelism: each GPU keeps 1/EP of the experts, sharded over the ranks holding them",
          "[memory][moe]") {
  // mixtral-8x7b on 2 x 8 GPUs, EP = 8: the expert-data-parallel group is the 2 ranks with the same experts.
  auto states = [](const char* policy, int ep) {
    nlohmann::json doc = scenario_json("mixtral-8x7b", "dgx-h100", 2, policy, 4096);
    doc["policy"]["expert_parallel"] = ep;
    doc["training"]["recompute"] = "full";
    Built b = build(scenario_from(doc));
    const MemoryBreakdown m = memory_per_gpu(b.scenario, b.cost, b.schedule);
    double experts = 0;
    for (const ModuleCost& mc : b.cost.modules) experts += static_cast<double>(mc.expert_params);
    return std::tuple{m.params + m.grads + m.optimizer, static_cast<double>(b.cost.params) - experts, experts};
  };
  const auto [ddp, dense, experts] = states("ddp", 8);
  CHECK(ddp == Approx(16 * dense + 16 * experts / 8).epsilon(1e-9));
  CHECK(std::get<0>(states("zero3", 8)) == Approx(16 * dense / 16 + 16 * (experts / 8) / 2).epsilon(1e-9));
  CHECK(std::get<0>(states("hsdp", 8)) == Approx(16 * dense / 8 + 16 * (experts / 8) / 1).epsilon(1e-9));
  CHECK(std::get<0>(states("zero3", 1)) == Approx(16 * (dense + experts) / 16).epsilon(1e-9));
  CHECK(std::get<0>(states("zero3", 2)) == Approx(16 * dense / 16 + 16 * (experts / 2) / 8).epsilon(1e-9));
}
