// Preset comparison for `hzp plan`: one analytic estimate per registered policy.
#include "shared/plan/plan.h"

#include <algorithm>
#include <cstdio>
#include <optional>

#include "shared/base/text.h"
#include "shared/compile/compile.h"
#include "shared/policy/policy_registry.h"
#include "shared/scenario/overrides.h"
#include "shared/scenario/presets.h"
#include "shared/scenario/scenario_parser.h"
#include "shared/schedule/sharding.h"

namespace hzp {

Result<Scenario> with_policy(const Scenario& scenario, Policy policy) {
  const ReplicaAxis& axis = scenario.mesh.replica;
  HZP_ASSIGN_OR_RETURN(ShardingSpec sharding, sharding_preset(policy, axis.ranks_per_node, axis.nodes));
  Scenario out = scenario;
  out.policy.preset = policy;
  out.policy.sharding = sharding;
  return out;
}

namespace {

// `scenario` on `nodes` nodes under `recompute`, with the same micro-batches per GPU per step — or fewer,
// where the memory peak cannot tell: at most (virtual_stages + 1) x pipeline, more than a stage ever holds in
// flight (1F1B: pipeline; interleaved: (v - 1)p + 2(p - 1) + 1 chunks), so that a search over a model of 128
// micro-batches does not build schedules of 128 (DeepSeek-V3 on one node took 30 s). An error when the
// layout does not divide there (e.g. pipeline stages that are not whole nodes).
Result<Scenario> resized(const Scenario& scenario, int nodes, Recompute recompute) {
  const std::int64_t per_gpu = scenario.grad_accum_steps();
  const std::int64_t in_flight =
      static_cast<std::int64_t>(scenario.policy.parallel.virtual_stages + 1) * scenario.mesh.pipeline;
  const std::int64_t kept = std::min(per_gpu, in_flight);
  const std::int64_t gpus = static_cast<std::int64_t>(nodes) * scenario.cluster.gpus_per_node;
  const std::int64_t model_parallel =
      static_cast<std::int64_t>(scenario.mesh.tensor) * scenario.mesh.pipeline * scenario.mesh.context;
  if (gpus % model_parallel != 0)
    return Status::InvalidInput("the layout does not divide " + std::to_string(gpus) + " GPUs");
  const std::int64_t global_batch = kept * scenario.training.micro_batch * (gpus / model_parallel);
  const nlohmann::json patch = {
      {"cluster", {{"nodes", nodes}}},
      {"training", {{"global_batch_sequences", global_batch}, {"recompute", to_string(recompute)}}}};
  HZP_ASSIGN_OR_RETURN(nlohmann::json doc, apply_overrides(scenario_to_json(scenario), patch));
  return parse_scenario(doc, scenario.name);
}

// Memory per GPU of `policy` on `nodes` nodes, if it fits there.
std::optional<MemoryBreakdown> fits_at(const Scenario& scenario, Policy policy, int nodes, Recompute recompute) {
  auto sized = resized(scenario, nodes, recompute);
  if (!sized.ok()) return std::nullopt;
  auto variant = with_policy(*sized, policy);
  if (!variant.ok()) return std::nullopt;
  auto estimate = evaluate(*variant);
  if (!estimate.ok() || !estimate->fits_memory) return std::nullopt;
  return estimate->memory;
}

}  // namespace

Result<std::vector<FitAdvice>> what_would_fit(const Scenario& scenario) {
  std::vector<FitAdvice> advice;
  if (scenario.training.global_batch % scenario.cluster.nodes != 0) return advice;  // cannot keep the batch per GPU
  const int base = scenario.cluster.nodes;
  for (const PolicyEntry& entry : policy_registry()) {
    if (!entry.in_plan) continue;
    for (Recompute recompute : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      if (recompute < scenario.training.recompute) continue;
      FitAdvice a{entry.id, recompute, 0, 0, {}};
      // Double until it fits, then halve the gap: memory per GPU only falls as the shards spread, so the
      // first fitting size is found in a few dozen estimates.
      int fail = base, fit = 0;
      for (int nodes = 2 * base; nodes <= kMaxAdviceNodes && fit == 0; nodes *= 2) {
        if (fits_at(scenario, entry.id, nodes, recompute))
          fit = nodes;
        else
          fail = nodes;
      }
      while (fit != 0 && fit - fail > 1) {
        const int mid = fail + (fit - fail) / 2;
        (fits_at(scenario, entry.id, mid, recompute) ? fit : fail) = mid;
      }
      if (fit != 0) {
        a.nodes = fit;
        a.gpus = fit * scenario.cluster.gpus_per_node;
        a.memory = *fits_at(scenario, entry.id, fit, recompute);
      }
      advice.push_back(a);
    }
  }
  return advice;
}

Result<Plan> plan_presets(const Scenario& scenario) {
  Plan plan;
  std::vector<Scenario> variants;
  bool scenario_is_listed = false;
  for (const PolicyEntry& entry : policy_registry()) {
    if (!entry.in_plan) continue;
    HZP_ASSIGN_OR_RETURN(Scenario variant, with_policy(scenario, entry.id));
    scenario_is_listed = scenario_is_listed || variant.policy.sharding == scenario.policy.sharding;
    variants.push_back(std::move(variant));
  }
  if (!scenario_is_listed) variants.insert(variants.begin(), scenario);

  for (const Scenario& variant : variants) {
    HZP_ASSIGN_OR_RETURN(Estimate est, evaluate(variant));
    est.timings.clear();
    plan.candidates.push_back({variant.policy.preset, variant.policy.sharding, std::move(est)});
  }
  // Ranked: what fits, fastest first, then what does not fit (its speed is moot), fastest first.
  std::stable_sort(plan.candidates.begin(), plan.candidates.end(), [](const PlanCandidate& a, const PlanCandidate& b) {
    if (a.estimate.fits_memory != b.estimate.fits_memory) return a.estimate.fits_memory;
    return a.estimate.step_time_s < b.estimate.step_time_s;
  });
  if (!plan.candidates.empty() && plan.candidates.front().estimate.fits_memory) plan.best = 0;
  if (plan.best < 0) {
    HZP_ASSIGN_OR_RETURN(plan.would_fit, what_would_fit(scenario));
  }
  return plan;
}

namespace {
nlohmann::json group_json(ShardGroup g) {
  return nlohmann::json::array({g.s0, g.s1});
}
}  // namespace

nlohmann::json plan_to_json(const Scenario& scenario, const Plan& plan) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const PlanCandidate& c : plan.candidates) {
    const Estimate& e = c.estimate;
    candidates.push_back({
        {"policy", to_string(c.policy)},
        {"sharding",
         {{"params", group_json(c.sharding.params)},
          {"grads", group_json(c.sharding.grads)},
          {"optimizer", group_json(c.sharding.optimizer)}}},
        {"memory_bytes_per_gpu",
         {{"params", e.memory.params},
          {"grads", e.memory.grads},
          {"optimizer", e.memory.optimizer},
          {"activations", e.memory.activations},
          {"buffers", e.memory.buffers},
          {"total", e.memory.total()}}},
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
                        {"gpus", scenario.cluster.world_size()},
                        {"gpu_memory_bytes", scenario.cluster.gpu.memory_bytes},
                        {"candidates", candidates}};
  out["best"] = plan.best >= 0 ? nlohmann::json(to_string(plan.candidates[plan.best].policy)) : nlohmann::json(nullptr);
  if (plan.best < 0) {
    nlohmann::json advice = nlohmann::json::array();
    for (const FitAdvice& a : plan.would_fit) {
      nlohmann::json row = {{"policy", to_string(a.policy)}, {"recompute", to_string(a.recompute)}};
      row["nodes"] = a.nodes ? nlohmann::json(a.nodes) : nlohmann::json(nullptr);
      row["gpus"] = a.nodes ? nlohmann::json(a.gpus) : nlohmann::json(nullptr);
      if (a.nodes) row["memory_bytes_per_gpu"] = {{"total", a.memory.total()}};
      advice.push_back(std::move(row));
    }
    out["would_fit"] = std::move(advice);
  }
  return out;
}

std::string would_fit_table(const Scenario& scenario, const std::vector<FitAdvice>& advice) {
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  if (advice.empty()) return {};
  std::string out = "what would fit: the fewest nodes of " + std::to_string(scenario.cluster.gpus_per_node) + " " +
                    scenario.cluster.gpu.type +
                    " per policy (micro-batch and micro-batches per GPU kept, so the global batch grows with the "
                    "GPUs); more recomputation only where it needs fewer nodes; tensor or pipeline parallelism: hzp "
                    "plan --search\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-8s %-10s %7s %7s %8s %8s %8s %8s %8s\n", "policy", "recompute", "nodes", "GPUs",
                "P GiB", "G GiB", "OS GiB", "act GiB", "tot GiB");
  out += line;
  std::vector<std::string> never;
  for (std::size_t i = 0; i < advice.size();) {
    // One policy's rows, least recomputation first: keep each that needs fewer nodes than every row before.
    std::size_t end = i;
    int fewest = 0;
    for (; end < advice.size() && advice[end].policy == advice[i].policy; ++end) {
      const FitAdvice& a = advice[end];
      if (a.nodes == 0 || (fewest != 0 && a.nodes >= fewest)) continue;
      fewest = a.nodes;
      const MemoryBreakdown& m = a.memory;
      std::snprintf(line, sizeof line, "%-8s %-10s %7d %7d %8.2f %8.2f %8.2f %8.2f %8.2f\n", to_string(a.policy),
                    to_string(a.recompute), a.nodes, a.gpus, m.params / GiB, m.grads / GiB, m.optimizer / GiB,
                    m.activations / GiB, m.total() / GiB);
      out += line;
    }
    if (fewest == 0) never.push_back(to_string(advice[i].policy));
    i = end;
  }
  if (!never.empty())
    out += join(never, ", ") + ": fit on no cluster up to " + std::to_string(kMaxAdviceNodes) +
           " nodes under any recomputation\n";
  return out;
}

