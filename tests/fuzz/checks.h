// What every target asks of an error: the right kind, and a message a person can read. A message over
// kMaxMessageBytes, or one holding control characters or invalid UTF-8, fails the case: messages must
// name the offending value, not echo megabytes of input or bytes that garble a terminal or a JSON report.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "shared/base/status.h"
#include "tests/fuzz/fuzz_target.h"

namespace hzp::fuzz {

constexpr std::size_t kMaxMessageBytes = 2000;

// Empty when `message` is fine; else what is wrong with it, e.g. "message of 1048600 bytes".
std::string message_problem(std::string_view message);

// True when `text` is valid UTF-8 (no overlong forms, no surrogates, nothing above U+10FFFF).
bool valid_utf8(std::string_view text);

// The verdict on the status of one stage of the pipeline under test: nullopt when it is ok (go on); else the
// case's verdict — passed for kInvalidInput with a clean message, failed for anything else. `unimplemented_ok`
// accepts kUnimplemented like kInvalidInput (a policy whose scheduler is not built yet).
std::optional<Verdict> stop_on_error(std::string_view stage, const Status& status, bool unimplemented_ok = false);

}  // namespace hzp::fuzz
