// ND parallelism (policy.parallel): the scenario's rules, Megatron's rank placement, the per-GPU math
// against the closed forms of Shoeybi et al. 2019 and Korthikanti et al. 2022, and the pipeline schedules
// against Narayanan et al. 2021 (warm-up, micro-batches in flight, bubble fraction).
#include <algorithm>

#include "shared/schedule/sharding.h"
#include "tests/test_util.h"

using namespace hzp;
using namespace hzp::test;

namespace {

nlohmann::json nd_json(const std::string& model, int nodes, const std::string& policy, nlohmann::json parallel,
                       long long global_sequences) {
  nlohmann::json doc = scenario_json(model, "dgx-a100", nodes, policy, 2048, global_sequences);
  doc["policy"]["parallel"] = std::move(parallel);
  return doc;
}

std::string parse_error(const nlohmann::json& doc) {
  auto s = parse_scenario(doc, "test");
  return s.ok() ? "" : s.status().message();
}

// Peak of (forward passes - backward passes) of model chunks in a stage's program: micro-batches in flight.
int chunks_in_flight(const Schedule& s, int program, int layers_per_chunk) {
  int live = 0, peak = 0;
  for (const Op& op : s.programs[program].ops)
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      if (c->layer < 0 || c->layer % layers_per_chunk != 0 || c->module != ModuleKind::kAttention) continue;
      if (c->phase == Phase::kForward) ++live;
      if (c->phase == Phase::kBackward) --live;
      peak = std::max(peak, live);
    }
  return peak;
}

}  // namespace

TEST_CASE("policy.parallel resolves the mesh and lays the ZeRO presets over the data axis", "[nd]") {
  // 4 nodes x 8 GPUs, tensor 4 x pipeline 2: data = 32 / 8 = 4, two data ranks per node, a stage per 2 nodes.
  const Scenario s = scenario_from(nd_json("llama2-7b", 4, "zero3", {{"tensor", 4}, {"pipeline", 2}}, 64));
  const ParallelMesh m = s.mesh;
  CHECK(m.data == 4);
  CHECK(m.tensor == 4);
  CHECK(m.pipeline == 2);
  CHECK(s.grad_accum_steps() == 16);
  CHECK(s.policy.sharding.params == ShardGroup{2, 2});  // every data rank: 2 per node x 2 nodes
  // The resolved form parses back to the same scenario.
  const Scenario again = scenario_from(scenario_to_json(s));
  CHECK(again.policy.parallel == s.policy.parallel);
  CHECK(again.policy.sharding == s.policy.sharding);
}

TEST_CASE("policy.parallel errors name the field and the rule", "[nd]") {
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"tensor", 3}}, 64)).find("policy.parallel.tensor") == 0);
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"tensor", 16}}, 64)).find("policy.parallel.tensor") == 0);
  CHECK(parse_error(nd_json("llama-30b", 1, "zero1", {{"tensor", 8}}, 64)).find("model.heads") !=
        std::string::npos);  // 52 heads
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"pipeline", 3}}, 64)).find("policy.parallel.pipeline") == 0);
  CHECK(parse_error(nd_json("llama2-7b", 4, "zero1", {{"pipeline", 4}, {"virtual_stages", 3}}, 64))
            .find("policy.parallel.virtual_stages") == 0);  // 32 layers
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"virtual_stages", 2}}, 64))
            .find("policy.parallel.virtual_stages: needs pipeline > 1") == 0);
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"sequence_parallel", true}}, 64))
            .find("policy.parallel.sequence_parallel") == 0);
  // Context groups tile the replica axis (16 GPUs, tensor 1 here) and 2 x context divides the sequence.
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"context", 3}}, 64)).find("policy.parallel.context") == 0);
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"context", 32}}, 64)).find("policy.parallel.context") == 0);
  {
    nlohmann::json doc = nd_json("llama2-7b", 2, "zero1", {{"context", 16}}, 64);
    doc["training"]["seq_len"] = 2000;  // 2000 % 32 != 0
    CHECK(parse_error(doc).find("policy.parallel.context: 2 x context must divide training.seq_len (2000)") == 0);
  }
  // Interleaving runs micro-batches in groups of `pipeline`: 2 nodes, pipeline 2 -> data 8, 24 / 8 = 3.
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"pipeline", 2}, {"virtual_stages", 2}}, 24))
            .find("multiple of pipeline") != std::string::npos);
  // The whole schedule is bounded: 8 stages x 4096 micro-batches x (32 layers + 2 x 8) unit passes.
  CHECK(parse_error(nd_json("llama2-7b", 8, "ddp", {{"pipeline", 8}}, 8 * 4096)).find("unit passes") !=
        std::string::npos);
  // The global batch is counted against the data axis: 2 nodes, tensor 8 -> data 2.
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"tensor", 8}}, 3)).find("data-parallel size (2)") !=
        std::string::npos);
}

