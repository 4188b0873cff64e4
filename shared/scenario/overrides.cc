// Overrides on a resolved scenario (overrides.h).
#include "shared/scenario/overrides.h"

#include <string>
#include <vector>

#include "shared/base/text.h"
#include "shared/scenario/presets.h"
#include "shared/scenario/scenario_parser.h"

namespace hzp {
namespace {

using nlohmann::json;

// The override's section `key` when it is an object, else nullptr.
const json* section(const json& overrides, const char* key) {
  auto it = overrides.find(key);
  return it != overrides.end() && it->is_object() ? &*it : nullptr;
}

bool has(const json* object, const char* key) {
  return object != nullptr && object->contains(key);
}

void erase(json& base, const char* object, const char* key) {
  if (base.contains(object) && base[object].is_object()) base[object].erase(key);
}

// Whether the resolved scenario's sharding is its preset's on its own replica axis (then it follows the
// cluster and parallel layout the overrides may change, as it would in the file).
bool sharding_from_preset(const json& resolved) {
  const Result<Scenario> s = parse_scenario(resolved, "resolved");
  if (!s.ok()) return false;
  const Result<ShardingSpec> preset =
      sharding_preset(s->policy.preset, s->mesh.replica.ranks_per_node, s->mesh.replica.nodes);
  return preset.ok() && *preset == s->policy.sharding;
}

// The fields of `base` that a key of the overrides decides, dropped so that the parser derives them again.
void drop_derived(json& base, const json& overrides) {
  if (sharding_from_preset(base)) erase(base, "policy", "sharding");
  if (has(section(overrides, "model"), "preset") || has(section(overrides, "model"), "from_hf_config"))
    base.erase("model");
  if (has(section(overrides, "cluster"), "preset") && base.contains("cluster") && base["cluster"].is_object())
    base["cluster"] = json{{"nodes", base["cluster"].value("nodes", json(1))}};  // the run's size stays
  const json* cluster = section(overrides, "cluster");
  if (cluster != nullptr && !cluster->contains("preset") && cluster->contains("gpu") && (*cluster)["gpu"].is_object() &&
      (*cluster)["gpu"].contains("type")) {
    erase(base, "cluster", "gpu");
    erase(base, "cluster", "efficiency");
  }
  const json* policy = section(overrides, "policy");
  if (has(policy, "preset") && !policy->contains("sharding")) erase(base, "policy", "sharding");
  const json* comm = policy != nullptr ? section(*policy, "comm") : nullptr;
  const json* training = section(overrides, "training");
  if (base.contains("policy") && base["policy"].is_object()) {
    json& base_policy = base["policy"];
    if (has(comm, "framework")) {
      base_policy.erase("comm");
      const json* overlap = section(*policy, "overlap");
      if (!has(overlap, "bucket_MiB")) erase(base_policy, "overlap", "bucket_MiB");
    } else if (has(training, "precision") && !has(comm, "grad_reduce_in_fp32") && base_policy.contains("comm") &&
               base_policy["comm"].is_object() && base_policy["comm"].contains("framework")) {
      erase(base_policy, "comm", "grad_reduce_in_fp32");
    }
  }
  if (has(training, "global_batch_tokens")) erase(base, "training", "global_batch_sequences");
  if (has(training, "global_batch_sequences")) erase(base, "training", "global_batch_tokens");
}

}  // namespace

Result<json> apply_overrides(const json& resolved, const json& overrides) {
  if (!overrides.is_object()) return Status::InvalidInput("overrides: must be a JSON object");
  for (const auto& [key, value] : overrides.items())
    if (resolved.contains(key) && resolved[key].is_object() && !value.is_object() && !value.is_null())
      return Status::InvalidInput(key + ": must be an object (it overrides the scenario's " + key + ")");
  json base = resolved;
  drop_derived(base, overrides);
  base.merge_patch(overrides);
  return base;
}

Status apply_set(json& doc, std::string_view assignment) {
  const std::string shown = printable(assignment, 120);
  const std::size_t eq = assignment.find('=');
  if (eq == std::string_view::npos) return Status::InvalidInput("--set " + shown + ": expected PATH=VALUE");
  const std::string_view path = assignment.substr(0, eq), text = assignment.substr(eq + 1);
  std::vector<std::string> keys;
  for (std::size_t begin = 0;;) {
    const std::size_t dot = path.find('.', begin);
    keys.emplace_back(path.substr(begin, dot == std::string_view::npos ? std::string_view::npos : dot - begin));
    if (keys.back().empty()) return Status::InvalidInput("--set " + shown + ": empty key in the path");
    if (dot == std::string_view::npos) break;
    begin = dot + 1;
  }
  if (!doc.is_object()) return Status::InvalidInput("--set " + shown + ": the scenario is not a JSON object");
  json value = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (value.is_discarded()) value = std::string(text);
  json* at = &doc;
  std::string walked;
  for (std::size_t i = 0; i + 1 < keys.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + keys[i];
    json& next = (*at)[keys[i]];
    if (next.is_null()) next = json::object();
    if (!next.is_object())
      return Status::InvalidInput("--set " + shown + ": " + walked + " is " + printable(next.dump(), 60) +
                                  ", not an object");
    at = &next;
  }
  // null deletes the key, but where null itself means something: it removes a preset's MoE or MLA.
  const bool nullable = path == "model.moe" || path == "model.mla";
  if (value.is_null() && !nullable)
    at->erase(keys.back());
  else
    (*at)[keys.back()] = std::move(value);
  return Status::Ok();
}

}  // namespace hzp
