// The schedule IR: the contract between the scheduling core and both executors (sim/, runtime/).
//
// A Schedule says, for every rank, which ops run in which order on which stream:
//   - ops of one rank are stored in program order; each op names its stream and its dependencies
//     (earlier ops of the same rank). An op starts when (a) the previous op of its stream has finished —
//     streams are in-order queues, like CUDA streams — and (b) every dependency has finished.
//   - a collective starts only when every member of its group has reached it (NCCL semantics); cross-rank
//     order is therefore implied by collectives, never by dependencies.
//   - a program is one training step; executors that run several steps repeat it, honouring each op's
//     `prev_step_deps` on the previous repetition.
//
// Ranks that run the same program share it: `programs` holds each distinct program once and
// `rank_program[r]` says which one rank r runs. Collectives name a group *role* (GroupRole: which state's
// group), bound per rank to a concrete ProcessGroup by `rank_groups[r][role index]`. This keeps an 8192-GPU
// ZeRO schedule at one program of a few thousand ops instead of 8192 copies.
//
// The IR is the contract with the executors: every op carries its meaning as typed data — the unit and
// module it works on (one numbering, `Schedule::units`), what a collective is for (CollectivePurpose: which
// state, which step of the pipeline, which all-to-all of a MoE layer), the state kind it moves (dense or
// expert), the kind of pool a slot belongs to — and the schedule states each state's group sizes
// (`Schedule::states`). Executors switch on these fields; they never parse names or count ops.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "shared/model/model_math.h"
#include "shared/policy/policy_registry.h"

