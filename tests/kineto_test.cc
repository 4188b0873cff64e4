// The PyTorch profiler importer (shared/trace/import/kineto.h) on small synthetic traces, each built here
// event by event, so that every rule of the reader and of the layout onto a schedule is checked against
// numbers worked out by hand. (tests/kineto_import_test.sh runs it on the real H100 recordings.)
#include "tests/test_util.h"

#include <map>
#include <numeric>

#include "shared/trace/import/kineto.h"

using namespace hzp;
using namespace hzp::test;
using nlohmann::json;

namespace {

// A complete ("X") event.
json ev(const std::string& cat, const std::string& name, double ts, double dur, json args = json::object()) {
  return {{"ph", "X"}, {"cat", cat}, {"name", name}, {"ts", ts}, {"dur", dur}, {"args", std::move(args)}};
}
// GPU work of `cat` launched at CPU time `launched` (a cuda_runtime call with the same correlation id).
void gpu_work(json& events, const std::string& cat, const std::string& name, double launched, double ts, double dur,
              int correlation, json extra = json::object()) {
  events.push_back(ev("cuda_runtime", "cudaLaunchKernel", launched, 1, {{"correlation", correlation}}));
  extra["correlation"] = correlation;
  events.push_back(ev(cat, name, ts, dur, extra));
}
json doc_of(json events) {
  return {{"traceEvents", std::move(events)}};
}

// Two profiler steps: step 0 runs forward, backward (launched between forward and optimizer, no annotation),
// an NCCL all-reduce sized by its record_param_comms call, and the optimizer; step 1 a forward.
json two_steps() {
  json e = json::array();
  e.push_back(ev("user_annotation", "ProfilerStep#0", 0, 1000));
  e.push_back(ev("user_annotation", "ProfilerStep#1", 1000, 1000));
  e.push_back(ev("user_annotation", "DistributedDataParallel.forward", 10, 190));
  e.push_back(ev("user_annotation", "Optimizer.step#AdamW.step", 800, 100));
  e.push_back(ev("user_annotation", "## forward ##", 1010, 190));
  gpu_work(e, "kernel", "ampere_sgemm_128x64_tn", 20, 50, 100, 1);               // forward
  gpu_work(e, "gpu_memset", "Memset (Device)", 40, 160, 10, 5);                  // forward, not a kernel
  gpu_work(e, "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 30, 170, 7, 4);  // host copy: ignored
  gpu_work(e, "kernel", "void at::native::elementwise", 300, 320, 200, 2);       // backward
  e.push_back(ev("cpu_op", "record_param_comms", 400, 10, {{"In msg nelems", 1000}, {"dtype", "Float"}}));
  gpu_work(e, "kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 405, 550, 50, 6);
  gpu_work(e, "kernel", "multi_tensor_apply_kernel", 850, 860, 30, 3);  // optimizer
  gpu_work(e, "kernel", "ampere_sgemm_128x64_tn", 1050, 1100, 100, 7);  // step 1 forward
  gpu_work(e, "kernel", "stray", 5000, 5000, 40, 8);                    // after every step
  return e;
}

}  // namespace

TEST_CASE("kineto: GPU time by step and phase, NCCL collectives sized by their launch", "[kineto]") {
  auto p = read_kineto(doc_of(two_steps()), "synthetic");
  REQUIRE(p.ok());
  REQUIRE(p->steps.size() == 2);
  const KinetoStep& s0 = p->steps[0];
  CHECK(s0.busy_us[0] == 110);  // sgemm + memset; the host copy is not compute
  CHECK(s0.busy_us[1] == 200);  // launched after forward ended, before the optimizer: backward
  CHECK(s0.busy_us[2] == 30);
  CHECK(s0.kernel_us == 330);  // kernels only: neither the memset nor NCCL's
  CHECK(s0.first_us[0] == 50);
  CHECK(s0.last_us[0] == 170);
  REQUIRE(s0.collectives.size() == 1);
  CHECK(s0.collectives[0].kind == TraceKind::kAllReduce);
  CHECK(s0.collectives[0].bytes == 4000);  // 1000 floats
  CHECK(s0.collectives[0].backend == "nccl");
  CHECK(s0.collectives[0].start_us == 550);
  CHECK(p->steps[1].busy_us[0] == 100);
  CHECK(p->unattributed == 1);
  CHECK(p->unattributed_us == 40);
  CHECK(p->gpu_events == 8);  // every kernel, memset and copy, NCCL's included
}

TEST_CASE("kineto: without ProfilerStep each forward starts a step, and gloo collectives take their copies' bytes",
          "[kineto]") {
  json e = json::array();
  e.push_back(ev("user_annotation", "forward", 0, 100));
  e.push_back(ev("user_annotation", "forward", 1000, 100));
  gpu_work(e, "kernel", "gemm", 50, 60, 30, 1);
  gpu_work(e, "kernel", "gemm", 1050, 1060, 40, 2);
  e.push_back(ev("user_annotation", "gloo:all_reduce", 300, 50));
  e.push_back(ev("user_annotation", "gloo:barrier", 400, 5));  // not a collective hzp models
  e.push_back(ev("gpu_user_annotation", "gloo:all_reduce", 310, 50, {{"stream", 7}}));
  gpu_work(e, "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 305, 320, 5, 3, {{"bytes", 2048}, {"stream", 7}});
  gpu_work(e, "gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 305, 330, 5, 4, {{"bytes", 999}, {"stream", 8}});
  auto p = read_kineto(doc_of(e), "synthetic");
  REQUIRE(p.ok());
  REQUIRE(p->steps.size() == 2);
  CHECK(p->steps[0].busy_us[0] == 30);
  CHECK(p->steps[1].busy_us[0] == 40);
  REQUIRE(p->steps[0].collectives.size() == 1);
  CHECK(p->steps[0].collectives[0].backend == "gloo");
  CHECK(p->steps[0].collectives[0].bytes == 2048);  // the copy on the range's own stream only
  CHECK(p->collectives_unknown == 1);
}

TEST_CASE("kineto: bad traces are refused with the event and field named", "[kineto]") {
  auto message = [](const json& doc) {
    auto p = read_kineto(doc, "t.json");
    REQUIRE_FALSE(p.ok());
    CHECK(p.status().code() == StatusCode::kInvalidInput);
    return p.status().message();
  };
  CHECK_THAT(message(json::object()), Catch::Contains("no traceEvents array"));
  json no_correlation = two_steps();
  no_correlation.push_back(ev("kernel", "gemm", 10, 5));
  CHECK_THAT(message(doc_of(no_correlation)), Catch::Contains("args.correlation") && Catch::Contains("traceEvents["));
  json negative = json::array({ev("user_annotation", "forward", -5, 10)});
  CHECK_THAT(message(doc_of(negative)), Catch::Contains("traceEvents[0].ts"));
  json no_forward = json::array();
  gpu_work(no_forward, "kernel", "gemm", 0, 1, 1, 1);
  CHECK_THAT(message(doc_of(no_forward)), Catch::Contains("no training step found"));
  json cpu_only = json::array({ev("user_annotation", "forward", 0, 10)});
  CHECK_THAT(message(doc_of(cpu_only)), Catch::Contains("hold no GPU work"));
  json bad_rank = doc_of(two_steps());
  bad_rank["distributedInfo"] = {{"rank", 3}, {"world_size", 2}};
  CHECK_THAT(message(bad_rank), Catch::Contains("distributedInfo"));
  // Only a memset of GPU time, every kernel of 0 us: nothing a replay could time.
  json memset_only = json::array({ev("user_annotation", "ProfilerStep#0", 0, 1000),
                                  ev("user_annotation", "DistributedDataParallel.forward", 10, 190)});
  gpu_work(memset_only, "gpu_memset", "Memset (Device)", 20, 50, 10, 1);
  gpu_work(memset_only, "kernel", "ampere_sgemm_128x64_tn", 30, 70, 0, 2);
  CHECK_THAT(message(doc_of(memset_only)), Catch::Contains("no GPU kernel time"));
  json bad_device = doc_of(two_steps());
  bad_device["deviceProperties"] = "x";  // skipped the GPU check before
  CHECK_THAT(message(bad_device), Catch::Contains("deviceProperties"));
}

namespace {

// A profile of one step with the given GPU time per phase and `all_reduces` NCCL all-reduces of 1 ms.
KinetoProfile profile(int rank, double forward_us, double backward_us, double optimizer_us, int all_reduces) {
  KinetoProfile p;
  p.source = "rank" + std::to_string(rank);
  p.rank = rank;
  KinetoStep s;
  s.busy_us = {forward_us, backward_us, optimizer_us};
  s.first_us = {100, 100 + forward_us, 100 + forward_us + backward_us};
  s.last_us = {s.first_us[0] + forward_us, s.first_us[1] + backward_us, s.first_us[2] + optimizer_us};
  for (int i = 0; i < all_reduces; ++i)
    s.collectives.push_back(
        {TraceKind::kAllReduce, -1, s.first_us[1] + 1000.0 * i, s.first_us[1] + 1000.0 * (i + 1), "nccl"});
  p.steps.push_back(s);
  return p;
}

Compiled ddp_two_ranks() {
  return build(scenario_from(json::parse(R"({
    "model": {"layers": 2, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 512, "vocab": 1024},
    "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 2},
    "training": {"seq_len": 128, "micro_batch": 1, "global_batch_sequences": 2},
    "policy": {"preset": "ddp", "overlap": {"bucket_MiB": 1}}})")));
}

int all_reduces_of(const Schedule& schedule) {
  int n = 0;
  for (const Op& op : schedule.program_of(0).ops)
    if (const auto* c = std::get_if<CollectiveOp>(&op.body)) n += c->kind == CollectiveKind::kAllReduce;
  return n;
}

}  // namespace

TEST_CASE("kineto_to_trace: each phase's time spread over its ops, collectives matched one to one", "[kineto]") {
  const Compiled c = ddp_two_ranks();
  const int n = all_reduces_of(c.schedule);
  REQUIRE(n >= 1);
  // Files given in the wrong order are put in rank order by distributedInfo.rank.
  std::vector<KinetoProfile> profiles = {profile(1, 1000, 2000, 300, n), profile(0, 1000, 2000, 300, n)};
  const RooflineDurations roofline(c.scenario.cluster);
  auto imported = kineto_to_trace(profiles, c.scenario, c.schedule, roofline, false);
  REQUIRE(imported.ok());
  CHECK(imported->steps == 1);
  std::map<std::pair<int, TraceKind>, double> total;  // (rank, kind) -> µs
  std::map<int, std::map<int, int>> phase_ops;
  for (const TraceEvent& e : imported->trace.events) total[{e.rank, e.kind}] += e.end_us - e.start_us;
  for (int r = 0; r < 2; ++r) {
    CHECK(total[{r, TraceKind::kCompute}] == Approx(3000).epsilon(1e-9));  // forward + backward
    CHECK(total[{r, TraceKind::kOptimizerStep}] == Approx(300).epsilon(1e-9));
    CHECK(total[{r, TraceKind::kAllReduce}] == Approx(1000.0 * n).epsilon(1e-9));
  }
  // Every compute op, optimizer step and all-reduce of both ranks has exactly one event.
  std::size_t expected = 0;
  for (int r = 0; r < 2; ++r)
    for (const Op& op : c.schedule.program_of(r).ops)
      if (!std::holds_alternative<BufferAcquireOp>(op.body) && !std::holds_alternative<BufferReleaseOp>(op.body))
        ++expected;
  CHECK(imported->trace.events.size() == expected);
  // No stream runs two events at once.
  std::map<std::pair<int, int>, double> free_at;
  std::vector<TraceEvent> events = imported->trace.events;
  std::stable_sort(events.begin(), events.end(),
                   [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
  for (const TraceEvent& e : events) {
    CHECK(e.start_us >= free_at[{e.rank, e.stream}] - 1e-9);
    free_at[{e.rank, e.stream}] = e.end_us;
  }
  CHECK(trace_from_json(trace_to_json(imported->trace)).ok());  // the reader's checks, as hzp replay runs them
}

TEST_CASE("kineto_to_trace: other counts are spread by bytes (with a note), and rank files must be 0..N-1",
          "[kineto]") {
  const Compiled c = ddp_two_ranks();
  const int n = all_reduces_of(c.schedule);
  const RooflineDurations roofline(c.scenario.cluster);
  auto imported = kineto_to_trace({profile(0, 1000, 2000, 300, n + 2), profile(1, 1000, 2000, 300, n + 2)}, c.scenario,
                                  c.schedule, roofline, false);
  REQUIRE(imported.ok());
  const bool noted = std::any_of(imported->notes.begin(), imported->notes.end(), [](const std::string& s) {
    return s.find("spread over the schedule's by bytes") != std::string::npos;
  });
  CHECK(noted);
  double all_reduce = 0;
  for (const TraceEvent& e : imported->trace.events)
    if (e.rank == 0 && e.kind == TraceKind::kAllReduce) all_reduce += e.end_us - e.start_us;
  CHECK(all_reduce == Approx(1000.0 * (n + 2)).epsilon(1e-9));  // the kind's whole time in flight

  auto wrong =
      kineto_to_trace({profile(0, 1, 1, 1, 0), profile(2, 1, 1, 1, 0)}, c.scenario, c.schedule, roofline, false);
  REQUIRE_FALSE(wrong.ok());
  CHECK_THAT(wrong.status().message(), Catch::Contains("distributedInfo.rank 2"));
  auto missing = kineto_to_trace({profile(0, 1, 1, 1, 0)}, c.scenario, c.schedule, roofline, false);
  REQUIRE_FALSE(missing.ok());
  CHECK_THAT(missing.status().message(), Catch::Contains("one per rank"));
  // A backward whose kernels span 2 years (damaged timestamps): refused, not a trace replay refuses.
  KinetoProfile far = profile(0, 1000, 2000, 300, n);
  far.steps[0].last_us[1] = far.steps[0].first_us[1] + 2 * 365 * 86400e6;
  for (bool idle : {false, true}) {
    auto spanned = kineto_to_trace({far, profile(1, 1000, 2000, 300, n)}, c.scenario, c.schedule, roofline, idle);
    if (idle) {  // the idle gaps are laid out
      REQUIRE_FALSE(spanned.ok());
      CHECK_THAT(spanned.status().message(), Catch::Contains("past the year an hzp trace may span"));
    } else {
      REQUIRE(spanned.ok());
      CHECK(trace_from_json(trace_to_json(spanned->trace)).ok());
    }
  }
}

TEST_CASE("kineto: a trace is checked against the scenario it is said to record", "[kineto]") {
  const Compiled dense = ddp_two_ranks();
  KinetoProfile p = profile(0, 1000, 2000, 300, 0);
  p.device = "NVIDIA H100 80GB HBM3";
  CHECK(check_kineto_against({p}, dense.scenario).ok());
  p.device = "NVIDIA A100-SXM4-80GB";
  Status other_gpu = check_kineto_against({p}, dense.scenario);
  REQUIRE_FALSE(other_gpu.ok());
  CHECK_THAT(other_gpu.message(), Catch::Contains("ran on NVIDIA A100") && Catch::Contains("h100-sxm"));
  p.device = "an accelerator hzp does not know";  // unknown names are not held against the scenario
  CHECK(check_kineto_against({p}, dense.scenario).ok());
  // Token routing: a dense model has about none; 2 layers x 1 micro-batch x 1 step here.
  p.steps[0].routing_kernels = 20;
  Status routed = check_kineto_against({p}, dense.scenario);
  REQUIRE_FALSE(routed.ok());
  CHECK_THAT(routed.message(), Catch::Contains("routes tokens as a MoE does"));
  json moe_doc = scenario_to_json(dense.scenario);
  moe_doc["model"]["moe"] = {{"experts", 4}, {"top_k", 2}, {"expert_ffn_hidden", 512}, {"layers", "all"}};
  const Scenario moe = scenario_from(moe_doc);
  CHECK(check_kineto_against({p}, moe).ok());
  p.steps[0].routing_kernels = 0;
  CHECK_THAT(check_kineto_against({p}, moe).message(), Catch::Contains("shows no token routing"));
}

TEST_CASE("kineto: GEMM and routing kernels are counted per step", "[kineto]") {
  json e = json::array();
  e.push_back(ev("user_annotation", "forward", 0, 100));
  gpu_work(e, "kernel", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 10, 20, 5, 1);
  gpu_work(e, "kernel", "void cutlass::Kernel<cutlass_80_tensorop_bf16_s16816gemm>", 11, 30, 5, 2);
  gpu_work(e, "kernel", "void cublasLt::splitKreduce_kernel", 12, 40, 1, 3);  // part of a GEMM, not one
  gpu_work(e, "kernel", "void at::native::vectorized_gather_kernel", 13, 50, 1, 4);
  gpu_work(e, "kernel", "void at::native::index_elementwise_kernel", 14, 60, 1, 5);
  auto p = read_kineto(doc_of(e), "synthetic");
  REQUIRE(p.ok());
  CHECK(p->steps[0].gemm_kernels == 2);
  CHECK(p->steps[0].routing_kernels == 2);
}
