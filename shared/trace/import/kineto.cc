// PyTorch profiler traces into hzp traces (kineto.h).
#include "shared/trace/import/kineto.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <tuple>
#include <variant>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"

namespace hzp {
namespace {

using nlohmann::json;

struct Range {
  double start = 0;
  double end = 0;
};

// One "X" (complete) event, its fields checked.
struct Span {
  std::string cat;
  std::string name;
  double start = 0;
  double end = 0;
  const json* args = nullptr;
};

std::string at_event(const std::string& source, std::size_t index, const char* field) {
  return printable(source, 200) + ": traceEvents[" + std::to_string(index) + "]" + (*field == '\0' ? "" : ".") + field +
         ": ";
}

Result<double> number_field(const json& e, const char* key, const std::string& source, std::size_t index) {
  auto it = e.find(key);
  if (it == e.end() || !it->is_number())
    return Status::InvalidInput(at_event(source, index, key) + "missing or not a number");
  const double v = it->get<double>();
  if (!std::isfinite(v) || v < 0 || v > 1e18)
    return Status::InvalidInput(at_event(source, index, key) + "must be a finite time in [0, 1e18] us");
  return v;
}

std::optional<std::int64_t> int_arg(const json* args, const char* key) {
  if (args == nullptr) return std::nullopt;
  auto it = args->find(key);
  if (it == args->end() || !it->is_number_integer()) return std::nullopt;
  return it->get<std::int64_t>();
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
bool starts_with(const std::string& s, const std::string& head) {
  return s.rfind(head, 0) == 0;
}
bool contains(const std::string& s, const char* part) {
  return s.find(part) != std::string::npos;
}

std::optional<KinetoPhase> phase_of_annotation(const std::string& name) {
  if (name == "forward" || ends_with(name, ".forward") || name == "## forward ##") return KinetoPhase::kForward;
  if (name == "backward" || ends_with(name, ".backward") || name == "## backward ##") return KinetoPhase::kBackward;
  if (name == "optimizer" || starts_with(name, "Optimizer.step") || starts_with(name, "Optimizer.zero_grad"))
    return KinetoPhase::kOptimizer;
  return std::nullopt;
}

std::optional<TraceKind> nccl_kind(const std::string& kernel) {
  if (contains(kernel, "AllReduce")) return TraceKind::kAllReduce;
  if (contains(kernel, "AllGather")) return TraceKind::kAllGather;
  if (contains(kernel, "ReduceScatter")) return TraceKind::kReduceScatter;
  if (contains(kernel, "Broadcast")) return TraceKind::kBroadcast;
  if (contains(kernel, "SendRecv") || contains(kernel, "AllToAll")) return TraceKind::kAllToAll;
  return std::nullopt;
}

std::optional<TraceKind> gloo_kind(const std::string& op) {
  if (op == "all_reduce" || op == "allreduce") return TraceKind::kAllReduce;
  if (op == "all_gather" || op == "allgather" || op == "all_gather_into_tensor") return TraceKind::kAllGather;
  if (op == "reduce_scatter" || op == "reduce_scatter_tensor") return TraceKind::kReduceScatter;
  if (op == "broadcast") return TraceKind::kBroadcast;
  if (op == "all_to_all" || op == "alltoall" || op == "alltoall_base") return TraceKind::kAllToAll;
  return std::nullopt;
}

int dtype_bytes(const std::string& dtype) {
  if (dtype == "Double" || dtype == "Long" || dtype == "ComplexFloat") return 8;
  if (dtype == "Float" || dtype == "Int") return 4;
  if (dtype == "BFloat16" || dtype == "Half" || dtype == "Short") return 2;
  if (dtype == "Byte" || dtype == "Char" || dtype == "Bool" || starts_with(dtype, "Float8")) return 1;
  return 0;
}

// Kernel families by name, as cuBLAS, cuBLASLt (nvjet), CUTLASS and PyTorch's ATen name them.
bool is_gemm(const std::string& kernel) {
  std::string lower = kernel;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  return (contains(lower, "gemm") || starts_with(lower, "nvjet") || contains(lower, "cutlass") ||
          contains(lower, "xmma")) &&
         !contains(lower, "splitkreduce");
}
bool is_routing(const std::string& kernel) {
  return contains(kernel, "gather") || contains(kernel, "scatter") || contains(kernel, "index");
}

// Ranges merged where they overlap or nest, by start (back-to-back ProfilerStep ranges stay two steps).
std::vector<Range> merged(std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.start < b.start; });
  std::vector<Range> out;
  for (const Range& r : ranges) {
    if (!out.empty() && r.start < out.back().end)
      out.back().end = std::max(out.back().end, r.end);
    else
      out.push_back(r);
  }
  return out;
}

bool inside(const std::vector<Range>& ranges, double t) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), t, [](double v, const Range& r) { return v < r.start; });
  return it != ranges.begin() && t <= std::prev(it)->end;
}

// The first range starting at or after `t` (ranges by start), or nullptr.
const Range* first_from(const std::vector<Range>& ranges, double t) {
  auto it = std::lower_bound(ranges.begin(), ranges.end(), t, [](const Range& r, double v) { return r.start < v; });
  return it == ranges.end() ? nullptr : &*it;
}

}  // namespace

