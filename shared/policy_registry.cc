// The policy table. DDP, ZeRO-1/2/3, HSDP/MiCS and explicit AMSP-style sharding differ only in their
// groups, so they share the sharded data-parallel scheduler; hierarchical/async schedulers get their own
// files here as they are written.
#include "policy_registry.h"

#include "schedule_builder.h"

namespace hzp {
namespace {

template <const char* kName>
Result<Schedule> data_parallel(const Scenario& scenario, const ModelCost& cost) {
  return build_data_parallel_schedule(scenario, cost, kName);
}

// ZeRO++ hpZ: ZeRO-3 plus a secondary parameter copy sharded inside the node for backward all-gathers.
Result<Schedule> zeropp(const Scenario& scenario, const ModelCost& cost) {
  return build_data_parallel_schedule(scenario, cost, "zeropp", SchedulerOptions{.secondary_param_copy = true});
}

constexpr char kDdp[] = "ddp", kZero1[] = "zero1", kZero2[] = "zero2", kZero3[] = "zero3", kFsdp[] = "fsdp",
               kHsdp[] = "hsdp", kMics[] = "mics", kAmsp[] = "amsp", kCustom[] = "custom";

// AsyncHZP: P and G sharded inside the node, OS over all GPUs (presets.cc), with every communication kind
// on its own stream: parameter gathers, gradient reduce-scatters, the cross-replica sync, and the refresh.
// Backward gathers and prefetches module by module.
Result<Schedule> asynchzp(const Scenario& scenario, const ModelCost& cost) {
  return build_data_parallel_schedule(scenario, cost, "asynchzp",
                                      SchedulerOptions{.dedicated_refresh_stream = true, .backward_module_gather = true});
}

}  // namespace

const std::vector<PolicyEntry>& policy_registry() {
  static const std::vector<PolicyEntry> table = {
      {kDdp, "replicated P, G, OS; gradient all-reduce in buckets", data_parallel<kDdp>, true},
      {kZero1, "optimizer states sharded over all GPUs", data_parallel<kZero1>, true},
      {kZero2, "gradients and optimizer states sharded over all GPUs", data_parallel<kZero2>, true},
      {kZero3, "P, G, OS sharded over all GPUs; per-layer all-gather with prefetch", data_parallel<kZero3>, true},
      {kFsdp, "alias of zero3", data_parallel<kFsdp>, false},
      {kHsdp, "P, G, OS sharded inside the node, replicated across nodes (MiCS, FSDP HYBRID_SHARD)",
       data_parallel<kHsdp>, true},
      {kMics, "alias of hsdp", data_parallel<kMics>, false},
      {kAmsp, "explicit (s_p, s_g, s_os) partial sharding", data_parallel<kAmsp>, false},
      {kCustom, "explicit sharding without a preset", data_parallel<kCustom>, false},
      {"zeropp", "ZeRO-3 + secondary intra-node parameter copy for backward all-gathers (ZeRO++ hpZ)", zeropp, true},
      {"asynchzp", "AsyncHZP: per-state groups, one stream per communication kind, fixed buffer pools", asynchzp, true},
  };
  return table;
}

Result<Schedule> build_schedule(const Scenario& scenario, const ModelCost& cost) {
  for (const PolicyEntry& entry : policy_registry()) {
    if (scenario.policy.preset != entry.name) continue;
    if (entry.build == nullptr)
      return Status::Unimplemented("policy.preset: \"" + scenario.policy.preset + "\" resolves (see `hzp validate`) "
                                   "but its scheduler is not implemented yet");
    return entry.build(scenario, cost);
  }
  return Status::InvalidInput("policy.preset: no scheduler for \"" + scenario.policy.preset + "\"");
}

}  // namespace hzp
