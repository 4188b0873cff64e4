// The policy table (policy_registry.h). Shardings in AMSP notation (arXiv 2311.00257 §III); the schedules
// differ only in these groups and the scheduler's options.
#include "shared/policy/policy_registry.h"

#include <array>

namespace hzp {

namespace {

using S = ShardScope;
// ZeRO++ hpZ (Wang et al. 2023): ZeRO-3 plus a secondary copy of the parameters sharded among the GPUs of
// each node, built from the forward all-gather, so backward all-gathers stay on intra-node links (Ψ/R more
// parameter bytes per GPU; qwZ/qgZ quantisation is not modelled).
constexpr SchedulerOptions kHpz{.secondary_param_copy = true};
// AsyncHZP (arXiv 2510.20111): P and G sharded in the node, OS over all GPUs; every communication kind on
// a stream of its own (the paper's background threads), a fixed pool of gather/reduce slots, forward
// prefetch of the next layer(s) and backward prefetch of the next module. Its ablation switches are
// policy.overlap.separate_streams = false and prefetch_depth = 0 (then the schedule is the synchronous one).
constexpr SchedulerOptions kAsync{.dedicated_refresh_stream = true, .backward_module_gather = true};
constexpr std::array<PolicyEntry, kNumPolicies> kTable = {{
    {Policy::kDdp,
     "replicated P, G, OS; gradient all-reduce in buckets",
     S::kReplica,
     S::kReplica,
     S::kReplica,
     {},
     true,
     true},
    {Policy::kZero1, "optimizer states sharded over all GPUs", S::kReplica, S::kReplica, S::kFull, {}, true, true},
    {Policy::kZero2,
     "gradients and optimizer states sharded over all GPUs",
     S::kReplica,
     S::kFull,
     S::kFull,
     {},
     true,
     true},
    {Policy::kZero3,
     "P, G, OS sharded over all GPUs; per-layer all-gather with prefetch",
     S::kFull,
     S::kFull,
     S::kFull,
     {},
     true,
     true},
    {Policy::kFsdp, "alias of zero3", S::kFull, S::kFull, S::kFull, {}, false, true},
    {Policy::kHsdp,
     "P, G, OS sharded inside the node, replicated across nodes (MiCS, FSDP HYBRID_SHARD)",
     S::kNode,
     S::kNode,
     S::kNode,
     {},
     true,
     true},
    {Policy::kMics, "alias of hsdp", S::kNode, S::kNode, S::kNode, {}, false, true},
    {Policy::kZeropp, "ZeRO-3 + secondary intra-node parameter copy for backward all-gathers (ZeRO++ hpZ)", S::kFull,
     S::kFull, S::kFull, kHpz, true, true},
    {Policy::kAmsp,
     "explicit (s_p, s_g, s_os) partial sharding, or the planner's pick",
     S::kExplicit,
     S::kExplicit,
     S::kExplicit,
     {},
     false,
     true},
    {Policy::kAsyncHzp, "AsyncHZP: per-state groups, one stream per communication kind, fixed buffer pools", S::kNode,
     S::kNode, S::kFull, kAsync, true, true},
    {Policy::kCustom, "explicit sharding without a preset", S::kExplicit, S::kExplicit, S::kExplicit, {}, false, false},
}};

constexpr bool rows_in_enum_order() {
  for (int i = 0; i < kNumPolicies; ++i)
    if (kTable[i].id != static_cast<Policy>(i)) return false;
  return true;
}
static_assert(rows_in_enum_order(), "policy_registry.cc: one row per Policy, in the order of HZP_POLICIES");

}  // namespace

const std::vector<PolicyEntry>& policy_registry() {
  static const std::vector<PolicyEntry> table(kTable.begin(), kTable.end());
  return table;
}

const char* to_string(Policy policy) {
#define HZP_NAME_CASE(name, text) \
  case Policy::name:              \
    return text;
  switch (policy) { HZP_POLICIES(HZP_NAME_CASE) }
#undef HZP_NAME_CASE
  return "?";
}

std::optional<Policy> policy_named(std::string_view name) {
  for (int i = 0; i < kNumPolicies; ++i)
    if (name == to_string(static_cast<Policy>(i))) return static_cast<Policy>(i);
  return std::nullopt;
}

const PolicyEntry& policy_entry(Policy policy) {
  return policy_registry()[static_cast<int>(policy)];
}

}  // namespace hzp
