// `hzp import` on small hand-made PyTorch profiler documents: phases from the annotations (backward by
// elimination), GPU work by its launch, host copies and work outside the steps left out, NCCL kernels
// with their record_param_comms size, rank files ordered by distributedInfo; each phase's time in the
// written trace equals the sum of its kernels (closed form), and the replay of a one-rank import is that
// sum. Bad documents exit 2 with a message naming the file, event and field, and write nothing.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "shared/base/files.h"
#include "tests/run_util.h"

namespace {

using hzp::test::RunResult;
using nlohmann::json;

const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = hzp::test::fresh_dir("import");
  return dir;
}

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string write(const std::string& name, const std::string& text) {
  const auto path = scratch() / name;
  std::ofstream(path) << text;
  return path.string();
}

// A tiny dense model on `gpus` GPUs of one node under DDP.
std::string scenario(int gpus, bool h100_gemms = false) {
  json s = {
      {"name", "tiny-import-" + std::to_string(gpus)},
      {"model",
       {{"name", "tiny"},
        {"family", "llama"},
        {"layers", 2},
        {"hidden", 64},
        {"heads", 4},
        {"kv_heads", 4},
        {"ffn_hidden", 176},
        {"vocab", 256},
        {"tied_embeddings", false},
        {"position", "rope"},
        {"max_positions", 64}}},
      // The synthetic kernels below are not an H100's: its fixed cost per GEMM kernel (6.75 us) would
      // outweigh them (that case: the "fixed cost" test below).
      {"cluster", {{"preset", "dgx-h100"}, {"nodes", 1}, {"gpus_per_node", gpus}, {"gpu", {{"gemm_overhead_us", 0}}}}},
      {"training", {{"seq_len", 64}, {"micro_batch", 4}, {"global_batch_sequences", 4 * gpus}}},
      {"policy", {{"preset", "ddp"}}}};
  if (h100_gemms) s["cluster"].erase("gpu");
  return write("scenario-" + std::to_string(gpus) + (h100_gemms ? "-h100" : "") + ".json", s.dump());
}

// Builds a profiler document: CPU annotations, launches and the GPU work they launch.
struct Doc {
  json events = json::array();
  int correlation = 0;
  void annotation(const std::string& name, double ts, double dur) {
    events.push_back({{"ph", "X"}, {"cat", "user_annotation"}, {"name", name}, {"ts", ts}, {"dur", dur}});
  }
  // GPU work of `cat` launched at CPU time `launch`, running [start, start + dur).
  void gpu(const std::string& cat, const std::string& name, double launch, double start, double dur,
           json args = json::object()) {
    ++correlation;
    events.push_back({{"ph", "X"},
                      {"cat", "cuda_runtime"},
                      {"name", "cudaLaunchKernel"},
                      {"ts", launch},
                      {"dur", 2},
                      {"args", {{"correlation", correlation}}}});
    args["correlation"] = correlation;
    events.push_back({{"ph", "X"}, {"cat", cat}, {"name", name}, {"ts", start}, {"dur", dur}, {"args", args}});
  }
  json done(int rank = -1, int world = -1) const {
    json d = {{"schemaVersion", 1}, {"traceEvents", events}};
    if (rank >= 0) d["distributedInfo"] = {{"backend", "nccl"}, {"rank", rank}, {"world_size", world}};
    return d;
  }
};

// One training step at `t`: forward [t, t+100) with kernels of 30 and 20 us, backward (no range: autograd)
// with one of 100 us, optimizer [t+300, t+320) with a 5 us kernel and a 1 us memset; plus a host copy in
// the forward and a kernel launched after the optimizer (both left out).
void step(Doc& d, double t) {
  d.annotation("forward", t, 100);
  d.annotation("optimizer", t + 300, 20);
  d.gpu("kernel", "ampere_bf16_gemm", t + 10, t + 15, 30);
  d.gpu("kernel", "flash_fwd_kernel", t + 20, t + 45, 20);
  d.gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", t + 50, t + 66, 7, {{"bytes", 4096}});
  d.gpu("kernel", "flash_bwd_kernel", t + 150, t + 155, 100);
  d.gpu("kernel", "multi_tensor_apply_kernel", t + 305, t + 306, 5);
  d.gpu("gpu_memset", "Memset (Device)", t + 310, t + 312, 1);
  d.gpu("kernel", "after_the_step", t + 400, t + 401, 9);
}

RunResult hzp_import(const std::vector<std::string>& files, const std::string& scenario_path, const std::string& out,
                     const std::string& extra = "") {
  std::string cmd = std::string("'") + HZP_BINARY + "' import";
  for (const std::string& f : files) cmd += " '" + f + "'";
  return hzp::test::run(cmd + " --scenario '" + scenario_path + "' --out '" + out + "'" + extra);
}

