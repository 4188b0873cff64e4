// Small text helpers shared by the core, both executors and the CLI: joining lists, and showing
// user-supplied text in messages without echoing megabytes of it or raw control characters.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace hzp {

// "a, b, c" (or with another separator).
std::string join(const std::vector<std::string>& items, std::string_view separator = ", ");

// `text` made safe to print in one line of an error message: control characters and invalid UTF-8 bytes
// become \xHH / \n / \t escapes, characters that reorder or hide what a terminal shows (bidi overrides such
// as U+202E, zero-width characters, C1 controls) \uXXXX, and anything past `max_bytes` is cut to "...(N bytes)". The
// result is at most about max_bytes + 24 bytes long.
std::string printable(std::string_view text, std::size_t max_bytes = 80);

// printable() in double quotes: "name".
std::string quoted(std::string_view text, std::size_t max_bytes = 80);

}  // namespace hzp
