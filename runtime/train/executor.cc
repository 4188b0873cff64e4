// The runtime executor (see executor.h for what each IR op does).
#include "train/executor.h"

#include "train/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <numeric>
#include <sstream>

#include <nlohmann/json.hpp>

namespace hzp::runtime {
namespace {

using Clock = std::chrono::steady_clock;

double now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

// How one kind of state (0 dense, 1 expert) is sharded on this rank.
struct KindInfo {
  bool present = false;
  int role_param = -1, role_grad = -1, role_refresh = -1, role_replica = -1;
  int s_p = 1, s_g = 1, s_os = 1, replicas = 1;
  int p = 0, g = 0, i = 0;  // positions in the param_shard, grad_shard and param_refresh groups
  int q() const { return s_os / s_p; }
  int os_index() const { return p * q() + i; }
};

// One module's parameters of one kind: the unit of sharding.
struct Segment {
  int unit = 0;
  int module = 0;
  int kind = 0;
  Layout layout;
  std::int64_t n = 0;             // real parameters
  std::int64_t padded = 0;        // multiple of every group size of its kind
  std::int64_t unit_offset = 0;   // in the unit's gather slot
  std::uint64_t tensor_id = 0;
  std::int64_t first_expert = -1; // experts segment: global index of its first expert
  float* param = nullptr;         // resident: full (s_p = 1) or this rank's shard
  float* grad = nullptr;          // resident: full (s_g = 1) or this rank's shard
  float* m = nullptr;             // Adam moments of the optimizer slice
  float* v = nullptr;
  float* secondary = nullptr;     // hpZ: this rank's piece of the node-sharded copy
};

std::int64_t round_up(std::int64_t x, std::int64_t m) { return (x + m - 1) / m * m; }

int position_in(const ProcessGroup& g, int rank) {
  auto it = std::find(g.ranks.begin(), g.ranks.end(), rank);
  return it == g.ranks.end() ? -1 : static_cast<int>(it - g.ranks.begin());
}

int module_index(ModuleKind kind) { return kind == ModuleKind::kMlp || kind == ModuleKind::kMoe ? 1 : 0; }

}  // namespace

double learning_rate(const RunSpec& run, std::int64_t step) {
  if (step < run.warmup_steps) return run.lr * static_cast<double>(step + 1) / static_cast<double>(run.warmup_steps);
  const double span = static_cast<double>(std::max<std::int64_t>(1, run.steps - run.warmup_steps));
  const double t = std::min(1.0, static_cast<double>(step - run.warmup_steps) / span);
  return run.min_lr + 0.5 * (run.lr - run.min_lr) * (1 + std::cos(M_PI * t));
}

struct Executor::Impl {
  Scenario scenario;
  Schedule schedule;
  const Program* program = nullptr;
  int rank = 0;
  int world = 1;
  const ByteDataset* data = nullptr;
  ModelConfig cfg;
  std::int64_t batch = 0, seq = 0, tokens = 0;
  std::int64_t groups_per_step = 0;     // micro-batch groups in the global batch
  int ep = 1, ep_pos = 0;
  std::array<KindInfo, 2> kinds;
  int role_secondary = -1, secondary_size = 1, secondary_pos = 0;
  int role_ep = -1, role_world = -1;

  std::vector<Segment> segs;
  std::vector<std::vector<int>> unit_segs;          // per unit (layer + 1)
  std::vector<std::int64_t> unit_padded;            // gather-slot floats a unit needs
  std::vector<std::vector<std::pair<int, std::int64_t>>> bucket_segs;  // (segment, offset in the grad slot)
  std::vector<std::array<int, 2>> unit_bucket;      // [unit][kind] -> bucket

  std::unique_ptr<MemoryPool> pool;
  std::vector<std::vector<float*>> pool_slots;      // [pool][slot]
  int gather_pool = -1, grad_pool = -1;
  float* eval_params = nullptr;                     // full parameters for evaluation (sharded runs)

  std::vector<std::unique_ptr<Stream>> streams;
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

  // Expert-parallel all-to-all buffers of each MoE layer (one micro-batch in flight on the compute stream).
  struct MoeBuffers {
    std::vector<float> send, recv, out, back;
    std::vector<std::int64_t> send_counts, recv_counts, out_counts, back_counts;
    int phase = 0;  // which of the 4 all-to-alls of a micro-batch comes next
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

  // ---------------------------------------------------------------------------------------------------
  Status setup();
  Status setup_segments();
  Status setup_memory();
  Status setup_comms(const CommunicatorFactory& make);
  Communicator* comm(int role, int stream) {
    auto it = comms.find({schedule.rank_groups[rank][role], stream});
    return it == comms.end() ? nullptr : it->second.get();
  }

