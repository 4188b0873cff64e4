// A pipeline stage's layout (stage_layout.h): units, buckets, visits.
#include "shared/schedule/stage_layout.h"

#include <algorithm>

namespace hzp::schedule_detail {

StageLayout::StageLayout(const Scenario& scenario, const ModelCost& cost, const SchedulerOptions& options,
                         Schedule& schedule, int stage, const std::vector<int>& chunk_layers)
    : scenario(scenario),
      schedule(schedule),
      stage(stage),
      chunks(scenario.mesh.pipeline * scenario.policy.parallel.virtual_stages),
      ep(scenario.mesh.expert),
      num_kinds(ep > 1 ? 2 : 1),
      state(state_bytes_per_param(scenario.training.precision, scenario.policy.comm.grad_reduce_in_fp32)),
      dtype(scenario.training.precision == Precision::kFp32   ? DType::kFp32
            : scenario.training.precision == Precision::kFp16 ? DType::kFp16
                                                              : DType::kBf16),
      micro_batches(scenario.grad_accum_steps()),
      // The secondary copy only helps when parameters are sharded beyond the node.
      secondary(options.secondary_param_copy && scenario.policy.sharding.params.s1 > 1),
      act_bytes(static_cast<std::int64_t>(scenario.training.micro_batch * scenario.training.seq_len /
                                          scenario.mesh.context * scenario.model.hidden * dtype_bytes(dtype))),
      bucket_base(static_cast<int>(schedule.buckets.size())) {
  chunk_begin.assign(1, 0);
  for (int n : chunk_layers) chunk_begin.push_back(chunk_begin.back() + n);
  lay_out_units_and_buckets(cost, schedule);
  plan_visits(options);
}

void StageLayout::lay_out_units_and_buckets(const ModelCost& cost, Schedule& schedule) {
  units.assign(scenario.model.layers + 2, Unit{});
  for (std::size_t i = 0; i < units.size(); ++i) units[i].layer = static_cast<int>(i) - 1;
  for (const ModuleCost& m : cost.modules) {
    const std::size_t u = static_cast<std::size_t>(unit_of_module(m, scenario.model.layers));
    if (!on_stage(static_cast<int>(u))) continue;
    units[u].modules.push_back(&m);
    // With expert parallelism each rank holds 1/EP of the experts; without, experts are ordinary params.
    const std::int64_t experts = ep > 1 ? m.expert_params : 0;
    units[u].params[kDense] += m.params - experts;
    units[u].params[kExpert] += experts / ep;
  }
  // Pipelined with tied embeddings, the last stage keeps its own copy of the word embeddings for the
  // logits (Megatron); tied_embedding_sync adds the two copies' gradients.
  const int head = scenario.model.layers + 1;
  if (scenario.mesh.pipeline > 1 && scenario.model.tied_embeddings && on_stage(head))
    units[head].params[kDense] +=
        (scenario.model.vocab * scenario.model.hidden + scenario.mesh.tensor - 1) / scenario.mesh.tensor;
  if (schedule.units.empty()) {  // every unit, whichever stage runs it
    std::vector<UnitInfo> all(units.size());
    for (std::size_t u = 0; u < all.size(); ++u) all[u].layer = units[u].layer;
    for (const ModuleCost& m : cost.modules)
      all[static_cast<std::size_t>(unit_of_module(m, scenario.model.layers))].modules.push_back(m.kind);
    schedule.units = std::move(all);
  }
  // Buckets: with sharded parameters every unit is its own bucket (FSDP's wrapping unit); with replicated
  // parameters, consecutive units in backward order are packed until bucket_bytes (DDP / DeepSpeed). A
  // bucket counts bytes of working-precision gradients, i.e. parameters (the frameworks size theirs in
  // elements): gradients reduced in fp32 move twice its bytes. A bucket never spans two model chunks of an
  // interleaved stage (Megatron-LM wraps each chunk in its own DDP): the backward of one chunk runs between
  // micro-batches of the other, so such a bucket would be taken again before its reduction freed it.
  const double bucket_params = static_cast<double>(scenario.policy.overlap.bucket_bytes) /
                               state_bytes_per_param(scenario.training.precision).grad;
  for (int k = 0; k < num_kinds; ++k)
    for (int u = static_cast<int>(units.size()) - 1; u >= 0; --u) {
      if (units[u].params[k] == 0) continue;
      const bool per_unit = kind(k).s_p > 1;
      if (buckets.empty() || buckets.back().kind != k || per_unit ||
          chunk_of(buckets.back().units.back()) != chunk_of(u) ||
          static_cast<double>(buckets.back().params) >= bucket_params)
        buckets.push_back(Bucket{k, {}, 0});
      buckets.back().units.push_back(u);
      buckets.back().params += units[u].params[k];
    }
  bucket_of.assign(units.size(), {-1, -1});
  for (std::size_t b = 0; b < buckets.size(); ++b) {
    for (int u : buckets[b].units) bucket_of[u][buckets[b].kind] = static_cast<int>(b);
    schedule.buckets.push_back(GradBucket{static_cast<StateKind>(buckets[b].kind), buckets[b].units});
  }
  // Resident model states: each kind's parameters over its groups.
  StateBytesPerRank states;
  for (int k = 0; k < num_kinds; ++k) {
    double psi = 0;
    for (const Unit& u : units) psi += static_cast<double>(u.params[k]);
    states.params += state.param * psi / kind(k).s_p;
    states.grads += state.grad * psi / kind(k).s_g;
    states.optimizer += state.optimizer * psi / kind(k).s_os;
    // hpZ's secondary copy: the dense parameters again, sharded over the node's data-parallel ranks.
    if (secondary && k == kDense)
      states.params +=
          state.param * psi / static_cast<double>(schedule.group_of(0, schedule.role_secondary).ranks.size());
  }
  schedule.state_bytes.push_back(states);
}

std::vector<StageLayout::Pass> StageLayout::pipeline_order() const {
  const int p = scenario.mesh.pipeline, v = scenario.policy.parallel.virtual_stages,
            m = static_cast<int>(micro_batches);
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
    return Pass{forward ? Phase::kForward : Phase::kBackward, local * p + stage, group * p + in_group % p};
  };
  const int warmup = std::min(total, v == 1 ? p - stage - 1 : 2 * (p - stage - 1) + (v - 1) * p);
  int forwards = 0, backwards = 0;
  for (; forwards < warmup; ++forwards) order.push_back(pass(forwards, true));
  for (; forwards < total; ++forwards, ++backwards) {
    order.push_back(pass(forwards, true));
    order.push_back(pass(backwards, false));
  }
  for (; backwards < total; ++backwards) order.push_back(pass(backwards, false));
  return order;
}

