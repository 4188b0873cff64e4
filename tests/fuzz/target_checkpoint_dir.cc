// Target "checkpoint_dir": a checkpoint directory (`hzp train --checkpoint-dir`) damaged as a whole, the way
// disks, people and attackers leave one: `latest` rewritten, removed, a link or a FIFO; step folders removed,
// replaced by files or links; rank files truncated, flipped, copied from another step, replaced by FIFOs;
// `.lock` a link out of the directory; stray temporary files.
//
// Seed: a real directory written in prepare() by a 1-rank run of the tiny dense model (steps 1 and 2).
// A case is a JSON array of operations on a copy of it, e.g.
//   [{"op": "truncate", "path": "step_2/rank_0.bin", "keep": 0.5}, {"op": "symlink", "path": ".lock",
//     "target": "@OUTSIDE@"}, {"op": "write", "path": "latest", "hex": "330a"}]
// Run: `hzp train --resume --steps 3` on the damaged copy, then a run without --resume into what is left.
// Pass, for each: exit 0 or exit 2 with clean messages (spawn.h); a resume that succeeds leaves `latest` at 3
// with step_3/rank_0.bin a regular file; a run without --resume into a directory whose `latest` names a step
// is refused; and nothing outside the directory changes (a sentinel file and an empty folder beside it, the
// targets of the links a case makes).
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "shared/base/text.h"
#include "tests/fuzz/files.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/spawn.h"

namespace hzp::fuzz {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kSentinel = "sentinel: hzp must not write here\n";

// Names a case may touch: the seed's entries and the ones a run creates or could be tricked into.
const std::vector<std::string>& paths() {
  static const std::vector<std::string> p = {"latest",
                                             "latest",
                                             ".lock",
                                             "step_1",
                                             "step_2",
                                             "step_3",
                                             "step_1/rank_0.bin",
                                             "step_2/rank_0.bin",
                                             "step_2/rank_0.bin",
                                             "step_2/rank_1.bin",
                                             "step_3/rank_0.bin",
                                             "latest.tmp",
                                             "step_0"};
  return p;
}
const std::vector<std::string>& rank_files() {
  static const std::vector<std::string> p = {"step_1/rank_0.bin", "step_2/rank_0.bin"};
  return p;
}

// Written contents travel as hex: they hold bytes JSON strings cannot (invalid UTF-8, NUL).
std::string to_hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : bytes) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}
std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

json random_op(Rng& rng) {
  const auto pick = [&](const std::vector<std::string>& v) { return v[rng.below(v.size())]; };
  static const std::vector<std::string> texts = {"1\n",
                                                 "2\n",
                                                 "3\n",
                                                 "0\n",
                                                 "-1\n",
                                                 "2 2\n",
                                                 "abc\n",
                                                 "",
                                                 "99999999999\n",
                                                 "4294967298\n",
                                                 "2",
                                                 std::string("2\0\n", 3),
                                                 "\xff\xfe\n",
                                                 std::string(5000, '7')};
  static const std::vector<std::string> targets = {"@OUTSIDE@",         "@OUTSIDE_DIR@",  "step_1",
                                                   "step_1/rank_0.bin", "/nonexistent/x", "latest"};
  switch (rng.below(8)) {
    case 0:
      return {{"op", "write"}, {"path", pick(paths())}, {"hex", to_hex(pick(texts))}};
    case 1:
      return {{"op", "truncate"}, {"path", pick(rank_files())}, {"keep", static_cast<double>(rng.below(1000)) / 1000}};
    case 2:
      return {{"op", "flip"}, {"path", pick(rank_files())}, {"at", static_cast<double>(rng.below(1000)) / 1000}};
    case 3:
      return {{"op", "remove"}, {"path", pick(paths())}};
    case 4:
      return {{"op", "symlink"}, {"path", pick(paths())}, {"target", pick(targets)}};
    case 5:
      return {{"op", "fifo"}, {"path", pick(paths())}};
    case 6:
      return {{"op", "mkdir"}, {"path", pick(paths())}};
    default:
      return {{"op", "copy"}, {"from", pick(rank_files())}, {"path", pick(paths())}};
  }
}

