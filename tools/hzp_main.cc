// Entry point of the `hzp` CLI: dispatches to the subcommand table in cli_commands.cc.
#include <cstdio>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "runtime/runtime_info.h"
#include "shared/base/text.h"
#include "sim/sim_info.h"
#include "tools/cli.h"

namespace {

void print_usage(std::FILE* out) {
  std::fprintf(out,
               "hzp — hierarchical, asynchronous ZeRO sharding: plan, simulate and run LLM training schedules.\n\n"
               "usage: hzp COMMAND [ARGS]   (hzp COMMAND --help for details)\n\ncommands:\n");
  for (const auto& c : hzp::cli::commands()) std::fprintf(out, "  %-10s %s\n", c.name, c.summary);
  std::fprintf(out,
               "\nexit codes: 0 ok, 2 bad input (scenario or arguments), 1 internal error.\n"
               "scenario format: scenarios/README.md\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    print_usage(stderr);
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_usage(stdout);
    return 0;
  }
  if (args[0] == "--version") {
    std::printf("hzp 0.1.0\n  sim: %s\n  runtime: %s\n", hzp::sim::backend_description().c_str(),
                hzp::runtime::backend_description().c_str());
    return 0;
  }
  // Arguments are shown back as they are (an output folder in "wrote PATH", a file in messages): one with
  // control characters, or characters that reorder or hide what a terminal shows, is refused rather than
  // echoed raw (issue 35's seventh attack: an --out holding ESC reached the terminal in 24 commands); so is
  // one that is not UTF-8, which the JSON writer refuses with an exception (the eighth: overlong forms).
  for (std::size_t i = 0; i < args.size(); ++i)
    if (hzp::printable(args[i], args[i].size() + 1) != args[i]) {
      std::fprintf(stderr,
                   "hzp: error: argument %zu, %s, holds control or invisible characters, or is not UTF-8 "
                   "(terminal escapes, bidi overrides, overlong or surrogate bytes); give it without them\n",
                   i + 1, hzp::quoted(args[i], 200).c_str());
      return 2;
    }
  for (const auto& c : hzp::cli::commands()) {
    if (args[0] != c.name) continue;
    std::vector<std::string> rest(args.begin() + 1, args.end());
    for (const std::string& a : rest) {
      if (a == "--help" || a == "-h") {
        std::printf("%s", c.help);
        return 0;
      }
    }
    // Memory a command could not get (an input past what the process's limits allow, where no estimate
    // refused it first) ends the command with a message, not std::terminate.
    try {
      return c.run(rest);
    } catch (const std::bad_alloc&) {
      std::fprintf(stderr,
                   "hzp: error: out of memory: the input needs more than this process's memory limits "
                   "(ulimit -v, cgroup) allow\n");
      return 2;
    }
  }
  std::fprintf(stderr, "hzp: unknown command %s\n\n", hzp::quoted(args[0], 60).c_str());
  print_usage(stderr);
  return 2;
}
