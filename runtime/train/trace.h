// Runtime traces: the ops a rank executed, turned into the core's trace format (shared/trace/trace_format.h,
// traces/README.md), merged over ranks, and drawn as a Perfetto timeline.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/train/executor.h"
#include "shared/base/status.h"
#include "shared/ir/schedule.h"
#include "shared/scenario/scenario.h"
#include "shared/trace/trace_format.h"

namespace hzp::runtime {

// The trace of one rank: header (scenario, policy, world, streams, groups, pools) + its executed ops, times
// still absolute (microseconds of the host's steady clock).
Trace rank_trace(const Scenario& scenario, const Schedule& schedule, int rank, const std::vector<ExecutedOp>& executed);

// Every rank's trace into one: events of all ranks, times shifted so that the earliest starts at 0, sorted
// by start time. The headers must agree (kInternal otherwise).
Result<Trace> merge_traces(std::vector<Trace> ranks);

// Perfetto / chrome://tracing: one process per rank, one thread per stream.
nlohmann::json perfetto_from_trace(const Trace& trace);

// Writes `doc` to `path` atomically and durably (files.h).
Status write_json_atomic(const std::string& path, const nlohmann::json& doc, int indent = -1);

}  // namespace hzp::runtime
