// TraceDurations (trace_replay.h): the recorded durations of a trace, keyed the way the simulator asks.
#include "shared/trace/trace_replay.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <variant>

#include "shared/base/text.h"

namespace hzp {
namespace {

std::string at_event(std::size_t index, const char* field) {
  return "trace event " + std::to_string(index) + " (" + field + "): ";
}

// The op kind a trace event must find at its index in the rank's program.
bool kind_matches(const TraceEvent& e, const Op& op) {
  switch (e.kind) {
    case TraceKind::kCompute:
      return std::holds_alternative<ComputeOp>(op.body);
    case TraceKind::kOptimizerStep:
      return std::holds_alternative<OptimizerStepOp>(op.body);
    case TraceKind::kAcquire:
      return std::holds_alternative<BufferAcquireOp>(op.body);
    case TraceKind::kRelease:
      return std::holds_alternative<BufferReleaseOp>(op.body);
    default: {
      const auto* c = std::get_if<CollectiveOp>(&op.body);
      return c != nullptr && trace_kind(c->kind) == e.kind;
    }
  }
}

// The first field of `e` that differs from what the rebuilt schedule's op says (trace_event), with both
// values; empty when they agree. Bytes are the executed ones and are not compared.
std::string differing_field(const Trace& trace, const TraceEvent& e, const Schedule& schedule, const TraceEvent& want) {
  const auto differs = [](const char* field, const std::string& got, const std::string& expected) {
    return std::string(field) + ": " + got + ", but the rebuilt schedule's op has " + expected;
  };
  if (e.layer != want.layer) return differs("layer", std::to_string(e.layer), std::to_string(want.layer));
  if (e.micro_batch != want.micro_batch)
    return differs("micro_batch", std::to_string(e.micro_batch), std::to_string(want.micro_batch));
  if (e.module != want.module) return differs("module", to_string(e.module), to_string(want.module));
  if (e.phase != want.phase) return differs("phase", to_string(e.phase), to_string(want.phase));
  if (e.payload != want.payload) return differs("payload", to_string(e.payload), to_string(want.payload));
  if (e.bucket != want.bucket) return differs("bucket", std::to_string(e.bucket), std::to_string(want.bucket));
  // Pools and streams by name (a version-1 trace without a pools table numbers them as its events name them).
  const auto name = [](const std::vector<std::string>& names, int i) {
    return i >= 0 && i < static_cast<int>(names.size()) ? names[i] : std::string("none");
  };
  const std::string want_pool = want.pool >= 0 ? schedule.pools[want.pool].name : "none";
  if (name(trace.pools, e.pool) != want_pool) return differs("pool", name(trace.pools, e.pool), want_pool);
  const std::string want_stream = to_string(schedule.streams[want.stream]);
  if (name(trace.streams, e.stream) != want_stream)
    return differs("stream", name(trace.streams, e.stream), want_stream);
  return "";
}

// Every rank records every step the trace holds, each with the same ops: a step with missing
// events would replay with other steps' times (the tenth attack of issue 35 removed rank 0's step 1, or one
// of its collectives, and the replay went on). A trace may lack an op in every step (an import that did not
// see it: the roofline times it), not in some.
Status check_complete_steps(std::map<std::pair<int, std::int64_t>, std::vector<int>>& recorded_ops) {
  std::vector<std::int64_t> steps;
  std::map<int, const std::vector<int>*> first_of_rank;  // each rank's ops in its first step
  std::map<int, std::int64_t> first_step;
  for (auto& [key, ops] : recorded_ops) {
    const auto& [rank, step] = key;
    std::sort(ops.begin(), ops.end());  // (each op once a step: trace_format's reader checked)
    steps.push_back(step);
    if (first_of_rank.try_emplace(rank, &ops).second) first_step[rank] = step;
  }
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  for (const auto& [rank, reference] : first_of_rank) {
    for (std::int64_t step : steps) {
      auto it = recorded_ops.find({rank, step});
      if (it == recorded_ops.end())
        return Status::InvalidInput("trace: rank " + std::to_string(rank) + " has no event in step " +
                                    std::to_string(step) + ", which other ranks record");
      if (it->second == *reference) continue;
      std::vector<int> only_first, only_here;
      std::set_difference(reference->begin(), reference->end(), it->second.begin(), it->second.end(),
                          std::back_inserter(only_first));
      std::set_difference(it->second.begin(), it->second.end(), reference->begin(), reference->end(),
                          std::back_inserter(only_here));
      const bool missing = !only_first.empty();
      return Status::InvalidInput("trace: rank " + std::to_string(rank) + "'s step " +
                                  std::to_string(missing ? step : first_step[rank]) + " lacks op " +
                                  std::to_string(missing ? only_first.front() : only_here.front()) +
                                  ", which its step " + std::to_string(missing ? first_step[rank] : step) +
                                  " records (" + std::to_string(missing ? only_first.size() : only_here.size()) +
                                  " such ops): every recorded step must hold the same ops");
    }
  }
  return Status::Ok();
}

}  // namespace

Status check_trace_against(const Trace& trace, const Schedule& schedule) {
  const int world = schedule.world_size;
  if (trace.world_size != world)
    return Status::InvalidInput("trace: world_size " + std::to_string(trace.world_size) +
                                " differs from the schedule its scenario_config builds (" + std::to_string(world) +
                                " ranks)");
  if (trace.groups.size() != schedule.groups.size())
    return Status::InvalidInput("trace: " + std::to_string(trace.groups.size()) + " groups, the rebuilt schedule has " +
                                std::to_string(schedule.groups.size()));
  // The header is the rebuilt schedule's: its streams (in order: events name them), groups (ranks and role)
  // and node size.
  std::vector<std::string> streams;
  for (StreamKind k : schedule.streams) streams.push_back(to_string(k));
  if (trace.streams != streams) {
    std::string want;
    for (const std::string& name : streams) want += (want.empty() ? "" : ", ") + name;
    return Status::InvalidInput("trace: streams differ from the rebuilt schedule's (" + want + ")");
  }
  for (std::size_t g = 0; g < trace.groups.size(); ++g) {
    if (trace.groups[g].ranks != schedule.groups[g].ranks)
      return Status::InvalidInput("trace: group " + std::to_string(g) + " (" + trace.groups[g].role +
                                  ") has other ranks than the rebuilt schedule's");
    if (trace.groups[g].role != to_string(schedule.groups[g].role))
      return Status::InvalidInput("trace: group " + std::to_string(g) + " has role " +
                                  printable(trace.groups[g].role, 40) + ", the rebuilt schedule's has " +
                                  to_string(schedule.groups[g].role));
  }
  if (trace.gpus_per_node != schedule.gpus_per_node)
    return Status::InvalidInput("trace: gpus_per_node " + std::to_string(trace.gpus_per_node) +
                                " differs from the rebuilt schedule's " + std::to_string(schedule.gpus_per_node));
  // (rank, step) -> the ops it records, to check below that no step lacks what the others have.
  std::map<std::pair<int, std::int64_t>, std::vector<int>> recorded_ops;
  for (std::size_t i = 0; i < trace.events.size(); ++i) {
    const TraceEvent& e = trace.events[i];
    const auto& ops = schedule.program_of(e.rank).ops;
    if (e.op < 0 || e.op >= static_cast<int>(ops.size()))
      return Status::InvalidInput(at_event(i, "op") + "rank " + std::to_string(e.rank) + " has no op " +
                                  std::to_string(e.op) + " in the rebuilt schedule (" + std::to_string(ops.size()) +
                                  " ops)");
    const Op& op = ops[e.op];
    if (!kind_matches(e, op))
      return Status::InvalidInput(at_event(i, "kind") + to_string(e.kind) + " but op " + std::to_string(e.op) +
                                  " of rank " + std::to_string(e.rank) + " in the rebuilt schedule is another kind");
    const std::string differs =
        differing_field(trace, e, schedule, trace_event(schedule, e.rank, e.op, e.step, op.stream, 0, 0, 0));
    if (!differs.empty())
      return Status::InvalidInput("trace event " + std::to_string(i) + " (op " + std::to_string(e.op) + " of rank " +
                                  std::to_string(e.rank) + "): " + differs);
    if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      const int group = schedule.rank_groups[e.rank][c->role];
      if (e.group != group)
        return Status::InvalidInput(at_event(i, "group") + std::to_string(e.group) + ", but op " +
                                    std::to_string(e.op) + " of rank " + std::to_string(e.rank) + " runs on group " +
                                    std::to_string(group) + " in the rebuilt schedule");
    }
    recorded_ops[{e.rank, e.step}].push_back(e.op);
  }
  return check_complete_steps(recorded_ops);
}