TEST_CASE("ranks follow Megatron's order: tensor inside the node, then data, then pipeline", "[nd]") {
  const Built b = build(scenario_from(nd_json("llama2-7b", 4, "zero3", {{"tensor", 4}, {"pipeline", 2}}, 64)));
  const Schedule& s = b.schedule;
  const int tensor = s.role_index(GroupRole::kTensor);
  const int shard = s.role_index(GroupRole::kParamShard);
  REQUIRE(tensor >= 0);
  for (int r = 0; r < 32; ++r) {
    const ProcessGroup& t = s.group_of(r, tensor);
    CHECK(t.intra_node);
    CHECK(t.ranks.front() == r / 4 * 4);
    CHECK(s.rank_program[r] == r / 16);  // stage = rank / (tensor x data)
    // The data-parallel group: same tensor index and stage, data ranks 0..3.
    std::vector<int> data = s.group_of(r, shard).ranks;
    std::sort(data.begin(), data.end());
    const int base = r % 4 + r / 16 * 16;
    CHECK(data == std::vector<int>{base, base + 4, base + 8, base + 12});
  }
  // Pipeline links pair the same (tensor, data) coordinate of consecutive stages, sender first.
  const ProcessGroup& act = s.group_of(5, s.role_index(GroupRole::kPipeActEven));
  CHECK(act.ranks == std::vector<int>{5, 21});
  const ProcessGroup& grad = s.group_of(21, s.role_index(GroupRole::kPipeGradEven));
  CHECK(grad.ranks == std::vector<int>{21, 5});
}

TEST_CASE("tensor-parallel parameters and FLOPs per GPU follow Megatron's split", "[nd]") {
  const double h = 4096, f = 11008, V = 32000;
  for (int t : {1, 2, 4, 8}) {
    INFO("tensor " << t);
    const Scenario s = scenario_from(nd_json("llama2-7b", 1, "ddp", {{"tensor", t}}, 8 / t));
    const ModelCost c = scenario_cost(s);
    const ModelCost whole = model_cost(s.model, s.training);
    // Norms stay replicated; every matrix (vocabulary-parallel embedding and head included) is split.
    CHECK(c.modules[0].params == static_cast<std::int64_t>(V * h / t));
    CHECK(c.modules[1].params == static_cast<std::int64_t>(h + 4 * h * h / t));
    CHECK(c.modules[2].params == static_cast<std::int64_t>(h + 3 * h * f / t));
    CHECK(c.modules.back().params == static_cast<std::int64_t>(h + V * h / t));
    CHECK(c.model_flops == Approx(whole.model_flops / t).epsilon(1e-12));
    CHECK(c.model_flops == Approx(model_flops_formula(s.model, 1, 2048) / t).epsilon(1e-9));
  }
}