// Per (rank, step, kind[, phase]) the summed event time of an hzp trace, in us.
double summed(const json& trace, int rank, int step, const std::string& kind, const std::string& phase = "") {
  double total = 0;
  for (const json& e : trace["events"])
    if (e["rank"] == rank && e["step"] == step && e["kind"] == kind && (phase.empty() || e.value("phase", "") == phase))
      total += e["end_us"].get<double>() - e["start_us"].get<double>();
  return total;
}

// `n` empty events, comma-separated.
std::string many_events(std::size_t n) {
  std::string text;
  text.reserve(3 * n);
  for (std::size_t i = 0; i < n; ++i) text += i == 0 ? "{}" : ",{}";
  return text;
}

}  // namespace

TEST_CASE("import: phases by launch, GPU time per phase as recorded, replayed as the sum", "[cli][import]") {
  Doc d;
  step(d, 0);
  step(d, 1000);
  const std::string file = write("one_rank.json", d.done().dump());
  const std::string out = (scratch() / "one_rank_trace.json").string();
  const RunResult r = hzp_import({file}, scenario(1), out);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("2 steps") != std::string::npos);
  CHECK(r.output.find("2 GPU ops (0.018 ms) launched outside") != std::string::npos);
  const json trace = json::parse(slurp(out));
  for (int s = 0; s < 2; ++s) {
    CHECK(summed(trace, 0, s, "compute", "fwd") == Approx(50));
    CHECK(summed(trace, 0, s, "compute", "bwd") == Approx(100));
    CHECK(summed(trace, 0, s, "optimizer_step") == Approx(6));
  }
  const auto replayed = scratch() / "one_rank_replay";
  const RunResult rep =
      hzp::test::run(std::string("'") + HZP_BINARY + "' replay '" + out + "' --out '" + replayed.string() + "'");
  INFO(rep.output);
  REQUIRE(rep.code == 0);
  const json summary = json::parse(slurp(replayed / "summary.json"));
  CHECK(summary["replay"]["ops_not_in_trace"] == 0);
  CHECK(summary["replay"]["ranks"][0]["replayed_step_s"].get<double>() == Approx(156e-6).epsilon(1e-6));
  // The replay runs the ops back to back: it equals the trace's busy time, and the idle rest of the recorded
  // step is named, with the flag that keeps it.
  CHECK(summary["replay"]["ranks"][0]["recorded_busy_s"].get<double>() == Approx(156e-6).epsilon(1e-6));
  CHECK(summary["replay"]["max_idle_fraction"].get<double>() > 0.05);
  CHECK_THAT(rep.output, Catch::Contains("busy = the part of it in which an") && Catch::Contains("--include-idle"));
  // The profiler's own file given to replay: recognised, and pointed to hzp import.
  const RunResult raw = hzp::test::run(std::string("'") + HZP_BINARY + "' replay '" + file + "'");
  CHECK(raw.code == 2);
  CHECK_THAT(raw.output,
             Catch::Contains("a PyTorch profiler trace, not an hzp trace") && Catch::Contains("hzp import"));

  // calibrate --trace: the imported trace's scenario with efficiencies that give its compute per step.
  const std::string calibrated = (scratch() / "calibrated.json").string();
  const std::string bin = std::string("'") + HZP_BINARY + "'";
  const RunResult cal = hzp::test::run(bin + " calibrate --trace '" + out + "' --out '" + calibrated + "'");
  INFO(cal.output);
  REQUIRE(cal.code == 0);
  const auto simulated = scratch() / "calibrated_sim";
  REQUIRE(hzp::test::run(bin + " simulate '" + calibrated + "' --out '" + simulated.string() + "'").code == 0);
  CHECK(json::parse(slurp(simulated / "summary.json"))["step_time_s"].get<double>() == Approx(156e-6).epsilon(1e-6));
  CHECK(hzp::test::run(bin + " calibrate --trace '" + out + "' --mfu 0.5").code == 2);

  // The same kernels against the H100's fixed cost per GEMM kernel: 9 forward GEMMs alone would take 61 us of
  // the 50 recorded, so there is nothing left to fit: refused, naming the setting.
  const std::string h100_out = (scratch() / "h100_trace.json").string();
  REQUIRE(hzp_import({file}, scenario(1, true), h100_out).code == 0);
  const RunResult fixed = hzp::test::run(bin + " calibrate --trace '" + h100_out + "'");
  CHECK(fixed.code == 2);
  CHECK_THAT(fixed.output, Catch::Contains("fixed cost") && Catch::Contains("cluster.gpu.gemm_overhead_us 6.75"));

  // --include-idle: the optimizer's kernel (306..311) and memset (312..313) leave 1 us of idle GPU
  // between them, which now goes to the optimizer step; the forward's kernels run back to back.
  const RunResult idle = hzp_import({file}, scenario(1), out, " --include-idle");
  REQUIRE(idle.code == 0);
  const json with_idle = json::parse(slurp(out));
  CHECK(summed(with_idle, 0, 1, "compute", "fwd") == Approx(50));
  CHECK(summed(with_idle, 0, 1, "optimizer_step") == Approx(7));

  // The same dense trace with a MoE scenario: refused, saying why (it used to import silently); and with
  // --no-check, imported as asked.
  json moe = json::parse(slurp(scenario(1)));
  moe["name"] = "tiny-moe-import";
  moe["model"]["moe"] = {{"experts", 4}, {"top_k", 2}, {"expert_ffn_hidden", 176}};
  const std::string moe_path = write("scenario-moe.json", moe.dump());
  const RunResult mismatch = hzp_import({file}, moe_path, out);
  CHECK(mismatch.code == 2);
  CHECK_THAT(mismatch.output, Catch::Contains("MoE layers but the trace shows no token routing"));
  CHECK(hzp_import({file}, moe_path, out, " --no-check").code == 0);
}

