// hzp_fuzz: runs the fuzz targets of targets.cc, each case in a sandboxed child (sandbox.h), and reports
// every failing case with its reproducer. Usage and the pass criterion: tests/fuzz/README.md.
//
// Order per target: the checked-in regressions (tests/fuzz/regressions/<target>/), then --corpus files,
// then N generated cases. Generated case i depends only on (--seed, target, i), so `--case i` reruns it.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "tests/fuzz/files.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/sandbox.h"
#include "tests/fuzz/self_test.h"

namespace {

namespace fs = std::filesystem;

// SIGINT / SIGTERM: finish the running case, skip the rest, remove the work directory, print the summary.
volatile std::sig_atomic_t stop_requested = 0;
extern "C" void request_stop(int) {
  stop_requested = 1;
}
using namespace hzp::fuzz;

const char kUsage[] =
    "usage: hzp_fuzz [--target NAME|all] [--cases N | --cases NAME=N ...] [--seed S] [--case I]\n"
    "                [--corpus DIR] [--save-failures DIR] [--replay FILE] [--case-timeout-s T]\n"
    "                [--case-memory-mib M] [--show K] [--verbose] [--no-regressions] [--list] [--self-test]\n\n"
    "Runs N generated cases per target (default 100) after its regressions (tests/fuzz/regressions/<target>/),\n"
    "each in a forked child limited to T seconds (default 10) and M MiB of address space (default 2048).\n"
    "  --cases NAME=N      N cases for target NAME only (repeatable; overrides --cases N for it)\n"
    "  --seed S            the run's seed (default 1); generated case i of a target depends on S, the target and i\n"
    "  --case I            only generated case I (with the same --seed, --target and --corpus: reruns one\n"
    "                      reported case)\n"
    "  --corpus DIR        also run, first, every file under DIR/<target>/ (a --save-failures folder, say)\n"
    "  --save-failures DIR write each failing input to DIR/<target>/<seed>-<case><ext>\n"
    "  --replay FILE       run FILE as the single input of --target NAME\n"
    "  --show K            print the details of the first K failures of each kind (default 3; all are counted)\n"
    "  --verbose           one line per case: outcome, time, input\n"
    "  --list              print the targets and exit\n"
    "  --self-test         check that the sandbox reports crashes, hangs, exits and memory blow-ups, and exit\n"
    "Prints one line per failure, a summary per target and `N passed, M failed`; exits 1 when a case failed.\n";

struct Options {
  std::string target = "all";
  long long cases = 100;
  std::map<std::string, long long> cases_per_target;
  std::uint64_t seed = 1;
  std::optional<long long> only_case;
  std::string corpus;
  std::string save_failures;
  std::string replay;
  double timeout_s = 10;
  std::size_t memory_mib = 2048;
  long long show = 3;
  bool regressions = true;
  bool list = false;
  bool verbose = false;
  bool self_test = false;
};

bool parse_number(const std::string& text, long long min, long long& out) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0' || v < min) return false;
  out = v;
  return true;
}

// nullopt after printing the problem.
std::optional<Options> parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::printf("%s", kUsage);
      std::exit(0);
    }
    if (a == "--no-regressions") {
      o.regressions = false;
      continue;
    }
    if (a == "--list") {
      o.list = true;
      continue;
    }
    if (a == "--self-test") {
      o.self_test = true;
      continue;
    }
    if (a == "--verbose") {
      o.verbose = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "hzp_fuzz: %s needs a value\n%s", a.c_str(), kUsage);
      return std::nullopt;
    }
    const std::string v = argv[++i];
    long long n = 0;
    bool good = true;
    if (a == "--target") {
      o.target = v;
    } else if (a == "--cases") {
      const std::size_t eq = v.find('=');
      if (eq == std::string::npos)
        good = parse_number(v, 0, o.cases);
      else if ((good = parse_number(v.substr(eq + 1), 0, n)))
        o.cases_per_target[v.substr(0, eq)] = n;
    } else if (a == "--seed") {
      good = parse_number(v, 0, n);
      o.seed = static_cast<std::uint64_t>(n);
    } else if (a == "--case") {
      good = parse_number(v, 0, n);
      o.only_case = n;
    } else if (a == "--corpus") {
      o.corpus = v;
    } else if (a == "--save-failures") {
      o.save_failures = v;
    } else if (a == "--replay") {
      o.replay = v;
    } else if (a == "--show") {
      good = parse_number(v, 0, o.show);
    } else if (a == "--case-timeout-s") {
      good = parse_number(v, 1, n);
      o.timeout_s = static_cast<double>(n);
    } else if (a == "--case-memory-mib") {
      good = parse_number(v, 64, n);
      o.memory_mib = static_cast<std::size_t>(n);
    } else {
      std::fprintf(stderr, "hzp_fuzz: unknown option %s\n%s", a.c_str(), kUsage);
      return std::nullopt;
    }
    if (!good) {
      std::fprintf(stderr, "hzp_fuzz: %s: bad value '%s'\n", a.c_str(), v.c_str());
      return std::nullopt;
    }
  }
  if (!o.replay.empty() && o.target == "all") {
    std::fprintf(stderr, "hzp_fuzz: --replay needs --target NAME\n");
    return std::nullopt;
  }
  return o;
}

