// `hzp train` against hostile input and failures: damaged, foreign, inconsistent and non-finite
// checkpoints; two jobs on one checkpoint directory; a launcher killed with -9; a rank that never joins;
// flags out of range; outputs that cannot be written; a diverged loss; the checkpoint header parser alone.
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/store/launch_env.h"
#include "runtime/train/checkpoint.h"
#include "tests/run_util.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

using hzp::test::fresh_dir;
using hzp::test::run;
using hzp::test::RunResult;
const std::string& kData = hzp::test::kTrainingText;

std::string tiny_scenario(const fs::path& dir, int steps, const std::string& policy = "zero3") {
  const json doc = {
      {"model", {{"preset", "tiny-dense"}, {"layers", 2}, {"hidden", 32}, {"heads", 4}, {"ffn_hidden", 64}}},
      {"cluster", {{"preset", "dgx-a100"}, {"gpus_per_node", 4}}},
      {"training", {{"seq_len", 32}, {"micro_batch", 2}, {"global_batch_sequences", 8}, {"precision", "fp32"}}},
      {"policy", {{"preset", policy}}},
      {"run", {{"steps", steps}, {"lr", 0.003}, {"warmup_steps", 2}, {"eval_batches", 2}}}};
  const fs::path p = dir / "s.json";
  std::ofstream(p) << doc.dump(2);
  return p.string();
}

std::string train(const std::string& scenario, int nproc, const std::string& extra) {
  return std::string(HZP_BINARY) + " train " + scenario + " --nproc " + std::to_string(nproc) +
         " --threads 1 --timeout-s 20 --data " + kData + " " + extra;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A rank file split into its header line (JSON) and payload.
struct RankFile {
  json header;
  std::string payload;
};
RankFile read_rank_file(const fs::path& p) {
  const std::string text = slurp(p);
  const auto nl = text.find('\n');
  return {json::parse(text.substr(0, nl)), text.substr(nl + 1)};
}
void write_rank_file(const fs::path& p, const RankFile& f) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << f.header.dump() << "\n" << f.payload;
}
// FNV-1a 64 of the payload, written independently of checkpoint.cc.
std::string fnv1a_hex(const std::string& bytes) {
  std::uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

}  // namespace

TEST_CASE("checkpoint header: every field is type- and range-checked", "[train][checkpoint]") {
  using hzp::runtime::parse_checkpoint_header;
  const json good = {{"format", "hzp-checkpoint-v1"},
                     {"rank", 1},
                     {"world_size", 4},
                     {"policy", "zero3"},
                     {"next_step", 10},
                     {"adam_steps", 10},
                     {"segments", {{8, 4}, {16, 8}}},
                     {"payload_bytes", (8 + 8 + 16 + 16) * 4},
                     {"payload_fnv1a64", "00000000000000ff"}};
  auto ok = parse_checkpoint_header(good.dump());
  REQUIRE(ok.ok());
  CHECK(ok->rank == 1);
  CHECK(ok->checksum == 255);
  struct Case {
    const char* key;
    json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"rank", "1", "rank: must be an integer"},
      {"rank", 4, "rank: must be in [0, 3]"},
      {"world_size", nullptr, "world_size: must be an integer"},
      {"next_step", -1, "next_step: must be in [0, 1000000000]"},
      {"next_step", 1e300, "next_step: must be an integer"},
      {"adam_steps", 11, "adam_steps: must be in [0, 10]"},
      {"policy", 3, "policy: must be a string"},
      {"segments", "all", "segments: must be an array"},
      {"segments", {{8, -4}}, "segments[0]: must be"},
      {"payload_bytes", 12, "payload_bytes: 12 disagrees with the segments"},
      {"payload_fnv1a64", "xyz", "payload_fnv1a64: must be 16 lowercase hex digits"},
      {"format", "zip", "format: not an hzp checkpoint"},
  };
  for (const Case& c : cases) {
    json h = good;
    h[c.key] = c.value;
    auto r = parse_checkpoint_header(h.dump());
    INFO(c.key << " = " << c.value.dump());
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == hzp::StatusCode::kInvalidInput);
    CHECK_THAT(r.status().message(), Catch::Contains(c.message));
  }
  json missing = good;
  missing.erase("next_step");
  CHECK_THAT(parse_checkpoint_header(missing.dump()).status().message(), Catch::Contains("next_step: missing"));
  CHECK_FALSE(parse_checkpoint_header(std::string(100000, '[')).ok());
  CHECK_FALSE(parse_checkpoint_header("").ok());
}