namespace {

// Rank `rank` of 2: one step with an NCCL all-reduce kernel (launched at 200 us, starting at `start`, lasting
// `dur`) and the record_param_comms call that launched it, of `count` elements of `dtype`.
std::string nccl_profile(const std::string& name, int rank, const json& count, const json& dtype, double start,
                         double dur) {
  Doc d;
  step(d, 0);
  d.events.push_back({{"ph", "X"},
                      {"cat", "cpu_op"},
                      {"name", "record_param_comms"},
                      {"ts", 195},
                      {"dur", 15},
                      {"args", {{"In msg nelems", count}, {"Out msg nelems", count}, {"dtype", dtype}}}});
  d.gpu("kernel", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 200, start, dur);
  return write(name + std::to_string(rank) + ".json", d.done(rank, 2).dump());
}

}  // namespace

TEST_CASE("import: NCCL kernels with their record_param_comms size, rank files ordered by rank", "[cli][import]") {
  std::vector<std::string> files;
  for (int rank : {1, 0})  // given in the wrong order on purpose
    files.push_back(nccl_profile("nccl_rank", rank, 1000, "BFloat16", rank == 0 ? 260 : 270, rank == 0 ? 40 : 42));
  const std::string out = (scratch() / "nccl_trace.json").string();
  const RunResult r = hzp_import(files, scenario(2), out);
  INFO(r.output);
  REQUIRE(r.code == 0);
  CHECK(r.output.find("rank 1") != std::string::npos);
  const json trace = json::parse(slurp(out));
  REQUIRE(trace["world_size"] == 2);
  // Clocks aligned on the first collective's end (300 vs 312): the instance runs from the latest start
  // (rank 1: 270 - 12 = 258; rank 0: 260) to the latest end, 300 us: 40 us on both ranks.
  for (int rank : {0, 1}) CHECK(summed(trace, rank, 0, "all_reduce") == Approx(40));
  bool sized = false;
  for (const json& e : trace["events"])
    if (e["kind"] == "all_reduce" && e["bytes"] == 2000) sized = true;
  if (r.output.find("spread over the schedule") == std::string::npos) CHECK(sized);
}

TEST_CASE("import: a record_param_comms size that cannot be read is said, not replaced silently", "[cli][import]") {
  // The eighth attack of issue 35: a message count of -1, 1e30, 1.5, "1000" or null, or a dtype of unknown
  // width, was replaced by the schedule's size without a word.
  const std::vector<std::pair<nlohmann::json, nlohmann::json>> bad = {
      {-1, "BFloat16"},
      {1.5, "BFloat16"},
      {"1000", "BFloat16"},
      {nullptr, "BFloat16"},
      {1000, "Bogus"},
      {1000, 5},
      // The ninth: a size past what a trace records (1 PiB) was written, and then refused by replay.
      {600000000000000LL, "BFloat16"}};
  for (const auto& [count, dtype] : bad) {
    std::vector<std::string> files;
    for (int rank : {0, 1}) files.push_back(nccl_profile("unsized_rank", rank, count, dtype, 260, 40));
    const RunResult r = hzp_import(files, scenario(2), (scratch() / "unsized_trace.json").string());
    INFO(count.dump() << " " << dtype.dump() << ": " << r.output);
    CHECK(r.code == 0);
    CHECK(r.output.find("note: 1 NCCL kernel launched by a record_param_comms whose size cannot be read") !=
          std::string::npos);
    CHECK(r.output.find("In msg nelems " + count.dump() + ", dtype " + dtype.dump()) != std::string::npos);
  }
}