void StageLayout::plan_visits(const SchedulerOptions& options) {
  const bool module_visits = options.backward_module_gather && scenario.policy.overlap.prefetch_depth > 0 &&
                             scenario.training.recompute == Recompute::kNone;
  for (const Pass& pass : pipeline_order()) {
    const int mb = pass.mb;
    const int begin = scenario.mesh.pipeline == 1 ? 0 : first_unit(pass.chunk);
    const int end = scenario.mesh.pipeline == 1 ? static_cast<int>(units.size()) - 1 : last_unit(pass.chunk);
    if (pass.phase == Phase::kForward) {
      for (int u = begin; u <= end; ++u)
        visits.push_back({u, Phase::kForward, mb, units[u].modules, units[u].params, true, true});
      continue;
    }
    for (int u = end; u >= begin; --u) {
      const std::vector<const ModuleCost*>& modules = units[u].modules;
      if (!module_visits || modules.size() < 2) {
        visits.push_back({u, Phase::kBackward, mb, modules, units[u].params, true, true});
        continue;
      }
      for (std::size_t i = modules.size(); i-- > 0;) {
        const ModuleCost* m = modules[i];
        const std::int64_t experts = ep > 1 ? m->expert_params : 0;
        visits.push_back({u,
                          Phase::kBackward,
                          mb,
                          {m},
                          {m->params - experts, experts / ep},
                          i + 1 == modules.size(),
                          i == 0,
                          static_cast<int>(i)});
      }
    }
  }
}

CollectiveOp StageLayout::collective(CollectiveKind k, CollectivePurpose purpose, int state_kind, int role,
                                     std::int64_t bytes, Payload payload, int unit, int mb, int bucket) const {
  CollectiveOp c;
  c.kind = k;
  c.purpose = purpose;
  c.state = static_cast<StateKind>(state_kind);
  c.role = role;
  c.bytes = bytes;
  c.dtype = dtype;
  c.payload = payload;
  c.unit = unit;
  c.layer = units[unit].layer;
  c.micro_batch = mb;
  c.bucket = bucket < 0 ? -1 : bucket + bucket_base;
  return c;
}

}  // namespace hzp::schedule_detail
