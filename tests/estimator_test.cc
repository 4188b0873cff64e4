// The analytic estimator against closed forms: a 1-GPU step is exactly its compute; ring collectives
// follow (p-1)α + (p-1)/p·S/B; a single stream without prefetch serialises compute and communication;
// overlap only ever helps.
#include <cmath>
#include <random>

#include "tests/test_util.h"

#include "shared/cost/collective_cost.h"
#include "shared/scenario/calibration.h"
#include "shared/scenario/presets.h"
#include "shared/schedule/schedule_builder.h"

using namespace hzp;
using namespace hzp::test;

namespace {

double sum_compute(const Built& b) {
  double t = 0;
  for (const Op& op : b.schedule.programs[0].ops)
    if (std::holds_alternative<ComputeOp>(op.body) || std::holds_alternative<OptimizerStepOp>(op.body))
      t += op_duration(b.scenario, b.schedule, 0, op);
  return t;
}

double sum_comm(const Built& b) {
  double t = 0;
  for (const Op& op : b.schedule.programs[0].ops)
    if (std::holds_alternative<CollectiveOp>(op.body)) t += op_duration(b.scenario, b.schedule, 0, op);
  return t;
}

}  // namespace

TEST_CASE("a 1-GPU DDP step takes exactly its compute time", "[estimator]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 1, "ddp", 4096);
  doc["cluster"]["gpus_per_node"] = 1;
  doc["cluster"]["nic"] = {{"per_node", 1}};
  const Built b = build(scenario_from(doc));
  const Estimate e = estimate_of(b);
  CHECK(e.step_time_s == Approx(sum_compute(b)).epsilon(1e-12));
  CHECK(e.comm_s == 0);
  CHECK(e.exposed_comm_s == Approx(0).margin(1e-12));
  // Compute model: flops at peak·gemm efficiency + bytes at HBM·memory-bound efficiency, per op; the A100 has
  // no flash table, so the causal kernel's executed FLOPs run at half the GEMM rate (count them twice).
  REQUIRE(b.scenario.cluster.gpu.flash_rates.empty());
  double expected = 0;
  for (const ModuleCost& m : b.cost.modules)
    expected += compute_time(
        b.scenario.cluster,
        m.fwd_flops + m.bwd_flops + m.recompute_flops + m.fwd_flash_flops + m.bwd_flash_flops + m.recompute_flash_flops,
        m.fwd_mem_bytes + m.bwd_mem_bytes + m.recompute_mem_bytes);
  expected += compute_time(b.scenario.cluster, 0, static_cast<double>(b.cost.params) * kAdamBytesPerParam);
  CHECK(e.step_time_s == Approx(expected).epsilon(1e-9));
  CHECK(e.mfu == Approx(b.cost.model_flops / (e.step_time_s * b.scenario.cluster.gpu.peak_flops)).epsilon(1e-12));
}

TEST_CASE("a 1-GPU step without flash attention times the core's GEMMs as a roofline", "[estimator]") {
  // GPT-2-sized heads (d = 64) on an A100: QK^T and P.V move e / (2d) = 1/64 byte per FLOP, twice the
  // 0.0077 of the A100's HBM rate over its GEMM rate, so the core takes its bytes' time, not its FLOPs'.
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 1, "ddp", 1024);
  doc["model"] = {{"name", "d64-heads"}, {"family", "llama"}, {"layers", 4},        {"hidden", 768},
                  {"heads", 12},         {"kv_heads", 12},    {"ffn_hidden", 2048}, {"vocab", 32000}};
  doc["cluster"]["gpus_per_node"] = 1;
  doc["cluster"]["nic"] = {{"per_node", 1}};
  doc["training"]["flash_attention"] = false;
  const Built b = build(scenario_from(doc));
  const ClusterSpec& c = b.scenario.cluster;
  const double gemm = c.gpu.peak_flops * c.efficiency.gemm, hbm = c.gpu.hbm_bytes_per_s * c.efficiency.memory_bound;
  double expected = 0;
  for (const ModuleCost& m : b.cost.modules) {
    const double core = m.fwd_core_flops + m.bwd_core_flops + m.recompute_core_flops;
    const double core_bytes = m.fwd_core_bytes + m.bwd_core_bytes + m.recompute_core_bytes;
    if (core > 0) CHECK(core_bytes / hbm > 1.5 * core / gemm);
    expected += (m.fwd_flops + m.bwd_flops + m.recompute_flops - core) / gemm +
                std::max(core / gemm, core_bytes / hbm) +
                (m.fwd_mem_bytes + m.bwd_mem_bytes + m.recompute_mem_bytes) / hbm;
  }
  expected += static_cast<double>(b.cost.params) * kAdamBytesPerParam / hbm;
  CHECK(estimate_of(b).step_time_s == Approx(expected).epsilon(1e-9));
}