TEST_CASE("runtime: damaged, foreign, inconsistent and non-finite checkpoints are refused with exit 2",
          "[train][checkpoint]") {
  const fs::path dir = fresh_dir("ckpt");
  const std::string scen = tiny_scenario(dir, 6);
  const fs::path ckpt = dir / "ckpt";
  RunResult first = run(train(scen, 2, "--checkpoint-dir " + ckpt.string() + " --stop-after 3"));
  INFO(first.output);
  REQUIRE(first.code == 0);
  const fs::path rank1 = ckpt / "step_3" / "rank_1.bin";
  REQUIRE(fs::exists(rank1));
  const RankFile original = read_rank_file(rank1);
  auto resume = [&] { return run(train(scen, 2, "--checkpoint-dir " + ckpt.string() + " --resume")); };
  auto expect_refused = [&](const char* what, const std::string& message) {
    const RunResult r = resume();
    INFO(what << ": " << r.output);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Catch::Contains(message));
    write_rank_file(rank1, original);
  };

  RankFile f = original;
  f.header["next_step"] = "three";
  write_rank_file(rank1, f);
  expect_refused("a field of the wrong JSON type", "next_step: must be an integer");

  f = original;
  f.header["next_step"] = 2;  // consistent file, but not the step `latest` names: ranks would desynchronise
  f.header["adam_steps"] = 2;
  write_rank_file(rank1, f);
  expect_refused("next_step different across ranks", "rank 1 resumes at step 2 where 'latest' says 3");

  f = original;
  f.header["next_step"] = 1000;
  f.header["adam_steps"] = 1000;
  write_rank_file(rank1, f);
  expect_refused("next_step beyond the run", "next_step 1000 is beyond the run's 6 steps");

  f = original;
  f.header["adam_steps"] = 0;  // fp32 skips no step: Adam's bias correction would restart silently
  write_rank_file(rank1, f);
  expect_refused("adam_steps behind next_step in fp32", "adam_steps: must equal next_step (3)");

  f = original;
  f.header["note"] = "edited";
  write_rank_file(rank1, f);
  expect_refused("a key hzp does not write", "unknown key \"note\"");

  f = original;
  f.payload[f.payload.size() / 2] ^= 0x40;
  write_rank_file(rank1, f);
  expect_refused("a flipped payload bit", "(the file is damaged)");

  f = original;
  const float nan = std::nanf("");
  for (std::size_t i = 0; i + 4 <= 64; i += 4) std::memcpy(&f.payload[i], &nan, 4);
  f.header["payload_fnv1a64"] = fnv1a_hex(f.payload);  // a well-formed file of a diverged state
  write_rank_file(rank1, f);
  expect_refused("a state full of NaN", "holds NaN or Inf");

  // The original resumes fine and `latest` was never moved by the failures.
  CHECK(slurp(ckpt / "latest") == "3\n");
  const RunResult ok = resume();
  INFO(ok.output);
  CHECK(ok.code == 0);
  CHECK(slurp(ckpt / "latest") == "6\n");
  fs::remove_all(dir);
}

