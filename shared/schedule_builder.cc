// The sharded data-parallel scheduler (see schedule_builder.h for the timeline it builds).
#include "schedule_builder.h"

#include <algorithm>
#include <array>

#include "sharding.h"

namespace hzp {
namespace {

// How one kind of state is sharded: the dense states, or (with expert parallelism) the expert states.
struct StateGroups {
  int role_param = 0, role_grad = 0, role_refresh = 0, role_replica = 0;
  int s_p = 1, s_g = 1, s_os = 1, replicas = 1;  // group sizes on every rank
  int q_refresh() const { return s_os / s_p; }  // optimizer slices per parameter shard
  int q_grad() const { return s_os / s_g; }     // reduce-scatter from grad shard to optimizer slice
};

// A parameter unit: the granularity of all-gathers (embedding, one layer, head).
struct Unit {
  int layer = -1;                     // -1 embedding, 0..L-1 layers, L head
  std::vector<const ModuleCost*> modules;
  std::array<std::int64_t, 2> params = {0, 0};  // per kind (dense, expert): parameters this rank's EP slot uses
};

// Consecutive units (in backward order) whose gradients of one kind are reduced together.
struct Bucket {
  int kind = 0;                       // 0 dense, 1 expert
  std::vector<int> units;             // unit indices in backward order; the last one completes the bucket
  std::int64_t params = 0;
};

std::vector<Unit> make_units(const ModelCost& cost, int layers, int expert_parallel) {
  std::vector<Unit> units(layers + 2);
  for (size_t i = 0; i < units.size(); ++i) units[i].layer = static_cast<int>(i) - 1;
  for (const ModuleCost& m : cost.modules) {
    const size_t u = m.kind == ModuleKind::kEmbedding ? 0 : m.kind == ModuleKind::kHead ? units.size() - 1 : m.layer + 1;
    units[u].modules.push_back(&m);
    // With expert parallelism each rank holds 1/EP of the experts; without, experts are ordinary params.
    const std::int64_t experts = expert_parallel > 1 ? m.expert_params : 0;
    units[u].params[0] += m.params - experts;
    units[u].params[1] += experts / expert_parallel;
  }
  return units;
}

std::vector<Bucket> make_buckets(const std::vector<Unit>& units, int kind, bool per_unit, double bucket_params) {
  std::vector<Bucket> buckets;
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    if (units[u].params[kind] == 0) continue;
    if (buckets.empty() || per_unit || static_cast<double>(buckets.back().params) >= bucket_params)
      buckets.push_back(Bucket{kind, {}, 0});
    buckets.back().units.push_back(u);
    buckets.back().params += units[u].params[kind];
  }
  return buckets;
}

// Appends ops to one program; streams are created on first use so unused ones do not appear.
class ProgramBuilder {
 public:
  ProgramBuilder(Schedule& schedule, bool separate_streams) : schedule_(schedule), separate_(separate_streams) {
    stream_index("compute");  // stream 0 is always the compute stream
  }

  int add(const std::string& stream, std::vector<int> deps, OpBody body) {
    std::sort(deps.begin(), deps.end());
    deps.erase(std::unique(deps.begin(), deps.end()), deps.end());
    deps.erase(std::remove(deps.begin(), deps.end(), -1), deps.end());
    program_.ops.push_back(Op{stream_index(separate_ ? stream : "compute"), std::move(deps), std::move(body), {}});
    return static_cast<int>(program_.ops.size()) - 1;
  }
  Program take() { return std::move(program_); }
  Op& op(int index) { return program_.ops[index]; }

