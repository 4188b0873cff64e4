// `hzp train`: parse flags, then launch N local ranks or, under a launcher's environment, run one rank.
#pragma once

#include <string>
#include <vector>

namespace hzp::cli {

extern const char* const kTrainHelp;
int run_train_command(const std::vector<std::string>& args);

}  // namespace hzp::cli
