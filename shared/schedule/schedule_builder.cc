// The sharded data-parallel scheduler (see schedule_builder.h for the timeline it builds), in phases:
// layout (groups, units, buckets, pools) -> step-start refresh -> per compute visit: forward gathers,
// gradient slots, compute, gradient reductions -> gradient norm -> optimizer steps.
#include "shared/schedule/schedule_builder.h"

#include <algorithm>
#include <array>
#include <utility>

#include "shared/schedule/sharding.h"

namespace hzp {
namespace {

constexpr int kDense = static_cast<int>(StateKind::kDense);
constexpr int kExpert = static_cast<int>(StateKind::kExpert);

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

// Appends ops to one program; streams are created on first use so unused ones do not appear.
class ProgramBuilder {
 public:
  ProgramBuilder(Schedule& schedule, bool separate_streams) : schedule_(schedule), separate_(separate_streams) {
    stream_index(StreamKind::kCompute);  // stream 0 is always the compute stream
  }
  int add(StreamKind stream, std::vector<int> deps, OpBody body) {
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    deps.erase(std::remove(deps.begin(), deps.end(), -1), deps.end());
    const bool own = separate_ || own_queue(stream);
    program_.ops.push_back(Op{stream_index(own ? stream : StreamKind::kCompute), std::move(deps), std::move(body), {}});
    return static_cast<int>(program_.ops.size()) - 1;
  }
  Program take() { return std::move(program_); }
  Op& op(int index) { return program_.ops[index]; }

 private:
  int stream_index(StreamKind kind) {
    auto it = std::find(schedule_.streams.begin(), schedule_.streams.end(), kind);
    if (it != schedule_.streams.end()) return static_cast<int>(it - schedule_.streams.begin());
    schedule_.streams.push_back(kind);
    return static_cast<int>(schedule_.streams.size()) - 1;
  }
  Schedule& schedule_;
  bool separate_;
  Program program_;
};

// A fixed pool of slots, split into `rings` equal rings each handed out round-robin; a slot's next acquire
// waits for its previous release. Round-robin is only safe when a ring's holders release in the order they
// acquired: gradient buckets of one kind do, but a dense bucket spanning several units outlives expert
// buckets, so each kind of state gets a ring of its own (one shared ring handed a still-held slot).
class SlotPool {
 public:
  SlotPool(int pool, int slots, int rings = 1)
      : pool_(pool), per_ring_(slots / rings), counters_(rings, 0), last_release_(slots, -1) {}
  int pool() const { return pool_; }
  int next_slot(int ring = 0) { return ring * per_ring_ + static_cast<int>(counters_[ring]++ % per_ring_); }
  int last_release(int slot) const { return last_release_[slot]; }
  void set_release(int slot, int op) { last_release_[slot] = op; }

 private:
  int pool_;
  int per_ring_;
  std::vector<long long> counters_;
  std::vector<int> last_release_;
};

class DataParallelBuilder {
 public:
  DataParallelBuilder(const Scenario& scenario, const ModelCost& cost, const SchedulerOptions& options,
                      Schedule& schedule, int stage)
      : scenario_(scenario),
        cost_(cost),
        options_(options),
        overlap_(scenario.policy.overlap),
        ep_(scenario.mesh.expert),
        num_kinds_(ep_ > 1 ? 2 : 1),
        state_(state_bytes_per_param(scenario.training.precision, scenario.policy.comm.grad_reduce_in_fp32)),
        dtype_(scenario.training.precision == Precision::kFp32   ? DType::kFp32
               : scenario.training.precision == Precision::kFp16 ? DType::kFp16
                                                                 : DType::kBf16),
        micro_batches_(scenario.grad_accum_steps()),
        // The secondary copy only helps when parameters are sharded beyond the node.
        secondary_(options.secondary_param_copy && scenario.policy.sharding.params.s1 > 1),
        refresh_stream_(options.dedicated_refresh_stream ? StreamKind::kParamRefresh : StreamKind::kReplicaSync),
        mesh_(scenario.mesh),
        parallel_(scenario.policy.parallel),
        stage_(stage),
        chunks_(mesh_.pipeline * parallel_.virtual_stages),
        act_bytes_(static_cast<std::int64_t>(scenario.training.micro_batch * scenario.training.seq_len / mesh_.context *
                                             scenario.model.hidden * dtype_bytes(dtype_))),
        schedule_(schedule),
        bucket_base_(static_cast<int>(schedule.buckets.size())) {}

  // Appends this stage's program to the schedule (whose groups lay_out_groups has set).
  void build() {
    lay_out_units_and_buckets();
    lay_out_pools();
    ProgramBuilder prog(schedule_, overlap_.separate_streams);
    prog_ = &prog;
    refresh_parameters();
    plan_visits();
    for (std::size_t i = 0; i < visits_.size(); ++i) run_visit(i);
    tied_embedding_sync();
    gradient_norm();
    optimizer_steps();
    schedule_.programs.push_back(prog.take());
  }

 private:
  std::int64_t param_bytes(std::int64_t params) const { return static_cast<std::int64_t>(params * state_.param); }
  std::int64_t grad_bytes(std::int64_t params) const { return static_cast<std::int64_t>(params * state_.grad); }
  const StateSharding& kind(int k) const { return schedule_.states[k]; }
  int refresh_of(int unit, int k) const { return bucket_of_[unit][k] < 0 ? -1 : refresh_op_[bucket_of_[unit][k]]; }

