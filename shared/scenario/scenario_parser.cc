// Scenario JSON -> typed Scenario (strict, errors name the JSON path and the value), and the resolved form
// back to JSON. The field reference, with units and defaults, is scenarios/README.md.
#include "shared/scenario/scenario_parser.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <iostream>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>
#include <vector>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"
#include "shared/scenario/calibration.h"
#include "shared/scenario/hf_config.h"
#include "shared/scenario/mesh.h"
#include "shared/scenario/overrides.h"
#include "shared/scenario/pipeline_split.h"
#include "shared/scenario/presets.h"

namespace hzp {
namespace {

using nlohmann::json;

// Units: the JSON key's suffix names the unit; the structs hold SI: SI = JSON value x multiply / divide.
// Microseconds divide by 1e6 rather than multiply by the inexact 1e-6, so "latency_us": 30 gives exactly 30e-6.
struct Unit {
  double multiply;
  double divide;
};
constexpr Unit kOne{1, 1};
constexpr Unit kTflops{1e12, 1};
constexpr Unit kGiB{1024.0 * 1024.0 * 1024.0, 1};
constexpr Unit kMiB{1024.0 * 1024.0, 1};
constexpr Unit kGBps{1e9, 1};
constexpr Unit kGbps{1e9, 8};  // gigaBITS per second -> bytes per second
constexpr Unit kUs{1, 1e6};

double from_unit(double value, Unit u) {
  return value * u.multiply / u.divide;
}

constexpr std::int64_t kIntMax = std::numeric_limits<int>::max();

// The accepted range of every integer field (scenarios/README.md, "Ranges"): wide enough for any model and
// cluster built or announced, narrow enough that no product downstream overflows (parameter counts stay
// below 2^62, tokens of a micro-batch below 2^26) and that the work a scenario asks for stays bounded.
namespace range {
constexpr std::int64_t kLayers = 4096;
constexpr std::int64_t kHidden = 1 << 17;
constexpr std::int64_t kHeads = 1 << 14;
constexpr std::int64_t kFfn = 1 << 19;
constexpr std::int64_t kVocab = 1 << 22;
constexpr std::int64_t kPositions = 1 << 24;
constexpr std::int64_t kExperts = 4096;
constexpr std::int64_t kHeadDim = 4096;  // per-head widths of model.mla
constexpr std::int64_t kTopK = 256;
constexpr std::int64_t kNodes = 1 << 17;
constexpr std::int64_t kGpusPerNode = 1024;
constexpr std::int64_t kFullMeshGpus = 64;  // a full mesh of R GPUs has R(R-1)/2 links
constexpr std::int64_t kWorld = 1 << 18;    // GPUs in all: above the largest clusters built (~200 k)
constexpr std::int64_t kNics = 64;
constexpr std::int64_t kLeafSize = 1 << 16;
constexpr std::int64_t kEcmpPorts = 1 << 20;  // SimGrid hosts: 65,536 of them took 86 MB more (hzp collective)
constexpr std::int64_t kQpsPerConnection = 64;
constexpr std::int64_t kSeqLen = 1 << 22;
constexpr std::int64_t kMicroBatch = 1 << 16;
constexpr std::int64_t kMicroBatchTokens = 1 << 26;  // micro_batch x seq_len
constexpr std::int64_t kGlobalSequences = 1ll << 40;
constexpr std::int64_t kMicroBatchesPerStep = 1 << 16;
constexpr std::int64_t kUnitPasses = 1 << 16;  // micro-batches per step x (layers per stage + 2)
// ... summed over pipeline stages, micro-batches x (layers + 2 x pipeline): the whole schedule (Megatron's
// 1 T model, 512 x (128 + 128), is 2^17).
constexpr std::int64_t kScheduleUnitPasses = 1 << 17;
constexpr std::int64_t kPrefetch = 64;
constexpr std::int64_t kSteps = 1'000'000'000;
constexpr std::int64_t kEvalBatches = 100'000;
constexpr std::int64_t kSeed = std::numeric_limits<std::int64_t>::max();
}  // namespace range

std::string show(const json& v) {
  return printable(v.dump(-1, ' ', false, json::error_handler_t::replace), 80);
}

std::string join_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? std::string(key) : parent + "." + std::string(key);
}

Status invalid(const std::string& path, const std::string& what) {
  return Status::InvalidInput(path + ": " + what);
}
Status invalid(const std::string& path, const std::string& what, const json& got) {
  return invalid(path, what + ", got " + show(got));
}

// A JSON integer in [min, max]; `path` names it in errors.
Result<std::int64_t> as_int(const json& v, const std::string& path, std::int64_t min, std::int64_t max) {
  if (!v.is_number_integer()) return invalid(path, "must be an integer", v);
  const std::string range = "must be an integer in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  if (v.is_number_unsigned() && v.get<std::uint64_t>() > static_cast<std::uint64_t>(max))
    return invalid(path, range, v);
  const std::int64_t x = v.get<std::int64_t>();
  if (x < min || x > max) return invalid(path, range, v);
  return x;
}

Result<ShardGroup> parse_group(const json& v, const std::string& path) {
  if (!v.is_array() || v.size() != 2) return invalid(path, "must be an array of two integers [s0, s1]", v);
  HZP_ASSIGN_OR_RETURN(std::int64_t s0, as_int(v[0], path + "[0]", 1, range::kGpusPerNode));
  HZP_ASSIGN_OR_RETURN(std::int64_t s1, as_int(v[1], path + "[1]", 1, range::kNodes));
  return ShardGroup{static_cast<int>(s0), static_cast<int>(s1)};
}

// An accepted interval for a number, in the unit of its JSON key. `open_min`: the minimum itself is refused.
struct Interval {
  double min;
  double max;
  bool open_min = false;
  bool open_max = false;
};
std::string describe(const Interval& r) {
  auto num = [](double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.10g", x);
    return std::string(buf);
  };
  return (r.open_min ? "(" : "[") + num(r.min) + ", " + num(r.max) + (r.open_max ? ")" : "]");
}
constexpr Interval kFraction{0.01, 1};  // efficiencies: below 1 % a link or a GPU is broken, not slow

// One JSON object being read. Opening it rejects unknown keys (listing the known ones); each read_* leaves
// its output untouched when the key is absent, so a preset's value survives unless overridden.
class ObjectReader {
 public:
  static Result<ObjectReader> open(const json& value, const std::string& path, std::vector<std::string> keys) {
    const std::string shown = path.empty() ? "scenario" : path;
    if (!value.is_object()) return invalid(shown, "must be an object", value);
    for (const auto& item : value.items()) {
      if (std::find(keys.begin(), keys.end(), item.key()) == keys.end())
        return invalid(join_path(path, printable(item.key(), 60)),
                       "unknown key; known keys of " + shown + ": " + join(keys));
    }
    return ObjectReader(value, path);
  }

  std::string path_of(std::string_view key) const { return join_path(path_, key); }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  const json& at(std::string_view key) const { return *find(key); }

  Result<ObjectReader> child(std::string_view key, std::vector<std::string> keys) const {
    return open(at(key), path_of(key), std::move(keys));
  }

  Status require(std::string_view key, std::string_view context = "") const {
    if (has(key)) return Status::Ok();
    std::string what = "missing required field";
    if (!context.empty()) what += " (" + std::string(context) + ")";
    return invalid(path_of(key), what);
  }

  // Reads an integer in [min, max] (both inclusive).
  template <typename Int>
  Status read_int(std::string_view key, Int& out, std::int64_t min, std::int64_t max) const {
    static_assert(sizeof(Int) >= sizeof(int));
    const json* v = find(key);
    if (v == nullptr) return Status::Ok();
    if (sizeof(Int) < sizeof(std::int64_t)) max = std::min(max, kIntMax);
    HZP_ASSIGN_OR_RETURN(std::int64_t x, as_int(*v, path_of(key), min, max));
    out = static_cast<Int>(x);
    return Status::Ok();
  }

  // Reads a number in the key's unit, checks it lies in `range` (same unit) and stores it in SI.
  Status read_number(std::string_view key, double& out, Unit unit, Interval range) const {
    const json* v = find(key);
    if (v == nullptr) return Status::Ok();
    const std::string p = path_of(key);
    if (!v->is_number()) return invalid(p, "must be a number", *v);
    const double x = v->get<double>();
    const bool low = range.open_min ? !(x > range.min) : !(x >= range.min);
    const bool high = range.open_max ? !(x < range.max) : !(x <= range.max);
    if (low || high) return invalid(p, "must be in " + describe(range), *v);
    out = from_unit(x, unit);
    return Status::Ok();
  }

  // A name shown in reports and used (sanitised) in file names: printable, at most 128 bytes.
  Status read_label(std::string_view key, std::string& out) const {
    if (!has(key)) return Status::Ok();
    std::string text;
    HZP_RETURN_IF_ERROR(read_string(key, text));
    if (text.empty() || text.size() > 128 || printable(text, 128) != text)
      return invalid(path_of(key), "must be 1 to 128 bytes of printable text", at(key));
    out = std::move(text);
    return Status::Ok();
  }

  Status read_bool(std::string_view key, bool& out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_boolean()) return invalid(path_of(key), "must be true or false", *v);
    out = v->get<bool>();
    return Status::Ok();
  }

  Status read_string(std::string_view key, std::string& out) const {
    const json* v = find(key);
    if (v == nullptr) return Status::Ok();
    if (!v->is_string()) return invalid(path_of(key), "must be a string", *v);
    out = v->get<std::string>();
    return Status::Ok();
  }

  // Enum values are spelled as to_string() spells them (scenario.cc).
  template <typename E>
  Status read_enum(std::string_view key, E& out, std::initializer_list<E> values) const {
    const json* v = find(key);
    if (v == nullptr) return Status::Ok();
    std::vector<std::string> names;
    for (E e : values) {
      if (v->is_string() && v->get<std::string>() == to_string(e)) {
        out = e;
        return Status::Ok();
      }
      names.emplace_back(std::string("\"") + to_string(e) + "\"");
    }
    return invalid(path_of(key), "must be one of " + join(names), *v);
  }

