// JSON mutations (see mutate.h). Every choice comes from the Rng, so a case seed names one document.
#include "tests/fuzz/mutate.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace hzp::fuzz {

using nlohmann::json;

// Raw texts that replace placeholder strings after serialisation. A placeholder is the string
// "\x01R<index>\x01", which nlohmann::json always writes as "\u0001R<index>\u0001"; as a key or a value it
// stands for raw[index] verbatim (quotes included when the raw text is a string).
struct JsonMutator::Raw {
  std::vector<std::string> texts;

  std::string add(std::string text) {
    texts.push_back(std::move(text));
    return "\x01R" + std::to_string(texts.size() - 1) + "\x01";
  }

  std::string apply(const std::string& dumped) const {
    static const std::string kOpen = "\"\\u0001R";
    static const std::string kClose = "\\u0001\"";
    std::string out;
    std::size_t pos = 0;
    for (;;) {
      const std::size_t at = dumped.find(kOpen, pos);
      if (at == std::string::npos) break;
      std::size_t digits = at + kOpen.size();
      std::size_t end = digits;
      while (end < dumped.size() && std::isdigit(static_cast<unsigned char>(dumped[end]))) ++end;
      if (end == digits || dumped.compare(end, kClose.size(), kClose) != 0) {
        out.append(dumped, pos, digits - pos);
        pos = digits;
        continue;
      }
      const std::size_t index = std::stoul(dumped.substr(digits, end - digits));
      out.append(dumped, pos, at - pos);
      out += index < texts.size() ? texts[index] : "null";
      pos = end + kClose.size();
    }
    out.append(dumped, pos, std::string::npos);
    return out;
  }
};

namespace {

// Where a node sits: its parent (nullptr for the root), its key or index there, and the parent's own key.
struct Slot {
  json* node = nullptr;
  json* parent = nullptr;
  std::string key;
  std::size_t index = 0;
  std::string parent_key;
};

void collect(json& node, json* parent, const std::string& key, std::size_t index, std::vector<Slot>& out,
             const std::string& parent_key = {}) {
  out.push_back({&node, parent, key, index, parent_key});
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) collect(it.value(), &node, it.key(), 0, out, key);
  } else if (node.is_array()) {
    for (std::size_t i = 0; i < node.size(); ++i) collect(node[i], &node, {}, i, out, key);
  }
}

template <typename T>
void add_unique(std::vector<T>& items, T item) {
  if (std::find(items.begin(), items.end(), item) == items.end()) items.push_back(std::move(item));
}

void collect_semantic(const json& node, const std::string& key, std::map<std::string, std::vector<json>>& values,
                      std::map<std::string, std::vector<std::pair<std::string, json>>>& members) {
  if (!node.is_object()) return;
  for (auto it = node.begin(); it != node.end(); ++it) {
    add_unique(values[key + "/" + it.key()], it.value());
    add_unique(members[key], std::pair<std::string, json>(it.key(), it.value()));
    collect_semantic(it.value(), it.key(), values, members);
  }
}

void collect_vocabulary(const json& node, std::vector<std::string>& keys, std::vector<std::string>& strings) {
  if (node.is_object()) {
    for (auto it = node.begin(); it != node.end(); ++it) {
      keys.push_back(it.key());
      collect_vocabulary(it.value(), keys, strings);
    }
  } else if (node.is_array()) {
    for (const json& child : node) collect_vocabulary(child, keys, strings);
  } else if (node.is_string()) {
    strings.push_back(node.get<std::string>());
  }
}

void sort_unique(std::vector<std::string>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

// Sizes for the "big" mutations: mostly modest, sometimes what the issue names (MiB strings, 100 000 levels).
std::size_t big_size(Rng& rng) {
  static const std::vector<std::size_t> sizes = {100, 1000, 3000, 10000, 100000, 1 << 20, 4 << 20};
  const std::size_t i = rng.chance(85) ? rng.below(4) : rng.below(sizes.size());
  return sizes[i];
}

std::size_t nesting_depth(Rng& rng) {
  static const std::vector<std::size_t> depths = {2, 16, 100, 1000, 10000, 100000};
  return depths[rng.chance(80) ? rng.below(4) : rng.below(depths.size())];
}

// A JSON string literal (with quotes) of `inner`, which is raw text already escaped as wanted.
std::string quoted(const std::string& inner) {
  return "\"" + inner + "\"";
}

}  // namespace

