// `hzp replay` end to end: the shipped traces come back within 3 % of their recorded step time on every
// rank, with every op timed from the trace; a trace that does not match the schedule its scenario rebuilds
// is refused (exit 2) with a message naming the event and field, and nothing is written.
#include <catch2/catch.hpp>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "tests/run_util.h"

namespace {

using hzp::test::RunResult;

std::string slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const std::filesystem::path& scratch() {
  static const std::filesystem::path dir = hzp::test::fresh_dir("replay");
  return dir;
}

// `hzp replay TRACE [--scenario OVERRIDES] --out OUT`.
RunResult replay(const std::string& trace, const std::filesystem::path& out, const std::string& overrides = "") {
  return hzp::test::run(std::string("'") + HZP_BINARY + "' replay '" + trace + "'" +
                        (overrides.empty() ? "" : " --scenario '" + overrides + "'") + " --out '" + out.string() + "'");
}

const std::string kTraces = std::string(HZP_SOURCE_DIR) + "/traces";

// The shipped dense trace with `edit` applied, written to a scratch file.
std::string edited_trace(const std::string& name, void (*edit)(nlohmann::json&)) {
  nlohmann::json doc = nlohmann::json::parse(slurp(kTraces + "/tiny_dense_4ranks.json"));
  edit(doc);
  const std::string path = (scratch() / name).string();
  std::ofstream(path) << doc.dump();
  return path;
}

// The shipped dense trace with every time multiplied by `factor`.
std::string scaled_trace(const std::string& name, double factor) {
  nlohmann::json doc = nlohmann::json::parse(slurp(kTraces + "/tiny_dense_4ranks.json"));
  for (auto& e : doc["events"])
    for (const char* key : {"start_us", "end_us"}) e[key] = e[key].get<double>() * factor;
  const std::string path = (scratch() / name).string();
  std::ofstream(path) << doc.dump();
  return path;
}

}  // namespace

TEST_CASE("replay: the shipped traces come back within 3 % of their recorded step time", "[cli][replay]") {
  for (const char* name : {"tiny_dense_4ranks.json", "tiny_moe_4ranks.json"}) {
    const auto out = scratch() / (std::string("out_") + name);
    const RunResult r = replay(kTraces + "/" + name, out);
    INFO(name << "\n" << r.output);
    REQUIRE(r.code == 0);
    const auto summary = nlohmann::json::parse(slurp(out / "summary.json"));
    const auto& rep = summary["replay"];
    CHECK(rep["steps"] == 2);
    CHECK(rep["ops_not_in_trace"] == 0);
    REQUIRE(rep["ranks"].size() == 4);
    for (const auto& rank : rep["ranks"]) {
      CHECK(rank["recorded_step_s"].get<double>() > 0);
      CHECK(std::abs(rank["error"].get<double>()) <= 0.03);
    }
    CHECK(rep["worst_abs_error"].get<double>() <= 0.03);
    CHECK(std::filesystem::exists(out / "timeline.json"));
  }
  // Gzipped, the same trace replays to the same step (it was refused as "a NUL byte").
  const auto gz = scratch() / "tiny_dense_4ranks.json.gz";
  std::filesystem::remove(gz);
  std::filesystem::copy_file(kTraces + "/tiny_dense_4ranks.json", scratch() / "tiny_dense_4ranks.json",
                             std::filesystem::copy_options::overwrite_existing);
  REQUIRE(hzp::test::run("gzip '" + (scratch() / "tiny_dense_4ranks.json").string() + "'").code == 0);
  const RunResult plain = replay(kTraces + "/tiny_dense_4ranks.json", scratch() / "out_plain");
  const RunResult zipped = replay(gz.string(), scratch() / "out_gz");
  INFO(zipped.output);
  REQUIRE(zipped.code == 0);
  CHECK(nlohmann::json::parse(slurp(scratch() / "out_gz" / "summary.json"))["step_time_s"] ==
        nlohmann::json::parse(slurp(scratch() / "out_plain" / "summary.json"))["step_time_s"]);
  // One that inflates past the 256 MiB a trace may have says that, not "a NUL byte" (the eighth attack).
  const auto bomb = scratch() / "spaces.json.gz";
  REQUIRE(std::system(("head -c 272629760 /dev/zero | tr '\\0' ' ' | gzip -1 > '" + bomb.string() + "'").c_str()) == 0);
  const RunResult big = replay(bomb.string(), scratch() / "out_bomb");
  CHECK(big.code == 2);
  CHECK_THAT(big.output, Catch::Contains("inflates to more than the 268435456 bytes accepted"));
}

