// The sharded data-parallel scheduler (see schedule_builder.h for the timeline it builds), in phases:
// groups (lay_out_groups) -> per stage: its layout (stage_layout.h: units, buckets, visits) and pools ->
// step-start refresh -> per compute visit: forward gathers, gradient slots, the modules' ops
// (module_ops.h), gradient reductions -> gradient norm -> optimizer steps.
#include "shared/schedule/schedule_builder.h"

#include <algorithm>
#include <array>
#include <utility>

#include "shared/scenario/pipeline_split.h"
#include "shared/schedule/module_ops.h"
#include "shared/schedule/program_builder.h"
#include "shared/schedule/sharding.h"
#include "shared/schedule/stage_layout.h"

namespace hzp {
namespace {

using namespace schedule_detail;

class DataParallelBuilder {
 public:
  DataParallelBuilder(const Scenario& scenario, const ModelCost& cost, const SchedulerOptions& options,
                      Schedule& schedule, int stage, const std::vector<int>& chunk_layers)
      : scenario_(scenario),
        overlap_(scenario.policy.overlap),
        refresh_stream_(options.dedicated_refresh_stream ? StreamKind::kParamRefresh : StreamKind::kReplicaSync),
        schedule_(schedule),
        layout_(scenario, cost, options, schedule, stage, chunk_layers) {}

  // Appends this stage's program to the schedule (whose groups lay_out_groups has set).
  void build() {
    lay_out_pools();
    ProgramBuilder prog(schedule_, overlap_.separate_streams);
    ModuleOps ops(layout_, schedule_, prog);
    prog_ = &prog;
    ops_ = &ops;
    refresh_parameters();
    gather_ops_.assign(layout_.visits.size(), {});
    gather_slot_.assign(layout_.visits.size(), -1);
    final_grad_op_.assign(layout_.buckets.size(), -1);
    grad_slot_.assign(layout_.buckets.size(), -1);
    for (std::size_t i = 0; i < layout_.visits.size(); ++i) run_visit(i);
    tied_embedding_sync();
    gradient_norm();
    optimizer_steps();
    schedule_.programs.push_back(prog.take());
  }

 private:
  int refresh_of(int unit, int k) const {
    return layout_.bucket_of[unit][k] < 0 ? -1 : refresh_op_[layout_.bucket_of[unit][k]];
  }

  // Fixed pools, sized once from the largest unit / bucket.
  void lay_out_pools() {
    std::int64_t max_unit = 0, max_bucket = 0;
    for (int k = 0; k < layout_.num_kinds; ++k) {
      any_gather_ = any_gather_ || layout_.kind(k).s_p > 1;
      any_reduce_ = any_reduce_ || layout_.kind(k).s_g > 1;
    }
    for (const Unit& u : layout_.units) max_unit = std::max(max_unit, u.params[kDense] + u.params[kExpert]);
    for (const Bucket& b : layout_.buckets)
      max_bucket = std::max(max_bucket, layout_.kind(b.kind).s_p > 1 ? 0 : b.params);
    const int gather_slots = overlap_.prefetch_depth + 1;
    const int reduce_slots = 2 * layout_.num_kinds;  // double-buffered per kind of state
    if (any_gather_)
      gather_pool_ =
          SlotPool(pool_of(PoolKind::kParamGather, gather_slots, layout_.param_bytes(max_unit)), gather_slots);
    if (any_reduce_)
      grad_pool_ =
          SlotPool(pool_of(PoolKind::kGradReduce, reduce_slots, layout_.grad_bytes(std::max(max_unit, max_bucket))),
                   reduce_slots, layout_.num_kinds);
  }

  // The schedule's pool of a kind (pipeline stages share it, sized for the largest stage's need).
  int pool_of(PoolKind kind, int slots, std::int64_t slot_bytes) {
    for (std::size_t i = 0; i < schedule_.pools.size(); ++i)
      if (schedule_.pools[i].kind == kind) {
        schedule_.pools[i].slot_bytes = std::max(schedule_.pools[i].slot_bytes, slot_bytes);
        return static_cast<int>(i);
      }
    schedule_.pools.push_back({kind, to_string(kind), slots, slot_bytes});
    return static_cast<int>(schedule_.pools.size()) - 1;
  }

