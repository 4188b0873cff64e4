// `hzp_fuzz --self-test`: the sandbox must turn each way a case can go wrong into the right outcome, or the
// harness would report a crashing build as clean. Each body below misbehaves in one way, on purpose.
#include "tests/fuzz/self_test.h"

#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

#include "tests/fuzz/checks.h"
#include "tests/fuzz/sandbox.h"

namespace hzp::fuzz {
namespace {

struct Check {
  const char* name;
  Outcome expected;
  Verdict (*body)();
};

volatile int* null_pointer = nullptr;

const Check kChecks[] = {
    {"passes", Outcome::kPassed, [] { return Verdict::pass(); }},
    {"fails", Outcome::kFailed, [] { return Verdict::fail("on purpose"); }},
    {"segfault", Outcome::kCrashed,
     [] {
       *null_pointer = 1;
       return Verdict::pass();
     }},
    {"abort", Outcome::kCrashed,
     [] {
       std::abort();
       return Verdict::pass();
     }},
    {"exception", Outcome::kFailed, []() -> Verdict { throw std::runtime_error("escaped"); }},
    {"exit", Outcome::kNoVerdict,
     [] {
       std::exit(3);
       return Verdict::pass();
     }},
    {"hang", Outcome::kTimedOut,
     [] {
       for (;;) pause();
       return Verdict::pass();
     }},
    {"hang in a grandchild", Outcome::kTimedOut,
     [] {
       if (fork() == 0)
         for (;;) pause();
       for (;;) pause();
       return Verdict::pass();
     }},
    {"memory", Outcome::kOutOfMemory,
     [] {
       std::vector<std::vector<char>> hog;
       for (;;) hog.emplace_back(64 << 20, 'x');
       return Verdict::pass();
     }},
    {"message with a control character", Outcome::kFailed,
     [] { return *stop_on_error("stage", Status::InvalidInput("bad \x1b[31m")); }},
    {"long message", Outcome::kFailed,
     [] { return *stop_on_error("stage", Status::InvalidInput(std::string(3000, 'x'))); }},
    {"invalid UTF-8 message", Outcome::kFailed,
     [] { return *stop_on_error("stage", Status::InvalidInput("bad \xc3(")); }},
    {"clean kInvalidInput", Outcome::kPassed,
     [] { return *stop_on_error("stage", Status::InvalidInput("model.layers: must be a positive integer, got 0")); }},
    {"kInternal", Outcome::kFailed, [] { return *stop_on_error("stage", Status::Internal("broken")); }},
};

}  // namespace

int run_self_test(const std::string& work_dir) {
  SandboxLimits limits;
  limits.timeout_s = 2;
  limits.memory_mib = 512;
  limits.output_path = work_dir + "/self_test_output";
  int wrong = 0;
  for (const Check& c : kChecks) {
    // Hangs are judged at 2 s; everything else gets 10 s, so a loaded machine (a parallel ctest) does not
    // turn a slow verdict (filling 512 MiB) into a time-out.
    limits.timeout_s = c.expected == Outcome::kTimedOut ? 2 : 10;
    const SandboxResult r = run_in_sandbox(c.body, limits);
    const bool ok = r.outcome == c.expected;
    wrong += ok ? 0 : 1;
    std::printf("%s self-test %-34s %-13s (expected %s) %s\n", ok ? "ok  " : "FAIL", c.name, to_string(r.outcome),
                to_string(c.expected), printable(r.reason, 120).c_str());
  }
  std::printf("self-test: %zu checks, %d wrong\n", std::size(kChecks), wrong);
  return wrong == 0 ? 0 : 1;
}

}  // namespace hzp::fuzz