TEST_CASE("activations per layer follow Korthikanti et al. Table 2, with and without dropout", "[nd]") {
  // GPT layer, no flash attention, bf16: sbh(34 + 5as/h) in the paper, which has dropout; without its dropout
  // masks (sbh for each block's output, as²b + 2as²b for the attention's) sbh(32 + 2as/h). Tensor parallelism
  // splits all but the norms' inputs, the first matmuls' inputs and the blocks' dropout masks (8sbh, 10sbh
  // with dropout); sequence parallelism splits those too.
  const double s = 2048, b = 1, h = 12288, a = 96;
  auto per_layer = [&](int t, bool sp, const char* recompute, double dropout) {
    nlohmann::json doc = nd_json("gpt3-175b", 1, "ddp", {{"tensor", t}, {"sequence_parallel", sp}}, 8 / t);
    doc["training"]["flash_attention"] = false;
    doc["training"]["recompute"] = recompute;
    doc["training"]["attention_dropout"] = dropout;
    doc["training"]["hidden_dropout"] = dropout;
    const ModelCost c = scenario_cost(scenario_from(doc));
    return c.modules[1].activation_bytes + c.modules[2].activation_bytes;  // layer 0: attention + MLP
  };
  const double sbh = s * b * h;
  for (const bool dropout : {false, true}) {
    INFO("dropout " << dropout);
    const double p = dropout ? 0.1 : 0;
    const double whole = dropout ? 34 : 32, kept = dropout ? 10 : 8, quadratic = (dropout ? 5 : 2) * a * s / h;
    for (int t : {2, 4, 8}) {
      INFO("tensor " << t);
      CHECK(per_layer(t, false, "none", p) == Approx(sbh * (kept + 24.0 / t + quadratic / t)).epsilon(1e-12));
      CHECK(per_layer(t, true, "none", p) == Approx(sbh * (whole + quadratic) / t).epsilon(1e-12));
      CHECK(per_layer(t, false, "selective", p) == Approx(sbh * (kept + 24.0 / t)).epsilon(1e-12));
      CHECK(per_layer(t, true, "selective", p) == Approx(sbh * whole / t).epsilon(1e-12));
      CHECK(per_layer(t, false, "full", p) == Approx(2 * sbh).epsilon(1e-12));
    }
    CHECK(per_layer(1, false, "none", p) == Approx(sbh * (whole + quadratic)).epsilon(1e-12));
  }
}

TEST_CASE("1F1B keeps pipeline - stage micro-batches in flight, interleaving 2(p-s-1) + (v-1)p + 1 chunks", "[nd]") {
  const int p = 4;
  for (int v : {1, 2}) {
    INFO("virtual stages " << v);
    // 4 nodes x 8 GPUs, tensor 8, pipeline 4 -> data 1; 8 micro-batches.
    const Built b = build(
        scenario_from(nd_json("llama2-7b", 4, "ddp", {{"tensor", 8}, {"pipeline", p}, {"virtual_stages", v}}, 8)));
    REQUIRE(b.schedule.programs.size() == p);
    const int m = 8, layers_per_chunk = 32 / (p * v);
    for (int stage = 0; stage < p; ++stage) {
      INFO("stage " << stage);
      const int expected = v == 1 ? std::min(p - stage, m) : std::min(2 * (p - stage - 1) + (v - 1) * p + 1, m * v);
      CHECK(chunks_in_flight(b.schedule, stage, layers_per_chunk) == expected);
    }
    // Memory: stage 0 peaks with its in-flight chunks' activations (Korthikanti §4.2.3: L layers' worth
    // for 1F1B, times 1 + (p - 1) / (p·v) interleaved).
    const double layer = b.cost.modules[1].activation_bytes + b.cost.modules[2].activation_bytes;
    const double expected_layers = v == 1 ? 32 : 32 * (1 + (p - 1.0) / (p * v));
    const MemoryBreakdown stage0 = memory_of_program(b.cost, b.schedule, 0);
    CHECK(stage0.activations - b.cost.transient_bytes ==
          Approx(expected_layers * layer + b.cost.modules[0].activation_bytes).epsilon(1e-9));
  }
}

TEST_CASE("interleaved pipelines build under every ZeRO preset: a gradient bucket never spans two chunks", "[nd]") {
  // ZeRO-2 took a bucket's reduce slot again in the other chunk's backward before its reduction freed it
  // ("acquires grad_reduce slot 0 still held"): the Grok-1-like recipe failed `hzp plan` with exit 1.
  for (const char* model : {"tiny-dense", "tiny-moe"})
    for (const char* preset : {"ddp", "zero1", "zero2", "zero3", "hsdp", "asynchzp"}) {
      INFO(model << " " << preset);
      nlohmann::json doc = nd_json(model, 1, preset, {{"pipeline", 2}, {"virtual_stages", 2}}, 16);
      doc["model"]["layers"] = 4;
      doc["training"]["seq_len"] = 64;
      if (std::string(model) == "tiny-moe") doc["policy"]["expert_parallel"] = 2;
      const Compiled b = build(scenario_from(doc));
      // 4 layers in 4 chunks: the embedding (unit 0) and layer 0 in chunk 0, layer i in chunk i, the head
      // (unit 5) in chunk 3.
      const auto chunk_of = [](int unit) { return unit == 0 ? 0 : std::min(unit - 1, 3); };
      for (const GradBucket& bucket : b.schedule.buckets)
        for (int unit : bucket.units) CHECK(chunk_of(unit) == chunk_of(bucket.units.front()));
    }
}