  // --- Step start: refresh each bucket's parameters from last step's optimizer slices ---------------------
  // policy.comm.param_refresh: one all-gather per bucket over its refresh group, or one broadcast per owner
  // of the parameters it updated (owners: the ranks holding whole tensors, at most one per tensor). With
  // refresh_overlap off, every read of the step waits for the whole refresh.
  void refresh_parameters() {
    const CommSpec& comm = scenario_.policy.comm;
    refresh_op_.assign(layout_.buckets.size(), -1);
    refresh_start_.assign(layout_.buckets.size(), -1);
    if (comm.param_refresh == ParamRefresh::kBroadcast) {
      for (int k = 0; k < layout_.num_kinds; ++k) broadcast_refresh(k);
    } else {
      for (int b = static_cast<int>(layout_.buckets.size()) - 1; b >= 0; --b) {
        const StateSharding& g = layout_.kind(layout_.buckets[b].kind);
        if (g.q() <= 1) continue;
        const int u = layout_.buckets[b].units.back();
        refresh_op_[b] = refresh_start_[b] = prog_->add(
            refresh_stream_, {},
            layout_.collective(CollectiveKind::kAllGather, CollectivePurpose::kRefreshParams, layout_.buckets[b].kind,
                               g.role_refresh, layout_.param_bytes(layout_.buckets[b].params) / g.s_p, Payload::kParams,
                               u, 0, b));
      }
    }
    // Every refresh runs on one stream, so its last op completing means all have.
    if (!comm.refresh_overlap && !refresh_op_.empty()) {
      const int last = *std::max_element(refresh_op_.begin(), refresh_op_.end());
      for (int& r : refresh_op_)
        if (r >= 0) r = last;
    }
    // The first op of the step that reads each unit's parameters of each kind: it waits for last step's update.
    first_read_.assign(layout_.units.size(), {-1, -1});
    for (std::size_t b = 0; b < layout_.buckets.size(); ++b)
      for (int u : layout_.buckets[b].units) first_read_[u][layout_.buckets[b].kind] = refresh_op_[b];
  }

  void broadcast_refresh(int k) {
    const StateSharding& g = layout_.kind(k);
    if (g.q() <= 1) return;
    std::int64_t bytes = 0;
    int tensors = 0;
    for (const Bucket& bucket : layout_.buckets)
      if (bucket.kind == k) bytes += layout_.param_bytes(bucket.params) / g.s_p;
    for (const Unit& unit : layout_.units)
      for (const ModuleCost* m : unit.modules) tensors += m->tensors;
    const int owners = std::max(1, std::min(g.q(), tensors));
    int final_unit = 0;  // this stage's last unit
    for (int u = 0; u < static_cast<int>(layout_.units.size()); ++u)
      if (!layout_.units[u].modules.empty()) final_unit = u;
    int first = -1, last = -1;
    for (int i = 0; i < owners; ++i) {
      CollectiveOp c =
          layout_.collective(CollectiveKind::kBroadcast, CollectivePurpose::kRefreshParams, k, g.role_refresh,
                             bytes / owners + (i < bytes % owners ? 1 : 0), Payload::kParams, final_unit, 0, -1);
      c.root = static_cast<int>(static_cast<long long>(i) * g.q() / owners);
      last = prog_->add(refresh_stream_, {}, c);
      if (first < 0) first = last;
    }
    for (std::size_t b = 0; b < layout_.buckets.size(); ++b)
      if (layout_.buckets[b].kind == k) {
        refresh_op_[b] = last;
        refresh_start_[b] = first;  // later broadcasts follow it on the stream
      }
  }

