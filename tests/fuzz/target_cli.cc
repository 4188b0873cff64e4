// Target "cli": the built `hzp` binary with mutated subcommands, flags and values, each run in a scratch
// directory (its working directory and every --out) that is emptied before the case.
//
// A case (file format below) is a list of arguments plus the files and directories to create first.
// Arguments may name @TMP@ (the scratch directory) and @SRC@ (the repository). Generated cases cover
// validate, schedule, plan, plan --search, simulate, collective and train, with extreme numbers, missing
// values, unknown flags, directories and devices for files, and mutated scenario and cluster files.
//
// `hzp train` is only ever given scenarios that cannot parse (the file is not a JSON object, or holds the
// unknown top-level key "fuzz_unknown_key"), so it always stops before a rank starts; run() refuses a train
// case that names any other JSON object file (a hand-written replay, say) rather than start real training.
//
// Pass: hzp exits 0 or 2 within the case limits; on exit 2 every stderr line passes message_problem
// (checks.h) and stderr stays under 64 KiB; `collective` on exit 0 prints only positive sizes.
//
// Case file format (text, one record per line, bytes outside printable ASCII as \xNN, backslash as \\):
//   dir NAME              a directory to create under @TMP@
//   file NAME CONTENTS    a file to create under @TMP@
//   arg VALUE             the next argument after `hzp`
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <set>

#include "shared/model/model_math.h"
#include "shared/scenario/scenario_parser.h"
#include "tests/fuzz/checks.h"
#include "tests/fuzz/files.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/mutate.h"
#include "tests/fuzz/sandbox.h"
#include "tests/fuzz/spawn.h"

namespace hzp::fuzz {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct CliCase {
  std::vector<std::string> dirs;
  std::vector<std::pair<std::string, std::string>> files;
  std::vector<std::string> args;
};

std::string escape(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string unescape(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '\\' || i + 1 >= text.size()) {
      out += text[i];
    } else if (text[i + 1] == 'x' && i + 3 < text.size()) {
      out += static_cast<char>(std::stoi(text.substr(i + 2, 2), nullptr, 16));
      i += 3;
    } else {
      out += text[i + 1];
      ++i;
    }
  }
  return out;
}

std::string encode(const CliCase& c) {
  std::string out = "# hzp_fuzz cli case (tests/fuzz/README.md)\n";
  for (const std::string& d : c.dirs) out += "dir " + escape(d) + "\n";
  for (const auto& [name, contents] : c.files) out += "file " + escape(name) + " " + escape(contents) + "\n";
  for (const std::string& a : c.args) out += "arg " + escape(a) + "\n";
  return out;
}

CliCase decode(const std::string& text) {
  CliCase c;
  std::size_t pos = 0;
  while (pos < text.size()) {
    std::size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    if (line.rfind("arg ", 0) == 0) {
      c.args.push_back(unescape(line.substr(4)));
    } else if (line.rfind("dir ", 0) == 0) {
      c.dirs.push_back(unescape(line.substr(4)));
    } else if (line.rfind("file ", 0) == 0) {
      const std::size_t space = line.find(' ', 5);
      if (space == std::string::npos) continue;
      c.files.emplace_back(unescape(line.substr(5, space - 5)), unescape(line.substr(space + 1)));
    }
  }
  return c;
}