TEST_CASE("the pipeline bubble is (p-1)/(m+p-1), and (p-1)/(v·m+p-1) interleaved, on an idle network", "[nd]") {
  const int p = 4, m = 8;
  for (int v : {1, 2}) {
    INFO("virtual stages " << v);
    const Built b = build(scenario_from(idle_pipeline_json(p, v, m)));
    const Estimate e = estimate_of(b);
    // Stage 0 runs the first forward and the last backward: its span is the pipeline's.
    double busy = 0, last_backward = 0;
    const std::vector<Op>& ops = b.schedule.programs[0].ops;
    for (std::size_t i = 0; i < ops.size(); ++i)
      if (const auto* c = std::get_if<ComputeOp>(&ops[i].body)) {
        busy += e.timings[i].end - e.timings[i].start;
        if (c->phase == Phase::kBackward) last_backward = std::max(last_backward, e.timings[i].end);
      }
    const double bubble = 1 - busy / last_backward;
    CHECK(bubble == Approx((p - 1.0) / (v * m + p - 1.0)).epsilon(0.01));
  }
}

TEST_CASE("the validator catches pipeline transfers issued out of order", "[nd]") {
  Built b = build(scenario_from(idle_pipeline_json(2, 1, 4)));
  // Stage 0 sends micro-batch 1's activations where stage 1 expects micro-batch 0's.
  for (Op& op : b.schedule.programs[0].ops)
    if (auto* c = std::get_if<CollectiveOp>(&op.body); c && c->purpose == CollectivePurpose::kPipeActivations) {
      c->micro_batch = 1;
      break;
    }
  const Status st = validate_schedule(b.schedule);
  REQUIRE_FALSE(st.ok());
  CHECK(st.message().find("deadlock") != std::string::npos);
  CHECK(st.message().find("pipe_act_even") != std::string::npos);
}

TEST_CASE("the Megatron scenarios have Megatron-LM Table 1's parameter counts", "[nd]") {
  // Narayanan et al. 2021, Table 1 (billions, one decimal), from its Eq. 2 with V = 51 200, s = 2048.
  const std::pair<const char*, double> rows[] = {
      {"1.7b", 1.7},   {"3.6b", 3.6},     {"7.5b", 7.5},     {"18.4b", 18.4},   {"39.1b", 39.1},
      {"76.1b", 76.1}, {"145.6b", 145.6}, {"310.1b", 310.1}, {"529.6b", 529.6}, {"1008b", 1008.0}};
  for (const auto& [name, billions] : rows) {
    INFO(name);
    auto s = load_scenario_file(std::string(HZP_SOURCE_DIR) + "/scenarios/papers/megatron-gpt-" + name + ".json");
    REQUIRE(s.ok());
    CHECK(static_cast<double>(parameter_count(s->model)) / 1e9 == Approx(billions).margin(0.051));
  }
}

TEST_CASE("pipelines validate on one stream too: receives keep their own streams", "[nd]") {
  nlohmann::json doc = idle_pipeline_json(4, 2, 8);
  doc["policy"]["overlap"] = {{"separate_streams", false}};
  const Built b = build(scenario_from(doc));  // fails on a deadlock
  CHECK(b.schedule.role_index(GroupRole::kPipeActWrap) >= 0);
  CHECK(estimate_of(b).step_time_s > 0);
}

