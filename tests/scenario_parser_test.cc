// Tests for the scenario parser, the preset tables and the calibration table.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "shared/scenario/calibration.h"
#include "shared/scenario/presets.h"
#include "shared/scenario/scenario_parser.h"

#ifndef HZP_TEST_DATA_DIR
#define HZP_TEST_DATA_DIR "tests/data"
#endif

namespace hzp {
namespace {

using nlohmann::json;

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

// A valid scenario to mutate: LLaMA-2 7B, ZeRO-1, 4 x DGX-A100 (D = 32).
json base_doc() {
  return json::parse(R"({
    "model": {"preset": "llama2-7b"},
    "cluster": {"preset": "dgx-a100", "nodes": 4},
    "training": {"seq_len": 4096, "micro_batch": 1, "global_batch_sequences": 64},
    "policy": {"preset": "zero1"}
  })");
}

Scenario parse_ok(const json& doc) {
  Result<Scenario> s = parse_scenario(doc, "test");
  INFO(s.status().message());
  REQUIRE(s.ok());
  return *s;
}

std::string parse_error(const json& doc) {
  Result<Scenario> s = parse_scenario(doc, "test");
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == StatusCode::kInvalidInput);
  return s.status().message();
}

void check_same(const Scenario& a, const Scenario& b) {
  CHECK(a.name == b.name);
  const ModelSpec& m = a.model;
  const ModelSpec& n = b.model;
  CHECK(m.name == n.name);
  CHECK(m.family == n.family);
  CHECK(m.layers == n.layers);
  CHECK(m.hidden == n.hidden);
  CHECK(m.heads == n.heads);
  CHECK(m.kv_heads == n.kv_heads);
  CHECK(m.ffn_hidden == n.ffn_hidden);
  CHECK(m.mlp == n.mlp);
  CHECK(m.vocab == n.vocab);
  CHECK(m.tied_embeddings == n.tied_embeddings);
  CHECK(m.position == n.position);
  CHECK(m.max_positions == n.max_positions);
  CHECK(m.has_moe == n.has_moe);
  CHECK(m.moe.experts == n.moe.experts);
  CHECK(m.moe.top_k == n.moe.top_k);
  CHECK(m.moe.expert_ffn_hidden == n.moe.expert_ffn_hidden);
  CHECK(m.moe.layers == n.moe.layers);

  const ClusterSpec& c = a.cluster;
  const ClusterSpec& d = b.cluster;
  CHECK(c.name == d.name);
  CHECK(c.nodes == d.nodes);
  CHECK(c.gpus_per_node == d.gpus_per_node);
  CHECK(c.gpu.type == d.gpu.type);
  CHECK(c.gpu.peak_flops == d.gpu.peak_flops);
  CHECK(c.gpu.arch == d.gpu.arch);
  CHECK(c.gpu.memory_bytes == d.gpu.memory_bytes);
  CHECK(c.gpu.hbm_bytes_per_s == d.gpu.hbm_bytes_per_s);
  CHECK(c.gpu.fp8_peak_flops == d.gpu.fp8_peak_flops);
  CHECK(c.intra.topology == d.intra.topology);
  CHECK(c.intra.bytes_per_s == d.intra.bytes_per_s);
  CHECK(c.intra.latency_s == d.intra.latency_s);
  CHECK(c.nic.per_node == d.nic.per_node);
  CHECK(c.nic.bytes_per_s == d.nic.bytes_per_s);
  CHECK(c.nic.latency_s == d.nic.latency_s);
  CHECK(c.nic.mapping == d.nic.mapping);
  CHECK(c.inter.leaf_size == d.inter.leaf_size);
  CHECK(c.inter.oversubscription == d.inter.oversubscription);
  CHECK(c.inter.routing == d.inter.routing);
  CHECK(c.inter.rail_optimized == d.inter.rail_optimized);
  CHECK(c.inter.qps_per_connection == d.inter.qps_per_connection);
  CHECK(c.inter.placement == d.inter.placement);
  CHECK(c.inter.seed == d.inter.seed);
  CHECK(c.inter.switch_latency_s == d.inter.switch_latency_s);
  CHECK(c.efficiency.gemm == d.efficiency.gemm);
  CHECK(c.efficiency.memory_bound == d.efficiency.memory_bound);
  CHECK(c.efficiency.intra_node == d.efficiency.intra_node);
  CHECK(c.efficiency.inter_node == d.efficiency.inter_node);

  const TrainingSpec& t = a.training;
  const TrainingSpec& u = b.training;
  CHECK(t.seq_len == u.seq_len);
  CHECK(t.micro_batch == u.micro_batch);
  CHECK(t.global_batch == u.global_batch);
  CHECK(t.precision == u.precision);
  CHECK(t.optimizer == u.optimizer);
  CHECK(t.recompute == u.recompute);
  CHECK(t.flash_attention == u.flash_attention);
  CHECK(t.attention_dropout == u.attention_dropout);
  CHECK(t.hidden_dropout == u.hidden_dropout);
  CHECK(t.fp8 == u.fp8);

  CHECK(a.policy.preset == b.policy.preset);
  CHECK(a.policy.sharding == b.policy.sharding);
  CHECK(a.policy.overlap.prefetch_depth == b.policy.overlap.prefetch_depth);
  CHECK(a.policy.overlap.bucket_bytes == b.policy.overlap.bucket_bytes);
  CHECK(a.policy.overlap.separate_streams == b.policy.overlap.separate_streams);
}

void check_round_trip(const Scenario& s) {
  const json resolved = scenario_to_json(s);
  INFO(resolved.dump(2));
  Result<Scenario> again = parse_scenario(resolved, "other-name");
  INFO(again.status().message());
  REQUIRE(again.ok());
  check_same(s, *again);
  // Writing the re-read scenario gives the same document: no drift across passes.
  CHECK(scenario_to_json(*again) == resolved);
}

std::string data_dir() {
  return HZP_TEST_DATA_DIR;
}

}  // namespace