TEST_CASE("replay: a trace of subnormal times replays with no relative error, not a 300-digit one", "[cli][replay]") {
  const std::string trace = edited_trace("subnormal.json", [](nlohmann::json& d) {
    for (auto& e : d["events"])
      for (const char* key : {"start_us", "end_us"}) e[key] = e[key].get<double>() * 1e-315;
  });
  const auto out = scratch() / "out_subnormal";
  const RunResult r = replay(trace, out);
  INFO(r.output);
  REQUIRE(r.code == 0);
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) CHECK(line.size() < 200);
  const auto summary = nlohmann::json::parse(slurp(out / "summary.json"));
  for (const auto& rank : summary["replay"]["ranks"]) CHECK(rank["error"].is_null());
  CHECK(summary["replay"]["worst_abs_error"].is_null());  // undefined, not 0 %
}

TEST_CASE("replay: a trace with a rank missing, or a rank of zero-length events, is refused", "[cli][replay]") {
  const std::string missing = edited_trace("missing_rank.json", [](nlohmann::json& d) {
    nlohmann::json kept = nlohmann::json::array();
    for (auto& e : d["events"])
      if (e["rank"] != 3) kept.push_back(e);
    d["events"] = kept;
  });
  RunResult r = replay(missing, scratch() / "out_missing_rank");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("has no events of rank 3"));
  const std::string zero = edited_trace("zero_times.json", [](nlohmann::json& d) {
    for (auto& e : d["events"]) e["start_us"] = e["end_us"] = 0;
  });
  r = replay(zero, scratch() / "out_zero_times");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("no time was recorded"));
  // One event (of rank 3) lasting 1 µs among zero-length ones: the other ranks recorded no time (issue 35's
  // eighth attack: it replayed as a step of 0 s with an empty table).
  const std::string one = edited_trace("one_timed_event.json", [](nlohmann::json& d) {
    for (auto& e : d["events"]) e["end_us"] = e["start_us"];
    d["events"][0]["end_us"] = d["events"][0]["start_us"].get<double>() + 1;
  });
  r = replay(one, scratch() / "out_one_timed_event");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("every event of rank 0 starts and ends at the same instant"));
}

TEST_CASE("replay: times faster than the GPU's peak replay with a note saying so", "[cli][replay]") {
  // Issue 35's eighth attack: a trace scaled by 1e-7 replayed at 10,761 TFLOP/s per A100 with no word.
  const std::string fast = scaled_trace("scaled_1e-7.json", 1e-7);
  const auto out = scratch() / "out_scaled";
  const RunResult r = replay(fast, out);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("the a100-80gb's peak of 312: they are not the times"));
  CHECK(nlohmann::json::parse(slurp(out / "summary.json"))["replay"]["faster_than_peak"] == true);
  // Scaled by 1e-9, no rank's recorded step reaches a nanosecond: the worst error is undefined, not 0 % (the
  // ninth attack).
  const std::string tiny = scaled_trace("scaled_1e-9.json", 1e-9);
  const auto tiny_out = scratch() / "out_scaled_1e-9";
  const RunResult t = replay(tiny, tiny_out);
  CHECK(t.code == 0);
  CHECK_THAT(t.output, Catch::Contains("worst |error| undefined") && Catch::Contains("they are not the times"));
  CHECK(nlohmann::json::parse(slurp(tiny_out / "summary.json"))["replay"]["worst_abs_error"].is_null());
  // One rank's ops lasting 1e-9 us where they were recorded: its step looks normal, its busy time does not
  // (the ninth attack: it hid behind the other ranks').
  const std::string one_fast = edited_trace("one_rank_fast.json", [](nlohmann::json& d) {
    for (auto& e : d["events"])
      if (e["rank"] == 0) e["end_us"] = e["start_us"].get<double>() + 1e-9;
  });
  const RunResult f = replay(one_fast, scratch() / "out_one_rank_fast");
  CHECK(f.code == 0);
  CHECK_THAT(f.output, Catch::Contains("note: rank 0's recorded times imply"));
  // The recorded trace itself is no faster than its GPU.
  const auto plain = scratch() / "out_plain_peak";
  CHECK(replay(kTraces + "/tiny_dense_4ranks.json", plain).output.find("they are not the times") == std::string::npos);
  CHECK(nlohmann::json::parse(slurp(plain / "summary.json"))["replay"]["faster_than_peak"] == false);
}

