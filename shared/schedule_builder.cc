// The sharded data-parallel scheduler (see schedule_builder.h for the timeline it builds).
#include "schedule_builder.h"

#include <algorithm>
#include <map>

#include "sharding.h"

namespace hzp {
namespace {

// A parameter unit: the granularity of all-gathers (embedding, one layer, head).
struct Unit {
  int layer = -1;                     // -1 embedding, 0..L-1 layers, L head
  std::vector<const ModuleCost*> modules;
  std::int64_t params = 0;
};

// Consecutive units (in backward order) whose gradients are reduced together.
struct Bucket {
  std::vector<int> units;             // unit indices in backward order; the last one completes the bucket
  std::int64_t params = 0;
};

std::vector<Unit> make_units(const ModelCost& cost, int layers) {
  std::vector<Unit> units(layers + 2);
  for (size_t i = 0; i < units.size(); ++i) units[i].layer = static_cast<int>(i) - 1;
  units.back().layer = layers;
  for (const ModuleCost& m : cost.modules) {
    const size_t u = m.kind == ModuleKind::kEmbedding ? 0 : m.kind == ModuleKind::kHead ? units.size() - 1 : m.layer + 1;
    units[u].modules.push_back(&m);
    units[u].params += m.params;
  }
  return units;
}

std::vector<Bucket> make_buckets(const std::vector<Unit>& units, bool per_unit, double bucket_params) {
  std::vector<Bucket> buckets;
  for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
    if (buckets.empty() || per_unit || static_cast<double>(buckets.back().params) >= bucket_params) buckets.emplace_back();
    buckets.back().units.push_back(u);
    buckets.back().params += units[u].params;
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

// A fixed pool of slots handed out round-robin; a slot's next acquire waits for its previous release.
class SlotPool {
 public:
  SlotPool(int pool, int slots) : pool_(pool), last_release_(slots, -1) {}
  int pool() const { return pool_; }
  int next_slot() { return static_cast<int>(counter_++ % last_release_.size()); }
  int last_release(int slot) const { return last_release_[slot]; }
  void set_release(int slot, int op) { last_release_[slot] = op; }

 private:
  int pool_;
  long long counter_ = 0;
  std::vector<int> last_release_;
};

}  // namespace

Result<Schedule> build_data_parallel_schedule(const Scenario& scenario, const ModelCost& cost,
                                              const std::string& policy_name) {
  const ShardingSpec& s = scenario.policy.sharding;
  const OverlapSpec& overlap = scenario.policy.overlap;
  const int world = scenario.data_parallel();
  HZP_ASSIGN_OR_RETURN(ShardingLayout layout, build_sharding_layout(scenario.cluster, s));

  Schedule schedule;
  schedule.policy = policy_name;
  schedule.world_size = world;
  schedule.gpus_per_node = scenario.cluster.gpus_per_node;
  schedule.roles = layout.roles;
  schedule.groups = std::move(layout.groups);
  schedule.rank_groups = std::move(layout.rank_groups);
  schedule.rank_program.assign(world, 0);

  const StateBytes state = state_bytes_per_param(scenario.training.precision);
  const DType dtype = scenario.training.precision == Precision::kFp32   ? DType::kFp32
                      : scenario.training.precision == Precision::kFp16 ? DType::kFp16
                                                                        : DType::kBf16;
  const int s_p = s.params.size(), s_g = s.grads.size(), s_os = s.optimizer.size();
  const int q_refresh = s_os / s_p;         // optimizer slices per parameter shard
  const int q_grad = s_os / s_g;            // reduce-scatter from grad shard to optimizer slice
  const int replicas = world / s_os;        // copies of each optimizer slice
  const long long micro_batches = scenario.grad_accum_steps();
  const int role_param = static_cast<int>(GroupRole::kParamShard);
  const int role_grad = static_cast<int>(GroupRole::kGradShard);
  const int role_refresh = static_cast<int>(GroupRole::kParamRefresh);
  const int role_replica = static_cast<int>(GroupRole::kOsReplica);

  const int layers = scenario.model.layers;
  std::vector<Unit> units = make_units(cost, layers);
  const std::vector<Bucket> buckets =
      make_buckets(units, s_p > 1, static_cast<double>(overlap.bucket_bytes) / state.grad);
  std::vector<int> bucket_of_unit(units.size());
  for (size_t b = 0; b < buckets.size(); ++b)
    for (int u : buckets[b].units) bucket_of_unit[u] = static_cast<int>(b);
  auto unit_bytes = [&](std::int64_t params) { return static_cast<std::int64_t>(params * state.param); };
  auto grad_bytes = [&](std::int64_t params) { return static_cast<std::int64_t>(params * state.grad); };

  ProgramBuilder prog(schedule, overlap.separate_streams);

  // Fixed pools, sized once from the largest unit / bucket.
  std::int64_t max_unit = 0, max_bucket = 0;
  for (const Unit& u : units) max_unit = std::max(max_unit, u.params);
  for (const Bucket& b : buckets) max_bucket = std::max(max_bucket, b.params);
  const int gather_slots = overlap.prefetch_depth + 1;
  SlotPool gather_pool(-1, gather_slots), grad_pool(-1, 2);
  if (s_p > 1) {
    gather_pool = SlotPool(static_cast<int>(schedule.pools.size()), gather_slots);
    schedule.pools.push_back({"param_gather", gather_slots, unit_bytes(max_unit)});
  }
  if (s_g > 1) {
    grad_pool = SlotPool(static_cast<int>(schedule.pools.size()), 2);
    schedule.pools.push_back({"grad_reduce", 2, grad_bytes(s_p > 1 ? max_unit : max_bucket)});
  }

  // Step start: refresh each bucket's parameters from last step's optimizer slices.
  std::vector<int> refresh_op(buckets.size(), -1);
  if (q_refresh > 1) {
    for (int b = static_cast<int>(buckets.size()) - 1; b >= 0; --b)
      refresh_op[b] = prog.add("replica_sync", {},
                               CollectiveOp{CollectiveKind::kAllGather, role_refresh,
                                            unit_bytes(buckets[b].params) / s_p, dtype, Payload::kParams,
                                            units[buckets[b].units.back()].layer, 0});
  }

  // The first op of the step that reads each unit's parameters: it must wait for last step's update.
  std::vector<int> first_read(units.size(), -1);
  for (size_t b = 0; b < buckets.size(); ++b)
    for (int u : buckets[b].units) first_read[u] = refresh_op[b];

  // The compute visits of the whole step, in order: prefetching runs across micro-batch boundaries.
  struct Visit {
    int unit;
    Phase phase;
    int micro_batch;
  };
  std::vector<Visit> visits;
  for (int mb = 0; mb < micro_batches; ++mb) {
    for (int u = 0; u < static_cast<int>(units.size()); ++u) visits.push_back({u, Phase::kForward, mb});
    for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) visits.push_back({u, Phase::kBackward, mb});
  }