TEST_CASE("runtime: one job per checkpoint directory, stale temporary files are cleaned", "[train][checkpoint]") {
  const fs::path dir = fresh_dir("lock");
  const std::string scen = tiny_scenario(dir, 2000);
  const fs::path ckpt = dir / "ckpt";
  fs::create_directories(ckpt / "step_7");
  std::ofstream(ckpt / "step_7" / "rank_0.bin.tmp") << "half a file";
  std::ofstream(ckpt / "latest.tmp") << "9";
  // A long job holds the directory; a second one is refused at once, naming the holder.
  const std::string bg = train(scen, 2, "--checkpoint-dir " + ckpt.string() + " --out " + (dir / "o").string());
  const RunResult started = run("bash -c '" + bg + " >/dev/null 2>&1 & echo $! > " + (dir / "pid").string() +
                                "; for i in $(seq 100); do [ -s " + (dir / "o" / "metrics.jsonl").string() +
                                " ] && exit 0; sleep 0.1; done; exit 1'");
  REQUIRE(started.code == 0);
  CHECK_FALSE(fs::exists(ckpt / "step_7" / "rank_0.bin.tmp"));
  CHECK_FALSE(fs::exists(ckpt / "latest.tmp"));
  const RunResult second = run(train(scen, 2, "--checkpoint-dir " + ckpt.string() + " --steps 3"));
  INFO(second.output);
  CHECK(second.code == 2);
  CHECK_THAT(second.output, Catch::Contains("is in use by another hzp train job (pid"));
  run("kill -TERM $(cat " + (dir / "pid").string() + ")");
  std::this_thread::sleep_for(std::chrono::seconds(2));
  fs::remove_all(dir);
}

TEST_CASE("runtime: train keeps to what it wrote: others' .tmp files, a hard-linked .lock, steps past latest",
          "[train][checkpoint]") {
  // Issue 35's seventh attack: every *.tmp two levels deep was removed, a .lock hard-linked to a file outside
  // was truncated and written, and --resume overwrote a step folder past `latest`.
  const fs::path dir = fresh_dir("foreign");
  const std::string scen = tiny_scenario(dir, 4);
  const fs::path ckpt = dir / "ckpt";
  fs::create_directories(ckpt / "notes");
  std::ofstream(ckpt / "draft.tmp") << "mine";
  std::ofstream(ckpt / "notes" / "report.tmp") << "mine";
  const RunResult first = run(train(scen, 2, "--checkpoint-dir " + ckpt.string() + " --stop-after 2"));
  INFO(first.output);
  REQUIRE(first.code == 0);
  CHECK(fs::exists(ckpt / "draft.tmp"));
  CHECK(fs::exists(ckpt / "notes" / "report.tmp"));
  // latest = 2; a step folder past it is refused before anything is written.
  fs::create_directories(ckpt / "step_9");
  const RunResult past = run(train(scen, 2, "--checkpoint-dir " + ckpt.string() + " --resume"));
  INFO(past.output);
  CHECK(past.code == 2);
  CHECK_THAT(past.output, Catch::Contains("holds step_9, past its latest (step 2)"));
  fs::remove(ckpt / "step_9");
  // A .lock that is a hard link to a file outside the folder: refused, the file as it was.
  std::ofstream(dir / "victim") << "precious";
  fs::remove(ckpt / ".lock");
  fs::create_hard_link(dir / "victim", ckpt / ".lock");
  const RunResult linked = run(train(scen, 2, "--checkpoint-dir " + ckpt.string() + " --resume"));
  INFO(linked.output);
  CHECK(linked.code == 2);
  CHECK_THAT(linked.output, Catch::Contains("is not a lock file of its own"));
  std::ifstream victim(dir / "victim");
  std::string text((std::istreambuf_iterator<char>(victim)), std::istreambuf_iterator<char>());
  CHECK(text == "precious");
  fs::remove(ckpt / ".lock");
  CHECK(run(train(scen, 2, "--checkpoint-dir " + ckpt.string() + " --resume")).code == 0);
  fs::remove_all(dir);
}

