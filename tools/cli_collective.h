// `hzp collective`: the simulated twin of nccl-tests.
#pragma once

#include <string>
#include <vector>

namespace hzp::cli {

// The help text, generated from the same option table as the parser (presets, defaults and values included).
const char* collective_help();
int run_collective_command(const std::vector<std::string>& args);

}  // namespace hzp::cli
