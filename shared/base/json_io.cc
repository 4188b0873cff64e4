// Strict JSON decoding (json_io.h).
#include "shared/base/json_io.h"

#include <algorithm>
#include <cstdint>
#include <new>
#include <set>
#include <vector>

#include "shared/base/files.h"
#include "shared/base/memory_limits.h"
#include "shared/base/text.h"

namespace hzp {
namespace {

using nlohmann::json;

// What a pre-scan of the text learns without parsing it: nesting depth and what nlohmann's tree of it takes.
struct Shape {
  int max_depth = 0;
  std::int64_t tree_bytes = 16;  // the root value
  std::int64_t objects = 0;
  std::size_t deep_at = std::string_view::npos;
  std::size_t nul_at = std::string_view::npos;  // nlohmann reads a NUL byte as the end of the input
};

// The heap that nlohmann's tree of a document takes, counted as glibc allocates it (16 bytes of header,
// 32-byte minimum chunk), from its containers, members, elements and strings. A std::map node of a member
// is 80 bytes (96 allocated); an array element is 16 bytes, up to twice that while its vector grows; a
// string value is a heap std::string (48 allocated) with its text on the heap past 15 characters.
// Linear, one pass, no allocation: it runs before the parser so that a document of many tiny values
// ("[0,0,0,...]", "[{},{},...]") is refused before it takes gigabytes.
Shape scan_shape(std::string_view text, int max_depth) {
  constexpr std::int64_t kObject = 64, kMember = 96, kArray = 32, kElement = 32, kStringValue = 48;
  Shape shape;
  std::vector<char> open;  // '{' or '[' per open container
  open.reserve(64);
  bool in_string = false, escaped = false, in_token = false, string_is_key = false;
  std::size_t string_start = 0;
  bool expect_key = false;  // inside an object, after '{' or ','
  const auto value_slot = [&] {
    if (!open.empty()) shape.tree_bytes += open.back() == '{' ? kMember : kElement;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
        const std::size_t length = i - string_start;  // escapes counted as written: an upper bound
        if (length > 15) shape.tree_bytes += static_cast<std::int64_t>(length) + 17;
        if (!string_is_key) shape.tree_bytes += kStringValue;
      }
      continue;
    }
    const bool token_char =
        (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '-' || c == '+' || c == '.' || c == 'E';
    if (token_char) {
      if (!in_token) value_slot();
      in_token = true;
      continue;
    }
    in_token = false;
    switch (c) {
      case '"':
        in_string = true;
        string_start = i + 1;
        string_is_key = expect_key;
        if (!expect_key) value_slot();
        expect_key = false;
        break;
      case '{':
      case '[':
        value_slot();
        shape.tree_bytes += c == '{' ? kObject : kArray;
        shape.objects += c == '{';
        open.push_back(c);
        expect_key = c == '{';
        if (static_cast<int>(open.size()) > max_depth && shape.deep_at == std::string_view::npos) shape.deep_at = i;
        shape.max_depth = std::max(shape.max_depth, static_cast<int>(open.size()));
        break;
      case '}':
      case ']':
        if (!open.empty()) open.pop_back();
        expect_key = false;
        break;
      case ',':
        expect_key = !open.empty() && open.back() == '{';
        break;
      case '\0':
        if (shape.nul_at == std::string_view::npos) shape.nul_at = i;
        break;
      default:
        break;
    }
    if (shape.deep_at != std::string_view::npos) break;
  }
  return shape;
}

Status check_shape(std::string_view text, const JsonLimits& limits) {
  if (text.size() > limits.max_bytes)
    return Status::InvalidInput("document of " + std::to_string(text.size()) + " bytes, more than the " +
                                std::to_string(limits.max_bytes) + " accepted");
  const Shape shape = scan_shape(text, limits.max_depth);
  if (shape.nul_at != std::string_view::npos)
    return Status::InvalidInput("malformed JSON at byte " + std::to_string(shape.nul_at) +
                                ": a NUL byte (not text; the document ends there or is binary)");
  if (shape.deep_at != std::string_view::npos)
    return Status::InvalidInput("malformed JSON at byte " + std::to_string(shape.deep_at) + ": nested deeper than " +
                                std::to_string(limits.max_depth) + " levels");
  if (limits.max_objects > 0 && shape.objects > limits.max_objects)
    return Status::InvalidInput(std::to_string(shape.objects) + " JSON objects, more than the " +
                                std::to_string(limits.max_objects) + " accepted (refused before parsing)");
  const std::int64_t max_tree =
      limits.max_tree_bytes > 0 ? limits.max_tree_bytes : static_cast<std::int64_t>(limits.max_bytes) * 12;
  const std::string needs =
      "decoding this document would take about " + std::to_string((shape.tree_bytes + (1 << 20) - 1) >> 20) + " MiB";
  if (shape.tree_bytes > max_tree)
    return Status::InvalidInput(needs + ", more than the " + std::to_string(max_tree >> 20) +
                                " MiB accepted (refused before parsing: too many small JSON values for its size)");
  // And what this process can spare: half of what its limits leave (the text and what is built from the
  // tree need the rest), so that a limit (ulimit -v, a cgroup) refuses the document instead of bad_alloc.
  const double spare = 0.5 * std::min(memory_allowance(), address_space_limit() - address_space_mapped());
  if (static_cast<double>(shape.tree_bytes) > spare)
    return Status::InvalidInput(needs + ", more than this process can spare under its memory limits (" +
                                std::to_string(static_cast<long long>(std::max(0.0, spare)) >> 20) + " MiB)");
  return Status::Ok();
}

// A SAX pass that tracks the keys of every open object and stops at the first repeat, naming its path
// ("model.moe.experts", "events[].rank"). Linear in the document.
struct DuplicateKeys : nlohmann::json_sax<json> {
  struct Frame {
    bool object;
    std::string path;
    std::set<std::string> keys;
    std::string last_key;
  };
  std::vector<Frame> open;
  std::string duplicate;
  std::string error;  // the first syntax or range error: where, in which value, what

