// The sharded data-parallel scheduler: one schedule builder for every (s_p, s_g, s_os) sharding.
//
// DDP, ZeRO-1/2/3, HSDP/MiCS and AMSP-style partial sharding differ only in their groups (presets.h);
// *when* things run is decided here, once:
//
//   step start   param refresh: all-gather of last step's updated parameters from optimizer slices into the
//                parameter layout (param_refresh group, q = s_os/s_p > 1 only). Placing it at the start of
//                the step models the steady state in which it overlaps the next forward (AMSP, FSDP).
//   each micro-batch
//     forward    per unit (embedding, layers, head): all-gather its parameters into a slot of the fixed
//                `param_gather` pool (s_p > 1), prefetching `prefetch_depth` units ahead; compute; release.
//     backward   units in reverse: gather again (s_p > 1), recompute (if asked), backward, release; the
//                unit's gradients go into a `grad_reduce` pool slot and are reduce-scattered in the
//                grad_shard group (s_g > 1) — every micro-batch, since a sharded gradient cannot accumulate
//                unsharded. Replicated gradients (s_g = 1) accumulate locally.
//   last micro-batch only, per bucket as soon as its gradients are final:
//                reduce-scatter down to the optimizer slice in param_refresh (q_g = s_os/s_g > 1),
//                all-reduce the slice across os_replica (D/s_os > 1).
//   step end     AdamW on this rank's optimizer slice, per bucket. The first op of the next step that reads
//                a unit's parameters (refresh, gather or forward) depends on it across the step boundary.
//
// Buckets: with s_p > 1 every unit is its own bucket (FSDP's wrapping unit); with replicated parameters,
// consecutive units in backward order are packed until `bucket_bytes` (DDP / DeepSpeed buckets).
// Streams: compute, param_gather (parameter all-gathers), grad_reduce (per-micro-batch reduce-scatters),
// replica_sync (once-per-step gradient sync and the refresh) — or all on compute with separate_streams off.
#pragma once

#include <string>

#include "shared/model_math.h"
#include "shared/scenario.h"
#include "shared/schedule.h"
#include "shared/status.h"

namespace hzp {

// Variations of the timeline above, each owned by the policy that asks for it (policy_registry.cc).
struct SchedulerOptions {
  // ZeRO++ hpZ: after the forward all-gather over the s_p group, each GPU keeps the gathered unit sharded
  // among the GPUs of its node (Ψ/R more parameter bytes per GPU), so the backward all-gather stays inside
  // the node (param_secondary group). A no-op when s_p fits in one node.
  bool secondary_param_copy = false;
  // AsyncHZP: the parameter refresh gets its own stream ("param_refresh") instead of sharing replica_sync
  // with the cross-replica all-reduce, so last step's refresh never queues behind this step's sync.
  bool dedicated_refresh_stream = false;
  // AsyncHZP: backward gathers one module (attention, MLP) at a time, so prefetching the next module's
  // parameters overlaps this module's backward (as AMSP and FSDP's BACKWARD_PRE prefetch do). Only with prefetch_depth
  // > 0 (the "no prefetch" switch turns it off too) and without recomputation (which needs the whole layer gathered).
  bool backward_module_gather = false;
};

Result<Schedule> build_data_parallel_schedule(const Scenario& scenario, const ModelCost& cost,
                                              const std::string& policy_name, const SchedulerOptions& options = {});

// Bytes of AdamW HBM traffic per optimizer-slice parameter: read grad, read+write master, m, v, write
// working param (mixed precision 2 + 8 + 8 + 8 + 2; fp32 4 + 8 + 8 + 8).
inline constexpr double kAdamBytesPerParam = 28;

}  // namespace hzp