TEST_CASE("a 1-GPU FP8 step runs the linear layers at the FP8 peak and the rest at the bf16 peak", "[estimator]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-h100", 1, "ddp", 4096);
  doc["cluster"]["gpus_per_node"] = 1;
  doc["cluster"]["nic"] = {{"per_node", 1}};
  doc["training"]["fp8"] = true;
  const Built b = build(scenario_from(doc));
  const ClusterSpec& c = b.scenario.cluster;
  REQUIRE(c.gpu.fp8_peak_flops == Approx(1979e12));  // NVIDIA H100 SXM datasheet, dense
  REQUIRE(c.gpu.fp8_gemm_vs_bf16 == Approx(0.908));  // calibration.cc: FP8 products measured against bf16 ones
  double expected = 0, fp8_flops = 0;
  const double fwd_flash = flash_vs_gemm(c.gpu, false, 128, 4096), bwd_flash = flash_vs_gemm(c.gpu, true, 128, 4096);
  for (const ModuleCost& m : b.cost.modules) {
    const double all = m.fwd_flops + m.bwd_flops + m.recompute_flops;
    const double in_fp8 = m.fwd_fp8_flops + m.bwd_fp8_flops + m.recompute_fp8_flops;
    // The flash kernel (bf16) at its own multiple of the GEMM rate.
    const double flash = m.fwd_flash_flops / fwd_flash + m.bwd_flash_flops / bwd_flash;
    fp8_flops += in_fp8;
    expected +=
        (all - in_fp8 - m.fwd_flash_flops - m.bwd_flash_flops + flash) / (c.gpu.peak_flops * c.efficiency.gemm) +
        in_fp8 / (c.gpu.fp8_peak_flops * c.gpu.fp8_gemm_vs_bf16 * c.efficiency.gemm) +
        (m.fwd_mem_bytes + m.bwd_mem_bytes + m.recompute_mem_bytes) /
            (c.gpu.hbm_bytes_per_s * c.efficiency.memory_bound) +
        (m.fwd_gemms + m.bwd_gemms + m.recompute_gemms) * c.gpu.gemm_overhead_s;  // 7B: compute-bound
  }
  expected +=
      static_cast<double>(b.cost.params) * kAdamBytesPerParam / (c.gpu.hbm_bytes_per_s * c.efficiency.memory_bound);
  CHECK(fp8_flops > 0);
  CHECK(estimate_of(b).step_time_s == Approx(expected).epsilon(1e-9));
  // Faster than the same step in bf16, slower than everything at the FP8 peak.
  doc["training"]["fp8"] = false;
  const double bf16_s = estimate_of(build(scenario_from(doc))).step_time_s;
  doc["cluster"]["gpu"] = {{"peak_tflops", 1979}};
  const double all_fp8_s = estimate_of(build(scenario_from(doc))).step_time_s;
  CHECK(expected < bf16_s);
  CHECK(expected > all_fp8_s);
}

// GEMM efficiency by shape (GpuSpec::gemm_overhead_s, ComputeOp::gemms / gemm_bytes): every GEMM kernel adds
// the GPU's fixed cost, and products whose operands outweigh their FLOPs (few rows per expert) take as long as
// their bytes at the HBM rate. Checked against the closed form on one GPU, where the step is its compute.
TEST_CASE("a 1-GPU step adds each GEMM kernel's fixed cost, and few rows per expert make the experts bytes-bound",
          "[estimator]") {
  auto one_gpu = [](nlohmann::json doc) {
    doc["cluster"]["gpus_per_node"] = 1;
    doc["cluster"]["nic"] = {{"per_node", 1}};
    return doc;
  };
  // Dense: the products are large, so the fixed cost is all the shape adds; 0 takes it out exactly.
  nlohmann::json doc = one_gpu(scenario_json("llama2-7b", "dgx-h100", 1, "ddp", 4096));
  const Built b = build(scenario_from(doc));
  const double t0 = b.scenario.cluster.gpu.gemm_overhead_s;
  REQUIRE(t0 == Approx(6.75e-6));  // calibration.cc: h100_kernels.json's fit
  long long kernels = 0;
  for (const ModuleCost& m : b.cost.modules) {
    kernels += m.fwd_gemms + m.bwd_gemms + m.recompute_gemms;
    CHECK(m.fwd_gemm_bytes == Approx(m.bwd_gemm_bytes / 2));
  }
  // 32 layers x (QKV, output, gate + up, down) + the head: 129 forward, twice as many backward.
  CHECK(kernels == 3 * (32 * 4 + 1));
  doc["cluster"]["gpu"] = {{"gemm_overhead_us", 0}};
  const double without = estimate_of(build(scenario_from(doc))).step_time_s;
  CHECK(estimate_of(b).step_time_s - without == Approx(static_cast<double>(kernels) * t0).epsilon(1e-6));

  // MoE with 64 experts of 256 rows each on one GPU, 16 tokens: each expert GEMM reads its weights for 32 rows
  // (16 x top-2), far below Hopper's ridge, so the experts take their bytes' time, not their FLOPs'.
  nlohmann::json moe = one_gpu(scenario_json("llama2-7b", "dgx-h100", 1, "ddp", 16));
  moe["model"] = {{"preset", "tiny-moe"},
                  {"layers", 1},
                  {"hidden", 1024},
                  {"heads", 8},
                  {"ffn_hidden", 256},
                  {"vocab", 1024},
                  {"moe", {{"experts", 64}, {"top_k", 2}, {"expert_ffn_hidden", 256}}}};
  moe["training"]["micro_batch"] = 1;
  const Built bm = build(scenario_from(moe));
  const ClusterSpec& c = bm.scenario.cluster;
  const auto it = std::find_if(bm.cost.modules.begin(), bm.cost.modules.end(),
                               [](const ModuleCost& m) { return m.kind == ModuleKind::kMoe; });
  REQUIRE(it != bm.cost.modules.end());
  CHECK(it->fwd_gemms == 1 + 2 * 64);  // the router, each expert's gate + up and down
  const double gemm = c.gpu.peak_flops * c.efficiency.gemm, hbm = c.gpu.hbm_bytes_per_s * c.efficiency.memory_bound;
  CHECK(it->fwd_gemm_bytes / hbm > 10 * it->fwd_flops / gemm);
  ComputeOp fwd;
  fwd.flops = it->fwd_flops, fwd.mem_bytes = it->fwd_mem_bytes, fwd.gemms = it->fwd_gemms;
  fwd.gemm_bytes = it->fwd_gemm_bytes;
  CHECK(compute_time(c, fwd) == Approx(it->fwd_gemm_bytes / hbm + it->fwd_mem_bytes / hbm + it->fwd_gemms * 6.75e-6));
}

