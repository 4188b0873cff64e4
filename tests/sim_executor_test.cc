// The SimGrid executor end to end. Every test case creates its own SimGrid engine, so each must run in its
// own process: ctest does that (one test per case); running this binary on several cases at once does not.
#include "tests/test_util.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "shared/cost/collective_cost.h"
#include "sim/breakdown.h"
#include "sim/executor.h"

using namespace hzp;
using namespace hzp::test;

namespace {

sim::SimResult run_sim(const Built& b, int steps = 1, bool exact = false) {
  sim::SimOptions options;
  options.steps = steps;
  options.exact = exact;
  auto r = sim::simulate(b, options);
  if (!r.ok()) FAIL(r.status().message());
  return *r;
}

// LLaMA-2 7B under DDP on a single A100: a step is its compute alone.
nlohmann::json one_gpu_ddp() {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 1, "ddp", 4096);
  doc["cluster"]["gpus_per_node"] = 1;
  doc["cluster"]["nic"] = {{"per_node", 1}};
  return doc;
}

// The simulated step and busiest rank's compute time agree with the analytic estimator's within `eps`.
void check_step_and_compute_match_estimate(const nlohmann::json& doc, double eps) {
  const Built b = build(scenario_from(doc));
  const sim::SimResult r = run_sim(b);
  const Estimate e = estimate_of(b);
  CHECK(r.step_time_s == Approx(e.step_time_s).epsilon(eps));
  CHECK(r.compute_s == Approx(e.compute_s).epsilon(eps));
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_CASE("sim: a 1-GPU DDP step takes exactly its compute time", "[sim]") {
  nlohmann::json doc = one_gpu_ddp();
  const Built b = build(scenario_from(doc));
  const sim::SimResult r = run_sim(b);
  double compute = 0;
  for (const Op& op : b.schedule.programs[0].ops) compute += op_duration(b.scenario, b.schedule, 0, op);
  CHECK(r.step_time_s == Approx(compute).epsilon(1e-9));
  CHECK(r.exposed_comm_s == Approx(0).margin(1e-9));
  CHECK(r.collectives == 0);
}

TEST_CASE("sim: DDP on 2 nodes agrees with the analytic estimator", "[sim][estimator]") {
  const Built b = build(scenario_from(scenario_json("llama2-7b", "dgx-a100", 2, "ddp", 4096, 16 * 2)));
  const sim::SimResult r = run_sim(b);
  CHECK(r.step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.02));
}

TEST_CASE("sim: ZeRO-1 on 2 nodes agrees with the analytic estimator", "[sim][estimator]") {
  const Built b = build(scenario_from(scenario_json("llama2-7b", "dgx-a100", 2, "zero1", 4096, 16 * 2)));
  CHECK(run_sim(b).step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.02));
}

TEST_CASE("sim: ZeRO-2 on 2 nodes agrees with the analytic estimator", "[sim][estimator]") {
  const Built b = build(scenario_from(scenario_json("llama2-7b", "dgx-a100", 2, "zero2", 4096, 16 * 2)));
  CHECK(run_sim(b).step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.02));
}

TEST_CASE("sim: ZeRO-3 on one stream (no concurrent collectives) agrees with the estimator", "[sim][estimator]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 2, "zero3", 4096, 16 * 2);
  doc["policy"]["overlap"] = {{"separate_streams", false}, {"prefetch_depth", 0}};
  const Built b = build(scenario_from(doc));
  const sim::SimResult r = run_sim(b);
  CHECK(r.step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.02));
  CHECK(r.overlap_fraction == Approx(0).margin(0.01));
}

TEST_CASE("sim: ZeRO-3 with overlap: streams share links, never faster than the estimator", "[sim][estimator]") {
  nlohmann::json doc = scenario_json("llama2-7b", "a800", 4, "zero3", 2048, 32 * 2);
  // Compute at full speed beside the collectives: shared links make them longer here than in the estimator,
  // so with the overlap slowdown the compute would differ too.
  doc["cluster"]["overlap_slowdown"] = 0;
  const Built b = build(scenario_from(doc));
  const sim::SimResult r = run_sim(b);
  const Estimate e = estimate_of(b);
  CHECK(r.step_time_s >= e.step_time_s * (1 - 1e-6));
  CHECK(r.compute_s == Approx(e.compute_s).epsilon(1e-6));
  CHECK(r.overlap_fraction > 0);
  // Traffic put on the wire: per GPU, the ring volume of every collective (AG fwd + AG bwd + RS per
  // micro-batch, 2 micro-batches), split between NVLink and NICs.
  CHECK(r.comm_bytes_intra_node + r.comm_bytes_inter_node == Approx(e.comm_bytes_per_gpu).epsilon(0.01));
}

