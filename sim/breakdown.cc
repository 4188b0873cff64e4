// A GPU's step time by phase, communication dimension and idle time (breakdown.h).
#include "sim/breakdown.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace hzp::sim {
namespace {

using Intervals = std::vector<std::pair<double, double>>;

// Total length of the union of the intervals.
double covered(Intervals v) {
  std::sort(v.begin(), v.end());
  double total = 0, open = 0, close = 0;
  bool any = false;
  for (const auto& [a, b] : v) {
    if (b <= a) continue;
    if (!any || a > close) {
      if (any) total += close - open;
      open = a;
      close = b;
      any = true;
    } else {
      close = std::max(close, b);
    }
  }
  return any ? total + close - open : 0.0;
}

Intervals joined(const Intervals& a, const Intervals& b) {
  Intervals out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

}  // namespace

const char* to_string(CommDimension d) {
  switch (d) {
#define HZP_NAME(id, name) \
  case CommDimension::id:  \
    return name;
    HZP_COMM_DIMENSIONS(HZP_NAME)
#undef HZP_NAME
  }
  return "?";
}

CommDimension comm_dimension(GroupRole role) {
  switch (role) {
    case GroupRole::kTensor:
      return CommDimension::kTensor;
    case GroupRole::kExpertParallel:
      return CommDimension::kExpert;
    case GroupRole::kContext:
      return CommDimension::kContext;
    case GroupRole::kPipeActEven:
    case GroupRole::kPipeActOdd:
    case GroupRole::kPipeActWrap:
    case GroupRole::kPipeGradEven:
    case GroupRole::kPipeGradOdd:
    case GroupRole::kPipeGradWrap:
    case GroupRole::kEmbedding:  // the tied embedding's gradient, between the first and the last stage
      return CommDimension::kPipeline;
    default:  // the states' groups (sharding, replicas, ZeRO++'s secondary copy) and the gradient norm
      return CommDimension::kData;
  }
}

StepBreakdown step_breakdown(const Schedule& schedule, const SimResult& result, int rank) {
  StepBreakdown b;
  b.rank = rank;
  const double steps = std::max(1, result.steps);
  const Program& program = schedule.program_of(rank);
  Intervals compute;
  std::array<Intervals, kNumCommDimensions> comm;
  for (const OpSpan& s : result.spans) {
    if (s.rank != rank) continue;
    const Op& op = program.ops[s.op];
    const double d = s.end - s.start;
    if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      (c->phase == Phase::kForward    ? b.forward_s
       : c->phase == Phase::kBackward ? b.backward_s
                                      : b.recompute_s) += d / steps;
      compute.emplace_back(s.start, s.end);
    } else if (std::holds_alternative<OptimizerStepOp>(op.body)) {
      b.optimizer_s += d / steps;
      compute.emplace_back(s.start, s.end);
    } else if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      const GroupRole role = schedule.roles[static_cast<std::size_t>(c->role)];
      comm[static_cast<int>(comm_dimension(role))].emplace_back(s.transfer_start, s.end);
    }
  }
  const double busy = covered(compute);
  Intervals every = compute;
  for (int d = 0; d < kNumCommDimensions; ++d) {
    b.comm[d].transfer_s = covered(comm[d]) / steps;
    b.comm[d].exposed_s = std::clamp((covered(joined(compute, comm[d])) - busy) / steps, 0.0, b.comm[d].transfer_s);
    every.insert(every.end(), comm[d].begin(), comm[d].end());
  }
  const double active = covered(every);
  b.step_s = result.total_time_s / steps;
  b.compute_busy_s = busy / steps;
  b.exposed_comm_s = std::max(0.0, active - busy) / steps;
  b.idle_s = std::max(0.0, result.total_time_s - active) / steps;
  return b;
}

nlohmann::json breakdown_json(const StepBreakdown& b) {
  nlohmann::json comm = nlohmann::json::object();
  for (int d = 0; d < kNumCommDimensions; ++d)
    if (b.comm[d].transfer_s > 0)
      comm[to_string(static_cast<CommDimension>(d))] = {{"transfer", b.comm[d].transfer_s},
                                                        {"exposed", b.comm[d].exposed_s}};
  return {{"rank", b.rank},
          {"compute_s",
           {{"forward", b.forward_s},
            {"backward", b.backward_s},
            {"recompute", b.recompute_s},
            {"optimizer", b.optimizer_s},
            {"busy", b.compute_busy_s}}},
          {"comm_s", comm},
          {"exposed_comm_s", b.exposed_comm_s},
          {"idle_s", b.idle_s}};
}

std::string breakdown_text(const StepBreakdown& b, bool pipelined) {
  char line[512];
  std::string out;
  auto pct = [&](double s) { return b.step_s > 0 ? 100 * s / b.step_s : 0.0; };
  std::snprintf(line, sizeof line,
                "  GPU %d's step  compute %.4f s (%.1f %%: forward %.4f, backward %.4f, recompute %.4f, optimizer "
                "%.4f), exposed communication %.4f s (%.1f %%), %s %.4f s (%.1f %%)\n",
                b.rank, b.compute_busy_s, pct(b.compute_busy_s), b.forward_s, b.backward_s, b.recompute_s,
                b.optimizer_s, b.exposed_comm_s, pct(b.exposed_comm_s), pipelined ? "bubble and waits" : "idle",
                b.idle_s, pct(b.idle_s));
  out += line;
  std::string kinds;
  for (int d = 0; d < kNumCommDimensions; ++d) {
    if (b.comm[d].transfer_s <= 0) continue;
    std::snprintf(line, sizeof line, "%s%s %.4f s (exposed %.4f, hidden %.4f)", kinds.empty() ? "" : ", ",
                  to_string(static_cast<CommDimension>(d)), b.comm[d].transfer_s, b.comm[d].exposed_s,
                  b.comm[d].transfer_s - b.comm[d].exposed_s);
    kinds += line;
  }
  if (!kinds.empty()) out += "  communication " + kinds + "\n";
  return out;
}

}  // namespace hzp::sim