  // Forward gathers: every visit up to `last` gets its slot and its all-gathers (prefetching).
  void gather_through(std::size_t last) {
    for (; any_gather_ && next_gather_ <= last && next_gather_ < layout_.visits.size(); ++next_gather_) {
      const Visit& v = layout_.visits[next_gather_];
      const int slot = gather_pool_.next_slot();
      const int acquire = prog_->add(StreamKind::kParamGather, {gather_pool_.last_release(slot)},
                                     BufferAcquireOp{gather_pool_.pool(), slot, v.unit, layout_.units[v.unit].layer});
      gather_slot_[next_gather_] = slot;
      for (int k = 0; k < layout_.num_kinds; ++k) {
        if (layout_.kind(k).s_p <= 1 || v.params[k] == 0) continue;
        // hpZ: backward gathers the dense parameters from the node's secondary copy.
        const bool from_secondary = k == kDense && schedule_.role_secondary >= 0 && v.phase == Phase::kBackward;
        // policy.comm.param_gather "tensor" (DeepSpeed ZeRO-3): one all-gather per large tensor of the visit.
        int pieces = 1;
        if (scenario_.policy.comm.param_gather == ParamGather::kTensor) {
          pieces = 0;
          for (const ModuleCost* m : v.modules) pieces += m->large_tensors;
          pieces = std::max(1, pieces);
        }
        const std::int64_t bytes = layout_.param_bytes(v.params[k]);
        for (int piece = 0; piece < pieces; ++piece) {
          CollectiveOp c = layout_.collective(
              CollectiveKind::kAllGather,
              from_secondary ? CollectivePurpose::kGatherSecondary : CollectivePurpose::kGatherParams, k,
              from_secondary ? schedule_.role_secondary : layout_.kind(k).role_param,
              bytes / pieces + (piece < bytes % pieces ? 1 : 0), Payload::kParams, v.unit, v.micro_batch, -1);
          c.module = v.module;
          c.gather_slot = slot;
          const int gather = prog_->add(StreamKind::kParamGather, {acquire, refresh_of(v.unit, k)}, c);
          gather_ops_[next_gather_].push_back(gather);
          if (first_read_[v.unit][k] < 0) first_read_[v.unit][k] = gather;
        }
      }
    }
  }

  void run_visit(std::size_t i) {
    const Visit& v = layout_.visits[i];
    gather_through(i + overlap_.prefetch_depth);
    ops_->set_visit_slot(any_gather_ ? gather_slot_[i] : -1);
    std::vector<int> deps = gather_ops_[i];
    for (int k = 0; k < layout_.num_kinds; ++k)
      if (layout_.kind(k).s_p == 1) deps.push_back(refresh_of(v.unit, k));
    // policy.comm.grad_reduce_overlap off: the backward goes on once the reduction before the last is done.
    if (blocking_reduce_ >= 0) deps.push_back(std::exchange(blocking_reduce_, -1));

    // Pipelined: the chunk's input activations (forward) or its output's gradients (backward) come from the
    // neighbouring stage first.
    const int chunk = layout_.chunk_of(v.unit);
    if (v.phase == Phase::kForward && chunk > 0 && v.unit == layout_.first_unit(chunk))
      deps.push_back(pipe_transfer(CollectivePurpose::kPipeActivations, chunk - 1, v.micro_batch, false, {}));
    if (v.phase == Phase::kBackward && chunk + 1 < layout_.chunks && v.unit == layout_.last_unit(chunk) &&
        v.first_of_unit)
      deps.push_back(pipe_transfer(CollectivePurpose::kPipeGrads, chunk + 1, v.micro_batch, false, {}));

    // Backward writes each sharded kind's gradients into a reduce slot taken when its bucket starts.
    for (int k = 0; k < layout_.num_kinds && v.phase == Phase::kBackward; ++k) {
      const int b = layout_.bucket_of[v.unit][k];
      if (b < 0 || layout_.kind(k).s_g <= 1 || v.unit != layout_.buckets[b].units.front() || !v.first_of_unit) continue;
      grad_slot_[b] = grad_pool_.next_slot(k);
      deps.push_back(prog_->add(StreamKind::kCompute, {grad_pool_.last_release(grad_slot_[b])},
                                BufferAcquireOp{grad_pool_.pool(), grad_slot_[b], v.unit, layout_.units[v.unit].layer,
                                                b + layout_.bucket_base}));
    }

    int last_compute = -1;
    if (v.phase == Phase::kForward) {
      for (const ModuleCost* m : v.modules) {
        last_compute = ops_->compute(m, v.unit, Phase::kForward, v.micro_batch, deps);
        deps = {last_compute};
        for (int k = 0; k < layout_.num_kinds; ++k)
          if (first_read_[v.unit][k] < 0) first_read_[v.unit][k] = last_compute;
      }
    } else {
      for (const ModuleCost* m : v.modules)
        if (m->recompute_flops > 0 || m->recompute_mem_bytes > 0)
          deps = {ops_->compute(m, v.unit, Phase::kRecompute, v.micro_batch, deps)};
      for (auto it = v.modules.rbegin(); it != v.modules.rend(); ++it) {
        last_compute = ops_->compute(*it, v.unit, Phase::kBackward, v.micro_batch, deps);
        deps = {last_compute};
      }
    }
    // What the visit's consumers wait for: its last compute, and an attention exchange still running beside
    // it (which the next compute waits for as well).
    std::vector<int> done{last_compute};
    done.insert(done.end(), ops_->pending_exchanges().begin(), ops_->pending_exchanges().end());
    if (any_gather_) {
      const int release =
          prog_->add(StreamKind::kCompute, {last_compute},
                     BufferReleaseOp{gather_pool_.pool(), gather_slot_[i], v.unit, layout_.units[v.unit].layer});
      gather_pool_.set_release(gather_slot_[i], release);
    }
    // Pipelined: the chunk's output goes on to the next stage, its input's gradient back to the previous.
    if (v.phase == Phase::kForward && chunk + 1 < layout_.chunks && v.unit == layout_.last_unit(chunk))
      pipe_transfer(CollectivePurpose::kPipeActivations, chunk, v.micro_batch, true, done);
    if (v.phase == Phase::kBackward && chunk > 0 && v.unit == layout_.first_unit(chunk) && v.last_of_unit)
      pipe_transfer(CollectivePurpose::kPipeGrads, chunk, v.micro_batch, true, done);
    if (v.phase == Phase::kBackward) reduce_gradients(v, done);
  }