TEST_CASE("sim: measured peak memory equals the core's memory model", "[sim][memory]") {
  const Built b = build(scenario_from(scenario_json("llama2-7b", "a800", 2, "zero3", 4096, 16 * 2)));
  const sim::SimResult r = run_sim(b);
  const MemoryBreakdown m = memory_per_gpu(b.scenario, b.cost, b.schedule);
  CHECK(r.memory.activations == Approx(m.activations).epsilon(1e-9));
  CHECK(r.memory.total() == Approx(m.total()).epsilon(1e-9));
  CHECK(r.fits_memory);
}

TEST_CASE("sim: an out-of-memory scenario is simulated and reported, not a crash", "[sim][memory]") {
  const Built b = build(scenario_from(scenario_json("llama2-13b", "a800", 1, "ddp", 4096)));
  const sim::SimResult r = run_sim(b);
  CHECK_FALSE(r.fits_memory);
  CHECK_THAT(r.memory_verdict, Catch::Contains("OUT OF MEMORY"));
  CHECK(r.step_time_s > 0);
}

TEST_CASE("sim: several steps run back to back", "[sim]") {
  const Built b = build(scenario_from(scenario_json("tiny-dense", "dgx-a100", 2, "zero3", 256)));
  const sim::SimResult r = run_sim(b, 3);
  CHECK(r.steps == 3);
  CHECK(r.ops_executed == 3LL * 16 * static_cast<long long>(b.schedule.programs[0].ops.size()));
  CHECK(r.total_time_s == Approx(3 * r.step_time_s));
}

TEST_CASE("sim: a second simulation in the same process is refused", "[sim]") {
  const Built b = build(scenario_from(scenario_json("tiny-dense", "dgx-a100", 1, "ddp", 64)));
  run_sim(b);
  auto again = sim::simulate(b, sim::SimOptions{});
  REQUIRE_FALSE(again.ok());
  CHECK_THAT(again.status().message(), Catch::Contains("one SimGrid simulation per process"));
}

// One line per op span: "start end rank=R step=S op=O [stream]".
std::vector<std::string> event_log(const Built& b, const sim::SimResult& r) {
  std::vector<std::string> lines;
  char line[256];
  for (const sim::OpSpan& s : r.spans) {
    std::snprintf(line, sizeof line, "%.9f %.9f rank=%d step=%d op=%d [%s]\n", s.start, s.end, s.rank, s.step, s.op,
                  to_string(b.schedule.streams[b.schedule.program_of(s.rank).ops[s.op].stream]));
    lines.push_back(line);
  }
  return lines;
}

const char* kGoldenEvents = "/tests/golden/sim_zero3_events.txt";

TEST_CASE("sim: the event log of a tiny scenario matches its golden file", "[sim][golden]") {
  auto scenario = load_scenario_file(std::string(HZP_TEST_DATA_DIR) + "/golden/zero3.json");
  REQUIRE(scenario.ok());
  const Built b = build(*scenario);
  const sim::SimResult r = run_sim(b, 1, /*exact=*/true);  // every rank: the reference the symmetric run matches
  std::ostringstream log;
  for (const std::string& line : event_log(b, r)) log << line;
  const std::string path = std::string(HZP_SOURCE_DIR) + kGoldenEvents;
  if (std::getenv("HZP_UPDATE_GOLDEN")) {
    std::ofstream(path) << log.str();
    WARN("rewrote " << path);
    return;
  }
  INFO("golden file " << path << " (HZP_UPDATE_GOLDEN=1 regenerates it after an intended change)");
  CHECK(log.str() == read_file(path));
}

