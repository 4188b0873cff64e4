// Runtime traces in the core's format (trace.h).
#include "runtime/train/trace.h"

#include <algorithm>
#include <limits>

#include "shared/base/files.h"
#include "shared/trace/perfetto.h"

namespace hzp::runtime {

Trace rank_trace(const Scenario& scenario, const Schedule& schedule, int rank,
                 const std::vector<ExecutedOp>& executed) {
  Trace t = trace_header(scenario, schedule);
  for (const ExecutedOp& x : executed)
    t.events.push_back(trace_event(schedule, rank, x.op, x.step, x.stream, x.start_us, x.end_us, x.bytes));
  return t;
}

Result<Trace> merge_traces(std::vector<Trace> ranks) {
  if (ranks.empty()) return Status::Internal("trace: nothing to merge");
  Trace out = std::move(ranks.front());
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    const Trace& t = ranks[r];
    if (t.world_size != out.world_size || t.streams != out.streams || t.groups.size() != out.groups.size() ||
        t.policy != out.policy)
      return Status::Internal("trace: the rank traces do not describe one run (rank file " + std::to_string(r) + ")");
    out.events.insert(out.events.end(), t.events.begin(), t.events.end());
  }
  double t0 = std::numeric_limits<double>::infinity();
  for (const TraceEvent& e : out.events) t0 = std::min(t0, e.start_us);
  if (out.events.empty()) t0 = 0;
  for (TraceEvent& e : out.events) {
    e.start_us -= t0;
    e.end_us -= t0;
  }
  std::stable_sort(out.events.begin(), out.events.end(),
                   [](const TraceEvent& a, const TraceEvent& b) { return a.start_us < b.start_us; });
  return out;
}

nlohmann::json perfetto_from_trace(const Trace& trace) {
  PerfettoTimeline timeline;  // the simulator's track and span names (perfetto.h), so the two line up
  for (int r = 0; r < trace.world_size; ++r) {
    timeline.process(r, timeline_gpu_name(r, trace.gpus_per_node));
    for (std::size_t s = 0; s < trace.streams.size(); ++s) timeline.thread(r, static_cast<int>(s), trace.streams[s]);
  }
  for (const TraceEvent& e : trace.events) {
    nlohmann::json args = {{"step", e.step}, {"op", e.op}, {"layer", e.layer}};
    std::string name;
    if (e.kind == TraceKind::kCompute) {
      name = timeline_compute_name(e.module, e.phase, e.layer);
      args["micro_batch"] = e.micro_batch;
    } else if (e.group >= 0) {
      name = timeline_collective_name(to_string(e.kind), e.payload, e.layer);
      args["bytes"] = e.bytes;
      args["group_role"] = trace.groups[e.group].role;
      args["micro_batch"] = e.micro_batch;
    } else if (e.kind == TraceKind::kOptimizerStep) {
      name = timeline_optimizer_name(e.bucket);
      args["bucket"] = e.bucket;
    } else {
      name = timeline_buffer_name(e.kind == TraceKind::kAcquire, e.pool >= 0 ? trace.pools[e.pool] : "?", e.layer);
    }
    timeline.span(e.rank, e.stream, name, e.group >= 0 ? "comm" : "compute", e.start_us, e.end_us - e.start_us,
                  std::move(args));
  }
  return std::move(timeline).to_json({{"scenario", trace.scenario}, {"policy", trace.policy}});
}

Status write_json_atomic(const std::string& path, const nlohmann::json& doc, int indent) {
  return write_file_atomic(path, doc.dump(indent) + "\n");
}

}  // namespace hzp::runtime