const std::vector<std::string>& extreme_number_texts() {
  static const std::vector<std::string> texts = {
      "0", "-0", "-1", "1", "2", "3", "7", "0.0", "-0.0", "0.5", "1.5", "4.0", "1e2", "1E+2", "1e-2", "127", "128",
      "255", "256", "65535", "65536", "1048576", "1000000", "16777217", "2147483647", "2147483648", "-2147483648",
      "-2147483649", "4294967295", "4294967296", "4294967297", "9007199254740993", "9223372036854775807",
      "9223372036854775808", "-9223372036854775808", "-9223372036854775809", "18446744073709551615",
      "18446744073709551616", "100000000000000000000000000000", "1e18", "1e19", "1e308", "1.7976931348623157e308",
      "1e309", "-1e308", "-1e309", "5e-324", "2.5e-324", "1e-400", "123456789012345678901234567890e-10",
      // Not JSON numbers: a strict parser must refuse each with a message, not a crash.
      "NaN", "-NaN", "Infinity", "-Infinity", "inf", "1e", "1e+", "-", "+1", "0x10", "01", "1.", ".5", "1_000"};
  return texts;
}

std::string deep_nesting(Rng& rng, std::size_t depth) {
  std::string open, close;
  const int style = static_cast<int>(rng.below(3));
  for (std::size_t i = 0; i < depth; ++i) {
    const bool array = style == 0 || (style == 2 && i % 2 == 0);
    open += array ? "[" : "{\"a\":";
    close += array ? "]" : "}";
  }
  std::string text = open + "1";
  text.append(close.rbegin(), close.rend());
  return text;
}

// The deepest nesting of brackets outside strings: seeds deeper than kMaxSeedDepth are mutated as bytes only,
// since the tree walks here recurse.
std::size_t max_nesting(const std::string& text) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      deepest = std::max(deepest, ++depth);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

void JsonMutator::add_seed(const std::string& text) {
  constexpr std::size_t kMaxSeedDepth = 64, kMaxSeedBytes = 1 << 20;
  Seed seed;
  seed.text = text;
  if (text.size() <= kMaxSeedBytes && max_nesting(text) <= kMaxSeedDepth) {
    seed.doc = json::parse(text, nullptr, /*allow_exceptions=*/false);
    seed.parsed = !seed.doc.is_discarded();
  }
  if (seed.parsed) {
    collect_vocabulary(seed.doc, keys_, strings_);
    collect_semantic(seed.doc, "", values_by_key_, members_by_parent_);
  } else {
    seed.doc = json();
  }
  seeds_.push_back(std::move(seed));
  sort_unique(keys_);
  sort_unique(strings_);
}

std::string JsonMutator::generate(Rng& rng) const {
  if (seeds_.empty()) return "{}";
  const Seed& seed = seeds_[rng.below(seeds_.size())];
  if (!seed.parsed) {
    std::string text = seed.text;
    mutate_bytes(rng, text);
    return text;
  }
  if (rng.chance(50)) return mutate_document(rng, seed.doc);
  json copy = seed.doc;
  const int rounds = 1 + static_cast<int>(rng.below(4));
  for (int i = 0; i < rounds; ++i) mutate_semantic(rng, copy);
  return rng.chance(50) ? copy.dump() : copy.dump(2);
}