TEST_CASE("context parallelism: ranks tensor, context, data, with states sharded over data x context", "[nd]") {
  // 2 nodes x 8 GPUs, tensor 2, context 2: the replica axis has 8 ranks (4 per node), data = 4.
  const Built b = build(scenario_from(nd_json("llama2-7b", 2, "zero3", {{"tensor", 2}, {"context", 2}}, 64)));
  const Scenario& sc = b.scenario;
  const ParallelMesh m = sc.mesh;
  CHECK(m.data == 4);
  CHECK(m.context == 2);
  CHECK(sc.grad_accum_steps() == 16);                    // 64 sequences over 4 data replicas
  CHECK(sc.policy.sharding.params == ShardGroup{4, 2});  // every replica-axis rank: 4 per node x 2 nodes
  CHECK(scenario_from(scenario_to_json(sc)).policy.parallel == sc.policy.parallel);
  const Schedule& s = b.schedule;
  const int context = s.role_index(GroupRole::kContext), shard = s.role_index(GroupRole::kParamShard);
  REQUIRE(context >= 0);
  for (int r = 0; r < 16; ++r) {
    INFO("rank " << r);
    CHECK(m.tensor_rank(r) == r % 2);
    CHECK(m.context_rank(r) == r / 2 % 2);
    CHECK(m.data_rank(r) == r / 4);
    const int first = r - 2 * m.context_rank(r);
    CHECK(s.group_of(r, context).ranks == std::vector<int>{first, first + 2});
    CHECK(s.group_of(r, context).intra_node);
    std::vector<int> replicas = s.group_of(r, shard).ranks;  // same tensor index, every context and data rank
    std::sort(replicas.begin(), replicas.end());
    std::vector<int> expected;
    for (int k = 0; k < 8; ++k) expected.push_back(r % 2 + 2 * k);
    CHECK(replicas == expected);
  }
}

TEST_CASE("context parallelism divides FLOPs and activations by context and all-gathers keys and values", "[nd]") {
  // GPT-3 175B layer, no flash attention: this GPU keeps s / c tokens, so Korthikanti's sbh(32 + 2as/h)
  // (without dropout) becomes sbh(32 + 2as/h) / c: the s x s scores shrink to its s / c query rows.
  const double s = 2048, b = 1, h = 12288, a = 96;
  const double sbh = s * b * h, quadratic = 2 * a * s / h;
  nlohmann::json base = nd_json("gpt3-175b", 1, "ddp", nlohmann::json::object(), 8);
  base["training"]["flash_attention"] = false;
  const ModelCost whole = scenario_cost(scenario_from(base));
  for (int c : {2, 4, 8}) {
    INFO("context " << c);
    nlohmann::json doc = base;
    doc["policy"]["parallel"] = {{"context", c}};
    const ModelCost cost = scenario_cost(scenario_from(doc));
    CHECK(cost.modules[1].activation_bytes + cost.modules[2].activation_bytes ==
          Approx(sbh * (32 + quadratic) / c).epsilon(1e-12));
    CHECK(cost.model_flops == Approx(whole.model_flops / c).epsilon(1e-12));
    CHECK(cost.modules[1].bwd_flops == Approx(whole.modules[1].bwd_flops / c).epsilon(1e-12));
    CHECK(cost.params == whole.params);  // replicated over the context group
  }
  // The exchange: per layer and micro-batch, one all-gather of the sequence's K and V (2·b·s·n_kv·d_head
  // elements of this tensor rank's heads) forward; an all-gather and a reduce-scatter of their gradients
  // backward; full recomputation repeats the forward's.
  for (const char* recompute : {"none", "full"}) {
    INFO("recompute " << recompute);
    nlohmann::json doc = nd_json("llama2-7b", 1, "zero1", {{"tensor", 2}, {"context", 4}}, 2);
    doc["training"]["recompute"] = recompute;
    const Built built = build(scenario_from(doc));
    const std::int64_t kv_bytes = 1 * 2048 * 2 * (32 / 2) * 128 * 2;
    int forward = 0, backward_gather = 0, backward_reduce = 0;
    for (const Op& op : built.schedule.programs[0].ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
        if (c->purpose != CollectivePurpose::kContextForward && c->purpose != CollectivePurpose::kContextBackward)
          continue;
        CHECK(c->bytes == kv_bytes);
        CHECK(built.schedule.streams[op.stream] == StreamKind::kContext);
        const bool fwd = c->purpose == CollectivePurpose::kContextForward;
        if (fwd) CHECK(c->kind == CollectiveKind::kAllGather);
        forward += fwd;
        backward_gather += !fwd && c->kind == CollectiveKind::kAllGather;
        backward_reduce += !fwd && c->kind == CollectiveKind::kReduceScatter;
      }
    const int passes = 32 * 2;  // layers x micro-batches (2 sequences, data 8 / (2 x 4) = 1)
    CHECK(forward == passes * (std::string(recompute) == "full" ? 2 : 1));
    CHECK(backward_gather == passes);
    CHECK(backward_reduce == passes);
  }
}