TEST_CASE("every model preset loads with its published numbers", "[scenario][presets]") {
  struct Expected {
    int layers;
    std::int64_t hidden;
    int heads, kv_heads;
    std::int64_t ffn, vocab;
    int moe_layers;  // 0: dense
  };
  const std::map<std::string, Expected> expected = {
      {"llama2-7b", {32, 4096, 32, 32, 11008, 32000, 0}},
      {"llama2-13b", {40, 5120, 40, 40, 13824, 32000, 0}},
      {"llama-30b", {60, 6656, 52, 52, 17920, 32000, 0}},
      {"llama2-70b", {80, 8192, 64, 8, 28672, 32000, 0}},
      {"gpt3-175b", {96, 12288, 96, 96, 49152, 50257, 0}},
      {"mixtral-8x7b", {32, 4096, 32, 8, 14336, 32000, 32}},
      {"tiny-dense", {4, 128, 4, 4, 352, 256, 0}},
      {"tiny-moe", {4, 128, 4, 4, 352, 256, 4}},
      // Hugging Face config.json of each (tests/hf_config_test.cc checks the parameter counts as well)
      {"llama3-8b", {32, 4096, 32, 8, 14336, 128256, 0}},
      {"llama3-70b", {80, 8192, 64, 8, 28672, 128256, 0}},
      {"llama3.1-8b", {32, 4096, 32, 8, 14336, 128256, 0}},
      {"llama3.1-70b", {80, 8192, 64, 8, 28672, 128256, 0}},
      {"llama3.1-405b", {126, 16384, 128, 8, 53248, 128256, 0}},
      {"qwen2.5-7b", {28, 3584, 28, 4, 18944, 152064, 0}},
      {"qwen2.5-14b", {48, 5120, 40, 8, 13824, 152064, 0}},
      {"qwen2.5-32b", {64, 5120, 40, 8, 27648, 152064, 0}},
      {"qwen2.5-72b", {80, 8192, 64, 8, 29568, 152064, 0}},
      {"mixtral-8x22b", {56, 6144, 48, 8, 16384, 32000, 56}},
      // MLA (kv_heads == heads) and dense first layers (tests/hf_config_test.cc has the rest)
      {"deepseek-v3", {61, 7168, 128, 128, 18432, 129280, 58}},
      {"deepseek-v2", {60, 5120, 128, 128, 12288, 102400, 59}},
      {"deepseek-v2-lite", {27, 2048, 16, 16, 10944, 102400, 26}},
  };
  REQUIRE(model_preset_names().size() == expected.size());
  for (const std::string& name : model_preset_names()) {
    INFO(name);
    REQUIRE(expected.count(name) == 1);
    json doc = base_doc();
    doc["model"] = {{"preset", name}};
    doc["training"]["seq_len"] = 2048;  // within gpt3's learned position table
    const ModelSpec m = parse_ok(doc).model;
    const Expected& e = expected.at(name);
    CHECK(m.name == name);
    CHECK(m.layers == e.layers);
    CHECK(m.hidden == e.hidden);
    CHECK(m.heads == e.heads);
    CHECK(m.kv_heads == e.kv_heads);
    CHECK(m.ffn_hidden == e.ffn);
    CHECK(m.vocab == e.vocab);
    CHECK(m.has_moe == (e.moe_layers > 0));
    CHECK(static_cast<int>(m.moe.layers.size()) == e.moe_layers);
  }
  const ModelSpec gpt3 = *model_preset("gpt3-175b");
  CHECK(gpt3.family == ModelFamily::kGpt);
  CHECK(gpt3.tied_embeddings);
  CHECK(gpt3.position == PositionEmbedding::kLearned);
  CHECK(gpt3.max_positions == 2048);
  const ModelSpec mixtral = *model_preset("mixtral-8x7b");
  CHECK(mixtral.moe.experts == 8);
  CHECK(mixtral.moe.top_k == 2);
  CHECK(mixtral.moe.expert_ffn_hidden == 14336);
  const ModelSpec tiny_moe = *model_preset("tiny-moe");
  CHECK(tiny_moe.moe.experts == 4);
  CHECK(tiny_moe.moe.top_k == 2);
  CHECK(tiny_moe.moe.expert_ffn_hidden == 176);
  CHECK(tiny_moe.moe.layers == std::vector<int>{0, 1, 2, 3});
}

TEST_CASE("every cluster preset loads, in SI units", "[scenario][presets]") {
  for (const std::string& name : cluster_preset_names()) {
    INFO(name);
    json doc = base_doc();
    doc["cluster"] = {{"preset", name}, {"nodes", 2}};
    doc["training"]["global_batch_sequences"] = 64;
    const ClusterSpec c = parse_ok(doc).cluster;
    CHECK(c.name == name);
    CHECK(c.nodes == 2);
    CHECK(c.gpu.peak_flops > 0);
    CHECK(c.intra.latency_s > 0);
    CHECK(c.nic.latency_s > 0);
    CHECK(c.efficiency.gemm > 0);
    REQUIRE(calibration_for(c.gpu.type).ok());
    CHECK(c.efficiency.gemm == calibration_for(c.gpu.type)->efficiency.gemm);
  }
  const ClusterSpec a100 = *cluster_preset("dgx-a100");
  CHECK(a100.nodes == 1);
  CHECK(a100.gpus_per_node == 8);
  CHECK(a100.gpu.peak_flops == 312e12);
  CHECK(a100.gpu.memory_bytes == 80 * kGiB);
  CHECK(a100.gpu.hbm_bytes_per_s == 2039e9);
  CHECK(a100.intra.bytes_per_s == 300e9);  // NVLink 600 GB/s bidirectional
  CHECK(a100.nic.per_node == 8);
  CHECK(a100.nic.bytes_per_s == 25e9);  // 200 Gb/s HDR
  CHECK(a100.nic.mapping == NicMapping::kRail);
  CHECK(a100.inter.leaf_size == 32);
  CHECK(a100.inter.oversubscription == 1);

  const ClusterSpec a800 = *cluster_preset("a800");
  CHECK(a800.intra.bytes_per_s == 200e9);
  CHECK(a800.nic.per_node == 4);
  CHECK(a800.gpu.type == "a800-80gb");

  const ClusterSpec h100 = *cluster_preset("dgx-h100");
  CHECK(h100.gpu.peak_flops == 989e12);
  CHECK(h100.intra.bytes_per_s == 450e9);
  CHECK(h100.nic.bytes_per_s == 50e9);
  CHECK(h100.efficiency.intra_node == 0.82);

  const ClusterSpec npu = *cluster_preset("npu-16");
  CHECK(npu.gpus_per_node == 16);
  CHECK(npu.intra.topology == IntraNodeTopology::kFullMesh);
  CHECK(npu.intra.bytes_per_s == 200e9);
  CHECK(npu.nic.per_node == 8);
  CHECK(npu.gpu.type == "npu-910b");
}

TEST_CASE("every policy preset resolves to its groups in AMSP notation", "[scenario][presets]") {
  const int r = 8;
  const int n = 4;
  const ShardGroup rep{1, 1}, node{r, 1}, full{r, n};
  const std::map<std::string, ShardingSpec> expected = {
      {"ddp", {rep, rep, rep}},      {"zero1", {rep, rep, full}},  {"zero2", {rep, full, full}},
      {"zero3", {full, full, full}}, {"fsdp", {full, full, full}}, {"zeropp", {full, full, full}},
      {"hsdp", {node, node, node}},  {"mics", {node, node, node}}, {"asynchzp", {node, node, full}},
  };
  for (const std::string& name : policy_preset_names()) {
    INFO(name);
    json doc = base_doc();
    doc["policy"] = {{"preset", name}};
    if (name == "amsp") {
      CHECK_FALSE(sharding_preset(Policy::kAmsp, r, n).ok());
      CHECK(parse_error(doc).rfind("policy.sharding: ", 0) == 0);
      continue;
    }
    REQUIRE(expected.count(name) == 1);
    const PolicySpec p = parse_ok(doc).policy;
    CHECK(to_string(p.preset) == name);  // "fsdp" stays "fsdp"
    CHECK(p.sharding == expected.at(name));
    CHECK(p.overlap.prefetch_depth == 1);
    CHECK(p.overlap.bucket_bytes == 25 * 1024 * 1024);
    CHECK(p.overlap.separate_streams);
    CHECK(check_sharding(p.sharding, r, n, "policy.sharding").ok());
  }
  CHECK(policy_preset_names().size() == expected.size() + 1);
}

