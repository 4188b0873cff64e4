// Preset comparison for `hzp plan`: one analytic estimate per registered policy.
#include "plan.h"

#include <cstdio>

#include "model_math.h"
#include "policy_registry.h"
#include "presets.h"
#include "schedule_validator.h"

namespace hzp {

Result<Scenario> with_policy(const Scenario& scenario, const std::string& policy) {
  HZP_ASSIGN_OR_RETURN(ShardingSpec sharding,
                       sharding_preset(policy, scenario.cluster.gpus_per_node, scenario.cluster.nodes));
  Scenario out = scenario;
  out.policy.preset = policy;
  out.policy.sharding = sharding;
  return out;
}

Result<Estimate> evaluate(const Scenario& scenario) {
  const ModelCost cost = model_cost(scenario.model, scenario.training);
  HZP_ASSIGN_OR_RETURN(Schedule schedule, build_schedule(scenario, cost));
  HZP_RETURN_IF_ERROR(validate_schedule(schedule));
  return estimate(scenario, cost, schedule);
}

Result<Plan> plan_presets(const Scenario& scenario) {
  Plan plan;
  std::vector<Scenario> variants;
  bool scenario_is_listed = false;
  for (const PolicyEntry& entry : policy_registry()) {
    if (!entry.in_plan) continue;
    HZP_ASSIGN_OR_RETURN(Scenario variant, with_policy(scenario, entry.name));
    scenario_is_listed = scenario_is_listed || variant.policy.sharding == scenario.policy.sharding;
    variants.push_back(std::move(variant));
  }
  if (!scenario_is_listed && policy_registry().end() != std::find_if(policy_registry().begin(), policy_registry().end(),
      [&](const PolicyEntry& e) { return scenario.policy.preset == e.name && e.build != nullptr; }))
    variants.insert(variants.begin(), scenario);

  for (const Scenario& variant : variants) {
    HZP_ASSIGN_OR_RETURN(Estimate est, evaluate(variant));
    est.timings.clear();
    plan.candidates.push_back({variant.policy.preset, variant.policy.sharding, std::move(est)});
  }
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const Estimate& e = plan.candidates[i].estimate;
    if (e.fits_memory && (plan.best < 0 || e.step_time_s < plan.candidates[plan.best].estimate.step_time_s))
      plan.best = static_cast<int>(i);
  }
  return plan;
}

namespace {
nlohmann::json group_json(ShardGroup g) { return nlohmann::json::array({g.s0, g.s1}); }
}  // namespace

nlohmann::json plan_to_json(const Scenario& scenario, const Plan& plan) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const PlanCandidate& c : plan.candidates) {
    const Estimate& e = c.estimate;
    candidates.push_back({
        {"policy", c.policy},
        {"sharding", {{"params", group_json(c.sharding.params)}, {"grads", group_json(c.sharding.grads)},
                      {"optimizer", group_json(c.sharding.optimizer)}}},
        {"memory_bytes_per_gpu", {{"params", e.memory.params}, {"grads", e.memory.grads},
                                  {"optimizer", e.memory.optimizer}, {"activations", e.memory.activations},
                                  {"buffers", e.memory.buffers}, {"total", e.memory.total()}}},
        {"comm_bytes_per_gpu", e.comm_bytes_per_gpu},
        {"comm_bytes_per_gpu_intra_node", e.comm_bytes_intra},
        {"comm_bytes_per_gpu_inter_node", e.comm_bytes_inter},
        {"estimated_step_time_s", e.step_time_s},
        {"estimated_exposed_comm_s", e.exposed_comm_s},
        {"estimated_mfu", e.mfu},
        {"fits_memory", e.fits_memory},
    });
  }
  nlohmann::json out = {{"scenario", scenario.name},
                        {"gpus", scenario.data_parallel()},
                        {"gpu_memory_bytes", scenario.cluster.gpu.memory_bytes},
                        {"candidates", candidates}};
  out["best"] = plan.best >= 0 ? nlohmann::json(plan.candidates[plan.best].policy) : nlohmann::json(nullptr);
  return out;
}

std::string plan_table(const Scenario& scenario, const Plan& plan) {
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "scenario %s: %s on %d x %d %s, seq %lld, micro-batch %lld, %lld micro-batches/step\n",
                scenario.name.c_str(), scenario.model.name.c_str(), scenario.cluster.nodes, scenario.cluster.gpus_per_node,
                scenario.cluster.gpu.type.c_str(), static_cast<long long>(scenario.training.seq_len),
                static_cast<long long>(scenario.training.micro_batch), static_cast<long long>(scenario.grad_accum_steps()));
  out += line;
  std::snprintf(line, sizeof line, "%-8s %-23s %8s %8s %8s %8s %8s %8s %5s %10s %9s %9s %6s\n", "policy",
                "sharding P/G/OS", "P GiB", "G GiB", "OS GiB", "act GiB", "buf GiB", "tot GiB", "fits", "comm GB",
                "step s", "exposed s", "MFU");
  out += line;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const PlanCandidate& c = plan.candidates[i];
    const Estimate& e = c.estimate;
    char sharding[64];
    std::snprintf(sharding, sizeof sharding, "%d,%d/%d,%d/%d,%d", c.sharding.params.s0, c.sharding.params.s1,
                  c.sharding.grads.s0, c.sharding.grads.s1, c.sharding.optimizer.s0, c.sharding.optimizer.s1);
    std::snprintf(line, sizeof line, "%-8s %-23s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %5s %10.2f %9.3f %9.3f %5.1f%%%s\n",
                  c.policy.c_str(), sharding, e.memory.params / GiB, e.memory.grads / GiB, e.memory.optimizer / GiB,
                  e.memory.activations / GiB, e.memory.buffers / GiB, e.memory.total() / GiB,
                  e.fits_memory ? "yes" : "NO", e.comm_bytes_per_gpu / 1e9, e.step_time_s, e.exposed_comm_s,
                  100 * e.mfu, static_cast<int>(i) == plan.best ? "  <- best" : "");
    out += line;
  }
  if (plan.best < 0) out += "no policy fits in " + std::to_string(scenario.cluster.gpu.memory_bytes / GiB) + " GiB per GPU\n";
  return out;
}

}  // namespace hzp
