// Perfetto timelines (perfetto.h).
#include "shared/trace/perfetto.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

namespace hzp {

namespace {

void append_number(std::string& out, double value) {
  if (!std::isfinite(value)) {  // as nlohmann::json writes them
    out += "null";
    return;
  }
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, value);
  out.append(buf, ec == std::errc() ? end : buf);
}

}  // namespace

void append_json_string(std::string& out, const std::string& text) {
  out += '"';
  for (const char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(static_cast<unsigned char>(c)));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

void SpanArgs::key(const char* key) {
  text_ += text_.empty() ? "{" : ",";
  append_json_string(text_, key);
  text_ += ':';
}

SpanArgs& SpanArgs::add(const char* k, long long value) {
  key(k);
  text_ += std::to_string(value);
  return *this;
}

SpanArgs& SpanArgs::add(const char* k, double value) {
  key(k);
  append_number(text_, value);
  return *this;
}

SpanArgs& SpanArgs::add(const char* k, const char* value) {
  key(k);
  append_json_string(text_, value);
  return *this;
}

void PerfettoTimeline::event(const nlohmann::json& e) {
  if (!events_.empty()) events_ += ',';
  events_ += e.dump();
}

void PerfettoTimeline::process(int pid, const std::string& name) {
  event({{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
  event({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", pid}, {"args", {{"sort_index", pid}}}});
}

void PerfettoTimeline::thread(int pid, int tid, const std::string& name) {
  event({{"ph", "M"}, {"name", "thread_name"}, {"pid", pid}, {"tid", tid}, {"args", {{"name", name}}}});
}

void PerfettoTimeline::span_head(int pid, int tid, const std::string& name, const char* category, double start_us,
                                 double duration_us) {
  if (!events_.empty()) events_ += ',';
  events_ += "{\"name\":";
  append_json_string(events_, name);
  events_ += ",\"cat\":";
  append_json_string(events_, category);
  events_ += ",\"ph\":\"X\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid) + ",\"ts\":";
  append_number(events_, start_us);
  events_ += ",\"dur\":";
  append_number(events_, duration_us);
  events_ += ",\"args\":";
}

void PerfettoTimeline::span(int pid, int tid, const std::string& name, const char* category, double start_us,
                            double duration_us, const nlohmann::json& args) {
  span_head(pid, tid, name, category, start_us, duration_us);
  events_ += args.dump();
  events_ += '}';
}

void PerfettoTimeline::span(int pid, int tid, const std::string& name, const char* category, double start_us,
                            double duration_us, const SpanArgs& args) {
  span_head(pid, tid, name, category, start_us, duration_us);
  events_ += args.text();
  events_ += '}';
}

std::string PerfettoTimeline::to_text(const nlohmann::json& other) && {
  std::string text = "{\"traceEvents\":[";
  text += events_;
  events_.clear();
  events_.shrink_to_fit();
  text += "],\"displayTimeUnit\":\"ms\",\"otherData\":" + other.dump() + "}";
  return text;
}

nlohmann::json PerfettoTimeline::to_json(const nlohmann::json& other) && {
  return nlohmann::json::parse(std::move(*this).to_text(other));
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