TEST_CASE("replay: a step missing events is refused, compute recorded in no time noted and not calibrated",
          "[cli][replay]") {
  // Issue 35's tenth attack: rank 0's step 1 removed (+102 % with no word), one of its collectives removed (the
  // pairing shifted), and rank 1's compute set to zero length (no faster-than-peak note, and calibrate fitted
  // the optimizer's ops alone).
  const std::string no_step = edited_trace("no_step.json", [](nlohmann::json& d) {
    nlohmann::json kept = nlohmann::json::array();
    for (auto& e : d["events"])
      if (!(e["rank"] == 0 && e["step"] == 1)) kept.push_back(e);
    d["events"] = kept;
  });
  RunResult r = replay(no_step, scratch() / "out_no_step");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("rank 0 has no event in step 1, which other ranks record"));
  const std::string no_collective = edited_trace("no_collective.json", [](nlohmann::json& d) {
    nlohmann::json kept = nlohmann::json::array();
    bool dropped = false;
    for (auto& e : d["events"]) {
      const bool collective = e["kind"] == "all_gather" || e["kind"] == "reduce_scatter";
      if (!dropped && e["rank"] == 0 && e["step"] == 0 && collective) {
        dropped = true;
        continue;
      }
      kept.push_back(e);
    }
    d["events"] = kept;
  });
  r = replay(no_collective, scratch() / "out_no_collective");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("rank 0's step 0 lacks op") && Catch::Contains("every recorded step"));
  const std::string twice =
      edited_trace("event_twice.json", [](nlohmann::json& d) { d["events"].push_back(d["events"][0]); });
  r = replay(twice, scratch() / "out_event_twice");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("an op runs once a step"));
  const std::string no_compute_time = edited_trace("no_compute_time.json", [](nlohmann::json& d) {
    for (auto& e : d["events"])
      if (e["rank"] == 1 && e["kind"] == "compute") e["end_us"] = e["start_us"];
  });
  r = replay(no_compute_time, scratch() / "out_no_compute_time");
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("note: rank 1's recorded times imply"));
  r = hzp::test::run(std::string("'") + HZP_BINARY + "' calibrate --trace '" + no_compute_time + "'");
  CHECK(r.code == 2);
  CHECK_THAT(r.output, Catch::Contains("rank 1's compute ops ran at inf x the peak FLOP/s"));
}

