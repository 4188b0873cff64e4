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
// `rank_program[r]` says which one rank r runs. Collectives name a group *role* (e.g. "param shard"),
// bound per rank to a concrete ProcessGroup by `rank_groups[r][role]`. This keeps a 8192-GPU ZeRO schedule
// at one program of a few thousand ops instead of 8192 copies. `ops_of(rank)` resolves roles for a rank.
#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "model_math.h"

namespace hzp {

enum class Phase { kForward, kBackward, kRecompute };
enum class CollectiveKind { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kAllToAll };
enum class DType { kBf16, kFp16, kFp32 };
// What a collective moves; lets executors and reports attribute communication to a state.
// kGradNorm: the partial squared L2 norms of every rank's final gradient shards, summed over the world
// before clipping (the executor computes its partial sum when the all-reduce is due).
enum class Payload { kParams, kGrads, kActivations, kGradNorm };

const char* to_string(Phase v);
const char* to_string(CollectiveKind v);
const char* to_string(DType v);
const char* to_string(Payload v);
int dtype_bytes(DType v);

// Compute on the GPU: a module in a phase, for one micro-batch. Duration model: flops at the GEMM
// efficiency plus mem_bytes at the memory-bound efficiency (collective_cost.h / estimator.h).
struct ComputeOp {
  ModuleKind module = ModuleKind::kAttention;
  int layer = -1;            // unit: -1 embedding, 0..L-1 layers, L head (as in every op kind)
  Phase phase = Phase::kForward;
  int micro_batch = 0;
  double flops = 0;
  double mem_bytes = 0;
};

// A collective over the group bound to `role`. `bytes` is the size of the full (unsharded) buffer the
// collective operates on, as nccl-tests counts it: for all-gather the output, for reduce-scatter the input,
// for all-reduce / broadcast the buffer, for all-to-all the send buffer of one rank.
struct CollectiveOp {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  int role = 0;              // index into Schedule::roles
  std::int64_t bytes = 0;
  DType dtype = DType::kBf16;
  Payload payload = Payload::kParams;
  int layer = -1;            // unit (-1 embedding, 0..L-1 layers, L head); for a bucket of several units, the
                             // one whose backward completes it
  int micro_batch = 0;
  int bucket = -1;           // gradient reduction and parameter refresh: index into Schedule::buckets
  int module = -1;           // parameter all-gather of ONE module of the unit (its index in the unit, forward
                             // order: 0 attention, 1 MLP/MoE); -1 = the whole unit
};

// The AdamW update of this rank's optimizer shard of one unit: memory-bound.
struct OptimizerStepOp {
  int bucket = -1;           // index into Schedule::buckets
  int layer = -1;
  std::int64_t shard_params = 0;
  double mem_bytes = 0;
};

// A fixed buffer pool slot taken / given back. Pools are sized once (Schedule::pools); a schedule never
// allocates in steady state, and peak memory counts the whole pool.
struct BufferAcquireOp {
  int pool = 0;
  int slot = 0;
  int layer = -1;
  int bucket = -1;           // a gradient slot holds this bucket (Schedule::buckets); -1 for parameter slots
};
struct BufferReleaseOp {
  int pool = 0;
  int slot = 0;
  int layer = -1;
  int bucket = -1;
};

using OpBody = std::variant<ComputeOp, CollectiveOp, OptimizerStepOp, BufferAcquireOp, BufferReleaseOp>;

struct Op {
  int stream = 0;            // index into Schedule::streams
  std::vector<int> deps;     // indices of earlier ops of the same program
  OpBody body;
  // Loop-carried dependencies: ops of the *previous* step this op waits for when steps run back to back
  // (e.g. the first read of a unit's parameters waits for last step's optimizer update of that unit).
  // Executors of a single step ignore them.
  std::vector<int> prev_step_deps;
};

struct ProcessGroup {
  std::string role;          // same as Schedule::roles[role index]
  std::vector<int> ranks;    // global ranks in ring order
  bool intra_node = false;   // every member on one node
  int ranks_per_node = 0;    // members per node (s0)
  int nodes = 0;             // nodes spanned (s1)
};

struct BufferPool {
  std::string name;
  int slots = 0;
  std::int64_t slot_bytes = 0;
};

// Units whose gradients of one kind are reduced and updated together. Gradient collectives, refreshes and
// optimizer steps name their bucket; a buffer of a bucket is its units' parameters concatenated in this
// order, each unit's modules in forward order.
struct GradBucket {
  int kind = 0;              // 0 dense states, 1 expert states (expert parallelism only)
  std::vector<int> layers;   // units in backward order (-1 embedding, 0..L-1, L head)
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
  std::string policy;
  StateBytesPerRank state_bytes;
  int world_size = 0;
  int gpus_per_node = 0;
  std::vector<std::string> streams;       // e.g. {"compute", "allgather", "reduce_scatter", "allreduce"}
  std::vector<std::string> roles;         // group roles used by collectives
  std::vector<ProcessGroup> groups;       // every concrete group, deterministic order
  std::vector<BufferPool> pools;
  std::vector<GradBucket> buckets;
  std::vector<Program> programs;
  std::vector<int> rank_program;          // size world_size
  std::vector<std::vector<int>> rank_groups;  // [rank][role] -> index into groups

  const Program& program_of(int rank) const { return programs[rank_program[rank]]; }
  const ProcessGroup& group_of(int rank, int role) const { return groups[rank_groups[rank][role]]; }
};

// Deterministic text dump of one rank's ops (or the group table etc. when rank < 0: everything).
// Stable across runs and platforms: golden tests diff it.
std::string dump_schedule(const Schedule& schedule, int rank);

}  // namespace hzp