// sim/symmetry.h: the symmetric run simulates rank 0 alone and lets the other ranks follow it; every rank's
// events are the full simulation's, to the nanosecond (the golden file, in another order).
TEST_CASE("sim: the symmetric event log is the full simulation's, rank by rank", "[sim][golden]") {
  auto scenario = load_scenario_file(std::string(HZP_TEST_DATA_DIR) + "/golden/zero3.json");
  REQUIRE(scenario.ok());
  const Built b = build(*scenario);
  const sim::SimResult r = run_sim(b);
  REQUIRE(r.symmetric);
  CHECK(r.ops_simulated * b.schedule.world_size == r.ops_executed);
  std::vector<std::string> got = event_log(b, r), want;
  std::istringstream golden(read_file(std::string(HZP_SOURCE_DIR) + kGoldenEvents));
  for (std::string line; std::getline(golden, line);) want.push_back(line + "\n");
  std::sort(got.begin(), got.end());
  std::sort(want.begin(), want.end());
  CHECK(got == want);
}

TEST_CASE("sim: timeline is a Chrome trace with one process per GPU and one thread per stream", "[sim]") {
  const Built b = build(scenario_from(scenario_json("tiny-dense", "dgx-a100", 2, "zero3", 64)));
  const sim::SimResult r = run_sim(b);
  const nlohmann::json t = nlohmann::json::parse(sim::timeline_text(b.scenario, b.schedule, r));
  int complete = 0;
  std::set<int> pids;
  for (const auto& e : t["traceEvents"]) {
    if (e["ph"] == "X") {
      ++complete;
      pids.insert(e["pid"].get<int>());
      CHECK(e["dur"].get<double>() >= 0);
      if (e["cat"] == "comm") CHECK(e["args"].contains("bytes"));
    }
  }
  CHECK(pids.size() == 16);
  CHECK(complete > 0);
  const nlohmann::json s = sim::summary_json(b.scenario, r);
  for (const char* key :
       {"step_time_s", "tokens_per_s", "tokens_per_gpu_per_s", "mfu", "tflops_per_gpu", "compute_s", "exposed_comm_s",
        "overlap_fraction", "peak_memory_bytes", "comm_bytes", "gpus", "sim_wall_s"})
    CHECK(s.contains(key));
}

TEST_CASE("timeline sample: all ranks up to the limit, then node 0 and spread nodes", "[sim]") {
  CHECK(sim::timeline_sample(16, 8, 64).size() == 16);
  const std::vector<int> big = sim::timeline_sample(8192, 8, 64);
  CHECK(big.size() == 64);
  CHECK(big[7] == 7);
  CHECK(big.back() == 8184);
}

TEST_CASE("sim: the executor takes compute times from the DurationModel it is given", "[sim][durations]") {
  // Two nodes, so communication is simulated too; the estimator with the same source agrees.
  const Built b = build(scenario_from(scenario_json("llama2-7b", "dgx-a100", 2, "zero1", 4096, 16 * 2)));
  const ScaledComputeDurations slow(b.scenario.cluster, 2.0);
  sim::SimOptions options;
  options.durations = &slow;
  auto r = sim::simulate(b, options);
  REQUIRE(r.ok());
  auto e = estimate(b.scenario, b.cost, b.schedule, &slow);
  REQUIRE(e.ok());
  CHECK(r->compute_s >= compute_ops_time(b, slow) * (1 - 1e-9));
  CHECK(r->step_time_s > estimate_of(b).step_time_s * 1.5);
  CHECK(r->step_time_s == Approx(e->step_time_s).epsilon(0.02));
}

TEST_CASE("sim: with compute_spread each GPU computes at its own fixed speed", "[sim][durations]") {
  nlohmann::json doc = one_gpu_ddp();
  doc["cluster"]["compute_spread"] = 0.05;
  const Built b = build(scenario_from(doc));
  const RooflineDurations roofline(b.scenario.cluster);
  const SpreadDurations spread(roofline, 0.05);
  double plain = 0;
  for (const Op& op : b.schedule.programs[0].ops) plain += op_duration(b.scenario, b.schedule, 0, op);
  // One GPU, no communication: the step is its compute at rank 0's speed factor.
  CHECK(run_sim(b).step_time_s == Approx(plain * spread.speed_factor(0)).epsilon(1e-9));
}