 private:
  int stream_index(const std::string& name) {
    auto it = std::find(schedule_.streams.begin(), schedule_.streams.end(), name);
    if (it != schedule_.streams.end()) return static_cast<int>(it - schedule_.streams.begin());
    schedule_.streams.push_back(name);
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

StateGroups state_groups(const Schedule& s, const ShardingLayout& layout, GroupRole param, GroupRole grad,
                         GroupRole refresh, GroupRole replica) {
  StateGroups g;
  g.role_param = layout.role(param);
  g.role_grad = layout.role(grad);
  g.role_refresh = layout.role(refresh);
  g.role_replica = layout.role(replica);
  auto size = [&](int role) { return static_cast<int>(s.group_of(0, role).ranks.size()); };
  g.s_p = size(g.role_param);
  g.s_g = size(g.role_grad);
  g.s_os = g.s_p * size(g.role_refresh);
  g.replicas = size(g.role_replica);
  return g;
}

}  // namespace

Result<Schedule> build_data_parallel_schedule(const Scenario& scenario, const ModelCost& cost,
                                              const std::string& policy_name, const SchedulerOptions& options) {
  const OverlapSpec& overlap = scenario.policy.overlap;
  const int world = scenario.data_parallel();
  const int ep = scenario.policy.expert_parallel;
  // The secondary copy only helps when parameters are sharded beyond the node.
  const bool secondary = options.secondary_param_copy && scenario.policy.sharding.params.s1 > 1;
  HZP_ASSIGN_OR_RETURN(ShardingLayout layout,
                       build_sharding_layout(scenario.cluster, scenario.policy.sharding,
                                             LayoutOptions{ep, secondary}));
  const std::string refresh_stream = options.dedicated_refresh_stream ? "param_refresh" : "replica_sync";

  Schedule schedule;
  schedule.policy = policy_name;
  schedule.world_size = world;
  schedule.gpus_per_node = scenario.cluster.gpus_per_node;
  schedule.roles = layout.roles;
  schedule.groups = layout.groups;
  schedule.rank_groups = layout.rank_groups;
  schedule.rank_program.assign(world, 0);

  const StateBytes state = state_bytes_per_param(scenario.training.precision);
  const DType dtype = scenario.training.precision == Precision::kFp32   ? DType::kFp32
                      : scenario.training.precision == Precision::kFp16 ? DType::kFp16
                                                                        : DType::kBf16;
  const long long micro_batches = scenario.grad_accum_steps();
  const std::array<StateGroups, 2> kinds = {
      state_groups(schedule, layout, GroupRole::kParamShard, GroupRole::kGradShard, GroupRole::kParamRefresh,
                   GroupRole::kOsReplica),
      ep > 1 ? state_groups(schedule, layout, GroupRole::kExpertParamShard, GroupRole::kExpertGradShard,
                            GroupRole::kExpertParamRefresh, GroupRole::kExpertOsReplica)
             : StateGroups{}};
  const int role_secondary = secondary ? layout.role(GroupRole::kParamSecondary) : -1;
  const int num_kinds = ep > 1 ? 2 : 1;

  std::vector<Unit> units = make_units(cost, scenario.model.layers, ep);
  std::vector<Bucket> buckets;
  for (int k = 0; k < num_kinds; ++k) {
    std::vector<Bucket> b = make_buckets(units, k, kinds[k].s_p > 1, static_cast<double>(overlap.bucket_bytes) / state.grad);
    buckets.insert(buckets.end(), b.begin(), b.end());
  }
  std::vector<std::array<int, 2>> bucket_of(units.size(), {-1, -1});  // [unit][kind]
  for (size_t b = 0; b < buckets.size(); ++b) {
    GradBucket table_entry{buckets[b].kind, {}};
    for (int u : buckets[b].units) {
      bucket_of[u][buckets[b].kind] = static_cast<int>(b);
      table_entry.layers.push_back(units[u].layer);
    }
    schedule.buckets.push_back(std::move(table_entry));
  }
  auto param_bytes = [&](std::int64_t params) { return static_cast<std::int64_t>(params * state.param); };
  auto grad_bytes = [&](std::int64_t params) { return static_cast<std::int64_t>(params * state.grad); };

  // Resident model states: each kind's parameters over its groups.
  for (int k = 0; k < num_kinds; ++k) {
    double psi = 0;
    for (const Unit& u : units) psi += static_cast<double>(u.params[k]);
    schedule.state_bytes.params += state.param * psi / kinds[k].s_p;
    schedule.state_bytes.grads += state.grad * psi / kinds[k].s_g;
    schedule.state_bytes.optimizer += state.optimizer * psi / kinds[k].s_os;
    // hpZ's secondary copy: the dense parameters again, sharded over the node.
    if (secondary && k == 0) schedule.state_bytes.params += state.param * psi / scenario.cluster.gpus_per_node;
  }

  ProgramBuilder prog(schedule, overlap.separate_streams);

  // Fixed pools, sized once from the largest unit / bucket.
  std::int64_t max_unit = 0, max_bucket = 0;
  bool any_gather = false, any_reduce = false;
  for (int k = 0; k < num_kinds; ++k) {
    any_gather = any_gather || kinds[k].s_p > 1;
    any_reduce = any_reduce || kinds[k].s_g > 1;
  }
  for (const Unit& u : units) max_unit = std::max(max_unit, u.params[0] + u.params[1]);
  for (const Bucket& b : buckets) max_bucket = std::max(max_bucket, kinds[b.kind].s_p > 1 ? 0 : b.params);
  const int gather_slots = overlap.prefetch_depth + 1;
  const int reduce_slots = 2 * num_kinds;  // double-buffered per kind of state
  SlotPool gather_pool(-1, gather_slots), grad_pool(-1, reduce_slots);
  if (any_gather) {
    gather_pool = SlotPool(static_cast<int>(schedule.pools.size()), gather_slots);
    schedule.pools.push_back({"param_gather", gather_slots, param_bytes(max_unit)});
  }
  if (any_reduce) {
    grad_pool = SlotPool(static_cast<int>(schedule.pools.size()), reduce_slots, num_kinds);
    schedule.pools.push_back({"grad_reduce", reduce_slots, grad_bytes(std::max(max_unit, max_bucket))});
  }

  // Step start: refresh each bucket's parameters from last step's optimizer slices.
  std::vector<int> refresh_op(buckets.size(), -1);
  for (int b = static_cast<int>(buckets.size()) - 1; b >= 0; --b) {
    const StateGroups& g = kinds[buckets[b].kind];
    if (g.q_refresh() > 1)
      refresh_op[b] = prog.add(refresh_stream, {},
                               CollectiveOp{CollectiveKind::kAllGather, g.role_refresh, param_bytes(buckets[b].params) / g.s_p,
                                            dtype, Payload::kParams, units[buckets[b].units.back()].layer, 0, b});
  }
  // The first op of the step that reads each unit's parameters of each kind: it waits for last step's update.
  std::vector<std::array<int, 2>> first_read(units.size(), {-1, -1});
  for (size_t b = 0; b < buckets.size(); ++b)
    for (int u : buckets[b].units) first_read[u][buckets[b].kind] = refresh_op[b];
  auto refresh_of = [&](int unit, int kind) { return bucket_of[unit][kind] < 0 ? -1 : refresh_op[bucket_of[unit][kind]]; };

  // The compute visits of the whole step, in order: prefetching runs across micro-batch boundaries.
  // A visit computes some modules of one unit with their parameters gathered: the whole unit, or — for
  // AsyncHZP's backward with prefetching and no recomputation — one module, so that the next module's
  // gather overlaps this one's backward.
  struct Visit {
    int unit;
    Phase phase;
    int micro_batch;
    std::vector<const ModuleCost*> modules;  // in forward order
    std::array<std::int64_t, 2> params;      // per kind, gathered for this visit
    bool first_of_unit;                       // in execution order
    bool last_of_unit;
    int module = -1;                          // index in the unit of a one-module visit
  };
  const bool module_visits = options.backward_module_gather && overlap.prefetch_depth > 0 &&
                             scenario.training.recompute == Recompute::kNone;
  std::vector<Visit> visits;
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (int u = 0; u < static_cast<int>(units.size()); ++u)
      visits.push_back({u, Phase::kForward, mb, units[u].modules, units[u].params, true, true});
    for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
      const std::vector<const ModuleCost*>& modules = units[u].modules;
      if (!module_visits || modules.size() < 2) {
        visits.push_back({u, Phase::kBackward, mb, modules, units[u].params, true, true});
        continue;
      }
      for (size_t i = modules.size(); i-- > 0;) {
        const ModuleCost* m = modules[i];
        const std::int64_t experts = ep > 1 ? m->expert_params : 0;
        visits.push_back({u, Phase::kBackward, mb, {m}, {m->params - experts, experts / ep}, i + 1 == modules.size(),
                          i == 0, static_cast<int>(i)});
      }
    }
  }

