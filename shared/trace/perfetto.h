// The one writer of Perfetto / chrome://tracing timelines (Chrome trace event JSON) for every executor:
// processes (GPUs, ranks) with threads (streams) and complete spans ("ph": "X") in microseconds.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "shared/ir/schedule.h"

namespace hzp {

// The names every timeline gives its tracks and spans — the simulator's (sim/report.cc) and a recorded run's
// (hzp train --perfetto) — so that the two of one schedule line up side by side:
//   process  "GPU 3 (node 1)"                  (the simulator adds ", stage 2" when pipelined)
//   thread   the stream's name                 "compute", "param_gather", ...
//   span     "attention fwd L3"                compute: module, phase, layer (-1 embedding, L head)
//            "all_gather params L3"            collectives: kind, payload, layer
//            "optimizer_step B2"               the optimizer step of gradient bucket 2
//            "acquire param_gather L3"         a buffer pool slot taken ("release ..." given back)
std::string timeline_gpu_name(int rank, int gpus_per_node);
std::string timeline_compute_name(ModuleKind module, Phase phase, int layer);
std::string timeline_collective_name(const char* kind, Payload payload, int layer);
std::string timeline_optimizer_name(int bucket);
std::string timeline_buffer_name(bool acquire, const std::string& pool, int layer);

// JSON text of a span's "args", written as it is built (a timeline of 500k spans as nlohmann::json objects took
// ~20 µs a span to build and dump; the simulator writes them straight to text).
class SpanArgs {
 public:
  SpanArgs& add(const char* key, long long value);
  SpanArgs& add(const char* key, double value);  // shortest text that reads back the same; null if not finite
  SpanArgs& add(const char* key, const char* value);
  std::string text() const { return text_.empty() ? "{}" : text_ + "}"; }

 private:
  void key(const char* key);
  std::string text_;
};

// `text` as a JSON string (quotes, backslashes and control characters escaped), appended to `out`.
void append_json_string(std::string& out, const std::string& text);

class PerfettoTimeline {
 public:
  void process(int pid, const std::string& name);  // sorted by pid in the UI
  void thread(int pid, int tid, const std::string& name);
  void span(int pid, int tid, const std::string& name, const char* category, double start_us, double duration_us,
            const nlohmann::json& args);
  void span(int pid, int tid, const std::string& name, const char* category, double start_us, double duration_us,
            const SpanArgs& args);
  // {"traceEvents": [...], "displayTimeUnit": "ms", "otherData": other}, as text and as a document.
  std::string to_text(const nlohmann::json& other = nlohmann::json::object()) &&;
  nlohmann::json to_json(const nlohmann::json& other = nlohmann::json::object()) &&;

 private:
  void event(const nlohmann::json& e);
  void span_head(int pid, int tid, const std::string& name, const char* category, double start_us, double duration_us);
  std::string events_;  // the events' text, comma-separated
};

}  // namespace hzp
