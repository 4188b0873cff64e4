// Text helpers (text.h).
#include "shared/base/text.h"

#include <cstdio>

namespace hzp {

std::string join(const std::vector<std::string>& items, std::string_view separator) {
  std::string out;
  for (const std::string& item : items) {
    if (!out.empty()) out += separator;
    out += item;
  }
  return out;
}

namespace {

// Length of the valid UTF-8 sequence starting at text[i], or 0 if it is not one.
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  std::size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  return n;
}

}  // namespace

std::string printable(std::string_view text, std::size_t max_bytes) {
  std::string out;
  std::size_t i = 0;
  for (; i < text.size() && out.size() < max_bytes;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_length(text, i);
    if (n > 1) {
      out.append(text.substr(i, n));
      i += n;
      continue;
    }
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f || n == 0) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
    ++i;
  }
  if (i < text.size()) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string quoted(std::string_view text, std::size_t max_bytes) {
  return "\"" + printable(text, max_bytes) + "\"";
}

}  // namespace hzp