  std::vector<std::vector<int>> gather_ops(visits.size());
  std::vector<int> gather_slot(visits.size(), -1);
  size_t next_gather = 0;
  auto issue_gathers_through = [&](size_t last) {
    for (; any_gather && next_gather <= last && next_gather < visits.size(); ++next_gather) {
      const Visit& v = visits[next_gather];
      const Unit& unit = units[v.unit];
      const int slot = gather_pool.next_slot();
      const int acquire =
          prog.add("param_gather", {gather_pool.last_release(slot)}, BufferAcquireOp{gather_pool.pool(), slot, unit.layer});
      gather_slot[next_gather] = slot;
      for (int k = 0; k < num_kinds; ++k) {
        if (kinds[k].s_p <= 1 || v.params[k] == 0) continue;
        // hpZ: backward gathers the dense parameters from the node's secondary copy.
        const int role = k == 0 && role_secondary >= 0 && v.phase == Phase::kBackward ? role_secondary : kinds[k].role_param;
        const int gather = prog.add("param_gather", {acquire, refresh_of(v.unit, k)},
                                    CollectiveOp{CollectiveKind::kAllGather, role, param_bytes(v.params[k]),
                                                 dtype, Payload::kParams, unit.layer, v.micro_batch, -1, v.module});
        gather_ops[next_gather].push_back(gather);
        if (first_read[v.unit][k] < 0) first_read[v.unit][k] = gather;
      }
    }
  };