void JsonMutator::mutate_semantic(Rng& rng, json& doc) const {
  std::vector<Slot> slots;
  collect(doc, nullptr, {}, 0, slots);
  std::vector<std::size_t> numbers, strings, objects, members, pairs;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const json& n = *slots[i].node;
    if (n.is_number()) numbers.push_back(i);
    if (n.is_string() && slots[i].parent && slots[i].parent->is_object()) strings.push_back(i);
    if (n.is_object()) objects.push_back(i);
    if (slots[i].parent && slots[i].parent->is_object()) members.push_back(i);
    if (n.is_array() && n.size() == 2) pairs.push_back(i);
  }
  auto seen = [&](const Slot& slot) -> const std::vector<json>* {
    auto it = values_by_key_.find(slot.parent_key + "/" + slot.key);
    return it == values_by_key_.end() || it->second.empty() ? nullptr : &it->second;
  };
  const std::size_t op = rng.below(10);
  if (op < 4 && !numbers.empty()) {  // a number: another seen value, or doubled, halved, nudged
    const Slot& slot = slots[rng.pick(numbers)];
    json& node = *slot.node;
    const std::vector<json>* values = seen(slot);
    if (values && rng.chance(40)) {
      node = rng.pick(*values);
    } else if (node.is_number_integer()) {
      const long long v = node.get<long long>();
      const long long options[] = {v * 2, std::max(1LL, v / 2), v + 1, std::max(0LL, v - 1), 1LL << rng.below(7)};
      node = options[rng.below(5)];
    } else {
      const double v = node.get<double>();
      const double options[] = {v * 2, v / 2, std::min(1.0, v * 1.1), 0.5};
      node = options[rng.below(4)];
    }
  } else if (op < 7 && !strings.empty()) {  // a string: another value seen under the same key
    const Slot& slot = slots[rng.pick(strings)];
    if (const std::vector<json>* values = seen(slot)) *slot.node = rng.pick(*values);
  } else if (op == 7 && !pairs.empty()) {  // a group: another seen one, or powers of two
    const Slot& slot = slots[rng.pick(pairs)];
    const std::vector<json>* values = seen(slot);
    if (values && rng.chance(50))
      *slot.node = rng.pick(*values);
    else
      *slot.node = json::array({1 << rng.below(5), 1 << rng.below(4)});
  } else if (op == 8 && !objects.empty()) {  // an optional member seen in an object of the same name
    const Slot& slot = slots[rng.pick(objects)];
    auto it = members_by_parent_.find(slot.key);
    if (it != members_by_parent_.end() && !it->second.empty()) {
      const auto& [key, value] = rng.pick(it->second);
      (*slot.node)[key] = value;
    }
  } else if (!members.empty()) {  // drop a member (falls back to the preset's or the default)
    const Slot& slot = slots[rng.pick(members)];
    slot.parent->erase(slot.key);
  }
}

std::string JsonMutator::mutate_document(Rng& rng, const json& doc) const {
  json copy = doc;
  Raw raw;
  const int rounds = 1 + static_cast<int>(rng.below(rng.chance(70) ? 2 : 4));
  for (int i = 0; i < rounds; ++i) mutate_tree(rng, copy, raw);
  std::string text = raw.apply(rng.chance(50) ? copy.dump() : copy.dump(2));
  if (rng.chance(15)) mutate_bytes(rng, text);
  return text;
}

std::string JsonMutator::random_string_value(Rng& rng, Raw& raw) const {
  switch (rng.below(11)) {
    case 0:
      return strings_.empty() ? "x" : rng.pick(strings_);
    case 1:
      return "";
    case 2:
      return std::string(big_size(rng), 'A');  // a huge string: messages must not echo it whole
    case 3:
      return "bad\x01\x1b[31mred\nline\ttab\x7f";  // valid JSON (escaped) holding control characters
    case 4:
      return raw.add(
          quoted("raw\x01"
                 "control\x1f"));  // control characters unescaped: not JSON
    case 5:
      return raw.add(quoted("bad utf8 \xff\xfe \xc3 \xe2\x82"));  // invalid UTF-8
    case 6:
      return raw.add(quoted("\\ud800 lone surrogate"));
    case 7:
      return std::string("nul\0inside", 10);
    case 8: {
      // A bit flip in an ASCII byte keeps the string valid UTF-8 (json::dump() throws on anything else;
      // invalid UTF-8 goes through Raw, case 5). Flipping a byte of a multi-byte character once aborted the
      // harness itself.
      std::string s = strings_.empty() ? "auto" : rng.pick(strings_);
      if (!s.empty()) {
        const std::size_t at = rng.below(s.size());
        if (static_cast<unsigned char>(s[at]) < 0x80) s[at] ^= static_cast<char>(1 << rng.below(6));
      }
      return s;
    }
    case 9: {  // valid non-ASCII: escaped, or raw and long enough that cutting it for a message splits a character
      if (rng.chance(50)) return raw.add(quoted("\\u00e9\\u4e2d\\ud83d\\ude00"));
      std::string s;
      for (int i = 0; i < 40; ++i) s += "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80";  // é, 中, 😀
      return s;
    }
    default:
      return std::to_string(rng.range(0, 64));  // a number as a string
  }
}