TEST_CASE("explicit sharding entries override the preset's", "[scenario][policy]") {
  json doc = base_doc();
  doc["policy"] = json::parse(R"({"preset": "zero3", "sharding": {"params": [8, 1]},
                                  "overlap": {"prefetch_depth": 0, "bucket_MiB": 0.5, "separate_streams": false}})");
  const PolicySpec p = parse_ok(doc).policy;
  CHECK(p.preset == Policy::kZero3);
  CHECK(p.sharding.params == ShardGroup{8, 1});
  CHECK(p.sharding.grads == ShardGroup{8, 4});
  CHECK(p.sharding.optimizer == ShardGroup{8, 4});
  CHECK(p.overlap.prefetch_depth == 0);
  CHECK(p.overlap.bucket_bytes == 512 * 1024);
  CHECK_FALSE(p.overlap.separate_streams);

  doc["policy"] = json::parse(R"({"sharding": {"params": [1, 1], "grads": [8, 4], "optimizer": [8, 4]}})");
  CHECK(parse_ok(doc).policy.preset == Policy::kCustom);
  // "custom", the documented name of "no preset", may be written; it needs every group as the absence does.
  doc["policy"]["preset"] = "custom";
  const PolicySpec custom = parse_ok(doc).policy;
  CHECK(custom.preset == Policy::kCustom);
  CHECK(custom.sharding.params == ShardGroup{1, 1});
  CHECK(scenario_to_json(parse_ok(doc)) == scenario_to_json(parse_ok(json::parse(doc.dump()))));
  doc["policy"] = json::parse(R"({"preset": "custom", "sharding": {"params": [8, 1]}})");
  CHECK_THAT(parse_error(doc), Catch::StartsWith("policy.sharding.grads: missing"));
}

TEST_CASE("check_sharding names the offending state", "[scenario][policy]") {
  auto msg = [](ShardGroup p, ShardGroup g, ShardGroup os) {
    Status s = check_sharding({p, g, os}, 8, 4, "x");
    REQUIRE_FALSE(s.ok());
    CHECK(s.code() == StatusCode::kInvalidInput);
    return s.message();
  };
  CHECK(msg({1, 1}, {3, 1}, {8, 4}) == "x.grads: s0 of group [3, 1] does not divide 8 GPUs per node");
  CHECK(msg({1, 1}, {1, 1}, {8, 3}) == "x.optimizer: s1 of group [8, 3] does not divide 4 nodes");
  CHECK(msg({0, 1}, {1, 1}, {8, 4}).rfind("x.params: ", 0) == 0);
  CHECK(msg({1, 1}, {1, 1}, {4, 2}).rfind("x.optimizer: group [4, 2] spans 2 nodes", 0) == 0);
  CHECK(msg({8, 1}, {4, 1}, {8, 4}).rfind("x.params: group [8, 1] is sharded wider than grads", 0) == 0);
  CHECK(msg({8, 2}, {8, 1}, {8, 4}).rfind("x.params: ", 0) == 0);  // s1 compared too
  CHECK(msg({1, 1}, {8, 4}, {8, 1}).rfind("x.grads: group [8, 4] is sharded wider than optimizer", 0) == 0);
  CHECK(msg({2, 1}, {4, 1}, {8, 1}).rfind("x.grads: grads must be sharded like params or like optimizer", 0) == 0);
  // The AMSP examples that are valid: ZeRO++-like partial params, ZeRO-1.5 (OS in the node).
  CHECK(check_sharding({{8, 1}, {8, 4}, {8, 4}}, 8, 4, "x").ok());
  CHECK(check_sharding({{1, 1}, {1, 1}, {8, 1}}, 8, 4, "x").ok());
  CHECK(check_sharding({{2, 1}, {2, 1}, {8, 2}}, 8, 4, "x").ok());
}

TEST_CASE("cluster overrides merge key by key into the preset", "[scenario][cluster]") {
  json doc = base_doc();
  doc["cluster"] = json::parse(R"({"preset": "dgx-a100", "nodes": 4,
      "nic": {"bandwidth_Gbps": 100},
      "intra_node": {"latency_us": 2},
      "inter_node": {"oversubscription": 2, "switch_latency_us": 1},
      "efficiency": {"gemm": 0.5}})");
  const ClusterSpec c = parse_ok(doc).cluster;
  const ClusterSpec preset = *cluster_preset("dgx-a100");
  CHECK(c.name == "dgx-a100");
  CHECK(c.nic.bytes_per_s == 12.5e9);
  CHECK(c.nic.per_node == preset.nic.per_node);
  CHECK(c.nic.latency_s == preset.nic.latency_s);
  CHECK(c.intra.latency_s == 2e-6);
  CHECK(c.intra.bytes_per_s == preset.intra.bytes_per_s);
  CHECK(c.inter.oversubscription == 2);
  CHECK(c.inter.switch_latency_s == 1e-6);
  CHECK(c.inter.leaf_size == preset.inter.leaf_size);
  CHECK(c.efficiency.gemm == 0.5);
  CHECK(c.efficiency.intra_node == preset.efficiency.intra_node);

  SECTION("a new gpu.type brings its calibrated numbers; explicit fields still win") {
    doc["cluster"] = json::parse(R"({"preset": "dgx-a100", "gpu": {"type": "h100-sxm", "memory_GiB": 94},
                                     "efficiency": {"memory_bound": 0.7}})");
    doc["training"]["global_batch_sequences"] = 8;
    const ClusterSpec h = parse_ok(doc).cluster;
    const CalibrationEntry cal = *calibration_for("h100-sxm");
    CHECK(h.gpu.type == "h100-sxm");
    CHECK(h.gpu.peak_flops == 989e12);
    CHECK(h.gpu.hbm_bytes_per_s == 3350e9);
    CHECK(h.gpu.memory_bytes == 94 * kGiB);
    CHECK(h.efficiency.gemm == cal.efficiency.gemm);
    CHECK(h.efficiency.memory_bound == 0.7);
    CHECK(h.intra.bytes_per_s == 300e9);  // the links stay the preset's
  }
}

