// The policy table: name -> scheduler (shared/policies/, one file each). DDP, ZeRO-1/2/3, HSDP/MiCS and
// explicit AMSP sharding differ only in their groups and share the data-parallel scheduler.
#include "policy_registry.h"

#include "policies/policies.h"

namespace hzp {

const std::vector<PolicyEntry>& policy_registry() {
  static const std::vector<PolicyEntry> table = {
      {"ddp", "replicated P, G, OS; gradient all-reduce in buckets", policies::data_parallel, true},
      {"zero1", "optimizer states sharded over all GPUs", policies::data_parallel, true},
      {"zero2", "gradients and optimizer states sharded over all GPUs", policies::data_parallel, true},
      {"zero3", "P, G, OS sharded over all GPUs; per-layer all-gather with prefetch", policies::data_parallel, true},
      {"fsdp", "alias of zero3", policies::data_parallel, false},
      {"hsdp", "P, G, OS sharded inside the node, replicated across nodes (MiCS, FSDP HYBRID_SHARD)",
       policies::data_parallel, true},
      {"mics", "alias of hsdp", policies::data_parallel, false},
      {"amsp", "explicit (s_p, s_g, s_os) partial sharding", policies::data_parallel, false},
      {"custom", "explicit sharding without a preset", policies::data_parallel, false},
      {"zeropp", "ZeRO-3 + secondary intra-node parameter copy for backward all-gathers (ZeRO++ hpZ)", policies::zeropp, true},
      {"asynchzp", "AsyncHZP: per-state groups, one stream per communication kind, fixed buffer pools", policies::asynchzp, true},
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