class CheckpointDirTarget : public FuzzTarget {
 public:
  std::string prepare(const Context& context) override {
    context_ = context;
    seed_ = context.work_dir + "/ckpt_seed";
    outside_ = context.work_dir + "/outside.txt";
    outside_dir_ = context.work_dir + "/outside_dir";
    std::error_code ec;
    fs::create_directories(outside_dir_, ec);
    if (!write_file(outside_, kSentinel)) return "cannot write " + outside_;
    const HzpRun run = run_hzp(train_args(seed_, 2, false), context.work_dir);
    if (exit_code(run) != 0) return "the seed run failed: " + printable(run.err.substr(0, 600), 600);
    if (read_file(seed_ + "/latest").value_or("") != "2\n") return "the seed run left no checkpoint at step 2";
    return "";
  }
  std::string generate(Rng& rng) override {
    json ops = json::array();
    for (std::size_t n = 1 + rng.below(3); n > 0; --n) ops.push_back(random_op(rng));
    return ops.dump();
  }
  Verdict run(const std::string& input) override {
    const json ops = json::parse(input, nullptr, false);
    if (!ops.is_array()) return Verdict::fail("harness: a case is a JSON array of operations");
    const std::string dir = context_.work_dir + "/ckpt_case";
    std::error_code ec;
    fs::remove_all(dir, ec);
    fs::copy(seed_, dir, fs::copy_options::recursive, ec);
    if (ec) return Verdict::fail("harness: cannot copy the seed directory | " + ec.message());
    for (const json& op : ops) apply(dir, op);

    const HzpRun resume = run_hzp(train_args(dir, 3, true), context_.work_dir);
    if (Verdict v = judge_hzp_exit(resume); !v.passed) return Verdict::fail("--resume: " + v.reason);
    if (exit_code(resume) == 0) {
      if (read_file(dir + "/latest").value_or("") != "3\n") return Verdict::fail("--resume exit 0 but latest is not 3");
      if (!fs::is_regular_file(fs::symlink_status(dir + "/step_3/rank_0.bin", ec)))
        return Verdict::fail("--resume exit 0 but step_3/rank_0.bin is not a regular file");
    }
    const bool holds_step = names_a_step(dir + "/latest");
    const HzpRun fresh = run_hzp(train_args(dir, 1, false), context_.work_dir);
    if (Verdict v = judge_hzp_exit(fresh); !v.passed) return Verdict::fail("fresh run: " + v.reason);
    if (exit_code(fresh) == 0 && holds_step)
      return Verdict::fail("a run without --resume went on in a directory whose latest names a step");
    if (read_file(outside_).value_or("") != kSentinel) return Verdict::fail("the file outside the directory changed");
    if (!fs::is_empty(outside_dir_, ec)) return Verdict::fail("hzp wrote into the folder outside the directory");
    return Verdict::pass();
  }
  const char* extension() const override { return ".json"; }
  std::string describe(const std::string& input) const override { return printable(input, 300); }

 private:
  std::vector<std::string> train_args(const std::string& dir, int steps, bool resume) const {
    std::vector<std::string> args = {context_.hzp_binary,
                                     "train",
                                     context_.source_dir + "/scenarios/runtime/tiny_dense.json",
                                     "--nproc",
                                     "1",
                                     "--threads",
                                     "1",
                                     "--steps",
                                     std::to_string(steps),
                                     "--set",
                                     "run.checkpoint_interval=1",
                                     "--data",
                                     context_.source_dir + "/tests/data/tinyshakespeare_200k.txt",
                                     "--checkpoint-dir",
                                     dir,
                                     "--out",
                                     dir + "_out"};
    if (resume) args.push_back("--resume");
    return args;
  }

  // A regular `latest` (not a link) holding a step number, as hzp writes it.
  static bool names_a_step(const std::string& path) {
    std::error_code ec;
    if (!fs::is_regular_file(fs::symlink_status(path, ec))) return false;
    const std::string text = read_file(path).value_or("");
    return text.size() >= 2 && text.back() == '\n' && text.find_first_not_of("0123456789\n") == std::string::npos;
  }

  // One operation inside `dir`; names that would leave it are ignored (a hand-written case cannot escape).
  void apply(const std::string& dir, const json& op) const {
    const std::string name = op.value("path", "");
    if (name.empty() || name[0] == '/' || name.find("..") != std::string::npos) return;
    const std::string path = dir + "/" + name, kind = op.value("op", "");
    std::error_code ec;
    fs::create_directories(fs::path(path).parent_path(), ec);
    // Nor through a link an earlier operation made: the harness must not write outside either.
    const fs::path parent = fs::weakly_canonical(fs::path(path).parent_path(), ec);
    const std::string root = fs::weakly_canonical(dir, ec).string();
    if (ec || parent.string().rfind(root, 0) != 0) return;
    // Damage only what is a regular file (reading a FIFO would block the harness; a link leads outside).
    if ((kind == "truncate" || kind == "flip") && !fs::is_regular_file(fs::symlink_status(path, ec))) return;
    if (kind == "write") {
      fs::remove_all(path, ec);
      const std::string hex = op.value("hex", "");
      if (hex.find_first_not_of("0123456789abcdef") != std::string::npos) return;
      write_file(path, from_hex(hex));
    } else if (kind == "truncate" || kind == "flip") {
      std::string bytes = read_file(path).value_or("");
      if (bytes.empty()) return;
      const double at = op.value(kind == "truncate" ? "keep" : "at", 0.0);
      const auto offset = static_cast<std::size_t>(std::clamp(at, 0.0, 1.0) * static_cast<double>(bytes.size() - 1));
      if (kind == "truncate")
        bytes.resize(offset);
      else
        bytes[offset] = static_cast<char>(bytes[offset] ^ 0x5a);
      write_file(path, bytes);
    } else if (kind == "remove") {
      fs::remove_all(path, ec);
    } else if (kind == "symlink") {
      std::string target = op.value("target", "");
      if (target == "@OUTSIDE@") target = outside_;
      if (target == "@OUTSIDE_DIR@") target = outside_dir_;
      fs::remove_all(path, ec);
      fs::create_symlink(target, path, ec);
    } else if (kind == "fifo") {
      fs::remove_all(path, ec);
      mkfifo(path.c_str(), 0644);
    } else if (kind == "mkdir") {
      fs::remove_all(path, ec);
      fs::create_directories(path, ec);
    } else if (kind == "copy") {
      const std::string from = op.value("from", "");
      if (from.empty() || from[0] == '/' || from.find("..") != std::string::npos ||
          !fs::is_regular_file(fs::symlink_status(dir + "/" + from, ec)))
        return;
      fs::remove_all(path, ec);
      fs::copy_file(dir + "/" + from, path, ec);
    }
  }

  Context context_;
  std::string seed_, outside_, outside_dir_;
};

}  // namespace

std::unique_ptr<FuzzTarget> make_checkpoint_dir_target() {
  return std::make_unique<CheckpointDirTarget>();
}

}  // namespace hzp::fuzz