TEST_CASE("explicit cluster: defaults from the calibration table", "[scenario][cluster]") {
  json doc = base_doc();
  doc["cluster"] = json::parse(R"({"nodes": 2, "gpus_per_node": 4, "gpu": {"type": "a800-80gb"},
      "intra_node": {"topology": "full_mesh", "bandwidth_GBps": 100},
      "nic": {"per_node": 2, "bandwidth_Gbps": 400}})");
  doc["training"]["global_batch_sequences"] = 8;
  const ClusterSpec c = parse_ok(doc).cluster;
  const CalibrationEntry cal = *calibration_for("a800-80gb");
  CHECK(c.name == "custom");
  CHECK(c.gpu.peak_flops == 312e12);
  CHECK(c.gpu.memory_bytes == 80 * kGiB);
  CHECK(c.intra.topology == IntraNodeTopology::kFullMesh);
  CHECK(c.intra.bytes_per_s == 100e9);
  CHECK(c.intra.latency_s == cal.intra_latency_s);
  CHECK(c.nic.bytes_per_s == 50e9);
  CHECK(c.nic.latency_s == cal.nic_latency_s);
  CHECK(c.nic.mapping == NicMapping::kRail);
  CHECK(c.inter.leaf_size == default_inter_node().leaf_size);
  CHECK(c.inter.switch_latency_s == default_inter_node().switch_latency_s);
  CHECK(c.efficiency.gemm == cal.efficiency.gemm);
  CHECK(c.world_size() == 8);

  SECTION("an uncalibrated GPU type needs every number explicitly") {
    doc["cluster"]["gpu"] = {{"type", "cpu"}, {"peak_tflops", 1}, {"memory_GiB", 8}, {"hbm_GBps", 50}};
    const std::string msg = parse_error(doc);
    CHECK(msg.rfind("cluster.gpu.type: no calibration entry", 0) == 0);
    CHECK(msg.find("cluster.efficiency.gemm") != std::string::npos);
    CHECK(msg.find("cluster.nic.latency_us") != std::string::npos);
    CHECK(msg.find("a100-80gb") != std::string::npos);
    doc["cluster"]["efficiency"] = {{"gemm", 0.5}, {"memory_bound", 0.5}, {"intra_node", 0.5}, {"inter_node", 0.5}};
    doc["cluster"]["intra_node"]["latency_us"] = 10;
    doc["cluster"]["nic"]["latency_us"] = 30;
    const ClusterSpec cpu = parse_ok(doc).cluster;
    CHECK(cpu.gpu.type == "cpu");
    CHECK(cpu.gpu.peak_flops == 1e12);
    CHECK(cpu.nic.latency_s == 30e-6);
    CHECK(cpu.gpu.arch == GpuArch::kUnknown);
    // LL's one-node cap is NCCL's per architecture: a protocol that may run LL needs cluster.gpu.arch.
    for (const char* protocol : {"auto", "ll"}) {
      doc["cluster"]["protocol"] = protocol;
      const std::string no_arch = parse_error(doc);
      CHECK(no_arch.rfind("cluster.gpu.arch: must be given", 0) == 0);
      CHECK(no_arch.find(protocol) != std::string::npos);
    }
    doc["cluster"]["gpu"]["arch"] = "sm90";
    CHECK(parse_error(doc).rfind("cluster.gpu.arch: must be one of", 0) == 0);
    doc["cluster"]["gpu"]["arch"] = "hopper";
    const Scenario with_arch = parse_ok(doc);
    CHECK(with_arch.cluster.gpu.arch == GpuArch::kHopper);
    CHECK(scenario_to_json(with_arch)["cluster"]["gpu"]["arch"] == "hopper");
    check_round_trip(with_arch);
  }
}

TEST_CASE("model overrides and explicit models", "[scenario][model]") {
  json doc = base_doc();
  SECTION("overriding heads keeps a multi-head preset multi-head") {
    doc["model"] = {{"preset", "llama2-7b"}, {"heads", 16}, {"layers", 2}};
    const ModelSpec m = parse_ok(doc).model;
    CHECK(m.name == "llama2-7b");
    CHECK(m.heads == 16);
    CHECK(m.kv_heads == 16);
    CHECK(m.layers == 2);
    CHECK(m.hidden == 4096);
  }
  SECTION("a GQA preset keeps its kv_heads") {
    doc["model"] = {{"preset", "llama2-70b"}, {"heads", 32}};
    CHECK(parse_ok(doc).model.kv_heads == 8);
  }
  SECTION("an all-layer MoE preset follows a layers override; moe merges key by key") {
    doc["model"] = json::parse(R"({"preset": "mixtral-8x7b", "layers": 3, "moe": {"top_k": 1}})");
    const ModelSpec m = parse_ok(doc).model;
    CHECK(m.moe.layers == std::vector<int>{0, 1, 2});
    CHECK(m.moe.top_k == 1);
    CHECK(m.moe.experts == 8);
  }
  SECTION("a layers override keeps a dense-first MoE preset's dense layers; mla merges key by key") {
    doc["model"] = json::parse(R"({"preset": "deepseek-v3", "layers": 5, "mla": {"q_lora_rank": 0}})");
    const ModelSpec m = parse_ok(doc).model;
    CHECK(m.moe.layers == std::vector<int>{3, 4});
    CHECK(m.has_mla);
    CHECK(m.mla.q_lora_rank == 0);
    CHECK(m.mla.kv_lora_rank == 512);
    doc["model"] = json::parse(R"({"preset": "deepseek-v3", "layers": 3})");
    CHECK(parse_error(doc).find("model.layers: leaves no MoE layer") != std::string::npos);
    doc["model"] = json::parse(R"({"preset": "deepseek-v3", "mla": null, "moe": {"shared_ffn_hidden": 0}})");
    const ModelSpec plain = parse_ok(doc).model;
    CHECK_FALSE(plain.has_mla);
    CHECK(plain.moe.shared_ffn_hidden == 0);
  }
  SECTION("mla is refused where its heads or positions cannot be") {
    doc["model"] = json::parse(R"({"preset": "deepseek-v3", "kv_heads": 8})");
    CHECK(parse_error(doc).find("model.kv_heads: must equal heads (128) with model.mla") != std::string::npos);
    doc["model"] = json::parse(R"({"preset": "llama2-7b", "mla": {"kv_lora_rank": 512}})");
    CHECK(parse_error(doc).find("model.mla.q_lora_rank: missing") != std::string::npos);
    doc["model"] = json::parse(
        R"({"preset": "llama2-7b", "position": "alibi", "mla": {"q_lora_rank": 0, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128}})");
    CHECK(parse_error(doc).find("model.position: must be rope with model.mla") != std::string::npos);
    doc["model"] = json::parse(R"({"preset": "deepseek-v3", "mla": {"v_head_dim": 0}})");
    CHECK(parse_error(doc).find("model.mla.v_head_dim") != std::string::npos);
    doc["model"] = json::parse(R"({"preset": "deepseek-v3", "moe": {"shared_ffn_hidden": -1}})");
    CHECK(parse_error(doc).find("model.moe.shared_ffn_hidden") != std::string::npos);
  }
  SECTION("moe layer forms") {
    doc["model"] =
        json::parse(R"({"preset": "mixtral-8x7b", "layers": 8, "moe": {"layers": {"every": 4, "offset": 1}}})");
    CHECK(parse_ok(doc).model.moe.layers == std::vector<int>{1, 5});
    doc["model"]["moe"]["layers"] = {6, 2, 4};
    CHECK(parse_ok(doc).model.moe.layers == std::vector<int>{2, 4, 6});
    doc["model"]["moe"]["layers"] = "all";
    CHECK(parse_ok(doc).model.moe.layers.size() == 8);
  }
  SECTION("moe: null drops a preset's MoE; an MoE can be added to a dense preset") {
    doc["model"] = json::parse(R"({"preset": "mixtral-8x7b", "moe": null})");
    const ModelSpec dense = parse_ok(doc).model;
    CHECK_FALSE(dense.has_moe);
    CHECK(dense.moe.layers.empty());
    doc["model"] =
        json::parse(R"({"preset": "llama2-7b", "moe": {"experts": 4, "top_k": 1, "expert_ffn_hidden": 2752}})");
    const ModelSpec moe = parse_ok(doc).model;
    CHECK(moe.has_moe);
    CHECK(moe.moe.layers.size() == 32);
  }
  SECTION("explicit GPT model: family defaults") {
    doc["model"] =
        json::parse(R"({"family": "gpt", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 256, "vocab": 100})");
    doc["training"]["seq_len"] = 1024;
    const ModelSpec m = parse_ok(doc).model;
    CHECK(m.name == "custom");
    CHECK(m.kv_heads == 4);
    CHECK(m.tied_embeddings);
    CHECK(m.position == PositionEmbedding::kLearned);
    CHECK(m.mlp == MlpKind::kGelu);
    CHECK(m.max_positions == 2048);
    CHECK_FALSE(m.has_moe);
  }
  SECTION("explicit LLaMA model: family defaults") {
    doc["model"] =
        json::parse(R"({"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 172, "vocab": 100,
                                   "position": "alibi", "name": "mini"})");
    const ModelSpec m = parse_ok(doc).model;
    CHECK(m.name == "mini");
    CHECK(m.family == ModelFamily::kLlama);
    CHECK_FALSE(m.tied_embeddings);
    CHECK(m.position == PositionEmbedding::kAlibi);
    CHECK(m.mlp == MlpKind::kSwiGlu);
    CHECK(m.kv_heads == 2);
  }
  SECTION("model.mlp: named, overriding a preset, round-tripped, and a bad name refused") {
    doc["model"] = json::parse(R"({"preset": "llama2-7b", "mlp": "squared_relu"})");
    const Scenario s = parse_ok(doc);
    CHECK(s.model.mlp == MlpKind::kSquaredRelu);
    CHECK(scenario_to_json(s)["model"]["mlp"] == "squared_relu");
    check_same(s, parse_ok(scenario_to_json(s)));
    doc["model"]["mlp"] = "relu";
    const std::string error = parse_error(doc);
    CHECK(error.find("model.mlp") != std::string::npos);
    CHECK(error.find("relu") != std::string::npos);
  }
}

