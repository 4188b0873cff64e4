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

// Every command of the hzp binary (tools/cli_table.cc): core_commands() and train, which needs the runtime.
const std::vector<Command>& commands();
// Every command but train (tools/cli_commands.cc, library hzp_cli): what the Python module and a simulation's
// child process run without the runtime.
const std::vector<Command>& core_commands();
// The core command named `name`, or nullptr.
const Command* find_core_command(const std::string& name);

}  // namespace hzp::cli