json JsonMutator::random_value(Rng& rng, Raw& raw, int depth) const {
  switch (rng.below(depth > 2 ? 9 : 12)) {
    case 0:
      return nullptr;
    case 1:
      return rng.chance(50);
    case 2:
      return rng.range(-2, 16);
    case 3:
      return 0.5;
    case 4:
      return random_string_value(rng, raw);
    case 5:
      return json::array();
    case 6:
      return json::object();
    case 7:
      return raw.add(rng.pick(extreme_number_texts()));
    case 8:
      return json::array({rng.range(0, 8), rng.range(0, 8)});
    case 9:
      return json::array({random_value(rng, raw, depth + 1)});
    case 10:
      return json::object({{keys_.empty() ? std::string("a") : rng.pick(keys_), random_value(rng, raw, depth + 1)}});
    default: {
      // a subtree of some seed: right-shaped values in the wrong places
      const Seed& donor = seeds_[rng.below(seeds_.size())];
      if (!donor.parsed) return nullptr;
      json tmp = donor.doc;
      std::vector<Slot> slots;
      collect(tmp, nullptr, {}, 0, slots);
      return *slots[rng.below(slots.size())].node;
    }
  }
}

void JsonMutator::mutate_tree(Rng& rng, json& doc, Raw& raw) const {
  std::vector<Slot> slots;
  collect(doc, nullptr, {}, 0, slots);
  // Numbers and enum-like strings are where most checks live: prefer them.
  std::vector<std::size_t> numbers, strings;
  for (std::size_t i = 0; i < slots.size(); ++i) {
    if (slots[i].node->is_number()) numbers.push_back(i);
    if (slots[i].node->is_string()) strings.push_back(i);
  }
  const std::size_t roll = rng.below(10);
  const Slot slot = roll < 4 && !numbers.empty()   ? slots[rng.pick(numbers)]
                    : roll < 6 && !strings.empty() ? slots[rng.pick(strings)]
                                                   : slots[rng.below(slots.size())];
  json& node = *slot.node;

  switch (rng.below(16)) {
    case 0:  // delete
      if (!slot.parent)
        node = random_value(rng, raw, 0);
      else if (slot.parent->is_object())
        slot.parent->erase(slot.key);
      else
        slot.parent->erase(slot.index);
      return;
    case 1:  // duplicate a key (same or another value)
      if (slot.parent && slot.parent->is_object()) {
        const json value = rng.chance(50) ? node : random_value(rng, raw, 0);
        (*slot.parent)[raw.add(json(slot.key).dump())] = value;
      }
      return;
    case 2: {  // rename a key
      if (!slot.parent || !slot.parent->is_object()) return;
      json value = node;
      std::string key;
      switch (rng.below(7)) {
        case 0:
          key = keys_.empty() ? "x" : rng.pick(keys_);
          break;
        case 1:
          key = slot.key + "_";
          break;
        case 2:
          key = "";
          break;
        case 3:
          key = std::string(big_size(rng), 'k');
          break;
        case 4:
          key =
              "key\x01with\x1b"
              "control";
          break;
        case 5:
          key = raw.add(quoted("key\xff\xfe"));
          break;
        default:
          key = slot.key;
          for (char& c : key) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
          break;
      }
      slot.parent->erase(slot.key);
      (*slot.parent)[key] = std::move(value);
      return;
    }
    case 3:  // change the type
      node = random_value(rng, raw, 0);
      return;
    case 4:
    case 5:  // an extreme number
      node = raw.add(rng.pick(extreme_number_texts()));
      return;
    case 6:
    case 7:
    case 8: {  // an in-range number that changes the work: more GPUs, layers, micro-batches
      static const std::vector<long long> values = {
          1, 2, 3, 4, 5, 7, 8, 16, 31, 64, 100, 128, 1000, 1024, 4096, 65536, 131072, 1000000, 1048576, 100000000};
      if (node.is_number_integer() && rng.chance(40)) {
        const long long v = node.get<long long>();
        const long long options[] = {v + 1, v - 1, v * 2, v / 2, v * 1000, -v};
        node = options[rng.below(6)];
      } else {
        node = rng.pick(values);
      }
      return;
    }
    case 9:  // a string: huge, control characters, invalid UTF-8, another enum value
      node = random_string_value(rng, raw);
      return;
    case 10:  // deep nesting
      node = raw.add(deep_nesting(rng, nesting_depth(rng)));
      return;
    case 11: {  // a new member with a known key
      json* object = node.is_object() ? &node : (slot.parent && slot.parent->is_object() ? slot.parent : nullptr);
      if (object && !keys_.empty()) (*object)[rng.pick(keys_)] = random_value(rng, raw, 0);
      return;
    }
    case 12: {  // grow an array (MoE layer lists, sharding groups)
      json* array = node.is_array() ? &node : (slot.parent && slot.parent->is_array() ? slot.parent : nullptr);
      if (!array) return;
      const std::size_t n = rng.chance(90) ? rng.below(8) + 1 : big_size(rng);
      const json element = array->empty() ? json(1) : (*array)[rng.below(array->size())];
      for (std::size_t i = 0; i < n; ++i) array->push_back(rng.chance(50) ? element : json(static_cast<long long>(i)));
      return;
    }
    case 13:  // a subtree from another seed
      node = random_value(rng, raw, 99);
      return;
    case 14: {  // a sharding-like group of powers of two (valid more often than random numbers)
      const int a = 1 << rng.below(5), b = 1 << rng.below(4);
      node = json::array({a, b});
      return;
    }
    default: {  // an enum-like string from the vocabulary, where strings are expected
      if (node.is_string() && !strings_.empty())
        node = rng.pick(strings_);
      else
        node = raw.add(rng.pick(extreme_number_texts()));
      return;
    }
  }
}