TEST_CASE("training: batch forms and defaults", "[scenario][training]") {
  json doc = base_doc();
  Scenario s = parse_ok(doc);
  CHECK(s.training.global_batch == 64);
  CHECK(s.grad_accum_steps() == 2);
  CHECK(s.training.precision == Precision::kBf16);
  CHECK(s.training.optimizer == "adamw");
  CHECK(s.training.recompute == Recompute::kNone);
  CHECK(s.training.flash_attention);

  doc["training"] = {{"seq_len", 4096}, {"micro_batch", 2}, {"global_batch_tokens", 4096 * 128}};
  s = parse_ok(doc);
  CHECK(s.training.global_batch == 128);
  CHECK(s.grad_accum_steps() == 2);

  doc["training"] = {{"seq_len", 1024}, {"micro_batch", 3}, {"recompute", "full"}, {"precision", "fp32"}};
  s = parse_ok(doc);
  CHECK(s.training.global_batch == 3 * 32);  // no accumulation by default
  CHECK(s.grad_accum_steps() == 1);
  CHECK(s.training.recompute == Recompute::kFull);
  CHECK(s.training.precision == Precision::kFp32);
}

TEST_CASE("error messages start with the JSON path and list the known names", "[scenario][errors]") {
  json doc = base_doc();
  doc["model"]["hiden"] = 1;
  std::string msg = parse_error(doc);
  CHECK(msg.rfind("model.hiden: unknown key", 0) == 0);
  CHECK(msg.find("kv_heads") != std::string::npos);

  doc = base_doc();
  doc["cluster"]["preset"] = "dgx-z";
  msg = parse_error(doc);
  CHECK(msg.rfind("cluster.preset: ", 0) == 0);
  CHECK(msg.find("npu-16") != std::string::npos);
  CHECK(msg.find("\"dgx-z\"") != std::string::npos);

  doc = base_doc();
  doc["policy"]["preset"] = "zero4";
  msg = parse_error(doc);
  CHECK(msg.find("asynchzp") != std::string::npos);

  doc = base_doc();
  doc["training"]["global_batch_sequences"] = 1000;
  doc["cluster"]["nodes"] = 128;
  CHECK(parse_error(doc) ==
        "training.global_batch_sequences: 1000 is not a multiple of micro_batch (1) x data-parallel size (1024)");

  doc = base_doc();
  doc["policy"] =
      json::parse(R"({"preset": "amsp", "sharding": {"params": [1, 1], "grads": [3, 1], "optimizer": [8, 4]}})");
  CHECK(parse_error(doc) == "policy.sharding.grads: s0 of group [3, 1] does not divide 8 GPUs per node");

  doc = base_doc();
  doc["model"]["layers"] = 4.0;
  CHECK(parse_error(doc) == "model.layers: must be an integer, got 4.0");
  doc["model"]["layers"] = 1ULL << 40;
  CHECK(parse_error(doc).rfind("model.layers: must be an integer in [1, 4096]", 0) == 0);

  doc = base_doc();
  doc["cluster"]["nodes"] = 1 << 29;
  CHECK(parse_error(doc) == "cluster.nodes: must be an integer in [1, 131072], got 536870912");
  doc["cluster"]["nodes"] = 1 << 17;
  doc["cluster"]["gpus_per_node"] = 16;
  doc["cluster"]["nic"] = {{"per_node", 8}};
  CHECK(parse_error(doc) ==
        "cluster.nodes: times gpus_per_node (16) is 2097152 GPUs, more than the 262144 hzp models, got 131072");

  CHECK(parse_error(json::array()) == "scenario: must be an object, got []");
}

TEST_CASE("text and file entry points", "[scenario][errors]") {
  Result<Scenario> s = parse_scenario_text("{\"model\": {\"preset\": ", "x");
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == StatusCode::kInvalidInput);
  CHECK(s.status().message().rfind("malformed JSON at byte 22", 0) == 0);
  // A number past double's range says where it is (it was "[json.exception.out_of_range.406] ..." alone).
  s = parse_scenario_text(R"({"model": {"preset": "llama2-7b", "layers": 1e400}})", "x");
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().message() == "malformed JSON at byte 49 (near model.layers): number overflow parsing '1e400'");

  s = parse_scenario_text(" \n", "x");
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().message().rfind("empty document", 0) == 0);

  s = parse_scenario_text(base_doc().dump(), "from-text");
  REQUIRE(s.ok());
  CHECK(s->name == "from-text");

  s = load_scenario_file(data_dir() + "/no/such/file.json");
  REQUIRE_FALSE(s.ok());
  CHECK(s.status().code() == StatusCode::kInvalidInput);
  CHECK(s.status().message().find("no/such/file.json: cannot open: No such file or directory") != std::string::npos);

  s = load_scenario_file(data_dir() + "/good/mixtral_asynchzp_h100.json");
  INFO(s.status().message());
  REQUIRE(s.ok());
  CHECK(s->name == "mixtral_asynchzp_h100");  // no "name" key: the file stem
  CHECK(s->model.layers == 16);
  CHECK(s->model.moe.layers == std::vector<int>{1, 3, 5, 7, 9, 11, 13, 15});
  CHECK(s->model.moe.top_k == 1);
  CHECK(s->cluster.nic.bytes_per_s == 25e9);
  CHECK(s->cluster.inter.leaf_size == 8);
  CHECK(s->training.global_batch == 1024);
  CHECK(s->grad_accum_steps() == 4);
  CHECK(s->policy.sharding == ShardingSpec{{8, 1}, {8, 1}, {8, 16}});
  CHECK(s->policy.overlap.bucket_bytes == 64 * 1024 * 1024);
}

