// A step's steady state counted instead of simulated (steady_state.h).
#include "sim/steady_state.h"

#include <cmath>
#include <utility>

#include "shared/cost/performance.h"

namespace hzp::sim {
namespace {

// The per-step quantities, each extrapolated the same way; one table so that the child's report, its reading
// and the extrapolation cannot disagree on a field.
struct ResultDouble {
  const char* name;
  double SimResult::*field;
};
constexpr ResultDouble kResultDoubles[] = {
    {"total_time_s", &SimResult::total_time_s},
    {"step_time_s", &SimResult::step_time_s},
    {"compute_s", &SimResult::compute_s},
    {"comm_s", &SimResult::comm_s},
    {"comm_bytes_intra_node", &SimResult::comm_bytes_intra_node},
    {"comm_bytes_inter_node", &SimResult::comm_bytes_inter_node},
};
struct ResultCount {
  const char* name;
  long long SimResult::*field;
};
constexpr ResultCount kResultCounts[] = {
    {"ops_executed", &SimResult::ops_executed},
    {"ops_simulated", &SimResult::ops_simulated},
    {"collectives", &SimResult::collectives},
    {"collectives_with_flows", &SimResult::collectives_with_flows},
};
struct BreakdownDouble {
  const char* name;
  double StepBreakdown::*field;
};
constexpr BreakdownDouble kBreakdownDoubles[] = {
    {"step_s", &StepBreakdown::step_s},
    {"forward_s", &StepBreakdown::forward_s},
    {"backward_s", &StepBreakdown::backward_s},
    {"recompute_s", &StepBreakdown::recompute_s},
    {"optimizer_s", &StepBreakdown::optimizer_s},
    {"compute_busy_s", &StepBreakdown::compute_busy_s},
    {"exposed_comm_s", &StepBreakdown::exposed_comm_s},
    {"idle_s", &StepBreakdown::idle_s},
};
struct MemoryDouble {
  const char* name;
  double MemoryBreakdown::*field;
};
constexpr MemoryDouble kMemory[] = {
    {"params", &MemoryBreakdown::params},       {"grads", &MemoryBreakdown::grads},
    {"optimizer", &MemoryBreakdown::optimizer}, {"activations", &MemoryBreakdown::activations},
    {"buffers", &MemoryBreakdown::buffers},
};

std::string comm_key(int dimension, bool exposed) {
  return std::string("comm_") + to_string(static_cast<CommDimension>(dimension)) + (exposed ? "_exposed" : "_transfer");
}

Status missing(const std::string& key) {
  return Status::Internal("steady state: the first run's report lacks \"" + key + "\"");
}

// Reads j[key] into *out.
Status read(const nlohmann::json& j, const std::string& key, double* out) {
  if (!j.contains(key) || !j[key].is_number()) return missing(key);
  *out = j[key].get<double>();
  return Status::Ok();
}

}  // namespace

SteadyStatePlan plan_steady_state(const Scenario& scenario, const SimOptions& options) {
  SteadyStatePlan plan;
  plan.micro_batches = scenario.grad_accum_steps();
  plan.period = std::max(1, scenario.mesh.pipeline);
  plan.first = 2 * plan.period;
  plan.second = 3 * plan.period;
  if (options.exact)
    plan.why_not = "--exact";
  else if (options.durations != nullptr || options.collectives != nullptr)
    plan.why_not = "recorded durations are per micro-batch";
  else if (plan.micro_batches < plan.first + plan.second)
    plan.why_not = std::to_string(plan.micro_batches) + " micro-batches: fewer than the " +
                   std::to_string(plan.first + plan.second) + " its two shorter runs would simulate";
  return plan;
}

Scenario with_micro_batches(const Scenario& scenario, std::int64_t micro_batches) {
  Scenario shorter = scenario;
  shorter.training.global_batch = micro_batches * scenario.training.micro_batch * scenario.data_parallel();
  return shorter;
}

nlohmann::json steady_point_json(const SteadyPoint& point) {
  const SimResult& r = point.result;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : kResultDoubles) j[f.name] = r.*f.field;
  for (const auto& f : kResultCounts) j[f.name] = r.*f.field;
  for (const auto& f : kBreakdownDoubles) j[std::string("breakdown_") + f.name] = point.breakdown.*f.field;
  for (int d = 0; d < kNumCommDimensions; ++d) {
    j[comm_key(d, false)] = point.breakdown.comm[d].transfer_s;
    j[comm_key(d, true)] = point.breakdown.comm[d].exposed_s;
  }
  for (const auto& f : kMemory) j[std::string("memory_") + f.name] = r.memory.*f.field;
  j["steps"] = r.steps;
  j["sim_wall_s"] = r.sim_wall_s;
  return j;
}

