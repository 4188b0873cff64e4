// Message and status checks shared by the targets (see checks.h).
#include "tests/fuzz/checks.h"

#include "tests/fuzz/sandbox.h"

namespace hzp::fuzz {

bool valid_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    std::size_t len = 0;
    unsigned int cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > text.size()) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const unsigned char cc = static_cast<unsigned char>(text[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    const unsigned int min[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

std::string message_problem(std::string_view message) {
  if (message.size() > kMaxMessageBytes)
    return "message of " + std::to_string(message.size()) + " bytes (limit " + std::to_string(kMaxMessageBytes) + ")";
  for (unsigned char c : message)
    if (c < 0x20 || c == 0x7f) return "message holds the raw control character " + printable(std::string(1, c), 8);
  if (message.empty()) return "empty message";
  if (!valid_utf8(message)) return "message is not valid UTF-8";
  return {};
}

std::optional<Verdict> stop_on_error(std::string_view stage, const Status& status, bool unimplemented_ok) {
  if (status.ok()) return std::nullopt;
  const std::string head = std::string(stage) + ": ";
  if (status.code() == StatusCode::kInvalidInput || (unimplemented_ok && status.code() == StatusCode::kUnimplemented)) {
    const std::string problem = message_problem(status.message());
    if (problem.empty()) return Verdict::pass();
    return Verdict::fail(head + problem + " | " + printable(status.message(), 300));
  }
  const char* code = status.code() == StatusCode::kInternal ? "kInternal" : "kUnimplemented";
  return Verdict::fail(head + code + " | " + printable(status.message(), 300));
}

}  // namespace hzp::fuzz
