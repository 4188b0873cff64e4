// Runtime traces (format documented in traces/README.md): every executed op of every rank with its stream,
// kind, layer, micro-batch, bytes, group and start/end time, in one versioned JSON document — the format
// the simulator's replay reads — plus an optional Perfetto (Chrome trace event) timeline.
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "schedule.h"
#include "scenario.h"
#include "status.h"
#include "train/executor.h"

namespace hzp::runtime {

inline constexpr const char* kTraceFormat = "hzp-trace";
inline constexpr int kTraceVersion = 1;

// The events of one rank as JSON objects (times still absolute, in microseconds).
nlohmann::json trace_events_json(const Schedule& schedule, int rank, const std::vector<TraceEvent>& events);

// The whole trace: header (scenario, policy, world, streams, groups) + every rank's events, times shifted
// so that the earliest event starts at 0 and events sorted by start time.
nlohmann::json merge_trace(const Scenario& scenario, const Schedule& schedule, const std::vector<nlohmann::json>& ranks);

// Perfetto / chrome://tracing: one process per rank, one thread per stream.
nlohmann::json perfetto_from_trace(const nlohmann::json& trace);

// Writes `doc` to `path` atomically (temp file + rename).
Status write_json_atomic(const std::string& path, const nlohmann::json& doc, int indent = -1);

}  // namespace hzp::runtime