Result<SteadyPoint> steady_point_from_json(const nlohmann::json& j) {
  SteadyPoint p;
  SimResult& r = p.result;
  if (!j.is_object()) return Status::Internal("steady state: the first run's report is not an object");
  for (const auto& f : kResultDoubles) {
    HZP_RETURN_IF_ERROR(read(j, f.name, &(r.*f.field)));
  }
  for (const auto& f : kResultCounts) {
    double v = 0;
    HZP_RETURN_IF_ERROR(read(j, f.name, &v));
    r.*f.field = std::llround(v);
  }
  for (const auto& f : kBreakdownDoubles) {
    HZP_RETURN_IF_ERROR(read(j, std::string("breakdown_") + f.name, &(p.breakdown.*f.field)));
  }
  for (int d = 0; d < kNumCommDimensions; ++d) {
    HZP_RETURN_IF_ERROR(read(j, comm_key(d, false), &p.breakdown.comm[d].transfer_s));
    HZP_RETURN_IF_ERROR(read(j, comm_key(d, true), &p.breakdown.comm[d].exposed_s));
  }
  for (const auto& f : kMemory) {
    HZP_RETURN_IF_ERROR(read(j, std::string("memory_") + f.name, &(r.memory.*f.field)));
  }
  double steps = 0;
  HZP_RETURN_IF_ERROR(read(j, "steps", &steps));
  r.steps = static_cast<int>(steps);
  HZP_RETURN_IF_ERROR(read(j, "sim_wall_s", &r.sim_wall_s));
  return p;
}

Result<SteadyPoint> extrapolate(const SteadyStatePlan& plan, const Scenario& scenario, const ModelCost& cost,
                                const SteadyPoint& first, SteadyPoint second) {
  for (const auto& f : kMemory)
    if (first.result.memory.*f.field != second.result.memory.*f.field)
      return Status::Internal("steady state: " + std::string(f.name) + " memory differs between " +
                              std::to_string(plan.first) + " and " + std::to_string(plan.second) + " micro-batches (" +
                              std::to_string(first.result.memory.*f.field) + " vs " +
                              std::to_string(second.result.memory.*f.field) +
                              " bytes): not a steady state; simulate every micro-batch with --exact");
  if (first.result.steps != second.result.steps)
    return Status::Internal("steady state: the two runs simulated different step counts");
  // f(M) = f(M2) + (M - M2) · (f(M2) - f(M1)) / (M2 - M1)
  const double beyond =
      static_cast<double>(plan.micro_batches - plan.second) / static_cast<double>(plan.second - plan.first);
  auto grow = [&](double at_first, double at_second) { return at_second + beyond * (at_second - at_first); };
  SimResult& r = second.result;
  for (const auto& f : kResultDoubles) r.*f.field = grow(first.result.*f.field, r.*f.field);
  for (const auto& f : kResultCounts)
    r.*f.field = std::llround(grow(static_cast<double>(first.result.*f.field), static_cast<double>(r.*f.field)));
  StepBreakdown& b = second.breakdown;
  for (const auto& f : kBreakdownDoubles) b.*f.field = grow(first.breakdown.*f.field, b.*f.field);
  for (int d = 0; d < kNumCommDimensions; ++d) {
    b.comm[d].transfer_s = grow(first.breakdown.comm[d].transfer_s, b.comm[d].transfer_s);
    b.comm[d].exposed_s = grow(first.breakdown.comm[d].exposed_s, b.comm[d].exposed_s);
  }
  derive_performance(scenario, cost, r);
  r.steady_state = {plan.micro_batches, plan.period, plan.first, plan.second};
  return second;
}

}  // namespace hzp::sim
