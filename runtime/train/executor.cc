// The runtime executor (see executor.h for what each IR op does). It reads the IR's typed fields — the op's
// unit and module slot, a collective's purpose and state kind, a pool's kind — and touches the device only
// through runtime/backend/device.h. Buffer layout: state_layout.*; AdamW: adamw.*; checkpoint files:
// checkpoint.*.
#include "runtime/train/executor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <numeric>
#include <sstream>

#include "runtime/train/adamw.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/state_layout.h"

namespace hzp::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// The CPU models compute in fp32 (runtime_supports refuses other precisions): what every buffer holds.
constexpr DType kComputeDtype = DType::kFp32;

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

}  // namespace

double learning_rate(const RunSpec& run, std::int64_t step) {
  if (step < run.warmup_steps) return run.lr * static_cast<double>(step + 1) / static_cast<double>(run.warmup_steps);
  const double span = static_cast<double>(std::max<std::int64_t>(1, run.steps - run.warmup_steps));
  const double t = std::min(1.0, static_cast<double>(step - run.warmup_steps) / span);
  return run.min_lr + 0.5 * (run.lr - run.min_lr) * (1 + std::cos(M_PI * t));
}

Status runtime_supports(const Scenario& scenario) {
  const CommSpec& comm = scenario.policy.comm;
  if (comm.grad_reduce != GradReduce::kReduceScatter || comm.param_refresh != ParamRefresh::kAllGather ||
      comm.param_gather != ParamGather::kUnit)
    return Status::InvalidInput(
        "policy.comm: the runtime runs the reduce_scatter / all_gather / unit forms only (framework \"" +
        comm.framework + "\" asks for " + to_string(comm.grad_reduce) + " / " + to_string(comm.param_refresh) + " / " +
        to_string(comm.param_gather) + "); the simulator and the planner model them");
  if (scenario.policy.parallel != ParallelSpec{})
    return Status::InvalidInput(
        "policy.parallel: the runtime trains with data parallelism (and expert parallelism) only; tensor, "
        "sequence, context and pipeline parallelism run in the simulator, the estimator and the planner");
  if (scenario.training.recompute != Recompute::kNone)
    return Status::InvalidInput("training.recompute: the runtime does not recompute activations; use \"none\"");
  if (scenario.training.attention_dropout > 0 || scenario.training.hidden_dropout > 0)
    return Status::InvalidInput(
        "training.attention_dropout / training.hidden_dropout: the runtime trains without dropout; set 0");
  if (scenario.training.fp8)
    return Status::InvalidInput("training.fp8: the CPU runtime has no FP8 arithmetic; set false");
  if (scenario.training.precision != Precision::kFp32)
    return Status::InvalidInput("training.precision: the CPU runtime trains in fp32; set \"fp32\" (got \"" +
                                std::string(to_string(scenario.training.precision)) + "\")");
  return model_config(scenario.model).status();
}

struct Executor::Impl {
  Scenario scenario;
  Schedule schedule;
  const Program* program = nullptr;
  int rank = 0;
  int world = 1;
  const ByteDataset* data = nullptr;
  Device* device = nullptr;
  ModelConfig cfg;
  std::int64_t batch = 0, seq = 0, tokens = 0;
  std::int64_t groups_per_step = 0;  // micro-batch groups in the global batch
  StateLayout layout;

  // Resident buffers of each segment (StateLayout sizes them).
  struct SegmentBuffers {
    float* param = nullptr;  // full (s_p = 1) or this rank's shard
    float* grad = nullptr;   // full (s_g = 1) or this rank's shard
    float* m = nullptr;      // Adam moments of the optimizer slice
    float* v = nullptr;
    float* secondary = nullptr;  // hpZ: this rank's piece of the node-sharded copy
  };
  std::vector<SegmentBuffers> bufs;
  std::unique_ptr<MemoryPool> pool;
  std::vector<std::vector<float*>> pool_slots;  // [pool][slot]
  float* eval_params = nullptr;                 // full parameters for evaluation (sharded runs)

  std::vector<std::unique_ptr<Stream>> streams;
  std::unique_ptr<Stream> host_stream;  // metrics and evaluation collectives (outside the IR)
  std::map<std::pair<int, int>, std::unique_ptr<Communicator>> comms;  // (group, stream)
  std::unique_ptr<Communicator> metrics;
  std::function<void(const Status&)> on_fatal;
  std::atomic<bool> failed{false};

  // Model blocks (one per layer; their saved activations serve every micro-batch in turn).
  std::unique_ptr<Embedding> embedding;
  std::vector<std::unique_ptr<AttentionBlock>> attention;
  std::vector<std::unique_ptr<MlpBlock>> mlp;
  std::vector<std::unique_ptr<MoeBlock>> moe;
  std::unique_ptr<Head> head;
  std::vector<float> x, dx;
  std::vector<std::int32_t> ids, targets;

