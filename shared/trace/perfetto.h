// The one writer of Perfetto / chrome://tracing timelines (Chrome trace event JSON) for every executor:
// processes (GPUs, ranks) with threads (streams) and complete spans ("ph": "X") in microseconds.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace hzp {

class PerfettoTimeline {
 public:
  void process(int pid, const std::string& name);  // sorted by pid in the UI
  void thread(int pid, int tid, const std::string& name);
  void span(int pid, int tid, const std::string& name, const char* category, double start_us, double duration_us,
            nlohmann::json args);
  // {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": other}
  nlohmann::json to_json(nlohmann::json other = nlohmann::json::object()) &&;

 private:
  nlohmann::json events_ = nlohmann::json::array();
};

}  // namespace hzp
