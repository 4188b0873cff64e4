// What each IR op does (executor.h): the module computes, the collectives by purpose, MoE exchanges and the
// optimizer step, as kernel and collective calls on the op's stream (runtime/device/). State: executor_impl.h.
#include <algorithm>

#include "runtime/train/executor_impl.h"

namespace hzp::runtime {

Buffer Executor::Impl::param_of(int s, const Buffer& gather_slot) const {
  const Segment& seg = layout.segment(s);
  if (layout.sharding(seg.state).s_p == 1) return bufs[s].param;
  return gather_slot.empty() ? Buffer{} : gather_slot.slice(seg.unit_offset, seg.padded);
}

Buffer Executor::Impl::grad_of(int s, const std::vector<Buffer>& bucket_slot) const {
  const Segment& seg = layout.segment(s);
  if (layout.sharding(seg.state).s_g == 1) return bufs[s].grad;
  const int b = layout.bucket_of(seg.unit, seg.state);
  for (const auto& [sg, off] : layout.bucket_segments(b))
    if (sg == s) return bucket_slot[b].empty() ? Buffer{} : bucket_slot[b].slice(off, seg.padded);
  return {};
}

// ---------------------------------------------------------------------------------------------------------
// The modules
// ---------------------------------------------------------------------------------------------------------

// Micro-batch group `micro_batch * world + rank` of this step: made on the host, copied to the device.
void Executor::Impl::load_batch(Kernels& k, int micro_batch) {
  const std::int64_t group = static_cast<std::int64_t>(micro_batch) * world + rank;
  const std::size_t slot = static_cast<std::size_t>(micro_batch) % host_ids.size();
  data->train_batch(static_cast<std::uint64_t>(scenario.run.seed), step, group, batch, host_ids[slot],
                    host_targets[slot]);
  k.copy_from_host(host_ids[slot].data(), inputs.ids);
  k.copy_from_host(host_targets[slot].data(), inputs.targets);
}

Status Executor::Impl::forward_module(Kernels& k, ModuleKind module, int unit, const std::function<Buffer(int)>& P) {
  const int layer = schedule.units[unit].layer;
  const int s0 = layout.find(unit, module_slot(module), StateKind::kDense, false);
  if (s0 < 0 || P(s0).empty()) return Status::Internal(std::string("runtime: no parameters for ") + to_string(module));
  switch (module) {
    case ModuleKind::kEmbedding:
      return embedding->forward(k, P(s0), inputs.ids, x);
    case ModuleKind::kAttention:
      return attention[layer]->forward(k, P(s0), x);
    case ModuleKind::kMlp:
      return mlp[layer]->forward(k, P(s0), x);
    case ModuleKind::kMoe:  // without expert parallelism: the stages back to back
      return moe[layer]->forward(k, P(s0), P(experts_seg(unit)), x, inputs.aux_sum);
    case ModuleKind::kHead:
      return head->forward(k, P(s0), x, inputs);
  }
  return Status::Internal("runtime: unknown module");
}

// Each exchange moves rows between the ranks of the expert-parallel group. The row counts go first, as a
// small all-to-all of the per-(rank, local expert) counts, so every rank knows what it receives without the
// host reading a count (what NCCL users do before ncclSend/ncclRecv of variable sizes).
Status Executor::Impl::moe_exchange(Kernels& k, CollectivePurpose purpose, int unit, Communicator& cm,
                                    const Buffer& router, const Buffer& drouter) {
  MoeBlock& block = *moe[schedule.units[unit].layer];
  switch (purpose) {
    case CollectivePurpose::kMoeDispatch:  // route my tokens, send each to the rank holding its expert
      HZP_RETURN_IF_ERROR(block.route_forward(k, router, x, inputs.aux_sum));
      HZP_RETURN_IF_ERROR(cm.all_to_all(block.expert_count(), block.recv_count()));
      HZP_RETURN_IF_ERROR(block.count_elements(k));
      return cm.all_to_all_v(block.send_rows(), block.send_elems(), block.recv_rows(), block.recv_elems());
    case CollectivePurpose::kMoeCombine:  // expert outputs back to the tokens' ranks
      HZP_RETURN_IF_ERROR(cm.all_to_all_v(block.out_rows(), block.recv_elems(), block.returned(), block.send_elems()));
      return block.combine_forward(k, x);
    case CollectivePurpose::kMoeCombineGrad:  // gradients of the expert outputs to the experts' ranks
      HZP_RETURN_IF_ERROR(block.combine_backward(k, dx));
      return cm.all_to_all_v(block.send_rows(), block.send_elems(), block.recv_rows(), block.recv_elems());
    case CollectivePurpose::kMoeDispatchGrad:  // gradients of the routed inputs back, then through the router
      HZP_RETURN_IF_ERROR(
          cm.all_to_all_v(block.out_rows(), block.recv_elems(), block.returned_grad(), block.send_elems()));
      return block.route_backward(k, router, aux_grad_scale(), dx, drouter);
    default:
      return Status::Internal(std::string("runtime: ") + to_string(purpose) + " is not a MoE exchange");
  }
}

Status Executor::Impl::compute(Kernels& k, const ComputeOp& c, const Buffer& gather_slot,
                               const std::vector<Buffer>& bucket_slot) {
  auto P = [&](int s) { return param_of(s, gather_slot); };
  auto G = [&](int s) { return grad_of(s, bucket_slot); };
  const int layer = c.layer;
  if (c.phase == Phase::kForward) {
    if (c.module == ModuleKind::kEmbedding) load_batch(k, c.micro_batch);
    // Under expert parallelism the MoE compute is the experts alone, between the dispatch and the combine.
    if (c.module == ModuleKind::kMoe && expert_parallel())
      return moe[layer]->experts_forward(k, P(experts_seg(c.unit)));
    return forward_module(k, c.module, c.unit, P);
  }
  const int s0 = layout.find(c.unit, module_slot(c.module), StateKind::kDense, false);
  if (s0 < 0 || P(s0).empty() || G(s0).empty())
    return Status::Internal(std::string("runtime: no parameter or gradient buffer for ") + to_string(c.module));
  switch (c.module) {
    case ModuleKind::kEmbedding:
      return embedding->backward(k, dx, inputs.ids, G(s0));
    case ModuleKind::kAttention:
      return attention[layer]->backward(k, P(s0), dx, G(s0));
    case ModuleKind::kMlp:
      return mlp[layer]->backward(k, P(s0), dx, G(s0));
    case ModuleKind::kMoe: {
      const int se = experts_seg(c.unit);
      if (expert_parallel()) return moe[layer]->experts_backward(k, P(se), G(se));
      return moe[layer]->backward(k, P(s0), P(se), aux_grad_scale(), dx, G(s0), G(se));
    }
    case ModuleKind::kHead:
      // dL/dlogits of the mean token loss over the global batch, times the loss scale (fp16).
      return head->backward(k, P(s0),
                            static_cast<float>(loss_scale) / static_cast<float>(scenario.training.global_batch * seq),
                            dx, G(s0));
  }
  return Status::Internal("runtime: unknown module");
}

// ---------------------------------------------------------------------------------------------------------
// The collectives, by purpose
// ---------------------------------------------------------------------------------------------------------

Status Executor::Impl::collective(Kernels& k, const CollectiveOp& c, int stream, const Buffer& gather_slot,
                                  const std::vector<Buffer>& bucket_slot) {
  Communicator* cm = comm(c.role, stream);
  if (cm == nullptr)
    return Status::Internal(std::string("runtime: no communicator for ") + to_string(schedule.roles[c.role]));
  const ShardPosition& pos = layout.position(c.state);
  switch (c.purpose) {
    case CollectivePurpose::kMoeDispatch:
    case CollectivePurpose::kMoeCombine:
    case CollectivePurpose::kMoeCombineGrad:
    case CollectivePurpose::kMoeDispatchGrad: {
      const int rs = router_seg(c.unit);
      return moe_exchange(k, c.purpose, c.unit, *cm, param_of(rs, gather_slot), grad_of(rs, bucket_slot));
    }
    case CollectivePurpose::kGradNorm: {
      // This rank's share of the squared norm (each slice is held by `replicas` ranks), summed over the world,
      // then the clipping coefficient (and the loss scale's inverse) for the optimizer, all on the device.
      k.fill(norm_acc, 0);
      for (std::size_t s = 0; s < layout.segments().size(); ++s) {
        const int i = static_cast<int>(s);
        k.sum_squares(bufs[s].grad.slice(layout.optimizer_in_grad(i), layout.optimizer_floats(i)),
                      layout.sharding(layout.segment(i).state).replicas, norm_acc);
      }
      k.cast(norm_acc, norm_sq);
      HZP_RETURN_IF_ERROR(k.status());
      HZP_RETURN_IF_ERROR(cm->all_reduce(norm_sq));
      k.clip_coefficient(norm_sq, scenario.training.grad_clip, 1.0 / loss_scale, grad_norm, coef);
      return k.status();
    }
    case CollectivePurpose::kRefreshParams:  // optimizer slices -> this rank's parameter shard, in place
      for (const auto& [s, off] : layout.bucket_segments(c.bucket)) {
        const std::int64_t piece = layout.optimizer_floats(s);
        const Buffer& param = bufs[s].param;
        HZP_RETURN_IF_ERROR(cm->all_gather(param.slice(pos.i * piece, piece), param.slice(0, cm->size() * piece)));
      }
      return Status::Ok();
    case CollectivePurpose::kGatherParams:
    case CollectivePurpose::kGatherSecondary: {
      if (gather_slot.empty()) return Status::Internal("runtime: parameter all-gather without a slot");
      const bool secondary = c.purpose == CollectivePurpose::kGatherSecondary;
      for (int s : layout.unit_segments(c.unit)) {
        const Segment& seg = layout.segment(s);
        if (seg.state != c.state || (c.module >= 0 && seg.module != c.module)) continue;
        const Buffer out = gather_slot.slice(seg.unit_offset, seg.padded);
        const std::int64_t piece = seg.padded / layout.secondary_size();
        if (secondary) {
          HZP_RETURN_IF_ERROR(cm->all_gather(bufs[s].secondary, out));
        } else {
          HZP_RETURN_IF_ERROR(cm->all_gather(bufs[s].param, out));
          if (!bufs[s].secondary.empty()) {  // hpZ: keep my node piece for the backward gathers
            k.copy(out.slice(layout.secondary_position() * piece, piece), bufs[s].secondary);
            HZP_RETURN_IF_ERROR(k.status());
          }
        }
      }
      return Status::Ok();
    }
    case CollectivePurpose::kReduceGrads: {  // gradient slot -> my gradient shard, accumulated
      const Buffer& slot = bucket_slot[c.bucket];
      if (slot.empty()) return Status::Internal("runtime: gradient reduce-scatter without a slot");
      for (const auto& [s, off] : layout.bucket_segments(c.bucket)) {
        const std::int64_t piece = layout.grad_floats(s);
        const Buffer in = slot.slice(off, cm->size() * piece);
        const Buffer mine = in.slice(pos.g * piece, piece);
        HZP_RETURN_IF_ERROR(cm->reduce_scatter(in, mine));
        k.add(mine, bufs[s].grad);
      }
      return k.status();
    }
    case CollectivePurpose::kReduceToOptimizer:  // gradient shard -> optimizer slice, in place
      for (const auto& [s, off] : layout.bucket_segments(c.bucket)) {
        const std::int64_t piece = layout.optimizer_floats(s);
        const Buffer& grad = bufs[s].grad;
        HZP_RETURN_IF_ERROR(cm->reduce_scatter(grad.slice(0, cm->size() * piece), grad.slice(pos.i * piece, piece)));
      }
      return Status::Ok();
    case CollectivePurpose::kSyncReplicas:  // the optimizer slice's gradients across replicas
      for (const auto& [s, off] : layout.bucket_segments(c.bucket))
        HZP_RETURN_IF_ERROR(
            cm->all_reduce(bufs[s].grad.slice(layout.optimizer_in_grad(s), layout.optimizer_floats(s))));
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
  return Status::Unimplemented(std::string("runtime: ") + to_string(c.purpose));
}

// AdamW on this rank's optimizer slices of the bucket (one multi-tensor call), then its gradients are zeroed
// for the next step. The update reads the clipping / loss-scale multiplier from the device, and in fp16
// skips itself when the gradient norm overflowed.
Status Executor::Impl::optimizer(Kernels& k, const OptimizerStepOp& o) {
  const RunSpec& run = scenario.run;
  AdamWHyper hyper;
  hyper.lr = lr;
  hyper.beta1 = run.beta1;
  hyper.beta2 = run.beta2;
  hyper.eps = run.eps;
  hyper.weight_decay = run.weight_decay;
  hyper.step = adam_t;
  hyper.coef = coef;
  if (fp16()) hyper.skip_if_nonfinite = grad_norm;
  k.adamw(hyper, adam_tensors[o.bucket]);
  for (const auto& [s, off] : layout.bucket_segments(o.bucket)) k.fill(bufs[s].grad, 0);
  return k.status();
}

}  // namespace hzp::runtime
