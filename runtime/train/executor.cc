// The runtime executor (executor.h): setup, the step loop, evaluation and checkpoints. What each IR op does
// is in executor_ops.cc; the state both share is executor_impl.h. The executor touches the device only
// through runtime/device/ (any backend), and host memory only for the per-step metrics, initial weights and
// checkpoints.
#include "runtime/train/executor.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <sstream>

#include "runtime/train/executor_impl.h"
#include "runtime/train/reshard.h"
#include "shared/base/text.h"

namespace hzp::runtime {
namespace {

using Clock = std::chrono::steady_clock;

// Dynamic loss scaling for fp16, with PyTorch's GradScaler defaults (torch/cuda/amp/grad_scaler.py): start at
// 2^16, halve on an overflow (the step is skipped), double after 2000 steps without one. A scale below 1
// means the gradients overflow even unscaled: the run has diverged.
constexpr double kInitialLossScale = 65536.0;
constexpr std::int64_t kLossScaleGrowthInterval = 2000;

// Runs host-driven work of one stream after another stream's queued work (cudaStreamWaitEvent): evaluation
// and refreshes issue kernels on one stream and collectives on another.
void hand_over(Stream& from, Stream& to) {
  to.wait(from.record());
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
  if (scenario.training.fp8) return Status::InvalidInput("training.fp8: the runtime has no FP8 arithmetic; set false");
  if (scenario.training.kernels != KernelFusion::kFused)
    return Status::InvalidInput(
        "training.kernels: \"eager\" prices PyTorch eager's unfused kernels in the simulator; the runtime runs its "
        "own fused kernels: set \"fused\"");
  return model_config(scenario).status();
}

// ---------------------------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------------------------

int Executor::Impl::compute_stream() const {
  for (std::size_t i = 0; i < schedule.streams.size(); ++i)
    if (schedule.streams[i] == StreamKind::kCompute) return static_cast<int>(i);
  return 0;
}

ScalarType Executor::Impl::payload_type(Payload p) const {
  switch (p) {
    case Payload::kGrads:
      return cfg.grad;
    case Payload::kGradNorm:
      return ScalarType::kFp32;
    case Payload::kParams:
    case Payload::kActivations:
      break;
  }
  return cfg.act;
}

Status Executor::Impl::setup() {
  if (schedule.world_size != world || rank < 0 || rank >= world)
    return Status::InvalidInput("runtime: rank " + std::to_string(rank) + " outside world of " + std::to_string(world));
  HZP_RETURN_IF_ERROR(runtime_supports(scenario));
  HZP_ASSIGN_OR_RETURN(cfg, model_config(scenario));
  program = &schedule.program_of(rank);
  batch = scenario.training.micro_batch;
  seq = scenario.training.seq_len;
  tokens = batch * seq;
  groups_per_step = scenario.training.global_batch / batch;
  if (fp16()) loss_scale = kInitialLossScale;
  int ep_position = 0;
  if (expert_parallel()) {
    const ProcessGroup& g = schedule.group_of(rank, schedule.role_expert_parallel);
    ep_position = static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), rank) - g.ranks.begin());
    if (static_cast<int>(g.ranks.size()) != scenario.mesh.expert)
      return Status::Internal("runtime: expert_parallel group size differs from policy.expert_parallel");
  }
  HZP_ASSIGN_OR_RETURN(layout, StateLayout::build(schedule, cfg, rank, ep_position));
  HZP_RETURN_IF_ERROR(setup_streams());
  // The largest kernel calls of this run, so that a backend sizes its scratch now and not inside a step.
  KernelLimits limits;
  limits.rows = tokens;
  limits.width = cfg.hidden;
  limits.vocab = cfg.vocab;
  limits.attention_rows = batch * cfg.heads * seq;
  limits.experts = cfg.experts;
  limits.moe_runs = cfg.experts;  // (source ranks) x (local experts) = experts
  for (auto& k : kernels) HZP_RETURN_IF_ERROR(k->prepare(limits));
  HZP_RETURN_IF_ERROR(host_kernels->prepare(limits));
  // Size everything once against a pool that only counts, then allocate it from one device allocation.
  SizingPool sizing;
  HZP_RETURN_IF_ERROR(allocate_all(sizing));
  pool = device->create_pool(sizing.used_bytes());
  HZP_RETURN_IF_ERROR(allocate_all(*pool));
  build_optimizer_tensors();
  return init_parameters_on_device();
}

