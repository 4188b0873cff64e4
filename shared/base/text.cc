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

// Length of the valid UTF-8 sequence starting at text[i], or 0 if it is not one. Valid as RFC 3629 §4 has it
// (and as nlohmann::json's dump checks, which throws on anything else): no overlong form (C0, C1; E0 80–9F;
// F0 80–8F), no UTF-16 surrogate (ED A0–BF), nothing past U+10FFFF (F4 90–BF; F5–FF).
std::size_t utf8_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return 1;
  const std::size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
  if (n == 0 || i + n > text.size()) return 0;
  for (std::size_t k = 1; k < n; ++k)
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
  // The second byte's narrower range after E0, ED, F0 and F4.
  const unsigned char second = byte(i + 1);
  if ((c == 0xe0 && second < 0xa0) || (c == 0xed && second > 0x9f) || (c == 0xf0 && second < 0x90) ||
      (c == 0xf4 && second > 0x8f))
    return 0;
  return n;
}

// The code point of the valid n-byte sequence at text[i].
char32_t code_point(std::string_view text, std::size_t i, std::size_t n) {
  const auto byte = [&](std::size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(text[i + k])); };
  char32_t cp = n == 2 ? byte(0) & 0x1f : n == 3 ? byte(0) & 0x0f : byte(0) & 0x07;
  for (std::size_t k = 1; k < n; ++k) cp = (cp << 6) | (byte(k) & 0x3f);
  return cp;
}

// Characters that are valid UTF-8 but change how a terminal shows the rest of the line, or hide text: C1
// controls, bidirectional overrides and isolates (U+202E shows what follows reversed), zero-width characters,
// line and paragraph separators, the byte order mark.
bool invisible(char32_t cp) {
  return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x200b && cp <= 0x200f) || (cp >= 0x2028 && cp <= 0x202e) ||
         (cp >= 0x2060 && cp <= 0x206f) || cp == 0xfeff;
}

}  // namespace

std::string printable(std::string_view text, std::size_t max_bytes) {
  std::string out;
  std::size_t i = 0;
  for (; i < text.size() && out.size() < max_bytes;) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const std::size_t n = utf8_length(text, i);
    if (n > 1 && invisible(code_point(text, i, n))) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(code_point(text, i, n)));
      out += buf;
      i += n;
      continue;
    }
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