namespace hzp {

enum class Phase { kForward, kBackward, kRecompute };
// The process group a collective runs over, by the state it serves (sharding.h lays them out). One list
// makes the enum, its names (to_string) and its count (kNumGroupRoles):
//   param_shard .. os_replica    the dense states' groups (AMSP's s_p, s_g, the refresh group, the replicas)
//   expert_parallel              only with expert parallelism (policy.expert_parallel > 1): the EP consecutive
//                                ranks that together hold every expert (all-to-all of tokens)
//   expert_param_shard ..        the dense roles' groups restricted to the ranks holding the same experts
//   param_secondary              ZeRO++ hpZ: the GPUs of my node, which hold the secondary parameter copy
//                                sharded among themselves and all-gather it in backward
//   world                        every rank: the gradient-norm all-reduce of training.grad_clip
//   tensor                       ND parallelism: the `tensor` consecutive ranks of a node that split each
//                                layer (per-layer all-reduces)
//   pipe_*                       pipeline links: the two ranks (same tensor and data coordinates) of
//                                consecutive stages, members in sending order. Activations flow stage s -> s+1,
//                                gradients s+1 -> s; each direction is its own group so that its transfers
//                                match in issue order. A rank binds one group per role, so links are coloured
//                                by the parity of their lower stage, and the interleaved schedule's link from
//                                the last stage back to the first (its next model chunk) gets a role of its own
//   context                      context parallelism: the `context` consecutive replica-axis ranks that split
//                                each sequence (same tensor and stage): per-layer all-gather of keys and
//                                values, reduce-scatter of their gradients
//   embedding                    pipelined with tied embeddings: the first and the last stage's ranks of one
//                                (tensor, replica) coordinate, which hold the word embeddings and the head's copy
#define HZP_GROUP_ROLES(X)                       \
  X(kParamShard, "param_shard")                  \
  X(kGradShard, "grad_shard")                    \
  X(kParamRefresh, "param_refresh")              \
  X(kOsReplica, "os_replica")                    \
  X(kExpertParallel, "expert_parallel")          \
  X(kExpertParamShard, "expert_param_shard")     \
  X(kExpertGradShard, "expert_grad_shard")       \
  X(kExpertParamRefresh, "expert_param_refresh") \
  X(kExpertOsReplica, "expert_os_replica")       \
  X(kParamSecondary, "param_secondary")          \
  X(kWorld, "world")                             \
  X(kTensor, "tensor")                           \
  X(kPipeActEven, "pipe_act_even")               \
  X(kPipeActOdd, "pipe_act_odd")                 \
  X(kPipeActWrap, "pipe_act_wrap")               \
  X(kPipeGradEven, "pipe_grad_even")             \
  X(kPipeGradOdd, "pipe_grad_odd")               \
  X(kPipeGradWrap, "pipe_grad_wrap")             \
  X(kContext, "context")                         \
  X(kEmbedding, "embedding")

// The streams of a schedule, each an in-order queue (a CUDA stream; one of AsyncHZP's background threads):
//   compute        compute, the optimizer, and the collectives on the compute path (tensor parallelism, MoE
//                  all-to-all, pipeline sends, the gradient norm)
//   param_gather   parameter all-gathers into the gather pool
//   grad_reduce    per-micro-batch gradient reduce-scatters
//   replica_sync   once-a-step gradient sync (and the parameter refresh, unless it has its own stream)
//   param_refresh  AsyncHZP: last step's parameter refresh, never queued behind this step's sync
//   context        context parallelism: ring attention's key / value exchange beside the attention
//   pipe_recv_*    pipeline receives (activations, gradients): posted on their own streams even when a
//                  policy puts every other op on compute (own_queue), so that two neighbouring stages never
//                  both block in a send that waits for the other's receive
//   tensor         tensor parallelism's all-gathers and reduce-scatters pipelined with the GEMMs
//                  (policy.parallel.tensor_comm_overlap); its own queue whatever the policy's streams
#define HZP_STREAM_KINDS(X)          \
  X(kCompute, "compute")             \
  X(kParamGather, "param_gather")    \
  X(kGradReduce, "grad_reduce")      \
  X(kReplicaSync, "replica_sync")    \
  X(kParamRefresh, "param_refresh")  \
  X(kContext, "context")             \
  X(kPipeRecvAct, "pipe_recv_act")   \
  X(kPipeRecvGrad, "pipe_recv_grad") \
  X(kTensor, "tensor")

#define HZP_ENUMERATOR(name, text) name,
#define HZP_COUNT_ONE(name, text) +1
enum class GroupRole { HZP_GROUP_ROLES(HZP_ENUMERATOR) };
inline constexpr int kNumGroupRoles = 0 HZP_GROUP_ROLES(HZP_COUNT_ONE);
enum class StreamKind { HZP_STREAM_KINDS(HZP_ENUMERATOR) };
inline constexpr int kNumStreamKinds = 0 HZP_STREAM_KINDS(HZP_COUNT_ONE);
#undef HZP_ENUMERATOR
#undef HZP_COUNT_ONE
// Whether a stream keeps its own queue when the policy runs everything else on compute
// (policy.overlap.separate_streams false): the pipeline receives and the tensor stream (see above).
inline bool own_queue(StreamKind s) {
  return s == StreamKind::kPipeRecvAct || s == StreamKind::kPipeRecvGrad || s == StreamKind::kTensor;
}
// Model states are sharded per kind: the dense parameters, and (with expert parallelism) the experts'.
enum class StateKind { kDense, kExpert };
// What a fixed buffer pool holds.
enum class PoolKind { kParamGather, kGradReduce };
// What a collective is for. Each names its group role and what the executor does with its buffers:
enum class CollectivePurpose {
  kGatherParams,       // all-gather a unit's (or one module's) parameter shards into a param_gather slot
  kGatherSecondary,    // hpZ: the same from the node's secondary copy (param_secondary), in backward
  kRefreshParams,      // all-gather last step's updated optimizer slices into the parameter shard (param_refresh)
  kReduceGrads,        // reduce-scatter a grad_reduce slot into the gradient shard (grad_shard), every micro-batch
  kReduceToOptimizer,  // reduce-scatter the gradient shard down to the optimizer slice (param_refresh), once a step
  kSyncReplicas,       // all-reduce the optimizer slice's gradients across replicas (os_replica), once a step
  kGradNorm,           // all-reduce of every rank's partial squared gradient norm (world), before clipping
  kMoeDispatch,        // forward: tokens to the ranks holding their experts (expert_parallel)
  kMoeCombine,         // forward: expert outputs back to their tokens' ranks
  kMoeCombineGrad,     // backward: gradients of the expert outputs to the experts' ranks
  kMoeDispatchGrad,    // backward: gradients of the dispatched tokens back to their ranks
  kTensorForward,      // forward: all-reduce (sequence parallel: all-gather / reduce-scatter) of a layer
                       // block's activations over the tensor group, on the compute path
  kTensorBackward,     // backward: the same for the activation gradients
  kPipeActivations,    // pipeline: a stage's output activations to the next stage (a two-rank broadcast
                       // rooted at the sender: the wire cost of a send / receive pair)
  kPipeGrads,          // pipeline: the gradients of a stage's input back to the previous stage
  kContextForward,     // context parallelism: all-gather of a layer's keys and values over the context group
                       // (ring attention's exchange), beside the attention that consumes them
  kContextBackward,    // the same in backward, and the reduce-scatter of the key and value gradients
  kEmbeddingGrads,     // pipelined, tied embeddings: all-reduce of the word-embedding gradient between the
                       // first stage's embedding and the last stage's head copy, once a step
};
enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kAllToAll };
enum class DType { kBf16, kFp16, kFp32 };
// What a collective moves; lets executors and reports attribute communication to a state.
// kGradNorm: the partial squared L2 norms of every rank's final gradient shards, summed over the world
// before clipping (the executor computes its partial sum when the all-reduce is due).
enum class Payload { kParams, kGrads, kActivations, kGradNorm };