void JsonMutator::mutate_bytes(Rng& rng, std::string& text) const {
  static const std::string kInteresting = "{}[]\":,-.0123456789eE \n\ttfn\\u\x01\x7f\xff\xc3" + std::string(1, '\0');
  const int rounds = 1 + static_cast<int>(rng.below(3));
  for (int r = 0; r < rounds; ++r) {
    if (text.empty()) {
      text.push_back(kInteresting[rng.below(kInteresting.size())]);
      continue;
    }
    const std::size_t at = rng.below(text.size());
    switch (rng.below(8)) {
      case 0:
        text[at] = static_cast<char>(text[at] ^ (1 << rng.below(8)));
        break;
      case 1:
        text[at] = kInteresting[rng.below(kInteresting.size())];
        break;
      case 2:
        text.insert(at, 1, kInteresting[rng.below(kInteresting.size())]);
        break;
      case 3:
        text.erase(at, 1 + rng.below(std::min<std::size_t>(64, text.size() - at)));
        break;
      case 4:
        text.resize(at);
        break;   // truncation
      case 5: {  // duplicate a chunk
        const std::size_t len = 1 + rng.below(std::min<std::size_t>(256, text.size() - at));
        text.insert(at, text.substr(at, len));
        break;
      }
      case 6: {  // splice: our head, another seed's tail
        const Seed& other = seeds_[rng.below(seeds_.size())];
        if (!other.text.empty()) text = text.substr(0, at) + other.text.substr(rng.below(other.text.size()));
        break;
      }
      default:
        text.insert(at, std::string(1 + rng.below(3), static_cast<char>(0x80 + rng.below(0x80))));
        break;
    }
  }
}

}  // namespace hzp::fuzz