  // One pipeline transfer from model chunk `from` (activations to chunk from + 1, gradients to from - 1),
  // seen from this stage: sending (on the compute stream, which waits until it is delivered, as Megatron's
  // blocking send / receive does) or receiving (posted on a stream of its own, so it never blocks the
  // sender behind this stage's compute). Megatron's scatter / gather optimization sends 1 / tensor of the
  // activations per tensor rank (Narayanan et al. 2021, §4.1); the all-gather inside the node after it is
  // not modelled.
  int pipe_transfer(CollectivePurpose purpose, int from, int mb, bool send, std::vector<int> deps) {
    const bool act = purpose == CollectivePurpose::kPipeActivations;
    const int p = scenario_.mesh.pipeline;
    const int from_stage = from % p;
    // The link's lower end (activations flow from it, gradients to it).
    const int link = act ? from_stage : (from_stage + p - 1) % p;
    static constexpr GroupRole kAct[3] = {GroupRole::kPipeActEven, GroupRole::kPipeActOdd, GroupRole::kPipeActWrap};
    static constexpr GroupRole kGrad[3] = {GroupRole::kPipeGradEven, GroupRole::kPipeGradOdd, GroupRole::kPipeGradWrap};
    const int colour = pipe_link_colour(link, p);
    const int role = schedule_.role_index(act ? kAct[colour] : kGrad[colour]);
    const int unit = act ? layout_.last_unit(from) : layout_.first_unit(from);
    CollectiveOp c =
        layout_.collective(CollectiveKind::kBroadcast, purpose, kDense, role, layout_.act_bytes / scenario_.mesh.tensor,
                           act ? Payload::kActivations : Payload::kGrads, unit, mb, -1);
    c.root = 0;  // the group lists the sender first
    return prog_->add(send ? StreamKind::kCompute : (act ? StreamKind::kPipeRecvAct : StreamKind::kPipeRecvGrad),
                      std::move(deps), c);
  }

