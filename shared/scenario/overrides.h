// Overrides on a scenario that has already been resolved (a trace's scenario_config, scenario_to_json's
// output): `hzp replay --scenario W.json` and every other place that edits a scenario. They resolve as the
// same fields would in a scenario file — presets first, then explicit fields — not as a plain JSON merge
// patch, where the resolved scenario's explicit fields would shadow what a new preset or GPU type brings:
//
//   a section's "preset" (model, cluster)  the section is the override's: the preset fills what it omits
//   (or model.from_hf_config)
//                                           (cluster.nodes stays the scenario's unless given)
//   cluster.gpu.type                        the GPU's numbers and the efficiencies come from the new type's
//                                           calibration unless the override gives them
//   policy.preset                           the sharding comes from the preset unless given; a sharding
//                                           that was the preset's follows a new cluster or parallel layout
//   policy.comm.framework                   that framework's collectives and bucket size unless given
//   training.precision                      a framework's precision default (grad_reduce_in_fp32) re-applies
//   training.global_batch_tokens / _sequences  replaces the other
//
// Everything else merges as RFC 7386 merge patch (an object merges key by key, null deletes a key).
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"

namespace hzp {

// `resolved` with `overrides` applied; kInvalidInput when `overrides` (or one of its sections) is not an
// object where the scenario has one.
Result<nlohmann::json> apply_overrides(const nlohmann::json& resolved, const nlohmann::json& overrides);

// One `--set PATH=VALUE` on a scenario document as written (before presets resolve, so it means what the same
// field would in the file): PATH is dot-separated keys ("training.micro_batch"), created where missing; VALUE
// is JSON when it parses as JSON (2, 0.5, true, null, [1,2], {"a":1}, "quoted") and a string otherwise
// (zero3, llama2-7b); null deletes the key (but model.moe=null and model.mla=null remove the preset's, as in a
// scenario file). kInvalidInput naming the assignment when there is no '=', an empty
// key, or a key below a value that is not an object.
Status apply_set(nlohmann::json& doc, std::string_view assignment);

}  // namespace hzp