  std::vector<int> gather_op(visits.size(), -1), gather_slot(visits.size(), -1);
  size_t next_gather = 0;
  auto issue_gathers_through = [&](size_t last) {
    for (; s_p > 1 && next_gather <= last && next_gather < visits.size(); ++next_gather) {
      const Visit& v = visits[next_gather];
      const int slot = gather_pool.next_slot();
      const int acquire = prog.add("param_gather", {gather_pool.last_release(slot)},
                                   BufferAcquireOp{gather_pool.pool(), slot, units[v.unit].layer});
      gather_slot[next_gather] = slot;
      gather_op[next_gather] =
          prog.add("param_gather", {acquire, refresh_op[bucket_of_unit[v.unit]]},
                   CollectiveOp{CollectiveKind::kAllGather, role_param, unit_bytes(units[v.unit].params), dtype,
                                Payload::kParams, units[v.unit].layer, v.micro_batch});
      if (first_read[v.unit] < 0) first_read[v.unit] = gather_op[next_gather];
    }
  };

  std::vector<int> final_grad_op(buckets.size(), -1);
  int grad_slot = -1;
  for (size_t i = 0; i < visits.size(); ++i) {
    const Visit& v = visits[i];
    const Unit& unit = units[v.unit];
    const bool last_mb = v.micro_batch == micro_batches - 1;
    issue_gathers_through(i + overlap.prefetch_depth);
    std::vector<int> deps = {gather_op[i]};
    if (s_p == 1) deps.push_back(refresh_op[bucket_of_unit[v.unit]]);

    const Bucket& bucket = buckets[bucket_of_unit[v.unit]];
    if (v.phase == Phase::kBackward && s_g > 1 && v.unit == bucket.units.front()) {
      grad_slot = grad_pool.next_slot();
      deps.push_back(prog.add("compute", {grad_pool.last_release(grad_slot)},
                              BufferAcquireOp{grad_pool.pool(), grad_slot, unit.layer}));
    }

    int last_compute = -1;
    if (v.phase == Phase::kForward) {
      for (const ModuleCost* m : unit.modules) {
        last_compute = prog.add("compute", deps, ComputeOp{m->kind, unit.layer, Phase::kForward, v.micro_batch,
                                                           m->fwd_flops, m->fwd_mem_bytes});
        if (first_read[v.unit] < 0) first_read[v.unit] = last_compute;
      }
    } else {
      for (const ModuleCost* m : unit.modules)
        if (m->recompute_flops > 0 || m->recompute_mem_bytes > 0)
          prog.add("compute", deps, ComputeOp{m->kind, unit.layer, Phase::kRecompute, v.micro_batch,
                                              m->recompute_flops, m->recompute_mem_bytes});
      for (auto it = unit.modules.rbegin(); it != unit.modules.rend(); ++it)
        last_compute = prog.add("compute", deps, ComputeOp{(*it)->kind, unit.layer, Phase::kBackward,
                                                           v.micro_batch, (*it)->bwd_flops, (*it)->bwd_mem_bytes});
    }
    if (s_p > 1) {
      const int release = prog.add("compute", {last_compute},
                                   BufferReleaseOp{gather_pool.pool(), gather_slot[i], unit.layer});
      gather_pool.set_release(gather_slot[i], release);
    }

    // Gradient communication once the bucket's last unit has finished its backward.
    if (v.phase != Phase::kBackward || v.unit != bucket.units.back()) continue;
    const int b = bucket_of_unit[v.unit];
    std::int64_t bytes = grad_bytes(bucket.params);
    int prev = last_compute;
    if (s_g > 1) {
      prev = prog.add("grad_reduce", {prev},
                      CollectiveOp{CollectiveKind::kReduceScatter, role_grad, bytes, dtype, Payload::kGrads,
                                   unit.layer, v.micro_batch});
      const int release = prog.add("grad_reduce", {prev}, BufferReleaseOp{grad_pool.pool(), grad_slot, unit.layer});
      grad_pool.set_release(grad_slot, release);
      bytes /= s_g;
    }
    if (!last_mb) continue;
    if (q_grad > 1) {
      prev = prog.add("replica_sync", {prev},
                      CollectiveOp{CollectiveKind::kReduceScatter, role_refresh, bytes, dtype, Payload::kGrads,
                                   unit.layer, v.micro_batch});
      bytes /= q_grad;
    }
    if (replicas > 1)
      prev = prog.add("replica_sync", {prev},
                      CollectiveOp{CollectiveKind::kAllReduce, role_replica, bytes, dtype, Payload::kGrads,
                                   unit.layer, v.micro_batch});
    final_grad_op[b] = prev;
  }

  // Step end: AdamW on each bucket's optimizer slice as soon as its gradients are final.
  for (size_t b = 0; b < buckets.size(); ++b) {
    const std::int64_t shard = buckets[b].params / s_os;
    const int update = prog.add("compute", {final_grad_op[b]},
                                OptimizerStepOp{units[buckets[b].units.back()].layer, shard, shard * kAdamBytesPerParam});
    for (int u : buckets[b].units) prog.op(first_read[u]).prev_step_deps.push_back(update);
  }
  schedule.programs.push_back(prog.take());
  return schedule;
}

}  // namespace hzp