TEST_CASE("sim: with overlap_slowdown a 1-GPU step is still exactly its compute", "[sim]") {
  nlohmann::json doc = one_gpu_ddp();
  doc["cluster"]["overlap_slowdown"] = 0.5;
  const Built b = build(scenario_from(doc));
  double compute = 0;
  for (const Op& op : b.schedule.programs[0].ops) compute += op_duration(b.scenario, b.schedule, 0, op);
  CHECK(run_sim(b).step_time_s == Approx(compute).epsilon(1e-9));
}

TEST_CASE("sim: ZeRO-3 on 2 nodes with overlap_slowdown agrees with the analytic estimator", "[sim][estimator]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 2, "zero3", 4096, 16 * 2);
  doc["cluster"]["overlap_slowdown"] = 0.3;
  check_step_and_compute_match_estimate(doc, 0.03);
}

// ND parallelism: pipeline transfers are point-to-point flows between stages, tensor collectives stay in the
// node; the simulated pipeline waits where the estimator's does.
TEST_CASE("sim: a 1F1B pipeline on an idle network agrees with the estimator", "[sim][nd]") {
  const Built b = build(scenario_from(idle_pipeline_json(4, 1, 8)));
  CHECK(run_sim(b).step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.01));
}

// A stage posts its receive long before the sender gets there; only the transfer itself (instant on an idle
// network) slows the compute beside it. Counting the wait as well slowed every stage by 1 + s almost all
// step long (Megatron's pipelined rows came out up to 18 % slow).
TEST_CASE("sim: overlap_slowdown counts a transfer, not a member waiting for its peers", "[sim][nd]") {
  nlohmann::json doc = idle_pipeline_json(4, 1, 8);
  doc["cluster"]["overlap_slowdown"] = 0.5;
  check_step_and_compute_match_estimate(doc, 0.01);
}

TEST_CASE("sim: an interleaved pipeline on an idle network agrees with the estimator", "[sim][nd]") {
  const Built b = build(scenario_from(idle_pipeline_json(4, 2, 8)));
  CHECK(run_sim(b).step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.01));
}

TEST_CASE("sim: tensor x pipeline x ZeRO-1 on 4 nodes agrees with the estimator, memory per stage", "[sim][nd]") {
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 4, "zero1", 4096, 64);
  doc["policy"]["parallel"] = {{"tensor", 4}, {"pipeline", 2}, {"sequence_parallel", true}};
  const Built b = build(scenario_from(doc));
  const sim::SimResult r = run_sim(b);
  CHECK(r.step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.03));
  // The worst GPU is a first-stage one (the most micro-batches in flight), as the core's model says.
  CHECK(r.peak_memory_rank < 16);
  CHECK(r.memory.total() == Approx(memory_per_gpu(b.scenario, b.cost, b.schedule).total()).epsilon(1e-9));
}

TEST_CASE("sim: tensor_comm_overlap agrees with the estimator and hides the tensor collectives", "[sim][nd]") {
  // (One simulation per process: the run without overlap is the estimator's, which the test above holds
  // within 3 % of its simulation.)
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 4, "zero1", 4096, 64);
  doc["policy"]["parallel"] = {{"tensor", 4}, {"pipeline", 2}, {"sequence_parallel", true}};
  const Built without = build(scenario_from(doc));
  doc["policy"]["parallel"]["tensor_comm_overlap"] = true;
  const Built b = build(scenario_from(doc));
  const sim::SimResult r = run_sim(b);
  CHECK(r.step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.03));
  CHECK(r.step_time_s < 0.97 * estimate_of(without).step_time_s);
  CHECK(r.exposed_comm_s < estimate_of(without).exposed_comm_s);
  // It moves time, not memory.
  CHECK(r.memory.total() ==
        Approx(memory_per_gpu(without.scenario, without.cost, without.schedule).total()).epsilon(1e-9));
}

