// Perfetto timelines (perfetto.h).
#include "shared/trace/perfetto.h"

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

}  // namespace hzp