// NCCL's per-collective base latency for Simple (src/graph/tuning.cc, baseLat Ring/Simple), the cluster
// default protocol; and its "plateau" factor on a Simple all-reduce ring's latency across nodes.
constexpr double kNcclBase = 8.4e-6;
constexpr double kPlateau = 1.4;

TEST_CASE("collective algorithms follow their α–β closed forms", "[estimator][collective]") {
  const Scenario s = scenario_from(scenario_json("tiny-dense", "dgx-a100", 4, "ddp", 64));
  const ClusterSpec& c = s.cluster;
  const double S = 1e9;
  const double b_intra = c.intra.bytes_per_s * c.efficiency.intra_node;
  const double rail = c.nic.per_node * c.nic.bytes_per_s / c.gpus_per_node * c.efficiency.inter_node;
  const GroupShape node{8, 1, 8}, rail_group{1, 4, 1}, all{8, 4, 8};
  const LinkParams l = link_params(c, all);
  CHECK(l.intra == Approx(b_intra));
  CHECK(l.rail == Approx(rail));
  // Intra-node ring all-gather among the 8 GPUs of a node: (7/8)·S/B + 7α.
  CHECK(collective_time(c, CollectiveKind::kAllGather, S, node) ==
        Approx(kNcclBase + 7.0 / 8 * S / b_intra + 7 * c.intra.latency_s));
  CHECK(choose_algorithm(c, CollectiveKind::kAllGather, S, node) == CollectiveAlgorithm::kRing);
  CHECK(collective_time(c, CollectiveKind::kAllReduce, S, node) ==
        Approx(kNcclBase + 2 * (7.0 / 8 * S / b_intra + 7 * c.intra.latency_s)));
  // One GPU per node across 4 nodes (a rail ring): its NIC share.
  CHECK(collective_time(c, CollectiveKind::kReduceScatter, S, rail_group) ==
        Approx(kNcclBase + 3.0 / 4 * S / rail + 3 * l.alpha_inter));
  // Whole nodes: the ring has one channel per NIC (8 rails), capped by NVLink; of its 2·31 steps the
  // 2·4 crossing nodes on the critical path cost α_n, the others α_i; hierarchical: intra RS, 8 concurrent
  // rail rings on S/8, intra AG. The ring's latency (with the base) pays the plateau factor.
  const double ring = 2 * 31.0 / 32 * S / std::min(8 * rail, b_intra) +
                      kPlateau * (kNcclBase + (62 - 8) * l.alpha_intra + 8 * l.alpha_inter);
  const double intra_pass = 7.0 / 8 * S / b_intra + 7 * c.intra.latency_s;
  const double hier = kNcclBase + 2 * intra_pass + 2 * (3.0 / 4 * (S / 8) / rail + 3 * l.alpha_inter);
  CHECK(algorithm_time(c, CollectiveAlgorithm::kRing, CollectiveKind::kAllReduce, S, all) == Approx(ring));
  CHECK(algorithm_time(c, CollectiveAlgorithm::kHierarchical, CollectiveKind::kAllReduce, S, all) == Approx(hier));
  CHECK(collective_time(c, CollectiveKind::kAllReduce, S, all) == Approx(std::min(ring, hier)));
  // Latency-bound sizes: the 2-level algorithm pays 2·(7 intra + 3 inter) steps instead of 2·(28 + 3).
  CHECK(choose_algorithm(c, CollectiveKind::kAllReduce, 1e4, all) == CollectiveAlgorithm::kHierarchical);
  // All-to-all, pairwise: max(intra 7/32·S/B_i, inter 24/32·S/B_rail) + 31 α.
  CHECK(collective_time(c, CollectiveKind::kAllToAll, S, all) ==
        Approx(kNcclBase + 31 * l.alpha_inter + std::max(7.0 / 32 * S / b_intra, 24.0 / 32 * S / rail)));
  CHECK(collective_time(c, CollectiveKind::kAllGather, S, GroupShape{1, 1, 1}) == 0);
}