  // Where a unit's parameters of `seg` are read from / its gradients written to right now.
  float* param_ptr(int s, float* gather_slot) const {
    const Segment& seg = segs[s];
    if (kinds[seg.kind].s_p == 1) return seg.param;
    return gather_slot == nullptr ? nullptr : gather_slot + seg.unit_offset;
  }
  // dL/d(aux loss of one micro-batch): the coefficient, averaged over the step's micro-batch groups.
  float aux_grad_scale() const { return static_cast<float>(cfg.aux_loss_coef / static_cast<double>(groups_per_step)); }

  Status run_step(std::int64_t step_index);
  // The checkpointed state (checkpoint.h): per segment its parameter shard, Adam m, Adam v.
  std::vector<FloatSpan> state_spans() const;
  CheckpointHeader checkpoint_header(std::int64_t next_step) const;
  Communicator* any_comm(int role) {
    for (const auto& [key, c] : comms)
      if (key.first == schedule.rank_groups[rank][role]) return c.get();
    return nullptr;
  }
  int stream_of_comm(const Communicator* cm) const {
    for (const auto& [key, c] : comms)
      if (c.get() == cm) return key.second;
    return 0;
  }
  Status refresh_parameters();
  Status compute(const ComputeOp& c, float* params_base, const std::vector<float*>& bucket_slot);
  Status collective(const CollectiveOp& c, int stream, float* gather_slot, const std::vector<float*>& bucket_slot);
  Status optimizer(const OptimizerStepOp& o);
  void load_batch(int micro_batch);
  float* grad_ptr(int s, const std::vector<float*>& bucket_slot) const {
    const Segment& seg = segs[s];
    if (kinds[seg.kind].s_g == 1) return seg.grad;
    const int b = unit_bucket[seg.unit][seg.kind];
    for (const auto& [sg, off] : bucket_segs[b])
      if (sg == s) return bucket_slot[b] == nullptr ? nullptr : bucket_slot[b] + off;
    return nullptr;
  }
  int seg_of(int unit, int module, int kind, bool experts) const {
    for (int s : unit_segs[unit])
      if (segs[s].module == module && segs[s].kind == kind && (segs[s].first_expert >= 0) == experts) return s;
    return -1;
  }
  int router_seg(int layer) const { return seg_of(layer + 1, 1, 0, false); }
  int experts_seg(int layer) const { return seg_of(layer + 1, 1, ep > 1 ? 1 : 0, true); }
};

// ---------------------------------------------------------------------------------------------------------
// Setup
// ---------------------------------------------------------------------------------------------------------

Status runtime_supports(const Scenario& scenario) {
  if (scenario.training.recompute != Recompute::kNone)
    return Status::InvalidInput("training.recompute: the runtime does not recompute activations; use \"none\"");
  if (scenario.training.precision != Precision::kFp32)
    return Status::InvalidInput("training.precision: the CPU runtime trains in fp32; set \"fp32\" (got \"" +
                                std::string(to_string(scenario.training.precision)) + "\")");
  return model_config(scenario.model).status();
}

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
  ep = scenario.policy.expert_parallel;