TEST_CASE("every bad scenario file fails with its expected message", "[scenario][errors]") {
  const std::string dir = data_dir() + "/bad";
  std::ifstream expected_file(dir + "/EXPECTED.txt");
  REQUIRE(expected_file);
  std::map<std::string, std::string> expected;
  for (std::string line; std::getline(expected_file, line);) {
    if (line.empty()) continue;
    const auto tab = line.find('\t');
    REQUIRE(tab != std::string::npos);
    expected[line.substr(0, tab)] = line.substr(tab + 1);
  }
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    const std::string file = entry.path().filename().string();
    INFO(file);
    REQUIRE(expected.count(file) == 1);
    const std::string& want = expected.at(file);
    Result<Scenario> s = load_scenario_file(entry.path().string());
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInvalidInput);
    const std::string& msg = s.status().message();
    INFO(msg);
    CHECK(msg.find(want) != std::string::npos);
    // Messages lead with the JSON path (syntax errors, which have none, lead with the file).
    if (msg.rfind(entry.path().string(), 0) != 0) CHECK(msg.rfind(want.substr(0, want.find(':')) + ":", 0) == 0);
  }
  CHECK(files == static_cast<int>(expected.size()));
  CHECK(files >= 20);
}

TEST_CASE("hostile documents are refused quickly, and messages never echo them whole", "[scenario][errors][hostile]") {
  SECTION("60 000 levels of nesting: refused before parsing, no stack overflow") {
    const std::string deep = std::string(60000, '[') + std::string(60000, ']');
    Result<Scenario> s = parse_scenario_text(deep, "deep");
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInvalidInput);
    CHECK(s.status().message().find("nested deeper than 64 levels") != std::string::npos);
    // Brackets inside strings do not count.
    json doc = base_doc();
    doc["name"] = std::string(100, '[');
    CHECK_FALSE(parse_scenario_text(doc.dump(), "x").status().message().find("nested") != std::string::npos);
  }
  SECTION("a 10 MB unknown key is named in a bounded message") {
    json doc = base_doc();
    doc["model"][std::string(10 << 20, 'k')] = 1;
    Result<Scenario> s = parse_scenario_text(doc.dump(), "huge");
    REQUIRE_FALSE(s.ok());
    const std::string& msg = s.status().message();
    CHECK(msg.rfind("model.kkkk", 0) == 0);
    CHECK(msg.find("unknown key") != std::string::npos);
    CHECK(msg.size() < 600);
  }
  SECTION("control characters and invalid UTF-8 in keys are escaped") {
    json doc = base_doc();
    doc["model"]["a\x01\x1b[31mb"] = 1;
    Result<Scenario> s = parse_scenario_text(doc.dump(), "ctl");
    REQUIRE_FALSE(s.ok());
    const std::string& msg = s.status().message();
    INFO(msg);
    CHECK(msg.find("a\\x01\\x1b[31mb") != std::string::npos);
    for (char c : msg) CHECK((static_cast<unsigned char>(c) >= 0x20 || c == '\n'));
    // valid UTF-8 that reorders or hides what a terminal shows: a right-to-left override (U+202E), a
    // zero-width space, a C1 control; letters of other scripts stay as they are
    doc = base_doc();
    doc["model"]["gpt\u202Eexe.2\u200B\u0085\u00e9\u4e2d"] = 1;
    Result<Scenario> bidi = parse_scenario_text(doc.dump(), "bidi");
    REQUIRE_FALSE(bidi.ok());
    INFO(bidi.status().message());
    CHECK(bidi.status().message().find("gpt\\u202eexe.2\\u200b\\u0085\u00e9\u4e2d") != std::string::npos);
    const std::string bad_utf8 = "{\"model\": {\"\xff\xfe\": 1}}";
    Result<Scenario> u = parse_scenario_text(bad_utf8, "utf8");
    REQUIRE_FALSE(u.ok());
    CHECK(u.status().message().size() < 600);
  }
  SECTION("a document over 16 MiB is refused without parsing") {
    const std::string big = "{\"name\": \"" + std::string(17 << 20, 'x') + "\"}";
    Result<Scenario> s = parse_scenario_text(big, "big");
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().message().find("more than the 16777216") != std::string::npos);
  }
  SECTION("a directory where a file is expected") {
    Result<Scenario> s = load_scenario_file(data_dir());
    REQUIRE_FALSE(s.ok());
    CHECK(s.status().code() == StatusCode::kInvalidInput);
    CHECK(s.status().message().find("not a regular file (a directory)") != std::string::npos);
  }
}

TEST_CASE("scenario_to_json round-trips", "[scenario][round-trip]") {
  SECTION("the good files") {
    int files = 0;
    for (const auto& entry : std::filesystem::directory_iterator(data_dir() + "/good")) {
      if (entry.path().extension() != ".json") continue;
      ++files;
      INFO(entry.path().string());
      Result<Scenario> s = load_scenario_file(entry.path().string());
      INFO(s.status().message());
      REQUIRE(s.ok());
      check_round_trip(*s);
    }
    CHECK(files >= 3);
  }
  SECTION("every model x cluster preset") {
    for (const std::string& model : model_preset_names()) {
      for (const std::string& cluster : cluster_preset_names()) {
        INFO(model << " on " << cluster);
        json doc = base_doc();
        doc["model"] = {{"preset", model}};
        doc["cluster"] = {{"preset", cluster}, {"nodes", 4}};
        doc["training"] = {{"seq_len", 2048}, {"micro_batch", 1}};
        doc["policy"] = {{"preset", "hsdp"}};
        check_round_trip(parse_ok(doc));
      }
    }
  }
  SECTION("awkward numbers survive exactly") {
    json doc = base_doc();
    doc["cluster"]["intra_node"] = {{"bandwidth_GBps", 0.1 + 0.2}, {"latency_us", 1.1}};
    doc["cluster"]["nic"] = {{"bandwidth_Gbps", 123.456}, {"latency_us", 7.77}};
    doc["cluster"]["gpu"] = {{"memory_GiB", 79.3}, {"peak_tflops", 311.9}};
    doc["cluster"]["inter_node"] = {{"switch_latency_us", 0.3}, {"oversubscription", 1.5}};
    doc["policy"]["overlap"] = {{"bucket_MiB", 0.3}};
    check_round_trip(parse_ok(doc));
  }
}