TEST_CASE("ring critical path: the network hops of the slowest piece, counted by walking the ring",
          "[estimator][collective]") {
  // Rank i of the ring sits on node i / s0 (a ring visits each node's ranks in a row); link i joins rank i to
  // rank i+1 and crosses nodes when they differ. A piece starting at rank r moves one link per step: AG / RS /
  // BC p-1 steps, AR 2(p-1). The latency ends with the slowest piece: the most node-crossing links it walks.
  for (int s0 = 1; s0 <= 5; ++s0)
    for (int s1 = 1; s1 <= 6; ++s1)
      for (CollectiveKind kind : {CollectiveKind::kAllGather, CollectiveKind::kReduceScatter,
                                  CollectiveKind::kBroadcast, CollectiveKind::kAllReduce}) {
        const int p = s0 * s1;
        const int steps = kind == CollectiveKind::kAllReduce ? 2 * (p - 1) : p - 1;
        int worst = 0;
        for (int start = 0; start < p; ++start) {
          int crossings = 0;
          for (int k = 0; k < steps; ++k) {
            const int from = (start + k) % p, to = (start + k + 1) % p;
            crossings += from / s0 != to / s0;
          }
          worst = std::max(worst, crossings);
        }
        INFO("s0 " << s0 << ", s1 " << s1 << ", " << to_string(kind));
        CHECK(ring_critical_inter_steps(kind, GroupShape{s0, s1, s0}) == worst);
      }
}

TEST_CASE("full mesh: direct inside the node, forced algorithms only where they apply", "[estimator][collective]") {
  nlohmann::json doc = scenario_json("tiny-dense", "npu-16", 4, "ddp", 64);
  doc["cluster"]["collective_algorithm"] = "ring";
  const Scenario s = scenario_from(doc);
  const ClusterSpec& c = s.cluster;
  const double b = c.intra.bytes_per_s * c.efficiency.intra_node;
  const GroupShape node{16, 1, 8}, half{8, 1, 4};
  // Every GPU sends its 1/p to each peer over its own pair link of B/(R-1).
  CHECK(choose_algorithm(c, CollectiveKind::kAllGather, 1e9, node) == CollectiveAlgorithm::kDirect);
  CHECK(collective_time(c, CollectiveKind::kAllGather, 1e9, node) ==
        Approx(kNcclBase + 15.0 / 16 * 1e9 / b + 15 * c.intra.latency_s));
  CHECK(collective_time(c, CollectiveKind::kAllGather, 1e9, half) ==
        Approx(kNcclBase + 15.0 / 8 * 1e9 / b + 7 * c.intra.latency_s));
  // "ring" is forced where it applies (across nodes) and ignored where it does not (inside one mesh node).
  CHECK(choose_algorithm(c, CollectiveKind::kAllReduce, 1e9, GroupShape{1, 4, 1}) == CollectiveAlgorithm::kRing);
  CHECK(choose_algorithm(c, CollectiveKind::kAllReduce, 1e9, GroupShape{16, 4, 8}) == CollectiveAlgorithm::kRing);
  CHECK(choose_algorithm(c, CollectiveKind::kAllReduce, 1e9, node) == CollectiveAlgorithm::kDirect);
  // Across mesh nodes the ring's intra hops use min(s0-1, channels) = 8 of the 15 pair links.
  const LinkParams l = link_params(c, GroupShape{16, 4, 8});
  CHECK(
      algorithm_time(c, CollectiveAlgorithm::kRing, CollectiveKind::kAllGather, 1e9, GroupShape{16, 4, 8}) ==
      Approx(kNcclBase + 59 * l.alpha_intra + 4 * l.alpha_inter + 63.0 / 64 * 1e9 / std::min(16 * l.rail, b * 8 / 15)));
}

TEST_CASE("one stream without prefetch serialises compute and communication", "[estimator][overlap]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 2, "zero3", 4096);
  doc["cluster"]["overlap_slowdown"] = 0;  // overlapped compute as fast as serial compute
  doc["policy"]["overlap"] = {{"prefetch_depth", 0}, {"separate_streams", false}};
  const Built serial = build(scenario_from(doc));
  const Estimate es = estimate_of(serial);
  CHECK(es.step_time_s == Approx(sum_compute(serial) + sum_comm(serial)).epsilon(1e-9));
  CHECK(es.overlap_fraction == Approx(0).margin(1e-9));

  doc["policy"]["overlap"] = {{"prefetch_depth", 1}, {"separate_streams", true}};
  const Built overlapped = build(scenario_from(doc));
  const Estimate eo = estimate_of(overlapped);
  CHECK(eo.step_time_s < es.step_time_s);
  CHECK(eo.step_time_s >= std::max(sum_compute(overlapped), eo.comm_s / overlapped.schedule.streams.size()) - 1e-12);
  CHECK(eo.overlap_fraction > 0.5);
  CHECK(eo.compute_s == Approx(es.compute_s));
}

