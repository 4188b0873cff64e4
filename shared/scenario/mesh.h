// The parallel mesh of a cluster and a policy.parallel (scenario.h: ParallelMesh), computed once: by the
// parser for every scenario it returns, and by the planner for the layouts it tries.
#pragma once

#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp {

// Tensor parallelism must divide the GPUs of a node; pipeline stages must be whole nodes or divide one node
// evenly; what is left of a (tensor, stage) coordinate is the replica axis (data x context ranks), split
// into `parallel.context` consecutive ranks per context group (the parser checks that context tiles it:
// validate_mesh). Errors name policy.parallel's field.
Result<ParallelMesh> make_mesh(const ClusterSpec& cluster, const ParallelSpec& parallel, int expert_parallel = 1);

}  // namespace hzp
