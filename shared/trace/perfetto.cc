// Perfetto timelines (perfetto.h).
#include "shared/trace/perfetto.h"

#include <algorithm>

namespace hzp {

void PerfettoTimeline::process(int pid, const std::string& name) {
  events_.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
  events_.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
}

void PerfettoTimeline::thread(int pid, int tid, const std::string& name) {
  events_.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
}

void PerfettoTimeline::span(int pid, int tid, const std::string& name, const char* category, double start_us,
                            double duration_us, nlohmann::json args) {
  events_.push_back({{"name", name},
                     {"cat", category},
                     {"ph", "X"},
                     {"pid", pid},
                     {"tid", tid},
                     {"ts", start_us},
                     {"dur", duration_us},
                     {"args", std::move(args)}});
}

nlohmann::json PerfettoTimeline::to_json(nlohmann::json other) && {
  return {{"traceEvents", std::move(events_)}, {"displayTimeUnit", "ms"}, {"otherData", std::move(other)}};
}

std::string timeline_gpu_name(int rank, int gpus_per_node) {
  return "GPU " + std::to_string(rank) + " (node " + std::to_string(rank / std::max(1, gpus_per_node)) + ")";
}

std::string timeline_compute_name(ModuleKind module, Phase phase, int layer) {
  return std::string(to_string(module)) + " " + to_string(phase) + " L" + std::to_string(layer);
}

std::string timeline_collective_name(const char* kind, Payload payload, int layer) {
  return std::string(kind) + " " + to_string(payload) + " L" + std::to_string(layer);
}

std::string timeline_optimizer_name(int bucket) {
  return "optimizer_step B" + std::to_string(bucket);
}

std::string timeline_buffer_name(bool acquire, const std::string& pool, int layer) {
  return std::string(acquire ? "acquire " : "release ") + pool + " L" + std::to_string(layer);
}

}  // namespace hzp