  // --- Layout ------------------------------------------------------------------------------------------
  // The model chunk (0 .. pipeline x virtual_stages - 1, in model order) holding a unit: chunk k runs on
  // stage k % pipeline as its virtual stage k / pipeline (Megatron's interleaved assignment); the embedding
  // is in the first chunk, the head in the last.
  int chunk_of(int unit) const {
    const int layers = scenario_.model.layers;
    if (unit == 0) return 0;
    if (unit == layers + 1) return chunks_ - 1;
    return (unit - 1) / (layers / chunks_);
  }
  bool on_stage(int unit) const { return chunk_of(unit) % mesh_.pipeline == stage_; }
  int first_unit(int chunk) const { return chunk == 0 ? 0 : unit_of_layer(chunk * (scenario_.model.layers / chunks_)); }
  int last_unit(int chunk) const {
    return chunk == chunks_ - 1 ? scenario_.model.layers + 1
                                : unit_of_layer((chunk + 1) * (scenario_.model.layers / chunks_) - 1);
  }

  void lay_out_units_and_buckets() {
    units_.assign(scenario_.model.layers + 2, Unit{});
    for (std::size_t i = 0; i < units_.size(); ++i) units_[i].layer = static_cast<int>(i) - 1;
    for (const ModuleCost& m : cost_.modules) {
      const std::size_t u = static_cast<std::size_t>(unit_of_module(m, scenario_.model.layers));
      if (!on_stage(static_cast<int>(u))) continue;
      units_[u].modules.push_back(&m);
      // With expert parallelism each rank holds 1/EP of the experts; without, experts are ordinary params.
      const std::int64_t experts = ep_ > 1 ? m.expert_params : 0;
      units_[u].params[kDense] += m.params - experts;
      units_[u].params[kExpert] += experts / ep_;
    }
    // Pipelined with tied embeddings, the last stage keeps its own copy of the word embeddings for the
    // logits (Megatron); tied_embedding_sync adds the two copies' gradients.
    const int head = scenario_.model.layers + 1;
    if (mesh_.pipeline > 1 && scenario_.model.tied_embeddings && on_stage(head))
      units_[head].params[kDense] += (scenario_.model.vocab * scenario_.model.hidden + mesh_.tensor - 1) / mesh_.tensor;
    if (schedule_.units.empty()) {  // every unit, whichever stage runs it
      std::vector<UnitInfo> all(units_.size());
      for (std::size_t u = 0; u < all.size(); ++u) all[u].layer = units_[u].layer;
      for (const ModuleCost& m : cost_.modules)
        all[static_cast<std::size_t>(unit_of_module(m, scenario_.model.layers))].modules.push_back(m.kind);
      schedule_.units = std::move(all);
    }
    // Buckets: with sharded parameters every unit is its own bucket (FSDP's wrapping unit); with replicated
    // parameters, consecutive units in backward order are packed until bucket_bytes (DDP / DeepSpeed). A
    // bucket counts bytes of working-precision gradients, i.e. parameters (the frameworks size theirs in
    // elements): gradients reduced in fp32 move twice its bytes.
    const double bucket_params =
        static_cast<double>(overlap_.bucket_bytes) / state_bytes_per_param(scenario_.training.precision).grad;
    for (int k = 0; k < num_kinds_; ++k)
      for (int u = static_cast<int>(units_.size()) - 1; u >= 0; --u) {
        if (units_[u].params[k] == 0) continue;
        const bool per_unit = kind(k).s_p > 1;
        if (buckets_.empty() || buckets_.back().kind != k || per_unit ||
            static_cast<double>(buckets_.back().params) >= bucket_params)
          buckets_.push_back(Bucket{k, {}, 0});
        buckets_.back().units.push_back(u);
        buckets_.back().params += units_[u].params[k];
      }
    bucket_of_.assign(units_.size(), {-1, -1});
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      for (int u : buckets_[b].units) bucket_of_[u][buckets_[b].kind] = static_cast<int>(b);
      schedule_.buckets.push_back(GradBucket{static_cast<StateKind>(buckets_[b].kind), buckets_[b].units});
    }
    // Resident model states: each kind's parameters over its groups.
    StateBytesPerRank states;
    for (int k = 0; k < num_kinds_; ++k) {
      double psi = 0;
      for (const Unit& u : units_) psi += static_cast<double>(u.params[k]);
      states.params += state_.param * psi / kind(k).s_p;
      states.grads += state_.grad * psi / kind(k).s_g;
      states.optimizer += state_.optimizer * psi / kind(k).s_os;
      // hpZ's secondary copy: the dense parameters again, sharded over the node's data-parallel ranks.
      if (secondary_ && k == kDense)
        states.params +=
            state_.param * psi / static_cast<double>(schedule_.group_of(0, schedule_.role_secondary).ranks.size());
    }
    schedule_.state_bytes.push_back(states);
  }