TEST_CASE("context parallelism's exchange overlaps attention: free on an idle network, hidden where it fits", "[nd]") {
  // One node of 8 GPUs, fast links: context 2 and 4 split each sequence but keep the per-GPU work of a
  // step (half the tokens, twice the micro-batches), so the step takes as long as without.
  nlohmann::json idle = nd_json("llama2-7b", 1, "ddp", nlohmann::json::object(), 16);
  idle["cluster"]["intra_node"] = {{"bandwidth_GBps", 1e5}, {"latency_us", 0}};
  const double alone = estimate_of(build(scenario_from(idle))).step_time_s;
  for (int c : {2, 4}) {
    INFO("context " << c);
    nlohmann::json doc = idle;
    doc["policy"]["parallel"] = {{"context", c}};
    CHECK(estimate_of(build(scenario_from(doc))).step_time_s == Approx(alone).epsilon(0.01));
  }
  // Real links, long sequences: the exchange runs beside the attention, so a step is faster with the
  // context stream than with everything on the compute stream.
  nlohmann::json doc = nd_json("llama2-7b", 1, "ddp", {{"context", 8}}, 1);
  doc["training"]["seq_len"] = 32768;
  const double overlapped = estimate_of(build(scenario_from(doc))).step_time_s;
  doc["policy"]["overlap"] = {{"separate_streams", false}};
  const double serial = estimate_of(build(scenario_from(doc))).step_time_s;
  CHECK(overlapped < serial);
}

TEST_CASE("tensor_comm_overlap: its rule, the same traffic on the tensor stream, less exposed", "[nd]") {
  nlohmann::json doc = nd_json("llama2-7b", 1, "zero1", {{"tensor", 4}, {"tensor_comm_overlap", true}}, 16);
  CHECK(parse_error(doc).find("policy.parallel.tensor_comm_overlap: needs sequence_parallel") == 0);
  doc["policy"]["parallel"]["sequence_parallel"] = true;
  // Its stream is one of its own: with every collective on the compute stream it would silently override
  // separate_streams (issue 35's tenth attack).
  doc["policy"]["overlap"] = {{"separate_streams", false}};
  CHECK(parse_error(doc).find("policy.parallel.tensor_comm_overlap: needs policy.overlap.separate_streams") == 0);
  doc["policy"].erase("overlap");
  const Built on = build(scenario_from(doc));
  CHECK(scenario_to_json(on.scenario)["policy"]["parallel"]["tensor_comm_overlap"] == true);
  doc["policy"]["parallel"]["tensor_comm_overlap"] = false;
  const Built off = build(scenario_from(doc));
  // Per program: the tensor collectives' bytes are the same (each reduce-scatter split in two), some of them
  // now on the tensor stream; nothing else changes. (Sequence parallelism's backward re-gathers run there
  // either way: counted apart, by their activations payload in backward.)
  auto tensor_traffic = [](const Schedule& s, bool on_tensor_stream) {
    double bytes = 0;
    for (const Op& op : s.programs[0].ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
        const bool regather = c->purpose == CollectivePurpose::kTensorBackward && c->payload == Payload::kActivations;
        if ((c->purpose == CollectivePurpose::kTensorForward || c->purpose == CollectivePurpose::kTensorBackward) &&
            !regather && (s.streams[op.stream] == StreamKind::kTensor) == on_tensor_stream)
          bytes += static_cast<double>(c->bytes);
      }
    return bytes;
  };
  CHECK(tensor_traffic(off.schedule, true) == 0);
  CHECK(tensor_traffic(on.schedule, true) > 0.5 * tensor_traffic(off.schedule, false));
  CHECK(tensor_traffic(on.schedule, true) + tensor_traffic(on.schedule, false) ==
        Approx(tensor_traffic(off.schedule, false)).epsilon(1e-6));
  const Estimate with = estimate_of(on), without = estimate_of(off);
  CHECK(with.step_time_s < without.step_time_s);
  CHECK(with.exposed_comm_s < 0.5 * without.exposed_comm_s);
  CHECK(with.compute_s >= without.compute_s);  // compute slowed while the overlapped transfers run
}