Result<TraceDurations> TraceDurations::make(const Trace& trace, const Schedule& schedule,
                                            const DurationModel& fallback) {
  HZP_RETURN_IF_ERROR(check_trace_against(trace, schedule));
  TraceDurations d(fallback);
  // Collective instances: (group, step, k-th collective of the group in the step) -> latest start, end.
  std::map<std::tuple<int, std::int64_t, long long>, std::pair<double, double>> instances;
  std::map<std::tuple<int, int, std::int64_t>, long long> seen;  // (rank, group, step) -> collectives so far
  std::int64_t max_step = -1;

  // Events are sorted by start; a rank meets a group's collectives in program order, so counting them per
  // (rank, group, step) in start order numbers each instance the same on every member.
  for (const TraceEvent& e : trace.events) {
    const Op& op = schedule.program_of(e.rank).ops[e.op];  // checked above
    max_step = std::max(max_step, e.step);
    const double seconds = (e.end_us - e.start_us) * 1e-6;
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      const ComputeKey key{e.rank, c->unit, static_cast<int>(c->module), static_cast<int>(c->phase), c->micro_batch};
      d.compute_steps_[key][e.step] = seconds;
    } else if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) {
      d.optimizer_steps_[{e.rank, o->bucket}][e.step] = seconds;
    } else if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      const int group = schedule.rank_groups[e.rank][c->role];
      const long long k = seen[{e.rank, group, e.step}]++;
      auto [it, fresh] = instances.try_emplace({group, e.step, k}, std::pair{e.start_us, e.end_us});
      if (!fresh) {
        it->second.first = std::max(it->second.first, e.start_us);
        it->second.second = std::max(it->second.second, e.end_us);
      }
    }
  }
  d.steps_ = static_cast<int>(max_step + 1);
  for (const auto& [key, span] : instances) {
    const auto& [group, step, k] = key;
    d.per_step_[group] = std::max(d.per_step_[group], k + 1);
  }
  // Each instance keeps its own step's time (a replay of the same steps meets them in the same order).
  for (const auto& [key, span] : instances) {
    const auto& [group, step, k] = key;
    d.collective_[{group, step * d.per_step_[group] + k}] = std::max(0.0, (span.second - span.first) * 1e-6);
  }
  return d;
}