  // Fixed pools, sized once from the largest unit / bucket.
  void lay_out_pools() {
    std::int64_t max_unit = 0, max_bucket = 0;
    for (int k = 0; k < num_kinds_; ++k) {
      any_gather_ = any_gather_ || kind(k).s_p > 1;
      any_reduce_ = any_reduce_ || kind(k).s_g > 1;
    }
    for (const Unit& u : units_) max_unit = std::max(max_unit, u.params[kDense] + u.params[kExpert]);
    for (const Bucket& b : buckets_) max_bucket = std::max(max_bucket, kind(b.kind).s_p > 1 ? 0 : b.params);
    const int gather_slots = overlap_.prefetch_depth + 1;
    const int reduce_slots = 2 * num_kinds_;  // double-buffered per kind of state
    if (any_gather_)
      gather_pool_ = SlotPool(pool_of(PoolKind::kParamGather, gather_slots, param_bytes(max_unit)), gather_slots);
    if (any_reduce_)
      grad_pool_ = SlotPool(pool_of(PoolKind::kGradReduce, reduce_slots, grad_bytes(std::max(max_unit, max_bucket))),
                            reduce_slots, num_kinds_);
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
    refresh_op_.assign(buckets_.size(), -1);
    refresh_start_.assign(buckets_.size(), -1);
    if (comm.param_refresh == ParamRefresh::kBroadcast) {
      for (int k = 0; k < num_kinds_; ++k) broadcast_refresh(k);
    } else {
      for (int b = static_cast<int>(buckets_.size()) - 1; b >= 0; --b) {
        const StateSharding& g = kind(buckets_[b].kind);
        if (g.q() <= 1) continue;
        const int u = buckets_[b].units.back();
        refresh_op_[b] = refresh_start_[b] =
            prog_->add(refresh_stream_, {},
                       collective(CollectiveKind::kAllGather, CollectivePurpose::kRefreshParams, buckets_[b].kind,
                                  g.role_refresh, param_bytes(buckets_[b].params) / g.s_p, Payload::kParams, u, 0, b));
      }
    }
    // Every refresh runs on one stream, so its last op completing means all have.
    if (!comm.refresh_overlap && !refresh_op_.empty()) {
      const int last = *std::max_element(refresh_op_.begin(), refresh_op_.end());
      for (int& r : refresh_op_)
        if (r >= 0) r = last;
    }
    // The first op of the step that reads each unit's parameters of each kind: it waits for last step's update.
    first_read_.assign(units_.size(), {-1, -1});
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      for (int u : buckets_[b].units) first_read_[u][buckets_[b].kind] = refresh_op_[b];
  }

  void broadcast_refresh(int k) {
    const StateSharding& g = kind(k);
    if (g.q() <= 1) return;
    std::int64_t bytes = 0;
    int tensors = 0;
    for (const Bucket& bucket : buckets_)
      if (bucket.kind == k) bytes += param_bytes(bucket.params) / g.s_p;
    for (const Unit& unit : units_)
      for (const ModuleCost* m : unit.modules) tensors += m->tensors;
    const int owners = std::max(1, std::min(g.q(), tensors));
    int final_unit = 0;  // this stage's last unit
    for (int u = 0; u < static_cast<int>(units_.size()); ++u)
      if (!units_[u].modules.empty()) final_unit = u;
    int first = -1, last = -1;
    for (int i = 0; i < owners; ++i) {
      CollectiveOp c = collective(CollectiveKind::kBroadcast, CollectivePurpose::kRefreshParams, k, g.role_refresh,
                                  bytes / owners + (i < bytes % owners ? 1 : 0), Payload::kParams, final_unit, 0, -1);
      c.root = static_cast<int>(static_cast<long long>(i) * g.q() / owners);
      last = prog_->add(refresh_stream_, {}, c);
      if (first < 0) first = last;
    }
    for (std::size_t b = 0; b < buckets_.size(); ++b)
      if (buckets_[b].kind == k) {
        refresh_op_[b] = last;
        refresh_start_[b] = first;  // later broadcasts follow it on the stream
      }
  }

  // --- The compute visits of the whole step, in order (prefetching runs across micro-batches) -----------
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
  std::vector<Pass> pipeline_order() const {
    const int p = mesh_.pipeline, v = parallel_.virtual_stages, m = static_cast<int>(micro_batches_);
    std::vector<Pass> order;
    if (p == 1) {
      for (int mb = 0; mb < m; ++mb) {
        order.push_back({Phase::kForward, 0, mb});
        order.push_back({Phase::kBackward, 0, mb});
      }
      return order;
    }
    const int total = m * v;
    auto pass = [&](int k, bool forward) {
      const int group = k / (p * v), in_group = k % (p * v);
      const int local = forward ? in_group / p : v - 1 - in_group / p;
      return Pass{forward ? Phase::kForward : Phase::kBackward, local * p + stage_, group * p + in_group % p};
    };
    const int warmup = std::min(total, v == 1 ? p - stage_ - 1 : 2 * (p - stage_ - 1) + (v - 1) * p);
    int forwards = 0, backwards = 0;
    for (; forwards < warmup; ++forwards) order.push_back(pass(forwards, true));
    for (; forwards < total; ++forwards, ++backwards) {
      order.push_back(pass(forwards, true));
      order.push_back(pass(backwards, false));
    }
    for (; backwards < total; ++backwards) order.push_back(pass(backwards, false));
    return order;
  }