TEST_CASE("runtime: ranks die with a launcher killed by SIGKILL", "[train]") {
  const fs::path dir = fresh_dir("orphans");
  const std::string scen = tiny_scenario(dir, 100000);
  const std::string out = (dir / "o").string();
  // Start the launcher, wait for training, list its ranks, kill -9 the launcher only, then count survivors.
  const std::string script =
      train(scen, 2, "--out " + out) +
      " >/dev/null 2>&1 & launcher=$!; "
      "for i in $(seq 150); do [ -s " +
      out +
      "/metrics.jsonl ] && break; sleep 0.1; done; "
      "ranks=$(pgrep -P $launcher); [ -n \"$ranks\" ] || exit 3; kill -9 $launcher; "
      "for i in $(seq 50); do alive=0; for p in $ranks; do kill -0 $p 2>/dev/null && alive=1; done; "
      "[ $alive = 0 ] && exit 0; sleep 0.1; done; kill -9 $ranks; exit 4";
  const RunResult r = run("bash -c '" + script + "'");
  INFO(r.output);
  CHECK(r.code == 0);
  fs::remove_all(dir);
}

TEST_CASE("runtime: a rank that never joins is named as such, MASTER_ADDR may be a host name", "[train]") {
  const fs::path dir = fresh_dir("join");
  const std::string scen = tiny_scenario(dir, 3, "ddp");
  const int port = hzp::test::free_port();
  // Rank 0 of 2 alone: it hosts the store at "localhost" and waits for rank 1, which never comes.
  const RunResult r =
      run("RANK=0 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=" + std::to_string(port) +
          " HZP_STORE_TOKEN=0123456789abcdef " + std::string(HZP_BINARY) + " train " + scen +
          " --threads 1 --timeout-s 3 --data " + kData);
  INFO(r.output);
  CHECK(r.code == 1);
  CHECK_THAT(r.output, Catch::Contains("rank 1 never joined"));
  CHECK(r.seconds < 30);
  auto resolved = hzp::runtime::resolve_ipv4("localhost", "MASTER_ADDR");
  REQUIRE(resolved.ok());
  CHECK(resolved->rfind("127.", 0) == 0);
  CHECK_THAT(hzp::runtime::resolve_ipv4("no-such-host.invalid", "MASTER_ADDR").status().message(),
             Catch::Contains("MASTER_ADDR=\"no-such-host.invalid\" does not resolve"));
  fs::remove_all(dir);
}

