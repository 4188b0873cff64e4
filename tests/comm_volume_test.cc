// Communication bytes summed over the IR against the closed forms of docs/model_math.md and the ZeRO paper (ring, bf16
// gradients): DDP sends 2(D-1)/D · 2Ψ per GPU; ZeRO-1/2 the same (reduce-scatter G + all-gather P); ZeRO-3 1.5x DDP;
// with M micro-batches, states sharded finer than the optimizer talk every micro-batch.
#include "tests/test_util.h"

#include <set>

#include "shared/cost/collective_cost.h"

using namespace hzp;
using namespace hzp::test;

namespace {

// Bytes one GPU sends, summed over rank `rank`'s program.
double bytes_sent(const Built& b, int rank = 0) {
  double total = 0;
  for (const Op& op : b.schedule.program_of(rank).ops)
    if (const auto* c = std::get_if<CollectiveOp>(&op.body))
      total += collective_bytes_sent(c->kind, static_cast<double>(c->bytes),
                                     static_cast<int>(b.schedule.group_of(rank, c->role).ranks.size()));
  return total;
}

// The IR dump of a scenario's schedule without the policy name: equal dumps = the same schedule.
std::string ir_of(const nlohmann::json& doc) {
  Schedule s = build(scenario_from(doc)).schedule;
  s.policy = Policy::kCustom;
  return dump_schedule(s, -1);
}

}  // namespace

TEST_CASE("one micro-batch: DDP = ZeRO-1 = ZeRO-2 = 2(D-1)/D·2Ψ and ZeRO-3 = 1.5x", "[comm]") {
  for (int nodes : {1, 2, 16}) {
    const double D = 8.0 * nodes;
    auto run = [&](const char* policy) {
      return build(scenario_from(scenario_json("llama2-7b", "dgx-h100", nodes, policy, 4096)));
    };
    const Built ddp = run("ddp");
    const double psi = static_cast<double>(ddp.cost.params);
    const double ddp_closed = 2 * (D - 1) / D * 2 * psi;
    INFO("nodes " << nodes);
    // Per-bucket integer division of odd-sized shards loses at most a few bytes per bucket.
    CHECK(bytes_sent(ddp) == Approx(ddp_closed).epsilon(1e-6));
    CHECK(bytes_sent(run("zero1")) == Approx(ddp_closed).epsilon(1e-6));
    CHECK(bytes_sent(run("zero2")) == Approx(ddp_closed).epsilon(1e-6));
    CHECK(bytes_sent(run("zero3")) == Approx(1.5 * ddp_closed).epsilon(1e-6));
  }
}

TEST_CASE("gradient accumulation: sharded gradients reduce every micro-batch, replicated ones once", "[comm]") {
  const int nodes = 4;
  const double D = 32, M = 4;
  auto run = [&](const char* policy) {
    return build(scenario_from(scenario_json("llama2-7b", "dgx-a100", nodes, policy, 2048, 32 * 4)));
  };
  const Built ddp = run("ddp");
  REQUIRE(ddp.scenario.grad_accum_steps() == 4);
  const double psi = static_cast<double>(ddp.cost.params);
  const double pass = (D - 1) / D * 2 * psi;  // one reduce-scatter or all-gather of all bf16 params/grads
  CHECK(bytes_sent(ddp) == Approx(2 * pass).epsilon(1e-6));                 // all-reduce on the last micro-batch
  CHECK(bytes_sent(run("zero1")) == Approx(2 * pass).epsilon(1e-6));        // RS once + refresh AG
  CHECK(bytes_sent(run("zero2")) == Approx((M + 1) * pass).epsilon(1e-6));  // RS every micro-batch + AG
  CHECK(bytes_sent(run("zero3")) == Approx(3 * M * pass).epsilon(1e-6));    // AG fwd + AG bwd + RS each
}

TEST_CASE("HSDP: intra-node ZeRO-3 traffic plus a cross-node all-reduce of the shard", "[comm]") {
  const int nodes = 4;
  const double R = 8, N = nodes;
  const Built b = build(scenario_from(scenario_json("llama2-7b", "a800", nodes, "hsdp", 4096)));
  const double psi = static_cast<double>(b.cost.params);
  const double intra = 3 * (R - 1) / R * 2 * psi;      // AG fwd + AG bwd + RS inside the node
  const double inter = 2 * (N - 1) / N * 2 * psi / R;  // ring all-reduce of a 1/R shard across N nodes
  CHECK(bytes_sent(b) == Approx(intra + inter).epsilon(1e-6));
}

TEST_CASE("hierarchical ZeRO on one node is flat ZeRO-3", "[comm][equivalence]") {
  CHECK(ir_of(scenario_json("tiny-dense", "dgx-a100", 1, "hsdp", 64)) ==
        ir_of(scenario_json("tiny-dense", "dgx-a100", 1, "zero3", 64)));
}