TEST_CASE("calibration table: one entry per GPU type, every number sourced", "[calibration]") {
  const std::vector<std::string> types = {"a100-80gb", "a800-80gb", "h100-sxm", "h800-sxm",
                                          "h200-sxm",  "b200",      "npu-910b"};
  REQUIRE(calibration_table().size() == types.size());
  for (const std::string& type : types) {
    INFO(type);
    Result<CalibrationEntry> e = calibration_for(type);
    REQUIRE(e.ok());
    CHECK(e->gpu.type == type);
    CHECK(e->gpu.peak_flops > 0);
    CHECK(e->gpu.memory_bytes > 0);
    CHECK(e->gpu.hbm_bytes_per_s > 0);
    for (double eff :
         {e->efficiency.gemm, e->efficiency.memory_bound, e->efficiency.intra_node, e->efficiency.inter_node}) {
      CHECK(eff > 0);
      CHECK(eff <= 1);
    }
    CHECK(e->intra_latency_s > 0);
    CHECK(e->nic_latency_s > e->intra_latency_s);
    CHECK(e->source.find("gemm") != std::string::npos);
    CHECK(e->source.find("latency") != std::string::npos);
  }
  CHECK(calibration_for("npu-910b")->source.find("assumption") != std::string::npos);
  // Same chip: the A800 calibration (tests/calibration_test.cc) carries over to the A100.
  CHECK(calibration_for("a800-80gb")->efficiency.gemm == calibration_for("a100-80gb")->efficiency.gemm);
  Result<CalibrationEntry> unknown = calibration_for("gb300");
  REQUIRE_FALSE(unknown.ok());
  CHECK(unknown.status().message().find("h100-sxm") != std::string::npos);
}

}  // namespace hzp

namespace hzp {
namespace {

TEST_CASE("the parallel mesh prints every degree and multiplies to the world", "[scenario][mesh]") {
  Scenario s = parse_ok(base_doc());
  const ParallelMesh m = s.mesh;
  CHECK(m.data == 32);
  CHECK(m.world() == s.cluster.world_size());
  CHECK(s.data_parallel() == 32);
  CHECK(m.describe() == "data 32 x tensor 1 x pipeline 1 x context 1 = 32 GPUs");
  CHECK(validate_mesh(s).ok());

  // Expert parallelism lives inside the data axis and must divide it; the message names every degree.
  s.mesh.expert = 3;
  const Status bad = validate_mesh(s);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.message() ==
        "parallel mesh (data 32 x tensor 1 x pipeline 1 x context 1 = 32 GPUs, expert 3 (inside data)): "
        "expert must divide data");
}

}  // namespace
}  // namespace hzp

namespace hzp {
namespace {

TEST_CASE("policy.comm: a framework sets the collective choices and bucket, fields override it",
          "[scenario][framework]") {
  json doc = base_doc();
  CHECK(parse_ok(doc).policy.comm == CommSpec{});  // hzp's own schedule by default
  doc["policy"]["comm"] = {{"framework", "internevo"}};
  Scenario s = parse_ok(doc);
  CHECK(s.policy.comm.grad_reduce == GradReduce::kAllReduce);
  CHECK(s.policy.comm.param_refresh == ParamRefresh::kBroadcast);
  CHECK_FALSE(s.policy.comm.refresh_overlap);
  CHECK_FALSE(s.policy.comm.grad_reduce_overlap);
  CHECK(s.policy.overlap.bucket_bytes == 1024LL * 1024 * 1024);  // 512 Mi bf16 elements
  doc["policy"]["comm"]["refresh_overlap"] = true;
  doc["policy"]["overlap"] = {{"bucket_MiB", 64}};
  s = parse_ok(doc);
  CHECK(s.policy.comm.refresh_overlap);
  CHECK(s.policy.overlap.bucket_bytes == 64LL * 1024 * 1024);
  // The resolved form round-trips.
  CHECK(parse_ok(scenario_to_json(s)).policy.comm == s.policy.comm);
  for (const std::string& name : framework_names()) {
    doc["policy"]["comm"] = {{"framework", name}};
    CHECK(parse_ok(doc).policy.comm.framework == name);
  }

  doc["policy"]["comm"] = {{"framework", "horovod"}};
  Result<Scenario> bad = parse_scenario(doc, "t");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().rfind("policy.comm.framework: unknown framework", 0) == 0);
  doc["policy"]["comm"] = {{"grad_reduce", "reduce"}};
  bad = parse_scenario(doc, "t");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().rfind("policy.comm.grad_reduce: must be one of", 0) == 0);
}

TEST_CASE("policy.comm.grad_reduce_in_fp32: Megatron's follows the precision, the others default to 16 bits",
          "[scenario][framework]") {
  json doc = base_doc();
  CHECK_FALSE(parse_ok(doc).policy.comm.grad_reduce_in_fp32);
  // Megatron-LM: bf16 accumulates and reduces gradients in fp32, fp16 in fp16.
  doc["policy"]["comm"] = {{"framework", "megatron"}};
  doc["training"]["precision"] = "bf16";
  Scenario s = parse_ok(doc);
  CHECK(s.policy.comm.grad_reduce_in_fp32);
  CHECK(parse_ok(scenario_to_json(s)).policy.comm == s.policy.comm);  // the resolved form round-trips
  doc["training"]["precision"] = "fp16";
  CHECK_FALSE(parse_ok(doc).policy.comm.grad_reduce_in_fp32);
  // A value given in the scenario wins over the framework's.
  doc["training"]["precision"] = "bf16";
  doc["policy"]["comm"]["grad_reduce_in_fp32"] = false;
  CHECK_FALSE(parse_ok(doc).policy.comm.grad_reduce_in_fp32);
  for (const char* name : {"hzp", "internevo", "deepspeed", "fsdp"}) {
    doc["policy"]["comm"] = {{"framework", name}};
    INFO(name);
    CHECK_FALSE(parse_ok(doc).policy.comm.grad_reduce_in_fp32);
    doc["policy"]["comm"]["grad_reduce_in_fp32"] = true;  // torchtitan's FSDP2: reduce_dtype float32
    CHECK(parse_ok(doc).policy.comm.grad_reduce_in_fp32);
  }
  doc["policy"]["comm"] = {{"grad_reduce_in_fp32", "yes"}};
  Result<Scenario> bad = parse_scenario(doc, "t");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().rfind("policy.comm.grad_reduce_in_fp32:", 0) == 0);
}

}  // namespace
}  // namespace hzp

