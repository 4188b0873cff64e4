// The `hzp` command-line parser (cli_flags.h).
#include "tools/cli_flags.h"

#include <algorithm>
#include <charconv>
#include <cstdio>

#include "shared/base/text.h"

namespace hzp::cli {

bool ParsedArgs::has(const std::string& flag) const {
  return std::any_of(options.begin(), options.end(), [&](const auto& o) { return o.first == flag; });
}

std::optional<std::string> ParsedArgs::get(const std::string& flag) const {
  std::optional<std::string> value;
  for (const auto& [k, v] : options)
    if (k == flag) value = v;
  return value;
}

std::vector<std::string> ParsedArgs::all(const std::string& flag) const {
  std::vector<std::string> values;
  for (const auto& [k, v] : options)
    if (k == flag) values.push_back(v);
  return values;
}

Result<ParsedArgs> parse_flags(const std::vector<std::string>& argv, const std::vector<Flag>& flags,
                               std::size_t max_positional) {
  ParsedArgs out;
  for (std::size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a.rfind("--", 0) != 0) {
      if (out.positional.size() >= max_positional) return Status::InvalidInput("unexpected argument " + quoted(a, 60));
      out.positional.push_back(a);
      continue;
    }
    const auto spec = std::find_if(flags.begin(), flags.end(), [&](const Flag& f) { return a == f.name; });
    if (spec == flags.end()) return Status::InvalidInput("unknown option " + printable(a, 60));
    if (!spec->repeatable && out.has(a)) return Status::InvalidInput("option " + a + " given twice");
    if (!spec->takes_value) {
      out.options.emplace_back(a, "");
      continue;
    }
    if (i + 1 >= argv.size()) return Status::InvalidInput("option " + a + " needs a value");
    // An empty value is never meant: `--out ""` wrote into the working folder, `--trace ""` silently nothing
    // (issue 35's tenth attack).
    if (argv[i + 1].empty()) return Status::InvalidInput("option " + a + ": empty value");
    out.options.emplace_back(a, argv[++i]);
  }
  return out;
}

Result<long long> parse_int_flag(const std::string& flag, const std::string& text, long long min, long long max) {
  long long v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < min || v > max)
    return Status::InvalidInput(flag + ": expected an integer in [" + std::to_string(min) + ", " + std::to_string(max) +
                                "], got " + quoted(text, 40));
  return v;
}

Result<double> parse_number_flag(const std::string& flag, const std::string& text, double min, double max) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  char range[96];
  std::snprintf(range, sizeof range, "[%g, %g]", min, max);
  if (text.empty() || ec != std::errc() || p != end || !(v >= min && v <= max))
    return Status::InvalidInput(flag + ": expected a number in " + range + ", got " + quoted(text, 40));
  return v;
}

}  // namespace hzp::cli
