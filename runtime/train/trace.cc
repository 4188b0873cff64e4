#include "train/trace.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>

#include "files.h"
#include "scenario_parser.h"

namespace hzp::runtime {

nlohmann::json trace_events_json(const Schedule& schedule, int rank, const std::vector<TraceEvent>& events) {
  nlohmann::json out = nlohmann::json::array();
  const Program& program = schedule.program_of(rank);
  for (const TraceEvent& e : events) {
    const Op& op = program.ops[e.op];
    nlohmann::json j = {{"rank", rank},
                        {"step", e.step},
                        {"op", e.op},
                        {"stream", schedule.streams[e.stream]},
                        {"start_us", e.start_us},
                        {"end_us", e.end_us}};
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      j["kind"] = "compute";
      j["module"] = to_string(c->module);
      j["phase"] = to_string(c->phase);
      j["layer"] = c->layer;
      j["micro_batch"] = c->micro_batch;
    } else if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      j["kind"] = to_string(c->kind);
      j["payload"] = to_string(c->payload);
      j["layer"] = c->layer;
      j["micro_batch"] = c->micro_batch;
      j["bytes"] = e.bytes;
      j["group"] = schedule.rank_groups[rank][c->role];
      j["role"] = schedule.roles[c->role];
    } else if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) {
      j["kind"] = "optimizer_step";
      j["layer"] = o->layer;
      j["bucket"] = o->bucket;
    } else if (const auto* a = std::get_if<BufferAcquireOp>(&op.body)) {
      j["kind"] = "acquire";
      j["pool"] = schedule.pools[a->pool].name;
      j["layer"] = a->layer;
    } else if (const auto* r = std::get_if<BufferReleaseOp>(&op.body)) {
      j["kind"] = "release";
      j["pool"] = schedule.pools[r->pool].name;
      j["layer"] = r->layer;
    }
    out.push_back(std::move(j));
  }
  return out;
}

nlohmann::json merge_trace(const Scenario& scenario, const Schedule& schedule, const std::vector<nlohmann::json>& ranks) {
  nlohmann::json events = nlohmann::json::array();
  double t0 = std::numeric_limits<double>::infinity();
  for (const nlohmann::json& r : ranks)
    for (const nlohmann::json& e : r) {
      t0 = std::min(t0, e["start_us"].get<double>());
      events.push_back(e);
    }
  if (!std::isfinite(t0)) t0 = 0;
  for (nlohmann::json& e : events) {
    e["start_us"] = e["start_us"].get<double>() - t0;
    e["end_us"] = e["end_us"].get<double>() - t0;
  }
  std::stable_sort(events.begin(), events.end(), [](const nlohmann::json& a, const nlohmann::json& b) {
    return a["start_us"].get<double>() < b["start_us"].get<double>();
  });
  nlohmann::json groups = nlohmann::json::array();
  for (size_t g = 0; g < schedule.groups.size(); ++g)
    groups.push_back({{"index", g}, {"role", schedule.groups[g].role}, {"ranks", schedule.groups[g].ranks}});
  return {{"format", kTraceFormat},
          {"version", kTraceVersion},
          {"scenario", scenario.name},
          {"scenario_config", scenario_to_json(scenario)},
          {"policy", schedule.policy},
          {"world_size", schedule.world_size},
          {"gpus_per_node", schedule.gpus_per_node},
          {"model", {{"layers", scenario.model.layers}, {"hidden", scenario.model.hidden}, {"moe", scenario.model.has_moe}}},
          {"training",
           {{"seq_len", scenario.training.seq_len},
            {"micro_batch", scenario.training.micro_batch},
            {"global_batch_sequences", scenario.training.global_batch}}},
          {"streams", schedule.streams},
          {"groups", groups},
          {"events", events}};
}

nlohmann::json perfetto_from_trace(const nlohmann::json& trace) {
  nlohmann::json out = nlohmann::json::array();
  const std::vector<std::string> streams = trace["streams"].get<std::vector<std::string>>();
  for (int r = 0; r < trace["world_size"].get<int>(); ++r) {
    out.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"args", {{"name", "rank " + std::to_string(r)}}}});
    for (size_t s = 0; s < streams.size(); ++s)
      out.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", s}, {"args", {{"name", streams[s]}}}});
  }
  for (const nlohmann::json& e : trace["events"]) {
    const std::string stream = e["stream"].get<std::string>();
    const auto tid = std::find(streams.begin(), streams.end(), stream) - streams.begin();
    std::string name = e["kind"].get<std::string>();
    if (e.contains("module")) name = e["module"].get<std::string>() + " " + e["phase"].get<std::string>();
    if (e.contains("role")) name += " " + e["role"].get<std::string>();
    if (e.contains("layer")) name += " L" + std::to_string(e["layer"].get<int>());
    nlohmann::json args = e;
    out.push_back({{"ph", "X"},
                   {"name", name},
                   {"pid", e["rank"]},
                   {"tid", tid},
                   {"ts", e["start_us"]},
                   {"dur", e["end_us"].get<double>() - e["start_us"].get<double>()},
                   {"args", args}});
  }
  return {{"traceEvents", out}, {"displayTimeUnit", "ms"}};
}

Status write_json_atomic(const std::string& path, const nlohmann::json& doc, int indent) {
  return write_file_atomic(path, doc.dump(indent) + "\n");
}

}  // namespace hzp::runtime