TEST_CASE("replay: a trace that does not match its rebuilt schedule is refused, naming the event", "[cli][replay]") {
  struct Case {
    const char* name;
    void (*edit)(nlohmann::json&);
    const char* needle;
  };
  const Case cases[] = {
      {"kind.json",
       [](nlohmann::json& d) {
         // A compute event and the same rank's op 1 (the first parameter all-gather) swap op numbers.
         for (auto& e : d["events"])
           if (e["kind"] == "compute") {
             for (auto& other : d["events"])
               if (other["rank"] == e["rank"] && other["step"] == e["step"] && other["op"] == 1) other["op"] = e["op"];
             e["op"] = 1;
             break;
           }
       },
       "(kind): "},
      {"op.json", [](nlohmann::json& d) { d["events"][0]["op"] = 100000; }, "(op): rank"},
      {"world.json",
       [](nlohmann::json& d) {
         d["scenario_config"]["cluster"]["nodes"] = 4;  // 8 ranks
         d["scenario_config"]["training"]["global_batch_sequences"] = 32;
         d["training"]["global_batch_sequences"] = 32;  // the summary says what scenario_config does
       },
       "world_size 4 differs"},
      {"group.json", [](nlohmann::json& d) { std::swap(d["groups"][0]["ranks"][0], d["groups"][0]["ranks"][1]); },
       "other ranks than the rebuilt schedule's"},
      {"scenario.json",
       [](nlohmann::json& d) {
         d["scenario_config"]["model"]["layers"] = "two";
         d.erase("model");  // the summary is optional
       },
       "scenario_config: model.layers"},
      // The summaries and the policy name must be scenario_config's (the eighth attack: ddp over a zero3 run).
      {"policy.json", [](nlohmann::json& d) { d["policy"] = "ddp"; }, "policy: must be scenario_config.policy.preset"},
      {"summary.json", [](nlohmann::json& d) { d["model"]["layers"] = 7; },
       "model: must be what scenario_config gives"},
      // The tenth: an integer written as 16.0, and a scenario name other than scenario_config's.
      {"summary_float.json",
       [](nlohmann::json& d) { d["training"]["micro_batch"] = d["training"]["micro_batch"].get<double>(); },
       "training: must be what scenario_config gives"},
      {"scenario_name.json", [](nlohmann::json& d) { d["scenario"] = "another-run"; },
       "scenario: must be scenario_config.name"},
      {"streams.json", [](nlohmann::json& d) { d["streams"].push_back("compute"); }, "names \"compute\" twice"},
      {"stream_order.json", [](nlohmann::json& d) { std::swap(d["streams"][1], d["streams"][2]); },
       "streams differ from the rebuilt schedule's (compute, param_gather, grad_reduce)"},
      // Every field an event repeats from its op must be the op's (they were read and never compared).
      {"layer.json", [](nlohmann::json& d) { d["events"][5]["layer"] = 3; }, "layer: 3, but the rebuilt"},
      {"micro_batch.json",
       [](nlohmann::json& d) {
         for (auto& e : d["events"])
           if (e["kind"] == "compute") {
             e["micro_batch"] = 4;
             break;
           }
       },
       "micro_batch: 4, but the rebuilt"},
      {"pool.json",
       [](nlohmann::json& d) {
         for (auto& e : d["events"])
           if (e["kind"] == "acquire") {
             e["pool"] = e["pool"] == "param_gather" ? "grad_reduce" : "param_gather";
             break;
           }
       },
       "pool: "},
      {"stream.json",
       [](nlohmann::json& d) {
         for (auto& e : d["events"])
           if (e["kind"] == "all_gather") {
             e["stream"] = "compute";
             break;
           }
       },
       "stream: compute, but the rebuilt"},
      {"role.json",
       [](nlohmann::json& d) {
         d["groups"][0]["role"] = "x";
         for (auto& e : d["events"])
           if (e.contains("group") && e["group"] == 0) e["role"] = "x";
       },
       "group 0 has role x, the rebuilt"},
      {"gpus_per_node.json", [](nlohmann::json& d) { d["gpus_per_node"] = 1; }, "gpus_per_node 1 differs"},
      {"event_key.json", [](nlohmann::json& d) { d["events"][3]["colour"] = "red"; }, "events[3].colour: not a key of"},
      {"kind_key.json",
       [](nlohmann::json& d) {
         for (std::size_t i = 0; i < d["events"].size(); ++i)
           if (d["events"][i]["kind"] == "all_gather") {
             d["events"][i]["phase"] = "bwd";
             break;
           }
       },
       "phase: not a key of all_gather events"},
      {"event_role.json", [](nlohmann::json& d) { d["events"][5]["role"] = nlohmann::json::array(); },
       "events[5].role: must be its group's role"},
      {"model_summary.json", [](nlohmann::json& d) { d["model"] = "big"; }, "trace.model: must be a summary object"},
  };
  for (const Case& c : cases) {
    const auto out = scratch() / (std::string("bad_") + c.name);
    const RunResult r = replay(edited_trace(c.name, c.edit), out);
    INFO(c.name << "\n" << r.output);
    CHECK(r.code == 2);
    CHECK(r.output.find(c.needle) != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(out / "summary.json"));
  }
  const RunResult missing = replay(kTraces + "/no_such_trace.json", scratch() / "missing");
  CHECK(missing.code == 2);
}

namespace {

RunResult what_if(const std::string& trace, const nlohmann::json& overrides, const std::filesystem::path& out) {
  const std::string file = out.string() + ".overrides.json";
  std::ofstream(file) << overrides.dump();
  return replay(trace, out, file);
}

}  // namespace