Status Executor::Impl::setup_streams() {
  for (StreamKind kind : schedule.streams) {
    streams.push_back(device->create_stream(to_string(kind)));
    kernels.push_back(device->create_kernels(*streams.back()));
  }
  host_stream = device->create_stream("host");
  host_kernels = device->create_kernels(*host_stream);
  return Status::Ok();
}

Status Executor::Impl::allocate_all(MemoryPool& p) {
  const std::vector<Segment>& segs = layout.segments();
  const bool mixed = cfg.act != ScalarType::kFp32;
  bufs.assign(segs.size(), {});
  std::int64_t full_model = 0;
  for (std::size_t s = 0; s < segs.size(); ++s) {
    const int i = static_cast<int>(s);
    HZP_ASSIGN_OR_RETURN(bufs[s].param, p.allocate("params", layout.param_floats(i), cfg.act));
    HZP_ASSIGN_OR_RETURN(bufs[s].grad, p.allocate("grads", layout.grad_floats(i), cfg.grad));
    if (mixed) {
      HZP_ASSIGN_OR_RETURN(bufs[s].master, p.allocate("optimizer", layout.optimizer_floats(i), ScalarType::kFp32));
    }
    HZP_ASSIGN_OR_RETURN(bufs[s].m, p.allocate("optimizer", layout.optimizer_floats(i), ScalarType::kFp32));
    HZP_ASSIGN_OR_RETURN(bufs[s].v, p.allocate("optimizer", layout.optimizer_floats(i), ScalarType::kFp32));
    if (segs[s].state == StateKind::kDense && schedule.role_secondary >= 0) {
      HZP_ASSIGN_OR_RETURN(bufs[s].secondary, p.allocate("params", segs[s].padded / layout.secondary_size(), cfg.act));
    }
    full_model += segs[s].padded;
  }
  // The schedule's pools: gather slots hold parameters, gradient slots gradients.
  pool_slots.assign(schedule.pools.size(), {});
  for (std::size_t q = 0; q < schedule.pools.size(); ++q) {
    const bool gather = schedule.pools[q].kind == PoolKind::kParamGather;
    const std::int64_t elements =
        gather ? layout.max_unit_floats() : std::max(layout.max_unit_floats(), layout.max_bucket_floats());
    for (int i = 0; i < schedule.pools[q].slots; ++i) {
      HZP_ASSIGN_OR_RETURN(Buffer slot,
                           p.allocate("pool:" + schedule.pools[q].name, elements, gather ? cfg.act : cfg.grad));
      pool_slots[q].push_back(slot);
    }
  }
  const bool sharded_params =
      layout.sharding(StateKind::kDense).s_p > 1 ||
      (schedule.state(StateKind::kExpert).present && layout.sharding(StateKind::kExpert).s_p > 1);
  eval_params = {};
  if (sharded_params) {
    HZP_ASSIGN_OR_RETURN(eval_params, p.allocate("eval", full_model, cfg.act));
  }

  // The model: its blocks' saved activations and the shared backward scratch.
  Kernels& ck = *kernels[compute_stream()];
  const int ep = expert_parallel() ? scenario.mesh.expert : 1;
  workspace = Workspace();
  embedding = std::make_unique<Embedding>(cfg);
  attention.clear();
  mlp.clear();
  moe.clear();
  for (int l = 0; l < cfg.layers; ++l) {
    HZP_ASSIGN_OR_RETURN(auto a, AttentionBlock::create(cfg, batch, seq, ck, p, workspace));
    attention.push_back(std::move(a));
    if (cfg.moe_layer[l]) {
      HZP_ASSIGN_OR_RETURN(auto m, MoeBlock::create(cfg, batch, seq, ep, p));
      moe.push_back(std::move(m));
      mlp.push_back(nullptr);
    } else {
      HZP_ASSIGN_OR_RETURN(auto m, MlpBlock::create(cfg, batch, seq, p, workspace));
      mlp.push_back(std::move(m));
      moe.push_back(nullptr);
    }
  }
  HZP_ASSIGN_OR_RETURN(head, Head::create(cfg, tokens, ck, p, workspace));
  HZP_RETURN_IF_ERROR(workspace.allocate(p, cfg.act));
  HZP_ASSIGN_OR_RETURN(x, p.allocate("activations", tokens * cfg.hidden, cfg.act));
  HZP_ASSIGN_OR_RETURN(dx, p.allocate("activations", tokens * cfg.hidden, cfg.act));
  HZP_ASSIGN_OR_RETURN(inputs.ids, p.allocate("activations", tokens, ScalarType::kInt32));
  HZP_ASSIGN_OR_RETURN(inputs.targets, p.allocate("activations", tokens, ScalarType::kInt32));
  // Step scalars: accumulators and the optimizer's inputs.
  HZP_ASSIGN_OR_RETURN(inputs.loss_sum, p.allocate("scalars", 1, ScalarType::kFp64));
  HZP_ASSIGN_OR_RETURN(inputs.aux_sum, p.allocate("scalars", 1, ScalarType::kFp64));
  HZP_ASSIGN_OR_RETURN(metrics_buffer, p.allocate("scalars", 3, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(norm_acc, p.allocate("scalars", 1, ScalarType::kFp64));
  HZP_ASSIGN_OR_RETURN(norm_sq, p.allocate("scalars", 1, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(grad_norm, p.allocate("scalars", 1, ScalarType::kFp64));
  HZP_ASSIGN_OR_RETURN(coef, p.allocate("scalars", 1, ScalarType::kFp32));
  const int micro_batches = static_cast<int>(groups_per_step / world);
  host_ids.assign(static_cast<std::size_t>(std::max(1, micro_batches)), {});
  host_targets.assign(host_ids.size(), {});
  return Status::Ok();
}

// The optimizer slice of each segment, split where the layout's tensors change weight-decay rule (norm
// weights are not decayed); the padding past the layout is never touched.
void Executor::Impl::build_optimizer_tensors() {
  adam_tensors.assign(schedule.buckets.size(), {});
  for (std::size_t b = 0; b < schedule.buckets.size(); ++b) {
    for (const auto& [s, off] : layout.bucket_segments(static_cast<int>(b))) {
      const std::int64_t begin = layout.optimizer_begin(s), count = layout.optimizer_floats(s);
      for (const TensorInfo& t : layout.segment(s).layout) {
        const std::int64_t lo = std::max(begin, t.offset), hi = std::min(begin + count, t.offset + t.size());
        if (lo >= hi) continue;
        const std::int64_t at = lo - begin, n = hi - lo;
        AdamWTensor a;
        a.param = bufs[s].param.slice(layout.optimizer_in_param(s) + at, n);
        if (!bufs[s].master.empty()) a.master = bufs[s].master.slice(at, n);
        a.grad = bufs[s].grad.slice(layout.optimizer_in_grad(s) + at, n);
        a.m = bufs[s].m.slice(at, n);
        a.v = bufs[s].v.slice(at, n);
        a.decay = t.decay;
        adam_tensors[b].push_back(a);
      }
    }
  }
}

// Initial weights: the full tensor is a function of (seed, tensor, index), made on the host; this rank's
// shard goes to the device in the working type, and its optimizer slice to the fp32 master.
Status Executor::Impl::init_parameters_on_device() {
  Kernels& k = *host_kernels;
  std::vector<float> full;
  std::vector<char> encoded;
  for (std::size_t s = 0; s < layout.segments().size(); ++s) {
    const Segment& seg = layout.segment(static_cast<int>(s));
    full.assign(static_cast<std::size_t>(seg.padded), 0.f);
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
    const float* mine = full.data() + layout.position(seg.state).p * piece;
    encoded.resize(static_cast<std::size_t>(bufs[s].param.bytes()));
    encode_floats(cfg.act, mine, piece, encoded.data());
    k.copy_from_host(encoded.data(), bufs[s].param);
    if (!bufs[s].master.empty())
      k.copy_from_host(mine + layout.optimizer_in_param(static_cast<int>(s)), bufs[s].master);
    // The host buffers are reused by the next segment: wait until the copies have read them.
    HZP_RETURN_IF_ERROR(host_stream->synchronize());
  }
  return k.status();
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
    name << "] on stream " << to_string(schedule.streams[stream]);
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
// One step
// ---------------------------------------------------------------------------------------------------------

Status Executor::Impl::run_step(std::int64_t step_index) {
  step = step_index;
  lr = learning_rate(scenario.run, step);
  ++adam_t;

  // The step's accumulators, zeroed on the compute stream before any op of the step is queued. Without a
  // gradient-norm op in the schedule the optimizer's multiplier stays 1 (no clipping, no loss scale).
  {
    Kernels& k = *kernels[compute_stream()];
    k.fill(inputs.loss_sum, 0);
    k.fill(inputs.aux_sum, 0);
    k.fill(grad_norm, 0);
    k.fill(coef, 1);
    HZP_RETURN_IF_ERROR(k.status());
  }

  const std::vector<Op>& ops = program->ops;
  std::vector<EventPtr> events(ops.size()), begins(tracing ? ops.size() : 0);
  std::vector<std::int64_t> op_bytes(tracing ? ops.size() : 0);
  // Host-side bookkeeping in program order: the gradient slot of every bucket. (Gather slots are named by the
  // ops that fill and read them.)
  std::vector<Buffer> bucket_slot(schedule.buckets.size());
  int gather_pool = -1;
  for (std::size_t p = 0; p < schedule.pools.size(); ++p)
    if (schedule.pools[p].kind == PoolKind::kParamGather) gather_pool = static_cast<int>(p);
  auto gather_slot = [&](int slot) { return slot >= 0 && gather_pool >= 0 ? pool_slots[gather_pool][slot] : Buffer{}; };
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    Stream& stream = *streams[op.stream];
    Kernels& k = *kernels[op.stream];
    // A dependency on another stream: this stream waits for that op's event before running the op
    // (cudaStreamWaitEvent), so a gather's slot is filled before compute reads it, a gradient slot is
    // reduced before it is reused, and the optimizer runs after the last gradient collective.
    for (int d : op.deps)
      if (ops[d].stream != op.stream) stream.wait(events[d]);
    std::function<Status()> work;
    std::int64_t bytes = 0;
    if (const auto* a = std::get_if<BufferAcquireOp>(&op.body)) {
      const Buffer slot = pool_slots[a->pool][a->slot];
      if (schedule.pools[a->pool].kind == PoolKind::kParamGather) {
        work = [] { return Status::Ok(); };  // the gathers that follow fill it
      } else {
        bucket_slot[a->bucket] = slot;
        const Buffer used = slot.slice(0, layout.bucket_floats(a->bucket));
        work = [&k, used] {
          k.fill(used, 0);
          return k.status();
        };
      }
    } else if (std::holds_alternative<BufferReleaseOp>(op.body)) {
      work = [] { return Status::Ok(); };
    } else if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      const Buffer slot = gather_slot(c->gather_slot);  // empty: the parameters are replicated
      work = [this, &k, body = *c, slot, buckets = bucket_slot] { return compute(k, body, slot, buckets); };
    } else if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      // The slot a parameter all-gather fills, or whose parameters a MoE all-to-all reads (the router's).
      const Buffer slot = gather_slot(c->gather_slot);
      if (slot.empty() &&
          (c->purpose == CollectivePurpose::kGatherParams || c->purpose == CollectivePurpose::kGatherSecondary))
        return Status::Internal("runtime: parameter all-gather names no gather slot");
      // Bytes as executed: the IR's element count in the type the runtime moves this payload in.
      bytes = c->bytes / dtype_bytes(c->dtype) * scalar_bytes(payload_type(c->payload));
      work = [this, &k, body = *c, s = op.stream, slot, buckets = bucket_slot] {
        return collective(k, body, s, slot, buckets);
      };
    } else if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) {
      work = [this, &k, body = *o] { return optimizer(k, body); };
    }
    // Traced, an op runs between two events of its stream: one recorded once the stream has waited for the
    // op's dependencies (the op starts), and the op's own (it ends). Their timestamps are the device's.
    if (tracing) {
      begins[i] = stream.record();
      op_bytes[i] = bytes;
    }
    events[i] = stream.submit([this, work = std::move(work)]() -> Status {
      Status st = work();
      if (!st.ok() && !failed.exchange(true) && on_fatal) on_fatal(st);
      return st;
    });
  }
  Status first = Status::Ok();
  for (auto& s : streams) {
    Status st = s->synchronize();
    if (first.ok() && !st.ok()) first = st;
  }
  if (tracing && first.ok())
    for (std::size_t i = 0; i < ops.size(); ++i)
      traced.push_back({step, static_cast<int>(i), ops[i].stream, begins[i]->completed_at_us(),
                        events[i]->completed_at_us(), op_bytes[i]});
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

void Executor::inject_overflow(std::int64_t step) {
  impl_->overflow_step = step;
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

Result<StepMetrics> Executor::train_step(std::int64_t step, bool stop_requested) {
  Impl& d = *impl_;
  const auto t0 = Clock::now();
  const double scale = d.loss_scale;
  if (step == d.overflow_step) d.loss_scale = 0x1p40;
  const double scale_used = d.loss_scale;
  const Status ran = d.run_step(step);
  d.loss_scale = scale;  // the scaler's rule below applies to the scale it chose
  HZP_RETURN_IF_ERROR(ran);
  trace_.insert(trace_.end(), d.traced.begin(), d.traced.end());
  d.traced.clear();
  // The step's scalars, read once every stream has finished: loss and aux sums (this rank's), the global
  // gradient norm.
  double sums[2] = {0, 0};
  double norm = 0;
  Kernels& k = *d.host_kernels;
  k.copy_to_host(d.inputs.loss_sum, &sums[0]);
  k.copy_to_host(d.inputs.aux_sum, &sums[1]);
  k.copy_to_host(d.grad_norm, &norm);
  HZP_RETURN_IF_ERROR(d.host_stream->synchronize());
  HZP_RETURN_IF_ERROR(k.status());
  // Metrics over the world (logging, outside the schedule): loss and aux sums, in fp32, and the ranks asking
  // to stop.
  float reduced[3] = {static_cast<float>(sums[0]), static_cast<float>(sums[1]), stop_requested ? 1.0f : 0.0f};
  k.copy_from_host(reduced, d.metrics_buffer);
  HZP_RETURN_IF_ERROR(k.status());
  HZP_RETURN_IF_ERROR(d.metrics->all_reduce(d.metrics_buffer));
  k.copy_to_host(d.metrics_buffer, reduced);
  HZP_RETURN_IF_ERROR(d.host_stream->synchronize());
  HZP_RETURN_IF_ERROR(k.status());
  StepMetrics m;
  m.loss = reduced[0] / static_cast<double>(d.scenario.training.global_batch * d.seq);
  m.aux_loss = reduced[1] / static_cast<double>(d.groups_per_step);
  m.grad_norm = norm;
  m.stop = reduced[2] > 0;
  m.lr = d.lr;
  m.loss_scale = scale_used;
  if (d.fp16()) {
    // The optimizer skipped the update on a non-finite norm (every rank sees the same all-reduced norm).
    if (!std::isfinite(norm)) {
      m.skipped = true;
      --d.adam_t;  // no optimizer step was taken
      d.good_steps = 0;
      d.loss_scale /= 2;
      if (d.loss_scale < 1)
        return Status::InvalidInput("training diverged: fp16 gradients overflow even without loss scaling (scale " +
                                    std::to_string(d.loss_scale) + "); lower run.lr or train in bf16");
    } else if (++d.good_steps == kLossScaleGrowthInterval) {
      d.good_steps = 0;
      d.loss_scale *= 2;
    }
  }
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
    const Buffer param = bufs[s].param;
    const int i = layout.position(kind).i;
    HZP_RETURN_IF_ERROR(streams[stream]
                            ->submit([cm = cm, param, piece, i] {
                              return cm->all_gather(param.slice(i * piece, piece), param.slice(0, cm->size() * piece));
                            })
                            ->synchronize());
  }
  return Status::Ok();
}

Result<double> Executor::evaluate(std::int64_t groups) {
  Impl& d = *impl_;
  HZP_RETURN_IF_ERROR(d.refresh_parameters());
  const int cs = d.compute_stream();
  Kernels& ck = *d.kernels[cs];
  // Full parameters of every segment: resident, or gathered once into the eval buffer.
  const std::size_t count = d.layout.segments().size();
  std::vector<Buffer> full(count);
  std::int64_t offset = 0;
  for (std::size_t s = 0; s < count; ++s) {
    const Segment& seg = d.layout.segment(static_cast<int>(s));
    const StateSharding& k = d.layout.sharding(seg.state);
    if (k.s_p == 1) {
      full[s] = d.bufs[s].param;
      continue;
    }
    full[s] = d.eval_params.slice(offset, seg.padded);
    offset += seg.padded;
    auto [cm, stream] = d.any_comm(k.role_param);  // the stream that owns this group's gathers
    if (cm == nullptr) return Status::Internal("runtime: no parameter communicator for evaluation");
    const Buffer in = d.bufs[s].param, out = full[s];
    HZP_RETURN_IF_ERROR(
        d.streams[stream]->submit([cm = cm, in, out] { return cm->all_gather(in, out); })->synchronize());
  }
  auto P = [&](int s) { return full[s]; };
  auto [ep_comm, ep_stream] =
      d.expert_parallel() ? d.any_comm(d.schedule.role_expert_parallel) : std::pair<Communicator*, int>{nullptr, -1};
  const std::int64_t per_rank = (groups + d.world - 1) / d.world;
  // Evaluation accumulates into the step's loss sum: zero it (the last step's value was read already).
  ck.fill(d.inputs.loss_sum, 0);
  ck.fill(d.inputs.aux_sum, 0);
  // The same module forwards as training, unit by unit, issued from the host on the compute stream; under
  // expert parallelism a MoE layer runs its exchanges on the stream of its all-to-all communicator, handed
  // over in both directions so that each stage sees the previous one's results.
  for (std::int64_t j = 0; j < per_rank; ++j) {
    d.data->val_batch(static_cast<std::uint64_t>(d.scenario.run.seed), j * d.world + d.rank, d.batch, d.host_ids[0],
                      d.host_targets[0]);
    ck.copy_from_host(d.host_ids[0].data(), d.inputs.ids);
    ck.copy_from_host(d.host_targets[0].data(), d.inputs.targets);
    for (int u = 0; u < static_cast<int>(d.schedule.units.size()); ++u)
      for (ModuleKind module : d.schedule.units[u].modules) {
        if (module != ModuleKind::kMoe || ep_comm == nullptr) {
          HZP_RETURN_IF_ERROR(d.forward_module(ck, module, u, P));
          continue;
        }
        const int layer = d.schedule.units[u].layer;
        Kernels& ek = *d.kernels[ep_stream];
        hand_over(*d.streams[cs], *d.streams[ep_stream]);
        HZP_RETURN_IF_ERROR(
            d.moe_exchange(ek, CollectivePurpose::kMoeDispatch, u, *ep_comm, full[d.router_seg(u)], Buffer{}));
        HZP_RETURN_IF_ERROR(d.moe[layer]->experts_forward(ek, full[d.experts_seg(u)]));
        HZP_RETURN_IF_ERROR(d.moe_exchange(ek, CollectivePurpose::kMoeCombine, u, *ep_comm, Buffer{}, Buffer{}));
        hand_over(*d.streams[ep_stream], *d.streams[cs]);
      }
    // The host batch is reused by the next group: wait until the copies have read it.
    HZP_RETURN_IF_ERROR(d.streams[cs]->synchronize());
  }
  double sum = 0;
  ck.copy_to_host(d.inputs.loss_sum, &sum);
  HZP_RETURN_IF_ERROR(d.streams[cs]->synchronize());
  HZP_RETURN_IF_ERROR(ck.status());
  float reduced = static_cast<float>(sum);
  Kernels& hk = *d.host_kernels;
  hk.copy_from_host(&reduced, d.metrics_buffer.slice(0, 1));
  HZP_RETURN_IF_ERROR(hk.status());
  HZP_RETURN_IF_ERROR(d.metrics->all_reduce(d.metrics_buffer.slice(0, 1)));
  hk.copy_to_host(d.metrics_buffer.slice(0, 1), &reduced);
  HZP_RETURN_IF_ERROR(d.host_stream->synchronize());
  HZP_RETURN_IF_ERROR(hk.status());
  return reduced / static_cast<double>(per_rank * d.world * d.tokens);
}

MemoryReport Executor::memory() const {
  MemoryReport r;
  for (const auto& [k, v] : impl_->pool->bytes_by_category()) r[k] = v;
  return r;
}

// ---------------------------------------------------------------------------------------------------------
// Checkpoints (format: checkpoint.h): per segment the parameter shard (as fp32), in 16-bit training the
// fp32 master of the optimizer slice, Adam m and Adam v, in segment order.
// ---------------------------------------------------------------------------------------------------------

std::vector<std::vector<float>> Executor::Impl::state_to_host() {
  std::vector<std::vector<float>> state;
  std::vector<char> raw;
  Kernels& k = *host_kernels;
  for (const SegmentBuffers& b : bufs)
    for (const Buffer* part : {&b.param, &b.master, &b.m, &b.v}) {
      if (part == &b.master && part->empty()) continue;
      raw.resize(static_cast<std::size_t>(part->bytes()));
      k.copy_to_host(*part, raw.data());
      if (!host_stream->synchronize().ok()) return {};
      state.emplace_back(static_cast<std::size_t>(part->count));
      decode_floats(part->type, raw.data(), part->count, state.back().data());
    }
  return state;
}

Status Executor::Impl::state_from_host(const std::vector<std::vector<float>>& state) {
  std::vector<char> raw;
  Kernels& k = *host_kernels;
  std::size_t i = 0;
  for (const SegmentBuffers& b : bufs)
    for (const Buffer* part : {&b.param, &b.master, &b.m, &b.v}) {
      if (part == &b.master && part->empty()) continue;
      raw.resize(static_cast<std::size_t>(part->bytes()));
      encode_floats(part->type, state[i++].data(), part->count, raw.data());
      k.copy_from_host(raw.data(), *part);
      HZP_RETURN_IF_ERROR(host_stream->synchronize());
    }
  return k.status();
}

CheckpointHeader Executor::Impl::checkpoint_header(std::int64_t next_step) const {
  CheckpointHeader h;
  h.rank = rank;
  h.world_size = world;
  h.policy = to_string(schedule.policy);
  h.precision = to_string(scenario.training.precision);
  h.next_step = next_step;
  h.adam_steps = adam_t;
  h.loss_scale = loss_scale;
  h.loss_scale_good_steps = good_steps;
  for (std::size_t s = 0; s < bufs.size(); ++s)
    h.segments.emplace_back(layout.param_floats(static_cast<int>(s)), layout.optimizer_floats(static_cast<int>(s)));
  h.layout = checkpoint_layout(scenario);
  return h;
}

namespace {
std::vector<FloatSpan> spans_of(std::vector<std::vector<float>>& state) {
  std::vector<FloatSpan> spans;
  for (auto& v : state) spans.push_back({v.data(), static_cast<std::int64_t>(v.size())});
  return spans;
}
}  // namespace

Status Executor::save(const std::string& path, std::int64_t next_step) const {
  std::vector<std::vector<float>> state = impl_->state_to_host();
  HZP_RETURN_IF_ERROR(impl_->host_kernels->status());
  if (state.empty() && !impl_->bufs.empty())
    return Status::Internal("checkpoint: reading the state from the device failed");
  return write_checkpoint(path, impl_->checkpoint_header(next_step), spans_of(state));
}

Result<std::int64_t> Executor::load(const std::string& path) {
  namespace fs = std::filesystem;
  Impl& d = *impl_;
  // Another layout wrote the step (another world size or policy; the writer's rank_0 says which): reshard it.
  const fs::path step_dir = fs::path(path).parent_path();
  HZP_ASSIGN_OR_RETURN(CheckpointHeader first, read_checkpoint_header((step_dir / "rank_0.bin").string()));
  CheckpointHeader expected = d.checkpoint_header(0);
  expected.rank = 0;
  // Weights of another model can have the same shapes (4 heads of 32 or 8 of 16): the record says which, and a
  // header without it (an older hzp's, or one edited: the checksum covers the payload alone) cannot be told from
  // another model's (the eleventh attack of issue 35).
  if (!first.layout.is_object() || !first.layout.contains("model"))
    return Status::InvalidInput("--resume: " + printable(step_dir.string(), 200) +
                                " was written before checkpoints recorded their model (rank_0.bin's header has no "
                                "layout.model): hzp cannot tell it from another model of the same shapes (4 heads "
                                "of 32 or 8 of 16), so it does not resume it; train without --resume");
  if (first.layout["model"] != expected.layout["model"]) {
    // What differs, key by key (the whole records ran past 400 characters).
    const nlohmann::json& was = first.layout["model"];
    const nlohmann::json& now = expected.layout["model"];
    std::string differs;
    for (const auto* side : {&was, &now})
      for (auto it = side->begin(); side->is_object() && it != side->end(); ++it) {
        const std::string& key = it.key();
        const nlohmann::json a = was.is_object() ? was.value(key, nlohmann::json()) : nlohmann::json();
        const nlohmann::json b = now.value(key, nlohmann::json());
        if (a == b || (side == &now && was.is_object() && was.contains(key))) continue;
        if (differs.size() > 200) break;
        differs += (differs.empty() ? "" : ", ") + printable(key, 30) + " " + printable(a.dump(), 30) + " (this run " +
                   printable(b.dump(), 30) + ")";
      }
    return Status::InvalidInput("--resume: " + printable(step_dir.string(), 200) + " was written for another model: " +
                                (differs.empty() ? printable(was.dump(), 200) : differs));
  }
  const bool other_layout =
      !first.same_layout(expected) || (!first.layout.is_null() && first.layout != expected.layout);
  if (first.precision == expected.precision && other_layout) {
    HZP_ASSIGN_OR_RETURN(auto resharded,
                         reshard_state(step_dir.string(), first, d.scenario, d.cfg, d.layout, d.scenario.run.steps));
    HZP_RETURN_IF_ERROR(d.state_from_host(resharded));
    d.adam_t = first.adam_steps;
    d.loss_scale = first.loss_scale;
    d.good_steps = first.loss_scale_good_steps;
    return first.next_step;
  }
  std::vector<std::vector<float>> state;
  for (const Impl::SegmentBuffers& b : d.bufs)
    for (const Buffer* part : {&b.param, &b.master, &b.m, &b.v})
      if (part != &b.master || !part->empty()) state.emplace_back(static_cast<std::size_t>(part->count));
  HZP_ASSIGN_OR_RETURN(CheckpointHeader h,
                       read_checkpoint(path, d.checkpoint_header(0), d.scenario.run.steps, spans_of(state)));
  HZP_RETURN_IF_ERROR(d.state_from_host(state));
  d.adam_t = h.adam_steps;
  d.loss_scale = h.loss_scale;
  d.good_steps = h.loss_scale_good_steps;
  return h.next_step;
}

}  // namespace hzp::runtime
