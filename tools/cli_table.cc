// The hzp binary's command table: the core commands (tools/cli_commands.cc) and train, the one that needs the
// runtime library (Gloo, the CUDA backend), so that the core's table links without it (the Python module).
#include <vector>

#include "tools/cli.h"
#include "tools/cli_train.h"

namespace hzp::cli {

const std::vector<Command>& commands() {
  static const std::vector<Command> table = [] {
    std::vector<Command> all = core_commands();
    all.push_back({"train", "train the scenario's model on local CPU ranks (Gloo) with its policy's schedule",
                   kTrainHelp, run_train_command});
    return all;
  }();
  return table;
}

}  // namespace hzp::cli