TEST_CASE("replay what-if: the trace's compute scaled by FLOPs on another cluster and policy", "[cli][replay]") {
  const std::string trace = kTraces + "/tiny_dense_4ranks.json";
  // 8 nodes of 8 under HSDP, at the recorded micro-batch of 4 and at 8.
  nlohmann::json overrides = {{"cluster", {{"nodes", 8}, {"gpus_per_node", 8}, {"nic", {{"per_node", 8}}}}},
                              {"training", {{"global_batch_sequences", 512}}},
                              {"policy", {{"preset", "hsdp"}, {"sharding", nullptr}}}};
  const auto out4 = scratch() / "what_if_mb4";
  const RunResult r4 = what_if(trace, overrides, out4);
  INFO(r4.output);
  REQUIRE(r4.code == 0);
  overrides["training"]["micro_batch"] = 8;  // as many micro-batches per step, each twice the tokens
  overrides["training"]["global_batch_sequences"] = 1024;
  const auto out8 = scratch() / "what_if_mb8";
  const RunResult r8 = what_if(trace, overrides, out8);
  INFO(r8.output);
  REQUIRE(r8.code == 0);
  const auto s4 = nlohmann::json::parse(slurp(out4 / "summary.json"));
  const auto s8 = nlohmann::json::parse(slurp(out8 / "summary.json"));
  CHECK(s4["gpus"] == 64);
  CHECK(s4["what_if"]["ops_not_in_trace"] == 0);
  CHECK(s4["what_if"]["recorded_step_s"].get<double>() > 0);
  // Twice the tokens per micro-batch: every compute op twice the FLOPs (attention's quadratic part grows
  // with the sequence, not the micro-batch), so twice the compute time, minus the unchanged optimizer.
  const double ratio = s8["compute_s"].get<double>() / s4["compute_s"].get<double>();
  CHECK(ratio > 1.8);
  CHECK(ratio <= 2.0 + 1e-9);
  // FP8 linear layers on a GPU whose FP8 peak is twice its bf16 one: those FLOPs take half the recorded
  // time per FLOP, the attention core, the head and the memory-bound work keep theirs.
  overrides["training"]["precision"] = "bf16";
  overrides["cluster"]["gpu"] = {{"fp8_peak_tflops", 2 * 312}};  // the trace ran on "a100-80gb" (312)
  const auto out16 = scratch() / "what_if_bf16";
  const RunResult r16 = what_if(trace, overrides, out16);
  INFO(r16.output);
  REQUIRE(r16.code == 0);
  overrides["training"]["fp8"] = true;
  const auto out_fp8 = scratch() / "what_if_fp8";
  const RunResult r_fp8 = what_if(trace, overrides, out_fp8);
  INFO(r_fp8.output);
  REQUIRE(r_fp8.code == 0);
  const double fp8_ratio = nlohmann::json::parse(slurp(out_fp8 / "summary.json"))["compute_s"].get<double>() /
                           nlohmann::json::parse(slurp(out16 / "summary.json"))["compute_s"].get<double>();
  CHECK(fp8_ratio < 0.95);
  CHECK(fp8_ratio > 0.5);
  // A what-if that breaks the scenario rules is refused with the JSON path, nothing written.
  const auto bad = scratch() / "what_if_bad";
  const RunResult r = what_if(trace, {{"training", {{"micro_batch", 0}}}}, bad);
  CHECK(r.code == 2);
  CHECK(r.output.find("training.micro_batch") != std::string::npos);
  CHECK_FALSE(std::filesystem::exists(bad / "summary.json"));
  // An overrides file that is not a JSON object, and --steps without a what-if: exit 2.
  const RunResult array = what_if(trace, nlohmann::json::array({1, 2}), scratch() / "what_if_array");
  CHECK(array.code == 2);
  CHECK(array.output.find("is not a JSON object") != std::string::npos);
  const RunResult steps = hzp::test::run(std::string("'") + HZP_BINARY + "' replay '" + trace + "' --steps 2");
  CHECK(steps.code == 2);
  CHECK(steps.output.find("--steps applies to a what-if") != std::string::npos);
}