namespace {

// The recorded time of the call-th execution of an op (the steps in order), else its mean over the steps.
template <class Key>
std::optional<double> recorded(const Key& key, const std::map<Key, std::map<std::int64_t, double>>& per_step,
                               std::map<Key, std::int64_t>& calls) {
  auto steps = per_step.find(key);
  if (steps == per_step.end()) return std::nullopt;
  auto s = steps->second.find(calls[key]++);
  if (s != steps->second.end()) return s->second;
  double sum = 0;
  for (const auto& [step, seconds] : steps->second) sum += seconds;
  return sum / static_cast<double>(steps->second.size());
}

}  // namespace

double TraceDurations::compute_s(int rank, const ComputeOp& op) const {
  const ComputeKey key{rank, op.unit, static_cast<int>(op.module), static_cast<int>(op.phase), op.micro_batch};
  if (auto t = recorded(key, compute_steps_, compute_calls_)) return *t;
  ++fallbacks_;
  return fallback_->compute_s(rank, op);
}

double TraceDurations::optimizer_s(int rank, const OptimizerStepOp& op) const {
  if (auto t = recorded(std::pair{rank, op.bucket}, optimizer_steps_, optimizer_calls_)) return *t;
  ++fallbacks_;
  return fallback_->optimizer_s(rank, op);
}

std::optional<double> TraceDurations::transfer_s(int group, long long seq) const {
  auto per = per_step_.find(group);
  if (per == per_step_.end() || per->second == 0) return std::nullopt;
  auto it = collective_.find({group, seq % (per->second * std::max(1, steps_))});
  if (it == collective_.end()) return std::nullopt;
  return it->second;
}

std::vector<double> recorded_step_times(const Trace& trace) {
  std::vector<double> first(trace.world_size, std::numeric_limits<double>::infinity());
  std::vector<double> last(trace.world_size, 0);
  std::int64_t steps = 0;
  for (const TraceEvent& e : trace.events) {
    first[e.rank] = std::min(first[e.rank], e.start_us);
    last[e.rank] = std::max(last[e.rank], e.end_us);
    steps = std::max(steps, e.step + 1);
  }
  std::vector<double> out(trace.world_size, 0);
  for (int r = 0; r < trace.world_size; ++r)
    if (steps > 0 && last[r] >= first[r]) out[r] = (last[r] - first[r]) * 1e-6 / static_cast<double>(steps);
  return out;
}