const char* to_string(KinetoPhase phase) {
  switch (phase) {
    case KinetoPhase::kForward:
      return "forward";
    case KinetoPhase::kBackward:
      return "backward";
    case KinetoPhase::kOptimizer:
      return "optimizer";
  }
  return "?";
}

namespace {

// distributedInfo (rank, world size) and deviceProperties[0].name.
Status read_header(const json& doc, const std::string& shown, KinetoProfile& p) {
  if (auto d = doc.find("distributedInfo"); d != doc.end()) {
    // Present but not the profiler's object: its rank would be taken as not recorded.
    if (!d->is_object())
      return Status::InvalidInput(shown + ": distributedInfo: expected the profiler's object, got " +
                                  printable(d->dump(), 60));
    // Read as 64 bits and checked before narrowing: a rank of 2^40 read as an int was rank 0. A field that is
    // present must be a whole number in range: a rank of -1, 1.5 or "1" was read as "no rank recorded".
    long long rank = p.rank, world_size = p.world_size;
    for (auto [key, value, lowest] : {std::tuple{"rank", &rank, 0LL}, std::tuple{"world_size", &world_size, 1LL}}) {
      auto f = d->find(key);
      if (f == d->end()) continue;
      if (!f->is_number_integer() || f->get<long long>() < lowest || f->get<long long>() > 1'000'000)
        return Status::InvalidInput(shown + ": distributedInfo." + key + ": expected a whole number in [" +
                                    std::to_string(lowest) + ", 1000000], got " + printable(f->dump(), 60));
      *value = f->get<long long>();
    }
    if (rank >= 0 && world_size > 0 && rank >= world_size)
      return Status::InvalidInput(shown + ": distributedInfo: rank " + std::to_string(rank) + " of world_size " +
                                  std::to_string(world_size) + " is not a rank of that world");
    p.rank = static_cast<int>(rank);
    p.world_size = static_cast<int>(world_size);
  }
  if (auto d = doc.find("deviceProperties"); d != doc.end()) {
    // Present but not the profiler's array of objects: the GPU check would be skipped ("device not named").
    if (!d->is_array() || (!d->empty() && !(*d)[0].is_object()))
      return Status::InvalidInput(shown + ": deviceProperties: expected the profiler's array of device objects, got " +
                                  printable(d->dump(), 60));
    if (!d->empty())
      if (auto n = (*d)[0].find("name"); n != (*d)[0].end() && n->is_string())
        p.device = printable(n->get<std::string>(), 80);
  }
  return Status::Ok();
}

// The events of a trace that matter, sorted into what they are.
struct Spans {
  std::vector<Span> gpu;                                 // kernels, memcpys, memsets
  std::vector<Span> gpu_annotations;                     // gloo's GPU ranges
  std::vector<Span> comms;                               // record_param_comms CPU calls
  std::vector<Span> gloo;                                // gloo's CPU ranges
  std::vector<Range> steps;                              // ProfilerStep#N
  std::array<std::vector<Range>, kKinetoPhases> phases;  // CPU annotations per phase, merged
  std::map<std::int64_t, double> launch;                 // correlation -> CPU launch time
};

// One "X" event of traceEvents[i], its fields checked; nullopt for the other phases (metadata, flows).
Result<std::optional<Span>> read_span(const json& e, const std::string& source, std::size_t i) {
  if (!e.is_object()) return Status::InvalidInput(at_event(source, i, "") + "not an object");
  auto ph = e.find("ph");
  if (ph == e.end() || !ph->is_string() || *ph != "X") return std::optional<Span>();
  Span s;
  if (auto c = e.find("cat"); c != e.end() && c->is_string()) s.cat = c->get<std::string>();
  auto name = e.find("name");
  if (name == e.end() || !name->is_string()) return Status::InvalidInput(at_event(source, i, "name") + "missing");
  s.name = name->get<std::string>();
  HZP_ASSIGN_OR_RETURN(s.start, number_field(e, "ts", source, i));
  HZP_ASSIGN_OR_RETURN(double dur, number_field(e, "dur", source, i));
  s.end = s.start + dur;
  if (auto a = e.find("args"); a != e.end() && a->is_object()) s.args = &*a;
  return std::optional<Span>(std::move(s));
}

Result<Spans> collect_spans(const json& events, const std::string& source) {
  Spans out;
  for (std::size_t i = 0; i < events.size(); ++i) {
    HZP_ASSIGN_OR_RETURN(std::optional<Span> span, read_span(events[i], source, i));
    if (!span) continue;
    Span& s = *span;
    if (s.cat == "kernel" || s.cat == "gpu_memcpy" || s.cat == "gpu_memset") {
      if (!int_arg(s.args, "correlation"))
        return Status::InvalidInput(at_event(source, i, "args.correlation") + "missing on GPU work");
      out.gpu.push_back(std::move(s));
    } else if (s.cat == "cuda_runtime" || s.cat == "cuda_driver") {
      if (auto c = int_arg(s.args, "correlation")) out.launch[*c] = s.start;
    } else if (s.cat == "user_annotation") {
      if (starts_with(s.name, "ProfilerStep#")) {
        out.steps.push_back({s.start, s.end});
      } else if (starts_with(s.name, "gloo:")) {
        out.gloo.push_back(std::move(s));
      } else if (auto phase = phase_of_annotation(s.name)) {
        out.phases[static_cast<int>(*phase)].push_back({s.start, s.end});
      }
    } else if (s.cat == "gpu_user_annotation") {
      if (starts_with(s.name, "gloo:")) out.gpu_annotations.push_back(std::move(s));
    } else if (s.cat == "cpu_op" && s.name == "record_param_comms") {
      out.comms.push_back(std::move(s));
    }
  }
  for (auto& r : out.phases) r = merged(std::move(r));
  std::sort(out.comms.begin(), out.comms.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  return out;
}

// Where a CPU time falls: its step (ProfilerStep ranges, else one per forward range) and phase.
class StepLocator {
 public:
  StepLocator(std::vector<Range> steps, const std::array<std::vector<Range>, kKinetoPhases>& phases)
      : forward_(phases[0]), backward_(phases[1]), optimizer_(phases[2]) {
    if (steps.empty()) {
      for (std::size_t k = 0; k < forward_.size(); ++k)
        steps.push_back({forward_[k].start,
                         k + 1 < forward_.size() ? forward_[k + 1].start : std::numeric_limits<double>::infinity()});
    } else {
      steps = merged(std::move(steps));
    }
    steps_ = std::move(steps);
  }
  std::size_t steps() const { return steps_.size(); }
  bool has_forward() const { return !forward_.empty(); }

  // The step of a CPU time, -1 when none.
  int step_of(double t) const {
    auto it = std::upper_bound(steps_.begin(), steps_.end(), t, [](double v, const Range& r) { return v < r.start; });
    if (it == steps_.begin() || t > std::prev(it)->end) return -1;
    return static_cast<int>(std::prev(it) - steps_.begin());
  }

  // The step and phase of a launch: forward / optimizer / backward ranges; between a step's forward end and
  // its optimizer start, backward (autograd launches from its own thread).
  std::optional<std::pair<int, KinetoPhase>> locate(double t) const {
    const int step = step_of(t);
    if (step < 0) return std::nullopt;
    if (inside(forward_, t)) return std::pair{step, KinetoPhase::kForward};
    if (inside(optimizer_, t)) return std::pair{step, KinetoPhase::kOptimizer};
    if (inside(backward_, t)) return std::pair{step, KinetoPhase::kBackward};
    const Range& st = steps_[step];
    const Range* fwd = first_from(forward_, st.start);
    if (fwd == nullptr || fwd->start > st.end || t < fwd->end) return std::nullopt;
    const Range* opt = first_from(optimizer_, fwd->end);
    if (opt != nullptr && opt->start <= st.end && t > opt->start) return std::nullopt;  // after the optimizer
    return std::pair{step, KinetoPhase::kBackward};
  }

 private:
  const std::vector<Range>& forward_;
  const std::vector<Range>& backward_;
  const std::vector<Range>& optimizer_;
  std::vector<Range> steps_;
};

// An NCCL kernel as a collective, sized by the record_param_comms call that launched it (the latest one
// starting at or before the launch). A call whose size cannot be read leaves the size to the schedule; it
// is counted in `p` (the eighth attack of issue 35: such calls were replaced without a word).
KinetoCollective nccl_collective(const Span& kernel, TraceKind kind, double launched, const std::vector<Span>& comms,
                                 KinetoProfile& p) {
  KinetoCollective c{kind, -1, kernel.start, kernel.end, "nccl"};
  auto it = std::upper_bound(comms.begin(), comms.end(), launched, [](double v, const Span& x) { return v < x.start; });
  if (it != comms.begin() && std::prev(it)->end >= launched) {
    const Span& call = *std::prev(it);
    const char* count_key = kind == TraceKind::kAllGather ? "Out msg nelems" : "In msg nelems";
    auto n = int_arg(call.args, count_key);
    std::string dtype;
    if (auto d = call.args != nullptr ? call.args->find("dtype") : json::const_iterator{};
        call.args != nullptr && d != call.args->end() && d->is_string())
      dtype = d->get<std::string>();
    // A size past what a trace records (1 PiB) would be written and then refused by replay: unreadable too.
    if (n && *n >= 0 && dtype_bytes(dtype) > 0 && *n <= kMaxEventBytes / dtype_bytes(dtype)) {
      c.bytes = *n * dtype_bytes(dtype);
    } else if (p.collectives_unsized++ == 0) {
      const auto shown = [&](const char* key) {
        if (call.args == nullptr || !call.args->contains(key)) return std::string("missing");
        return printable((*call.args)[key].dump(), 40);
      };
      p.unsized_example = std::string(count_key) + " " + shown(count_key) + ", dtype " + shown("dtype");
    }
  }
  return c;
}

// GPU work into each step's phases (compute) and collectives (NCCL kernels).
void attribute_gpu_work(const Spans& spans, const StepLocator& where, KinetoProfile& p) {
  for (const Span& s : spans.gpu) {
    ++p.gpu_events;
    auto l = spans.launch.find(*int_arg(s.args, "correlation"));
    const double at = l != spans.launch.end() ? l->second : s.start;
    const bool nccl = s.cat == "kernel" && (starts_with(s.name, "nccl") || contains(s.name, "ncclDevKernel"));
    if (nccl) {
      auto kind = nccl_kind(s.name);
      const int step = where.step_of(at);
      if (kind && step >= 0) p.steps[step].collectives.push_back(nccl_collective(s, *kind, at, spans.comms, p));
      continue;
    }
    if (s.cat == "gpu_memcpy" && !contains(s.name, "DtoD")) continue;  // host copies: gloo's or the data's
    auto located = where.locate(at);
    if (!located) {
      ++p.unattributed;
      p.unattributed_us += s.end - s.start;
      continue;
    }
    KinetoStep& st = p.steps[located->first];
    const int ph = static_cast<int>(located->second);
    st.busy_us[ph] += s.end - s.start;
    if (st.first_us[ph] == 0 || s.start < st.first_us[ph]) st.first_us[ph] = s.start;
    st.last_us[ph] = std::max(st.last_us[ph], s.end);
    if (s.cat == "kernel") {
      st.kernel_us += s.end - s.start;
      st.gemm_kernels += is_gemm(s.name) ? 1 : 0;
      st.routing_kernels += is_routing(s.name) ? 1 : 0;
    }
  }
}

// gloo: the k-th CPU range of a name pairs with the k-th GPU range of that name, whose host-to-device
// copies are the collective's result.
void attribute_gloo(Spans& spans, const StepLocator& where, KinetoProfile& p) {
  std::map<std::string, std::vector<const Span*>> gpu_by_name;
  std::sort(spans.gpu_annotations.begin(), spans.gpu_annotations.end(),
            [](const Span& a, const Span& b) { return a.start < b.start; });
  for (const Span& a : spans.gpu_annotations) gpu_by_name[a.name].push_back(&a);
  std::sort(spans.gloo.begin(), spans.gloo.end(), [](const Span& a, const Span& b) { return a.start < b.start; });
  std::map<std::string, std::size_t> seen;
  std::vector<const Span*> host_copies;
  for (const Span& s : spans.gpu)
    if (s.cat == "gpu_memcpy" && contains(s.name, "HtoD")) host_copies.push_back(&s);
  // By start, so that each range visits only the copies that start inside it (a scan of every copy per
  // range took 29 s for 100 k of each).
  std::sort(host_copies.begin(), host_copies.end(), [](const Span* a, const Span* b) { return a->start < b->start; });
  for (const Span& s : spans.gloo) {
    const std::size_t k = seen[s.name]++;
    auto kind = gloo_kind(s.name.substr(5));
    const int step = where.step_of(s.start);
    if (!kind) {
      ++p.collectives_unknown;
      continue;
    }
    if (step < 0) continue;
    KinetoCollective c{*kind, -1, s.start, s.end, "gloo"};
    auto g = gpu_by_name.find(s.name);
    if (g != gpu_by_name.end() && k < g->second.size()) {
      const Span& range = *g->second[k];
      const std::int64_t stream = int_arg(range.args, "stream").value_or(-1);
      std::int64_t bytes = 0;
      auto first = std::lower_bound(host_copies.begin(), host_copies.end(), range.start,
                                    [](const Span* copy, double start) { return copy->start < start; });
      for (auto it = first; it != host_copies.end() && (*it)->start <= range.end; ++it) {
        const Span* copy = *it;
        if (stream < 0 || int_arg(copy->args, "stream").value_or(-2) == stream || !int_arg(copy->args, "stream"))
          bytes += int_arg(copy->args, "bytes").value_or(0);
      }
      if (bytes > 0) c.bytes = bytes;
    }
    p.steps[step].collectives.push_back(c);
  }
}

// A CUDA stream runs one kernel (copy, memset) at a time: its GPU events may touch, never overlap by more than
// the profiler's rounding (the repo's H100 traces: 4 us of 222 ms, at most 0.3 us at once). Events that
// overlap by more than kMaxStreamOverlap of the stream's time (and 1 ms) were edited or merged from
// several streams, and their times cannot be a step's.
constexpr double kMaxStreamOverlap = 0.01;
Status check_streams_serial(const std::vector<Span>& gpu, const std::string& shown) {
  std::map<std::int64_t, std::vector<std::pair<double, double>>> by_stream;
  for (const Span& s : gpu) by_stream[int_arg(s.args, "stream").value_or(-1)].emplace_back(s.start, s.end);
  for (auto& [stream, spans] : by_stream) {
    std::sort(spans.begin(), spans.end());
    double busy = 0, overlap = 0, end = -std::numeric_limits<double>::infinity();
    for (const auto& [a, b] : spans) {
      busy += b - a;
      if (a < end) overlap += std::min(end, b) - a;
      end = std::max(end, b);
    }
    if (overlap > std::max(1e3, kMaxStreamOverlap * busy)) {
      char text[160];
      std::snprintf(text, sizeof text, "GPU stream %lld's events overlap for %.4g ms of their %.4g ms",
                    static_cast<long long>(stream), overlap / 1e3, busy / 1e3);
      return Status::InvalidInput(shown + ": " + text +
                                  ": a CUDA stream runs one kernel at a time (durations edited, or events of "
                                  "several streams merged into one)");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<KinetoProfile> read_kineto(const json& doc, const std::string& source) {
  const std::string shown = printable(source, 200);
  if (!doc.is_object() || !doc.contains("traceEvents") || !doc["traceEvents"].is_array())
    return Status::InvalidInput(shown + ": not a PyTorch profiler trace (no traceEvents array)");
  const json& events = doc["traceEvents"];
  if (static_cast<std::int64_t>(events.size()) > kMaxKinetoEvents)
    return Status::InvalidInput(shown + ": " + std::to_string(events.size()) + " events, more than the " +
                                std::to_string(kMaxKinetoEvents) + " accepted");
  KinetoProfile p;
  p.source = source;
  HZP_RETURN_IF_ERROR(read_header(doc, shown, p));
  HZP_ASSIGN_OR_RETURN(Spans spans, collect_spans(events, source));
  const StepLocator where(std::move(spans.steps), spans.phases);
  if (where.steps() == 0 || !where.has_forward())
    return Status::InvalidInput(
        shown +
        ": no training step found: the trace needs forward ranges (record_function(\"forward\") "
        "or DistributedDataParallel.forward / FullyShardedDataParallel.forward)");
  HZP_RETURN_IF_ERROR(check_streams_serial(spans.gpu, shown));
  p.steps.resize(where.steps());
  attribute_gpu_work(spans, where, p);
  attribute_gloo(spans, where, p);
  for (KinetoStep& st : p.steps)
    std::sort(st.collectives.begin(), st.collectives.end(),
              [](const KinetoCollective& a, const KinetoCollective& b) { return a.start_us < b.start_us; });
  // A trailing step with no GPU work (the profile ended inside it) is not a step.
  while (!p.steps.empty()) {
    const KinetoStep& last = p.steps.back();
    if (last.busy_us[0] + last.busy_us[1] + last.busy_us[2] > 0) break;
    p.steps.pop_back();
  }
  if (p.steps.empty()) return Status::InvalidInput(shown + ": its steps hold no GPU work (a CPU-only profile?)");
  double kernel_us = 0;
  for (const KinetoStep& st : p.steps) kernel_us += st.kernel_us;
  if (kernel_us <= 0)
    return Status::InvalidInput(shown + ": its steps run no GPU kernel time (no kernels, or every kernel's dur is 0)");
  return p;
}

namespace {

// The GPU family a name holds ("NVIDIA H100 80GB HBM3", "h100-sxm" -> "h100"), empty when none is known.
std::string gpu_family(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  for (const char* family : {"a100", "a800", "h100", "h800", "h200", "b200", "gb200", "l40", "v100", "mi250", "mi300"})
    if (contains(name, family)) return family;
  return "";
}

}  // namespace

Status check_kineto_against(const std::vector<KinetoProfile>& profiles, const Scenario& scenario) {
  const std::string expected = gpu_family(scenario.cluster.gpu.type);
  long long routing = 0, steps = 0;
  for (const KinetoProfile& p : profiles) {
    const std::string recorded = gpu_family(p.device);
    if (!expected.empty() && !recorded.empty() && recorded != expected)
      return Status::InvalidInput(printable(p.source, 200) + " ran on " + p.device +
                                  ", the scenario's cluster.gpu is \"" + scenario.cluster.gpu.type +
                                  "\": give the scenario of the recorded run (hzp import --no-check skips this check)");
    for (const KinetoStep& s : p.steps) routing += s.routing_kernels;
    steps += static_cast<long long>(p.steps.size());
  }
  if (steps == 0) return Status::Ok();
  // Per layer, micro-batch and step: a MoE routes tokens with several gathers, scatters and index kernels per
  // layer (forward and backward), a dense model has about none (the embedding's).
  const double per_layer = static_cast<double>(routing) / static_cast<double>(steps) /
                           static_cast<double>(scenario.model.layers * scenario.grad_accum_steps());
  const std::string why = " (" + std::to_string(per_layer).substr(0, 4) +
                          " gather / scatter / index kernels per layer, micro-batch and step; hzp import --no-check "
                          "skips this check)";
  if (scenario.model.has_moe && per_layer < 1)
    return Status::InvalidInput("the scenario's model has MoE layers but the trace shows no token routing" + why);
  if (!scenario.model.has_moe && per_layer >= 4)
    return Status::InvalidInput("the trace routes tokens as a MoE does but the scenario's model has no MoE layers" +
                                why);
  return Status::Ok();
}

Result<KinetoProfile> load_kineto_file(const std::string& path) {
  HZP_ASSIGN_OR_RETURN(std::string text, read_maybe_gzip_file(path, kMaxKinetoBytes));
  // A profiler event is one object with one "args" object: three per event leaves room for the metadata.
  Result<json> doc = parse_json_strict(
      text, JsonLimits{static_cast<std::size_t>(kMaxKinetoBytes), kMaxJsonDepth, 0, 3 * kMaxKinetoEvents});
  if (!doc.ok()) return Status::InvalidInput(printable(path, 200) + ": " + doc.status().message());
  text.clear();
  text.shrink_to_fit();
  return read_kineto(*doc, path);
}

namespace {

KinetoPhase kineto_phase(Phase phase) {
  return phase == Phase::kForward ? KinetoPhase::kForward : KinetoPhase::kBackward;
}

// The i-th recorded instance of a kind in a step: the members' latest start and latest end.
struct Instance {
  double start = 0;
  double end = 0;
  std::int64_t bytes = -1;
};
using Recorded = std::map<TraceKind, std::vector<Instance>>;

// One profile per rank, in rank order: by distributedInfo.rank when every file has one, else as given.
Status order_profiles(std::vector<KinetoProfile>& profiles, int world) {
  if (static_cast<int>(profiles.size()) != world)
    return Status::InvalidInput("the scenario has " + std::to_string(world) + " rank" + (world == 1 ? "" : "s") + "; " +
                                std::to_string(profiles.size()) + " profiler file" +
                                (profiles.size() == 1 ? " was" : "s were") + " given (one per rank)");
  for (const KinetoProfile& p : profiles)
    if (p.world_size > 0 && p.world_size != world)
      return Status::InvalidInput(printable(p.source, 200) + ": distributedInfo.world_size " +
                                  std::to_string(p.world_size) + ", but the scenario has " + std::to_string(world) +
                                  " rank" + (world == 1 ? "" : "s"));
  const auto has_rank = [](const KinetoProfile& p) { return p.rank >= 0; };
  const auto with = std::find_if(profiles.begin(), profiles.end(), has_rank);
  const auto without = std::find_if_not(profiles.begin(), profiles.end(), has_rank);
  if (with == profiles.end()) return Status::Ok();  // none records its rank: the order given
  // Some files record their rank and some do not: the order given would contradict a recorded rank silently.
  if (without != profiles.end())
    return Status::InvalidInput(printable(with->source, 200) + " records distributedInfo.rank " +
                                std::to_string(with->rank) + " but " + printable(without->source, 200) +
                                " records none: give files that all record their rank, or none (then in rank order)");
  std::sort(profiles.begin(), profiles.end(),
            [](const KinetoProfile& a, const KinetoProfile& b) { return a.rank < b.rank; });
  for (int r = 0; r < world; ++r)
    if (profiles[r].rank != r)
      return Status::InvalidInput(printable(profiles[r].source, 200) + ": distributedInfo.rank " +
                                  std::to_string(profiles[r].rank) + " where rank " + std::to_string(r) +
                                  " was expected (the files must be ranks 0.." + std::to_string(world - 1) + ")");
  return Status::Ok();
}

// Clocks: files of one host share one; across hosts, align on the end of the first collective. Returns the
// shift of each rank's clock onto rank 0's.
std::vector<double> clock_shifts(const std::vector<KinetoProfile>& profiles) {
  const int world = static_cast<int>(profiles.size());
  std::vector<double> shift(world, 0);
  auto first_end = [](const KinetoProfile& p) -> std::optional<double> {
    for (const KinetoStep& s : p.steps)
      if (!s.collectives.empty()) return s.collectives.front().end_us;
    return std::nullopt;
  };
  if (const auto reference = first_end(profiles[0]); reference && world > 1)
    for (int r = 1; r < world; ++r)
      if (auto e = first_end(profiles[r])) shift[r] = *reference - *e;
  return shift;
}

// Per kind, the step's recorded instances: the k-th collective of a kind on every rank is one instance (as
// many as the rank that recorded fewest has).
Recorded recorded_instances(const std::vector<KinetoProfile>& profiles, int step, const std::vector<double>& shift) {
  const int world = static_cast<int>(profiles.size());
  std::map<TraceKind, std::size_t> count;
  for (int r = 0; r < world; ++r)
    for (const KinetoCollective& c : profiles[r].steps[step].collectives) count[c.kind] = 0;
  for (auto& [kind, k] : count) {
    k = std::numeric_limits<std::size_t>::max();
    for (int r = 0; r < world; ++r) {
      const auto& list = profiles[r].steps[step].collectives;
      k = std::min<std::size_t>(k, std::count_if(list.begin(), list.end(),
                                                 [kind = kind](const KinetoCollective& c) { return c.kind == kind; }));
    }
  }
  Recorded recorded;
  for (const auto& [kind, k] : count) {
    std::vector<Instance>& list = recorded[kind];
    list.assign(k, Instance{-std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(), -1});
    for (int r = 0; r < world; ++r) {
      std::size_t i = 0;
      for (const KinetoCollective& c : profiles[r].steps[step].collectives) {
        if (c.kind != kind || i >= k) continue;
        list[i].start = std::max(list[i].start, c.start_us + shift[r]);
        list[i].end = std::max(list[i].end, c.end_us + shift[r]);
        list[i].bytes = std::max(list[i].bytes, c.bytes);
        ++i;
      }
    }
    // Collectives of a kind that ran at once (gloo's two threads, NCCL's streams) replay one after the
    // other on the schedule's stream: each keeps only the time after the previous one ended, so their
    // total is the time the kind was in flight.
    for (std::size_t i = 1; i < list.size(); ++i) {
      list[i].start = std::max(list[i].start, list[i - 1].end);
      list[i].end = std::max(list[i].end, list[i].start);
    }
  }
  return recorded;
}

// Builds the trace of one rank and step at a time (kineto.h: kineto_to_trace).
class TraceLayout {
 public:
  TraceLayout(const Schedule& schedule, const DurationModel& weights, bool include_idle, double t0, KinetoImport& out)
      : schedule_(schedule), weights_(weights), include_idle_(include_idle), t0_(t0), out_(out) {}

  void note_once(const std::string& text) {
    if (std::find(out_.notes.begin(), out_.notes.end(), text) == out_.notes.end()) out_.notes.push_back(text);
  }

  // Each phase's GPU time over its compute ops (the optimizer's over the optimizer steps) by weight, from
  // the phase's first GPU start on; phases that recorded nothing start where the previous one ended.
  void lay_out_compute(int r, int step, const KinetoStep& st, double shift) {
    const auto& ops = schedule_.program_of(r).ops;
    std::array<double, kKinetoPhases> total_weight{};
    for (const Op& op : ops) {
      int ph = 0;
      const double w = weight(r, op, ph);
      if (w >= 0) total_weight[ph] += w;
    }
    std::array<double, kKinetoPhases> time{}, cursor{};
    for (int ph = 0; ph < kKinetoPhases; ++ph) {
      const double span = st.busy_us[ph] > 0 ? st.last_us[ph] - st.first_us[ph] : 0;
      time[ph] = include_idle_ ? std::max(span, st.busy_us[ph]) : st.busy_us[ph];
      cursor[ph] = st.busy_us[ph] > 0 ? st.first_us[ph] + shift - t0_ : 0;
      if (st.busy_us[ph] > 0 && total_weight[ph] <= 0)
        note_once(std::string("the trace's ") + to_string(static_cast<KinetoPhase>(ph)) +
                  " GPU time has no op of the schedule to go to: left out");
    }
    for (int ph = 1; ph < kKinetoPhases; ++ph)
      if (st.busy_us[ph] <= 0) cursor[ph] = cursor[ph - 1] + time[ph - 1];
    for (int i = 0; i < static_cast<int>(ops.size()); ++i) {
      int ph = 0;
      const double w = weight(r, ops[i], ph);
      if (w < 0) continue;
      const double d = total_weight[ph] > 0 ? time[ph] * w / total_weight[ph] : 0;
      out_.trace.events.push_back(trace_event(schedule_, r, i, step, ops[i].stream, cursor[ph], cursor[ph] + d, -1));
      cursor[ph] += d;
    }
  }

  // Each of the schedule's collectives takes the recorded instance of its kind in order when the counts
  // agree, else the kind's recorded time in flight spread by the schedule's bytes; kinds not recorded are
  // left out (a replay simulates them).
  void lay_out_collectives(int r, int step, const Recorded& recorded) {
    const auto& ops = schedule_.program_of(r).ops;
    std::map<TraceKind, std::vector<int>> collective_ops;
    for (int i = 0; i < static_cast<int>(ops.size()); ++i)
      if (const auto* c = std::get_if<CollectiveOp>(&ops[i].body)) collective_ops[trace_kind(c->kind)].push_back(i);
    for (const auto& [kind, indices] : collective_ops) {
      auto rec = recorded.find(kind);
      if (rec == recorded.end() || rec->second.empty()) {
        note_once(std::string("the schedule's ") + to_string(kind) +
                  "s were not recorded: a replay simulates them on the scenario's network");
        continue;
      }
      const std::vector<Instance>& list = rec->second;
      if (list.size() == indices.size()) {
        for (std::size_t k = 0; k < indices.size(); ++k) {
          const Op& op = ops[indices[k]];
          const std::int64_t bytes = list[k].bytes > 0 ? list[k].bytes : std::get<CollectiveOp>(op.body).bytes;
          out_.trace.events.push_back(
              trace_event(schedule_, r, indices[k], step, op.stream, list[k].start - t0_, list[k].end - t0_, bytes));
        }
        continue;
      }
      spread_by_bytes(r, step, kind, list, indices);
    }
  }

  // The recorded kinds the schedule does not have: said once.
  void note_unscheduled(const Recorded& recorded) {
    for (const auto& [kind, list] : recorded) {
      bool in_schedule = false;
      for (const Op& op : schedule_.program_of(0).ops)
        if (const auto* c = std::get_if<CollectiveOp>(&op.body); c != nullptr && trace_kind(c->kind) == kind)
          in_schedule = true;
      if (!in_schedule && !list.empty())
        note_once(std::to_string(list.size()) + " " + to_string(kind) +
                  " per step recorded that the schedule does not have: not replayed");
    }
  }

  // A stream runs one op at a time: where the layout made two overlap, the later one waits.
  void serialise_streams() {
    std::map<std::pair<int, int>, std::vector<TraceEvent*>> by_stream;
    for (TraceEvent& e : out_.trace.events) by_stream[{e.rank, e.stream}].push_back(&e);
    long long moved = 0;
    for (auto& [key, list] : by_stream) {
      std::stable_sort(list.begin(), list.end(), [](const TraceEvent* a, const TraceEvent* b) {
        return a->start_us < b->start_us || (a->start_us == b->start_us && a->step < b->step);
      });
      double free_at = 0;
      for (TraceEvent* e : list) {
        if (e->start_us < free_at) {
          const double d = e->end_us - e->start_us;
          e->start_us = free_at;
          e->end_us = free_at + d;
          ++moved;
        }
        free_at = e->end_us;
      }
    }
    if (moved > 0)
      out_.notes.push_back(std::to_string(moved) + " op" + (moved == 1 ? "" : "s") +
                           " moved later so that no stream runs two at once (durations kept)");
  }

 private:
  // A compute op's or optimizer step's weight and phase (`ph`); -1 for the other ops.
  double weight(int r, const Op& op, int& ph) const {
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      ph = static_cast<int>(kineto_phase(c->phase));
      return weights_.compute_s(r, *c);
    }
    if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) {
      ph = static_cast<int>(KinetoPhase::kOptimizer);
      return weights_.optimizer_s(r, *o);
    }
    return -1;
  }

  // Counts differ (other buckets): the kind's time in flight, spread by the schedule's bytes.
  void spread_by_bytes(int r, int step, TraceKind kind, const std::vector<Instance>& list,
                       const std::vector<int>& indices) {
    const auto& ops = schedule_.program_of(r).ops;
    double total = 0, first = std::numeric_limits<double>::infinity(), bytes = 0;
    for (const Instance& in : list) {
      total += std::max(0.0, in.end - in.start);
      first = std::min(first, in.start);
    }
    for (int i : indices) bytes += static_cast<double>(std::get<CollectiveOp>(ops[i].body).bytes);
    note_once(std::to_string(list.size()) + " " + to_string(kind) + "s per step recorded, " +
              std::to_string(indices.size()) +
              " in the schedule (other buckets): their recorded time is spread over the schedule's by bytes");
    double at = first - t0_;
    for (int i : indices) {
      const CollectiveOp& c = std::get<CollectiveOp>(ops[i].body);
      const double d = bytes > 0 ? total * static_cast<double>(c.bytes) / bytes : total / indices.size();
      out_.trace.events.push_back(trace_event(schedule_, r, i, step, ops[i].stream, at, at + d, c.bytes));
      at += d;
    }
  }

  const Schedule& schedule_;
  const DurationModel& weights_;
  const bool include_idle_;
  const double t0_;  // the earliest GPU start of any rank: time 0 of the trace
  KinetoImport& out_;
};

}  // namespace

Result<KinetoImport> kineto_to_trace(std::vector<KinetoProfile> profiles, const Scenario& scenario,
                                     const Schedule& schedule, const DurationModel& weights, bool include_idle) {
  const int world = schedule.world_size;
  HZP_RETURN_IF_ERROR(order_profiles(profiles, world));
  KinetoImport out;
  out.steps = static_cast<int>(profiles[0].steps.size());
  for (const KinetoProfile& p : profiles) out.steps = std::min(out.steps, static_cast<int>(p.steps.size()));
  // What replay would refuse is not built: too many steps, or more events than a trace may hold (100 k
  // empty profiler steps took 3.5 GB to build a trace that replay then refused).
  std::int64_t ops_per_step = 0;
  for (int r = 0; r < world; ++r) ops_per_step += static_cast<std::int64_t>(schedule.program_of(r).ops.size());
  if (out.steps > kMaxTraceSteps || static_cast<std::int64_t>(out.steps) * ops_per_step > kMaxTraceEvents)
    return Status::InvalidInput(
        "the profiles hold " + std::to_string(out.steps) + " steps of " + std::to_string(ops_per_step) +
        " schedule ops over the ranks: an hzp trace holds at most " + std::to_string(kMaxTraceSteps) + " steps and " +
        std::to_string(kMaxTraceEvents) + " events (profile fewer steps)");
  const std::vector<double> shift = clock_shifts(profiles);
  double t0 = std::numeric_limits<double>::infinity();
  for (int r = 0; r < world; ++r)
    for (const KinetoStep& s : profiles[r].steps)
      for (int ph = 0; ph < kKinetoPhases; ++ph)
        if (s.busy_us[ph] > 0) t0 = std::min(t0, s.first_us[ph] + shift[r]);
  out.trace = trace_header(scenario, schedule);
  TraceLayout layout(schedule, weights, include_idle, t0, out);
  for (int step = 0; step < out.steps; ++step) {
    const Recorded recorded = recorded_instances(profiles, step, shift);
    for (int r = 0; r < world; ++r) {
      layout.lay_out_compute(r, step, profiles[r].steps[step], shift[r]);
      layout.lay_out_collectives(r, step, recorded);
    }
    layout.note_unscheduled(recorded);
  }
  layout.serialise_streams();
  // What replay would refuse is not written: a layout past the year a trace may span (timestamps of a
  // damaged profile, idle gaps of days with --include-idle).
  for (const TraceEvent& e : out.trace.events)
    if (!(e.start_us >= 0 && e.end_us <= kMaxTraceMicroseconds))
      return Status::InvalidInput("the profiles lay out step " + std::to_string(e.step) + " of rank " +
                                  std::to_string(e.rank) + " at " + std::to_string(e.end_us / 86400e6) +
                                  " days from the first event, past the year an hzp trace may span (are the "
                                  "profiles' timestamps damaged?)");
  std::stable_sort(out.trace.events.begin(), out.trace.events.end(), [](const TraceEvent& a, const TraceEvent& b) {
    return a.start_us < b.start_us || (a.start_us == b.start_us && a.end_us < b.end_us);
  });
  return out;
}

}  // namespace hzp