 private:
  ObjectReader(const json& obj, std::string path) : obj_(&obj), path_(std::move(path)) {}

  const json* find(std::string_view key) const {
    auto it = obj_->find(std::string(key));
    return it == obj_->end() ? nullptr : &*it;
  }

  const json* obj_;
  std::string path_;
};

// Looks up r["preset"] with `lookup`; an unknown name lists the known ones.
template <typename T, typename Lookup>
Result<T> read_preset(const ObjectReader& r, Lookup lookup, const std::vector<std::string>& names, const char* what) {
  std::string name;
  HZP_RETURN_IF_ERROR(r.read_string("preset", name));
  Result<T> found = lookup(name);
  if (!found.ok())
    return invalid(r.path_of("preset"), std::string("unknown ") + what + " (known: " + join(names) + ")",
                   r.at("preset"));
  return found;
}

std::vector<int> all_layers(int layers) {
  std::vector<int> out(layers);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

// model.moe.layers: "all" | [i, j, ...] | {"every": n, "offset": k}.
Result<std::vector<int>> parse_moe_layers(const json& v, const std::string& path, int layers) {
  std::vector<int> out;
  if (v.is_string()) {
    if (v.get<std::string>() != "all")
      return invalid(path, "must be \"all\", an array of layer indices or {\"every\": n, \"offset\": k}", v);
    out = all_layers(layers);
  } else if (v.is_array()) {
    std::set<int> seen;
    for (std::size_t i = 0; i < v.size(); ++i) {
      const std::string p = path + "[" + std::to_string(i) + "]";
      HZP_ASSIGN_OR_RETURN(std::int64_t index, as_int(v[i], p, 0, range::kLayers));
      if (index >= layers) return invalid(p, "layer index out of range [0, " + std::to_string(layers) + ")", v[i]);
      if (!seen.insert(static_cast<int>(index)).second) return invalid(p, "duplicate layer index", v[i]);
    }
    out.assign(seen.begin(), seen.end());
  } else if (v.is_object()) {
    HZP_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::open(v, path, {"every", "offset"}));
    HZP_RETURN_IF_ERROR(r.require("every"));
    int every = 1;
    int offset = 0;
    HZP_RETURN_IF_ERROR(r.read_int("every", every, 1, range::kLayers));
    HZP_RETURN_IF_ERROR(r.read_int("offset", offset, 0, range::kLayers));
    if (offset >= every)
      return invalid(r.path_of("offset"), "must be less than every (" + std::to_string(every) + ")", r.at("offset"));
    for (int i = offset; i < layers; i += every) out.push_back(i);
  } else {
    return invalid(path, "must be \"all\", an array of layer indices or {\"every\": n, \"offset\": k}", v);
  }
  if (out.empty()) return invalid(path, "selects no layer of " + std::to_string(layers), v);
  return out;
}

// What a model section starts from: its preset, its Hugging Face config (hf_config.h), or nothing (every
// size must then be given).
Result<ModelSpec> model_starting_point(const ObjectReader& r) {
  ModelSpec m;
  if (r.has("preset") && r.has("from_hf_config"))
    return invalid(r.path_of("from_hf_config"), "give either preset or from_hf_config, not both",
                   r.at("from_hf_config"));
  if (r.has("from_hf_config")) {
    std::string path;
    HZP_RETURN_IF_ERROR(r.read_string("from_hf_config", path));
    HZP_ASSIGN_OR_RETURN(m, load_hf_config(path));
    m.hf_config_path = path;
    const std::tuple<const char*, std::int64_t, std::int64_t> checks[] = {
        {"layers", m.layers, range::kLayers},
        {"hidden", m.hidden, range::kHidden},
        {"heads", m.heads, range::kHeads},
        {"ffn_hidden", m.ffn_hidden, range::kFfn},
        {"vocab", m.vocab, range::kVocab},
        {"max_positions", m.max_positions, range::kPositions},
        {"moe.experts", m.moe.experts, range::kExperts},
        {"moe.top_k", m.moe.top_k, range::kTopK},
        {"moe.expert_ffn_hidden", m.moe.expert_ffn_hidden, range::kFfn},
        {"moe.shared_ffn_hidden", m.moe.shared_ffn_hidden, range::kFfn},
        {"mla.q_lora_rank", m.mla.q_lora_rank, range::kHidden},
        {"mla.kv_lora_rank", m.mla.kv_lora_rank, range::kHidden},
        {"mla.qk_nope_head_dim", m.mla.qk_nope_head_dim, range::kHeadDim},
        {"mla.qk_rope_head_dim", m.mla.qk_rope_head_dim, range::kHeadDim},
        {"mla.v_head_dim", m.mla.v_head_dim, range::kHeadDim}};
    for (const auto& [field, value, most] : checks)
      if (value > most)
        return invalid(r.path_of("from_hf_config"),
                       "the config gives the model's " + std::string(field) + " " + std::to_string(value) +
                           ", past hzp's range (" + std::to_string(most) + ")",
                       r.at("from_hf_config"));
    return m;
  }
  if (r.has("preset")) return read_preset<ModelSpec>(r, model_preset, model_preset_names(), "model preset");
  for (const char* key : {"layers", "hidden", "heads", "ffn_hidden", "vocab"})
    HZP_RETURN_IF_ERROR(r.require(key, "the model has no preset"));
  m.name = "custom";
  m.max_positions = 2048;
  return m;
}

// The first MoE layer when the MoE layers are every layer from it to the last; nullopt otherwise.
std::optional<int> moe_tail_start(const ModelSpec& m) {
  if (!m.has_moe || m.moe.layers.empty() || m.moe.layers.back() != m.layers - 1) return std::nullopt;
  const int first = m.moe.layers.front();
  if (static_cast<int>(m.moe.layers.size()) != m.layers - first) return std::nullopt;
  return first;
}