TEST_CASE("model FLOPs in the estimate follow the closed form of docs/model_math.md", "[estimator][flops]") {
  const Built b = build(scenario_from(scenario_json("llama2-7b", "dgx-h100", 2, "zero2", 4096, 16 * 4)));
  const Estimate e = estimate_of(b);
  CHECK(e.model_flops_per_gpu == Approx(model_flops_formula(b.scenario.model, 4, 4096)).epsilon(1e-9));
  CHECK(e.tokens_per_s == Approx(64.0 * 4096 / e.step_time_s));
}

TEST_CASE("memory verdict: llama2-70b does not fit under DDP on 80 GB GPUs, fits under ZeRO-3 on 64",
          "[estimator][memory]") {
  auto run = [](const char* policy) {
    nlohmann::json doc = scenario_json("llama2-70b", "dgx-h100", 8, policy, 4096);
    doc["training"]["recompute"] = "full";
    return estimate_of(build(scenario_from(doc)));
  };
  const Estimate ddp = run("ddp"), zero3 = run("zero3");
  CHECK_FALSE(ddp.fits_memory);
  CHECK(ddp.memory.total() > 16 * 68e9);
  CHECK(zero3.fits_memory);
}

TEST_CASE("the estimator takes compute times from the DurationModel it is given", "[estimator][durations]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 1, "ddp", 4096);
  doc["cluster"]["gpus_per_node"] = 1;
  doc["cluster"]["nic"] = {{"per_node", 1}};
  const Built b = build(scenario_from(doc));
  const RooflineDurations roofline(b.scenario.cluster);
  const ScaledComputeDurations slow(b.scenario.cluster, 3.0);
  auto base = estimate(b.scenario, b.cost, b.schedule, &roofline);
  auto scaled = estimate(b.scenario, b.cost, b.schedule, &slow);
  REQUIRE(base.ok());
  REQUIRE(scaled.ok());
  // One GPU, no communication: the step grows by exactly the extra compute; MFU is derived from it.
  const double extra = compute_ops_time(b, slow) - compute_ops_time(b, roofline);
  CHECK(extra > 0);
  CHECK(scaled->step_time_s == Approx(base->step_time_s + extra).epsilon(1e-12));
  CHECK(scaled->mfu == Approx(base->mfu * base->step_time_s / scaled->step_time_s).epsilon(1e-12));
  CHECK(estimate_of(b).step_time_s == Approx(base->step_time_s).epsilon(1e-15));  // null = the roofline
}

TEST_CASE("fixed_normal is a standard normal, the same for an index everywhere", "[durations]") {
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const double z = fixed_normal(static_cast<std::uint64_t>(i));
    sum += z;
    sq += z * z;
  }
  CHECK(sum / n == Approx(0).margin(0.01));
  CHECK(sq / n == Approx(1).epsilon(0.01));
  CHECK(fixed_normal(7) == fixed_normal(7));
  const RooflineDurations roofline(ClusterSpec{});
  const SpreadDurations spread(roofline, 0.02);
  CHECK(spread.speed_factor(3) == Approx(1 + 0.02 * fixed_normal(3)).epsilon(1e-15));
}