  // --- Gradient reductions of each bucket whose last unit has just finished its backward -----------------
  void reduce_gradients(const Visit& v, const std::vector<int>& done) {
    const bool last_mb = v.micro_batch == layout_.micro_batches - 1;
    for (int k = 0; k < layout_.num_kinds; ++k) {
      const int b = layout_.bucket_of[v.unit][k];
      if (b < 0 || v.unit != layout_.buckets[b].units.back() || !v.last_of_unit) continue;
      const StateSharding& g = layout_.kind(k);
      std::int64_t bytes = layout_.grad_bytes(layout_.buckets[b].params);
      int prev = done.front();
      // The first reduction waits for everything the visit did; the next ones for the one before.
      const auto after = [&] { return prev == done.front() ? done : std::vector<int>{prev}; };
      if (g.s_g > 1) {  // every micro-batch: a sharded gradient cannot accumulate unsharded
        prev = prog_->add(StreamKind::kGradReduce, after(),
                          layout_.collective(CollectiveKind::kReduceScatter, CollectivePurpose::kReduceGrads, k,
                                             g.role_grad, bytes, Payload::kGrads, v.unit, v.micro_batch, b));
        const int release = prog_->add(StreamKind::kGradReduce, {prev},
                                       BufferReleaseOp{grad_pool_.pool(), grad_slot_[b], v.unit,
                                                       layout_.units[v.unit].layer, b + layout_.bucket_base});
        grad_pool_.set_release(grad_slot_[b], release);
        bytes /= g.s_g;
      }
      if (!last_mb) continue;
      const int q_grad = g.s_os / g.s_g;
      if (q_grad > 1) {
        // policy.comm.grad_reduce: reduce-scatter to the slice, or all-reduce everything and keep the slice.
        const CollectiveKind how = scenario_.policy.comm.grad_reduce == GradReduce::kAllReduce
                                       ? CollectiveKind::kAllReduce
                                       : CollectiveKind::kReduceScatter;
        prev = prog_->add(StreamKind::kReplicaSync, after(),
                          layout_.collective(how, CollectivePurpose::kReduceToOptimizer, k, g.role_refresh, bytes,
                                             Payload::kGrads, v.unit, v.micro_batch, b));
        bytes /= q_grad;
      }
      if (g.replicas > 1)
        prev = prog_->add(StreamKind::kReplicaSync, after(),
                          layout_.collective(CollectiveKind::kAllReduce, CollectivePurpose::kSyncReplicas, k,
                                             g.role_replica, bytes, Payload::kGrads, v.unit, v.micro_batch, b));
      final_grad_op_[b] = prev;
      // grad_reduce_overlap off (InternEvo): the host synchronizes the device before issuing each bucket's
      // reduction, so the backward after it waits for the previous bucket's reduction (one in flight).
      if (!scenario_.policy.comm.grad_reduce_overlap) blocking_reduce_ = std::exchange(last_reduce_, prev);
    }
  }

  // --- Gradient clipping needs the norm over every shard before any update: a world all-reduce of each
  // rank's partial squared norm once all gradients are final (as FSDP's clip_grad_norm_ / DeepSpeed do).
  // Pipelined with tied embeddings, the first stage's word embeddings and the last stage's copy each get the
  // sum of both gradients: an all-reduce of the whole word-embedding gradient (V·h / tensor) between the two
  // once a step, after the data-parallel reduction and before clipping and the optimizer, on the compute
  // stream (Megatron-LM's _allreduce_word_embedding_grads in finalize_model_grads).
  void tied_embedding_sync() {
    if (scenario_.mesh.pipeline == 1 || !scenario_.model.tied_embeddings) return;
    const int head = static_cast<int>(layout_.units.size()) - 1;
    const int unit = layout_.on_stage(0) ? 0 : layout_.on_stage(head) ? head : -1;
    if (unit < 0) return;
    const int b = layout_.bucket_of[unit][kDense];
    const std::int64_t params =
        (scenario_.model.vocab * scenario_.model.hidden + scenario_.mesh.tensor - 1) / scenario_.mesh.tensor;
    CollectiveOp c =
        layout_.collective(CollectiveKind::kAllReduce, CollectivePurpose::kEmbeddingGrads, kDense,
                           schedule_.role_index(GroupRole::kEmbedding), layout_.grad_bytes(params), Payload::kGrads, 0,
                           static_cast<int>(layout_.micro_batches) - 1, -1);  // the embedding's, on both ends
    final_grad_op_[b] = prog_->add(StreamKind::kCompute, {final_grad_op_[b]}, c);
  }

