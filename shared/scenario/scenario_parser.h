// Scenario JSON -> typed Scenario. Strict: unknown keys, wrong types, out-of-range values and broken
// sharding rules are errors (StatusCode::kInvalidInput) whose message starts with the JSON path, e.g.
//   policy.sharding.grads: group 3 does not divide data-parallel size 1024
// The field reference, with defaults and units, is scenarios/README.md.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp {

// Where `hzp train` runs a scenario: its own ranks instead of the scenario's cluster size. nodes and
// gpus_per_node replace the scenario's (which then need not give them), and a scenario that names no NIC
// count gets one NIC per rank (a preset's 8 NICs cannot rail-map 3 ranks). nodes == 0: no override.
struct ClusterOverride {
  int nodes = 0;
  int gpus_per_node = 0;
};

// Parse an already-decoded JSON document. `name` is used when the document has no "name" key.
Result<Scenario> parse_scenario(const nlohmann::json& doc, std::string_view name, const ClusterOverride& run_on = {});

// Decode text and parse it; malformed JSON is an error naming the byte offset.
Result<Scenario> parse_scenario_text(std::string_view text, std::string_view name);

// Read a file ("-": standard input, named "stdin") and parse it, after the `--set PATH=VALUE` assignments
// (overrides.h apply_set) on the document as written; a missing/unreadable file is an error naming the path.
Result<Scenario> load_scenario_file(const std::string& path, const std::vector<std::string>& sets = {});

// The document load_scenario_file parses, and the name it gives a document without "name".
Result<nlohmann::json> load_scenario_document(const std::string& path, const std::vector<std::string>& sets,
                                              std::string* name = nullptr);

// The parallel mesh of a scenario, checked once (the parser calls it last): every degree at least 1, their
// product the cluster's GPUs, expert dividing data. The message prints every degree.
Status validate_mesh(const Scenario& scenario);

// The fully resolved form (presets expanded, every field explicit, units as in the JSON keys).
// parse_scenario(scenario_to_json(s)) reproduces s.
nlohmann::json scenario_to_json(const Scenario& scenario);

// policy.parallel as the scenario format spells it (every field).
nlohmann::json parallel_to_json(const ParallelSpec& parallel);

}  // namespace hzp