TEST_CASE("NCCL protocols: LL and LL128 trade bandwidth for per-step latency as NCCL's tuner says",
          "[estimator][collective]") {
  nlohmann::json doc = scenario_json("tiny-dense", "dgx-h100", 4, "ddp", 64);
  doc["cluster"]["protocol"] = "auto";
  const Scenario s = scenario_from(doc);
  const ClusterSpec& c = s.cluster;
  const GroupShape all{8, 4, 8};
  const double b_intra = c.intra.bytes_per_s * c.efficiency.intra_node;
  const double rail = c.nic.per_node * c.nic.bytes_per_s / c.gpus_per_node * c.efficiency.inter_node;
  const double sw = 2 * c.inter.switch_latency_s;
  // NCCL's tables (src/graph/tuning.cc): baseLat LL 6.6 / LL128 14.0 µs; hwLat Ring NVLINK LL .6 / LL128 1.9
  // (of Simple's 3.4) and NET LL 2.7 / LL128 4.0 (of Simple's 14.0); across nodes an intra step costs at
  // least the 1 µs network post overhead. Bandwidth: LL128 0.92, LL 1/2 capped at 20.4 GB/s beyond 2 nodes.
  const double ll128_ai = c.intra.latency_s * 1.9 / 3.4, ll128_an = c.nic.latency_s * 4.0 / 14.0 + sw;
  const double ll_ai = std::max(c.intra.latency_s * 0.6 / 3.4, 1e-6), ll_an = c.nic.latency_s * 2.7 / 14.0 + sw;
  const double S = 64 * 1024.0 * 1024.0;
  const double ll128 = 14.0e-6 + 27 * ll128_ai + 4 * ll128_an + 31.0 / 32 * S / (0.92 * std::min(8 * rail, b_intra));
  const double ll = 6.6e-6 + 27 * ll_ai + 4 * ll_an + 31.0 / 32 * S / 20.4e9;
  CHECK(algorithm_time(c, CollectiveAlgorithm::kRing, CollectiveKind::kAllGather, S, all, NcclProtocol::kLL128) ==
        Approx(ll128));
  CHECK(algorithm_time(c, CollectiveAlgorithm::kRing, CollectiveKind::kAllGather, S, all, NcclProtocol::kLL) ==
        Approx(ll));
  // "auto": LL for tiny messages, LL128 in between, Simple for large ones.
  CHECK(choose_protocol(c, CollectiveAlgorithm::kRing, CollectiveKind::kAllGather, 4096, all) == NcclProtocol::kLL);
  CHECK(choose_protocol(c, CollectiveAlgorithm::kRing, CollectiveKind::kAllGather, S, all) == NcclProtocol::kLL128);
  CHECK(choose_protocol(c, CollectiveAlgorithm::kRing, CollectiveKind::kAllGather, 8e9, all) == NcclProtocol::kSimple);
  // Direct and pairwise exchanges always use Simple; the default (no "protocol") is Simple everywhere.
  CHECK(choose_protocol(c, CollectiveAlgorithm::kPairwise, CollectiveKind::kAllToAll, 4096, all) ==
        NcclProtocol::kSimple);
  const Scenario plain = scenario_from(scenario_json("tiny-dense", "dgx-h100", 4, "ddp", 64));
  CHECK(plain.cluster.protocol == ProtocolChoice::kSimple);
  CHECK(choose_protocol(plain.cluster, CollectiveAlgorithm::kRing, CollectiveKind::kAllGather, 4096, all) ==
        NcclProtocol::kSimple);
}

TEST_CASE("NCCL protocols: LL's one-node cap is per architecture, one GPU per node pays the tree's NET latency",
          "[estimator][collective]") {
  // NCCL 2.26.2 src/graph/tuning.cc: Ring/LL busBw = min(llMaxBw, busBw * .5) with llMaxBw on one node
  // 87.7 GB/s (Ampere) and 141 GB/s (Hopper); with ppn == 1 the inter-node latency is hwLat[NET][Tree][p]
  // (LL 5.0, LL128 8.5, Simple 14 us) in place of the ring's (2.7, 4.0, 14).
  const GroupShape node{8, 1, 8};
  const Scenario h100 = scenario_from(scenario_json("tiny-dense", "dgx-h100", 1, "ddp", 64));
  const Scenario a100 = scenario_from(scenario_json("tiny-dense", "dgx-a100", 1, "ddp", 64));
  CHECK(h100.cluster.gpu.arch == GpuArch::kHopper);
  CHECK(a100.cluster.gpu.arch == GpuArch::kAmpere);
  for (const Scenario* s : {&h100, &a100}) {
    const ClusterSpec& c = s->cluster;
    const double cap = c.gpu.arch == GpuArch::kHopper ? 141e9 : 87.7e9;
    const double b_intra = c.intra.bytes_per_s * c.efficiency.intra_node;
    const LinkParams ll = link_params(c, node, NcclProtocol::kLL);
    CHECK(ll.bandwidth_factor == Approx(std::min(0.5, cap / b_intra)));
    CHECK(ll.bandwidth_factor * b_intra <= cap * (1 + 1e-12));
  }
  // The two caps differ, so the same LL ring on one node is faster on Hopper when its NVLink allows it.
  CHECK(link_params(h100.cluster, node, NcclProtocol::kLL).bandwidth_factor * h100.cluster.intra.bytes_per_s *
            h100.cluster.efficiency.intra_node >
        link_params(a100.cluster, node, NcclProtocol::kLL).bandwidth_factor * a100.cluster.intra.bytes_per_s *
            a100.cluster.efficiency.intra_node);

  const ClusterSpec& c = h100.cluster;
  const double sw = 2 * c.inter.switch_latency_s;
  const GroupShape one_per_node{1, 4, 1}, full{8, 4, 8};
  CHECK(link_params(c, one_per_node, NcclProtocol::kLL).alpha_inter == Approx(c.nic.latency_s * 5.0 / 14 + sw));
  CHECK(link_params(c, full, NcclProtocol::kLL).alpha_inter == Approx(c.nic.latency_s * 2.7 / 14 + sw));
  CHECK(link_params(c, one_per_node, NcclProtocol::kLL128).alpha_inter == Approx(c.nic.latency_s * 8.5 / 14 + sw));
  CHECK(link_params(c, one_per_node, NcclProtocol::kSimple).alpha_inter ==
        link_params(c, full, NcclProtocol::kSimple).alpha_inter);
}

TEST_CASE("cluster.protocol: known names parse, others are refused with the path", "[estimator][collective]") {
  nlohmann::json doc = scenario_json("tiny-dense", "dgx-h100", 2, "ddp", 64);
  doc["cluster"]["protocol"] = "ll128";
  CHECK(scenario_from(doc).cluster.protocol == ProtocolChoice::kLL128);
  doc["cluster"]["protocol"] = "LL256";
  auto bad = parse_scenario(doc, "t");
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("cluster.protocol"));
}