TEST_CASE("replay what-if from --set: the same as the overrides file with those fields", "[cli][replay]") {
  const std::string trace = kTraces + "/tiny_dense_4ranks.json";
  const auto from_file = scratch() / "set_file";
  const RunResult f = what_if(trace, {{"cluster", {{"nodes", 2}}}, {"policy", {{"preset", "zero1"}}}}, from_file);
  INFO(f.output);
  REQUIRE(f.code == 0);
  const auto from_set = scratch() / "set_flags";
  const RunResult s =
      hzp::test::run(std::string("'") + HZP_BINARY + "' replay '" + trace +
                     "' --set cluster.nodes=2 --set policy.preset=zero1 --out '" + from_set.string() + "'");
  INFO(s.output);
  REQUIRE(s.code == 0);
  const auto a = nlohmann::json::parse(slurp(from_file / "summary.json"));
  const auto b = nlohmann::json::parse(slurp(from_set / "summary.json"));
  CHECK(a["gpus"] == b["gpus"]);
  CHECK(a["step_time_s"] == b["step_time_s"]);
  CHECK(a["what_if"]["recorded_step_s"] == b["what_if"]["recorded_step_s"]);
}

TEST_CASE("replay and calibrate refuse hostile trace fields naming them (issue 35 items 1-3)", "[cli][replay]") {
  // Each once crashed (SIGFPE, SIGSEGV), ran without bound or aborted inside SimGrid.
  const struct {
    const char* name;
    void (*edit)(nlohmann::json&);
    const char* message;
  } cases[] = {
      {"gpn0", [](nlohmann::json& d) { d["gpus_per_node"] = 0; }, "trace.gpus_per_node: must be in [1, 4]"},
      {"nogroups", [](nlohmann::json& d) { d["groups"] = nlohmann::json::array(); },
       "names an entry of an empty table"},
      {"far_step", [](nlohmann::json& d) { d["events"][5]["step"] = 1'000'000'000; },
       "a trace's steps are consecutive"},
      {"huge_time", [](nlohmann::json& d) { d["events"][7]["end_us"] = 1.7e308; },
       "microseconds from the trace's start"},
      {"negative_time", [](nlohmann::json& d) { d["events"][7]["start_us"] = -1.0; }, "must be in [0, "},
  };
  for (const auto& c : cases) {
    const std::string path = edited_trace(std::string("hostile_") + c.name + ".json", c.edit);
    for (const std::string& command : {"replay '" + path + "' --out '" + (scratch() / "hostile").string() + "'",
                                       "calibrate --trace '" + path + "'"}) {
      INFO(c.name << ": " << command);
      const RunResult r = hzp::test::run(std::string("'") + HZP_BINARY + "' " + command);
      CHECK(r.code == 2);
      CHECK(r.output.find(c.message) != std::string::npos);
    }
  }
  // A trace whose steps start later (a resumed run's) is renumbered, not refused.
  const std::string later = edited_trace("later_steps.json", [](nlohmann::json& d) {
    for (auto& e : d["events"]) e["step"] = e["step"].get<long long>() + 7;
  });
  const RunResult r = replay(later, scratch() / "later");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK(nlohmann::json::parse(slurp(scratch() / "later" / "summary.json"))["replay"]["steps"] == 2);
}

TEST_CASE("replay: --timeline-ranks K records K GPUs, as its message about a large timeline says", "[cli][replay]") {
  const auto out = scratch() / "out_timeline_ranks";
  const RunResult r = hzp::test::run(std::string("'") + HZP_BINARY + "' replay '" + kTraces +
                                     "/tiny_dense_4ranks.json' --timeline-ranks 2 --out '" + out.string() + "'");
  INFO(r.output);
  REQUIRE(r.code == 0);
  const auto timeline = nlohmann::json::parse(slurp(out / "timeline.json"));
  CHECK(timeline["otherData"]["recorded_ranks"] == 2);
  const RunResult zero = hzp::test::run(std::string("'") + HZP_BINARY + "' replay '" + kTraces +
                                        "/tiny_dense_4ranks.json' --timeline-ranks 0 --out '" + out.string() + "'");
  CHECK(zero.code == 2);
  CHECK(zero.output.find("--timeline-ranks") != std::string::npos);
}