  // Expert-parallel exchange buffers of each MoE layer (one micro-batch in flight on the compute stream).
  struct MoeBuffers {
    std::vector<float> send, recv, out, back;
    std::vector<std::int64_t> send_counts, recv_counts, out_counts, back_counts;
  };
  std::vector<MoeBuffers> moe_buf;

  // Per step.
  std::int64_t step = 0;
  double lr = 0;
  double loss_sum = 0, aux_sum = 0;
  double grad_norm = 0, clip_coef = 1;
  std::int64_t adam_t = 0;  // optimizer steps taken (bias correction)

  std::vector<std::vector<ExecutedOp>> stream_trace;  // per stream, appended by its worker thread only
  bool tracing = false;

  Status setup();
  Status setup_memory();
  Status setup_comms();
  Communicator* comm(int role, int stream) {
    auto it = comms.find({schedule.rank_groups[rank][role], stream});
    return it == comms.end() ? nullptr : it->second.get();
  }
  // Any communicator of the group bound to `role`, with the stream it belongs to (for host-driven work).
  std::pair<Communicator*, Stream*> any_comm(int role) {
    for (const auto& [key, c] : comms)
      if (key.first == schedule.rank_groups[rank][role]) return {c.get(), streams[key.second].get()};
    return {nullptr, nullptr};
  }

  // Where segment s's parameters are read from / its gradients written to right now.
  float* param_ptr(int s, float* gather_slot) const {
    const Segment& seg = layout.segment(s);
    if (layout.sharding(seg.state).s_p == 1) return bufs[s].param;
    return gather_slot == nullptr ? nullptr : gather_slot + seg.unit_offset;
  }
  float* grad_ptr(int s, const std::vector<float*>& bucket_slot) const {
    const Segment& seg = layout.segment(s);
    if (layout.sharding(seg.state).s_g == 1) return bufs[s].grad;
    const int b = layout.bucket_of(seg.unit, seg.state);
    for (const auto& [sg, off] : layout.bucket_segments(b))
      if (sg == s) return bucket_slot[b] == nullptr ? nullptr : bucket_slot[b] + off;
    return nullptr;
  }
  int router_seg(int unit) const { return layout.find(unit, 1, StateKind::kDense, false); }
  int experts_seg(int unit) const {
    return layout.find(unit, 1, schedule.state(StateKind::kExpert).present ? StateKind::kExpert : StateKind::kDense,
                       true);
  }
  bool expert_parallel() const { return schedule.role_expert_parallel >= 0; }
  // dL/d(aux loss of one micro-batch): the coefficient, averaged over the step's micro-batch groups.
  float aux_grad_scale() const { return static_cast<float>(cfg.aux_loss_coef / static_cast<double>(groups_per_step)); }

  // The module forwards, shared by training's compute ops and evaluation.
  Status forward_module(ModuleKind module, int unit, const std::function<float*(int)>& P);
  // The stages of a MoE layer under expert parallelism around its all-to-alls (one per CollectivePurpose).
  Status moe_exchange(CollectivePurpose purpose, int unit, Communicator& cm, float* router, float* drouter);

  Status run_step(std::int64_t step_index);
  Status refresh_parameters();
  Status compute(const ComputeOp& c, float* gather_slot, const std::vector<float*>& bucket_slot);
  Status collective(const CollectiveOp& c, int stream, float* gather_slot, const std::vector<float*>& bucket_slot);
  Status optimizer(const OptimizerStepOp& o);
  void load_batch(int micro_batch);
  // The checkpointed state (checkpoint.h): per segment its parameter shard, Adam m, Adam v.
  std::vector<FloatSpan> state_spans() const;
  CheckpointHeader checkpoint_header(std::int64_t next_step) const;
};

// ---------------------------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------------------------

Status Executor::Impl::setup() {
  if (schedule.world_size != world || rank < 0 || rank >= world)
    return Status::InvalidInput("runtime: rank " + std::to_string(rank) + " outside world of " + std::to_string(world));
  HZP_RETURN_IF_ERROR(runtime_supports(scenario));
  HZP_ASSIGN_OR_RETURN(cfg, model_config(scenario.model));
  program = &schedule.program_of(rank);
  batch = scenario.training.micro_batch;
  seq = scenario.training.seq_len;
  tokens = batch * seq;
  groups_per_step = scenario.training.global_batch / batch;
  int ep_position = 0;
  if (expert_parallel()) {
    const ProcessGroup& g = schedule.group_of(rank, schedule.role_expert_parallel);
    ep_position = static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), rank) - g.ranks.begin());
    if (static_cast<int>(g.ranks.size()) != scenario.policy.expert_parallel)
      return Status::Internal("runtime: expert_parallel group size differs from policy.expert_parallel");
  }
  HZP_ASSIGN_OR_RETURN(layout, StateLayout::build(schedule, cfg, rank, ep_position));
  HZP_RETURN_IF_ERROR(setup_memory());

  const int ep = expert_parallel() ? scenario.policy.expert_parallel : 1;
  embedding = std::make_unique<Embedding>(cfg, tokens);
  for (int l = 0; l < cfg.layers; ++l) {
    attention.push_back(std::make_unique<AttentionBlock>(cfg, batch, seq));
    mlp.push_back(cfg.moe_layer[l] ? nullptr : std::make_unique<MlpBlock>(cfg, batch, seq));
    moe.push_back(cfg.moe_layer[l] ? std::make_unique<MoeBlock>(cfg, batch, seq, ep) : nullptr);
  }
  moe_buf.resize(cfg.layers);
  head = std::make_unique<Head>(cfg, tokens);
  x.assign(tokens * cfg.hidden, 0.f);
  dx.assign(tokens * cfg.hidden, 0.f);
  for (const std::string& name : schedule.streams) streams.push_back(device->create_stream(name));
  host_stream = device->create_stream("host");
  stream_trace.resize(streams.size());
  return Status::Ok();
}