const char* to_string(Phase v);
const char* to_string(GroupRole v);
const char* to_string(StreamKind v);
const char* to_string(StateKind v);
const char* to_string(PoolKind v);
const char* to_string(CollectivePurpose v);
const char* to_string(CollectiveKind v);
const char* to_string(DType v);
const char* to_string(Payload v);
int dtype_bytes(DType v);

// Compute on the GPU: a module in a phase, for one micro-batch. Duration model: flops at the GEMM
// efficiency plus mem_bytes at the memory-bound efficiency (collective_cost.h / estimator.h).
// Units: the granularity of parameter gathers — the embedding, each layer, the head. Unit u holds layer
// u - 1 (unit 0 the embedding, unit L + 1 the head); its modules in forward order are its module slots
// (0 attention / embedding / head, 1 MLP or MoE). This is the one numbering every executor uses.
inline int unit_of_layer(int layer) {
  return layer + 1;
}
// The unit a module's costs belong to (ModuleCost numbers both the embedding and the head layer -1).
inline int unit_of_module(const ModuleCost& m, int layers) {
  return m.kind == ModuleKind::kEmbedding ? 0 : m.kind == ModuleKind::kHead ? layers + 1 : unit_of_layer(m.layer);
}
int module_slot(ModuleKind module);

struct ComputeOp {
  ModuleKind module = ModuleKind::kAttention;
  int unit = 0;    // Schedule::units
  int layer = -1;  // the unit's layer: -1 embedding, 0..L-1 layers, L head (as in every op kind)
  Phase phase = Phase::kForward;
  int micro_batch = 0;
  double flops = 0;
  double mem_bytes = 0;
  double fp8_flops = 0;   // of `flops`, those run at the GPU's FP8 peak (TrainingSpec::fp8)
  double core_flops = 0;  // of `flops`, the unfused attention core's (ModuleCost::fwd_core_flops) ...
  double core_bytes = 0;  // ... and its GEMMs' operand bytes: timed as max(FLOPs, bytes)
  // Of `flops`, the causal flash-attention kernel's (ModuleCost::fwd_flash_flops), at the GEMM rate times
  // flash_vs_gemm of the GPU at its head dimension and keys per call.
  double flash_flops = 0;
  int flash_head_dim = 0;
  double flash_seq = 0;
  // The other GEMMs of the op (the linear layers, the router, the LM head): how many kernels they launch and
  // the bytes of their operands. Their FLOPs are timed as max(FLOPs, bytes) plus the GPU's fixed cost per
  // GEMM (GpuSpec::gemm_overhead_s): the GEMM efficiency of a product by its shape.
  int gemms = 0;
  double gemm_bytes = 0;
  // The slot of the param_gather pool (PoolKind::kParamGather) holding the parameters this op reads,
  // acquired and filled before it; -1 when the schedule gathers nothing (parameters replicated).
  int gather_slot = -1;
};

// A collective over the group bound to `role`. `bytes` is the size of the full (unsharded) buffer the
// collective operates on, as nccl-tests counts it: for all-gather the output, for reduce-scatter the input,
// for all-reduce / broadcast the buffer, for all-to-all the send buffer of one rank.
struct CollectiveOp {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  CollectivePurpose purpose = CollectivePurpose::kGatherParams;
  StateKind state = StateKind::kDense;  // whose parameters or gradients it moves (dense for norm and all-to-all)
  int role = 0;                         // index into Schedule::roles
  std::int64_t bytes = 0;
  DType dtype = DType::kBf16;
  Payload payload = Payload::kParams;
  int unit = 0;    // Schedule::units; for a bucket of several units, the one whose backward
  int layer = -1;  // completes it (and that unit's layer)
  int micro_batch = 0;
  int bucket = -1;  // gradient reduction and parameter refresh: index into Schedule::buckets
  int module = -1;  // parameter all-gather of ONE module of the unit (its index in the unit, forward
                    // order: 0 attention, 1 MLP/MoE); -1 = the whole unit
  int root = -1;    // broadcast: the sending member's index in the group (policy.comm.param_refresh
                    // "broadcast": one per owner, bucket -1 = the owner's share of the whole model)
  // The param_gather slot this op fills (kGatherParams, kGatherSecondary) or whose parameters it reads (the
  // MoE all-to-alls: the router's); -1 for every other collective and when nothing is gathered.
  int gather_slot = -1;
};

// The AdamW update of this rank's optimizer shard of one unit: memory-bound.
struct OptimizerStepOp {
  int bucket = -1;  // index into Schedule::buckets
  int unit = 0;     // the bucket's last unit
  int layer = -1;
  std::int64_t shard_params = 0;
  double mem_bytes = 0;
};

