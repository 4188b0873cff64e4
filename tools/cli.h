// The `hzp` command line: one table of subcommands, each with its help text. Exit codes: 0 ok,
// 2 bad input (scenario, flags), 1 internal error. Only main() exits.
#pragma once

#include <string>
#include <vector>

namespace hzp::cli {

struct Command {
  const char* name;
  const char* summary;
  const char* help;  // full `hzp CMD --help` text
  int (*run)(const std::vector<std::string>& args);
};

const std::vector<Command>& commands();

}  // namespace hzp::cli
