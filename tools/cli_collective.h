// `hzp collective`: the simulated twin of nccl-tests.
#pragma once

#include <string>
#include <vector>

namespace hzp::cli {

extern const char* const kCollectiveHelp;
int run_collective_command(const std::vector<std::string>& args);

}  // namespace hzp::cli