  // Expert parallelism: tokens go all-to-all to their experts before the experts and come back after them;
  // the backward pass does the same with gradients. The compute stream waits for them (as in Megatron and
  // DeepSpeed-MoE), so they run on it.
  const double act_bytes = scenario.training.precision == Precision::kFp32 ? 4 : 2;
  const std::int64_t a2a_bytes =
      ep > 1 ? static_cast<std::int64_t>(static_cast<double>(scenario.training.micro_batch * scenario.training.seq_len) *
                                         scenario.model.moe.top_k * scenario.model.hidden * act_bytes)
             : 0;
  auto all_to_all = [&](int layer, int mb, std::vector<int> deps) {
    return prog.add("compute", std::move(deps),
                    CollectiveOp{CollectiveKind::kAllToAll, layout.role(GroupRole::kExpertParallel), a2a_bytes, dtype,
                                 Payload::kActivations, layer, mb});
  };
  auto compute = [&](const ModuleCost* m, int layer, Phase phase, int mb, std::vector<int> deps, double flops,
                     double bytes) {
    const bool a2a = ep > 1 && m->kind == ModuleKind::kMoe && phase != Phase::kRecompute;
    if (a2a) deps = {all_to_all(layer, mb, std::move(deps))};  // dispatch (fwd) / combine gradient (bwd)
    int op = prog.add("compute", std::move(deps), ComputeOp{m->kind, layer, phase, mb, flops, bytes});
    if (a2a) op = all_to_all(layer, mb, {op});  // combine (fwd) / dispatch gradient (bwd)
    return op;
  };

