// The ops around one module's pass (module_ops.h).
#include "shared/schedule/module_ops.h"

#include <utility>

namespace hzp::schedule_detail {

// Expert parallelism: tokens go all-to-all to their experts before the experts and come back after them;
// the backward pass does the same with gradients. The compute stream waits for them (as in Megatron and
// DeepSpeed-MoE), so they run on it.
int ModuleOps::all_to_all(CollectivePurpose purpose, int unit, int mb, std::vector<int> deps) {
  const double act_bytes = layout_.scenario.training.precision == Precision::kFp32 ? 4 : 2;
  const auto bytes =
      static_cast<std::int64_t>(static_cast<double>(layout_.scenario.training.micro_batch *
                                                    layout_.scenario.training.seq_len / layout_.scenario.mesh.context) *
                                layout_.scenario.model.moe.top_k * layout_.scenario.model.hidden * act_bytes);
  CollectiveOp c = layout_.collective(CollectiveKind::kAllToAll, purpose, kDense, schedule_.role_expert_parallel, bytes,
                                      Payload::kActivations, unit, mb, -1);
  c.gather_slot = visit_slot_;  // the router's parameters
  return prog_.add(StreamKind::kCompute, std::move(deps), c);
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
int ModuleOps::tensor_collective(CollectiveKind kind, const ModuleCost* m, int unit, Phase phase, int mb,
                                 std::vector<int> deps, std::int64_t bytes, DType dtype, StreamKind stream,
                                 std::optional<Payload> payload) {
  const bool bwd = phase == Phase::kBackward;
  if (!payload) payload = bwd ? Payload::kGrads : Payload::kActivations;
  CollectiveOp c =
      layout_.collective(kind, bwd ? CollectivePurpose::kTensorBackward : CollectivePurpose::kTensorForward, kDense,
                         schedule_.role_index(GroupRole::kTensor), bytes, *payload, unit, mb, -1);
  c.module = module_slot(m->kind);
  c.dtype = dtype;
  return prog_.add(stream, std::move(deps), c);
}

ModuleOps::TensorComm ModuleOps::tensor_comm(ModuleKind kind, Phase phase) const {
  TensorComm t;
  if (layout_.scenario.mesh.tensor == 1 ||
      (phase == Phase::kRecompute && layout_.scenario.training.recompute != Recompute::kFull))
    return t;
  const bool bwd = phase == Phase::kBackward, sp = layout_.scenario.policy.parallel.sequence_parallel;
  const bool embedding = kind == ModuleKind::kEmbedding, head = kind == ModuleKind::kHead;
  t.after = sp ? CollectiveKind::kReduceScatter : CollectiveKind::kAllReduce;
  t.gather_before = sp && !(embedding && !bwd) && !(head && bwd);
  t.reduce_after = !(embedding && bwd) && !(head && !bwd);
  t.loss = head && !bwd;
  // Megatron-LM's sequence parallelism keeps only its rank's part of a column-parallel layer's input (the
  // norm's output) and all-gathers it again in backward for the weight gradient, launched before the input
  // gradient's GEMM and waited for after it (LinearWithGradAccumulationAndAsyncCommunication): the layers
  // after a norm, QKV, the MLP's first and the output layer. An MoE block's experts keep their permuted
  // inputs.
  t.regather_input = sp && bwd && (kind == ModuleKind::kAttention || kind == ModuleKind::kMlp || head);
  return t;
}

// What module `m` computes in `phase` (forward, recompute or backward), as a compute op.
ComputeOp ModuleOps::work_of(const ModuleCost* m, int unit, Phase phase, int mb) const {
  ComputeOp w{m->kind, unit, layout_.units[unit].layer, phase, mb};
  w.flash_head_dim = m->flash_head_dim, w.flash_seq = m->flash_seq;
  switch (phase) {
    case Phase::kForward:
      w.flops = m->fwd_flops, w.mem_bytes = m->fwd_mem_bytes, w.fp8_flops = m->fwd_fp8_flops;
      w.core_flops = m->fwd_core_flops, w.core_bytes = m->fwd_core_bytes;
      w.flash_flops = m->fwd_flash_flops;
      w.gemms = m->fwd_gemms, w.gemm_bytes = m->fwd_gemm_bytes;
      break;
    case Phase::kRecompute:
      w.flops = m->recompute_flops, w.mem_bytes = m->recompute_mem_bytes, w.fp8_flops = m->recompute_fp8_flops;
      w.core_flops = m->recompute_core_flops, w.core_bytes = m->recompute_core_bytes;
      w.flash_flops = m->recompute_flash_flops;
      w.gemms = m->recompute_gemms, w.gemm_bytes = m->recompute_gemm_bytes;
      break;
    case Phase::kBackward:
      w.flops = m->bwd_flops, w.mem_bytes = m->bwd_mem_bytes, w.fp8_flops = m->bwd_fp8_flops;
      w.core_flops = m->bwd_core_flops, w.core_bytes = m->bwd_core_bytes;
      w.flash_flops = m->bwd_flash_flops;
      w.gemms = m->bwd_gemms, w.gemm_bytes = m->bwd_gemm_bytes;
      break;
  }
  return w;
}

int ModuleOps::compute(const ModuleCost* m, int unit, Phase phase, int mb, std::vector<int> deps) {
  const bool a2a = layout_.ep > 1 && m->kind == ModuleKind::kMoe && phase != Phase::kRecompute;
  const bool fwd = phase == Phase::kForward;
  // forward: dispatch, experts, combine; backward: combine's gradient, experts, dispatch's gradient.
  const TensorComm tp = tensor_comm(m->kind, phase);
  deps.insert(deps.end(), context_tail_.begin(), context_tail_.end());  // the last attention's exchange
  context_tail_.clear();
  // With tensor_comm_overlap the block's all-gather runs beside its compute on the tensor stream (the GEMM
  // starts on the local chunk while the others arrive); what follows the block waits for it.
  const bool overlap = layout_.scenario.policy.parallel.tensor_comm_overlap;
  const std::vector<int> inputs = deps;
  int gathered = -1;
  if (tp.gather_before && overlap)
    gathered = tensor_collective(CollectiveKind::kAllGather, m, unit, phase, mb, inputs, layout_.act_bytes,
                                 layout_.dtype, StreamKind::kTensor);
  else if (tp.gather_before)
    deps = {tensor_collective(CollectiveKind::kAllGather, m, unit, phase, mb, std::move(deps), layout_.act_bytes,
                              layout_.dtype)};
  context_exchange(m, unit, phase, mb, deps);
  const bool ulysses = ulysses_applies(m, phase);
  if (ulysses) deps = {ulysses_all_to_all(unit, phase, mb, /*before=*/true, std::move(deps))};
  if (a2a)
    deps = {all_to_all(fwd ? CollectivePurpose::kMoeDispatch : CollectivePurpose::kMoeCombineGrad, unit, mb, deps)};
  // The input's re-gather beside the backward's compute (on the compute stream where the policy keeps every
  // collective there); the reduction after the block waits for it.
  int regathered = -1;
  if (tp.regather_input) {
    const bool beside = layout_.scenario.policy.overlap.separate_streams;
    regathered = tensor_collective(CollectiveKind::kAllGather, m, unit, phase, mb, beside ? deps : std::vector<int>{},
                                   layout_.act_bytes, layout_.dtype,
                                   beside ? StreamKind::kTensor : StreamKind::kCompute, Payload::kActivations);
    if (!beside) deps = {regathered};
  }
  ComputeOp work = work_of(m, unit, phase, mb);
  work.gather_slot = visit_slot_;
  int op = prog_.add(StreamKind::kCompute, std::move(deps), work);
  if (a2a) op = all_to_all(fwd ? CollectivePurpose::kMoeCombine : CollectivePurpose::kMoeDispatchGrad, unit, mb, {op});
  if (ulysses) op = ulysses_all_to_all(unit, phase, mb, /*before=*/false, {op});
  if (tp.reduce_after && overlap) {
    // The reduce-scatter of each chunk's partial output runs while the next chunk computes: all but the last
    // chunk's (tensor - 1 of `tensor` parts of its traffic) beside the compute, after the all-gather on the
    // tensor stream; the last after both, on the compute path.
    const std::int64_t parts = layout_.scenario.mesh.tensor;
    const std::int64_t bulk_bytes = layout_.act_bytes * (parts - 1) / parts;
    const int bulk =
        tensor_collective(tp.after, m, unit, phase, mb, inputs, bulk_bytes, layout_.dtype, StreamKind::kTensor);
    std::vector<int> after{op, bulk};
    if (regathered >= 0) after.push_back(regathered);
    after.insert(after.end(), context_tail_.begin(), context_tail_.end());
    context_tail_.clear();
    op = tensor_collective(tp.after, m, unit, phase, mb, std::move(after), layout_.act_bytes - bulk_bytes,
                           layout_.dtype);
  } else if (tp.reduce_after) {
    std::vector<int> after{op};
    if (regathered >= 0) after.push_back(regathered);
    after.insert(after.end(), context_tail_.begin(), context_tail_.end());
    context_tail_.clear();
    op = tensor_collective(tp.after, m, unit, phase, mb, std::move(after), layout_.act_bytes, layout_.dtype);
  } else if (gathered >= 0) {
    context_tail_.push_back(gathered);  // nothing reduces after this block: the next compute waits for it
  }
  if (tp.loss)
    op = tensor_collective(CollectiveKind::kAllReduce, m, unit, phase, mb, {op},
                           3 * layout_.scenario.training.micro_batch * layout_.scenario.training.seq_len /
                               layout_.scenario.mesh.context * 4,
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
void ModuleOps::context_exchange(const ModuleCost* m, int unit, Phase phase, int mb, const std::vector<int>& deps) {
  if (layout_.scenario.mesh.context == 1 || m->kind != ModuleKind::kAttention ||
      layout_.scenario.policy.parallel.context_comm != ContextComm::kRing)
    return;
  if (phase == Phase::kRecompute && layout_.scenario.training.recompute != Recompute::kFull) return;
  const bool bwd = phase == Phase::kBackward;
  const ModelSpec& model = layout_.scenario.model;
  // K and V of the whole sequence, this tensor rank's heads.
  const auto bytes =
      static_cast<std::int64_t>(layout_.scenario.training.micro_batch * layout_.scenario.training.seq_len *
                                (model.kv_heads / layout_.scenario.mesh.tensor) *
                                (model.qk_head_dim() + model.v_head_dim()) * dtype_bytes(layout_.dtype));
  const int role = schedule_.role_index(GroupRole::kContext);
  const CollectivePurpose purpose = bwd ? CollectivePurpose::kContextBackward : CollectivePurpose::kContextForward;
  CollectiveOp gather =
      layout_.collective(CollectiveKind::kAllGather, purpose, kDense, role, bytes, Payload::kActivations, unit, mb, -1);
  gather.module = module_slot(m->kind);
  int last = prog_.add(StreamKind::kContext, deps, gather);
  if (bwd) {
    CollectiveOp reduce =
        layout_.collective(CollectiveKind::kReduceScatter, purpose, kDense, role, bytes, Payload::kGrads, unit, mb, -1);
    reduce.module = module_slot(m->kind);
    last = prog_.add(StreamKind::kContext, {last}, reduce);
  }
  context_tail_.push_back(last);
}

// Context parallelism by all-to-all (DeepSpeed-Ulysses, Jacobs et al. 2023; Megatron-LM's cp_comm_type
// "a2a"): around the attention core, each rank trades its s / context tokens of every head for the whole
// sequence of heads / context heads, and back after it. Forward: one all-to-all of Q, K and V before
// (b·(s/c)·(n_q + 2·n_kv)·d_head elements of this tensor rank's heads; MLA's keys and values are of their own
// widths), one of the output after (b·(s/c)·n_q·d_head); backward the same two with gradients, in reverse order; full
// recomputation repeats the forward's. On the compute path: the attention core needs their result. (Modelled around the
// attention module, whose projections run on the compute stream with them either way.)
bool ModuleOps::ulysses_applies(const ModuleCost* m, Phase phase) const {
  if (layout_.scenario.mesh.context == 1 || layout_.scenario.policy.parallel.context_comm != ContextComm::kAllToAll ||
      m->kind != ModuleKind::kAttention)
    return false;
  return phase != Phase::kRecompute || layout_.scenario.training.recompute == Recompute::kFull;
}

int ModuleOps::ulysses_all_to_all(int unit, Phase phase, int mb, bool before, std::vector<int> deps) {
  const ModelSpec& model = layout_.scenario.model;
  const bool bwd = phase == Phase::kBackward;
  // Q, K and V cross before the core forward and after it backward; the output the other way round.
  const bool qkv = before != bwd;
  const int tensor = layout_.scenario.mesh.tensor;
  const std::int64_t width =
      qkv ? (model.heads * model.qk_head_dim() + model.kv_heads * (model.qk_head_dim() + model.v_head_dim())) / tensor
          : model.heads * model.v_head_dim() / tensor;
  const std::int64_t bytes = layout_.scenario.training.micro_batch * layout_.scenario.training.seq_len /
                             layout_.scenario.mesh.context * width * dtype_bytes(layout_.dtype);
  CollectiveOp c = layout_.collective(
      CollectiveKind::kAllToAll, bwd ? CollectivePurpose::kContextBackward : CollectivePurpose::kContextForward, kDense,
      schedule_.role_index(GroupRole::kContext), bytes, bwd ? Payload::kGrads : Payload::kActivations, unit, mb, -1);
  c.module = module_slot(ModuleKind::kAttention);
  return prog_.add(StreamKind::kCompute, std::move(deps), c);
}

}  // namespace hzp::schedule_detail