TEST_CASE("launch environment: ranks per host from LOCAL_WORLD_SIZE and Slurm's tasks per node", "[train]") {
  using hzp::runtime::detect_launch_env;
  auto from = [](std::map<std::string, std::string> vars) {
    return [vars](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  };
  const std::map<std::string, std::string> base = {
      {"MASTER_ADDR", "h"}, {"MASTER_PORT", "1"}, {"HZP_STORE_TOKEN", "0123456789abcdef"}};
  auto with = [&](std::map<std::string, std::string> extra) {
    extra.insert(base.begin(), base.end());
    return detect_launch_env(from(extra));
  };
  auto torchrun = with({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"}});
  REQUIRE(torchrun.ok());
  CHECK((*torchrun)->local_world_size == 4);
  auto slurm = with({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_NTASKS_PER_NODE", "4(x2)"}});
  REQUIRE(slurm.ok());
  CHECK((*slurm)->local_world_size == 4);
  auto bad = with({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "9"}});
  REQUIRE_FALSE(bad.ok());
  CHECK_THAT(bad.status().message(), Catch::Contains("LOCAL_WORLD_SIZE"));
}

TEST_CASE("runtime: flags out of range, unwritable outputs and bad scenarios fail once, before training", "[train]") {
  const fs::path dir = fresh_dir("flags");
  const std::string scen = tiny_scenario(dir, 3);
  const std::string hzp = std::string(HZP_BINARY) + " train " + scen + " --data " + kData;
  for (const char* flags : {"--nproc 4294967297", "--nproc 0", "--timeout-s 2147483648", "--steps 2147483648000",
                            "--threads -1", "--gpus-per-node 1e3", "--nproc 2 --nproc 2"}) {
    const RunResult r = run(hzp + " " + flags);
    INFO(flags << ": " << r.output);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Catch::Contains("see hzp train --help"));
  }
  // Unwritable outputs are found before any rank starts (no metrics written, seconds not minutes).
  fs::create_directories(dir / "ro");
  fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  const bool root = ::geteuid() == 0;  // root writes anywhere: use a path under a regular file instead
  const std::string blocked = root ? (dir / "s.json").string() + "/sub" : (dir / "ro").string();
  for (const std::string& flags : {"--trace " + blocked + "/t.json", "--out " + blocked + "/o",
                                   "--checkpoint-dir " + blocked + "/c", "--perfetto " + dir.string()}) {
    const RunResult r = run(hzp + " --nproc 2 --steps 2 " + flags);
    INFO(flags << ": " << r.output);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Catch::Contains("--"));
    CHECK(r.output.find("step 1/") == std::string::npos);
  }
  fs::permissions(dir / "ro", fs::perms::owner_all);
  const RunResult trace = run(hzp + " --nproc 2 --steps 500 --trace " + (dir / "t.json").string());
  CHECK(trace.code == 2);
  CHECK_THAT(trace.output, Catch::Contains("at most 100 steps"));
  // A scenario error is reported once, not once per rank.
  json bad_doc = json::parse(slurp(scen));
  bad_doc["model"]["hiden"] = 3;
  std::ofstream(dir / "bad.json") << bad_doc.dump();
  const RunResult bad =
      run(std::string(HZP_BINARY) + " train " + (dir / "bad.json").string() + " --nproc 4 --data " + kData);
  CHECK(bad.code == 2);
  std::size_t count = 0;
  for (std::size_t at = bad.output.find("model.hiden"); at != std::string::npos;
       at = bad.output.find("model.hiden", at + 1))
    ++count;
  CHECK(count == 1);
  // A setting the simulator models but the runtime does not implement is refused, not ignored.
  auto refused = [&](const char* name, const json& training, const json& gpu, const std::string& message) {
    json doc = json::parse(slurp(scen));
    doc["training"].update(training);
    if (!gpu.empty()) doc["cluster"]["gpu"].update(gpu);
    std::ofstream(dir / name) << doc.dump();
    const RunResult r = run(std::string(HZP_BINARY) + " train " + (dir / name).string() + " --nproc 2 --data " + kData);
    INFO(r.output);
    CHECK(r.code == 2);
    CHECK_THAT(r.output, Catch::Contains(message));
  };
  refused("dropout.json", {{"attention_dropout", 0.1}}, json::object(), "training.attention_dropout");
  refused("fp8.json", {{"fp8", true}, {"precision", "bf16"}}, {{"fp8_peak_tflops", 1979}},
          "training.fp8: the runtime has no FP8");
  refused("eager.json", {{"kernels", "eager"}}, json::object(), "training.kernels: \"eager\"");
  fs::remove_all(dir);
}

TEST_CASE("runtime: the default training text is found from any working directory, a diverged loss stops the run",
          "[train]") {
  const fs::path dir = fresh_dir("cwd");
  const std::string scen = tiny_scenario(dir, 2);
  const RunResult r =
      run("cd " + dir.string() + " && " + std::string(HZP_BINARY) + " train " + scen + " --nproc 1 --threads 1");
  INFO(r.output);
  CHECK(r.code == 0);
  CHECK_THAT(r.output, Catch::Contains("hzp train: done: 2 steps"));
  CHECK_THAT(r.output, Catch::Contains("ETA"));
  CHECK(r.output.find("../shared") == std::string::npos);
  const RunResult nan = run("HZP_FAULT_NAN_STEP=1 " + train(scen, 2, "--checkpoint-dir " + (dir / "c").string()));
  INFO(nan.output);
  CHECK(nan.code == 1);
  CHECK_THAT(nan.output, Catch::Contains("training diverged at step 1 (loss nan"));
  CHECK_FALSE(fs::exists(dir / "c" / "latest"));
  fs::remove_all(dir);
}