// Megatron-LM's sequence parallelism all-gathers a column-parallel layer's input again in backward, for its
// weight gradient, overlapped with the input gradient's GEMM: per micro-batch one all-gather of b·s·h
// activations per attention and MLP block and one for the output layer, on the tensor stream (the compute
// stream where the policy keeps every collective there), and none without sequence parallelism.
TEST_CASE("sequence parallelism re-gathers each column-parallel input in backward, beside the compute", "[nd]") {
  auto regathers = [](const Built& b, StreamKind* stream) {
    int n = 0;
    for (const Op& op : b.schedule.programs[0].ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body))
        if (c->purpose == CollectivePurpose::kTensorBackward && c->payload == Payload::kActivations) {
          CHECK(c->kind == CollectiveKind::kAllGather);
          CHECK(c->bytes == 1 * 4096 * 4096 * 2);  // b·s·h in bf16, the whole sequence gathered
          *stream = b.schedule.streams[op.stream];
          ++n;
        }
    return n;
  };
  nlohmann::json doc = nd_json("llama2-7b", 1, "zero1", {{"tensor", 4}, {"sequence_parallel", true}}, 2);
  doc["training"]["seq_len"] = 4096;
  StreamKind stream = StreamKind::kCompute;
  const int micro_batches = 2 / (8 / 4);
  CHECK(regathers(build(scenario_from(doc)), &stream) == micro_batches * (2 * 32 + 1));
  CHECK(stream == StreamKind::kTensor);
  doc["policy"]["overlap"] = {{"separate_streams", false}};
  CHECK(regathers(build(scenario_from(doc)), &stream) == micro_batches * (2 * 32 + 1));
  CHECK(stream == StreamKind::kCompute);
  doc["policy"].erase("overlap");
  doc["policy"]["parallel"]["sequence_parallel"] = false;
  CHECK(regathers(build(scenario_from(doc)), &stream) == 0);
}