namespace hzp {
namespace {

TEST_CASE("cluster.compute_spread: 0 by default, a fraction up to 0.2", "[scenario]") {
  json doc = base_doc();
  CHECK(parse_ok(doc).cluster.compute_spread == 0);
  doc["cluster"]["compute_spread"] = 0.011;
  CHECK(parse_ok(doc).cluster.compute_spread == 0.011);
  CHECK(parse_ok(scenario_to_json(parse_ok(doc))).cluster.compute_spread == 0.011);
  doc["cluster"]["compute_spread"] = 0.5;
  Result<Scenario> bad = parse_scenario(doc, "t");
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().message().rfind("cluster.compute_spread:", 0) == 0);
}

TEST_CASE("cluster.overlap_slowdown: the measured 0.189 by default, 0 to turn it off, a fraction up to 1",
          "[scenario]") {
  json doc = base_doc();
  CHECK(parse_ok(doc).cluster.overlap_slowdown == kOverlapSlowdown);
  CHECK(kOverlapSlowdown == 0.189);
  doc["cluster"]["overlap_slowdown"] = 0;
  CHECK(parse_ok(scenario_to_json(parse_ok(doc))).cluster.overlap_slowdown == 0);
  doc["cluster"]["overlap_slowdown"] = 0.4;
  CHECK(parse_ok(scenario_to_json(parse_ok(doc))).cluster.overlap_slowdown == 0.4);
  for (const json& bad_value : {json(-0.1), json(1.5), json("0.2")}) {
    doc["cluster"]["overlap_slowdown"] = bad_value;
    Result<Scenario> bad = parse_scenario(doc, "t");
    REQUIRE_FALSE(bad.ok());
    CHECK(bad.status().message().rfind("cluster.overlap_slowdown:", 0) == 0);
  }
}

TEST_CASE("cluster.inter_node routing and placement: balanced and contiguous by default, ECMP fields checked",
          "[scenario][cluster]") {
  json doc = base_doc();
  const Scenario plain = parse_ok(doc);
  CHECK(plain.cluster.inter.routing == Routing::kBalanced);
  CHECK(plain.cluster.inter.placement == Placement::kContiguous);
  CHECK_FALSE(plain.cluster.inter.rail_optimized);
  CHECK(plain.cluster.inter.qps_per_connection == 1);

  doc["cluster"]["inter_node"] = {
      {"routing", "ecmp"}, {"rail_optimized", true}, {"qps_per_connection", 4}, {"placement", "scattered"},
      {"seed", 7},         {"leaf_size", 2}};
  const Scenario ecmp = parse_ok(doc);
  CHECK(ecmp.cluster.inter.routing == Routing::kEcmp);
  CHECK(ecmp.cluster.inter.rail_optimized);
  CHECK(ecmp.cluster.inter.qps_per_connection == 4);
  CHECK(ecmp.cluster.inter.placement == Placement::kScattered);
  CHECK(ecmp.cluster.inter.seed == 7);
  check_round_trip(ecmp);

  // Fields that only shape ECMP are errors under balanced routing, not silently ignored.
  doc["cluster"]["inter_node"] = {{"rail_optimized", true}};
  CHECK(parse_error(doc).rfind("cluster.inter_node.rail_optimized:", 0) == 0);
  doc["cluster"]["inter_node"] = {{"qps_per_connection", 2}};
  CHECK(parse_error(doc).rfind("cluster.inter_node.qps_per_connection:", 0) == 0);
  doc["cluster"]["inter_node"] = {{"routing", "adaptive"}};
  CHECK(parse_error(doc).find("\"balanced\", \"ecmp\"") != std::string::npos);
  doc["cluster"]["inter_node"] = {{"placement", "random"}};
  CHECK(parse_error(doc).rfind("cluster.inter_node.placement:", 0) == 0);
  doc["cluster"]["inter_node"] = {{"seed", -1}};
  CHECK(parse_error(doc).rfind("cluster.inter_node.seed:", 0) == 0);
  doc["cluster"]["inter_node"] = {{"routing", "ecmp"}, {"qps_per_connection", 0}};
  CHECK(parse_error(doc).rfind("cluster.inter_node.qps_per_connection:", 0) == 0);
  // One endpoint per (NIC, uplink): 4096 nodes x 8 NICs x 256 uplinks is refused, naming the way out.
  doc["cluster"] = {{"preset", "dgx-h100"}, {"nodes", 4096}, {"inter_node", {{"routing", "ecmp"}}}};
  doc["training"]["global_batch_sequences"] = 32768;
  const std::string too_many = parse_error(doc);
  CHECK(too_many.rfind("cluster.inter_node.routing:", 0) == 0);
  CHECK(too_many.find("rail-optimized") != std::string::npos);
  doc["cluster"]["inter_node"]["rail_optimized"] = true;  // 4096 x 8 x 32 fits
  CHECK(parse_ok(doc).cluster.inter.rail_optimized);
}

TEST_CASE("leaf uplinks carry the leaf's downlinks over the oversubscription", "[scenario][cluster]") {
  ClusterSpec c;
  c.nodes = 10;
  c.nic.per_node = 4;
  c.inter.leaf_size = 8;
  c.inter.oversubscription = 1;
  CHECK(leaf_uplinks(c) == 32);
  CHECK(ecmp_uplinks_per_nic(c) == 32);
  c.inter.rail_optimized = true;  // each rail's leaf: 8 NICs down, 8 up
  CHECK(ecmp_uplinks_per_nic(c) == 8);
  c.inter.oversubscription = 3;  // 8 / 3 ports: 2 (they carry the same capacity between them)
  CHECK(ecmp_uplinks_per_nic(c) == 2);
  c.inter.oversubscription = 100;  // never none
  CHECK(ecmp_uplinks_per_nic(c) == 1);
  CHECK(leaf_uplinks(c) == 1);
}

TEST_CASE("scattered placement fills the same leaves in another order, fixed by the seed", "[scenario][cluster]") {
  ClusterSpec c;
  c.nodes = 100;
  c.inter.leaf_size = 32;
  c.inter.seed = 3;
  const std::vector<int> in_order = node_leaves(c);
  for (int n = 0; n < c.nodes; ++n) CHECK(in_order[n] == n / 32);
  c.inter.placement = Placement::kScattered;
  const std::vector<int> scattered = node_leaves(c);
  CHECK(scattered == node_leaves(c));
  std::vector<int> per_leaf(c.leaves(), 0);
  int moved = 0, neighbours_apart = 0;
  for (int n = 0; n < c.nodes; ++n) {
    ++per_leaf[scattered[n]];
    moved += scattered[n] != in_order[n];
    if (n > 0) neighbours_apart += scattered[n] != scattered[n - 1];
  }
  CHECK(per_leaf == std::vector<int>{32, 32, 32, 4});  // a permutation of the same slots
  // A uniform permutation over these leaves puts consecutive nodes under different leaves ~2/3 of the time.
  CHECK(moved > 50);
  CHECK(neighbours_apart > 50);
  c.inter.seed = 4;
  CHECK(node_leaves(c) != scattered);
}

}  // namespace
}  // namespace hzp

namespace hzp {

TEST_CASE("training.attention: standard by default, pasa only with fp16 flash attention", "[scenario]") {
  json doc = base_doc();
  CHECK(parse_ok(doc).training.attention == AttentionAlgorithm::kStandard);
  doc["training"]["precision"] = "fp16";
  doc["training"]["attention"] = "pasa";
  const Scenario s = parse_ok(doc);
  CHECK(s.training.attention == AttentionAlgorithm::kPasa);
  CHECK(scenario_to_json(s)["training"]["attention"] == "pasa");
  json bf16 = doc;
  bf16["training"]["precision"] = "bf16";
  CHECK_THAT(parse_error(bf16),
             Catch::Contains("training.attention") && Catch::Contains("\"fp16\"") && Catch::Contains("not \"bf16\""));
  json unfused = doc;
  unfused["training"]["flash_attention"] = false;
  CHECK_THAT(parse_error(unfused), Catch::Contains("training.attention") && Catch::Contains("flash_attention true"));
  json unknown = doc;
  unknown["training"]["attention"] = "sage";
  CHECK_THAT(parse_error(unknown), Catch::Contains("training.attention") && Catch::Contains("\"standard\", \"pasa\"") &&
                                       Catch::Contains("sage"));
}
}  // namespace hzp