// model.mla: multi-head latent attention (scenario.h MlaSpec); null turns a preset's off.
Status parse_mla(const ObjectReader& r, ModelSpec& m) {
  if (r.has("mla") && r.at("mla").is_null()) {
    m.has_mla = false;
    m.mla = MlaSpec{};
  } else if (r.has("mla")) {
    HZP_ASSIGN_OR_RETURN(ObjectReader ar, r.child("mla", {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                          "qk_rope_head_dim", "v_head_dim"}));
    if (!m.has_mla)
      for (const char* key : {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"})
        HZP_RETURN_IF_ERROR(ar.require(key, "the model has no preset MLA to take it from"));
    HZP_RETURN_IF_ERROR(ar.read_int("q_lora_rank", m.mla.q_lora_rank, 0, range::kHidden));
    HZP_RETURN_IF_ERROR(ar.read_int("kv_lora_rank", m.mla.kv_lora_rank, 1, range::kHidden));
    HZP_RETURN_IF_ERROR(ar.read_int("qk_nope_head_dim", m.mla.qk_nope_head_dim, 1, range::kHeadDim));
    HZP_RETURN_IF_ERROR(ar.read_int("qk_rope_head_dim", m.mla.qk_rope_head_dim, 1, range::kHeadDim));
    HZP_RETURN_IF_ERROR(ar.read_int("v_head_dim", m.mla.v_head_dim, 1, range::kHeadDim));
    m.has_mla = true;
  }
  if (!m.has_mla) return Status::Ok();
  // Every query head has its own key and value head once the latent is projected up.
  if (m.kv_heads != m.heads)
    return invalid(r.has("kv_heads") ? r.path_of("kv_heads") : "model.kv_heads",
                   "must equal heads (" + std::to_string(m.heads) + ") with model.mla", m.kv_heads);
  if (m.position != PositionEmbedding::kRope)
    return invalid(r.has("position") ? r.path_of("position") : "model.position",
                   "must be rope with model.mla (its keys and queries carry a rotary part)", to_string(m.position));
  return Status::Ok();
}

Result<ModelSpec> parse_model(const json& value) {
  HZP_ASSIGN_OR_RETURN(
      ObjectReader r,
      ObjectReader::open(value, "model",
                         {"name", "preset", "from_hf_config", "family", "layers", "hidden", "heads", "kv_heads",
                          "ffn_hidden", "mlp", "vocab", "tied_embeddings", "position", "max_positions", "moe", "mla"}));
  const bool from_preset = r.has("preset") || r.has("from_hf_config");
  HZP_ASSIGN_OR_RETURN(ModelSpec m, model_starting_point(r));
  // A multi-head preset stays multi-head when `heads` is overridden, and a preset whose MoE covers every
  // layer from some layer on (all of them: Mixtral; all but the first 3: DeepSeek-V3) keeps doing so when
  // `layers` is overridden.
  const bool multi_head = m.kv_heads == m.heads;
  std::optional<int> moe_from = moe_tail_start(m);

  HZP_RETURN_IF_ERROR(r.read_label("name", m.name));
  HZP_RETURN_IF_ERROR(r.read_enum("family", m.family, {ModelFamily::kLlama, ModelFamily::kGpt}));
  if (!from_preset) {
    m.tied_embeddings = m.family == ModelFamily::kGpt;
    m.position = m.family == ModelFamily::kGpt ? PositionEmbedding::kLearned : PositionEmbedding::kRope;
    m.mlp = m.family == ModelFamily::kGpt ? MlpKind::kGelu : MlpKind::kSwiGlu;
  }
  HZP_RETURN_IF_ERROR(r.read_int("layers", m.layers, 1, range::kLayers));
  HZP_RETURN_IF_ERROR(r.read_int("hidden", m.hidden, 1, range::kHidden));
  HZP_RETURN_IF_ERROR(r.read_int("heads", m.heads, 1, range::kHeads));
  HZP_RETURN_IF_ERROR(r.read_int("kv_heads", m.kv_heads, 1, range::kHeads));
  HZP_RETURN_IF_ERROR(r.read_int("ffn_hidden", m.ffn_hidden, 1, range::kFfn));
  HZP_RETURN_IF_ERROR(r.read_enum("mlp", m.mlp, {MlpKind::kSwiGlu, MlpKind::kGelu, MlpKind::kSquaredRelu}));
  HZP_RETURN_IF_ERROR(r.read_int("vocab", m.vocab, 1, range::kVocab));
  HZP_RETURN_IF_ERROR(r.read_bool("tied_embeddings", m.tied_embeddings));
  HZP_RETURN_IF_ERROR(r.read_enum("position", m.position,
                                  {PositionEmbedding::kRope, PositionEmbedding::kLearned, PositionEmbedding::kAlibi}));
  HZP_RETURN_IF_ERROR(r.read_int("max_positions", m.max_positions, 1, range::kPositions));
  if (!r.has("kv_heads") && multi_head) m.kv_heads = m.heads;

  if (m.hidden % m.heads != 0)
    return invalid(r.path_of("heads"), "must divide hidden (" + std::to_string(m.hidden) + ")", m.heads);
  if (m.heads % m.kv_heads != 0)
    return invalid(r.path_of("kv_heads"), "must divide heads (" + std::to_string(m.heads) + ")", m.kv_heads);

  if (r.has("moe") && r.at("moe").is_null()) {
    m.has_moe = false;
    m.moe = MoeSpec{};
  } else if (r.has("moe")) {
    HZP_ASSIGN_OR_RETURN(ObjectReader mr,
                         r.child("moe", {"experts", "top_k", "expert_ffn_hidden", "layers", "shared_ffn_hidden"}));
    if (!m.has_moe) {
      for (const char* key : {"experts", "top_k", "expert_ffn_hidden"})
        HZP_RETURN_IF_ERROR(mr.require(key, "the model has no preset MoE to take it from"));
      moe_from = 0;
    }
    HZP_RETURN_IF_ERROR(mr.read_int("experts", m.moe.experts, 1, range::kExperts));
    HZP_RETURN_IF_ERROR(mr.read_int("top_k", m.moe.top_k, 1, range::kTopK));
    HZP_RETURN_IF_ERROR(mr.read_int("expert_ffn_hidden", m.moe.expert_ffn_hidden, 1, range::kFfn));
    HZP_RETURN_IF_ERROR(mr.read_int("shared_ffn_hidden", m.moe.shared_ffn_hidden, 0, range::kFfn));
    if (mr.has("layers")) {
      HZP_ASSIGN_OR_RETURN(m.moe.layers, parse_moe_layers(mr.at("layers"), mr.path_of("layers"), m.layers));
      moe_from.reset();
    }
    m.has_moe = true;
    if (m.moe.top_k > m.moe.experts)
      return invalid(mr.path_of("top_k"), "must be at most experts (" + std::to_string(m.moe.experts) + ")",
                     m.moe.top_k);
  }
  if (m.has_moe && moe_from) {
    m.moe.layers.clear();
    for (int layer = *moe_from; layer < m.layers; ++layer) m.moe.layers.push_back(layer);
    if (m.moe.layers.empty())
      return invalid(r.path_of("layers"),
                     "leaves no MoE layer (the model's MoE starts at layer " + std::to_string(*moe_from) +
                         "; set model.moe to null for a dense model)",
                     m.layers);
  }
  if (m.has_moe && !m.moe.layers.empty() && m.moe.layers.back() >= m.layers)
    return invalid("model.moe.layers", "layer index out of range [0, " + std::to_string(m.layers) + ")",
                   m.moe.layers.back());
  HZP_RETURN_IF_ERROR(parse_mla(r, m));
  return m;
}

// An unknown GPU type has no calibration entry, so everything that entry would supply must be explicit.
Status check_uncalibrated_gpu(const ObjectReader& cluster, const ObjectReader& gpu, bool from_preset) {
  auto given = [&](const char* object, const char* key) {
    if (!cluster.has(object)) return false;
    const json& o = cluster.at(object);
    return o.is_object() && o.contains(key);
  };
  std::vector<std::string> missing;
  for (const char* key : {"peak_tflops", "memory_GiB", "hbm_GBps"})
    if (!given("gpu", key)) missing.push_back(gpu.path_of(key));
  for (const char* key : {"gemm", "memory_bound", "intra_node", "inter_node"})
    if (!given("efficiency", key)) missing.push_back("cluster.efficiency." + std::string(key));
  if (!from_preset) {
    if (!given("intra_node", "latency_us")) missing.emplace_back("cluster.intra_node.latency_us");
    if (!given("nic", "latency_us")) missing.emplace_back("cluster.nic.latency_us");
  }
  if (missing.empty()) return Status::Ok();
  std::vector<std::string> known;
  for (const auto& e : calibration_table()) known.push_back(e.gpu_type);
  return invalid(
      gpu.path_of("type"),
      "no calibration entry for this GPU type (known: " + join(known) + "), so " + join(missing) + " must be given",
      gpu.at("type"));
}

// cluster.gpu.flash_attention_vs_gemm: [{"head_dim", "seq", "fwd", "bwd"}, ...], each (head_dim, seq) once;
// [] for none (GpuSpec::flash_rates).
Result<std::vector<FlashRate>> parse_flash_rates(const json& v, const std::string& path) {
  if (!v.is_array()) return invalid(path, "must be an array of {\"head_dim\", \"seq\", \"fwd\", \"bwd\"}", v);
  if (v.size() > 256) return invalid(path, "has more than 256 points", v);
  std::vector<FlashRate> out;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const std::string p = path + "[" + std::to_string(i) + "]";
    HZP_ASSIGN_OR_RETURN(ObjectReader r, ObjectReader::open(v[i], p, {"head_dim", "seq", "fwd", "bwd"}));
    for (const char* key : {"head_dim", "seq", "fwd", "bwd"}) HZP_RETURN_IF_ERROR(r.require(key));
    FlashRate f;
    HZP_RETURN_IF_ERROR(r.read_int("head_dim", f.head_dim, 1, 4096));
    HZP_RETURN_IF_ERROR(r.read_number("seq", f.seq, kOne, {1, 1e9}));
    HZP_RETURN_IF_ERROR(r.read_number("fwd", f.fwd, kOne, {0.01, 10}));
    HZP_RETURN_IF_ERROR(r.read_number("bwd", f.bwd, kOne, {0.01, 10}));
    for (const FlashRate& o : out)
      if (o.head_dim == f.head_dim && o.seq == f.seq)
        return invalid(p, "repeats the head_dim and seq of an earlier point", v[i]);
    out.push_back(f);
  }
  return out;
}

// cluster.gpu: the type first (a known type brings its calibrated numbers, which explicit fields override).
Status parse_gpu(const ObjectReader& r, bool from_preset, ClusterSpec& c) {
  HZP_ASSIGN_OR_RETURN(ObjectReader g,
                       r.child("gpu", {"type", "peak_tflops", "memory_GiB", "hbm_GBps", "fp8_peak_tflops", "arch",
                                       "gemm_overhead_us", "flash_attention_vs_gemm", "fp8_gemm_vs_bf16"}));
  if (!from_preset) HZP_RETURN_IF_ERROR(g.require("type", "the cluster has no preset"));
  if (g.has("type")) {
    std::string type;
    HZP_RETURN_IF_ERROR(g.read_string("type", type));
    Result<CalibrationEntry> cal = calibration_for(type);
    if (cal.ok()) {
      c.gpu = cal->gpu;
      c.efficiency = cal->efficiency;
      if (!from_preset) {
        c.intra.latency_s = cal->intra_latency_s;
        c.nic.latency_s = cal->nic_latency_s;
      }
    } else {
      HZP_RETURN_IF_ERROR(check_uncalibrated_gpu(r, g, from_preset));
      c.gpu = GpuSpec{type, 0, 0, 0};
    }
  }
  HZP_RETURN_IF_ERROR(g.read_number("peak_tflops", c.gpu.peak_flops, kTflops, {0.001, 1e6}));
  HZP_RETURN_IF_ERROR(g.read_number("memory_GiB", c.gpu.memory_bytes, kGiB, {0.001, 1e6}));
  HZP_RETURN_IF_ERROR(g.read_number("hbm_GBps", c.gpu.hbm_bytes_per_s, kGBps, {0.1, 1e6}));
  HZP_RETURN_IF_ERROR(g.read_number("fp8_peak_tflops", c.gpu.fp8_peak_flops, kTflops, {0.001, 1e6}));
  HZP_RETURN_IF_ERROR(g.read_number("gemm_overhead_us", c.gpu.gemm_overhead_s, kUs, {0, 1000}));
  HZP_RETURN_IF_ERROR(g.read_number("fp8_gemm_vs_bf16", c.gpu.fp8_gemm_vs_bf16, kOne, {0.1, 2}));
  if (g.has("flash_attention_vs_gemm")) {
    HZP_ASSIGN_OR_RETURN(c.gpu.flash_rates,
                         parse_flash_rates(g.at("flash_attention_vs_gemm"), g.path_of("flash_attention_vs_gemm")));
  }
  return g.read_enum("arch", c.gpu.arch, {GpuArch::kVolta, GpuArch::kAmpere, GpuArch::kHopper, GpuArch::kBlackwell});
}

// cluster.intra_node and cluster.nic. `nic_per_node_required`: false when hzp train runs the scenario on its
// own ranks and the scenario names no NIC count (one emulated NIC per rank then).
Status parse_links(const ObjectReader& r, bool from_preset, bool nic_per_node_required, ClusterSpec& c) {
  if (r.has("intra_node")) {
    HZP_ASSIGN_OR_RETURN(ObjectReader in, r.child("intra_node", {"topology", "bandwidth_GBps", "latency_us"}));
    if (!from_preset) {
      HZP_RETURN_IF_ERROR(in.require("topology", "the cluster has no preset"));
      HZP_RETURN_IF_ERROR(in.require("bandwidth_GBps", "the cluster has no preset"));
    }
    HZP_RETURN_IF_ERROR(
        in.read_enum("topology", c.intra.topology, {IntraNodeTopology::kSwitch, IntraNodeTopology::kFullMesh}));
    HZP_RETURN_IF_ERROR(in.read_number("bandwidth_GBps", c.intra.bytes_per_s, kGBps, {0.1, 1e5}));
    HZP_RETURN_IF_ERROR(in.read_number("latency_us", c.intra.latency_s, kUs, {0, 1e6}));
  }
  if (r.has("nic")) {
    HZP_ASSIGN_OR_RETURN(ObjectReader nic, r.child("nic", {"per_node", "bandwidth_Gbps", "latency_us", "mapping"}));
    if (!from_preset) {
      if (nic_per_node_required) HZP_RETURN_IF_ERROR(nic.require("per_node", "the cluster has no preset"));
      HZP_RETURN_IF_ERROR(nic.require("bandwidth_Gbps", "the cluster has no preset"));
    }
    HZP_RETURN_IF_ERROR(nic.read_int("per_node", c.nic.per_node, 1, range::kNics));
    HZP_RETURN_IF_ERROR(nic.read_number("bandwidth_Gbps", c.nic.bytes_per_s, kGbps, {0.1, 1e5}));
    HZP_RETURN_IF_ERROR(nic.read_number("latency_us", c.nic.latency_s, kUs, {0, 1e6}));
    HZP_RETURN_IF_ERROR(nic.read_enum("mapping", c.nic.mapping, {NicMapping::kRail, NicMapping::kShared}));
  }
  return Status::Ok();
}

// cluster.inter_node: the fat tree above the NICs.
Status parse_inter_node(const ObjectReader& r, InterNodeSpec& inter) {
  HZP_ASSIGN_OR_RETURN(ObjectReader o,
                       r.child("inter_node", {"topology", "leaf_size", "oversubscription", "switch_latency_us",
                                              "routing", "rail_optimized", "qps_per_connection", "placement", "seed"}));
  std::string topology = "fat_tree";
  HZP_RETURN_IF_ERROR(o.read_string("topology", topology));
  if (topology != "fat_tree")
    return invalid(o.path_of("topology"), "must be \"fat_tree\" (the only inter-node topology modelled)",
                   o.at("topology"));
  HZP_RETURN_IF_ERROR(o.read_int("leaf_size", inter.leaf_size, 1, range::kLeafSize));
  HZP_RETURN_IF_ERROR(o.read_number("oversubscription", inter.oversubscription, kOne, {1, 1000}));
  HZP_RETURN_IF_ERROR(o.read_number("switch_latency_us", inter.switch_latency_s, kUs, {0, 1e6}));
  HZP_RETURN_IF_ERROR(o.read_enum("routing", inter.routing, {Routing::kBalanced, Routing::kEcmp}));
  HZP_RETURN_IF_ERROR(o.read_bool("rail_optimized", inter.rail_optimized));
  HZP_RETURN_IF_ERROR(o.read_int("qps_per_connection", inter.qps_per_connection, 1, range::kQpsPerConnection));
  HZP_RETURN_IF_ERROR(o.read_enum("placement", inter.placement, {Placement::kContiguous, Placement::kScattered}));
  return o.read_int("seed", inter.seed, 0, kIntMax);
}

// cluster.efficiency, collective_algorithm, protocol, compute_spread, overlap_slowdown.
Status parse_cluster_tuning(const ObjectReader& r, ClusterSpec& c) {
  if (r.has("efficiency")) {
    HZP_ASSIGN_OR_RETURN(ObjectReader eff, r.child("efficiency", {"gemm", "memory_bound", "intra_node", "inter_node"}));
    HZP_RETURN_IF_ERROR(eff.read_number("gemm", c.efficiency.gemm, kOne, kFraction));
    HZP_RETURN_IF_ERROR(eff.read_number("memory_bound", c.efficiency.memory_bound, kOne, kFraction));
    HZP_RETURN_IF_ERROR(eff.read_number("intra_node", c.efficiency.intra_node, kOne, kFraction));
    HZP_RETURN_IF_ERROR(eff.read_number("inter_node", c.efficiency.inter_node, kOne, kFraction));
  }
  HZP_RETURN_IF_ERROR(r.read_enum(
      "collective_algorithm", c.collective_algorithm,
      {CollectiveAlgorithmChoice::kAuto, CollectiveAlgorithmChoice::kRing, CollectiveAlgorithmChoice::kHierarchical}));
  HZP_RETURN_IF_ERROR(
      r.read_enum("protocol", c.protocol,
                  {ProtocolChoice::kAuto, ProtocolChoice::kLL, ProtocolChoice::kLL128, ProtocolChoice::kSimple}));
  // The LL protocol's one-node bandwidth cap is NCCL's per architecture: no silent guess for an unknown GPU.
  if (c.gpu.arch == GpuArch::kUnknown && (c.protocol == ProtocolChoice::kLL || c.protocol == ProtocolChoice::kAuto))
    return invalid("cluster.gpu.arch",
                   "must be given (\"volta\", \"ampere\", \"hopper\" or \"blackwell\") for a GPU type without a "
                   "calibration entry when cluster.protocol is \"" +
                       std::string(to_string(c.protocol)) + "\": NCCL's LL bandwidth cap depends on it");
  HZP_RETURN_IF_ERROR(r.read_number("compute_spread", c.compute_spread, kOne, {0, 0.2}));
  c.overlap_slowdown = kOverlapSlowdown;
  return r.read_number("overlap_slowdown", c.overlap_slowdown, kOne, {0, 1});
}

// The rules that tie cluster fields together.
Status check_cluster(const ClusterSpec& c) {
  if (c.intra.topology == IntraNodeTopology::kFullMesh && c.gpus_per_node > range::kFullMeshGpus)
    return invalid("cluster.gpus_per_node",
                   "must be at most " + std::to_string(range::kFullMeshGpus) +
                       " with a \"full_mesh\" intra-node topology (one link per GPU pair)",
                   c.gpus_per_node);
  // Fields that only shape ECMP's hashing would be silently ignored under balanced routing.
  if (c.inter.routing != Routing::kEcmp) {
    if (c.inter.rail_optimized)
      return invalid("cluster.inter_node.rail_optimized",
                     "only applies with routing \"ecmp\" (balanced routing spreads every flow over all uplinks)", true);
    if (c.inter.qps_per_connection != 1)
      return invalid("cluster.inter_node.qps_per_connection", "only applies with routing \"ecmp\"",
                     c.inter.qps_per_connection);
  }
  // ECMP gives every NIC one endpoint per uplink it may hash onto (sim/platform.cc): bound their number.
  if (c.inter.routing == Routing::kEcmp && c.leaves() > 1) {
    const double ports = static_cast<double>(c.nodes) * c.nic.per_node * ecmp_uplinks_per_nic(c);
    if (ports > range::kEcmpPorts)
      return invalid("cluster.inter_node.routing",
                     "\"ecmp\" needs nodes x NICs x uplinks per NIC <= " + std::to_string(range::kEcmpPorts) +
                         " (here " + std::to_string(static_cast<long long>(ports)) +
                         "): use fewer nodes per leaf, a rail-optimized fabric, or balanced routing",
                     "ecmp");
  }
  // Rail mapping pairs local GPU g with NIC g * nics / gpus_per_node, which needs one count to divide the other.
  if (c.nic.mapping == NicMapping::kRail && c.gpus_per_node % c.nic.per_node != 0 &&
      c.nic.per_node % c.gpus_per_node != 0)
    return invalid(
        "cluster.nic.per_node",
        "with \"rail\" mapping must divide or be a multiple of gpus_per_node (" + std::to_string(c.gpus_per_node) + ")",
        c.nic.per_node);
  return Status::Ok();
}

Result<ClusterSpec> parse_cluster(const json& value, const ClusterOverride& run_on) {
  HZP_ASSIGN_OR_RETURN(
      ObjectReader r,
      ObjectReader::open(value, "cluster",
                         {"name", "preset", "nodes", "gpus_per_node", "gpu", "intra_node", "nic", "inter_node",
                          "efficiency", "collective_algorithm", "protocol", "compute_spread", "overlap_slowdown"}));
  ClusterSpec c;
  const bool from_preset = r.has("preset");
  const bool overridden = run_on.nodes > 0;
  if (from_preset) {
    HZP_ASSIGN_OR_RETURN(c, read_preset<ClusterSpec>(r, cluster_preset, cluster_preset_names(), "cluster preset"));
  } else {
    for (const char* key : {"gpu", "intra_node", "nic"})
      HZP_RETURN_IF_ERROR(r.require(key, "the cluster has no preset"));
    if (!overridden)
      for (const char* key : {"nodes", "gpus_per_node"})
        HZP_RETURN_IF_ERROR(r.require(key, "the cluster has no preset"));
    c.name = "custom";
    c.inter = default_inter_node();
  }
  HZP_RETURN_IF_ERROR(r.read_label("name", c.name));
  HZP_RETURN_IF_ERROR(r.read_int("nodes", c.nodes, 1, range::kNodes));
  HZP_RETURN_IF_ERROR(r.read_int("gpus_per_node", c.gpus_per_node, 1, range::kGpusPerNode));
  if (overridden) {
    c.nodes = run_on.nodes;
    c.gpus_per_node = run_on.gpus_per_node;
  }
  if (static_cast<std::int64_t>(c.nodes) * c.gpus_per_node > range::kWorld)
    return invalid(r.path_of("nodes"),
                   "times gpus_per_node (" + std::to_string(c.gpus_per_node) + ") is " +
                       std::to_string(static_cast<std::int64_t>(c.nodes) * c.gpus_per_node) + " GPUs, more than the " +
                       std::to_string(range::kWorld) + " hzp models",
                   c.nodes);
  if (r.has("gpu")) HZP_RETURN_IF_ERROR(parse_gpu(r, from_preset, c));
  // Run on other ranks, one emulated NIC per rank unless the scenario says otherwise (a preset's 8 NICs
  // cannot rail-map 3 ranks).
  const bool nic_count_given = r.has("nic") && r.at("nic").is_object() && r.at("nic").contains("per_node");
  if (overridden && !nic_count_given) c.nic.per_node = run_on.gpus_per_node;
  HZP_RETURN_IF_ERROR(parse_links(r, from_preset, !overridden, c));
  if (r.has("inter_node")) HZP_RETURN_IF_ERROR(parse_inter_node(r, c.inter));
  HZP_RETURN_IF_ERROR(parse_cluster_tuning(r, c));
  HZP_RETURN_IF_ERROR(check_cluster(c));
  return c;
}

// training's per-sequence fields: lengths, precision, optimizer, recomputation, attention, kernels, dropout, FP8,
// clipping.
Status parse_training_fields(const ObjectReader& r, TrainingSpec& t) {
  HZP_RETURN_IF_ERROR(r.require("seq_len"));
  HZP_RETURN_IF_ERROR(r.require("micro_batch"));
  HZP_RETURN_IF_ERROR(r.read_int("seq_len", t.seq_len, 1, range::kSeqLen));
  HZP_RETURN_IF_ERROR(r.read_int("micro_batch", t.micro_batch, 1, range::kMicroBatch));
  HZP_RETURN_IF_ERROR(r.read_enum("precision", t.precision, {Precision::kBf16, Precision::kFp16, Precision::kFp32}));
  HZP_RETURN_IF_ERROR(r.read_string("optimizer", t.optimizer));
  if (t.optimizer != "adamw")
    return invalid(r.path_of("optimizer"), "must be \"adamw\" (the only optimizer modelled)", r.at("optimizer"));
  HZP_RETURN_IF_ERROR(
      r.read_enum("recompute", t.recompute, {Recompute::kNone, Recompute::kSelective, Recompute::kFull}));
  HZP_RETURN_IF_ERROR(r.read_bool("flash_attention", t.flash_attention));
  HZP_RETURN_IF_ERROR(
      r.read_enum("attention", t.attention, {AttentionAlgorithm::kStandard, AttentionAlgorithm::kPasa}));
  if (t.attention == AttentionAlgorithm::kPasa && t.precision != Precision::kFp16)
    return invalid(
        r.path_of("attention"),
        std::string("\"pasa\" keeps fp16 scores from overflowing: it needs training.precision \"fp16\", not \"") +
            to_string(t.precision) + "\" (bf16 and fp32 have fp32's range)",
        r.at("attention"));
  if (t.attention == AttentionAlgorithm::kPasa && !t.flash_attention)
    return invalid(r.path_of("attention"),
                   "\"pasa\" is a flash-attention algorithm: it needs training.flash_attention true",
                   r.at("attention"));
  HZP_RETURN_IF_ERROR(r.read_enum("kernels", t.kernels, {KernelFusion::kFused, KernelFusion::kEager}));
  HZP_RETURN_IF_ERROR(r.read_number("attention_dropout", t.attention_dropout, kOne, {0, 1, false, true}));
  HZP_RETURN_IF_ERROR(r.read_number("hidden_dropout", t.hidden_dropout, kOne, {0, 1, false, true}));
  HZP_RETURN_IF_ERROR(r.read_bool("fp8", t.fp8));
  if (t.fp8 && t.precision == Precision::kFp32)
    return invalid(r.path_of("fp8"),
                   "FP8 linear layers need a 16-bit training.precision (bf16 or fp16) for the rest, not fp32", t.fp8);
  HZP_RETURN_IF_ERROR(r.read_number("grad_clip", t.grad_clip, kOne, {0, 1e9}));
  return Status::Ok();
}

// training's global batch (in sequences or tokens) against micro_batch x D, and the schedule's size bound.
Status parse_global_batch(const ObjectReader& r, const ModelSpec& model, int data_parallel, int pipeline,
                          TrainingSpec& t) {
  if (t.micro_batch * t.seq_len > range::kMicroBatchTokens)
    return invalid(r.path_of("micro_batch"),
                   "times seq_len (" + std::to_string(t.seq_len) + ") is more than the " +
                       std::to_string(range::kMicroBatchTokens) + " tokens a micro-batch may hold",
                   t.micro_batch);
  // Sequences one step takes without accumulation: micro_batch x D (< 2^36 with the ranges above).
  const std::int64_t per_step = t.micro_batch * static_cast<std::int64_t>(data_parallel);

  const bool by_tokens = r.has("global_batch_tokens");
  if (by_tokens && r.has("global_batch_sequences"))
    return invalid(r.path_of("global_batch_tokens"),
                   "give either global_batch_sequences or global_batch_tokens, "
                   "not both",
                   r.at("global_batch_tokens"));
  t.global_batch = per_step;
  std::string batch_path = r.path_of("global_batch_sequences");
  std::string shown;
  if (by_tokens) {
    batch_path = r.path_of("global_batch_tokens");
    std::int64_t tokens = 0;
    HZP_RETURN_IF_ERROR(r.read_int("global_batch_tokens", tokens, 1, std::numeric_limits<std::int64_t>::max()));
    if (tokens % t.seq_len != 0)
      return invalid(batch_path,
                     std::to_string(tokens) + " is not a multiple of seq_len (" + std::to_string(t.seq_len) + ")");
    t.global_batch = tokens / t.seq_len;
    if (t.global_batch > range::kGlobalSequences)
      return invalid(batch_path, "is more than " + std::to_string(range::kGlobalSequences) + " sequences",
                     r.at("global_batch_tokens"));
    shown = std::to_string(tokens) + " tokens = " + std::to_string(t.global_batch) + " sequences";
  } else {
    HZP_RETURN_IF_ERROR(r.read_int("global_batch_sequences", t.global_batch, 1, range::kGlobalSequences));
    shown = std::to_string(t.global_batch);
  }
  if (t.global_batch % per_step != 0)
    return invalid(batch_path, shown + " is not a multiple of micro_batch (" + std::to_string(t.micro_batch) +
                                   ") x data-parallel size (" + std::to_string(data_parallel) + ")");
  // The schedule holds every (unit, micro-batch) pass of a step: bound it.
  const std::int64_t micro_batches = t.global_batch / per_step;
  const int stage_units = (model.layers + pipeline - 1) / pipeline + 2;  // a stage's, about (uneven stages differ)
  if (micro_batches > range::kMicroBatchesPerStep || micro_batches * stage_units > range::kUnitPasses)
    return invalid(batch_path, shown + " makes " + std::to_string(micro_batches) + " micro-batches per step of " +
                                   std::to_string(stage_units) + " units each, more than the " +
                                   std::to_string(range::kUnitPasses) +
                                   " unit passes a step's schedule holds; raise micro_batch or lower the batch");
  return Status::Ok();
}

Result<TrainingSpec> parse_training(const json& value, const ModelSpec& model, int data_parallel, int pipeline) {
  HZP_ASSIGN_OR_RETURN(ObjectReader r,
                       ObjectReader::open(value, "training",
                                          {"seq_len", "micro_batch", "global_batch_sequences", "global_batch_tokens",
                                           "precision", "optimizer", "recompute", "flash_attention", "attention",
                                           "kernels", "attention_dropout", "hidden_dropout", "fp8", "grad_clip"}));
  TrainingSpec t;
  HZP_RETURN_IF_ERROR(parse_training_fields(r, t));
  if (model.position == PositionEmbedding::kLearned && t.seq_len > model.max_positions)
    return invalid(
        r.path_of("seq_len"),
        "exceeds model.max_positions (" + std::to_string(model.max_positions) + ") of the learned position table",
        t.seq_len);

  HZP_RETURN_IF_ERROR(parse_global_batch(r, model, data_parallel, pipeline, t));
  return t;
}

Result<RunSpec> parse_run(const json& value) {
  HZP_ASSIGN_OR_RETURN(ObjectReader r,
                       ObjectReader::open(value, "run",
                                          {"steps", "lr", "min_lr", "warmup_steps", "weight_decay", "beta1", "beta2",
                                           "eps", "seed", "eval_interval", "eval_batches", "checkpoint_interval"}));
  RunSpec run;
  HZP_RETURN_IF_ERROR(r.read_int("steps", run.steps, 1, range::kSteps));
  HZP_RETURN_IF_ERROR(r.read_number("lr", run.lr, kOne, {0, 100, true}));
  HZP_RETURN_IF_ERROR(r.read_number("min_lr", run.min_lr, kOne, {0, 100}));
  HZP_RETURN_IF_ERROR(r.read_int("warmup_steps", run.warmup_steps, 0, range::kSteps));
  HZP_RETURN_IF_ERROR(r.read_number("weight_decay", run.weight_decay, kOne, {0, 1}));
  HZP_RETURN_IF_ERROR(r.read_number("beta1", run.beta1, kOne, {0, 1, false, true}));
  HZP_RETURN_IF_ERROR(r.read_number("beta2", run.beta2, kOne, {0, 1, false, true}));
  HZP_RETURN_IF_ERROR(r.read_number("eps", run.eps, kOne, {1e-30, 1}));
  HZP_RETURN_IF_ERROR(r.read_int("seed", run.seed, 0, range::kSeed));
  HZP_RETURN_IF_ERROR(r.read_int("eval_interval", run.eval_interval, 0, range::kSteps));
  HZP_RETURN_IF_ERROR(r.read_int("eval_batches", run.eval_batches, 1, range::kEvalBatches));
  HZP_RETURN_IF_ERROR(r.read_int("checkpoint_interval", run.checkpoint_interval, 0, range::kSteps));
  if (run.min_lr > run.lr)
    return invalid(r.path_of("min_lr"), "must not exceed lr (" + std::to_string(run.lr) + ")", run.min_lr);
  return run;
}

// policy.parallel: tensor / pipeline / virtual_stages / sequence_parallel / context, checked against the
// model and the node (Megatron-LM's own requirements: heads, KV heads and MLP widths split evenly over tensor,
// the layers over pipeline x virtual_stages as pipeline_split.h says; the sequence into 2 x context chunks, checked
// with the training block).
Result<ParallelSpec> parse_parallel(const ObjectReader& policy, const ModelSpec& model, const ClusterSpec& cluster) {
  HZP_ASSIGN_OR_RETURN(
      ObjectReader r,
      policy.child("parallel", {"tensor", "pipeline", "virtual_stages", "sequence_parallel", "context", "context_comm",
                                "layers_in_first_stage", "layers_in_last_stage", "account_for_embedding_in_split",
                                "account_for_loss_in_split", "tensor_comm_overlap"}));
  ParallelSpec p;
  HZP_RETURN_IF_ERROR(r.read_int("tensor", p.tensor, 1, range::kGpusPerNode));
  HZP_RETURN_IF_ERROR(r.read_int("pipeline", p.pipeline, 1, range::kLayers));
  HZP_RETURN_IF_ERROR(r.read_int("virtual_stages", p.virtual_stages, 1, range::kLayers));
  HZP_RETURN_IF_ERROR(r.read_bool("sequence_parallel", p.sequence_parallel));
  HZP_RETURN_IF_ERROR(r.read_int("context", p.context, 1, range::kWorld));
  HZP_RETURN_IF_ERROR(r.read_enum("context_comm", p.context_comm, {ContextComm::kRing, ContextComm::kAllToAll}));
  HZP_RETURN_IF_ERROR(r.read_int("layers_in_first_stage", p.layers_in_first_stage, 0, range::kLayers));
  HZP_RETURN_IF_ERROR(r.read_int("layers_in_last_stage", p.layers_in_last_stage, 0, range::kLayers));
  HZP_RETURN_IF_ERROR(r.read_bool("account_for_embedding_in_split", p.account_for_embedding_in_split));
  HZP_RETURN_IF_ERROR(r.read_bool("account_for_loss_in_split", p.account_for_loss_in_split));
  HZP_RETURN_IF_ERROR(r.read_bool("tensor_comm_overlap", p.tensor_comm_overlap));
  const int t = p.tensor;
  if (cluster.gpus_per_node % t != 0)
    return invalid(r.path_of("tensor"),
                   "must divide the " + std::to_string(cluster.gpus_per_node) +
                       " GPUs per node (tensor parallelism stays inside a node)",
                   t);
  std::int64_t unsplit = 0;
  if (const char* what = tensor_unsplit_field(model, t, &unsplit))
    return invalid(r.path_of("tensor"), "does not divide " + std::string(what) + " (" + std::to_string(unsplit) + ")",
                   t);
  if (p.context_comm == ContextComm::kAllToAll && p.context == 1)
    return invalid(r.path_of("context_comm"), "needs context > 1 (it is how context ranks exchange the sequence)",
                   r.at("context_comm"));
  if (p.sequence_parallel && t == 1)
    return invalid(r.path_of("sequence_parallel"), "needs tensor > 1 (it splits what tensor parallelism replicates)",
                   r.at("sequence_parallel"));
  if (p.tensor_comm_overlap && !p.sequence_parallel)
    return invalid(r.path_of("tensor_comm_overlap"),
                   "needs sequence_parallel (Megatron's tp_comm_overlap and torchtitan's async-TP pipeline its "
                   "all-gathers and reduce-scatters, not all-reduces)",
                   r.at("tensor_comm_overlap"));
  if (p.virtual_stages > 1 && p.pipeline == 1)
    return invalid(r.path_of("virtual_stages"), "needs pipeline > 1 (it interleaves pipeline stages)",
                   p.virtual_stages);
  HZP_RETURN_IF_ERROR(chunk_layers(model.layers, p).status());  // the layers split over the stages
  return p;
}

// policy.parallel.context on the replica axis: a context group is `context` consecutive ranks of the axis;
// it must tile the axis and its nodes (and, for Ulysses, split the heads of a tensor rank).
Status check_context(const ParallelSpec& p, const ModelSpec& model, const ReplicaAxis& axis) {
  const std::string at = "policy.parallel.context";
  const int c = p.context, t = p.tensor, per_node = axis.ranks_per_node;
  if (axis.size() % c != 0 || (per_node % c != 0 && c % per_node != 0))
    return invalid(at,
                   "must divide the " + std::to_string(axis.size()) + " GPUs that hold the same parameters (" +
                       std::to_string(per_node) + " per node x " + std::to_string(axis.nodes) +
                       " nodes after tensor and pipeline), in whole nodes or equal parts of one",
                   c);
  // Ulysses re-splits the attention heads of a tensor rank over the context group.
  if (p.context_comm == ContextComm::kAllToAll)
    if (const char* what = ulysses_unsplit_heads(model, t, c)) {
      const std::int64_t n = std::string_view(what) == "model.heads" ? model.heads : model.kv_heads;
      return invalid(at,
                     "must divide " + std::string(what) + " / tensor (" + std::to_string(n) + " / " +
                         std::to_string(t) + ") with context_comm \"all_to_all\" (it splits the heads)",
                     c);
    }
  return Status::Ok();
}

// policy.preset and policy.sharding on the replica axis (`axis`): the preset's groups, then the explicit
// ones over them, or "auto".
Status parse_sharding(const ObjectReader& r, const ReplicaAxis& axis, PolicySpec& p) {
  const int gpus_per_node = axis.ranks_per_node, nodes = axis.nodes;
  // Without a default sharding (no preset, or amsp) every state's group must be explicit.
  bool need_all_groups = true;
  std::string why_all = "the policy has no preset";
  if (r.has("preset")) {
    std::string name;
    HZP_RETURN_IF_ERROR(r.read_string("preset", name));
    const std::optional<Policy> named = policy_named(name);
    // "custom" is what a policy without a preset is called: naming it is the same as leaving it out.
    if (!named || !(policy_entry(*named).is_preset || *named == Policy::kCustom))
      return invalid(r.path_of("preset"),
                     "unknown policy preset (known: " + join(policy_preset_names()) + ", or \"custom\")",
                     r.at("preset"));
    p.preset = *named;
    Result<ShardingSpec> preset = sharding_preset(p.preset, gpus_per_node, nodes);
    need_all_groups = !preset.ok();
    if (preset.ok()) p.sharding = *preset;
    why_all = "preset \"" + name + "\" has no default sharding";
  }
  if (r.has("sharding") && r.at("sharding").is_string()) {
    if (r.at("sharding") != "auto")
      return invalid(r.path_of("sharding"), "must be an object of groups or \"auto\"", r.at("sharding"));
    if (p.preset != Policy::kAmsp)
      return invalid(r.path_of("sharding"), "\"auto\" needs \"preset\": \"amsp\" (the planner picks the groups)",
                     r.at("sharding"));
    p.auto_sharding = true;
    p.sharding = *sharding_preset(Policy::kZero3, gpus_per_node, nodes);  // placeholder until compile() resolves it
  } else if (!r.has("sharding") && need_all_groups) {
    return invalid(r.path_of("sharding"), "missing params, grads and optimizer groups (" + why_all + ")");
  } else if (r.has("sharding")) {
    HZP_ASSIGN_OR_RETURN(ObjectReader s, r.child("sharding", {"params", "grads", "optimizer"}));
    const std::pair<const char*, ShardGroup*> states[] = {
        {"params", &p.sharding.params}, {"grads", &p.sharding.grads}, {"optimizer", &p.sharding.optimizer}};
    for (const auto& [key, group] : states) {
      if (need_all_groups) HZP_RETURN_IF_ERROR(s.require(key, why_all));
      if (s.has(key)) {
        HZP_ASSIGN_OR_RETURN(*group, parse_group(s.at(key), s.path_of(key)));
      }
    }
  }
  return check_sharding(p.sharding, gpus_per_node, nodes, r.path_of("sharding"));
}

// policy.comm (a framework's defaults first, then the fields given) and policy.overlap.
Status parse_comm_and_overlap(const ObjectReader& r, PolicySpec& p) {
  if (r.has("comm")) {
    HZP_ASSIGN_OR_RETURN(ObjectReader c,
                         r.child("comm", {"framework", "grad_reduce", "param_refresh", "refresh_overlap",
                                          "grad_reduce_overlap", "param_gather", "grad_reduce_in_fp32"}));
    if (c.has("framework")) {
      std::string name;
      HZP_RETURN_IF_ERROR(c.read_string("framework", name));
      auto framework = framework_comm(name);
      if (!framework.ok()) return invalid(c.path_of("framework"), framework.status().message(), c.at("framework"));
      p.comm = framework->comm;
      p.overlap.bucket_bytes = framework->bucket_bytes;
    }
    HZP_RETURN_IF_ERROR(
        c.read_enum("grad_reduce", p.comm.grad_reduce, {GradReduce::kReduceScatter, GradReduce::kAllReduce}));
    HZP_RETURN_IF_ERROR(
        c.read_enum("param_refresh", p.comm.param_refresh, {ParamRefresh::kAllGather, ParamRefresh::kBroadcast}));
    HZP_RETURN_IF_ERROR(c.read_bool("refresh_overlap", p.comm.refresh_overlap));
    HZP_RETURN_IF_ERROR(c.read_bool("grad_reduce_overlap", p.comm.grad_reduce_overlap));
    HZP_RETURN_IF_ERROR(c.read_enum("param_gather", p.comm.param_gather, {ParamGather::kUnit, ParamGather::kTensor}));
    HZP_RETURN_IF_ERROR(c.read_bool("grad_reduce_in_fp32", p.comm.grad_reduce_in_fp32));
  }
  if (r.has("overlap")) {
    HZP_ASSIGN_OR_RETURN(ObjectReader o, r.child("overlap", {"prefetch_depth", "bucket_MiB", "separate_streams"}));
    HZP_RETURN_IF_ERROR(o.read_int("prefetch_depth", p.overlap.prefetch_depth, 0, range::kPrefetch));
    double bucket = static_cast<double>(p.overlap.bucket_bytes);
    HZP_RETURN_IF_ERROR(o.read_number("bucket_MiB", bucket, kMiB, {1e-6, 1 << 20}));
    p.overlap.bucket_bytes = std::llround(bucket);
    HZP_RETURN_IF_ERROR(o.read_bool("separate_streams", p.overlap.separate_streams));
  }
  return Status::Ok();
}

// policy.expert_parallel: a MoE model's experts split evenly, inside a node or over whole nodes.
Status parse_expert_parallel(const ObjectReader& r, const ModelSpec& model, const ReplicaAxis& axis, int& ep) {
  HZP_RETURN_IF_ERROR(r.read_int("expert_parallel", ep, 1, range::kExperts));
  if (ep == 1) return Status::Ok();
  const int gpus_per_node = axis.ranks_per_node, nodes = axis.nodes;
  const std::string at = r.path_of("expert_parallel");
  if (!model.has_moe) return invalid(at, "needs a MoE model (the model has no moe block)", ep);
  if (model.moe.experts % ep != 0)
    return invalid(at, "does not divide the " + std::to_string(model.moe.experts) + " experts", ep);
  if (ep <= gpus_per_node ? gpus_per_node % ep != 0 : ep % gpus_per_node != 0 || nodes % (ep / gpus_per_node) != 0)
    return invalid(at,
                   "must divide the " + std::to_string(gpus_per_node) +
                       " GPUs per node, or be a whole number of nodes dividing the " + std::to_string(nodes) + " nodes",
                   ep);
  return Status::Ok();
}

// policy, and the parallel mesh it makes on the cluster (`mesh`, the one computation of it).
Result<PolicySpec> parse_policy(const json& value, const ModelSpec& model, const ClusterSpec& cluster,
                                ParallelMesh& mesh) {
  HZP_ASSIGN_OR_RETURN(
      ObjectReader r,
      ObjectReader::open(value, "policy", {"preset", "sharding", "overlap", "comm", "expert_parallel", "parallel"}));
  PolicySpec p;
  p.preset = Policy::kCustom;
  p.overlap.bucket_bytes = 25 * 1024 * 1024;
  if (r.has("parallel")) {
    HZP_ASSIGN_OR_RETURN(p.parallel, parse_parallel(r, model, cluster));
  }
  HZP_ASSIGN_OR_RETURN(mesh, make_mesh(cluster, p.parallel));
  if (p.parallel.context > 1) HZP_RETURN_IF_ERROR(check_context(p.parallel, model, mesh.replica));
  // Shardings are laid out on the replica axis: its ranks per node and nodes stand in for the cluster's.
  HZP_RETURN_IF_ERROR(parse_sharding(r, mesh.replica, p));
  HZP_RETURN_IF_ERROR(parse_comm_and_overlap(r, p));
  // Its tensor stream is a stream of its own: with separate_streams false every collective is on the compute
  // stream, and the overlap would silently override that (issue 35's tenth attack).
  if (p.parallel.tensor_comm_overlap && !p.overlap.separate_streams)
    return invalid("policy.parallel.tensor_comm_overlap",
                   "needs policy.overlap.separate_streams (false puts every collective on the compute stream)", true);
  HZP_RETURN_IF_ERROR(parse_expert_parallel(r, model, mesh.replica, p.expert_parallel));
  mesh.expert = p.expert_parallel;
  return p;
}

// The JSON number that the parser turns back into exactly `si`, when one exists: a round trip through
// scenario_to_json must not drift by an ulp per pass.
double to_unit(double si, Unit u) {
  const double v = si * u.divide / u.multiply;
  double up = v;
  double down = v;
  for (int i = 0; i < 4; ++i) {
    if (from_unit(up, u) == si) return up;
    if (from_unit(down, u) == si) return down;
    up = std::nextafter(up, std::numeric_limits<double>::infinity());
    down = std::nextafter(down, -std::numeric_limits<double>::infinity());
  }
  return v;
}

json group_json(const ShardGroup& g) {
  return json::array({g.s0, g.s1});
}

// A framework default that depends on the working precision, known only once training is read: Megatron-LM
// reduces gradients in fp32 under bf16 and in fp16 under fp16. A grad_reduce_in_fp32 given in the scenario wins
// (parse_policy has already validated policy.comm).
void apply_precision_defaults(const json& policy, Scenario& s) {
  const auto comm = policy.find("comm");
  if (comm == policy.end() || comm->contains("grad_reduce_in_fp32")) return;
  const auto name = comm->find("framework");
  if (name == comm->end() || !name->is_string()) return;
  const Result<FrameworkComm> framework = framework_comm(name->get<std::string>());
  if (framework.ok() && framework->grad_reduce_in_fp32_with_bf16)
    s.policy.comm.grad_reduce_in_fp32 = s.training.precision == Precision::kBf16;
}

// The resolved form, one section at a time (scenario_to_json).
json model_json(const ModelSpec& m) {
  json model = {
      {"name", m.name},
      {"family", to_string(m.family)},
      {"layers", m.layers},
      {"hidden", m.hidden},
      {"heads", m.heads},
      {"kv_heads", m.kv_heads},
      {"ffn_hidden", m.ffn_hidden},
      {"mlp", to_string(m.mlp)},
      {"vocab", m.vocab},
      {"tied_embeddings", m.tied_embeddings},
      {"position", to_string(m.position)},
      {"max_positions", m.max_positions},
      {"moe", nullptr},
  };
  if (m.has_moe) {
    const bool all = m.moe.layers == all_layers(m.layers);
    model["moe"] = {
        {"experts", m.moe.experts},
        {"top_k", m.moe.top_k},
        {"expert_ffn_hidden", m.moe.expert_ffn_hidden},
        {"shared_ffn_hidden", m.moe.shared_ffn_hidden},
        {"layers", all ? json("all") : json(m.moe.layers)},
    };
  }
  model["mla"] = nullptr;
  if (m.has_mla)
    model["mla"] = {{"q_lora_rank", m.mla.q_lora_rank},
                    {"kv_lora_rank", m.mla.kv_lora_rank},
                    {"qk_nope_head_dim", m.mla.qk_nope_head_dim},
                    {"qk_rope_head_dim", m.mla.qk_rope_head_dim},
                    {"v_head_dim", m.mla.v_head_dim}};
  return model;
}

json cluster_json(const ClusterSpec& c) {
  json cluster = {
      {"name", c.name},
      {"nodes", c.nodes},
      {"gpus_per_node", c.gpus_per_node},
      {"gpu",
       {{"type", c.gpu.type},
        {"peak_tflops", to_unit(c.gpu.peak_flops, kTflops)},
        {"memory_GiB", to_unit(c.gpu.memory_bytes, kGiB)},
        {"hbm_GBps", to_unit(c.gpu.hbm_bytes_per_s, kGBps)}}},
      {"intra_node",
       {{"topology", to_string(c.intra.topology)},
        {"bandwidth_GBps", to_unit(c.intra.bytes_per_s, kGBps)},
        {"latency_us", to_unit(c.intra.latency_s, kUs)}}},
      {"nic",
       {{"per_node", c.nic.per_node},
        {"bandwidth_Gbps", to_unit(c.nic.bytes_per_s, kGbps)},
        {"latency_us", to_unit(c.nic.latency_s, kUs)},
        {"mapping", to_string(c.nic.mapping)}}},
      {"inter_node",
       {{"topology", "fat_tree"},
        {"leaf_size", c.inter.leaf_size},
        {"oversubscription", c.inter.oversubscription},
        {"switch_latency_us", to_unit(c.inter.switch_latency_s, kUs)},
        {"routing", to_string(c.inter.routing)},
        {"rail_optimized", c.inter.rail_optimized},
        {"qps_per_connection", c.inter.qps_per_connection},
        {"placement", to_string(c.inter.placement)},
        {"seed", c.inter.seed}}},
      {"efficiency",
       {{"gemm", c.efficiency.gemm},
        {"memory_bound", c.efficiency.memory_bound},
        {"intra_node", c.efficiency.intra_node},
        {"inter_node", c.efficiency.inter_node}}},
      {"collective_algorithm", to_string(c.collective_algorithm)},
      {"protocol", to_string(c.protocol)},
      {"compute_spread", c.compute_spread},
      {"overlap_slowdown", c.overlap_slowdown},
  };
  if (c.gpu.fp8_peak_flops > 0) {
    cluster["gpu"]["fp8_peak_tflops"] = to_unit(c.gpu.fp8_peak_flops, kTflops);
    cluster["gpu"]["fp8_gemm_vs_bf16"] = c.gpu.fp8_gemm_vs_bf16;
  }
  if (c.gpu.arch != GpuArch::kUnknown) cluster["gpu"]["arch"] = to_string(c.gpu.arch);
  // Always: 0 is a choice too (a known type's entry would give its own otherwise).
  cluster["gpu"]["gemm_overhead_us"] = to_unit(c.gpu.gemm_overhead_s, kUs);
  json flash = json::array();
  for (const FlashRate& f : c.gpu.flash_rates)
    flash.push_back({{"head_dim", f.head_dim}, {"seq", f.seq}, {"fwd", f.fwd}, {"bwd", f.bwd}});
  cluster["gpu"]["flash_attention_vs_gemm"] = std::move(flash);  // always, as the fixed cost
  return cluster;
}

json training_json(const TrainingSpec& t) {
  json training = {
      {"seq_len", t.seq_len},
      {"micro_batch", t.micro_batch},
      {"global_batch_sequences", t.global_batch},
      {"precision", to_string(t.precision)},
      {"optimizer", t.optimizer},
      {"recompute", to_string(t.recompute)},
      {"flash_attention", t.flash_attention},
      {"attention", to_string(t.attention)},
      {"kernels", to_string(t.kernels)},
      {"attention_dropout", t.attention_dropout},
      {"hidden_dropout", t.hidden_dropout},
      {"fp8", t.fp8},
      {"grad_clip", t.grad_clip},
  };
  return training;
}

json run_json(const RunSpec& u) {
  json run = {
      {"steps", u.steps},
      {"lr", u.lr},
      {"min_lr", u.min_lr},
      {"warmup_steps", u.warmup_steps},
      {"weight_decay", u.weight_decay},
      {"beta1", u.beta1},
      {"beta2", u.beta2},
      {"eps", u.eps},
      {"seed", u.seed},
      {"eval_interval", u.eval_interval},
      {"eval_batches", u.eval_batches},
      {"checkpoint_interval", u.checkpoint_interval},
  };
  return run;
}

json policy_json(const PolicySpec& p) {
  json policy = {
      {"sharding",
       {{"params", group_json(p.sharding.params)},
        {"grads", group_json(p.sharding.grads)},
        {"optimizer", group_json(p.sharding.optimizer)}}},
      {"overlap",
       {{"prefetch_depth", p.overlap.prefetch_depth},
        {"bucket_MiB", to_unit(static_cast<double>(p.overlap.bucket_bytes), kMiB)},
        {"separate_streams", p.overlap.separate_streams}}},
      {"comm",
       {{"framework", p.comm.framework},
        {"grad_reduce", to_string(p.comm.grad_reduce)},
        {"param_refresh", to_string(p.comm.param_refresh)},
        {"refresh_overlap", p.comm.refresh_overlap},
        {"grad_reduce_overlap", p.comm.grad_reduce_overlap},
        {"param_gather", to_string(p.comm.param_gather)},
        {"grad_reduce_in_fp32", p.comm.grad_reduce_in_fp32}}},
      {"expert_parallel", p.expert_parallel},
      {"parallel", parallel_to_json(p.parallel)},
  };
  if (p.preset != Policy::kCustom) policy["preset"] = to_string(p.preset);
  return policy;
}

}  // namespace