TEST_CASE("sim: context parallelism across nodes agrees with the estimator", "[sim][nd]") {
  // 2 nodes, tensor 2 x context 8: each context group spans both nodes, its exchange crosses the NICs.
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 2, "zero1", 16384, 4);
  doc["policy"]["parallel"] = {{"tensor", 2}, {"context", 8}};
  const Built b = build(scenario_from(doc));
  const ProcessGroup& context = b.schedule.group_of(0, b.schedule.role_index(GroupRole::kContext));
  CHECK_FALSE(context.intra_node);
  const sim::SimResult r = run_sim(b);
  CHECK(r.step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.03));
}

TEST_CASE("sim: context parallelism by all-to-all across nodes agrees with the estimator", "[sim][nd]") {
  // 2 nodes, tensor 2 x context 8 (Ulysses): each all-to-all spans both nodes.
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 2, "zero1", 16384, 4);
  doc["policy"]["parallel"] = {{"tensor", 2}, {"context", 8}, {"context_comm", "all_to_all"}};
  const Built b = build(scenario_from(doc));
  CHECK_FALSE(b.schedule.group_of(0, b.schedule.role_index(GroupRole::kContext)).intra_node);
  const sim::SimResult r = run_sim(b);
  CHECK(r.step_time_s == Approx(estimate_of(b).step_time_s).epsilon(0.03));
}

// The step's breakdown (sim/breakdown.h): a partition of the step, checked against closed forms.
TEST_CASE("sim breakdown: a 1F1B pipeline's first stage idles (p-1)/(m+p-1) of the step", "[sim][nd][breakdown]") {
  // 4 equal stages, 8 micro-batches, transfers instant: stage 0 computes m (f + b) and idles (p - 1)(f + b),
  // 3/11 of the step but for the optimizer.
  const Built b = build(scenario_from(idle_pipeline_json(4, 1, 8)));
  const sim::SimResult r = run_sim(b);
  const sim::StepBreakdown d = sim::step_breakdown(b.schedule, r, 0);
  CHECK(d.step_s == Approx(r.step_time_s));
  CHECK(d.compute_busy_s + d.exposed_comm_s + d.idle_s == Approx(d.step_s).epsilon(1e-9));
  CHECK(d.idle_s == Approx(3.0 / 8.0 * (d.forward_s + d.backward_s)).epsilon(0.01));
  CHECK(d.recompute_s == 0);
  CHECK(d.backward_s / d.forward_s == Approx(2.0).epsilon(0.1));  // twice the FLOPs of forward, compute-bound
  CHECK(d.comm[static_cast<int>(sim::CommDimension::kPipeline)].transfer_s > 0);
  CHECK(d.comm[static_cast<int>(sim::CommDimension::kTensor)].transfer_s == 0);
  const nlohmann::json j = sim::breakdown_json(d);
  CHECK(j["comm_s"].contains("pipeline"));
  CHECK_FALSE(j["comm_s"].contains("tensor"));
  CHECK(sim::breakdown_text(d, true).find("bubble") != std::string::npos);
}

TEST_CASE("sim breakdown: ZeRO-3 with full recomputation and data-parallel traffic", "[sim][breakdown]") {
  nlohmann::json doc = scenario_json("llama2-7b", "a800", 2, "zero3", 2048, 16 * 2);
  doc["training"]["recompute"] = "full";
  const Built b = build(scenario_from(doc));
  const sim::SimResult r = run_sim(b);
  const sim::StepBreakdown d = sim::step_breakdown(b.schedule, r, 0);
  // One compute stream: the phases add up to its busy time; full recomputation re-runs the forward.
  CHECK(d.forward_s + d.backward_s + d.recompute_s + d.optimizer_s == Approx(d.compute_busy_s).epsilon(1e-9));
  CHECK(d.recompute_s == Approx(d.forward_s).epsilon(0.02));
  CHECK(d.compute_busy_s + d.exposed_comm_s + d.idle_s == Approx(d.step_s).epsilon(1e-9));
  const sim::CommTime& data = d.comm[static_cast<int>(sim::CommDimension::kData)];
  CHECK(data.transfer_s > 0);
  CHECK(data.exposed_s <= data.transfer_s);
  CHECK(d.exposed_comm_s == Approx(data.exposed_s).epsilon(1e-9));  // the only dimension with traffic
  // The executor's own figure, taken per rank from its busy times, is the busiest rank's: close to rank 0's.
  CHECK(d.compute_busy_s == Approx(r.compute_s).epsilon(0.01));
}