std::string plan_table(const Scenario& scenario, const Plan& plan) {
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  std::string out;
  char line[512];
  std::snprintf(
      line, sizeof line, "scenario %s: %s on %d x %d %s (%s), seq %lld, micro-batch %lld, %lld micro-batches/step\n",
      scenario.name.c_str(), scenario.model.name.c_str(), scenario.cluster.nodes, scenario.cluster.gpus_per_node,
      scenario.cluster.gpu.type.c_str(), scenario.mesh.describe().c_str(),
      static_cast<long long>(scenario.training.seq_len), static_cast<long long>(scenario.training.micro_batch),
      static_cast<long long>(scenario.grad_accum_steps()));
  out += line;
  out += std::string(kShardingLegend) + "; memory in GiB (2^30 bytes) per GPU of " +
         std::to_string(static_cast<int>(scenario.cluster.gpu.memory_bytes / GiB)) +
         " GiB, communication in GB (10^9 bytes) sent per GPU per step; policies that do not fit are ranked "
         "last, their step time and MFU in parentheses\n";
  std::snprintf(line, sizeof line, "%-8s %-24s %8s %8s %8s %8s %8s %8s %5s %10s %9s %9s %8s\n", "policy", "sharding",
                "P GiB", "G GiB", "OS GiB", "act GiB", "buf GiB", "tot GiB", "fits", "comm GB", "step s", "exposed s",
                "MFU");
  out += line;
  for (size_t i = 0; i < plan.candidates.size(); ++i) {
    const PlanCandidate& c = plan.candidates[i];
    const Estimate& e = c.estimate;
    char step[32], mfu[32];
    std::snprintf(step, sizeof step, e.fits_memory ? "%.3f" : "(%.3f)", e.step_time_s);
    std::snprintf(mfu, sizeof mfu, e.fits_memory ? "%.1f%%" : "(%.1f%%)", 100 * e.mfu);
    std::snprintf(line, sizeof line, "%-8s %-24s %8.2f %8.2f %8.2f %8.2f %8.2f %8.2f %5s %10.2f %9s %9.3f %8s%s\n",
                  to_string(c.policy), sharding_notation(c.sharding).c_str(), e.memory.params / GiB,
                  e.memory.grads / GiB, e.memory.optimizer / GiB, e.memory.activations / GiB, e.memory.buffers / GiB,
                  e.memory.total() / GiB, e.fits_memory ? "yes" : "NO", e.comm_bytes_per_gpu / 1e9, step,
                  e.exposed_comm_s, mfu, static_cast<int>(i) == plan.best ? "  <- best" : "");
    out += line;
  }
  if (plan.best < 0) {
    std::snprintf(line, sizeof line, "no policy fits in %.1f GiB per GPU\n", scenario.cluster.gpu.memory_bytes / GiB);
    out += line;
    out += would_fit_table(scenario, plan.would_fit);
  }
  return out;
}

}  // namespace hzp
