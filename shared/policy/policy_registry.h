// The policies hzp knows, one row each: the sharding of each model state, the scheduler's options, a
// one-line description and whether `hzp plan` compares it. Every policy runs on the sharded data-parallel
// scheduler (schedule/schedule_builder.h); what makes a policy is its row. This table is data below the
// scenario: the parser resolves a policy preset with it, the scheduler reads its options. Adding one: a row here (and,
// for new behaviour, a SchedulerOptions switch), a golden dump in tests/golden/, memory and communication tests.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/status.h"

namespace hzp {

// The policies, by name as a scenario spells them (policy.preset). One list makes the enum, its names and
// its count; the registry (policy_registry.cc) has one row per policy, in this order. "custom" is what a
// policy with explicit sharding and no preset is called.
#define HZP_POLICIES(X)    \
  X(kDdp, "ddp")           \
  X(kZero1, "zero1")       \
  X(kZero2, "zero2")       \
  X(kZero3, "zero3")       \
  X(kFsdp, "fsdp")         \
  X(kHsdp, "hsdp")         \
  X(kMics, "mics")         \
  X(kZeropp, "zeropp")     \
  X(kAmsp, "amsp")         \
  X(kAsyncHzp, "asynchzp") \
  X(kCustom, "custom")

#define HZP_ENUMERATOR(name, text) name,
#define HZP_COUNT_ONE(name, text) +1
enum class Policy { HZP_POLICIES(HZP_ENUMERATOR) };
inline constexpr int kNumPolicies = 0 HZP_POLICIES(HZP_COUNT_ONE);
#undef HZP_ENUMERATOR
#undef HZP_COUNT_ONE

const char* to_string(Policy policy);
// The policy a scenario names, or nullopt.
std::optional<Policy> policy_named(std::string_view name);

// Variations of the scheduler's timeline (schedule/schedule_builder.h), each owned by the policy that asks for
// it (policy_registry.cc).
struct SchedulerOptions {
  // ZeRO++ hpZ: after the forward all-gather over the s_p group, each GPU keeps the gathered unit sharded
  // among the GPUs of its node (Ψ/R more parameter bytes per GPU), so the backward all-gather stays inside
  // the node (param_secondary group). A no-op when s_p fits in one node.
  bool secondary_param_copy = false;
  // AsyncHZP: the parameter refresh gets its own stream ("param_refresh") instead of sharing replica_sync
  // with the cross-replica all-reduce, so last step's refresh never queues behind this step's sync.
  bool dedicated_refresh_stream = false;
  // AsyncHZP: backward gathers one module (attention, MLP) at a time, so prefetching the next module's
  // parameters overlaps this module's backward (as AMSP and FSDP's BACKWARD_PRE prefetch do). Only with
  // prefetch_depth > 0 (the "no prefetch" switch turns it off too) and without recomputation (which needs the
  // whole layer gathered).
  bool backward_module_gather = false;
};

// Where a state is sharded, for a cluster of R GPUs per node and N nodes.
enum class ShardScope {
  kReplica,   // (1, 1): every GPU holds the whole state
  kNode,      // (R, 1): sharded inside the node, replicated across nodes
  kFull,      // (R, N): sharded over every GPU
  kExplicit,  // no default: the scenario gives the groups (or "auto": the planner picks them)
};

struct PolicyEntry {
  Policy id;
  const char* description;
  ShardScope params, grads, optimizer;
  SchedulerOptions options;
  bool in_plan;    // compared by `hzp plan` (aliases and explicit-sharding policies are not)
  bool is_preset;  // may be named as policy.preset ("custom" is what a policy without a preset is called)
};

// Every policy's row, in enum order (row i is Policy i).
const std::vector<PolicyEntry>& policy_registry();
const PolicyEntry& policy_entry(Policy policy);

}  // namespace hzp
