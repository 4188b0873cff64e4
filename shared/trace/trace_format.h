// hzp traces, format version 1 (traces/README.md): every executed op of every rank with its stream, kind,
// unit, micro-batch, bytes, group and start/end time, plus the resolved scenario that produced it — what
// the runtime records (`hzp train --trace`) and what a replay reads. In the core so that every executor
// and tool reads and writes one format without linking the runtime.
//
// Reading is strict and bounded: a file over kMaxTraceBytes or kMaxTraceEvents is refused before it is
// decoded; every field is type- and range-checked; an event that names a stream, group or rank the header
// does not have, or that overlaps the previous event of its (rank, stream) — a stream runs one op at a
// time — is an error naming the event's index and field.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"
#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/scenario/scenario.h"

namespace hzp {

inline constexpr const char* kTraceFormat = "hzp-trace";
inline constexpr int kTraceVersion = 1;
inline constexpr std::size_t kMaxTraceBytes = 256u << 20;
// The most bytes one event's collective may record (1 PiB): what trace files are read with.
inline constexpr std::int64_t kMaxEventBytes = std::int64_t{1} << 50;
inline constexpr std::int64_t kMaxTraceEvents = 2'000'000;
inline constexpr std::int64_t kMaxTraceSteps = 10'000;            // consecutive steps (renumbered from 0)
inline constexpr double kMaxTraceMicroseconds = 365.0 * 86400e6;  // times within a year of the first event

enum class TraceKind {
  kCompute,
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kAllToAll,
  kOptimizerStep,
  kAcquire,
  kRelease
};
const char* to_string(TraceKind kind);
TraceKind trace_kind(CollectiveKind kind);

// One executed op. Fields that do not apply to the kind keep their defaults.
struct TraceEvent {
  int rank = 0;
  std::int64_t step = 0;
  int op = 0;      // index in the rank's program (`hzp schedule --rank R`)
  int stream = 0;  // index into Trace::streams
  TraceKind kind = TraceKind::kCompute;
  double start_us = 0;
  double end_us = 0;
  int layer = -1;                              // unit: -1 embedding, 0..L-1 layers, L head
  int micro_batch = -1;                        // compute and collectives
  ModuleKind module = ModuleKind::kEmbedding;  // compute
  Phase phase = Phase::kForward;               // compute
  std::int64_t bytes = -1;                     // collectives: the full buffer as nccl-tests counts it, as executed
  Payload payload = Payload::kParams;          // collectives
  int group = -1;                              // collectives: index into Trace::groups
  int bucket = -1;                             // optimizer steps
  int pool = -1;                               // acquire / release: index into Trace::pools
};

struct TraceGroup {
  std::string role;
  std::vector<int> ranks;
};

struct Trace {
  std::string scenario;            // scenario name
  nlohmann::json scenario_config;  // the resolved scenario (as `hzp validate` prints it)
  std::string policy;
  int world_size = 0;
  int gpus_per_node = 0;
  std::vector<std::string> streams;
  std::vector<TraceGroup> groups;
  std::vector<std::string> pools;
  std::vector<TraceEvent> events;  // sorted by start time
};

// A trace's header for a run of `schedule`, built from `scenario`: its name and resolved configuration,
// policy, world, streams, groups and pools; no events.
Trace trace_header(const Scenario& scenario, const Schedule& schedule);

// The event of op `op` of `rank`'s program run in `step` on `stream` from `start_us` to `end_us`, its
// fields (kind, unit, micro-batch, module, phase, group, bucket, pool) taken from the op; `bytes` is what a
// collective moved as executed (ignored for other kinds).
TraceEvent trace_event(const Schedule& schedule, int rank, int op, std::int64_t step, int stream, double start_us,
                       double end_us, std::int64_t bytes);

// The document of traces/README.md. `model` and `training` summaries are taken from scenario_config.
nlohmann::json trace_to_json(const Trace& trace);
// The same document as compact text (trace_to_json(t).dump()), made one event at a time: a tree of 2 M
// events would take ~2 GB. kInvalidInput once the text passes `max_bytes` (load_trace_file refuses more
// than kMaxTraceBytes).
Result<std::string> trace_json_text(const Trace& trace, std::size_t max_bytes = kMaxTraceBytes);
Result<Trace> trace_from_json(const nlohmann::json& doc);
Result<Trace> load_trace_file(const std::string& path);

}  // namespace hzp
