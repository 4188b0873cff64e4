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

#include "shared/base/status.h"
#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/policy/policy_registry.h"
#include "shared/scenario/scenario.h"

namespace hzp {

Result<Schedule> build_data_parallel_schedule(const Scenario& scenario, const ModelCost& cost,
                                              const SchedulerOptions& options = {});

// The schedule for the scenario's policy (its preset name; "custom" = explicit sharding): the policy row's
// options on the scheduler above.
Result<Schedule> build_schedule(const Scenario& scenario, const ModelCost& cost);

// Bytes of AdamW HBM traffic per optimizer-slice parameter: read grad, read+write master, m, v, write
// working param (mixed precision 2 + 8 + 8 + 8 + 2; fp32 4 + 8 + 8 + 8).
inline constexpr double kAdamBytesPerParam = 28;

}  // namespace hzp
