// Names of the IR's enums and the deterministic text dump used by golden tests.
#include "shared/ir/schedule.h"

#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace hzp {

const char* to_string(Phase v) {
  switch (v) {
    case Phase::kForward:
      return "fwd";
    case Phase::kBackward:
      return "bwd";
    case Phase::kRecompute:
      return "recompute";
  }
  return "?";
}

const char* to_string(CollectiveKind v) {
  switch (v) {
    case CollectiveKind::kAllGather:
      return "all_gather";
    case CollectiveKind::kReduceScatter:
      return "reduce_scatter";
    case CollectiveKind::kAllReduce:
      return "all_reduce";
    case CollectiveKind::kBroadcast:
      return "broadcast";
    case CollectiveKind::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

const char* to_string(DType v) {
  switch (v) {
    case DType::kBf16:
      return "bf16";
    case DType::kFp16:
      return "fp16";
    case DType::kFp32:
      return "fp32";
  }
  return "?";
}

const char* to_string(Payload v) {
  switch (v) {
    case Payload::kParams:
      return "params";
    case Payload::kGrads:
      return "grads";
    case Payload::kActivations:
      return "activations";
    case Payload::kGradNorm:
      return "grad_norm";
  }
  return "?";
}

int dtype_bytes(DType v) {
  return v == DType::kFp32 ? 4 : 2;
}

#define HZP_NAME_CASE(name, text) \
  case name:                      \
    return text;
const char* to_string(GroupRole role) {
  using enum GroupRole;
  switch (role) { HZP_GROUP_ROLES(HZP_NAME_CASE) }
  return "?";
}

const char* to_string(StreamKind stream) {
  using enum StreamKind;
  switch (stream) { HZP_STREAM_KINDS(HZP_NAME_CASE) }
  return "?";
}
#undef HZP_NAME_CASE

const char* to_string(StateKind v) {
  return v == StateKind::kDense ? "dense" : "expert";
}

const char* to_string(PoolKind v) {
  return v == PoolKind::kParamGather ? "param_gather" : "grad_reduce";
}

const char* to_string(CollectivePurpose v) {
  switch (v) {
    case CollectivePurpose::kGatherParams:
      return "gather_params";
    case CollectivePurpose::kGatherSecondary:
      return "gather_secondary";
    case CollectivePurpose::kRefreshParams:
      return "refresh_params";
    case CollectivePurpose::kReduceGrads:
      return "reduce_grads";
    case CollectivePurpose::kReduceToOptimizer:
      return "reduce_to_optimizer";
    case CollectivePurpose::kSyncReplicas:
      return "sync_replicas";
    case CollectivePurpose::kGradNorm:
      return "grad_norm";
    case CollectivePurpose::kMoeDispatch:
      return "moe_dispatch";
    case CollectivePurpose::kMoeCombine:
      return "moe_combine";
    case CollectivePurpose::kMoeCombineGrad:
      return "moe_combine_grad";
    case CollectivePurpose::kMoeDispatchGrad:
      return "moe_dispatch_grad";
    case CollectivePurpose::kTensorForward:
      return "tensor_forward";
    case CollectivePurpose::kTensorBackward:
      return "tensor_backward";
    case CollectivePurpose::kPipeActivations:
      return "pipe_activations";
    case CollectivePurpose::kPipeGrads:
      return "pipe_grads";
    case CollectivePurpose::kContextForward:
      return "context_forward";
    case CollectivePurpose::kContextBackward:
      return "context_backward";
    case CollectivePurpose::kEmbeddingGrads:
      return "embedding_grads";
  }
  return "?";
}

int module_slot(ModuleKind module) {
  return module == ModuleKind::kMlp || module == ModuleKind::kMoe ? 1 : 0;
}

int Schedule::role_index(GroupRole role) const {
  for (std::size_t i = 0; i < roles.size(); ++i)
    if (roles[i] == role) return static_cast<int>(i);
  return -1;
}

namespace {

std::string fmt_double(double v) {
  // Whole numbers print exactly; others with 9 significant digits, which is stable across platforms.
  char buf[64];
  if (std::fabs(v) < 9e15 && v == std::floor(v))
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string fmt_ranks(const std::vector<int>& ranks) {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? "," : "") + std::to_string(ranks[i]);
  return out + "]";
}

struct BodyPrinter {
  const Schedule& schedule;
  int rank;
  std::ostringstream& os;

  void operator()(const ComputeOp& c) const {
    os << "compute " << to_string(c.module) << " unit=" << c.unit << " phase=" << to_string(c.phase)
       << " mb=" << c.micro_batch << " flops=" << fmt_double(c.flops) << " mem_bytes=" << fmt_double(c.mem_bytes);
    if (c.fp8_flops > 0) os << " fp8_flops=" << fmt_double(c.fp8_flops);
    if (c.core_flops > 0)
      os << " core_flops=" << fmt_double(c.core_flops) << " core_bytes=" << fmt_double(c.core_bytes);
    if (c.flash_flops > 0)
      os << " flash_flops=" << fmt_double(c.flash_flops) << " flash_head_dim=" << c.flash_head_dim
         << " flash_seq=" << fmt_double(c.flash_seq);
    if (c.gemms > 0) os << " gemms=" << c.gemms << " gemm_bytes=" << fmt_double(c.gemm_bytes);
  }
  void operator()(const CollectiveOp& c) const {
    os << to_string(c.kind) << " " << to_string(c.purpose) << " " << to_string(c.state)
       << " role=" << to_string(schedule.roles[c.role]);
    if (rank >= 0) os << " group=" << schedule.rank_groups[rank][c.role];
    os << " bytes=" << c.bytes << " dtype=" << to_string(c.dtype) << " payload=" << to_string(c.payload)
       << " unit=" << c.unit << " mb=" << c.micro_batch;
    if (c.bucket >= 0) os << " bucket=" << c.bucket;
    if (c.module >= 0) os << " module=" << c.module;
    if (c.root >= 0) os << " root=" << c.root;
  }
  void operator()(const OptimizerStepOp& o) const {
    os << "optimizer_step bucket=" << o.bucket << " unit=" << o.unit << " shard_params=" << o.shard_params
       << " mem_bytes=" << fmt_double(o.mem_bytes);
  }
  void operator()(const BufferAcquireOp& b) const {
    os << "acquire pool=" << schedule.pools[b.pool].name << " slot=" << b.slot << " unit=" << b.unit;
    if (b.bucket >= 0) os << " bucket=" << b.bucket;
  }
  void operator()(const BufferReleaseOp& b) const {
    os << "release pool=" << schedule.pools[b.pool].name << " slot=" << b.slot << " unit=" << b.unit;
    if (b.bucket >= 0) os << " bucket=" << b.bucket;
  }
};

}  // namespace

std::string dump_schedule(const Schedule& schedule, int rank) {
  std::ostringstream os;
  os << "# hzp schedule v2 policy=" << to_string(schedule.policy) << " world=" << schedule.world_size
     << " gpus_per_node=" << schedule.gpus_per_node << " programs=" << schedule.programs.size() << "\n";
  os << "streams:";
  for (size_t i = 0; i < schedule.streams.size(); ++i) os << " " << i << "=" << to_string(schedule.streams[i]);
  os << "\npools:";
  for (const BufferPool& p : schedule.pools)
    os << " " << p.name << "(slots=" << p.slots << ",slot_bytes=" << p.slot_bytes << ")";
  os << "\nunits:";
  for (std::size_t u = 0; u < schedule.units.size(); ++u) {
    os << " " << u << "=";
    for (std::size_t m = 0; m < schedule.units[u].modules.size(); ++m)
      os << (m ? "+" : "") << to_string(schedule.units[u].modules[m]);
  }
  os << "\nstates:";
  for (StateKind k : {StateKind::kDense, StateKind::kExpert}) {
    const StateSharding& st = schedule.state(k);
    if (st.present)
      os << " " << to_string(k) << "(s_p=" << st.s_p << ",s_g=" << st.s_g << ",s_os=" << st.s_os
         << ",replicas=" << st.replicas << ")";
  }
  os << "\nbuckets:";
  for (const GradBucket& b : schedule.buckets) os << " " << to_string(b.state) << fmt_ranks(b.units);
  os << "\n";
  const int first = rank < 0 ? 0 : rank;
  const int last = rank < 0 ? schedule.world_size - 1 : rank;
  for (int r = first; r <= last; ++r) {
    os << "rank " << r << " program " << schedule.rank_program[r] << " groups:";
    for (size_t role = 0; role < schedule.roles.size(); ++role) {
      const int g = schedule.rank_groups[r][role];
      os << " " << to_string(schedule.roles[role]) << "=" << g << fmt_ranks(schedule.groups[g].ranks);
    }
    os << "\n";
  }
  const std::vector<int> programs_to_print =
      rank < 0 ? [&] { std::vector<int> all; for (size_t p = 0; p < schedule.programs.size(); ++p) all.push_back(static_cast<int>(p)); return all; }()
               : std::vector<int>{schedule.rank_program[rank]};
  for (int p : programs_to_print) {
    os << "program " << p << ":\n";
    const Program& prog = schedule.programs[p];
    for (size_t i = 0; i < prog.ops.size(); ++i) {
      const Op& op = prog.ops[i];
      os << "  " << i << " [" << to_string(schedule.streams[op.stream]) << "] ";
      std::visit(BodyPrinter{schedule, rank, os}, op.body);
      if (!op.deps.empty()) os << " deps=" << fmt_ranks(op.deps);
      if (!op.prev_step_deps.empty()) os << " prev_step_deps=" << fmt_ranks(op.prev_step_deps);
      os << "\n";
    }
  }
  return os.str();
}

}  // namespace hzp
