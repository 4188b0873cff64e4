// Strict JSON decoding (json_io.h).
#include "shared/base/json_io.h"

#include <set>
#include <vector>

#include "shared/base/files.h"
#include "shared/base/text.h"

namespace hzp {
namespace {

using nlohmann::json;

// The nesting depth outside strings, without parsing.
Status check_shape(std::string_view text, std::size_t max_bytes, int max_depth) {
  if (text.size() > max_bytes)
    return Status::InvalidInput("document of " + std::to_string(text.size()) + " bytes, more than the " +
                                std::to_string(max_bytes) + " accepted");
  int depth = 0;
  bool in_string = false, escaped = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > max_depth)
        return Status::InvalidInput("malformed JSON at byte " + std::to_string(i) + ": nested deeper than " +
                                    std::to_string(max_depth) + " levels");
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
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
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }
};

}  // namespace

Result<json> parse_json_strict(std::string_view text, std::size_t max_bytes, int max_depth) {
  if (text.find_first_not_of(" \t\r\n") == std::string_view::npos)
    return Status::InvalidInput("empty document, expected a JSON object");
  HZP_RETURN_IF_ERROR(check_shape(text, max_bytes, max_depth));
  json doc;
  try {
    doc = json::parse(text);  // no callback: nlohmann's callback parser rescans a container at every object end
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix; keep its line/column detail.
    if (auto end = what.find("] "); what.rfind("[json.exception", 0) == 0 && end != std::string::npos)
      what = what.substr(end + 2);
    return Status::InvalidInput("malformed JSON at byte " + std::to_string(e.byte) + ": " + printable(what, 200));
  } catch (const json::exception& e) {
    return Status::InvalidInput("malformed JSON: " + printable(e.what(), 200));
  }
  // A second, linear pass finds the first repeated key (nlohmann keeps the last value silently).
  DuplicateKeys keys;
  json::sax_parse(text, &keys);
  if (!keys.duplicate.empty())
    return Status::InvalidInput(keys.duplicate + ": duplicate key (only one value may be given)");
  return doc;
}

Result<json> load_json_file(const std::string& path, std::size_t max_bytes, int max_depth) {
  HZP_ASSIGN_OR_RETURN(std::string text, read_text_file(path, static_cast<std::int64_t>(max_bytes) + 1));
  Result<json> doc = parse_json_strict(text, max_bytes, max_depth);
  if (!doc.ok()) return Status::InvalidInput(printable(path, 200) + ": " + doc.status().message());
  return doc;
}

}  // namespace hzp