  // fp16 needs the same all-reduce without clipping: dynamic loss scaling skips the update when any rank's
  // gradients overflowed, which the global norm shows (Inf/NaN) to every rank at once (DeepSpeed's and
  // Megatron-LM's fp16 optimizers all-reduce an overflow flag at this point).
  void gradient_norm() {
    if (scenario_.training.grad_clip <= 0 && scenario_.training.precision != Precision::kFp16) return;
    if (schedule_.role_world < 0) add_world_group();
    CollectiveOp c = layout_.collective(
        CollectiveKind::kAllReduce, CollectivePurpose::kGradNorm, kDense, schedule_.role_world, 4, Payload::kGradNorm,
        static_cast<int>(layout_.units.size()) - 1, static_cast<int>(layout_.micro_batches) - 1, -1);
    c.dtype = DType::kFp32;
    norm_op_ = prog_->add(StreamKind::kCompute, final_grad_op_, c);
  }
  void add_world_group() {
    const int world = schedule_.world_size;
    ProcessGroup world_group{GroupRole::kWorld,
                             {},
                             world <= scenario_.cluster.gpus_per_node,
                             std::min(world, scenario_.cluster.gpus_per_node),
                             scenario_.cluster.nodes};
    for (int r = 0; r < world; ++r) world_group.ranks.push_back(r);
    schedule_.role_world = static_cast<int>(schedule_.roles.size());
    schedule_.roles.push_back(GroupRole::kWorld);
    schedule_.groups.push_back(std::move(world_group));
    for (std::vector<int>& g : schedule_.rank_groups) g.push_back(static_cast<int>(schedule_.groups.size()) - 1);
  }

  // --- Step end: AdamW on each bucket's optimizer slice as soon as its gradients are final ---------------
  void optimizer_steps() {
    for (std::size_t b = 0; b < layout_.buckets.size(); ++b) {
      const std::int64_t shard = layout_.buckets[b].params / layout_.kind(layout_.buckets[b].kind).s_os;
      const int u = layout_.buckets[b].units.back();
      const int update = prog_->add(StreamKind::kCompute, {norm_op_ >= 0 ? norm_op_ : final_grad_op_[b]},
                                    OptimizerStepOp{static_cast<int>(b) + layout_.bucket_base, u,
                                                    layout_.units[u].layer, shard, shard * kAdamBytesPerParam});
      // The refresh of this bucket (or, broadcasting, the first broadcast of its kind) waits for the update.
      if (refresh_start_[b] >= 0) prog_->op(refresh_start_[b]).prev_step_deps.push_back(update);
      for (int unit : layout_.buckets[b].units) {
        const int read = first_read_[unit][layout_.buckets[b].kind];
        if (read != refresh_start_[b]) prog_->op(read).prev_step_deps.push_back(update);
      }
    }
  }

