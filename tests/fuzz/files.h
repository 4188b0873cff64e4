// Small file helpers for the harness and its targets: whole-file read and write, sorted listings.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace hzp::fuzz {

std::optional<std::string> read_file(const std::string& path);
bool write_file(const std::string& path, const std::string& contents);

// Regular files under `dir` (recursively) whose names end in `suffix` ("" for all), sorted by path so that
// seeds, and therefore generated cases, do not depend on directory order. Empty when `dir` does not exist.
std::vector<std::string> list_files(const std::string& dir, const std::string& suffix);

}  // namespace hzp::fuzz