TEST_CASE("import: bad profiler documents are refused naming the file, event and field", "[cli][import]") {
  Doc good;
  step(good, 0);
  const std::string good_file = write("good.json", good.done().dump());
  const std::string gz = (scratch() / "good.json.gz").string();
  REQUIRE(std::system(("gzip -c '" + good_file + "' > '" + gz + "'").c_str()) == 0);
  const std::string gz_text = slurp(gz);
  const std::string truncated = write("truncated.json.gz", gz_text.substr(0, gz_text.size() / 2));

  Doc no_correlation;
  step(no_correlation, 0);
  no_correlation.events[3]["args"].erase("correlation");
  Doc negative;
  step(negative, 0);
  negative.events[1]["ts"] = -5;
  Doc no_steps;
  no_steps.gpu("kernel", "k", 1, 2, 3);

  struct Case {
    std::vector<std::string> files;
    int gpus;
    const char* expect;
  };
  // A one-rank profile whose distributedInfo says (rank, world_size).
  const auto with_info = [&](const nlohmann::json& rank, const nlohmann::json& world_size) {
    nlohmann::json d = good.done(0, 2);
    d["distributedInfo"]["rank"] = rank;
    d["distributedInfo"]["world_size"] = world_size;
    return d.dump();
  };
  const std::vector<Case> cases = {
      {{truncated}, 1, "gzip stream truncated"},
      {{write("not_profile.json", R"({"a": 1})")}, 1, "no traceEvents array"},
      {{write("not_json.json", "{\"traceEvents\": [")}, 1, "not_json.json"},
      {{write("no_correlation.json", no_correlation.done().dump())}, 1, "traceEvents[3].args.correlation"},
      {{write("negative.json", negative.done().dump())}, 1, "traceEvents[1].ts"},
      {{write("no_steps.json", no_steps.done().dump())}, 1, "no training step found"},
      {{good_file, good_file}, 1, "profiler files were given"},
      {{write("r0a.json", good.done(0, 2).dump()), write("r0b.json", good.done(0, 2).dump())},
       2,
       "distributedInfo.rank 0 where rank 1 was expected"},
      {{write("bad_rank.json", good.done(3, 2).dump())}, 1, "distributedInfo"},
      // A rank past 32 bits was read as rank 0; a world_size that is not the scenario's passed unnoticed.
      {{write("huge_rank.json", with_info(1LL << 40, -1))},
       1,
       "distributedInfo.rank: expected a whole number in [0, 1000000], got 1099511627776"},
      // A present rank that is not a whole number in range was read as "no rank recorded".
      {{write("rank_minus1.json", with_info(-1, 2))},
       1,
       "distributedInfo.rank: expected a whole number in [0, 1000000], got -1"},
      {{write("rank_half.json", with_info(1.5, 2))}, 1, "got 1.5"},
      {{write("rank_text.json", with_info("1", 0))}, 1, "got \"1\""},
      // Some files with their rank and some without were taken in the order given, against a recorded rank;
      // a distributedInfo that is not an object was taken as absent.
      {{write("mixed_r1.json", good.done(1, 2).dump()), write("mixed_none.json", good.done().dump())},
       2,
       "mixed_r1.json records distributedInfo.rank 1 but"},
      {{write("info_text.json",
              [&] {
                nlohmann::json d = good.done();
                d["distributedInfo"] = "rank1";
                return d.dump();
              }())},
       1,
       "distributedInfo: expected the profiler's object, got \"rank1\""},
      {{write("w64_r0.json", good.done(0, 64).dump()), write("w64_r1.json", good.done(1, 64).dump())},
       2,
       "distributedInfo.world_size 64, but the scenario has 2 ranks"},
      {{write("ten_million.json", "{\"traceEvents\": [" + many_events(10'000'000) + "]}")},
       1,
       "refused before parsing"},
  };
  for (const Case& c : cases) {
    const std::string out = (scratch() / "never.json").string();
    const RunResult r = hzp_import(c.files, scenario(c.gpus), out);
    INFO(c.expect << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(c.expect) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(out));
  }
  // The gzipped good file reads as the plain one.
  REQUIRE(hzp_import({gz}, scenario(1), (scratch() / "from_gz.json").string()).code == 0);
  // So does a file of several gzip members, as gzip -d reads it: an empty one first (it read as empty), or
  // the text split in two.
  const std::string members = (scratch() / "members.json.gz").string();
  const std::string split = (scratch() / "split.json.gz").string();
  REQUIRE(std::system(("printf '' | gzip -c > '" + members + "' && gzip -c '" + good_file + "' >> '" + members + "'")
                          .c_str()) == 0);
  REQUIRE(std::system(("head -c 100 '" + good_file + "' | gzip -c > '" + split + "' && tail -c +101 '" + good_file +
                       "' | gzip -c >> '" + split + "'")
                          .c_str()) == 0);
  for (const std::string& file : {members, split}) {
    INFO(file);
    CHECK(hzp_import({file}, scenario(1), (scratch() / "from_members.json").string()).code == 0);
    CHECK(hzp::read_maybe_gzip_file(file, 1 << 20).value() == slurp(good_file));
  }
}