TEST_CASE("overlap slowdown: compute beside a collective runs 1 / (1 + s) as fast, closed forms", "[estimator]") {
  CHECK(slowed_compute_end(3, 2, {}, 0.5) == Approx(5));
  CHECK(slowed_compute_end(0, 2, {{0, 10}}, 1.0) == Approx(4));  // wholly inside: twice as long
  CHECK(slowed_compute_end(0, 3, {{1, 3}}, 1.0) == Approx(4));   // 1 alone, 1 in 2 s, 1 alone
  CHECK(slowed_compute_end(0, 10, {{2, 5}, {1, 3}}, 0.5) == Approx(5 + (10 - 1 - 4 / 1.5)));  // union [1, 5)
  CHECK(slowed_compute_end(6, 1, {{1, 5}}, 0.5) == Approx(7));  // the collective ended before
  CHECK(slowed_compute_end(0, 1, {{4, 9}}, 0.5) == Approx(1));  // ... or starts after
}

TEST_CASE("overlap slowdown: no effect on one GPU, on two nodes slower with compute at most 1 + s times",
          "[estimator]") {
  nlohmann::json one = scenario_json("llama2-7b", "dgx-a100", 1, "ddp", 4096);
  one["cluster"]["gpus_per_node"] = 1;
  one["cluster"]["nic"] = {{"per_node", 1}};
  const double alone = estimate_of(build(scenario_from(one))).step_time_s;
  one["cluster"]["overlap_slowdown"] = 0.5;
  CHECK(estimate_of(build(scenario_from(one))).step_time_s == Approx(alone).epsilon(1e-12));

  nlohmann::json two = scenario_json("llama2-7b", "dgx-a100", 2, "zero3", 4096, 16 * 2);
  const Estimate base = estimate_of(build(scenario_from(two)));
  two["cluster"]["overlap_slowdown"] = 0.3;
  const Estimate slowed = estimate_of(build(scenario_from(two)));
  CHECK(slowed.step_time_s > base.step_time_s * 1.01);
  CHECK(slowed.compute_s > base.compute_s * 1.01);
  CHECK(slowed.compute_s <= base.compute_s * 1.3 * (1 + 1e-12));
}

TEST_CASE("ECMP slowdown: 1 where nothing hashes, the multinomial's expected maximum where flows collide",
          "[estimator][collective][ecmp]") {
  ClusterSpec c = *cluster_preset("dgx-a100");
  c.nodes = 8;
  c.nic.per_node = 4;
  c.inter.leaf_size = 2;  // 4 leaves of 2 nodes, 2 · 4 / 1 = 8 uplinks each
  const GroupShape all{8, 8, 4};
  CHECK(ecmp_slowdown(c, all) == 1);  // balanced routing
  c.inter.routing = Routing::kEcmp;
  CHECK(ecmp_slowdown(c, {8, 2, 4}) == 1);  // in order, two nodes under one leaf
  CHECK(ecmp_slowdown(c, {8, 1, 4}) == 1);

  // Independent check: throw the flows onto uplinks. In order, each of the 4 leaves sends one crossing of
  // 4 NICs x 2 channels = 8 flows over its 8 uplinks; a flow runs at nic / max(2, load of its uplink).
  std::mt19937 rng(12345);
  auto expected_max = [&](int pools, int flows, int uplinks, int per_nic) {
    constexpr int kTrials = 20000;
    double sum = 0;
    for (int t = 0; t < kTrials; ++t) {
      int worst = 0;
      for (int pool = 0; pool < pools; ++pool) {
        std::vector<int> load(uplinks, 0);
        for (int f = 0; f < flows; ++f) worst = std::max(worst, ++load[rng() % uplinks]);
      }
      sum += std::max(per_nic, worst);
    }
    return sum / kTrials / per_nic;
  };
  const double mc = expected_max(4, 8, 8, 2);
  CHECK(mc > 1.5);  // collisions are the rule here
  // Poisson loads are a little heavier-tailed than the multinomial's: within 10 %, above it.
  CHECK(ecmp_slowdown(c, all) == Approx(mc).epsilon(0.10));
  CHECK(ecmp_slowdown(c, all) >= mc * 0.99);
  // Four queue pairs per channel: 32 flows of a quarter the size each, over the same 8 uplinks.
  c.inter.qps_per_connection = 4;
  CHECK(ecmp_slowdown(c, all) == Approx(expected_max(4, 32, 8, 8)).epsilon(0.10));
  CHECK(ecmp_slowdown(c, all) < mc);
  // Rail-optimized with one uplink per rail's leaf: each uplink carries exactly its NIC's 2 flows.
  c.inter.qps_per_connection = 1;
  c.inter.rail_optimized = true;
  c.inter.leaf_size = 1;
  CHECK(ecmp_uplinks_per_nic(c) == 1);
  CHECK(ecmp_slowdown(c, all) == 1);
  // The slowdown is what the closed form's rail bandwidth loses across leaves.
  c.inter.rail_optimized = false;
  c.inter.leaf_size = 2;
  const double ecmp_rail = link_params(c, all).rail;
  c.inter.routing = Routing::kBalanced;
  CHECK(link_params(c, all).rail == Approx(ecmp_rail * ecmp_slowdown(
                                                           [&] {
                                                             ClusterSpec e = c;
                                                             e.inter.routing = Routing::kEcmp;
                                                             return e;
                                                           }(),
                                                           all)));
}

