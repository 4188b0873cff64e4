// Internal to schedule/: what one pipeline stage's program is built on, decided before any op exists —
// its parameter units, the gradient buckets, the order of its compute visits (pipeline_order: 1F1B or
// interleaved), and the sizes every op of the stage is made with.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/policy/policy_registry.h"
#include "shared/scenario/scenario.h"
#include "shared/schedule/sharding.h"

namespace hzp::schedule_detail {

inline constexpr int kDense = static_cast<int>(StateKind::kDense);
inline constexpr int kExpert = static_cast<int>(StateKind::kExpert);

// A parameter unit as the builder sees it: its modules' costs and its parameters per state kind.
struct Unit {
  int layer = -1;                               // -1 embedding, 0..L-1 layers, L head
  std::vector<const ModuleCost*> modules;       // forward order
  std::array<std::int64_t, 2> params = {0, 0};  // per kind: parameters this rank's EP slot uses
};

// Consecutive units (in backward order) whose gradients of one kind are reduced together.
struct Bucket {
  int kind = kDense;
  std::vector<int> units;  // backward order; the last one completes the bucket
  std::int64_t params = 0;
};

// A computation of some modules of one unit with their parameters gathered: the whole unit, or — for
// AsyncHZP's backward with prefetching and no recomputation — one module, so that the next module's gather
// overlaps this one's backward.
struct Visit {
  int unit;
  Phase phase;
  int micro_batch;
  std::vector<const ModuleCost*> modules;  // forward order
  std::array<std::int64_t, 2> params;      // per kind, gathered for this visit
  bool first_of_unit;                      // in execution order
  bool last_of_unit;
  int module = -1;  // module slot of a one-module visit
};

struct StageLayout {
  // Lays out `stage` of the scenario (whose groups are in `schedule`) and records its units, buckets and
  // resident state bytes in `schedule`.
  // `chunk_layers`: the transformer layers of each model chunk (pipeline_split.h).
  StageLayout(const Scenario& scenario, const ModelCost& cost, const SchedulerOptions& options, Schedule& schedule,
              int stage, const std::vector<int>& chunk_layers);

  const Scenario& scenario;
  const Schedule& schedule;
  const int stage;      // the pipeline stage this program runs
  const int chunks;     // model chunks: pipeline x virtual_stages
  const int ep;         // expert parallelism
  const int num_kinds;  // kinds of state: dense, and expert with expert parallelism
  const StateBytes state;
  const DType dtype;
  const long long micro_batches;
  const bool secondary;          // hpZ's secondary parameter copy (parameters sharded beyond the node)
  const std::int64_t act_bytes;  // one micro-batch's activations between blocks (b·s·h / context elements)
  const int bucket_base;         // this stage's first bucket in Schedule::buckets

  std::vector<int> chunk_begin;  // [chunk]: the chunk's first transformer layer; [chunks]: the layer count
  std::vector<Unit> units;
  std::vector<Bucket> buckets;
  std::vector<std::array<int, 2>> bucket_of;  // [unit][kind] -> bucket
  std::vector<Visit> visits;

  // The model chunk (0 .. pipeline x virtual_stages - 1, in model order) holding a unit: chunk k runs on
  // stage k % pipeline as its virtual stage k / pipeline (Megatron's interleaved assignment); the embedding
  // is in the first chunk, the head in the last.
  int chunk_of(int unit) const {
    const int layers = scenario.model.layers;
    if (unit == 0) return 0;
    if (unit == layers + 1) return chunks - 1;
    return static_cast<int>(std::upper_bound(chunk_begin.begin(), chunk_begin.end(), unit - 1) - chunk_begin.begin()) -
           1;
  }
  bool on_stage(int unit) const { return chunk_of(unit) % scenario.mesh.pipeline == stage; }
  int first_unit(int chunk) const { return chunk == 0 ? 0 : unit_of_layer(chunk_begin[chunk]); }
  int last_unit(int chunk) const {
    return chunk == chunks - 1 ? scenario.model.layers + 1 : unit_of_layer(chunk_begin[chunk + 1] - 1);
  }
  const StateSharding& kind(int k) const { return schedule.states[k]; }
  std::int64_t param_bytes(std::int64_t params) const { return static_cast<std::int64_t>(params * state.param); }
  std::int64_t grad_bytes(std::int64_t params) const { return static_cast<std::int64_t>(params * state.grad); }
  // A collective of this stage, in the working precision, naming `unit`'s layer and this stage's bucket.
  CollectiveOp collective(CollectiveKind k, CollectivePurpose purpose, int state_kind, int role, std::int64_t bytes,
                          Payload payload, int unit, int mb, int bucket) const;

 private:
  void lay_out_units_and_buckets(const ModelCost& cost, Schedule& schedule);
  // visits: the compute visits of the whole step, in order (prefetching runs across micro-batches).
  // The order in which this stage runs (phase, model chunk, micro-batch) passes. Without pipelining: each
  // micro-batch's forward then its backward. Pipelined, Megatron-LM's schedules (Narayanan et al. 2021,
  // §2.2): 1F1B runs pipeline - stage - 1 warm-up forwards, then alternates one forward and one backward,
  // then drains the backwards; interleaved 1F1B does the same over virtual_stages chunks per stage, with
  // 2·(pipeline - stage - 1) + (virtual_stages - 1)·pipeline warm-up passes, and its k-th forward (or
  // backward) pass takes micro-batch (k / (p·v))·p + k % p of chunk (k % (p·v)) / p (reversed for backward).
  struct Pass {
    Phase phase;
    int chunk;  // global model chunk
    int mb;
  };
  std::vector<Pass> pipeline_order() const;
  void plan_visits(const SchedulerOptions& options);
};

}  // namespace hzp::schedule_detail
