// Running the hzp binary from a fuzz target, and judging how it ended: the targets that spawn hzp (cli,
// checkpoint_dir) share one way to start it (stdin from /dev/null, no launcher variables, so `train` stays
// local) and one rule for its exit: 0, or 2 with stderr lines a person can read (checks.h).
#pragma once

#include <string>
#include <vector>

#include "tests/fuzz/fuzz_target.h"

namespace hzp::fuzz {

struct HzpRun {
  int status = 0;  // as waitpid reports it
  std::string out, err;
};

// Runs `args` (args[0] the binary) in `dir`, its stdout and stderr kept in dir/.stdout and dir/.stderr.
HzpRun run_hzp(std::vector<std::string> args, const std::string& dir);

// Failed when hzp was killed, exited with anything but 0 or 2, or exited 2 with more than 64 KiB of stderr
// or a stderr line that is not a clean message; passed otherwise.
Verdict judge_hzp_exit(const HzpRun& run);

// The exit code, or -1 when killed.
int exit_code(const HzpRun& run);

}  // namespace hzp::fuzz