TEST_CASE("expert parallelism: four all-to-alls per MoE layer per micro-batch, on the EP group", "[comm][moe]") {
  nlohmann::json doc = scenario_json("mixtral-8x7b", "dgx-h100", 2, "zero3", 4096, 16 * 2);
  doc["policy"]["expert_parallel"] = 8;
  const Built b = build(scenario_from(doc));
  int a2a = 0;
  for (const Op& op : b.schedule.programs[0].ops)
    if (const auto* c = std::get_if<CollectiveOp>(&op.body); c && c->kind == CollectiveKind::kAllToAll) {
      ++a2a;
      // Every token's hidden state goes to its top-2 experts: b·s·k·h bf16 values.
      CHECK(c->bytes == 1LL * 4096 * 2 * 4096 * 2);
      CHECK(b.schedule.group_of(0, c->role).ranks == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
      CHECK(op.stream == 0);
    }
  CHECK(a2a == 4 * 32 * 2);
}

TEST_CASE("ZeRO++ hpZ: backward all-gathers stay inside the node", "[comm][zeropp]") {
  const int nodes = 4;
  const double R = 8, D = 32;
  const Built b = build(scenario_from(scenario_json("llama2-7b", "a800", nodes, "zeropp", 4096)));
  const double psi = static_cast<double>(b.cost.params);
  // forward AG over D + reduce-scatter over D + backward AG over the node's R GPUs.
  const double expected = 2 * (D - 1) / D * 2 * psi + (R - 1) / R * 2 * psi;
  CHECK(bytes_sent(b) == Approx(expected).epsilon(1e-6));
  const MemoryBreakdown m = memory_per_gpu(b.scenario, b.cost, b.schedule);
  CHECK(m.params + m.grads + m.optimizer == Approx(16 * psi / D + 2 * psi / R).epsilon(1e-12));
}

TEST_CASE("ZeRO++ on one node is ZeRO-3 (the secondary copy would be the primary)", "[comm][zeropp][equivalence]") {
  CHECK(ir_of(scenario_json("tiny-dense", "dgx-a100", 1, "zeropp", 64)) ==
        ir_of(scenario_json("tiny-dense", "dgx-a100", 1, "zero3", 64)));
}

TEST_CASE("AsyncHZP with its async features off is the same sharding run synchronously", "[asynchzp][equivalence]") {
  auto synchronous = [](const char* policy) {
    nlohmann::json doc = scenario_json("tiny-dense", "dgx-a100", 2, policy, 64, 16 * 2);
    doc["policy"]["sharding"] = {{"params", {8, 1}}, {"grads", {8, 1}}, {"optimizer", {8, 2}}};
    doc["policy"]["overlap"] = {{"separate_streams", false}, {"prefetch_depth", 0}};
    return doc;
  };
  CHECK(ir_of(synchronous("asynchzp")) == ir_of(synchronous("amsp")));
  // With them on, the refresh runs on its own stream, beside the gathers, reduce-scatters and sync.
  nlohmann::json doc = scenario_json("tiny-dense", "dgx-a100", 2, "asynchzp", 64, 16 * 2);
  const Built on = build(scenario_from(doc));
  CHECK(on.scenario.policy.sharding.params == ShardGroup{8, 1});
  CHECK(on.scenario.policy.sharding.optimizer == ShardGroup{8, 2});
  CHECK(std::find(on.schedule.streams.begin(), on.schedule.streams.end(), StreamKind::kParamRefresh) !=
        on.schedule.streams.end());
}

TEST_CASE("amsp with every group = the data-parallel group is zero3", "[equivalence]") {
  nlohmann::json doc = scenario_json("tiny-dense", "dgx-a100", 2, "amsp", 64, 16 * 2);
  doc["policy"]["sharding"] = {{"params", {8, 2}}, {"grads", {8, 2}}, {"optimizer", {8, 2}}};
  CHECK(ir_of(doc) == ir_of(scenario_json("tiny-dense", "dgx-a100", 2, "zero3", 64, 16 * 2)));
}

TEST_CASE("InternEvo's ZeRO-1: all-reduce of the gradients + one broadcast per owner = 1.5x DDP", "[comm][framework]") {
  for (int nodes : {2, 64}) {
    const double D = 8.0 * nodes;
    nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", nodes, "zero1", 4096);
    const Built ddp = build(scenario_from(scenario_json("llama2-7b", "dgx-a100", nodes, "ddp", 4096)));
    doc["policy"]["comm"] = {{"framework", "internevo"}};
    const Built internevo = build(scenario_from(doc));
    const double psi = static_cast<double>(ddp.cost.params);
    INFO("nodes " << nodes);
    // AR 2(D-1)/D·2Ψ + broadcasts (D-1)/D·2Ψ (each owner's share forwarded around the ring once).
    CHECK(bytes_sent(internevo) == Approx(3 * (D - 1) / D * 2 * psi).epsilon(1e-6));
    CHECK(bytes_sent(internevo) == Approx(1.5 * bytes_sent(ddp)).epsilon(1e-6));
    // Owners hold whole tensors: LLaMA-2 7B has 32 x (4 attention + 3 MLP weights + 2 norms) + embedding +
    // head + final norm = 291, so at most 291 broadcasts, each from a different member.
    int broadcasts = 0;
    std::set<int> roots;
    for (const Op& op : internevo.schedule.program_of(0).ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body); c && c->kind == CollectiveKind::kBroadcast) {
        ++broadcasts;
        roots.insert(c->root);
        CHECK(c->purpose == CollectivePurpose::kRefreshParams);
        CHECK(internevo.schedule.group_of(0, c->role).ranks.size() == static_cast<std::size_t>(D));
      }
    CHECK(broadcasts == std::min(static_cast<int>(D), 291));
    CHECK(roots.size() == static_cast<std::size_t>(broadcasts));
  }
}