std::string substitute(std::string text, const std::string& tmp, const std::string& src) {
  for (const auto& [from, to] : {std::pair{std::string("@TMP@"), tmp}, std::pair{std::string("@SRC@"), src}}) {
    for (std::size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
      text.replace(at, from.size(), to);
  }
  return text;
}

class CliTarget : public FuzzTarget {
 public:
  std::string prepare(const Context& context) override {
    context_ = context;
    if (access(context.hzp_binary.c_str(), X_OK) != 0) return "the hzp binary " + context.hzp_binary + " is missing";
    for (const char* dir : {"/scenarios", "/tests/data"}) {
      for (const std::string& path : list_files(context.source_dir + dir, ".json")) {
        const std::string rel = "@SRC@" + path.substr(context.source_dir.size());
        auto text = read_file(path);
        if (!text) continue;
        seeds_.push_back(rel);
        auto parsed = parse_scenario_text(*text, "seed");
        if (!parsed.ok()) continue;
        const json doc = json::parse(*text);
        // Small scenarios are what plan --search and simulate get: each runs SimGrid (plan --search a dozen
        // times), whole seconds on a 7B model even on 8 GPUs.
        if (parsed->data_parallel() <= 16 && parameter_count(parsed->model) < 100'000'000) {
          tiny_paths_.push_back(rel);
          tiny_docs_.push_back(doc);
          tiny_mutator_.add_seed(*text);
        }
        if (doc.contains("cluster")) cluster_mutator_.add_seed(doc["cluster"].dump());
      }
    }
    for (const char* preset : {"dgx-a100", "a800", "dgx-h100", "h800", "npu-16"})
      cluster_mutator_.add_seed(json{{"preset", preset}, {"nodes", 2}}.dump());
    if (tiny_paths_.empty()) return "no small valid scenario among the seeds";
    return {};
  }

  const char* extension() const override { return ".argv"; }

  std::string describe(const std::string& input) const override {
    std::string out = "hzp";
    for (const std::string& a : decode(input).args) out += " " + printable(a, 60);
    return out;
  }

  std::string generate(Rng& rng) override {
    CliCase c;
    switch (rng.below(20)) {
      case 0:
      case 1:
      case 2:
      case 3:
        c.args = {"validate", scenario_arg(rng, c, false)};
        break;
      case 4:
      case 5:
      case 6:
        c.args = {"schedule", scenario_arg(rng, c, false)};
        if (rng.chance(80)) c.args.insert(c.args.end(), {"--rank", rng.chance(20) ? "all" : int_value(rng)});
        break;
      case 7:
      case 8:
        c.args = {"plan", scenario_arg(rng, c, false)};
        if (rng.chance(50)) c.args.insert(c.args.end(), {"--out", out_value(rng, c)});
        break;
      case 9:
        c.args = {"plan", scenario_arg(rng, c, true), "--search", "--out", out_value(rng, c)};
        if (rng.chance(70)) c.args.insert(c.args.end(), {"--top", rng.chance(50) ? "1" : int_value(rng)});
        if (rng.chance(70)) c.args.insert(c.args.end(), {"--jobs", rng.chance(50) ? "2" : int_value(rng)});
        break;
      case 10:
      case 11:
        c.args = {"simulate", scenario_arg(rng, c, true), "--out", out_value(rng, c)};
        if (rng.chance(60)) c.args.insert(c.args.end(), {"--steps", rng.chance(50) ? "2" : int_value(rng)});
        if (rng.chance(40)) c.args.insert(c.args.end(), {"--timeline-ranks", int_value(rng)});
        break;
      case 12:
      case 13:
      case 14:
      case 15:
        collective_args(rng, c);
        break;
      case 16:
      case 17:
      case 18:
        train_args(rng, c);
        break;
      default:
        junk_args(rng, c);
        break;
    }
    if (rng.chance(30)) mutate_args(rng, c);
    return encode(c);
  }

  Verdict run(const std::string& input) override {
    CliCase c = decode(input);
    const std::string tmp = context_.work_dir + "/cli_case";
    std::error_code ec;
    fs::remove_all(tmp, ec);
    fs::create_directories(tmp, ec);
    if (ec) return Verdict::fail("harness: cannot create " + tmp + " | " + ec.message());
    // Names stay inside the scratch directory, whatever a hand-written case says.
    auto inside = [](const std::string& name) {
      return !name.empty() && name[0] != '/' && name.find("..") == std::string::npos;
    };
    for (const std::string& d : c.dirs)
      if (inside(d)) fs::create_directories(tmp + "/" + d, ec);
    for (const auto& [name, contents] : c.files)
      if (inside(name)) write_file(tmp + "/" + name, contents);
    std::vector<std::string> args = {context_.hzp_binary};
    for (const std::string& a : c.args) args.push_back(substitute(a, tmp, context_.source_dir));
    // Mutations can move a repository path after an output flag: write there into the scratch directory instead.
    for (std::size_t i = 1; i + 1 < args.size(); ++i) {
      static const std::set<std::string> outputs = {"--out", "--checkpoint-dir", "--trace", "--perfetto"};
      if (outputs.count(args[i]) && args[i + 1].rfind(context_.source_dir, 0) == 0) args[i + 1] = tmp + "/redirected";
    }
    const std::string command = args.size() > 1 ? args[1] : "";
    if (command == "train") {
      if (std::string unsafe = unsafe_train_file(args); !unsafe.empty())
        return Verdict::fail("harness: refused to run train with " + unsafe +
                             ", a JSON object without \"fuzz_unknown_key\" | it could start real training");
    }

    const HzpRun run = run_hzp(std::move(args), tmp);
    Verdict verdict = judge_hzp_exit(run);
    if (verdict.passed && exit_code(run) == 0 && command == "collective") return check_collective_table(run.out);
    return verdict;
  }

 private:
  // `hzp collective` succeeded: every row of its table must have a positive size (an overflowing --bytes
  // must be refused, not printed as a negative size).
  static Verdict check_collective_table(const std::string& out) {
    std::size_t pos = 0;
    while (pos < out.size()) {
      std::size_t end = out.find('\n', pos);
      if (end == std::string::npos) end = out.size();
      const std::string line = out.substr(pos, end - pos);
      pos = end + 1;
      if (line.empty() || line[0] == '#' || line.find("size(B)") != std::string::npos) continue;
      const long long size = std::strtoll(line.c_str(), nullptr, 10);
      if (size <= 0)
        return Verdict::fail("hzp collective exit 0 with a non-positive size in its table | " + printable(line, 200));
    }
    return Verdict::pass();
  }

  // The first argument naming a JSON object file that `hzp train` could accept as a scenario, else "".
  std::string unsafe_train_file(const std::vector<std::string>& args) const {
    for (std::size_t i = 2; i < args.size(); ++i) {
      std::error_code ec;
      if (!fs::is_regular_file(args[i], ec)) continue;
      auto text = read_file(args[i]);
      if (!text) continue;
      const json doc = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (doc.is_object() && !doc.contains("fuzz_unknown_key")) return args[i];
    }
    return {};
  }

  // A SCENARIO argument: a seed, a mutated file, or a path that is no scenario at all.
  std::string scenario_arg(Rng& rng, CliCase& c, bool tiny) {
    const int roll = static_cast<int>(rng.below(100));
    if (roll < 40) return tiny ? rng.pick(tiny_paths_) : rng.pick(seeds_);
    if (roll < 75) {
      c.files.emplace_back("s.json", tiny_mutator_.mutate_document(rng, rng.pick(tiny_docs_)));
      return "@TMP@/s.json";
    }
    return special_path(rng, c);
  }

  std::string special_path(Rng& rng, CliCase& c) {
    switch (rng.below(12)) {
      case 0:
        return "@TMP@";  // a directory
      case 1:
        c.dirs.push_back("d.json");
        return "@TMP@/d.json";
      case 2:
        return "@TMP@/missing.json";
      case 3:
        return "/dev/null";
      case 4:
        return rng.chance(30) ? "/dev/zero" : "/dev/null";  // endless input
      case 5:
        return "";
      case 6:
        return "-";
      case 7:
        c.files.emplace_back("e.json", "");
        return "@TMP@/e.json";
      case 8:
        c.files.emplace_back("n.json", deep_nesting(rng, rng.chance(50) ? 1000 : 100000));
        return "@TMP@/n.json";
      case 9:
        return "@SRC@/scenarios";
      case 10:
        return std::string(rng.chance(50) ? 300 : 5000, 'p') + ".json";  // over NAME_MAX / long path
      default:
        return "bad\x01name\x1b[31m.json";
    }
  }

  std::string out_value(Rng& rng, CliCase& c) {
    switch (rng.below(10)) {
      case 0:
        return "/dev/null";
      case 1:
        c.files.emplace_back("f", "x");
        return "@TMP@/f/sub";  // a file where a directory must go
      case 2:
        return "";
      case 3:
        return "/proc/hzp_fuzz_no";
      case 4:
        return "@TMP@/" + std::string(300, 'o');
      default:
        return "@TMP@/out";
    }
  }

  std::string int_value(Rng& rng) {
    static const std::vector<std::string> values = {"0",
                                                    "1",
                                                    "2",
                                                    "3",
                                                    "4",
                                                    "7",
                                                    "8",
                                                    "16",
                                                    "64",
                                                    "-1",
                                                    "-0",
                                                    "+1",
                                                    "01",
                                                    " 1",
                                                    "1 ",
                                                    "1.5",
                                                    "1e3",
                                                    "0x10",
                                                    "",
                                                    "abc",
                                                    "1K",
                                                    "all",
                                                    "node",
                                                    "1000000",
                                                    "2147483647",
                                                    "2147483648",
                                                    "-2147483648",
                                                    "-2147483649",
                                                    "4294967295",
                                                    "4294967296",
                                                    "4294967297",
                                                    "9223372036854775807",
                                                    "9223372036854775808",
                                                    "18446744073709551616",
                                                    "99999999999999999999999999",
                                                    "\x01",
                                                    "\xff",
                                                    std::string(3000, '9')};
    return rng.pick(values);
  }

  void collective_args(Rng& rng, CliCase& c) {
    static const std::vector<std::string> clusters = {"dgx-a100", "a800", "dgx-h100", "h800",
                                                      "npu-16",   "nope", "",         "dgx-a100.json"};
    static const std::vector<std::string> ops = {"all_gather", "reduce_scatter", "all_reduce", "all_to_all",
                                                 "broadcast",  "all_reduce",     "reduce",     ""};
    static const std::vector<std::string> groups = {"node", "all", "1",  "2",       "3",          "8",
                                                    "9",    "16",  "64", "1000000", "2147483647", "2147483648",
                                                    "0",    "-1",  "",   "x",       "all "};
    static const std::vector<std::string> bytes = {"1K:1G",
                                                   "1",
                                                   "0",
                                                   "-1",
                                                   "64K",
                                                   "1M:1K",
                                                   "1G:1G",
                                                   "8G",
                                                   "1:1",
                                                   "1:8",
                                                   "K",
                                                   ":",
                                                   "1:",
                                                   ":1",
                                                   "1:2:3",
                                                   "",
                                                   "9223372036854775807",
                                                   "9223372036854775807:9223372036854775807",
                                                   "4611686018427387904:9223372036854775807",
                                                   "9007199254740993K",
                                                   "8589934592G",
                                                   "8589934591G",
                                                   "1:8589934592G",
                                                   "1k:1g",
                                                   "1T",
                                                   "1.5K",
                                                   "0x10"};
    static const std::vector<std::string> algorithms = {"auto",     "ring", "direct", "hierarchical",
                                                        "pairwise", "tree", ""};
    std::string cluster;
    const int roll = static_cast<int>(rng.below(100));
    if (roll < 55) {
      cluster = rng.pick(clusters);
    } else if (roll < 85) {
      c.files.emplace_back("cluster.json", cluster_mutator_.generate(rng));
      cluster = "@TMP@/cluster.json";
    } else {
      cluster = rng.chance(50) ? (c.dirs.push_back("dir.json"), "@TMP@/dir.json") : "@TMP@/missing.json";
    }
    c.args = {"collective", "--cluster",      cluster,   "--op",         rng.pick(ops),
              "--group",    rng.pick(groups), "--bytes", rng.pick(bytes)};
    if (rng.chance(40)) c.args.insert(c.args.end(), {"--nodes", rng.chance(40) ? "4" : int_value(rng)});
    if (rng.chance(40)) c.args.insert(c.args.end(), {"--algorithm", rng.pick(algorithms)});
  }

  // Only ever scenarios that fail to parse, whatever cluster size train substitutes (see the file comment).
  void train_args(Rng& rng, CliCase& c) {
    std::string scenario;
    switch (rng.below(8)) {
      case 0:
        c.files.emplace_back("t.json", "");
        scenario = "@TMP@/t.json";
        break;
      case 1:
        c.files.emplace_back("t.json", "[]");
        scenario = "@TMP@/t.json";
        break;
      case 2:
        c.files.emplace_back("t.json", "{\"model\":");
        scenario = "@TMP@/t.json";
        break;
      case 3:
        scenario = "@TMP@/missing.json";
        break;
      case 4:
        scenario = "@TMP@";
        break;
      case 5: {  // train decodes and re-encodes the document itself before the strict parse
        std::string text = rng.pick(tiny_docs_).dump();
        text.pop_back();
        text += ",\"fuzz_unknown_key\":" + deep_nesting(rng, rng.chance(50) ? 1000 : 100000) + "}";
        c.files.emplace_back("t.json", text);
        scenario = "@TMP@/t.json";
        break;
      }
      default: {
        json doc = rng.pick(tiny_docs_);
        doc["fuzz_unknown_key"] = 1;
        c.files.emplace_back("t.json", doc.dump());
        scenario = "@TMP@/t.json";
        break;
      }
    }
    c.args = {"train", scenario};
    static const std::vector<std::string> int_flags = {"--nproc",      "--gpus-per-node", "--steps",
                                                       "--stop-after", "--timeout-s",     "--threads"};
    const std::size_t n = rng.below(4);
    for (std::size_t i = 0; i < n; ++i) c.args.insert(c.args.end(), {rng.pick(int_flags), int_value(rng)});
    if (rng.chance(30)) c.args.insert(c.args.end(), {"--data", rng.chance(50) ? "@TMP@/missing.txt" : "@TMP@"});
    if (rng.chance(20)) c.args.insert(c.args.end(), {"--out", out_value(rng, c)});
    if (rng.chance(20)) c.args.insert(c.args.end(), {"--checkpoint-dir", out_value(rng, c)});
    if (rng.chance(15)) c.args.push_back("--resume");
    if (rng.chance(10)) c.args.insert(c.args.end(), {"--trace", out_value(rng, c)});
    if (rng.chance(10)) c.args.insert(c.args.end(), {"--perfetto", out_value(rng, c)});
  }

  void junk_args(Rng& rng, CliCase& c) {
    static const std::vector<std::vector<std::string>> forms = {{},
                                                                {"--help"},
                                                                {"--version"},
                                                                {"help"},
                                                                {"nope"},
                                                                {""},
                                                                {"validate"},
                                                                {"validate", "--bogus"},
                                                                {"schedule", "--rank"},
                                                                {"collective"},
                                                                {"train"},
                                                                {"plan", "--search"},
                                                                {"-h"},
                                                                {"VALIDATE"},
                                                                {"\x01\x02"},
                                                                {"\xff"},
                                                                {std::string(5000, 'c')},
                                                                {"simulate", "--steps"}};
    c.args = rng.pick(forms);
  }

  // Drop, duplicate, swap or replace arguments: missing values, repeated flags, unknown options.
  void mutate_args(Rng& rng, CliCase& c) {
    static const std::vector<std::string> known_flags = {
        "--out", "--rank",  "--search", "--top",   "--jobs",      "--steps", "--timeline-ranks", "--cluster",
        "--op",  "--group", "--bytes",  "--nodes", "--algorithm", "--nproc", "--resume"};
    auto& a = c.args;
    const int rounds = 1 + static_cast<int>(rng.below(2));
    for (int r = 0; r < rounds; ++r) {
      if (a.empty()) {
        a.push_back("validate");
        continue;
      }
      const std::size_t i = rng.below(a.size());
      switch (rng.below(8)) {
        case 0:
          a.erase(a.begin() + static_cast<long>(i));
          break;
        case 1:
          a.insert(a.begin() + static_cast<long>(i), a[i]);
          break;
        case 2:
          std::swap(a[i], a[rng.below(a.size())]);
          break;
        case 3:
          a.insert(a.begin() + static_cast<long>(i), rng.chance(50) ? "--bogus" : "--");
          break;
        case 4:
          a[i] = int_value(rng);
          break;
        case 5:
          a.push_back(a[i].rfind("--", 0) == 0 ? a[i] : "--out");
          break;  // a flag without its value
        case 6:
          a.insert(a.begin() + static_cast<long>(i), rng.pick(known_flags));
          break;
        default: {
          // Text hzp writes back (a --set value into summary.json, a path in a message): too long, control
          // characters, or bytes that look like UTF-8 and are not (overlong '/', a surrogate, past U+10FFFF:
          // the eighth attack of issue 35 aborted nlohmann's dump with them), kept inside what it edits.
          static const std::vector<std::string> bytes = {"ctl\x01\x7f",      "\xc0\xaf",     "\xed\xa0\x80",
                                                         "\xf4\x90\x80\x80", "\xe0\x80\xaf", "\xf8\x88\x80"};
          if (rng.chance(25)) {
            a[i] = std::string(3000, 'z');
          } else {
            const std::size_t eq = a[i].find('=');
            a[i] = (eq == std::string::npos ? a[i] : a[i].substr(0, eq + 1)) + "x" + rng.pick(bytes) + "y";
          }
          break;
        }
      }
    }
  }

  Context context_;
  std::vector<std::string> seeds_;       // every seed scenario, as @SRC@/...
  std::vector<std::string> tiny_paths_;  // valid seeds of at most 16 GPUs and 100 M parameters
  std::vector<json> tiny_docs_;
  JsonMutator tiny_mutator_;
  JsonMutator cluster_mutator_;
};

}  // namespace

std::unique_ptr<FuzzTarget> make_cli_target() {
  return std::make_unique<CliTarget>();
}

}  // namespace hzp::fuzz
