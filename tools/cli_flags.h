// The one command-line parser of every `hzp` subcommand: positional arguments, `--flag VALUE` options and
// bare switches, each flag declared once; integer values read with a documented range. Errors are
// kInvalidInput with a message naming the flag and the value (the caller prints it and exits 2).
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "shared/base/status.h"

namespace hzp::cli {

struct Flag {
  const char* name;         // "--out"
  bool takes_value;         // false: a switch such as --search
  bool repeatable = false;  // may be given more than once (--set): read with all()
};

struct ParsedArgs {
  std::vector<std::string> positional;
  std::vector<std::pair<std::string, std::string>> options;  // in order; switches have an empty value

  bool has(const std::string& flag) const;
  std::optional<std::string> get(const std::string& flag) const;  // the last value given
  std::vector<std::string> all(const std::string& flag) const;    // every value given, in order
};

// Refuses unknown flags, a missing or empty value, a repeated flag that is not repeatable, and more than
// `max_positional` positionals.
Result<ParsedArgs> parse_flags(const std::vector<std::string>& argv, const std::vector<Flag>& flags,
                               std::size_t max_positional);

// A decimal integer in [min, max], nothing else (no sign for min >= 0, no spaces, no suffix).
Result<long long> parse_int_flag(const std::string& flag, const std::string& text, long long min, long long max);

// A decimal number in [min, max] (std::from_chars: no spaces, no suffix; NaN and infinities refused).
Result<double> parse_number_flag(const std::string& flag, const std::string& text, double min, double max);

}  // namespace hzp::cli
