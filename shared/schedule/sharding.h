// The sharding plan: which process group each state uses on each rank, and the memory per GPU.
//
// Layout (AMSP notation, arXiv 2311.00257 §III; R GPUs per node, N nodes, rank r on node r / R with local index r % R):
// a state sharded over (s0, s1) splits the cluster into blocks of s0 consecutive local ranks x s1
// consecutive nodes; inside a block the rank at (node % s1, local % s0) holds shard
// (node % s1) * s0 + local % s0. Intra-node groups are therefore contiguous local ranks; blocks that span
// nodes take whole nodes ("fill the node first").
//
// The groups a data-parallel step needs (s_p | s_g | s_os required, s_g in {s_p, s_os}; q = s_os / s_p):
//   param_shard    the s_p block: all-gathers parameters before compute.
//   grad_shard     the s_g block: reduce-scatters gradients every micro-batch. When s_g == s_os its ring
//                  order is (param position, refresh index), so the reduce-scatter leaves each rank exactly
//                  its optimizer slice param_position * q + refresh_index.
//   param_refresh  the q ranks of my s_os block that share my param position: all-gathers updated
//                  parameters from optimizer slices into the parameter layout. When s_g == s_p it is also
//                  where the gradient shard is reduce-scattered down to the optimizer slice once per step.
//   os_replica     the D / s_os ranks at my position in every s_os block: all-reduce of the optimizer
//                  slice's gradient once per step.
//
// With expert parallelism EP, rank r holds experts of slot r % EP; its expert states are sharded like the
// dense ones but over the ranks that hold the same experts: each expert_* group is the matching dense
// group intersected with {r' : r' % EP == r % EP}. Every group of a role must come out the same size
// (EP and each s0 divide one another), else the layout is refused.
//
// ND parallelism (policy.parallel, Megatron's rank order: global rank = tensor + T·(context + C·(data +
// D·stage))): the layout above is built for the replica axis alone (the C·D ranks that hold the same
// parameters, ParallelMesh::replica: ranks_per_node per node x nodes) and copied to every (tensor,
// stage) coordinate, replica rank r becoming global rank tensor + T·(r + C·D·stage). Added roles: kTensor
// (T consecutive ranks), kContext (C consecutive replica ranks), the pipeline links and, with tied
// embeddings, kEmbedding (schedule.h).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "shared/base/status.h"
#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/scenario/scenario.h"

namespace hzp {

// Group membership for every role and rank, deterministic. `groups` is deduplicated: ranks of one group
// share its index. Built once per (cluster, sharding).
struct ShardingLayout {
  std::vector<GroupRole> roles;  // each present role, in the order built
  std::vector<ProcessGroup> groups;
  std::vector<std::vector<int>> rank_groups;  // [rank][role index] -> index into groups
  std::array<int, kNumGroupRoles> index{};    // GroupRole -> role index, -1 when the role is absent (kWorld always)

  int role(GroupRole r) const { return index[static_cast<int>(r)]; }
};

// The mesh decides the rest: expert > 1 adds the expert roles; tensor / pipeline / context > 1 the ND layout.
struct LayoutOptions {
  bool secondary_param_copy = false;  // adds kParamSecondary
  bool interleaved = false;           // pipelined with virtual stages: adds the last stage's wrap link
  bool tied_embeddings = false;       // pipelined: adds kEmbedding (first and last stage)
};

// The one notation for a sharding in every output: "P[8,1] G[8,4] OS[8,4]", and the legend that explains it.
std::string sharding_notation(const ShardingSpec& sharding);
inline constexpr const char* kShardingLegend =
    "P/G/OS[s0,s1]: parameters / gradients / optimizer states, each sharded over s0 GPUs of a node x s1 nodes "
    "([1,1] = replicated)";

Result<ShardingLayout> build_sharding_layout(const ClusterSpec& cluster, const ParallelMesh& mesh,
                                             const ShardingSpec& sharding, const LayoutOptions& options = {});

// The colour of pipeline link stage -> stage + 1 (2: the last stage's link back to the first): which of
// the kPipe*Even / *Odd / *Wrap roles carries it.
inline int pipe_link_colour(int stage, int stages) {
  return stage == stages - 1 ? 2 : stage % 2;
}

// Bytes per parameter of each model state for a precision (mixed precision keeps fp32 master + m + v).
struct StateBytes {
  double param = 0;      // working parameters
  double grad = 0;       // gradients
  double optimizer = 0;  // master weights + Adam moments
};
StateBytes state_bytes_per_param(Precision precision);
// The same with policy.comm.grad_reduce_in_fp32: gradients kept (and reduced) in fp32, 4 bytes per parameter.
StateBytes state_bytes_per_param(Precision precision, bool grads_in_fp32);

struct MemoryBreakdown {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
  double activations = 0;
  double buffers = 0;
  double total() const { return params + grads + optimizer + activations + buffers; }
};

// Model states per GPU = param·Ψ/s_p + grad·Ψ/s_g + optimizer·Ψ/s_os (bf16: 2Ψ/s_p + 2Ψ/s_g + 12Ψ/s_os),
// activations at their peak over the program (saved at a module's forward, freed at its backward: one
// micro-batch without pipelining, the micro-batches in flight of the pipeline schedule with it) plus the
// transient peak, and the schedule's buffer pools. Model states come from the schedule
// (Schedule::state_bytes, set by its builder: with expert parallelism the expert part is sharded by its own
// groups; pipeline stages hold different layers). memory_per_gpu is the worst program's.
MemoryBreakdown memory_of_program(const ModelCost& cost, const Schedule& schedule, int program);
MemoryBreakdown memory_per_gpu(const Scenario& scenario, const ModelCost& cost, const Schedule& schedule);

}  // namespace hzp
