// Runs one fuzz case in a forked child under a memory limit and a deadline, so that a crash, abort, hang or
// memory blow-up of the code under test becomes a report instead of the end of the harness.
//
// The child: leads its own process group (everything it spawns dies with it), sends stdout and stderr to a
// file, runs with RLIMIT_AS = the memory limit and no core files, and writes its Verdict to a pipe. The
// parent: waits on that pipe up to the deadline, then kills the whole group.
#pragma once

#include <cstddef>
#include <functional>
#include <string>

#include "tests/fuzz/fuzz_target.h"

namespace hzp::fuzz {

struct SandboxLimits {
  double timeout_s = 10;
  std::size_t memory_mib = 2048;
  std::string output_path;  // the child's stdout + stderr go here (truncated per case)
};

enum class Outcome {
  kPassed,       // the child returned a passing verdict
  kFailed,       // the child returned a failing verdict (bad status, over-long message, bad exit code, ...)
  kCrashed,      // killed by a signal (SIGSEGV, SIGABRT from an uncaught exception, ...)
  kTimedOut,     // still running at the deadline; killed
  kOutOfMemory,  // an allocation failed under the memory limit
  kNoVerdict,    // exited without writing a verdict (an exit() inside library code, for instance)
};

const char* to_string(Outcome outcome);

struct SandboxResult {
  Outcome outcome = Outcome::kPassed;
  std::string reason;  // one line: what happened
  double elapsed_s = 0;
  long max_rss_mib = 0;     // the child's peak resident memory
  std::string output_tail;  // the end of the child's stdout + stderr, control characters escaped
};

SandboxResult run_in_sandbox(const std::function<Verdict()>& body, const SandboxLimits& limits);

// `text` with control characters and bytes >= 0x7f as \xNN, cut to `max_bytes` (with "..." when cut).
std::string printable(const std::string& text, std::size_t max_bytes);

}  // namespace hzp::fuzz