TEST_CASE("context parallelism by all-to-all (Ulysses): its rules, traffic and placement on the compute path", "[nd]") {
  // Rules: it needs context > 1, and context must divide each tensor rank's query and key/value heads.
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"context_comm", "all_to_all"}}, 64))
            .find("policy.parallel.context_comm: needs context > 1") == 0);
  CHECK(parse_error(nd_json("llama2-7b", 2, "zero1", {{"context", 2}, {"context_comm", "ulysses"}}, 64))
            .find("policy.parallel.context_comm: must be one of \"ring\", \"all_to_all\"") == 0);
  // LLaMA-2 70B: 8 key/value heads, 1 per rank of tensor 8; a context of 2 cannot split it.
  const std::string gqa = parse_error(
      nd_json("llama2-70b", 2, "zero1", {{"tensor", 8}, {"context", 2}, {"context_comm", "all_to_all"}}, 64));
  CHECK(gqa.find("policy.parallel.context: must divide model.kv_heads / tensor (8 / 8)") == 0);
  CHECK(parse_error(nd_json("llama2-70b", 2, "zero1", {{"tensor", 8}, {"context", 2}}, 64)).empty());  // ring can

  // Traffic: per layer and micro-batch, forward an all-to-all of Q, K, V (b·(s/c)·(n_q + 2·n_kv)·d_head of
  // this tensor rank's heads) before the core and one of its output (b·(s/c)·n_q·d_head) after; backward the
  // same two, output gradient first; full recomputation repeats the forward's. All on the compute stream,
  // over the context group; no ring exchange.
  for (const char* recompute : {"none", "full"}) {
    INFO("recompute " << recompute);
    nlohmann::json doc =
        nd_json("llama2-7b", 1, "zero1", {{"tensor", 2}, {"context", 4}, {"context_comm", "all_to_all"}}, 2);
    doc["training"]["recompute"] = recompute;
    const Built built = build(scenario_from(doc));
    const Schedule& s = built.schedule;
    const std::int64_t tokens = 1 * 2048 / 4, d = 128;
    const std::int64_t qkv = tokens * (32 + 2 * 32) / 2 * d * 2, out = tokens * 32 / 2 * d * 2;
    int fwd_qkv = 0, fwd_out = 0, bwd_qkv = 0, bwd_out = 0;
    std::vector<std::int64_t> bwd_order;
    for (const Op& op : s.programs[0].ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
        if (c->purpose != CollectivePurpose::kContextForward && c->purpose != CollectivePurpose::kContextBackward)
          continue;
        CHECK(c->kind == CollectiveKind::kAllToAll);
        CHECK(s.streams[op.stream] == StreamKind::kCompute);
        CHECK(s.group_of(0, c->role).ranks == std::vector<int>{0, 2, 4, 6});  // tensor 2: every other GPU
        const bool fwd = c->purpose == CollectivePurpose::kContextForward;
        CHECK((c->bytes == qkv || c->bytes == out));
        (fwd ? (c->bytes == qkv ? fwd_qkv : fwd_out) : (c->bytes == qkv ? bwd_qkv : bwd_out)) += 1;
        if (!fwd && bwd_order.size() < 2) bwd_order.push_back(c->bytes);
      }
    const int passes = 32 * 2;  // layers x micro-batches (2 sequences, data 8 / (2 x 4) = 1)
    const int forwards = passes * (std::string(recompute) == "full" ? 2 : 1);
    CHECK(fwd_qkv == forwards);
    CHECK(fwd_out == forwards);
    CHECK(bwd_qkv == passes);
    CHECK(bwd_out == passes);
    CHECK(bwd_order == std::vector<std::int64_t>{out, qkv});
    CHECK(s.streams.end() == std::find(s.streams.begin(), s.streams.end(), StreamKind::kContext));
  }

  // On an idle network it costs nothing: the same step as without context parallelism.
  nlohmann::json idle = nd_json("llama2-7b", 1, "ddp", nlohmann::json::object(), 16);
  idle["cluster"]["intra_node"] = {{"bandwidth_GBps", 1e5}, {"latency_us", 0}};
  const double alone = estimate_of(build(scenario_from(idle))).step_time_s;
  idle["policy"]["parallel"] = {{"context", 4}, {"context_comm", "all_to_all"}};
  CHECK(estimate_of(build(scenario_from(idle))).step_time_s == Approx(alone).epsilon(0.01));
  // The resolved form keeps it.
  const Scenario ulysses = scenario_from(idle);
  CHECK(scenario_from(scenario_to_json(ulysses)).policy.parallel == ulysses.policy.parallel);
}

TEST_CASE("tied embeddings: first and last stage all-reduce the word-embedding gradient once a step", "[nd]") {
  // 4 stages x 2 GPUs, tensor 2: the embedding pairs link rank g of stage 0 with g + 3 x 2 of stage 3.
  nlohmann::json doc = idle_pipeline_json(4, 1, 8);
  doc["model"]["tied_embeddings"] = true;
  doc["model"]["vocab"] = 1024;
  doc["cluster"]["gpus_per_node"] = 2;
  doc["policy"]["parallel"]["tensor"] = 2;
  const Built b = build(scenario_from(doc));
  const Schedule& s = b.schedule;
  const int role = s.role_index(GroupRole::kEmbedding);
  REQUIRE(role >= 0);
  for (int r = 0; r < 2; ++r) CHECK(s.group_of(r, role).ranks == std::vector<int>{r, r + 6});
  for (int stage = 0; stage < 4; ++stage) {
    INFO("stage " << stage);
    int syncs = 0;
    for (const Op& op : s.programs[stage].ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body); c && c->purpose == CollectivePurpose::kEmbeddingGrads) {
        ++syncs;
        CHECK(c->kind == CollectiveKind::kAllReduce);
        CHECK(c->bytes == 1024 * 4096 / 2 * 2);  // V·h / tensor bf16 gradients
        CHECK(c->role == role);
      }
    CHECK(syncs == (stage == 0 || stage == 3 ? 1 : 0));
  }
  CHECK(estimate_of(b).step_time_s > 0);
  // Untied: no such group.
  doc["model"]["tied_embeddings"] = false;
  CHECK(build(scenario_from(doc)).schedule.role_index(GroupRole::kEmbedding) < 0);
}