// A fixed buffer pool slot taken / given back. Pools are sized once (Schedule::pools); a schedule never
// allocates in steady state, and peak memory counts the whole pool.
struct BufferAcquireOp {
  int pool = 0;
  int slot = 0;
  int unit = 0;
  int layer = -1;
  int bucket = -1;  // a gradient slot holds this bucket (Schedule::buckets); -1 for parameter slots
};
struct BufferReleaseOp {
  int pool = 0;
  int slot = 0;
  int unit = 0;
  int layer = -1;
  int bucket = -1;
};

using OpBody = std::variant<ComputeOp, CollectiveOp, OptimizerStepOp, BufferAcquireOp, BufferReleaseOp>;

struct Op {
  int stream = 0;         // index into Schedule::streams
  std::vector<int> deps;  // indices of earlier ops of the same program
  OpBody body;
  // Loop-carried dependencies: ops of the *previous* step this op waits for when steps run back to back
  // (e.g. the first read of a unit's parameters waits for last step's optimizer update of that unit).
  // Executors of a single step ignore them.
  std::vector<int> prev_step_deps;
};

struct ProcessGroup {
  GroupRole role = GroupRole::kParamShard;
  std::vector<int> ranks;   // global ranks in ring order
  bool intra_node = false;  // every member on one node
  int ranks_per_node = 0;   // members per node (s0)
  int nodes = 0;            // nodes spanned (s1)
};

struct BufferPool {
  PoolKind kind = PoolKind::kParamGather;
  std::string name;  // to_string(kind), for dumps and traces
  int slots = 0;
  std::int64_t slot_bytes = 0;
};

// Units whose gradients of one kind are reduced and updated together. Gradient collectives, refreshes and
// optimizer steps name their bucket; a buffer of a bucket is its units' parameters concatenated in this
// order, each unit's modules in forward order.
struct GradBucket {
  StateKind state = StateKind::kDense;  // expert buckets only with expert parallelism
  std::vector<int> units;               // Schedule::units, in backward order; the last one completes the bucket
};

struct UnitInfo {
  int layer = -1;                   // -1 embedding, 0..L-1, L head
  std::vector<ModuleKind> modules;  // in forward order: module slot i is modules[i]
};

// How one kind of state is sharded on every rank: its group sizes (AMSP notation: s_p parameters, s_g
// gradients, s_os optimizer states; replicas = D / s_os copies of each optimizer slice) and the roles of
// its groups. q = s_os / s_p optimizer slices make one parameter shard.
struct StateSharding {
  bool present = false;
  int s_p = 1, s_g = 1, s_os = 1, replicas = 1;
  int role_param = -1, role_grad = -1, role_refresh = -1, role_replica = -1;  // indices into Schedule::roles
  int q() const { return s_os / s_p; }
};

struct Program {
  std::vector<Op> ops;
};

// Model-state bytes each rank keeps resident for the whole run (set by the scheduler from its sharding).
struct StateBytesPerRank {
  double params = 0;
  double grads = 0;
  double optimizer = 0;
};

struct Schedule {
  Policy policy = Policy::kCustom;             // the scenario's policy.preset
  std::vector<StateBytesPerRank> state_bytes;  // per program (pipeline stages hold different layers)
  int world_size = 0;
  int gpus_per_node = 0;
  std::vector<StreamKind> streams;   // the streams the programs use; stream 0 is compute
  std::vector<GroupRole> roles;      // group roles used by collectives
  std::vector<ProcessGroup> groups;  // every concrete group, deterministic order
  std::vector<BufferPool> pools;
  std::vector<GradBucket> buckets;
  std::vector<UnitInfo> units;                                          // index = unit (unit_of_layer)
  std::array<StateSharding, 2> states;                                  // [StateKind]
  int role_secondary = -1, role_expert_parallel = -1, role_world = -1;  // indices into roles, -1 when absent
  std::vector<Program> programs;
  std::vector<int> rank_program;              // size world_size
  std::vector<std::vector<int>> rank_groups;  // [rank][role] -> index into groups

  const Program& program_of(int rank) const { return programs[rank_program[rank]]; }
  const ProcessGroup& group_of(int rank, int role) const { return groups[rank_groups[rank][role]]; }
  const StateSharding& state(StateKind kind) const { return states[static_cast<int>(kind)]; }
  // Index of `role` in `roles`, -1 when the schedule has no such group.
  int role_index(GroupRole role) const;
};

// Deterministic text dump of one rank's ops (or the group table etc. when rank < 0: everything).
// Stable across runs and platforms: golden tests diff it.
std::string dump_schedule(const Schedule& schedule, int rank);

}  // namespace hzp