  void plan_visits() {
    const bool module_visits = options_.backward_module_gather && overlap_.prefetch_depth > 0 &&
                               scenario_.training.recompute == Recompute::kNone;
    for (const Pass& pass : pipeline_order()) {
      const int mb = pass.mb;
      const int begin = mesh_.pipeline == 1 ? 0 : first_unit(pass.chunk);
      const int end = mesh_.pipeline == 1 ? static_cast<int>(units_.size()) - 1 : last_unit(pass.chunk);
      if (pass.phase == Phase::kForward) {
        for (int u = begin; u <= end; ++u)
          visits_.push_back({u, Phase::kForward, mb, units_[u].modules, units_[u].params, true, true});
        continue;
      }
      for (int u = end; u >= begin; --u) {
        const std::vector<const ModuleCost*>& modules = units_[u].modules;
        if (!module_visits || modules.size() < 2) {
          visits_.push_back({u, Phase::kBackward, mb, modules, units_[u].params, true, true});
          continue;
        }
        for (std::size_t i = modules.size(); i-- > 0;) {
          const ModuleCost* m = modules[i];
          const std::int64_t experts = ep_ > 1 ? m->expert_params : 0;
          visits_.push_back({u,
                             Phase::kBackward,
                             mb,
                             {m},
                             {m->params - experts, experts / ep_},
                             i + 1 == modules.size(),
                             i == 0,
                             static_cast<int>(i)});
        }
      }
    }
    gather_ops_.assign(visits_.size(), {});
    gather_slot_.assign(visits_.size(), -1);
    final_grad_op_.assign(buckets_.size(), -1);
    grad_slot_.assign(buckets_.size(), -1);
  }