  const Scenario& scenario_;
  const OverlapSpec& overlap_;
  const StreamKind refresh_stream_;
  Schedule& schedule_;
  const StageLayout layout_;  // units, buckets, visits (stage_layout.h)
  ProgramBuilder* prog_ = nullptr;
  ModuleOps* ops_ = nullptr;  // a module's compute and the collectives around it (module_ops.h)
  bool any_gather_ = false, any_reduce_ = false;
  SlotPool gather_pool_{-1, 1}, grad_pool_{-1, 1};
  std::vector<int> refresh_op_;                 // per bucket: what its readers wait for
  std::vector<int> refresh_start_;              // per bucket: the refresh op that waits for its update
  std::vector<std::array<int, 2>> first_read_;  // [unit][kind]
  std::vector<std::vector<int>> gather_ops_;    // per visit
  std::vector<int> gather_slot_;                // per visit
  std::size_t next_gather_ = 0;
  std::vector<int> final_grad_op_;  // per bucket
  std::vector<int> grad_slot_;      // per bucket
  int norm_op_ = -1;
  int blocking_reduce_ = -1;  // a once-a-step reduction the next compute waits for (grad_reduce_overlap off)
  int last_reduce_ = -1;      // the last once-a-step reduction issued
};

// The process groups of every role (sharding.h), each rank's program (its pipeline stage), and each kind of
// state's group sizes.
Status lay_out_groups(const Scenario& scenario, const SchedulerOptions& options, Schedule& schedule) {
  const ParallelMesh& mesh = scenario.mesh;
  const int ep = mesh.expert;
  // The secondary copy only helps when parameters are sharded beyond the node.
  const bool secondary = options.secondary_param_copy && scenario.policy.sharding.params.s1 > 1;
  HZP_ASSIGN_OR_RETURN(ShardingLayout layout,
                       build_sharding_layout(scenario.cluster, mesh, scenario.policy.sharding,
                                             LayoutOptions{secondary, scenario.policy.parallel.virtual_stages > 1,
                                                           scenario.model.tied_embeddings}));
  const int world = scenario.cluster.world_size();
  schedule.world_size = world;
  schedule.gpus_per_node = scenario.cluster.gpus_per_node;
  schedule.roles = layout.roles;
  schedule.groups = std::move(layout.groups);
  schedule.rank_groups = std::move(layout.rank_groups);
  schedule.rank_program.resize(world);
  for (int r = 0; r < world; ++r) schedule.rank_program[r] = mesh.stage(r);
  auto state_of = [&](GroupRole param, GroupRole grad, GroupRole refresh, GroupRole replica) {
    StateSharding s;
    s.present = true;
    s.role_param = layout.role(param);
    s.role_grad = layout.role(grad);
    s.role_refresh = layout.role(refresh);
    s.role_replica = layout.role(replica);
    auto size = [&](int role) { return static_cast<int>(schedule.group_of(0, role).ranks.size()); };
    s.s_p = size(s.role_param);
    s.s_g = size(s.role_grad);
    s.s_os = s.s_p * size(s.role_refresh);
    s.replicas = size(s.role_replica);
    return s;
  };
  schedule.states[kDense] =
      state_of(GroupRole::kParamShard, GroupRole::kGradShard, GroupRole::kParamRefresh, GroupRole::kOsReplica);
  if (ep > 1)
    schedule.states[kExpert] = state_of(GroupRole::kExpertParamShard, GroupRole::kExpertGradShard,
                                        GroupRole::kExpertParamRefresh, GroupRole::kExpertOsReplica);
  schedule.role_secondary = secondary ? layout.role(GroupRole::kParamSecondary) : -1;
  schedule.role_expert_parallel = ep > 1 ? layout.role(GroupRole::kExpertParallel) : -1;
  return Status::Ok();
}

}  // namespace

Result<Schedule> build_data_parallel_schedule(const Scenario& scenario, const ModelCost& cost,
                                              const SchedulerOptions& options) {
  Schedule schedule;
  schedule.policy = scenario.policy.preset;
  HZP_RETURN_IF_ERROR(lay_out_groups(scenario, options, schedule));
  HZP_ASSIGN_OR_RETURN(const std::vector<int> split, chunk_layers(scenario.model.layers, scenario.policy.parallel));
  if (static_cast<int>(split.size()) != scenario.mesh.pipeline * scenario.policy.parallel.virtual_stages)
    return Status::Internal("schedule: policy.parallel.pipeline differs from the mesh's");
  for (int stage = 0; stage < scenario.mesh.pipeline; ++stage)
    DataParallelBuilder(scenario, cost, options, schedule, stage, split).build();
  return schedule;
}

Result<Schedule> build_schedule(const Scenario& scenario, const ModelCost& cost) {
  return build_data_parallel_schedule(scenario, cost, policy_entry(scenario.policy.preset).options);
}

}  // namespace hzp