  std::vector<int> final_grad_op(buckets.size(), -1);
  std::vector<int> grad_slot(buckets.size(), -1);
  for (size_t i = 0; i < visits.size(); ++i) {
    const Visit& v = visits[i];
    const Unit& unit = units[v.unit];
    const bool last_mb = v.micro_batch == micro_batches - 1;
    issue_gathers_through(i + overlap.prefetch_depth);
    std::vector<int> deps = gather_ops[i];
    for (int k = 0; k < num_kinds; ++k)
      if (kinds[k].s_p == 1) deps.push_back(refresh_of(v.unit, k));

    // Backward writes each sharded kind's gradients into a reduce slot taken when its bucket starts.
    for (int k = 0; k < num_kinds && v.phase == Phase::kBackward; ++k) {
      const int b = bucket_of[v.unit][k];
      if (b < 0 || kinds[k].s_g <= 1 || v.unit != buckets[b].units.front() || !v.first_of_unit) continue;
      grad_slot[b] = grad_pool.next_slot(k);
      deps.push_back(prog.add("compute", {grad_pool.last_release(grad_slot[b])},
                              BufferAcquireOp{grad_pool.pool(), grad_slot[b], unit.layer, b}));
    }

    int last_compute = -1;
    if (v.phase == Phase::kForward) {
      for (const ModuleCost* m : v.modules) {
        last_compute = compute(m, unit.layer, Phase::kForward, v.micro_batch, deps, m->fwd_flops, m->fwd_mem_bytes);
        deps = {last_compute};
        for (int k = 0; k < num_kinds; ++k)
          if (first_read[v.unit][k] < 0) first_read[v.unit][k] = last_compute;
      }
    } else {
      for (const ModuleCost* m : v.modules)
        if (m->recompute_flops > 0 || m->recompute_mem_bytes > 0)
          deps = {compute(m, unit.layer, Phase::kRecompute, v.micro_batch, deps, m->recompute_flops, m->recompute_mem_bytes)};
      for (auto it = v.modules.rbegin(); it != v.modules.rend(); ++it) {
        last_compute = compute(*it, unit.layer, Phase::kBackward, v.micro_batch, deps, (*it)->bwd_flops, (*it)->bwd_mem_bytes);
        deps = {last_compute};
      }
    }
    if (any_gather) {
      const int release = prog.add("compute", {last_compute}, BufferReleaseOp{gather_pool.pool(), gather_slot[i], unit.layer});
      gather_pool.set_release(gather_slot[i], release);
    }
    if (v.phase != Phase::kBackward) continue;

    // Gradient communication of each bucket whose last unit has just finished its backward.
    for (int k = 0; k < num_kinds; ++k) {
      const int b = bucket_of[v.unit][k];
      if (b < 0 || v.unit != buckets[b].units.back() || !v.last_of_unit) continue;
      const StateGroups& g = kinds[k];
      std::int64_t bytes = grad_bytes(buckets[b].params);
      int prev = last_compute;
      if (g.s_g > 1) {
        prev = prog.add("grad_reduce", {prev},
                        CollectiveOp{CollectiveKind::kReduceScatter, g.role_grad, bytes, dtype, Payload::kGrads, unit.layer,
                                     v.micro_batch, b});
        const int release = prog.add("grad_reduce", {prev}, BufferReleaseOp{grad_pool.pool(), grad_slot[b], unit.layer, b});
        grad_pool.set_release(grad_slot[b], release);
        bytes /= g.s_g;
      }
      if (!last_mb) continue;
      if (g.q_grad() > 1) {
        prev = prog.add("replica_sync", {prev},
                        CollectiveOp{CollectiveKind::kReduceScatter, g.role_refresh, bytes, dtype, Payload::kGrads,
                                     unit.layer, v.micro_batch, b});
        bytes /= g.q_grad();
      }
      if (g.replicas > 1)
        prev = prog.add("replica_sync", {prev},
                        CollectiveOp{CollectiveKind::kAllReduce, g.role_replica, bytes, dtype, Payload::kGrads, unit.layer,
                                     v.micro_batch, b});
      final_grad_op[b] = prev;
    }
  }

  // Gradient clipping needs the norm over every shard before any update: a world all-reduce of each rank's
  // partial squared norm once all gradients are final (as FSDP's clip_grad_norm_ / DeepSpeed do).
  int norm_op = -1;
  if (scenario.training.grad_clip > 0) {
    ProcessGroup world_group{"world", {}, world <= scenario.cluster.gpus_per_node, std::min(world, scenario.cluster.gpus_per_node),
                             scenario.cluster.nodes};
    for (int r = 0; r < world; ++r) world_group.ranks.push_back(r);
    const int role_world = static_cast<int>(schedule.roles.size());
    schedule.roles.push_back("world");
    schedule.groups.push_back(std::move(world_group));
    for (std::vector<int>& g : schedule.rank_groups) g.push_back(static_cast<int>(schedule.groups.size()) - 1);
    norm_op = prog.add("compute", final_grad_op,
                       CollectiveOp{CollectiveKind::kAllReduce, role_world, 4, DType::kFp32, Payload::kGradNorm,
                                    scenario.model.layers, static_cast<int>(micro_batches) - 1});
  }

  // Step end: AdamW on each bucket's optimizer slice as soon as its gradients are final.
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::int64_t shard = buckets[b].params / kinds[buckets[b].kind].s_os;
    const int update = prog.add("compute", {norm_op >= 0 ? norm_op : final_grad_op[b]},
                                OptimizerStepOp{static_cast<int>(b), units[buckets[b].units.back()].layer, shard,
                                                shard * kAdamBytesPerParam});
    for (int u : buckets[b].units) prog.op(first_read[u][buckets[b].kind]).prev_step_deps.push_back(update);
  }
  schedule.programs.push_back(prog.take());
  return schedule;
}

}  // namespace hzp