TEST_CASE("gradients reduced in fp32 move and hold twice the gradient bytes, in the same buckets",
          "[comm][framework]") {
  for (int nodes : {1, 4}) {
    const double D = 8.0 * nodes;
    INFO("nodes " << nodes);
    const nlohmann::json ddp_doc = scenario_json("llama2-7b", "dgx-a100", nodes, "ddp", 4096);
    const Built ddp = build(scenario_from(ddp_doc));
    const double psi = static_cast<double>(ddp.cost.params);
    nlohmann::json doc = ddp_doc;
    doc["policy"]["comm"] = {{"grad_reduce_in_fp32", true}};
    const Built fp32 = build(scenario_from(doc));
    // DDP's all-reduce: 2(D-1)/D of 4 bytes per parameter instead of 2.
    CHECK(bytes_sent(fp32) == Approx(2 * (D - 1) / D * 4 * psi).epsilon(1e-6));
    CHECK(fp32.schedule.buckets.size() == ddp.schedule.buckets.size());
    CHECK(fp32.schedule.state_bytes[0].grads == Approx(2 * ddp.schedule.state_bytes[0].grads));
    CHECK(fp32.schedule.state_bytes[0].params == Approx(ddp.schedule.state_bytes[0].params));
    // Megatron's distributed optimizer under bf16: reduce-scatter of fp32 gradients (D-1)/D·4Ψ, all-gather of
    // the bf16 parameters (D-1)/D·2Ψ.
    doc = scenario_json("llama2-7b", "dgx-a100", nodes, "zero1", 4096);
    doc["policy"]["comm"] = {{"framework", "megatron"}};
    const Built megatron = build(scenario_from(doc));
    REQUIRE(megatron.scenario.policy.comm.grad_reduce_in_fp32);
    CHECK(bytes_sent(megatron) == Approx((D - 1) / D * 6 * psi).epsilon(1e-6));
    // Megatron-LM's docs/source/api-guide/dist_optimizer.md: "bf16 param, fp32 grads" take 6 + 12/d bytes
    // per parameter with the distributed optimizer.
    const StateBytesPerRank& states = megatron.schedule.state_bytes[0];
    CHECK(states.params + states.grads + states.optimizer == Approx((6 + 12 / D) * psi).epsilon(1e-9));
  }
}

TEST_CASE("DeepSpeed's ZeRO-3: one all-gather per large tensor, the same bytes as one per unit", "[comm][framework]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 2, "zero3", 4096);
  const Built unit = build(scenario_from(doc));
  doc["policy"]["comm"] = {{"framework", "deepspeed"}};
  const Built tensor = build(scenario_from(doc));
  CHECK(bytes_sent(tensor) == Approx(bytes_sent(unit)).epsilon(1e-9));
  auto gathers = [](const Built& b, int unit_index) {
    int n = 0;
    for (const Op& op : b.schedule.program_of(0).ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body);
          c && c->purpose == CollectivePurpose::kGatherParams && c->unit == unit_index)
        ++n;
    return n;
  };
  // A LLaMA layer: q, k, v, o and gate, up, down are large; its two norms (4096 elements) stay resident.
  const int layer_unit = unit_of_layer(5);
  CHECK(gathers(tensor, layer_unit) == 7 * gathers(unit, layer_unit));
  CHECK(unit.cost.modules[1].large_tensors + unit.cost.modules[2].large_tensors == 7);
  // Latency grows with the collectives' count; bandwidth does not: never faster.
  CHECK(estimate_of(tensor).step_time_s >= estimate_of(unit).step_time_s);
}
