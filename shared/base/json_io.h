// Strict JSON decoding for every document hzp reads (scenarios, cluster files, checkpoint headers,
// traces): bounded size and nesting, duplicate keys refused, errors as values with bounded messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"

namespace hzp {

inline constexpr std::size_t kMaxScenarioBytes = 16u << 20;  // a scenario is a few kilobytes
inline constexpr int kMaxJsonDepth = 64;                     // a scenario nests five levels

// What a document may be. max_tree_bytes bounds the heap of the decoded tree, estimated by a linear pre-scan
// (json_tree_bytes); 0 means twelve times max_bytes, what a document of ordinary values of that size takes.
struct JsonLimits {
  std::size_t max_bytes = kMaxScenarioBytes;
  int max_depth = kMaxJsonDepth;
  std::int64_t max_tree_bytes = 0;
  std::int64_t max_objects = 0;  // "{...}" outside strings, 0 for any number
};

// The heap nlohmann's tree of `text` would take (an upper estimate, exact to a few percent for documents
// of objects and numbers), from one pass over the text without parsing it.
std::int64_t json_tree_bytes(std::string_view text);

// Decodes `text`. kInvalidInput, with a message naming the byte offset or the JSON path, when it is empty,
// larger than `max_bytes`, nested deeper than `max_depth` (checked before parsing: nlohmann destroys a
// value recursively, so 60 000 levels overflow the stack), would decode into a tree larger than
// max_tree_bytes (also checked before parsing), malformed, or repeats a key in one object
// (nlohmann would keep the last value silently).
Result<nlohmann::json> parse_json_strict(std::string_view text, const JsonLimits& limits);
Result<nlohmann::json> parse_json_strict(std::string_view text, std::size_t max_bytes, int max_depth = kMaxJsonDepth);

// read_text_file (files.h) + parse_json_strict; errors lead with the path.
Result<nlohmann::json> load_json_file(const std::string& path, const JsonLimits& limits);
Result<nlohmann::json> load_json_file(const std::string& path, std::size_t max_bytes, int max_depth = kMaxJsonDepth);

}  // namespace hzp