// Flash attention's own rate (GpuSpec::flash_rates, flash_vs_gemm): the table's points exactly, log-linear
// between them in the sequence and the head dimension, clamped outside, 0.5 without a table.
TEST_CASE("flash_vs_gemm interpolates the GPU's measured table", "[estimator][flash]") {
  GpuSpec gpu;
  CHECK(flash_vs_gemm(gpu, false, 128, 4096) == kNoFlashTable);
  gpu.flash_rates = {{64, 1024, 0.3, 0.2}, {64, 4096, 0.5, 0.4}, {128, 1024, 0.6, 0.4}, {128, 4096, 0.8, 0.6}};
  CHECK(flash_vs_gemm(gpu, false, 64, 1024) == Approx(0.3));
  CHECK(flash_vs_gemm(gpu, true, 128, 4096) == Approx(0.6));
  CHECK(flash_vs_gemm(gpu, false, 64, 2048) == Approx(0.4));  // half-way in log2(seq)
  CHECK(flash_vs_gemm(gpu, true, 128, 2048) == Approx(0.5));
  CHECK(flash_vs_gemm(gpu, false, 128, 512) == Approx(0.6));    // clamped below ...
  CHECK(flash_vs_gemm(gpu, false, 128, 65536) == Approx(0.8));  // ... and above
  CHECK(flash_vs_gemm(gpu, false, 32, 4096) == Approx(0.5));
  CHECK(flash_vs_gemm(gpu, true, 256, 1024) == Approx(0.4));
  // Between head dimensions, half-way in log2(head_dim) at 2048 keys: (0.4 + 0.7) / 2.
  CHECK(flash_vs_gemm(gpu, false, std::sqrt(64.0 * 128), 2048) == Approx(0.55));
  // Hopper's table is the one calibration.cc carries (tools/flash_rate_table.py, tests/flash_rate_table.sh).
  const GpuSpec h100 = calibration_for("h100-sxm")->gpu;
  CHECK(flash_vs_gemm(h100, false, 128, 4096) == Approx(0.770));
  CHECK(flash_vs_gemm(h100, true, 128, 4096) == Approx(0.618));
  CHECK(calibration_for("a100-80gb")->gpu.flash_rates.empty());
}

// A 1-GPU step's attention: the flash kernel's executed FLOPs at the GEMM rate times flash_vs_gemm. Without a
// table (A100) that is the full causal count at the GEMM rate, the model before the tables.
TEST_CASE("a 1-GPU step times the flash kernel's executed FLOPs at its own rate", "[estimator][flash]") {
  for (const char* cluster : {"dgx-h100", "dgx-a100"}) {
    nlohmann::json doc = scenario_json("llama2-7b", cluster, 1, "ddp", 4096);
    doc["cluster"]["gpus_per_node"] = 1;
    doc["cluster"]["nic"] = {{"per_node", 1}};
    const Built b = build(scenario_from(doc));
    const ClusterSpec& c = b.scenario.cluster;
    INFO(cluster);
    const double gemm = c.gpu.peak_flops * c.efficiency.gemm, hbm = c.gpu.hbm_bytes_per_s * c.efficiency.memory_bound;
    const double fwd_ratio = flash_vs_gemm(c.gpu, false, 128, 4096), bwd_ratio = flash_vs_gemm(c.gpu, true, 128, 4096);
    double expected = 0, flash = 0;
    for (const ModuleCost& m : b.cost.modules) {
      const double all = m.fwd_flops + m.bwd_flops + m.recompute_flops;
      const double fwd_flash = m.fwd_flash_flops + m.recompute_flash_flops;
      flash += fwd_flash + m.bwd_flash_flops;
      expected += (all - fwd_flash - m.bwd_flash_flops) / gemm + fwd_flash / (gemm * fwd_ratio) +
                  m.bwd_flash_flops / (gemm * bwd_ratio) +
                  (m.fwd_mem_bytes + m.bwd_mem_bytes + m.recompute_mem_bytes) / hbm +
                  (m.fwd_gemms + m.bwd_gemms + m.recompute_gemms) * c.gpu.gemm_overhead_s;
    }
    expected += static_cast<double>(b.cost.params) * kAdamBytesPerParam / hbm;
    CHECK(flash > 0);
    CHECK(estimate_of(b).step_time_s == Approx(expected).epsilon(1e-9));
    if (c.gpu.flash_rates.empty()) CHECK(fwd_ratio == 0.5);  // the executed half at half the rate: the full count
  }
}