Result<Scenario> parse_scenario(const nlohmann::json& doc, std::string_view name, const ClusterOverride& run_on) {
  HZP_ASSIGN_OR_RETURN(ObjectReader r,
                       ObjectReader::open(doc, "", {"name", "model", "cluster", "training", "policy", "run"}));
  for (const char* key : {"model", "cluster", "training", "policy"}) HZP_RETURN_IF_ERROR(r.require(key));
  Scenario s;
  s.name = std::string(name);
  HZP_RETURN_IF_ERROR(r.read_label("name", s.name));
  HZP_ASSIGN_OR_RETURN(s.model, parse_model(r.at("model")));
  HZP_ASSIGN_OR_RETURN(s.cluster, parse_cluster(r.at("cluster"), run_on));
  HZP_ASSIGN_OR_RETURN(s.policy, parse_policy(r.at("policy"), s.model, s.cluster, s.mesh));
  HZP_ASSIGN_OR_RETURN(s.training,
                       parse_training(r.at("training"), s.model, s.data_parallel(), s.policy.parallel.pipeline));
  apply_precision_defaults(r.at("policy"), s);
  if (s.training.fp8 && !(s.cluster.gpu.fp8_peak_flops > 0))
    return invalid("training.fp8",
                   "cluster.gpu \"" + s.cluster.gpu.type +
                       "\" has no FP8 peak (no FP8 tensor cores, or none known): set cluster.gpu.fp8_peak_tflops",
                   s.training.fp8);
  const ParallelSpec& par = s.policy.parallel;
  const std::int64_t passes = s.grad_accum_steps() * (s.model.layers + 2LL * par.pipeline);
  if (par.pipeline > 1 && passes > range::kScheduleUnitPasses)
    return invalid("policy.parallel.pipeline",
                   "its " + std::to_string(par.pipeline) + " stages x " + std::to_string(s.grad_accum_steps()) +
                       " micro-batches make " + std::to_string(passes) + " unit passes per step, more than the " +
                       std::to_string(range::kScheduleUnitPasses) +
                       " a schedule holds; raise micro_batch or lower the batch",
                   par.pipeline);
  // Megatron's context parallelism splits each sequence into 2 x context chunks, two per rank (one early, one
  // late: causal attention's work then balances).
  if (par.context > 1 && s.training.seq_len % (2 * par.context) != 0)
    return invalid("policy.parallel.context",
                   "2 x context must divide training.seq_len (" + std::to_string(s.training.seq_len) + ")",
                   par.context);
  // Megatron's interleaved schedule runs micro-batches in groups of `pipeline`.
  if (par.virtual_stages > 1 && s.grad_accum_steps() % par.pipeline != 0)
    return invalid("policy.parallel.virtual_stages",
                   "the interleaved schedule needs the micro-batches per step (" +
                       std::to_string(s.grad_accum_steps()) + ") to be a multiple of pipeline (" +
                       std::to_string(par.pipeline) + ")",
                   par.virtual_stages);
  if (r.has("run")) {
    HZP_ASSIGN_OR_RETURN(s.run, parse_run(r.at("run")));
  }
  HZP_RETURN_IF_ERROR(validate_mesh(s));
  return s;
}