// A failure's kind for the summary: the reason up to " | ", numbers of three or more digits folded, so that
// equal bugs count together.
std::string signature(const SandboxResult& r) {
  std::string head = r.reason.substr(0, r.reason.find(" | "));
  head = std::regex_replace(head, std::regex("[0-9][0-9][0-9]+"), "N");
  return std::string(to_string(r.outcome)) + ": " + printable(head, 140);
}

struct CaseInput {
  std::string label;  // "regression FILE", "corpus FILE", "replay FILE" or "case I"
  std::string input;
  std::optional<long long> index;  // generated cases only
  std::string path;                // the file of a fixed input
};

struct TargetTally {
  long long passed = 0;
  long long failed = 0;
  double slowest_pass_s = 0;  // the slowest passing case: how close the suite runs to the time limit
  std::string slowest_pass;
  std::map<std::string, long long> kinds;
};

TargetTally run_target(const TargetEntry& entry, FuzzTarget& target, const Options& o, const Context& context) {
  // Regression and corpus files seed the mutations in every mode (so that `--case I` regenerates exactly the
  // input of a full run), and run first unless one case or one file was asked for.
  std::vector<CaseInput> fixed;
  auto add_files = [&](const std::string& dir, const char* what) {
    for (const std::string& path : list_files(dir, "")) {
      const std::string name = fs::path(path).filename().string();
      if (name.rfind('.', 0) == 0 || name == "README.md") continue;
      if (auto text = read_file(path)) {
        target.add_seed(*text);
        if (o.replay.empty() && !o.only_case)
          fixed.push_back({std::string(what) + " " + path, *text, std::nullopt, path});
      }
    }
  };
  if (o.regressions) add_files(context.source_dir + "/tests/fuzz/regressions/" + entry.name, "regression");
  if (!o.corpus.empty()) add_files(o.corpus + "/" + entry.name, "corpus");
  if (!o.replay.empty()) {
    if (auto text = read_file(o.replay))
      fixed.push_back({"replay " + o.replay, *text, std::nullopt, o.replay});
    else
      std::fprintf(stderr, "hzp_fuzz: cannot read %s\n", o.replay.c_str());
  }
  const long long n = o.cases_per_target.count(entry.name) ? o.cases_per_target.at(entry.name) : o.cases;
  const long long first = o.only_case.value_or(0);
  const long long last = !o.replay.empty() ? 0 : (o.only_case ? first + 1 : n);
  const long long total = static_cast<long long>(fixed.size()) + (last - first);

  SandboxLimits limits;
  limits.timeout_s = o.timeout_s;
  limits.memory_mib = o.memory_mib;
  limits.output_path = context.work_dir + "/case_output";
  TargetTally tally;
  const auto start = std::chrono::steady_clock::now();
  long long done = 0;
  auto run_one = [&](const CaseInput& c) {
    SandboxResult r = run_in_sandbox([&] { return target.run(c.input); }, limits);
    ++done;
    if (o.verbose)
      std::printf("%s %s: %s in %.2f s: %s\n", entry.name, c.label.c_str(), to_string(r.outcome), r.elapsed_s,
                  target.describe(c.input).c_str());
    if (r.outcome == Outcome::kPassed) {
      ++tally.passed;
      if (r.elapsed_s > tally.slowest_pass_s) tally.slowest_pass_s = r.elapsed_s, tally.slowest_pass = c.label;
    } else {
      ++tally.failed;
      std::string saved;
      if (!o.save_failures.empty() && c.index) {
        const std::string dir = o.save_failures + "/" + entry.name;
        std::error_code ec;
        fs::create_directories(dir, ec);
        const std::string path =
            dir + "/" + std::to_string(o.seed) + "-" + std::to_string(*c.index) + target.extension();
        if (write_file(path, c.input)) saved = path;
      }
      if (++tally.kinds[signature(r)] <= o.show) {
        std::printf("FAIL %s %s (seed %llu): %s: %s [%.2f s, max RSS %ld MiB]\n", entry.name, c.label.c_str(),
                    static_cast<unsigned long long>(o.seed), to_string(r.outcome), printable(r.reason, 600).c_str(),
                    r.elapsed_s, r.max_rss_mib);
        std::printf("  input: %s\n", target.describe(c.input).c_str());
        if (!r.output_tail.empty() && r.outcome != Outcome::kFailed)
          std::printf("  output tail: %s\n", r.output_tail.c_str());
        if (!saved.empty())
          std::printf("  saved: %s (replay: hzp_fuzz --target %s --replay %s)\n", saved.c_str(), entry.name,
                      saved.c_str());
        else if (c.index)
          std::printf("  rerun: hzp_fuzz --target %s --seed %llu --case %lld [--save-failures DIR]\n", entry.name,
                      static_cast<unsigned long long>(o.seed), *c.index);
        else
          std::printf("  replay: hzp_fuzz --target %s --replay %s\n", entry.name, c.path.c_str());
      }
    }
    if (total >= 10 && done % std::max<long long>(1, total / 10) == 0) {
      std::printf("%s: %lld/%lld cases, %lld failed, %.0f s\n", entry.name, done, total, tally.failed,
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::fflush(stdout);
  };
  for (const CaseInput& c : fixed)
    if (!stop_requested) run_one(c);
  for (long long i = first; i < last && !stop_requested; ++i) {
    Rng rng(Rng::case_seed(o.seed, entry.name, static_cast<std::uint64_t>(i)));
    run_one({"case " + std::to_string(i), target.generate(rng), i, {}});
  }
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("%s: %lld passed, %lld failed (%zu fixed inputs + %lld generated, seed %llu) in %.1f s", entry.name,
              tally.passed, tally.failed, fixed.size(), last - first, static_cast<unsigned long long>(o.seed), elapsed);
  if (tally.passed > 0)
    std::printf("; slowest passing case %.2f s (%s)", tally.slowest_pass_s, tally.slowest_pass.c_str());
  std::printf("\n");
  if (!tally.kinds.empty()) std::printf("  failures by kind (details above for the first %lld of each):\n", o.show);
  for (const auto& [kind, count] : tally.kinds) std::printf("  %6lld x %s\n", count, kind.c_str());
  return tally;
}

}  // namespace

int main(int argc, char** argv) {
  std::signal(SIGINT, request_stop);
  std::signal(SIGTERM, request_stop);
  auto options = parse_options(argc, argv);
  if (!options) return 2;
  const Options& o = *options;
  if (o.list) {
    for (const TargetEntry& e : target_registry()) std::printf("%-13s %s\n", e.name, e.description);
    return 0;
  }
  std::vector<const TargetEntry*> selected;
  for (const TargetEntry& e : target_registry())
    if (o.target == "all" || o.target == e.name) selected.push_back(&e);
  if (selected.empty()) {
    std::fprintf(stderr, "hzp_fuzz: unknown target '%s' (hzp_fuzz --list)\n", o.target.c_str());
    return 2;
  }

  Context context;
  context.source_dir = HZP_SOURCE_DIR;
  context.hzp_binary = HZP_BINARY;
  context.case_timeout_s = o.timeout_s;
  const std::string tmp_template = (fs::temp_directory_path() / "hzp_fuzz.XXXXXX").string();
  std::vector<char> tmp(tmp_template.begin(), tmp_template.end());
  tmp.push_back('\0');
  if (!mkdtemp(tmp.data())) {
    std::fprintf(stderr, "hzp_fuzz: cannot create a temporary directory: %s\n", std::strerror(errno));
    return 1;
  }
  context.work_dir = tmp.data();
  if (o.self_test) {
    const int code = run_self_test(context.work_dir);
    std::error_code ec;
    fs::remove_all(context.work_dir, ec);
    return code;
  }

  std::printf("hzp_fuzz: seed %llu, targets %s, %lld cases each, limits %.0f s and %zu MiB per case\n",
              static_cast<unsigned long long>(o.seed), o.target.c_str(), o.cases, o.timeout_s, o.memory_mib);
  long long passed = 0, failed = 0;
  for (const TargetEntry* e : selected) {
    if (stop_requested) break;
    auto target = e->make();
    if (std::string why = target->prepare(context); !why.empty()) {
      std::printf("FAIL %s: cannot prepare the target: %s\n", e->name, why.c_str());
      ++failed;
      continue;
    }
    const TargetTally t = run_target(*e, *target, o, context);
    passed += t.passed;
    failed += t.failed;
  }
  std::error_code ec;
  fs::remove_all(context.work_dir, ec);
  if (stop_requested) std::printf("hzp_fuzz: interrupted, the remaining cases were not run\n");
  std::printf("%lld passed, %lld failed\n", passed, failed);
  return failed > 0 || stop_requested ? 1 : 0;
}