std::vector<double> compute_speed_over_peak(const Trace& trace, const Schedule& schedule, const GpuSpec& gpu) {
  std::vector<double> at_peak(static_cast<std::size_t>(trace.world_size), 0.0), seconds(at_peak.size(), 0.0);
  for (const TraceEvent& e : trace.events) {
    if (e.rank < 0 || e.rank >= trace.world_size) continue;
    const auto& ops = schedule.program_of(e.rank).ops;
    if (e.op < 0 || e.op >= static_cast<int>(ops.size())) continue;
    const auto* k = std::get_if<ComputeOp>(&ops[e.op].body);
    if (k == nullptr) continue;
    at_peak[e.rank] += (k->flops - k->fp8_flops - k->flash_flops + flash_at_gemm_rate(gpu, *k)) / gpu.peak_flops +
                       (k->fp8_flops > 0 && gpu.fp8_peak_flops > 0 ? k->fp8_flops / gpu.fp8_gemm_peak() : 0.0);
    seconds[e.rank] += std::max(0.0, (e.end_us - e.start_us) * 1e-6);
  }
  std::vector<double> ratio(at_peak.size(), 0.0);
  for (std::size_t r = 0; r < ratio.size(); ++r)
    if (at_peak[r] > 0) ratio[r] = seconds[r] > 0 ? at_peak[r] / seconds[r] : std::numeric_limits<double>::infinity();
  return ratio;
}

std::vector<double> recorded_busy_times(const Trace& trace) {
  std::vector<std::vector<std::pair<double, double>>> spans(trace.world_size);
  std::int64_t steps = 0;
  for (const TraceEvent& e : trace.events) {
    spans[e.rank].emplace_back(e.start_us, e.end_us);
    steps = std::max(steps, e.step + 1);
  }
  std::vector<double> out(trace.world_size, 0);
  for (int r = 0; r < trace.world_size; ++r) {
    std::sort(spans[r].begin(), spans[r].end());
    double busy = 0, covered_to = -std::numeric_limits<double>::infinity();
    for (const auto& [start, end] : spans[r]) {
      if (end <= covered_to) continue;
      busy += end - std::max(start, covered_to);
      covered_to = end;
    }
    if (steps > 0) out[r] = busy * 1e-6 / static_cast<double>(steps);
  }
  return out;
}

Result<TraceRates> TraceRates::make(const Trace& trace, const Schedule& recorded, const DurationModel& fallback,
                                    const GpuSpec& gpu) {
  HZP_RETURN_IF_ERROR(check_trace_against(trace, recorded));
  TraceRates r(fallback, gpu);
  for (const TraceEvent& e : trace.events) {
    const Op& op = recorded.program_of(e.rank).ops[e.op];
    const double seconds = (e.end_us - e.start_us) * 1e-6;
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      Rate& rate = r.rates_[{static_cast<int>(c->module), static_cast<int>(c->phase)}];
      rate.seconds += seconds;
      rate.flops += r.weighted_flops(*c);
      rate.bytes += c->mem_bytes;
    } else if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) {
      r.optimizer_seconds_ += seconds;
      r.optimizer_params_ += static_cast<double>(o->shard_params);
    }
  }
  return r;
}

double TraceRates::compute_s(int rank, const ComputeOp& op) const {
  auto it = rates_.find({static_cast<int>(op.module), static_cast<int>(op.phase)});
  if (it != rates_.end()) {
    const Rate& rate = it->second;
    if (rate.flops > 0 && op.flops > 0) return rate.seconds / rate.flops * weighted_flops(op);
    if (rate.bytes > 0 && op.mem_bytes > 0) return rate.seconds / rate.bytes * op.mem_bytes;
  }
  ++fallbacks_;
  return fallback_->compute_s(rank, op);
}

double TraceRates::optimizer_s(int rank, const OptimizerStepOp& op) const {
  if (optimizer_params_ > 0) return optimizer_seconds_ / optimizer_params_ * static_cast<double>(op.shard_params);
  ++fallbacks_;
  return fallback_->optimizer_s(rank, op);
}

}  // namespace hzp