TEST_CASE("import: more steps than a trace may hold is refused before the trace is built", "[cli][import]") {
  // 10,001 steps (one forward range and kernel each) of a 1-GPU scenario: replay would refuse the trace
  // (kMaxTraceSteps), so import refuses the profile, and writes nothing (it once built such traces in GBs).
  Doc d;
  for (int s = 0; s <= 10'000; ++s) {
    d.annotation("forward", 1000.0 * s, 100);
    d.gpu("kernel", "ampere_bf16_gemm", 1000.0 * s + 10, 1000.0 * s + 15, 30);
  }
  const std::string file = write("many_steps.json", d.done().dump());
  const auto out = scratch() / "many_steps_trace.json";
  const RunResult r = hzp_import({file}, scenario(1), out.string(), " --no-check");
  CHECK(r.code == 2);
  CHECK(r.output.find("10001 training steps, more than the 10000 an hzp trace holds") != std::string::npos);
  CHECK(r.output.size() < 4000);  // refused before its per-step table (1.2 M steps printed 93 MB)
  CHECK_FALSE(std::filesystem::exists(out));
}

TEST_CASE("import: a scenario that makes the profile faster than the GPU's peak is not the model it ran",
          "[cli][import]") {
  // The eleventh attack of issue 35: --set model.* contradicting the profile was imported without a word. The
  // tiny profile's 155 us of compute for a 7B-sized layer stack would be ~70x an H100's peak.
  Doc d;
  step(d, 1000);
  const std::string file = write("peak.json", d.done().dump());
  const auto out = scratch() / "peak_trace.json";
  const std::string bigger =
      " --set model.hidden=8192 --set model.ffn_hidden=28672 --set model.layers=32 --set model.vocab=32000";
  const RunResult r = hzp_import({file}, scenario(1), out.string(), bigger);
  CHECK(r.code == 2);
  CHECK(r.output.find("x the peak FLOP/s of cluster.gpu") != std::string::npos);
  CHECK(r.output.find("--no-check imports it anyway") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));
  CHECK(hzp_import({file}, scenario(1), out.string(), bigger + " --no-check").code == 0);
  // The scenario the profile ran imports as before.
  CHECK(hzp_import({file}, scenario(1), (scratch() / "peak_ok.json").string()).code == 0);
}

TEST_CASE("import: GPU events of one stream that overlap are refused", "[cli][import]") {
  // The eleventh attack: every kernel's dur set to 1e9 us was imported (ops "moved later"), a step of 1.3e9 ms.
  // One CUDA stream runs one kernel at a time; the profiler's rounding overlaps them by < 1 us (allowed).
  Doc d;
  step(d, 1000);
  d.gpu("kernel", "sm90_gemm", 1000 + 60, 1000 + 60, 5e6, {{"stream", 7}});
  d.gpu("kernel", "sm90_gemm", 1000 + 61, 1000 + 61, 5e6, {{"stream", 7}});
  const std::string file = write("overlap.json", d.done().dump());
  const auto out = scratch() / "overlap_trace.json";
  const RunResult r = hzp_import({file}, scenario(1), out.string(), " --no-check");
  CHECK(r.code == 2);
  CHECK(r.output.find("GPU stream 7's events overlap for 5000 ms of their 1e+04 ms") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(out));
  Doc rounding;
  step(rounding, 1000);
  rounding.gpu("kernel", "sm90_gemm", 1000 + 60, 1000 + 60, 10, {{"stream", 7}});
  rounding.gpu("kernel", "sm90_gemm", 1000 + 61, 1000 + 69.7, 10, {{"stream", 7}});
  CHECK(hzp_import({write("rounding.json", rounding.done().dump())}, scenario(1),
                   (scratch() / "rounding_trace.json").string(), " --no-check")
            .code == 0);
}