  static std::string join_key(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  bool start(bool object) {
    std::string path;
    if (!open.empty())
      path = open.back().object ? join_key(open.back().path, open.back().last_key) : open.back().path + "[]";
    open.push_back({object, std::move(path), {}, {}});
    return true;
  }
  bool end() {
    if (!open.empty()) open.pop_back();
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return start(true); }
  bool end_object() override { return end(); }
  bool start_array(std::size_t) override { return start(false); }
  bool end_array() override { return end(); }
  bool key(string_t& key) override {
    Frame& frame = open.back();
    frame.last_key = printable(key, 60);
    if (!frame.keys.insert(key).second) {
      duplicate = join_key(frame.path, frame.last_key);
      return false;  // stop: the first repeat is the one reported
    }
    return true;
  }
  bool parse_error(std::size_t position, const std::string&, const nlohmann::detail::exception& e) override {
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix; keep its line/column detail.
    if (auto end = what.find("] "); what.rfind("[json.exception", 0) == 0 && end != std::string::npos)
      what = what.substr(end + 2);
    std::string where;
    if (!open.empty())
      where = open.back().object ? join_key(open.back().path, open.back().last_key) : open.back().path + "[]";
    error = "malformed JSON at byte " + std::to_string(position) + (where.empty() ? "" : " (near " + where + ")") +
            ": " + printable(what, 200);
    return false;
  }
};

}  // namespace

std::int64_t json_tree_bytes(std::string_view text) {
  return scan_shape(text, 1 << 30).tree_bytes;
}

Result<json> parse_json_strict(std::string_view text, const JsonLimits& limits) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return Status::InvalidInput("empty document, expected a JSON object");
  HZP_RETURN_IF_ERROR(check_shape(text, limits));
  // A linear SAX pass first: syntax and range errors with the byte and the value they are near ("number
  // overflow parsing '1e400'" near model.layers), then the first repeated key (nlohmann keeps the last value
  // silently).
  DuplicateKeys keys;
  if (!json::sax_parse(text, &keys)) {
    if (!keys.duplicate.empty())
      return Status::InvalidInput(keys.duplicate + ": duplicate key (only one value may be given)");
    return Status::InvalidInput(keys.error.empty() ? "malformed JSON" : keys.error);
  }
  json doc;
  try {
    doc = json::parse(text);  // no callback: nlohmann's callback parser rescans a container at every object end
  } catch (const json::exception& e) {
    return Status::InvalidInput("malformed JSON: " + printable(e.what(), 200));
  } catch (const std::bad_alloc&) {
    return Status::InvalidInput("out of memory decoding a document of " + std::to_string(text.size()) + " bytes");
  }
  return doc;
}

Result<json> parse_json_strict(std::string_view text, std::size_t max_bytes, int max_depth) {
  return parse_json_strict(text, JsonLimits{max_bytes, max_depth});
}

Result<json> load_json_file(const std::string& path, const JsonLimits& limits) {
  HZP_ASSIGN_OR_RETURN(std::string text, read_text_file(path, static_cast<std::int64_t>(limits.max_bytes) + 1));
  Result<json> doc = parse_json_strict(text, limits);
  if (!doc.ok()) return Status::InvalidInput(printable(path, 200) + ": " + doc.status().message());
  return doc;
}

Result<json> load_json_file(const std::string& path, std::size_t max_bytes, int max_depth) {
  return load_json_file(path, JsonLimits{max_bytes, max_depth});
}

}  // namespace hzp