Status Executor::Impl::setup_memory() {
  // Size everything first, then allocate once.
  const std::int64_t align = 64 / dtype_bytes(kComputeDtype);
  std::int64_t elements = 0, full_model = 0;
  auto need = [&](std::int64_t n) { elements += (n + align - 1) / align * align; };
  const std::vector<Segment>& segs = layout.segments();
  for (std::size_t s = 0; s < segs.size(); ++s) {
    const int i = static_cast<int>(s);
    need(layout.param_floats(i));
    need(layout.grad_floats(i));
    need(layout.optimizer_floats(i));
    need(layout.optimizer_floats(i));
    if (segs[s].state == StateKind::kDense && schedule.role_secondary >= 0)
      need(segs[s].padded / layout.secondary_size());
    full_model += segs[s].padded;
  }
  std::vector<std::int64_t> slot_elements;
  for (const BufferPool& bp : schedule.pools) {
    slot_elements.push_back(bp.kind == PoolKind::kParamGather
                                ? layout.max_unit_floats()
                                : std::max(layout.max_unit_floats(), layout.max_bucket_floats()));
    for (int i = 0; i < bp.slots; ++i) need(slot_elements.back());
  }
  const bool sharded_params =
      layout.sharding(StateKind::kDense).s_p > 1 ||
      (schedule.state(StateKind::kExpert).present && layout.sharding(StateKind::kExpert).s_p > 1);
  if (sharded_params) need(full_model);
  pool = device->create_pool(elements * dtype_bytes(kComputeDtype));

  bufs.assign(segs.size(), {});
  for (std::size_t s = 0; s < segs.size(); ++s) {
    const int i = static_cast<int>(s);
    HZP_ASSIGN_OR_RETURN(bufs[s].param, pool->allocate("params", layout.param_floats(i)));
    HZP_ASSIGN_OR_RETURN(bufs[s].grad, pool->allocate("grads", layout.grad_floats(i)));
    HZP_ASSIGN_OR_RETURN(bufs[s].m, pool->allocate("optimizer", layout.optimizer_floats(i)));
    HZP_ASSIGN_OR_RETURN(bufs[s].v, pool->allocate("optimizer", layout.optimizer_floats(i)));
    if (segs[s].state == StateKind::kDense && schedule.role_secondary >= 0) {
      HZP_ASSIGN_OR_RETURN(bufs[s].secondary, pool->allocate("params", segs[s].padded / layout.secondary_size()));
    }
  }
  pool_slots.assign(schedule.pools.size(), {});
  for (std::size_t p = 0; p < schedule.pools.size(); ++p)
    for (int i = 0; i < schedule.pools[p].slots; ++i) {
      HZP_ASSIGN_OR_RETURN(float* slot, pool->allocate("pool:" + schedule.pools[p].name, slot_elements[p]));
      pool_slots[p].push_back(slot);
    }
  if (sharded_params) {
    HZP_ASSIGN_OR_RETURN(eval_params, pool->allocate("eval", full_model));
  }

  // Initial weights: the full tensor is a function of (seed, tensor, index); keep this rank's shard.
  std::vector<float> full;
  for (std::size_t s = 0; s < segs.size(); ++s) {
    const Segment& seg = segs[s];
    full.assign(seg.padded, 0.f);
    if (!seg.experts || seg.first_expert < 0) {
      init_parameters(cfg, seg.layout, static_cast<std::uint64_t>(scenario.run.seed), seg.tensor_id, full.data());
    } else {
      const Layout one = experts_layout(cfg, 1);
      const std::int64_t per = layout_size(one);
      for (std::int64_t e = 0; e < seg.n / per; ++e)
        init_parameters(
            cfg, one, static_cast<std::uint64_t>(scenario.run.seed),
            1000000 + static_cast<std::uint64_t>(seg.unit) * 1000 + static_cast<std::uint64_t>(seg.first_expert + e),
            full.data() + e * per);
    }
    const std::int64_t piece = layout.param_floats(static_cast<int>(s));
    const int p = layout.position(seg.state).p;
    std::copy(full.begin() + p * piece, full.begin() + (p + 1) * piece, bufs[s].param);
  }
  return Status::Ok();
}

