// The MoE block of the runtime's models (model.h): router, top-k routing, token permutation, expert GEMMs
// and the weighted combine, each stage a sequence of kernel calls (runtime/device/kernels.h) so that expert
// parallelism can exchange rows between stages without the host seeing them.
//
// Routed rows are ordered by global expert, then token, then slot: the rows for rank j are then contiguous
// (rank j holds a contiguous range of experts) and sorted by its local experts, and send_row[t * k + s]
// remembers where (token t, slot s) went, which is all combine and route need to map returned rows back.
// The holder groups the rows it receives (from every rank) by local expert, so that each expert runs as one
// GEMM over its rows, and ungroups the results back into the received order.
#include <algorithm>
#include <cassert>

#include "runtime/model/model.h"

namespace hzp::runtime {

namespace {

// The three matrices of local expert 0 inside an experts_layout(c, local) buffer; expert g's are `stride`
// further on.
struct ExpertMatrices {
  ExpertMatrices(const Buffer& base, std::int64_t h, std::int64_t f)
      : gate(base.slice(0)), up(base.slice(h * f)), down(base.slice(2 * h * f)), stride(3 * h * f) {}
  Buffer gate, up, down;
  std::int64_t stride;
};

// c (+)= a op(W) over the experts' row groups, W [w_rows x w_cols].
ExpertGemmArgs grouped(const Buffer& a, const Buffer& w, const Buffer& c, const Buffer& offsets, std::int64_t groups,
                       std::int64_t w_rows, std::int64_t w_cols, std::int64_t stride, bool trans_w, bool accumulate) {
  ExpertGemmArgs g;
  g.a = a, g.w = w, g.c = c, g.offsets = offsets;
  g.groups = groups, g.w_rows = w_rows, g.w_cols = w_cols, g.w_stride = stride;
  g.trans_w = trans_w, g.accumulate = accumulate;
  return g;
}

}  // namespace

Result<std::unique_ptr<MoeBlock>> MoeBlock::create(const ModelConfig& c, std::int64_t batch, std::int64_t seq, int ep,
                                                   MemoryPool& pool) {
  if (ep < 1 || c.experts % ep != 0)
    return Status::Internal("MoeBlock: " + std::to_string(ep) + " expert-parallel ranks do not divide " +
                            std::to_string(c.experts) + " experts");
  std::unique_ptr<MoeBlock> b(new MoeBlock());
  b->c_ = c;
  b->t_ = batch * seq;
  b->ep_ = ep;
  b->local_ = c.experts / ep;
  const std::int64_t t = b->t_, h = c.hidden, e = c.experts, k = c.top_k, f = c.expert_ffn, tk = t * k;
  // Worst case at a holder: every rank sends each of its t tokens to min(k, local) of this rank's experts (a
  // token's experts are distinct).
  b->capacity_ = ep * t * std::min<std::int64_t>(k, b->local_);
  const std::int64_t cap = b->capacity_;
  auto take = [&](std::int64_t count, ScalarType type) -> Result<Buffer> {
    return pool.allocate("activations", count, type);
  };
  HZP_ASSIGN_OR_RETURN(b->x_in_, take(t * h, c.act));
  HZP_ASSIGN_OR_RETURN(b->rstd_, take(t, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(b->xn_, take(t * h, c.act));
  HZP_ASSIGN_OR_RETURN(b->logits_, take(t * e, c.act));
  HZP_ASSIGN_OR_RETURN(b->probs_, take(t * e, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(b->selected_, take(tk, ScalarType::kInt32));
  HZP_ASSIGN_OR_RETURN(b->weight_, take(tk, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(b->psum_, take(t, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(b->send_row_, take(tk, ScalarType::kInt64));
  HZP_ASSIGN_OR_RETURN(b->fraction_, take(e, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(b->expert_count_, take(e, ScalarType::kInt64));
  HZP_ASSIGN_OR_RETURN(b->send_elems_, take(ep, ScalarType::kInt64));
  HZP_ASSIGN_OR_RETURN(b->recv_elems_, take(ep, ScalarType::kInt64));
  HZP_ASSIGN_OR_RETURN(b->send_rows_, take(tk * h, c.act));
  HZP_ASSIGN_OR_RETURN(b->dweight_, take(tk, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(b->dxn_, take(t * h, c.act));
  HZP_ASSIGN_OR_RETURN(b->dp_, take(t * e, ScalarType::kFp32));
  HZP_ASSIGN_OR_RETURN(b->out_rows_, take(cap * h, c.act));
  HZP_ASSIGN_OR_RETURN(b->xe_, take(cap * h, c.act));
  HZP_ASSIGN_OR_RETURN(b->gate_, take(cap * f, c.act));
  HZP_ASSIGN_OR_RETURN(b->up_, take(cap * f, c.act));
  HZP_ASSIGN_OR_RETURN(b->act_, take(cap * f, c.act));
  HZP_ASSIGN_OR_RETURN(b->order_, take(cap, ScalarType::kInt64));
  HZP_ASSIGN_OR_RETURN(b->offsets_, take(b->local_ + 1, ScalarType::kInt64));
  HZP_ASSIGN_OR_RETURN(b->ye_, take(cap * h, c.act));
  HZP_ASSIGN_OR_RETURN(b->dact_, take(cap * f, c.act));
  HZP_ASSIGN_OR_RETURN(b->dgate_, take(cap * f, c.act));
  HZP_ASSIGN_OR_RETURN(b->dup_, take(cap * f, c.act));
  if (ep == 1) {
    // Nothing moves between ranks: the holder "receives" the sent rows where they are, and the outputs return
    // where the holder wrote them.
    b->recv_count_ = b->expert_count_;
    b->recv_rows_ = b->send_rows_;
    b->returned_ = b->out_rows_;
    b->returned_grad_ = b->out_rows_;
  } else {
    HZP_ASSIGN_OR_RETURN(b->recv_count_, take(e, ScalarType::kInt64));
    HZP_ASSIGN_OR_RETURN(b->recv_rows_, take(cap * h, c.act));
    HZP_ASSIGN_OR_RETURN(b->returned_, take(tk * h, c.act));
    b->returned_grad_ = b->send_rows_;  // free again once the combine gradients have left
  }
  return b;
}

Status MoeBlock::forward(Kernels& k, const Buffer& router, const Buffer& experts, const Buffer& x,
                         const Buffer& aux_sum) {
  assert(ep_ == 1);
  HZP_RETURN_IF_ERROR(route_forward(k, router, x, aux_sum));
  HZP_RETURN_IF_ERROR(experts_forward(k, experts));
  return combine_forward(k, x);
}

Status MoeBlock::backward(Kernels& k, const Buffer& router, const Buffer& experts, float aux_grad_scale,
                          const Buffer& dx, const Buffer& drouter, const Buffer& dexperts) {
  assert(ep_ == 1);
  HZP_RETURN_IF_ERROR(combine_backward(k, dx));
  HZP_RETURN_IF_ERROR(experts_backward(k, experts, dexperts));
  return route_backward(k, router, aux_grad_scale, dx, drouter);
}

Status MoeBlock::route_forward(Kernels& k, const Buffer& router, const Buffer& x, const Buffer& aux_sum) {
  const std::int64_t t = t_, h = c_.hidden, e = c_.experts, top = c_.top_k;
  const Buffer norm = router.slice(0, h), wr = router.slice(h, h * e);
  // Step 1: norm, router probabilities p = softmax(x_norm Wr) (in fp32).
  k.copy(x.slice(0, t * h), x_in_);
  k.rmsnorm_forward(x, norm, xn_, rstd_, t, h);
  k.linear(xn_, wr, logits_, t, h, e);
  k.softmax_rows(logits_, probs_, t, e);
  // Step 2: top-k per token, weights renormalised over the selected experts; rows per expert.
  k.moe_topk(probs_, selected_, weight_, psum_, expert_count_, t, e, top);
  // Step 3: aux = E * sum_e f_e * P_e over this micro-batch.
  k.moe_aux_loss(probs_, expert_count_, fraction_, aux_sum, t, e, top);
  // Step 4: the normed tokens in (expert, token, slot) order.
  k.moe_permute(xn_, selected_, expert_count_, send_rows_, send_row_, t, e, top, h);
  return k.status();
}

Status MoeBlock::count_elements(Kernels& k) {
  k.sum_counts(expert_count_, send_elems_, ep_, local_, c_.hidden);
  k.sum_counts(recv_count_, recv_elems_, ep_, local_, c_.hidden);
  return k.status();
}

Status MoeBlock::experts_forward(Kernels& k, const Buffer& experts) {
  const std::int64_t h = c_.hidden, f = c_.expert_ffn, cap = capacity_;
  const ExpertMatrices w(experts, h, f);
  const Buffer live = offsets_.slice(local_, 1);  // the rows received in all
  // Step 1: group the received rows by local expert.
  k.moe_group(recv_rows_.slice(0, cap * h), recv_count_, xe_, order_, offsets_, ep_, local_, h);
  // Step 2: each expert's SwiGLU MLP on its rows.
  k.expert_gemm(grouped(xe_, w.gate, gate_, offsets_, local_, h, f, w.stride, false, false));
  k.expert_gemm(grouped(xe_, w.up, up_, offsets_, local_, h, f, w.stride, false, false));
  k.swiglu_forward(gate_, up_, act_, cap, f, live);
  k.expert_gemm(grouped(act_, w.down, ye_, offsets_, local_, f, h, w.stride, false, false));
  // Step 3: outputs back in the received order.
  k.moe_ungroup(ye_, order_, offsets_, out_rows_, local_, h);
  return k.status();
}

Status MoeBlock::combine_forward(Kernels& k, const Buffer& x) {
  k.moe_combine(returned_, send_row_, weight_, x, t_, c_.top_k, c_.hidden, /*accumulate=*/true);
  return k.status();
}

Status MoeBlock::combine_backward(Kernels& k, const Buffer& dx) {
  // dL/d(expert output) of each routed row (into send_rows_, in send order) and dL/d(gate weight).
  k.moe_combine_backward(dx, returned_, send_row_, weight_, send_rows_, dweight_, t_, c_.top_k, c_.hidden);
  return k.status();
}

Status MoeBlock::experts_backward(Kernels& k, const Buffer& experts, const Buffer& dexperts) {
  const std::int64_t h = c_.hidden, f = c_.expert_ffn, cap = capacity_;
  const ExpertMatrices w(experts, h, f);
  const ExpertMatrices dw(dexperts, h, f);
  const Buffer live = offsets_.slice(local_, 1);
  // Step 1: the received gradients into the grouped order of experts_forward (the same counts give the same
  // grouping; ye_ is free scratch now).
  k.moe_group(recv_rows_.slice(0, cap * h), recv_count_, ye_, order_, offsets_, ep_, local_, h);
  // Step 2: each expert's backward: down, SwiGLU, then gate and up.
  k.expert_gemm_dw(grouped(act_, dw.down, ye_, offsets_, local_, f, h, dw.stride, false, false));
  k.expert_gemm(grouped(ye_, w.down, dact_, offsets_, local_, f, h, w.stride, /*trans_w=*/true, false));
  k.swiglu_backward(gate_, up_, dact_, dgate_, dup_, cap, f, live);
  k.expert_gemm_dw(grouped(xe_, dw.gate, dgate_, offsets_, local_, h, f, dw.stride, false, false));
  k.expert_gemm_dw(grouped(xe_, dw.up, dup_, offsets_, local_, h, f, dw.stride, false, false));
  const Buffer dxe = ye_;  // the grouped output gradients are consumed: reuse for dL/d(input)
  k.expert_gemm(grouped(dgate_, w.gate, dxe, offsets_, local_, h, f, w.stride, true, false));
  k.expert_gemm(grouped(dup_, w.up, dxe, offsets_, local_, h, f, w.stride, true, /*accumulate=*/true));
  // Step 3: input gradients back in the received order.
  k.moe_ungroup(dxe, order_, offsets_, out_rows_, local_, h);
  return k.status();
}

Status MoeBlock::route_backward(Kernels& k, const Buffer& router, float aux_grad_scale, const Buffer& dx,
                                const Buffer& drouter) {
  const std::int64_t t = t_, h = c_.hidden, e = c_.experts, top = c_.top_k;
  const Buffer norm = router.slice(0, h), wr = router.slice(h, h * e);
  const Buffer dnorm = drouter.slice(0, h), dwr = drouter.slice(h, h * e);
  // Step 1: dL/dx_norm through the experts: the sum over the token's routed copies.
  k.moe_combine(returned_grad_, send_row_, Buffer{}, dxn_, t, top, h, /*accumulate=*/false);
  // Step 2: dL/dp through the renormalised gates and the aux loss E * sum_e f_e * mean_t p_te.
  const float aux_coef = aux_grad_scale * static_cast<float>(e) / static_cast<float>(t);
  k.moe_router_backward(dweight_, weight_, selected_, psum_, fraction_, aux_coef, dp_, t, e, top);
  // Step 3: through the softmax (dlogits into the logits buffer) and the router matmul, then the norm (dx +=:
  // the residual keeps its part).
  const Buffer& dlogits = logits_;
  k.softmax_rows_backward(probs_, dp_, dlogits, t, e);
  k.linear_dw(xn_, dlogits, dwr, t, h, e);
  k.linear_dx(dlogits, wr, dxn_, t, h, e, /*accumulate=*/true);
  k.rmsnorm_backward(x_in_, norm, rstd_, dxn_, dx, dnorm, t, h, /*accumulate=*/true);
  return k.status();
}

}  // namespace hzp::runtime