Status validate_mesh(const Scenario& scenario) {
  const ParallelMesh& m = scenario.mesh;
  const ClusterSpec& c = scenario.cluster;
  const auto bad = [&](const std::string& what) {
    return Status::InvalidInput("parallel mesh (" + m.describe() + "): " + what);
  };
  for (int degree : {m.data, m.tensor, m.pipeline, m.context, m.expert})
    if (degree < 1) return bad("every degree must be at least 1");
  if (m.world() != c.world_size())
    return bad("the degrees multiply to " + std::to_string(m.world()) + " GPUs, the cluster has " +
               std::to_string(c.nodes) + " x " + std::to_string(c.gpus_per_node) + " = " +
               std::to_string(c.world_size()));
  if ((m.data * m.context) % m.expert != 0)
    return bad(m.context > 1 ? "expert must divide data x context" : "expert must divide data");
  return Status::Ok();
}

Result<Scenario> parse_scenario_text(std::string_view text, std::string_view name) {
  HZP_ASSIGN_OR_RETURN(json doc, parse_json_strict(text, kMaxScenarioBytes));
  return parse_scenario(doc, name);
}

Result<json> load_scenario_document(const std::string& path, const std::vector<std::string>& sets, std::string* name) {
  std::string text;
  if (path == "-") {
    // At most one byte past the limit is read: /dev/zero on stdin is refused at once, not read to the end.
    text.resize(kMaxScenarioBytes + 1);
    std::cin.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<std::size_t>(std::cin.gcount()));
    if (std::cin.bad()) return Status::InvalidInput("stdin: cannot be read");
    if (text.size() > kMaxScenarioBytes)
      return Status::InvalidInput("stdin: over " + std::to_string(kMaxScenarioBytes) + " bytes, not a scenario");
  } else {
    HZP_ASSIGN_OR_RETURN(text, read_text_file(path, kMaxScenarioBytes + 1));
  }
  const std::string shown = path == "-" ? std::string("stdin") : printable(path, 200);
  Result<json> doc = parse_json_strict(text, kMaxScenarioBytes);
  // Syntax errors have no JSON path to lead with, so they lead with the file instead.
  if (!doc.ok()) {
    const std::string& m = doc.status().message();
    if (m.rfind("malformed JSON", 0) == 0 || m.rfind("empty document", 0) == 0 || m.rfind("document of", 0) == 0)
      return Status::InvalidInput(shown + ": " + m);
    return doc.status();
  }
  // model.from_hf_config in the file names a file next to the scenario.
  if (path != "-" && doc->is_object() && doc->contains("model") && (*doc)["model"].is_object()) {
    json& model = (*doc)["model"];
    if (model.contains("from_hf_config") && model["from_hf_config"].is_string()) {
      const std::filesystem::path config = model["from_hf_config"].get<std::string>();
      if (config.is_relative() && !config.empty())
        model["from_hf_config"] = (std::filesystem::path(path).parent_path() / config).lexically_normal().string();
    }
  }
  for (const std::string& set : sets) HZP_RETURN_IF_ERROR(apply_set(*doc, set));  // paths in them: as typed
  if (name) *name = path == "-" ? std::string("stdin") : std::filesystem::path(path).stem().string();
  return doc;
}

