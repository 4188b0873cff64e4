// `hzp compare A [B]`: two scenarios, simulation summaries or plan candidates side by side, with deltas.
#pragma once

#include <string>
#include <vector>

namespace hzp::cli {

extern const char* const kCompareHelp;
int run_compare_command(const std::vector<std::string>& args);

}  // namespace hzp::cli