  // Forward gathers: every visit up to `last` gets its slot and its all-gathers (prefetching).
  void gather_through(std::size_t last) {
    for (; any_gather_ && next_gather_ <= last && next_gather_ < visits_.size(); ++next_gather_) {
      const Visit& v = visits_[next_gather_];
      const int slot = gather_pool_.next_slot();
      const int acquire = prog_->add(StreamKind::kParamGather, {gather_pool_.last_release(slot)},
                                     BufferAcquireOp{gather_pool_.pool(), slot, v.unit, units_[v.unit].layer});
      gather_slot_[next_gather_] = slot;
      for (int k = 0; k < num_kinds_; ++k) {
        if (kind(k).s_p <= 1 || v.params[k] == 0) continue;
        // hpZ: backward gathers the dense parameters from the node's secondary copy.
        const bool from_secondary = k == kDense && schedule_.role_secondary >= 0 && v.phase == Phase::kBackward;
        // policy.comm.param_gather "tensor" (DeepSpeed ZeRO-3): one all-gather per large tensor of the visit.
        int pieces = 1;
        if (scenario_.policy.comm.param_gather == ParamGather::kTensor) {
          pieces = 0;
          for (const ModuleCost* m : v.modules) pieces += m->large_tensors;
          pieces = std::max(1, pieces);
        }
        const std::int64_t bytes = param_bytes(v.params[k]);
        for (int piece = 0; piece < pieces; ++piece) {
          CollectiveOp c = collective(
              CollectiveKind::kAllGather,
              from_secondary ? CollectivePurpose::kGatherSecondary : CollectivePurpose::kGatherParams, k,
              from_secondary ? schedule_.role_secondary : kind(k).role_param,
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

  // Expert parallelism: tokens go all-to-all to their experts before the experts and come back after them;
  // the backward pass does the same with gradients. The compute stream waits for them (as in Megatron and
  // DeepSpeed-MoE), so they run on it.
  int all_to_all(CollectivePurpose purpose, int unit, int mb, std::vector<int> deps) {
    const double act_bytes = scenario_.training.precision == Precision::kFp32 ? 4 : 2;
    const auto bytes = static_cast<std::int64_t>(
        static_cast<double>(scenario_.training.micro_batch * scenario_.training.seq_len / mesh_.context) *
        scenario_.model.moe.top_k * scenario_.model.hidden * act_bytes);
    CollectiveOp c = collective(CollectiveKind::kAllToAll, purpose, kDense, schedule_.role_expert_parallel, bytes,
                                Payload::kActivations, unit, mb, -1);
    c.gather_slot = visit_slot_;  // the router's parameters
    return prog_->add(StreamKind::kCompute, std::move(deps), c);
  }

  // Tensor parallelism's collectives around one module's pass, on the compute path (Megatron-LM: Shoeybi et
  // al. 2019, §3; Korthikanti et al. 2022, §4.2.2), each over the block's activations (b·s·h elements):
  //   without sequence parallelism: an all-reduce after each layer block, both ways; after the embedding
  //     in forward; after the head in backward (its input gradient);
  //   with it: an all-gather before and a reduce-scatter after each layer block, both ways; the embedding
  //     reduce-scatters its output (forward) and gathers its gradient (backward); the head gathers its input
  //     (forward) and reduce-scatters its input gradient (backward).
  // The vocabulary-parallel loss adds three all-reduces of one fp32 per token (one op here). Full
  // recomputation repeats the forward's collectives; selective recomputation (the attention core) needs none.
  int tensor_collective(CollectiveKind kind, const ModuleCost* m, int unit, Phase phase, int mb, std::vector<int> deps,
                        std::int64_t bytes, DType dtype) {
    const bool bwd = phase == Phase::kBackward;
    CollectiveOp c = collective(kind, bwd ? CollectivePurpose::kTensorBackward : CollectivePurpose::kTensorForward,
                                kDense, schedule_.role_index(GroupRole::kTensor), bytes,
                                bwd ? Payload::kGrads : Payload::kActivations, unit, mb, -1);
    c.module = module_slot(m->kind);
    c.dtype = dtype;
    return prog_->add(StreamKind::kCompute, std::move(deps), c);
  }
  struct TensorComm {
    bool gather_before = false;
    CollectiveKind after = CollectiveKind::kAllReduce;
    bool reduce_after = false;
    bool loss = false;
  };
  TensorComm tensor_comm(ModuleKind kind, Phase phase) const {
    TensorComm t;
    if (mesh_.tensor == 1 || (phase == Phase::kRecompute && scenario_.training.recompute != Recompute::kFull)) return t;
    const bool bwd = phase == Phase::kBackward, sp = parallel_.sequence_parallel;
    const bool embedding = kind == ModuleKind::kEmbedding, head = kind == ModuleKind::kHead;
    t.after = sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
    t.gather_before = sp && !(embedding && !bwd) && !(head && bwd);
    t.reduce_after = !(embedding && bwd) && !(head && !bwd);
    t.loss = head && !bwd;
    return t;
  }

  // What module `m` computes in `phase` (forward, recompute or backward), as a compute op.
  ComputeOp work_of(const ModuleCost* m, int unit, Phase phase, int mb) const {
    ComputeOp w{m->kind, unit, units_[unit].layer, phase, mb};
    switch (phase) {
      case Phase::kForward:
        w.flops = m->fwd_flops, w.mem_bytes = m->fwd_mem_bytes, w.fp8_flops = m->fwd_fp8_flops;
        w.core_flops = m->fwd_core_flops, w.core_bytes = m->fwd_core_bytes;
        break;
      case Phase::kRecompute:
        w.flops = m->recompute_flops, w.mem_bytes = m->recompute_mem_bytes, w.fp8_flops = m->recompute_fp8_flops;
        w.core_flops = m->recompute_core_flops, w.core_bytes = m->recompute_core_bytes;
        break;
      case Phase::kBackward:
        w.flops = m->bwd_flops, w.mem_bytes = m->bwd_mem_bytes, w.fp8_flops = m->bwd_fp8_flops;
        w.core_flops = m->bwd_core_flops, w.core_bytes = m->bwd_core_bytes;
        break;
    }
    return w;
  }

  int compute(const ModuleCost* m, int unit, Phase phase, int mb, std::vector<int> deps) {
    const bool a2a = ep_ > 1 && m->kind == ModuleKind::kMoe && phase != Phase::kRecompute;
    const bool fwd = phase == Phase::kForward;
    // forward: dispatch, experts, combine; backward: combine's gradient, experts, dispatch's gradient.
    const TensorComm tp = tensor_comm(m->kind, phase);
    deps.insert(deps.end(), context_tail_.begin(), context_tail_.end());  // the last attention's exchange
    context_tail_.clear();
    if (tp.gather_before)
      deps = {tensor_collective(CollectiveKind::kAllGather, m, unit, phase, mb, std::move(deps), act_bytes_, dtype_)};
    context_exchange(m, unit, phase, mb, deps);
    const bool ulysses = ulysses_applies(m, phase);
    if (ulysses) deps = {ulysses_all_to_all(unit, phase, mb, /*before=*/true, std::move(deps))};
    if (a2a)
      deps = {all_to_all(fwd ? CollectivePurpose::kMoeDispatch : CollectivePurpose::kMoeCombineGrad, unit, mb, deps)};
    ComputeOp work = work_of(m, unit, phase, mb);
    work.gather_slot = visit_slot_;
    int op = prog_->add(StreamKind::kCompute, std::move(deps), work);
    if (a2a)
      op = all_to_all(fwd ? CollectivePurpose::kMoeCombine : CollectivePurpose::kMoeDispatchGrad, unit, mb, {op});
    if (ulysses) op = ulysses_all_to_all(unit, phase, mb, /*before=*/false, {op});
    if (tp.reduce_after) {
      std::vector<int> after{op};
      after.insert(after.end(), context_tail_.begin(), context_tail_.end());
      context_tail_.clear();
      op = tensor_collective(tp.after, m, unit, phase, mb, std::move(after), act_bytes_, dtype_);
    }
    if (tp.loss)
      op = tensor_collective(CollectiveKind::kAllReduce, m, unit, phase, mb, {op},
                             3 * scenario_.training.micro_batch * scenario_.training.seq_len / mesh_.context * 4,
                             DType::kFp32);
    return op;
  }

  // Context parallelism's exchange around one attention pass (Megatron-LM's CP over TransformerEngine's ring
  // attention; Liu et al. 2023, "Ring Attention"): each rank holds the keys and values of its s / context
  // tokens and, while computing attention on the blocks it has, passes them around the context group until
  // every rank has seen the whole sequence's — an all-gather's traffic. Backward passes them around again
  // and returns each block's key and value gradients to its owner: an all-gather and a reduce-scatter.
  // Full recomputation repeats the forward's. Modelled on a stream of their own beside the attention
  // compute, which they overlap (ring attention's point); what follows the attention waits for both
  // (context_tail_). The ring's first block and its per-step synchronisation are not modelled.
  void context_exchange(const ModuleCost* m, int unit, Phase phase, int mb, const std::vector<int>& deps) {
    if (mesh_.context == 1 || m->kind != ModuleKind::kAttention || parallel_.context_comm != ContextComm::kRing) return;
    if (phase == Phase::kRecompute && scenario_.training.recompute != Recompute::kFull) return;
    const bool bwd = phase == Phase::kBackward;
    const ModelSpec& model = scenario_.model;
    // K and V of the whole sequence, this tensor rank's heads.
    const auto bytes =
        static_cast<std::int64_t>(scenario_.training.micro_batch * scenario_.training.seq_len * 2 *
                                  (model.kv_heads / mesh_.tensor) * model.head_dim() * dtype_bytes(dtype_));
    const int role = schedule_.role_index(GroupRole::kContext);
    const CollectivePurpose purpose = bwd ? CollectivePurpose::kContextBackward : CollectivePurpose::kContextForward;
    CollectiveOp gather =
        collective(CollectiveKind::kAllGather, purpose, kDense, role, bytes, Payload::kActivations, unit, mb, -1);
    gather.module = module_slot(m->kind);
    int last = prog_->add(StreamKind::kContext, deps, gather);
    if (bwd) {
      CollectiveOp reduce =
          collective(CollectiveKind::kReduceScatter, purpose, kDense, role, bytes, Payload::kGrads, unit, mb, -1);
      reduce.module = module_slot(m->kind);
      last = prog_->add(StreamKind::kContext, {last}, reduce);
    }
    context_tail_.push_back(last);
  }

  // Context parallelism by all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023; Megatron-LM's cp_comm_type
  // "a2a"): around the attention core, each rank trades its s / context tokens of every head for the whole
  // sequence of heads / context heads, and back after it. Forward: one all-to-all of Q, K and V before
  // (b·(s/c)·(n_q + 2·n_kv)·d_head elements of this tensor rank's heads), one of the output after
  // (b·(s/c)·n_q·d_head); backward the same two with gradients, in reverse order; full recomputation
  // repeats the forward's. On the compute path: the attention core needs their result. (Modelled around the
  // attention module, whose projections run on the compute stream with them either way.)
  bool ulysses_applies(const ModuleCost* m, Phase phase) const {
    if (mesh_.context == 1 || parallel_.context_comm != ContextComm::kAllToAll || m->kind != ModuleKind::kAttention)
      return false;
    return phase != Phase::kRecompute || scenario_.training.recompute == Recompute::kFull;
  }
  int ulysses_all_to_all(int unit, Phase phase, int mb, bool before, std::vector<int> deps) {
    const ModelSpec& model = scenario_.model;
    const bool bwd = phase == Phase::kBackward;
    // Q, K and V cross before the core forward and after it backward; the output the other way round.
    const bool qkv = before != bwd;
    const std::int64_t heads = qkv ? (model.heads + 2 * model.kv_heads) / mesh_.tensor : model.heads / mesh_.tensor;
    const std::int64_t bytes = scenario_.training.micro_batch * scenario_.training.seq_len / mesh_.context * heads *
                               model.head_dim() * dtype_bytes(dtype_);
    CollectiveOp c = collective(CollectiveKind::kAllToAll,
                                bwd ? CollectivePurpose::kContextBackward : CollectivePurpose::kContextForward, kDense,
                                schedule_.role_index(GroupRole::kContext), bytes,
                                bwd ? Payload::kGrads : Payload::kActivations, unit, mb, -1);
    c.module = module_slot(ModuleKind::kAttention);
    return prog_->add(StreamKind::kCompute, std::move(deps), c);
  }

  void run_visit(std::size_t i) {
    const Visit& v = visits_[i];
    gather_through(i + overlap_.prefetch_depth);
    visit_slot_ = any_gather_ ? gather_slot_[i] : -1;
    std::vector<int> deps = gather_ops_[i];
    for (int k = 0; k < num_kinds_; ++k)
      if (kind(k).s_p == 1) deps.push_back(refresh_of(v.unit, k));
    // policy.comm.grad_reduce_overlap off: the backward goes on once the reduction before the last is done.
    if (blocking_reduce_ >= 0) deps.push_back(std::exchange(blocking_reduce_, -1));

    // Pipelined: the chunk's input activations (forward) or its output's gradients (backward) come from the
    // neighbouring stage first.
    const int chunk = chunk_of(v.unit);
    if (v.phase == Phase::kForward && chunk > 0 && v.unit == first_unit(chunk))
      deps.push_back(pipe_transfer(CollectivePurpose::kPipeActivations, chunk - 1, v.micro_batch, false, {}));
    if (v.phase == Phase::kBackward && chunk + 1 < chunks_ && v.unit == last_unit(chunk) && v.first_of_unit)
      deps.push_back(pipe_transfer(CollectivePurpose::kPipeGrads, chunk + 1, v.micro_batch, false, {}));

    // Backward writes each sharded kind's gradients into a reduce slot taken when its bucket starts.
    for (int k = 0; k < num_kinds_ && v.phase == Phase::kBackward; ++k) {
      const int b = bucket_of_[v.unit][k];
      if (b < 0 || kind(k).s_g <= 1 || v.unit != buckets_[b].units.front() || !v.first_of_unit) continue;
      grad_slot_[b] = grad_pool_.next_slot(k);
      deps.push_back(prog_->add(
          StreamKind::kCompute, {grad_pool_.last_release(grad_slot_[b])},
          BufferAcquireOp{grad_pool_.pool(), grad_slot_[b], v.unit, units_[v.unit].layer, b + bucket_base_}));
    }

    int last_compute = -1;
    if (v.phase == Phase::kForward) {
      for (const ModuleCost* m : v.modules) {
        last_compute = compute(m, v.unit, Phase::kForward, v.micro_batch, deps);
        deps = {last_compute};
        for (int k = 0; k < num_kinds_; ++k)
          if (first_read_[v.unit][k] < 0) first_read_[v.unit][k] = last_compute;
      }
    } else {
      for (const ModuleCost* m : v.modules)
        if (m->recompute_flops > 0 || m->recompute_mem_bytes > 0)
          deps = {compute(m, v.unit, Phase::kRecompute, v.micro_batch, deps)};
      for (auto it = v.modules.rbegin(); it != v.modules.rend(); ++it) {
        last_compute = compute(*it, v.unit, Phase::kBackward, v.micro_batch, deps);
        deps = {last_compute};
      }
    }
    // What the visit's consumers wait for: its last compute, and an attention exchange still running beside
    // it (which the next compute waits for as well).
    std::vector<int> done{last_compute};
    done.insert(done.end(), context_tail_.begin(), context_tail_.end());
    if (any_gather_) {
      const int release =
          prog_->add(StreamKind::kCompute, {last_compute},
                     BufferReleaseOp{gather_pool_.pool(), gather_slot_[i], v.unit, units_[v.unit].layer});
      gather_pool_.set_release(gather_slot_[i], release);
    }
    // Pipelined: the chunk's output goes on to the next stage, its input's gradient back to the previous.
    if (v.phase == Phase::kForward && chunk + 1 < chunks_ && v.unit == last_unit(chunk))
      pipe_transfer(CollectivePurpose::kPipeActivations, chunk, v.micro_batch, true, done);
    if (v.phase == Phase::kBackward && chunk > 0 && v.unit == first_unit(chunk) && v.last_of_unit)
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
    const int p = mesh_.pipeline;
    const int from_stage = from % p;
    // The link's lower end (activations flow from it, gradients to it).
    const int link = act ? from_stage : (from_stage + p - 1) % p;
    static constexpr GroupRole kAct[3] = {GroupRole::kPipeActEven, GroupRole::kPipeActOdd, GroupRole::kPipeActWrap};
    static constexpr GroupRole kGrad[3] = {GroupRole::kPipeGradEven, GroupRole::kPipeGradOdd, GroupRole::kPipeGradWrap};
    const int colour = pipe_link_colour(link, p);
    const int role = schedule_.role_index(act ? kAct[colour] : kGrad[colour]);
    const int unit = act ? last_unit(from) : first_unit(from);
    CollectiveOp c = collective(CollectiveKind::kBroadcast, purpose, kDense, role, act_bytes_ / mesh_.tensor,
                                act ? Payload::kActivations : Payload::kGrads, unit, mb, -1);
    c.root = 0;  // the group lists the sender first
    return prog_->add(send ? StreamKind::kCompute : (act ? StreamKind::kPipeRecvAct : StreamKind::kPipeRecvGrad),
                      std::move(deps), c);
  }

  // --- Gradient reductions of each bucket whose last unit has just finished its backward -----------------
  void reduce_gradients(const Visit& v, const std::vector<int>& done) {
    const bool last_mb = v.micro_batch == micro_batches_ - 1;
    for (int k = 0; k < num_kinds_; ++k) {
      const int b = bucket_of_[v.unit][k];
      if (b < 0 || v.unit != buckets_[b].units.back() || !v.last_of_unit) continue;
      const StateSharding& g = kind(k);
      std::int64_t bytes = grad_bytes(buckets_[b].params);
      int prev = done.front();
      // The first reduction waits for everything the visit did; the next ones for the one before.
      const auto after = [&] { return prev == done.front() ? done : std::vector<int>{prev}; };
      if (g.s_g > 1) {  // every micro-batch: a sharded gradient cannot accumulate unsharded
        prev = prog_->add(StreamKind::kGradReduce, after(),
                          collective(CollectiveKind::kReduceScatter, CollectivePurpose::kReduceGrads, k, g.role_grad,
                                     bytes, Payload::kGrads, v.unit, v.micro_batch, b));
        const int release = prog_->add(
            StreamKind::kGradReduce, {prev},
            BufferReleaseOp{grad_pool_.pool(), grad_slot_[b], v.unit, units_[v.unit].layer, b + bucket_base_});
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
                          collective(how, CollectivePurpose::kReduceToOptimizer, k, g.role_refresh, bytes,
                                     Payload::kGrads, v.unit, v.micro_batch, b));
        bytes /= q_grad;
      }
      if (g.replicas > 1)
        prev = prog_->add(StreamKind::kReplicaSync, after(),
                          collective(CollectiveKind::kAllReduce, CollectivePurpose::kSyncReplicas, k, g.role_replica,
                                     bytes, Payload::kGrads, v.unit, v.micro_batch, b));
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
    if (mesh_.pipeline == 1 || !scenario_.model.tied_embeddings) return;
    const int head = static_cast<int>(units_.size()) - 1;
    const int unit = on_stage(0) ? 0 : on_stage(head) ? head : -1;
    if (unit < 0) return;
    const int b = bucket_of_[unit][kDense];
    const std::int64_t params = (scenario_.model.vocab * scenario_.model.hidden + mesh_.tensor - 1) / mesh_.tensor;
    CollectiveOp c = collective(CollectiveKind::kAllReduce, CollectivePurpose::kEmbeddingGrads, kDense,
                                schedule_.role_index(GroupRole::kEmbedding), grad_bytes(params), Payload::kGrads, 0,
                                static_cast<int>(micro_batches_) - 1, -1);  // the embedding's, on both ends
    final_grad_op_[b] = prog_->add(StreamKind::kCompute, {final_grad_op_[b]}, c);
  }

  // fp16 needs the same all-reduce without clipping: dynamic loss scaling skips the update when any rank's
  // gradients overflowed, which the global norm shows (Inf/NaN) to every rank at once (DeepSpeed's and
  // Megatron-LM's fp16 optimizers all-reduce an overflow flag at this point).
  void gradient_norm() {
    if (scenario_.training.grad_clip <= 0 && scenario_.training.precision != Precision::kFp16) return;
    if (schedule_.role_world < 0) add_world_group();
    CollectiveOp c =
        collective(CollectiveKind::kAllReduce, CollectivePurpose::kGradNorm, kDense, schedule_.role_world, 4,
                   Payload::kGradNorm, static_cast<int>(units_.size()) - 1, static_cast<int>(micro_batches_) - 1, -1);
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
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      const std::int64_t shard = buckets_[b].params / kind(buckets_[b].kind).s_os;
      const int u = buckets_[b].units.back();
      const int update = prog_->add(
          StreamKind::kCompute, {norm_op_ >= 0 ? norm_op_ : final_grad_op_[b]},
          OptimizerStepOp{static_cast<int>(b) + bucket_base_, u, units_[u].layer, shard, shard * kAdamBytesPerParam});
      // The refresh of this bucket (or, broadcasting, the first broadcast of its kind) waits for the update.
      if (refresh_start_[b] >= 0) prog_->op(refresh_start_[b]).prev_step_deps.push_back(update);
      for (int unit : buckets_[b].units) {
        const int read = first_read_[unit][buckets_[b].kind];
        if (read != refresh_start_[b]) prog_->op(read).prev_step_deps.push_back(update);
      }
    }
  }

  CollectiveOp collective(CollectiveKind k, CollectivePurpose purpose, int state, int role, std::int64_t bytes,
                          Payload payload, int unit, int mb, int bucket) const {
    CollectiveOp c;
    c.kind = k;
    c.purpose = purpose;
    c.state = static_cast<StateKind>(state);
    c.role = role;
    c.bytes = bytes;
    c.dtype = dtype_;
    c.payload = payload;
    c.unit = unit;
    c.layer = units_[unit].layer;
    c.micro_batch = mb;
    c.bucket = bucket < 0 ? -1 : bucket + bucket_base_;
    return c;
  }

  const Scenario& scenario_;
  const ModelCost& cost_;
  const SchedulerOptions options_;
  const OverlapSpec& overlap_;
  const int ep_;
  const int num_kinds_;
  const StateBytes state_;
  const DType dtype_;
  const long long micro_batches_;
  const bool secondary_;
  const StreamKind refresh_stream_;
  const ParallelMesh& mesh_;      // degrees of the axes
  const ParallelSpec parallel_;   // how they run: virtual stages, sequence parallelism, context exchange
  const int stage_;               // the pipeline stage this program runs
  const int chunks_;              // model chunks: pipeline x virtual_stages
  const std::int64_t act_bytes_;  // one micro-batch's activations between blocks (b·s·h / context elements)

  Schedule& schedule_;
  const int bucket_base_;  // this stage's first bucket in Schedule::buckets
  ProgramBuilder* prog_ = nullptr;
  std::vector<Unit> units_;
  std::vector<Bucket> buckets_;
  std::vector<std::array<int, 2>> bucket_of_;  // [unit][kind] -> bucket
  bool any_gather_ = false, any_reduce_ = false;
  SlotPool gather_pool_{-1, 1}, grad_pool_{-1, 1};
  std::vector<int> refresh_op_;                 // per bucket: what its readers wait for
  std::vector<int> refresh_start_;              // per bucket: the refresh op that waits for its update
  std::vector<std::array<int, 2>> first_read_;  // [unit][kind]
  std::vector<int> context_tail_;               // attention exchanges (context_exchange) the next compute must wait for
  std::vector<Visit> visits_;
  std::vector<std::vector<int>> gather_ops_;  // per visit
  std::vector<int> gather_slot_;              // per visit
  int visit_slot_ = -1;                       // the gather slot of the visit being run (its ops read it)
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
  for (int stage = 0; stage < scenario.mesh.pipeline; ++stage)
    DataParallelBuilder(scenario, cost, options, schedule, stage).build();
  return schedule;
}

Result<Schedule> build_schedule(const Scenario& scenario, const ModelCost& cost) {
  return build_data_parallel_schedule(scenario, cost, policy_entry(scenario.policy.preset).options);
}

}  // namespace hzp