Result<Scenario> load_scenario_file(const std::string& path, const std::vector<std::string>& sets) {
  std::string name;
  HZP_ASSIGN_OR_RETURN(json doc, load_scenario_document(path, sets, &name));
  return parse_scenario(doc, name);
}

nlohmann::json parallel_to_json(const ParallelSpec& p) {
  return {{"tensor", p.tensor},
          {"pipeline", p.pipeline},
          {"virtual_stages", p.virtual_stages},
          {"sequence_parallel", p.sequence_parallel},
          {"context", p.context},
          {"context_comm", to_string(p.context_comm)},
          {"layers_in_first_stage", p.layers_in_first_stage},
          {"layers_in_last_stage", p.layers_in_last_stage},
          {"account_for_embedding_in_split", p.account_for_embedding_in_split},
          {"account_for_loss_in_split", p.account_for_loss_in_split},
          {"tensor_comm_overlap", p.tensor_comm_overlap}};
}

nlohmann::json scenario_to_json(const Scenario& s) {
  return {{"name", s.name},
          {"model", model_json(s.model)},
          {"cluster", cluster_json(s.cluster)},
          {"training", training_json(s.training)},
          {"policy", policy_json(s.policy)},
          {"run", run_json(s.run)}};
}

}  // namespace hzp