  auto role_of = [&](const std::string& name) {
    auto it = std::find(schedule.roles.begin(), schedule.roles.end(), name);
    return it == schedule.roles.end() ? -1 : static_cast<int>(it - schedule.roles.begin());
  };
  auto size_pos = [&](int role, int& size, int& pos) {
    const ProcessGroup& g = schedule.group_of(rank, role);
    size = static_cast<int>(g.ranks.size());
    pos = position_in(g, rank);
  };
  for (int k = 0; k < 2; ++k) {
    const std::string prefix = k == 0 ? "" : "expert_";
    KindInfo& info = kinds[k];
    info.role_param = role_of(prefix + "param_shard");
    info.role_grad = role_of(prefix + "grad_shard");
    info.role_refresh = role_of(prefix + "param_refresh");
    info.role_replica = role_of(prefix + "os_replica");
    info.present = info.role_param >= 0 && info.role_grad >= 0 && info.role_refresh >= 0 && info.role_replica >= 0;
    if (!info.present) continue;
    int q = 1, unused = 0;
    size_pos(info.role_param, info.s_p, info.p);
    size_pos(info.role_grad, info.s_g, info.g);
    size_pos(info.role_refresh, q, info.i);
    size_pos(info.role_replica, info.replicas, unused);
    info.s_os = info.s_p * q;
    // The layout promises nested pieces (sharding.h); check it rather than train on a mismatch.
    const int expected_g = info.s_g == info.s_os ? info.os_index() : info.p;
    if (!(info.s_g == info.s_p || info.s_g == info.s_os) || info.g != expected_g)
      return Status::Internal("runtime: " + prefix + "grad_shard position " + std::to_string(info.g) +
                              " does not nest with the parameter/optimizer pieces on rank " + std::to_string(rank));
  }
  if (!kinds[0].present) return Status::Internal("runtime: the schedule has no dense sharding roles");
  role_secondary = role_of("param_secondary");
  if (role_secondary >= 0) size_pos(role_secondary, secondary_size, secondary_pos);
  role_ep = role_of("expert_parallel");
  role_world = role_of("world");
  if (ep > 1) {
    if (role_ep < 0 || !kinds[1].present) return Status::Internal("runtime: expert parallelism without expert roles");
    int size = 0;
    size_pos(role_ep, size, ep_pos);
    if (size != ep) return Status::Internal("runtime: expert_parallel group size differs from policy.expert_parallel");
  }
  HZP_RETURN_IF_ERROR(setup_segments());
  HZP_RETURN_IF_ERROR(setup_memory());

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
  for (const std::string& name : schedule.streams) streams.push_back(std::make_unique<Stream>(name));
  stream_trace.resize(streams.size());
  return Status::Ok();
}

Status Executor::Impl::setup_segments() {
  const int units = cfg.layers + 2;
  unit_segs.assign(units, {});
  unit_padded.assign(units, 0);
  auto add = [&](int unit, int module, int kind, Layout layout, std::int64_t first_expert) {
    Segment s;
    s.unit = unit;
    s.module = module;
    s.kind = kind;
    s.layout = std::move(layout);
    s.n = layout_size(s.layout);
    std::int64_t multiple = kinds[kind].s_os;
    if (kind == 0 && role_secondary >= 0) multiple = std::lcm<std::int64_t>(multiple, secondary_size);
    s.padded = round_up(s.n, multiple);
    s.unit_offset = unit_padded[unit];
    unit_padded[unit] += s.padded;
    s.tensor_id = static_cast<std::uint64_t>(unit) * 8 + module * 2 + (first_expert >= 0 ? 1 : 0);
    s.first_expert = first_expert;
    unit_segs[unit].push_back(static_cast<int>(segs.size()));
    segs.push_back(std::move(s));
  };
  add(0, 0, 0, embedding_layout(cfg), -1);
  for (int l = 0; l < cfg.layers; ++l) {
    add(l + 1, 0, 0, attention_layout(cfg), -1);
    if (!cfg.moe_layer[l]) {
      add(l + 1, 1, 0, mlp_layout(cfg), -1);
    } else {
      add(l + 1, 1, 0, moe_router_layout(cfg), -1);
      const std::int64_t local = cfg.experts / ep;
      add(l + 1, 1, ep > 1 ? 1 : 0, experts_layout(cfg, local), ep_pos * local);
    }
  }
  add(units - 1, 0, 0, head_layout(cfg), -1);

  // Buckets as the schedule defines them: units in backward order, each unit's segments of the bucket's kind.
  unit_bucket.assign(units, {-1, -1});
  bucket_segs.assign(schedule.buckets.size(), {});
  for (size_t b = 0; b < schedule.buckets.size(); ++b) {
    const GradBucket& gb = schedule.buckets[b];
    std::int64_t offset = 0;
    for (int layer : gb.layers) {
      const int u = layer + 1;
      if (u < 0 || u >= units) return Status::Internal("runtime: bucket names unit " + std::to_string(layer));
      unit_bucket[u][gb.kind] = static_cast<int>(b);
      for (int s : unit_segs[u]) {
        if (segs[s].kind != gb.kind) continue;
        bucket_segs[b].push_back({s, offset});
        offset += segs[s].padded;
      }
    }
  }
  for (const Segment& s : segs)
    if (unit_bucket[s.unit][s.kind] < 0)
      return Status::Internal("runtime: unit " + std::to_string(s.unit - 1) + " has parameters in no bucket");
  return Status::Ok();
}

Status Executor::Impl::setup_memory() {
  // Size everything first, then allocate once.
  std::int64_t floats = 0;
  const std::int64_t align = 16;  // 64 bytes
  auto need = [&](std::int64_t n) { floats += round_up(n, align); };
  std::int64_t full_model = 0;
  for (const Segment& s : segs) {
    const KindInfo& k = kinds[s.kind];
    need(s.padded / k.s_p);
    need(s.padded / k.s_g);
    need(s.padded / k.s_os);
    need(s.padded / k.s_os);
    if (s.kind == 0 && role_secondary >= 0) need(s.padded / secondary_size);
    full_model += s.padded;
  }
  std::int64_t max_bucket = 0;
  for (const auto& b : bucket_segs) {
    std::int64_t size = 0;
    for (const auto& [s, off] : b) size = std::max(size, off + segs[s].padded);
    max_bucket = std::max(max_bucket, size);
  }
  const std::int64_t max_unit = *std::max_element(unit_padded.begin(), unit_padded.end());
  std::vector<std::int64_t> slot_floats;
  for (size_t p = 0; p < schedule.pools.size(); ++p) {
    const BufferPool& bp = schedule.pools[p];
    if (bp.name == "param_gather") {
      gather_pool = static_cast<int>(p);
      slot_floats.push_back(max_unit);
    } else if (bp.name == "grad_reduce") {
      grad_pool = static_cast<int>(p);
      slot_floats.push_back(std::max(max_unit, max_bucket));
    } else {
      return Status::Unimplemented("runtime: unknown buffer pool '" + bp.name + "'");
    }
    for (int i = 0; i < bp.slots; ++i) need(slot_floats.back());
  }
  const bool sharded_params = kinds[0].s_p > 1 || (kinds[1].present && kinds[1].s_p > 1);
  if (sharded_params) need(full_model);
  pool = std::make_unique<MemoryPool>(floats * 4);

  for (Segment& s : segs) {
    const KindInfo& k = kinds[s.kind];
    HZP_ASSIGN_OR_RETURN(s.param, pool->allocate("params", s.padded / k.s_p));
    HZP_ASSIGN_OR_RETURN(s.grad, pool->allocate("grads", s.padded / k.s_g));
    HZP_ASSIGN_OR_RETURN(s.m, pool->allocate("optimizer", s.padded / k.s_os));
    HZP_ASSIGN_OR_RETURN(s.v, pool->allocate("optimizer", s.padded / k.s_os));
    if (s.kind == 0 && role_secondary >= 0) {
      HZP_ASSIGN_OR_RETURN(s.secondary, pool->allocate("params", s.padded / secondary_size));
    }
  }
  pool_slots.assign(schedule.pools.size(), {});
  for (size_t p = 0; p < schedule.pools.size(); ++p)
    for (int i = 0; i < schedule.pools[p].slots; ++i) {
      HZP_ASSIGN_OR_RETURN(float* slot, pool->allocate("pool:" + schedule.pools[p].name, slot_floats[p]));
      pool_slots[p].push_back(slot);
    }
  if (sharded_params) {
    HZP_ASSIGN_OR_RETURN(eval_params, pool->allocate("eval", full_model));
  }

  // Initial weights: the full tensor is a function of (seed, tensor, index); keep this rank's shard.
  std::vector<float> full;
  for (Segment& s : segs) {
    full.assign(s.padded, 0.f);
    if (s.first_expert < 0) {
      init_parameters(cfg, s.layout, static_cast<std::uint64_t>(scenario.run.seed), s.tensor_id, full.data());
    } else {
      const Layout one = experts_layout(cfg, 1);
      const std::int64_t per = layout_size(one);
      const std::int64_t count = s.n / per;
      for (std::int64_t e = 0; e < count; ++e)
        init_parameters(cfg, one, static_cast<std::uint64_t>(scenario.run.seed),
                        1000000 + static_cast<std::uint64_t>(s.unit) * 1000 + static_cast<std::uint64_t>(s.first_expert + e),
                        full.data() + e * per);
    }
    const KindInfo& k = kinds[s.kind];
    const std::int64_t piece = s.padded / k.s_p;
    std::copy(full.begin() + k.p * piece, full.begin() + (k.p + 1) * piece, s.param);
  }
  return Status::Ok();
}

Status Executor::Impl::setup_comms(const CommunicatorFactory& make) {
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
    name << g.role << "[";
    for (size_t i = 0; i < g.ranks.size(); ++i) name << (i ? "," : "") << g.ranks[i];
    name << "] on stream " << schedule.streams[stream];
    HZP_ASSIGN_OR_RETURN(auto c, make(g.ranks, "g" + std::to_string(group) + "/s" + std::to_string(stream), name.str()));
    comms[{group, stream}] = std::move(c);
  }
  std::vector<int> all(world);
  std::iota(all.begin(), all.end(), 0);
  HZP_ASSIGN_OR_RETURN(metrics, make(all, "metrics", "world (metrics)"));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------
// One step
// ---------------------------------------------------------------------------------------------------------

void Executor::Impl::load_batch(int micro_batch) {
  const std::int64_t group = static_cast<std::int64_t>(micro_batch) * world + rank;
  data->train_batch(static_cast<std::uint64_t>(scenario.run.seed), step, group, batch, ids, targets);
}

Status Executor::Impl::compute(const ComputeOp& c, float* gather_slot, const std::vector<float*>& bucket_slot) {
  const int unit = c.module == ModuleKind::kEmbedding ? 0 : c.module == ModuleKind::kHead ? cfg.layers + 1 : c.layer + 1;
  const int module = module_index(c.module);
  auto P = [&](int s) { return param_ptr(s, gather_slot); };
  auto G = [&](int s) { return grad_ptr(s, bucket_slot); };
  const int s0 = seg_of(unit, module, 0, false);
  if (s0 < 0 || P(s0) == nullptr) return Status::Internal("runtime: no parameters for " + std::string(to_string(c.module)));
  if (c.phase == Phase::kBackward && G(s0) == nullptr)
    return Status::Internal("runtime: no gradient buffer for " + std::string(to_string(c.module)));
  const bool fwd = c.phase == Phase::kForward;
  const float grad_scale = 1.0f / static_cast<float>(scenario.training.global_batch * seq);
  const float aux_scale = aux_grad_scale();
  switch (c.module) {
    case ModuleKind::kEmbedding:
      if (fwd) {
        load_batch(c.micro_batch);
        embedding->forward(P(s0), ids.data(), x.data());
      } else {
        embedding->backward(dx.data(), ids.data(), G(s0));
      }
      break;
    case ModuleKind::kAttention:
      if (fwd) attention[c.layer]->forward(P(s0), x.data());
      else attention[c.layer]->backward(P(s0), dx.data(), G(s0));
      break;
    case ModuleKind::kMlp:
      if (fwd) mlp[c.layer]->forward(P(s0), x.data());
      else mlp[c.layer]->backward(P(s0), dx.data(), G(s0));
      break;
    case ModuleKind::kMoe: {
      const int se = experts_seg(c.layer);
      MoeBlock& block = *moe[c.layer];
      MoeBuffers& buf = moe_buf[c.layer];
      if (ep == 1) {
        if (fwd) {
          block.forward(P(s0), P(se), x.data());
          aux_sum += block.aux_loss();
        } else {
          block.backward(P(s0), P(se), aux_scale, dx.data(), G(s0), G(se));
        }
      } else if (fwd) {  // between the dispatch and combine all-to-alls
        block.experts_forward(P(se), buf.recv, buf.out);
      } else {
        block.experts_backward(P(se), buf.recv, buf.out, G(se));
      }
      break;
    }
    case ModuleKind::kHead:
      if (fwd) loss_sum += head->forward(P(s0), x.data(), targets.data());
      else head->backward(P(s0), grad_scale, dx.data(), G(s0));
      break;
  }
  return Status::Ok();
}

Status Executor::Impl::collective(const CollectiveOp& c, int stream, float* gather_slot,
                                  const std::vector<float*>& bucket_slot) {
  Communicator* cm = comm(c.role, stream);
  if (cm == nullptr) return Status::Internal("runtime: no communicator for role " + schedule.roles[c.role]);
  const std::string& role = schedule.roles[c.role];
  const int kind = role.rfind("expert_", 0) == 0 && role != "expert_parallel" ? 1 : 0;
  const KindInfo& k = kinds[kind];

  if (c.kind == CollectiveKind::kAllToAll) {  // expert parallelism: 4 per MoE layer and micro-batch
    MoeBuffers& buf = moe_buf[c.layer];
    MoeBlock& block = *moe[c.layer];
    const std::int64_t h = cfg.hidden;
    auto rows_to = [&](const std::vector<std::int64_t>& counts, std::int64_t from, std::int64_t to) {
      std::vector<std::int64_t> out(counts.size());
      for (size_t j = 0; j < counts.size(); ++j) out[j] = counts[j] / from * to;
      return out;
    };
    const int phase = buf.phase;
    buf.phase = (buf.phase + 1) % 4;
    const int rs = router_seg(c.layer);
    switch (phase) {
      case 0:  // dispatch: route my tokens, send each to the rank holding its expert
        block.route_forward(param_ptr(rs, gather_slot), x.data(),
                            buf.send, buf.send_counts);
        aux_sum += block.aux_loss();
        return cm->all_to_all_v(buf.send.data(), buf.send_counts, buf.recv, buf.recv_counts);
      case 1: {  // combine: expert outputs go back to the tokens' ranks
        HZP_RETURN_IF_ERROR(cm->all_to_all_v(buf.out.data(), rows_to(buf.recv_counts, h + 1, h), buf.back, buf.back_counts));
        block.combine_forward(buf.back, x.data());
        return Status::Ok();
      }
      case 2:  // backward dispatch: gradients of the expert outputs to the holders
        block.combine_backward(dx.data(), buf.send, buf.send_counts);
        return cm->all_to_all_v(buf.send.data(), buf.send_counts, buf.recv, buf.recv_counts);
      default: {  // backward combine: gradients of the routed inputs back, then through the router
        HZP_RETURN_IF_ERROR(cm->all_to_all_v(buf.out.data(), buf.recv_counts, buf.back, buf.back_counts));
        block.route_backward(param_ptr(rs, gather_slot), buf.back, aux_grad_scale(), dx.data(), grad_ptr(rs, bucket_slot));
        return Status::Ok();
      }
    }
  }

  if (c.payload == Payload::kGradNorm) {
    double partial = 0;
    for (const Segment& s : segs) {
      const KindInfo& sk = kinds[s.kind];
      const std::int64_t piece = s.padded / sk.s_os;
      const float* g = s.grad + (sk.os_index() * piece - sk.g * (s.padded / sk.s_g));
      double sum = 0;
      for (std::int64_t e = 0; e < piece; ++e) sum += static_cast<double>(g[e]) * g[e];
      partial += sum / sk.replicas;  // each slice is held by `replicas` ranks
    }
    float value = static_cast<float>(partial);
    HZP_RETURN_IF_ERROR(cm->all_reduce(&value, 1));
    grad_norm = std::sqrt(static_cast<double>(value));
    clip_coef = std::min(1.0, scenario.training.grad_clip / (grad_norm + 1e-6));
    return Status::Ok();
  }

  const bool params = c.payload == Payload::kParams;
  if (params && c.kind == CollectiveKind::kAllGather && role.find("param_refresh") != std::string::npos) {
    // Refresh: optimizer slices -> this rank's parameter shard (in place).
    for (const auto& [s, off] : bucket_segs[c.bucket]) {
      const std::int64_t piece = segs[s].padded / k.s_os;
      HZP_RETURN_IF_ERROR(cm->all_gather(segs[s].param + k.i * piece, segs[s].param, piece));
    }
    return Status::Ok();
  }
  if (params && c.kind == CollectiveKind::kAllGather) {
    if (gather_slot == nullptr) return Status::Internal("runtime: parameter all-gather without a slot");
    const int unit = c.layer + 1;
    const bool secondary = role == "param_secondary";
    for (int s : unit_segs[unit]) {
      Segment& seg = segs[s];
      if (seg.kind != kind || (c.module >= 0 && seg.module != c.module)) continue;
      float* out = gather_slot + seg.unit_offset;
      if (secondary) {
        HZP_RETURN_IF_ERROR(cm->all_gather(seg.secondary, out, seg.padded / secondary_size));
      } else {
        HZP_RETURN_IF_ERROR(cm->all_gather(seg.param, out, seg.padded / k.s_p));
        if (seg.secondary != nullptr) {  // hpZ: keep my node piece for the backward gathers
          const std::int64_t piece = seg.padded / secondary_size;
          std::copy(out + secondary_pos * piece, out + (secondary_pos + 1) * piece, seg.secondary);
        }
      }
    }
    return Status::Ok();
  }
  if (c.kind == CollectiveKind::kReduceScatter && role.find("grad_shard") != std::string::npos) {
    float* slot = bucket_slot[c.bucket];
    if (slot == nullptr) return Status::Internal("runtime: gradient reduce-scatter without a slot");
    for (const auto& [s, off] : bucket_segs[c.bucket]) {
      Segment& seg = segs[s];
      const std::int64_t piece = seg.padded / k.s_g;
      float* in = slot + off;
      HZP_RETURN_IF_ERROR(cm->reduce_scatter(in, in + k.g * piece, piece));
      const float* mine = in + k.g * piece;
      for (std::int64_t e = 0; e < piece; ++e) seg.grad[e] += mine[e];
    }
    return Status::Ok();
  }
  if (c.kind == CollectiveKind::kReduceScatter) {  // param_refresh: gradient shard -> optimizer slice, in place
    for (const auto& [s, off] : bucket_segs[c.bucket]) {
      const std::int64_t piece = segs[s].padded / k.s_os;
      HZP_RETURN_IF_ERROR(cm->reduce_scatter(segs[s].grad, segs[s].grad + k.i * piece, piece));
    }
    return Status::Ok();
  }
  if (c.kind == CollectiveKind::kAllReduce) {  // os_replica: the optimizer slice across replicas
    for (const auto& [s, off] : bucket_segs[c.bucket]) {
      const Segment& seg = segs[s];
      const std::int64_t piece = seg.padded / k.s_os;
      HZP_RETURN_IF_ERROR(cm->all_reduce(seg.grad + (k.os_index() * piece - k.g * (seg.padded / k.s_g)), piece));
    }
    return Status::Ok();
  }
  return Status::Unimplemented(std::string("runtime: ") + to_string(c.kind) + " on role " + role);
}

Status Executor::Impl::optimizer(const OptimizerStepOp& o) {
  const RunSpec& run = scenario.run;
  const double b1 = run.beta1, b2 = run.beta2;
  const double c1 = 1 - std::pow(b1, static_cast<double>(adam_t));
  const double c2 = 1 - std::pow(b2, static_cast<double>(adam_t));
  const float clip = static_cast<float>(clip_coef);
  for (const auto& [s, off] : bucket_segs[o.bucket]) {
    Segment& seg = segs[s];
    const KindInfo& k = kinds[seg.kind];
    const std::int64_t piece = seg.padded / k.s_os;
    const std::int64_t begin = k.os_index() * piece;  // in the segment's full coordinates
    float* p = seg.param + (begin - k.p * (seg.padded / k.s_p));
    const float* g = seg.grad + (begin - k.g * (seg.padded / k.s_g));
    for (const TensorInfo& t : seg.layout) {
      const std::int64_t lo = std::max(begin, t.offset), hi = std::min(begin + piece, t.offset + t.size());
      const double decay = t.decay ? lr * run.weight_decay : 0.0;
      for (std::int64_t e = lo - begin; e < hi - begin; ++e) {
        const double grad = static_cast<double>(g[e] * clip);
        const double m = b1 * seg.m[e] + (1 - b1) * grad;
        const double v = b2 * seg.v[e] + (1 - b2) * grad * grad;
        seg.m[e] = static_cast<float>(m);
        seg.v[e] = static_cast<float>(v);
        double w = p[e];
        w -= decay * w;
        w -= lr * (m / c1) / (std::sqrt(v / c2) + run.eps);
        p[e] = static_cast<float>(w);
      }
    }
    std::fill(seg.grad, seg.grad + seg.padded / k.s_g, 0.f);
  }
  return Status::Ok();
}

Status Executor::Impl::run_step(std::int64_t step_index) {
  step = step_index;
  lr = learning_rate(scenario.run, step);
  loss_sum = aux_sum = 0;
  grad_norm = 0;
  clip_coef = 1;
  ++adam_t;
  for (MoeBuffers& b : moe_buf) b.phase = 0;

  const std::vector<Op>& ops = program->ops;
  std::vector<EventPtr> events(ops.size());
  // Host-side bookkeeping in program order: the gather slots of the visits in flight (FIFO) and the
  // gradient slot of every bucket.
  float* last_gather = nullptr;  // the slot acquired for the gathers that follow it
  std::vector<float*> bucket_slot(schedule.buckets.size(), nullptr);
  std::deque<float*> compute_gather;  // the slot the next compute visit reads (front), in visit order
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    Stream& stream = *streams[op.stream];
    for (int d : op.deps)
      if (ops[d].stream != op.stream) stream.wait(events[d]);
    std::function<Status()> work;
    std::int64_t bytes = 0;
    if (const auto* a = std::get_if<BufferAcquireOp>(&op.body)) {
      float* slot = pool_slots[a->pool][a->slot];
      if (a->pool == gather_pool) {
        last_gather = slot;
        compute_gather.push_back(slot);
        work = [] { return Status::Ok(); };
      } else {
        bucket_slot[a->bucket] = slot;
        std::int64_t size = 0;
        for (const auto& [s, off] : bucket_segs[a->bucket]) size = std::max(size, off + segs[s].padded);
        work = [slot, size] {
          std::fill(slot, slot + size, 0.f);
          return Status::Ok();
        };
      }
    } else if (const auto* r = std::get_if<BufferReleaseOp>(&op.body)) {
      if (r->pool == gather_pool) {
        if (compute_gather.empty()) return Status::Internal("runtime: release of a gather slot never acquired");
        compute_gather.pop_front();
      }
      work = [] { return Status::Ok(); };
    } else if (const auto* c = std::get_if<ComputeOp>(&op.body)) {
      float* slot = compute_gather.empty() ? nullptr : compute_gather.front();
      const std::vector<float*> buckets = bucket_slot;
      const ComputeOp body = *c;
      work = [this, body, slot, buckets] { return compute(body, slot, buckets); };
    } else if (const auto* c = std::get_if<CollectiveOp>(&op.body)) {
      float* slot = nullptr;
      if (c->payload == Payload::kParams && c->bucket < 0) {  // a unit gather: the slot acquired for it
        if (last_gather == nullptr) return Status::Internal("runtime: parameter all-gather without an acquired slot");
        slot = last_gather;
      } else if (c->kind == CollectiveKind::kAllToAll) {
        slot = compute_gather.empty() ? nullptr : compute_gather.front();
      }
      const std::vector<float*> buckets = bucket_slot;
      const CollectiveOp body = *c;
      const int s = op.stream;
      bytes = body.bytes / dtype_bytes(body.dtype) * 4;
      work = [this, body, s, slot, buckets] { return collective(body, s, slot, buckets); };
    } else if (const auto* o = std::get_if<OptimizerStepOp>(&op.body)) {
      const OptimizerStepOp body = *o;
      work = [this, body] { return optimizer(body); };
    }
    const int stream_index = op.stream;
    const int op_index = static_cast<int>(i);
    events[i] = stream.enqueue([this, work = std::move(work), stream_index, op_index, bytes]() -> Status {
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
  if (impl_) impl_->streams.clear();  // join the workers before anything they touch goes away
}

int Executor::rank() const { return impl_->rank; }
void Executor::set_tracing(bool on) { impl_->tracing = on; }

Result<std::unique_ptr<Executor>> Executor::create(const Scenario& scenario, const Schedule& schedule, int rank,
                                                   const ByteDataset* data, CommunicatorFactory make_comm,
                                                   std::function<void(const Status&)> on_fatal) {
  auto impl = std::make_unique<Impl>();
  impl->scenario = scenario;
  impl->schedule = schedule;
  impl->rank = rank;
  impl->world = scenario.cluster.world_size();
  impl->data = data;
  impl->on_fatal = std::move(on_fatal);
  HZP_RETURN_IF_ERROR(impl->setup());
  HZP_RETURN_IF_ERROR(impl->setup_comms(make_comm));
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
  for (Segment& seg : segs) {
    const KindInfo& k = kinds[seg.kind];
    if (k.q() == 1) continue;
    Communicator* cm = any_comm(k.role_refresh);
    if (cm == nullptr) return Status::Internal("runtime: no param_refresh communicator");
    const std::int64_t piece = seg.padded / k.s_os;
    HZP_RETURN_IF_ERROR(cm->all_gather_async(*streams[stream_of_comm(cm)], seg.param + k.i * piece, seg.param, piece)
                            ->synchronize());
  }
  return Status::Ok();
}

Result<double> Executor::evaluate(std::int64_t groups) {
  Impl& d = *impl_;
  HZP_RETURN_IF_ERROR(d.refresh_parameters());
  // Full parameters of every unit: resident, or gathered once into the eval buffer.
  std::vector<float*> full(d.segs.size(), nullptr);
  std::int64_t offset = 0;
  for (size_t s = 0; s < d.segs.size(); ++s) {
    Segment& seg = d.segs[s];
    const KindInfo& k = d.kinds[seg.kind];
    if (k.s_p == 1) {
      full[s] = seg.param;
      continue;
    }
    full[s] = d.eval_params + offset;
    offset += seg.padded;
    // Gather on the stream that owns this group's communicator for parameter gathers.
    Communicator* cm = d.any_comm(k.role_param);
    if (cm == nullptr) return Status::Internal("runtime: no parameter communicator for evaluation");
    EventPtr ev = cm->all_gather_async(*d.streams[d.stream_of_comm(cm)], seg.param, full[s], seg.padded / k.s_p);
    HZP_RETURN_IF_ERROR(ev->synchronize());
  }
  Communicator* ep_comm = d.ep > 1 ? d.any_comm(d.role_ep) : nullptr;
  const std::int64_t per_rank = (groups + d.world - 1) / d.world;
  double loss = 0;
  for (std::int64_t j = 0; j < per_rank; ++j) {
    d.data->val_batch(static_cast<std::uint64_t>(d.scenario.run.seed), j * d.world + d.rank, d.batch, d.ids, d.targets);
    d.embedding->forward(full[d.seg_of(0, 0, 0, false)], d.ids.data(), d.x.data());
    for (int l = 0; l < d.cfg.layers; ++l) {
      d.attention[l]->forward(full[d.seg_of(l + 1, 0, 0, false)], d.x.data());
      if (!d.cfg.moe_layer[l]) {
        d.mlp[l]->forward(full[d.seg_of(l + 1, 1, 0, false)], d.x.data());
      } else if (d.ep == 1) {
        d.moe[l]->forward(full[d.router_seg(l)], full[d.experts_seg(l)], d.x.data());
      } else {
        Impl::MoeBuffers& b = d.moe_buf[l];
        d.moe[l]->route_forward(full[d.router_seg(l)], d.x.data(), b.send, b.send_counts);
        HZP_RETURN_IF_ERROR(ep_comm->all_to_all_v(b.send.data(), b.send_counts, b.recv, b.recv_counts));
        d.moe[l]->experts_forward(full[d.experts_seg(l)], b.recv, b.out);
        std::vector<std::int64_t> back(b.recv_counts.size());
        for (size_t i = 0; i < back.size(); ++i) back[i] = b.recv_counts[i] / (d.cfg.hidden + 1) * d.cfg.hidden;
        HZP_RETURN_IF_ERROR(ep_comm->all_to_all_v(b.out.data(), back, b.back, b.back_counts));
        d.moe[l]->combine_forward(b.back, d.x.data());
      }
    }
    loss += d.head->forward(full[d.seg_of(d.cfg.layers + 1, 0, 0, false)], d.x.data(), d.targets.data());
  }
  float sum = static_cast<float>(loss);
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
  for (const Segment& s : segs) {
    const KindInfo& k = kinds[s.kind];
    spans.push_back({s.param, s.padded / k.s_p});
    spans.push_back({s.m, s.padded / k.s_os});
    spans.push_back({s.v, s.padded / k.s_os});
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
  for (const Segment& seg : segs) h.segments.emplace_back(seg.padded / kinds[seg.kind].s_p, seg.padded / kinds[seg.kind].s_os);
  return h;
}

Status Executor::save(const std::string& path, std::int64_t next_step) const {
  return write_checkpoint(path, impl_->checkpoint_header(next_step), impl_->state_spans());
}

Result<std::int64_t> Executor::load(const std::string& path) {
  Impl& d = *impl_;
  HZP_ASSIGN_OR_RETURN(CheckpointHeader h, read_checkpoint(path, d.checkpoint_header(0), d.scenario.run.steps, d.state_spans()));
  d.adam_t = h.adam_steps;
  return h.next_step;
}

}  // namespace hzp::runtime
