// The `hzp` command line: one table of subcommands, each with its help text. Exit codes: 0 ok,
// 2 bad input (scenario, flags), 1 internal error. Only main() exits.
#pragma once

#include <string>
#include <vector>

// The help paragraph of every command that reads a scenario (a macro: it is concatenated into literals).
#define HZP_SCENARIO_INPUT_HELP                                                                                 \
  "\nSCENARIO may be - (read from stdin). --set PATH=VALUE, repeatable, edits the scenario as written before\n" \
  "anything resolves, as the same field in the file would (--set training.micro_batch=2 --set\n"                \
  "policy.preset=zero3 --set cluster.nodes=64); VALUE is JSON when it parses as JSON, else a string; null\n"    \
  "deletes the key.\n"

namespace hzp::cli {

struct Command {
  const char* name;
  const char* summary;
  const char* help;  // full `hzp CMD --help` text
  int (*run)(const std::vector<std::string>& args);
};

const std::vector<Command>& commands();

}  // namespace hzp::cli