Status Executor::Impl::setup_comms() {
  // Every (group, stream) pair this rank's program uses, created in one global order so that no two ranks
  // wait for each other's rendezvous in opposite orders.
  std::vector<std::pair<int, int>> pairs;
  for (const Op& op : program->ops)
    if (const auto* c = std::get_if<CollectiveOp>(&op.body))
      pairs.push_back({schedule.rank_groups[rank][c->role], op.stream});
  std::sort(pairs.begin(), pairs.end());
  pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
  for (const auto& [group, stream] : pairs) {
    const ProcessGroup& g = schedule.groups[group];
    std::ostringstream name;
    name << to_string(g.role) << "[";
    for (std::size_t i = 0; i < g.ranks.size(); ++i) name << (i ? "," : "") << g.ranks[i];
    name << "] on stream " << schedule.streams[stream];
    HZP_ASSIGN_OR_RETURN(
        auto c, device->create_communicator(g.ranks, "g" + std::to_string(group) + "/s" + std::to_string(stream),
                                            name.str(), *streams[stream]));
    comms[{group, stream}] = std::move(c);
  }
  std::vector<int> all(world);
  std::iota(all.begin(), all.end(), 0);
  HZP_ASSIGN_OR_RETURN(metrics, device->create_communicator(all, "metrics", "world (metrics)", *host_stream));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------
// The modules
// ---------------------------------------------------------------------------------------------------------

void Executor::Impl::load_batch(int micro_batch) {
  const std::int64_t group = static_cast<std::int64_t>(micro_batch) * world + rank;
  data->train_batch(static_cast<std::uint64_t>(scenario.run.seed), step, group, batch, ids, targets);
}

Status Executor::Impl::forward_module(ModuleKind module, int unit, const std::function<float*(int)>& P) {
  const int layer = schedule.units[unit].layer;
  const int s0 = layout.find(unit, module_slot(module), StateKind::kDense, false);
  if (s0 < 0 || P(s0) == nullptr)
    return Status::Internal(std::string("runtime: no parameters for ") + to_string(module));
  switch (module) {
    case ModuleKind::kEmbedding:
      embedding->forward(P(s0), ids.data(), x.data());
      break;
    case ModuleKind::kAttention:
      attention[layer]->forward(P(s0), x.data());
      break;
    case ModuleKind::kMlp:
      mlp[layer]->forward(P(s0), x.data());
      break;
    case ModuleKind::kMoe:  // without expert parallelism: the stages back to back
      moe[layer]->forward(P(s0), P(experts_seg(unit)), x.data());
      aux_sum += moe[layer]->aux_loss();
      break;
    case ModuleKind::kHead:
      loss_sum += head->forward(P(s0), x.data(), targets.data());
      break;
  }
  return Status::Ok();
}

Status Executor::Impl::moe_exchange(CollectivePurpose purpose, int unit, Communicator& cm, float* router,
                                    float* drouter) {
  const int layer = schedule.units[unit].layer;
  MoeBuffers& buf = moe_buf[layer];
  MoeBlock& block = *moe[layer];
  const std::int64_t h = cfg.hidden;
  switch (purpose) {
    case CollectivePurpose::kMoeDispatch:  // route my tokens, send each to the rank holding its expert
      block.route_forward(router, x.data(), buf.send, buf.send_counts);
      aux_sum += block.aux_loss();
      return cm.all_to_all_v(buf.send.data(), buf.send_counts, buf.recv, buf.recv_counts);
    case CollectivePurpose::kMoeCombine: {  // expert outputs (h floats a row) back to the tokens' ranks
      std::vector<std::int64_t> counts(buf.recv_counts.size());
      for (std::size_t j = 0; j < counts.size(); ++j) counts[j] = buf.recv_counts[j] / (h + 1) * h;
      HZP_RETURN_IF_ERROR(cm.all_to_all_v(buf.out.data(), counts, buf.back, buf.back_counts));
      block.combine_forward(buf.back, x.data());
      return Status::Ok();
    }
    case CollectivePurpose::kMoeCombineGrad:  // gradients of the expert outputs to the experts' ranks
      block.combine_backward(dx.data(), buf.send, buf.send_counts);
      return cm.all_to_all_v(buf.send.data(), buf.send_counts, buf.recv, buf.recv_counts);
    case CollectivePurpose::kMoeDispatchGrad:  // gradients of the routed inputs back, then through the router
      HZP_RETURN_IF_ERROR(cm.all_to_all_v(buf.out.data(), buf.recv_counts, buf.back, buf.back_counts));
      block.route_backward(router, buf.back, aux_grad_scale(), dx.data(), drouter);
      return Status::Ok();
    default:
      return Status::Internal(std::string("runtime: ") + to_string(purpose) + " is not a MoE exchange");
  }
}

Status Executor::Impl::compute(const ComputeOp& c, float* gather_slot, const std::vector<float*>& bucket_slot) {
  auto P = [&](int s) { return param_ptr(s, gather_slot); };
  auto G = [&](int s) { return grad_ptr(s, bucket_slot); };
  const int layer = c.layer;
  if (c.phase == Phase::kForward) {
    if (c.module == ModuleKind::kEmbedding) load_batch(c.micro_batch);
    // Under expert parallelism the MoE compute is the experts alone, between the dispatch and the combine.
    if (c.module == ModuleKind::kMoe && expert_parallel()) {
      moe[layer]->experts_forward(P(experts_seg(c.unit)), moe_buf[layer].recv, moe_buf[layer].out);
      return Status::Ok();
    }
    return forward_module(c.module, c.unit, P);
  }
  const int s0 = layout.find(c.unit, module_slot(c.module), StateKind::kDense, false);
  if (s0 < 0 || P(s0) == nullptr || G(s0) == nullptr)
    return Status::Internal(std::string("runtime: no parameter or gradient buffer for ") + to_string(c.module));
  switch (c.module) {
    case ModuleKind::kEmbedding:
      embedding->backward(dx.data(), ids.data(), G(s0));
      break;
    case ModuleKind::kAttention:
      attention[layer]->backward(P(s0), dx.data(), G(s0));
      break;
    case ModuleKind::kMlp:
      mlp[layer]->backward(P(s0), dx.data(), G(s0));
      break;
    case ModuleKind::kMoe: {
      const int se = experts_seg(c.unit);
      if (expert_parallel())
        moe[layer]->experts_backward(P(se), moe_buf[layer].recv, moe_buf[layer].out, G(se));
      else
        moe[layer]->backward(P(s0), P(se), aux_grad_scale(), dx.data(), G(s0), G(se));
      break;
    }
    case ModuleKind::kHead:
      head->backward(P(s0), 1.0f / static_cast<float>(scenario.training.global_batch * seq), dx.data(), G(s0));
      break;
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------
// The collectives, by purpose
// ---------------------------------------------------------------------------------------------------------

Status Executor::Impl::collective(const CollectiveOp& c, int stream, float* gather_slot,
                                  const std::vector<float*>& bucket_slot) {
  Communicator* cm = comm(c.role, stream);
  if (cm == nullptr)
    return Status::Internal(std::string("runtime: no communicator for ") + to_string(schedule.roles[c.role]));
  const StateSharding& k = layout.sharding(c.state);
  const ShardPosition& pos = layout.position(c.state);
  switch (c.purpose) {
    case CollectivePurpose::kMoeDispatch:
    case CollectivePurpose::kMoeCombine:
    case CollectivePurpose::kMoeCombineGrad:
    case CollectivePurpose::kMoeDispatchGrad: {
      const int rs = router_seg(c.unit);
      return moe_exchange(c.purpose, c.unit, *cm, param_ptr(rs, gather_slot), grad_ptr(rs, bucket_slot));
    }
    case CollectivePurpose::kGradNorm: {
      double partial = 0;
      for (std::size_t s = 0; s < layout.segments().size(); ++s) {
        const int i = static_cast<int>(s);
        const float* g = bufs[s].grad + layout.optimizer_in_grad(i);
        double sum = 0;
        for (std::int64_t e = 0; e < layout.optimizer_floats(i); ++e) sum += static_cast<double>(g[e]) * g[e];
        partial += sum / layout.sharding(layout.segment(i).state).replicas;  // each slice is held by `replicas` ranks
      }
      float value = static_cast<float>(partial);
      HZP_RETURN_IF_ERROR(cm->all_reduce(&value, 1));
      grad_norm = std::sqrt(static_cast<double>(value));
      clip_coef = std::min(1.0, scenario.training.grad_clip / (grad_norm + 1e-6));
      return Status::Ok();
    }
    case CollectivePurpose::kRefreshParams:  // optimizer slices -> this rank's parameter shard, in place
      for (const auto& [s, off] : layout.bucket_segments(c.bucket)) {
        const std::int64_t piece = layout.optimizer_floats(s);
        HZP_RETURN_IF_ERROR(cm->all_gather(bufs[s].param + pos.i * piece, bufs[s].param, piece));
      }
      return Status::Ok();
    case CollectivePurpose::kGatherParams:
    case CollectivePurpose::kGatherSecondary: {
      if (gather_slot == nullptr) return Status::Internal("runtime: parameter all-gather without a slot");
      const bool secondary = c.purpose == CollectivePurpose::kGatherSecondary;
      for (int s : layout.unit_segments(c.unit)) {
        const Segment& seg = layout.segment(s);
        if (seg.state != c.state || (c.module >= 0 && seg.module != c.module)) continue;
        float* out = gather_slot + seg.unit_offset;
        const std::int64_t piece = seg.padded / layout.secondary_size();
        if (secondary) {
          HZP_RETURN_IF_ERROR(cm->all_gather(bufs[s].secondary, out, piece));
        } else {
          HZP_RETURN_IF_ERROR(cm->all_gather(bufs[s].param, out, layout.param_floats(s)));
          if (bufs[s].secondary != nullptr)  // hpZ: keep my node piece for the backward gathers
            std::copy(out + layout.secondary_position() * piece, out + (layout.secondary_position() + 1) * piece,
                      bufs[s].secondary);
        }
      }
      return Status::Ok();
    }
    case CollectivePurpose::kReduceGrads: {  // gradient slot -> my gradient shard, accumulated
      float* slot = bucket_slot[c.bucket];
      if (slot == nullptr) return Status::Internal("runtime: gradient reduce-scatter without a slot");
      for (const auto& [s, off] : layout.bucket_segments(c.bucket)) {
        const std::int64_t piece = layout.grad_floats(s);
        float* in = slot + off;
        HZP_RETURN_IF_ERROR(cm->reduce_scatter(in, in + pos.g * piece, piece));
        const float* mine = in + pos.g * piece;
        for (std::int64_t e = 0; e < piece; ++e) bufs[s].grad[e] += mine[e];
      }
      return Status::Ok();
    }
    case CollectivePurpose::kReduceToOptimizer:  // gradient shard -> optimizer slice, in place
      for (const auto& [s, off] : layout.bucket_segments(c.bucket)) {
        const std::int64_t piece = layout.optimizer_floats(s);
        HZP_RETURN_IF_ERROR(cm->reduce_scatter(bufs[s].grad, bufs[s].grad + pos.i * piece, piece));
      }
      return Status::Ok();
    case CollectivePurpose::kSyncReplicas:  // the optimizer slice's gradients across replicas
      for (const auto& [s, off] : layout.bucket_segments(c.bucket))
        HZP_RETURN_IF_ERROR(cm->all_reduce(bufs[s].grad + layout.optimizer_in_grad(s), layout.optimizer_floats(s)));
      return Status::Ok();
    case CollectivePurpose::kTensorForward:  // ND parallelism: refused by runtime_supports
    case CollectivePurpose::kTensorBackward:
    case CollectivePurpose::kPipeActivations:
    case CollectivePurpose::kPipeGrads:
    case CollectivePurpose::kContextForward:
    case CollectivePurpose::kContextBackward:
    case CollectivePurpose::kEmbeddingGrads:
      break;
  }
  (void)k;
  return Status::Unimplemented(std::string("runtime: ") + to_string(c.purpose));
}

Status Executor::Impl::optimizer(const OptimizerStepOp& o) {
  const RunSpec& run = scenario.run;
  const AdamWStep hyper{lr, run.beta1, run.beta2, run.eps, run.weight_decay, adam_t, static_cast<float>(clip_coef)};
  for (const auto& [s, off] : layout.bucket_segments(o.bucket)) {
    adamw_update(hyper, layout.segment(s).layout, layout.optimizer_begin(s), layout.optimizer_floats(s),
                 bufs[s].param + layout.optimizer_in_param(s), bufs[s].grad + layout.optimizer_in_grad(s), bufs[s].m,
                 bufs[s].v);
    std::fill(bufs[s].grad, bufs[s].grad + layout.grad_floats(s), 0.f);
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------
// One step
// ---------------------------------------------------------------------------------------------------------

Status Executor::Impl::run_step(std::int64_t step_index) {
  step = step_index;
  lr = learning_rate(scenario.run, step);
  loss_sum = aux_sum = 0;
  grad_norm = 0;
  clip_coef = 1;
  ++adam_t;

  const std::vector<Op>& ops = program->ops;
  std::vector<EventPtr> events(ops.size());
  // Host-side bookkeeping in program order: the gather slots of the visits in flight (FIFO) and the
  // gradient slot of every bucket.
  float* last_gather = nullptr;  // the slot acquired for the gathers that follow it
  std::vector<float*> bucket_slot(schedule.buckets.size(), nullptr);
  std::deque<float*> compute_gather;  // the slot the next compute visit reads (front), in visit order
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    Stream& stream = *streams[op.stream];
    // A dependency on another stream: this stream waits for that op's event before running the op
    // (cudaStreamWaitEvent), so a gather's slot is filled before compute reads it, a gradient slot is
    // reduced before it is reused, and the optimizer runs after the last gradient collective.
    for (int d : op.deps)
      if (ops[d].stream != op.stream) stream.wait(events[d]);
    std::function<Status()> work;
    std::int64_t bytes = 0;
    if (const auto* a = std::get_if<BufferAcquireOp>(&op.body)) {
      float* slot = pool_slots[a->pool][a->slot];
      if (schedule.pools[a->pool].kind == PoolKind::kParamGather) {
        last_gather = slot;
        compute_gather.push_back(slot);
        work = [] { return Status::Ok(); };
      } else {
        bucket_slot[a->bucket] = slot;
        const std::int64_t size = layout.bucket_floats(a->bucket);
        work = [slot, size] {
          std::fill(slot, slot + size, 0.f);
          return Status::Ok();
        };
      }
    } else if (const auto* r = std::get_if<BufferReleaseOp>(&op.body)) {
      if (schedule.pools[r->pool].kind == PoolKind::kParamGather) {
        if (compute_gather.empty()) return Status::Internal("runtime: release of a gather slot never acquired");
        compute_gather.pop_front();
      }
      work = [] { return Status::Ok(); };
    } else if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      float* slot = compute_gather.empty() ? nullptr : compute_gather.front();
      work = [this, body = *c, slot, buckets = bucket_slot] { return compute(body, slot, buckets); };
    } else if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      float* slot = nullptr;
      if (c->purpose == CollectivePurpose::kGatherParams || c->purpose == CollectivePurpose::kGatherSecondary) {
        if (last_gather == nullptr) return Status::Internal("runtime: parameter all-gather without an acquired slot");
        slot = last_gather;  // the slot acquired for this unit's gathers
      } else if (c->kind == CollectiveKind::kAllToAll) {
        slot = compute_gather.empty() ? nullptr : compute_gather.front();  // the MoE unit's router parameters
      }
      // Bytes as executed: the IR's element count in the dtype the models compute in.
      bytes = c->bytes / dtype_bytes(c->dtype) * dtype_bytes(kComputeDtype);
      work = [this, body = *c, s = op.stream, slot, buckets = bucket_slot] {
        return collective(body, s, slot, buckets);
      };
    } else if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) {
      work = [this, body = *o] { return optimizer(body); };
    }
    const int stream_index = op.stream;
    const int op_index = static_cast<int>(i);
    events[i] = stream.submit([this, work = std::move(work), stream_index, op_index, bytes]() -> Status {
      const double t0 = tracing ? now_us() : 0;
      Status st = work();
      if (tracing) stream_trace[stream_index].push_back({step, op_index, stream_index, t0, now_us(), bytes});
      if (!st.ok() && !failed.exchange(true) && on_fatal) on_fatal(st);
      return st;
    });
  }
  Status first = Status::Ok();
  for (auto& s : streams) {
    Status st = s->synchronize();
    if (first.ok() && !st.ok()) first = st;
  }
  return first;
}

// ---------------------------------------------------------------------------------------------------------
// Executor
// ---------------------------------------------------------------------------------------------------------

Executor::Executor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Executor::~Executor() {
  if (impl_) {  // join the workers before anything they touch goes away
    impl_->streams.clear();
    impl_->host_stream.reset();
  }
}

int Executor::rank() const {
  return impl_->rank;
}
void Executor::set_tracing(bool on) {
  impl_->tracing = on;
}

Result<std::unique_ptr<Executor>> Executor::create(const Scenario& scenario, const Schedule& schedule, int rank,
                                                   const ByteDataset* data, Device& device,
                                                   std::function<void(const Status&)> on_fatal) {
  auto impl = std::make_unique<Impl>();
  impl->scenario = scenario;
  impl->schedule = schedule;
  impl->rank = rank;
  impl->world = scenario.cluster.world_size();
  impl->data = data;
  impl->device = &device;
  impl->on_fatal = std::move(on_fatal);
  HZP_RETURN_IF_ERROR(impl->setup());
  HZP_RETURN_IF_ERROR(impl->setup_comms());
  return std::unique_ptr<Executor>(new Executor(std::move(impl)));
}

Result<StepMetrics> Executor::train_step(std::int64_t step) {
  Impl& d = *impl_;
  const auto t0 = Clock::now();
  HZP_RETURN_IF_ERROR(d.run_step(step));
  for (auto& per_stream : d.stream_trace) {
    trace_.insert(trace_.end(), per_stream.begin(), per_stream.end());
    per_stream.clear();
  }
  // Metrics over the world (logging, outside the schedule): loss and aux sums.
  float sums[2] = {static_cast<float>(d.loss_sum), static_cast<float>(d.aux_sum)};
  HZP_RETURN_IF_ERROR(d.metrics->all_reduce(sums, 2));
  StepMetrics m;
  m.loss = sums[0] / static_cast<double>(d.scenario.training.global_batch * d.seq);
  m.aux_loss = sums[1] / static_cast<double>(d.groups_per_step);
  m.grad_norm = d.grad_norm;
  m.lr = d.lr;
  m.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return m;
}

// Brings every parameter shard up to date with the optimizer slices (what the next step's refresh does), so
// that evaluation and checkpoints of q > 1 layouts see the updated weights. Idempotent.
Status Executor::Impl::refresh_parameters() {
  for (std::size_t s = 0; s < layout.segments().size(); ++s) {
    const StateKind kind = layout.segment(static_cast<int>(s)).state;
    const StateSharding& k = layout.sharding(kind);
    if (k.q() == 1) continue;
    auto [cm, stream] = any_comm(k.role_refresh);
    if (cm == nullptr) return Status::Internal("runtime: no param_refresh communicator");
    const std::int64_t piece = layout.optimizer_floats(static_cast<int>(s));
    float* param = bufs[s].param;
    const int i = layout.position(kind).i;
    HZP_RETURN_IF_ERROR(cm->all_gather_async(*stream, param + i * piece, param, piece)->synchronize());
  }
  return Status::Ok();
}

Result<double> Executor::evaluate(std::int64_t groups) {
  Impl& d = *impl_;
  HZP_RETURN_IF_ERROR(d.refresh_parameters());
  // Full parameters of every segment: resident, or gathered once into the eval buffer.
  const std::size_t count = d.layout.segments().size();
  std::vector<float*> full(count, nullptr);
  std::int64_t offset = 0;
  for (std::size_t s = 0; s < count; ++s) {
    const Segment& seg = d.layout.segment(static_cast<int>(s));
    const StateSharding& k = d.layout.sharding(seg.state);
    if (k.s_p == 1) {
      full[s] = d.bufs[s].param;
      continue;
    }
    full[s] = d.eval_params + offset;
    offset += seg.padded;
    auto [cm, stream] = d.any_comm(k.role_param);  // the stream that owns this group's gathers
    if (cm == nullptr) return Status::Internal("runtime: no parameter communicator for evaluation");
    HZP_RETURN_IF_ERROR(
        cm->all_gather_async(*stream, d.bufs[s].param, full[s], d.layout.param_floats(static_cast<int>(s)))
            ->synchronize());
  }
  auto P = [&](int s) { return full[s]; };
  Communicator* ep_comm = d.expert_parallel() ? d.any_comm(d.schedule.role_expert_parallel).first : nullptr;
  const std::int64_t per_rank = (groups + d.world - 1) / d.world;
  const double loss_before = d.loss_sum, aux_before = d.aux_sum;
  d.loss_sum = 0;
  // The same module forwards as training, unit by unit; under expert parallelism a MoE layer runs its
  // stages around the two forward exchanges.
  for (std::int64_t j = 0; j < per_rank; ++j) {
    d.data->val_batch(static_cast<std::uint64_t>(d.scenario.run.seed), j * d.world + d.rank, d.batch, d.ids, d.targets);
    for (int u = 0; u < static_cast<int>(d.schedule.units.size()); ++u)
      for (ModuleKind module : d.schedule.units[u].modules) {
        if (module != ModuleKind::kMoe || ep_comm == nullptr) {
          HZP_RETURN_IF_ERROR(d.forward_module(module, u, P));
          continue;
        }
        const int layer = d.schedule.units[u].layer;
        HZP_RETURN_IF_ERROR(
            d.moe_exchange(CollectivePurpose::kMoeDispatch, u, *ep_comm, full[d.router_seg(u)], nullptr));
        d.moe[layer]->experts_forward(full[d.experts_seg(u)], d.moe_buf[layer].recv, d.moe_buf[layer].out);
        HZP_RETURN_IF_ERROR(d.moe_exchange(CollectivePurpose::kMoeCombine, u, *ep_comm, nullptr, nullptr));
      }
  }
  float sum = static_cast<float>(d.loss_sum);
  d.loss_sum = loss_before;
  d.aux_sum = aux_before;
  HZP_RETURN_IF_ERROR(d.metrics->all_reduce(&sum, 1));
  return sum / static_cast<double>(per_rank * d.world * d.tokens);
}

MemoryReport Executor::memory() const {
  MemoryReport r;
  for (const auto& [k, v] : impl_->pool->bytes_by_category()) r[k] = v;
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoints (format: checkpoint.h): every segment's parameter shard, Adam m and Adam v, in segment order.
// ---------------------------------------------------------------------------------------------------------

std::vector<FloatSpan> Executor::Impl::state_spans() const {
  std::vector<FloatSpan> spans;
  for (std::size_t s = 0; s < bufs.size(); ++s) {
    const int i = static_cast<int>(s);
    spans.push_back({bufs[s].param, layout.param_floats(i)});
    spans.push_back({bufs[s].m, layout.optimizer_floats(i)});
    spans.push_back({bufs[s].v, layout.optimizer_floats(i)});
  }
  return spans;
}

CheckpointHeader Executor::Impl::checkpoint_header(std::int64_t next_step) const {
  CheckpointHeader h;
  h.rank = rank;
  h.world_size = world;
  h.policy = schedule.policy;
  h.next_step = next_step;
  h.adam_steps = adam_t;
  for (std::size_t s = 0; s < bufs.size(); ++s)
    h.segments.emplace_back(layout.param_floats(static_cast<int>(s)), layout.optimizer_floats(static_cast<int>(s)));
  return h;
}

Status Executor::save(const std::string& path, std::int64_t next_step) const {
  return write_checkpoint(path, impl_->checkpoint_header(next_step), impl_->state_spans());
}

Result<std::int64_t> Executor::load(const std::string& path) {
  Impl& d = *impl_;
  HZP_ASSIGN_OR_RETURN(CheckpointHeader h,
                       read_checkpoint(path, d.checkpoint_header(0), d.scenario.run.steps, d.state_spans()));
  d.adam_t = h.adam_steps;
  return h.next_step;
}

}  // namespace hzp::runtime
