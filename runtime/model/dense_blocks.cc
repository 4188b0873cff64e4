// The dense modules of the runtime's models (model.h): embedding, attention block, MLP block and head, each
// forward and backward as a sequence of kernel calls (runtime/device/kernels.h).
#include <algorithm>

#include "runtime/model/model.h"

namespace hzp::runtime {

namespace {

// The saved activations of a block, allocated one after another from the pool.
class Saver {
 public:
  Saver(MemoryPool& pool, const char* category) : pool_(pool), category_(category) {}
  Buffer operator()(std::int64_t count, ScalarType type) {
    if (!status_.ok()) return {};
    auto b = pool_.allocate(category_, count, type);
    if (!b.ok()) {
      status_ = b.status();
      return {};
    }
    return *b;
  }
  const Status& status() const { return status_; }

 private:
  MemoryPool& pool_;
  const char* category_;
  Status status_;
};

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Workspace
// ---------------------------------------------------------------------------------------------------------

Status Workspace::allocate(MemoryPool& pool, ScalarType type) {
  HZP_ASSIGN_OR_RETURN(buffer_, pool.allocate("workspace", need_, type));
  used_ = 0;
  return Status::Ok();
}

Buffer Workspace::take(std::int64_t n) {
  Buffer b = buffer_.slice(used_, n);
  used_ += n;
  return b;
}

// ---------------------------------------------------------------------------------------------------------
// Embedding
// ---------------------------------------------------------------------------------------------------------

Status Embedding::forward(Kernels& k, const Buffer& params, const Buffer& ids, const Buffer& x) {
  k.embedding_forward(params, ids, x, c_.hidden);
  return k.status();
}

Status Embedding::backward(Kernels& k, const Buffer& dx, const Buffer& ids, const Buffer& dparams) {
  k.embedding_backward(dx, ids, dparams, c_.hidden);
  return k.status();
}

// ---------------------------------------------------------------------------------------------------------
// Attention block: x <- x + wo(attention(rope(norm(x) wq), rope(norm(x) wk), norm(x) wv))
// ---------------------------------------------------------------------------------------------------------

namespace {
// The tensors of attention_layout() inside one flat buffer (parameters or their gradients).
struct AttentionTensors {
  AttentionTensors(const Buffer& base, std::int64_t h, std::int64_t kvw)
      : norm(base.slice(0, h)),
        wq(base.slice(h, h * h)),
        wk(base.slice(h + h * h, h * kvw)),
        wv(base.slice(h + h * h + h * kvw, h * kvw)),
        wo(base.slice(h + h * h + 2 * h * kvw, h * h)) {}
  Buffer norm, wq, wk, wv, wo;
};
}  // namespace

Result<std::unique_ptr<AttentionBlock>> AttentionBlock::create(const ModelConfig& c, std::int64_t batch,
                                                               std::int64_t seq, const Kernels& k, MemoryPool& pool,
                                                               Workspace& ws) {
  std::unique_ptr<AttentionBlock> b(new AttentionBlock());
  b->c_ = c;
  b->shape_ = AttentionShape{batch, seq, c.heads, c.kv(), c.head_dim(), c.attention};
  b->t_ = batch * seq;
  const std::int64_t t = b->t_, h = c.hidden, kvw = c.kv_width(), d = c.head_dim();
  Saver save(pool, "activations");
  b->x_in_ = save(t * h, c.act);
  b->rstd_ = save(t, ScalarType::kFp32);
  b->xn_ = save(t * h, c.act);
  b->q_ = save(t * h, c.act);
  b->k_ = save(t * kvw, c.act);
  b->v_ = save(t * kvw, c.act);
  b->attn_ = save(t * h, c.act);
  b->lse_ = save(batch * c.heads * seq, ScalarType::kFp32);
  b->reserve_ = save(k.attention_reserve(b->shape_), ScalarType::kFp32);
  b->cos_ = save(seq * d / 2, ScalarType::kFp32);
  b->sin_ = save(seq * d / 2, ScalarType::kFp32);
  HZP_RETURN_IF_ERROR(save.status());
  ws.need(3 * t * h + 2 * t * kvw);  // dattn, dq, dxn; dk, dv
  b->ws_ = &ws;
  return b;
}

Status AttentionBlock::forward(Kernels& k, const Buffer& params, const Buffer& x) {
  const std::int64_t t = t_, h = c_.hidden, kvw = c_.kv_width(), seq = shape_.seq, d = shape_.head_dim;
  const AttentionTensors w(params, h, kvw);
  if (!tables_ready_) {  // the rotary tables, once (on the stream that uses them)
    k.rope_tables(cos_, sin_, seq, d);
    tables_ready_ = true;
  }
  k.copy(x.slice(0, t * h), x_in_);
  k.rmsnorm_forward(x, w.norm, xn_, rstd_, t, h);
  k.linear(xn_, w.wq, q_, t, h, h);
  k.linear(xn_, w.wk, k_, t, h, kvw);
  k.linear(xn_, w.wv, v_, t, h, kvw);
  k.rope_forward(q_, t, seq, shape_.heads, d, cos_, sin_);
  k.rope_forward(k_, t, seq, shape_.kv_heads, d, cos_, sin_);
  k.attention_forward(shape_, q_, k_, v_, attn_, lse_, reserve_);
  k.linear(attn_, w.wo, x, t, h, h, /*accumulate=*/true);  // residual
  return k.status();
}

Status AttentionBlock::backward(Kernels& k, const Buffer& params, const Buffer& dx, const Buffer& dparams) {
  const std::int64_t t = t_, h = c_.hidden, kvw = c_.kv_width(), seq = shape_.seq, d = shape_.head_dim;
  const AttentionTensors w(params, h, kvw);
  const AttentionTensors dw(dparams, h, kvw);
  ws_->reset();
  const Buffer dattn = ws_->take(t * h), dq = ws_->take(t * h), dk = ws_->take(t * kvw), dv = ws_->take(t * kvw),
               dxn = ws_->take(t * h);
  // dx holds dL/dy; the residual passes it through unchanged, the branch adds its part at the end.
  k.linear_dw(attn_, dx, dw.wo, t, h, h);
  k.linear_dx(dx, w.wo, dattn, t, h, h);
  k.attention_backward(shape_, q_, k_, v_, attn_, dattn, lse_, reserve_, dq, dk, dv);
  k.rope_backward(dq, t, seq, shape_.heads, d, cos_, sin_);
  k.rope_backward(dk, t, seq, shape_.kv_heads, d, cos_, sin_);
  k.linear_dw(xn_, dq, dw.wq, t, h, h);
  k.linear_dw(xn_, dk, dw.wk, t, h, kvw);
  k.linear_dw(xn_, dv, dw.wv, t, h, kvw);
  k.linear_dx(dq, w.wq, dxn, t, h, h);
  k.linear_dx(dk, w.wk, dxn, t, h, kvw, /*accumulate=*/true);
  k.linear_dx(dv, w.wv, dxn, t, h, kvw, /*accumulate=*/true);
  k.rmsnorm_backward(x_in_, w.norm, rstd_, dxn, dx, dw.norm, t, h, /*accumulate=*/true);
  return k.status();
}

// ---------------------------------------------------------------------------------------------------------
// Dense MLP block: x <- x + down(silu(norm(x) gate) * (norm(x) up))
// ---------------------------------------------------------------------------------------------------------

namespace {
struct MlpTensors {
  MlpTensors(const Buffer& base, std::int64_t h, std::int64_t f)
      : norm(base.slice(0, h)),
        gate(base.slice(h, h * f)),
        up(base.slice(h + h * f, h * f)),
        down(base.slice(h + 2 * h * f, f * h)) {}
  Buffer norm, gate, up, down;
};
}  // namespace

Result<std::unique_ptr<MlpBlock>> MlpBlock::create(const ModelConfig& c, std::int64_t batch, std::int64_t seq,
                                                   MemoryPool& pool, Workspace& ws) {
  std::unique_ptr<MlpBlock> b(new MlpBlock());
  b->c_ = c;
  b->t_ = batch * seq;
  const std::int64_t t = b->t_, h = c.hidden, f = c.ffn;
  Saver save(pool, "activations");
  b->x_in_ = save(t * h, c.act);
  b->rstd_ = save(t, ScalarType::kFp32);
  b->xn_ = save(t * h, c.act);
  b->gate_ = save(t * f, c.act);
  b->up_ = save(t * f, c.act);
  b->act_ = save(t * f, c.act);
  HZP_RETURN_IF_ERROR(save.status());
  ws.need(t * h + 3 * t * f);  // dxn; dact, dgate, dup
  b->ws_ = &ws;
  return b;
}

Status MlpBlock::forward(Kernels& k, const Buffer& params, const Buffer& x) {
  const std::int64_t t = t_, h = c_.hidden, f = c_.ffn;
  const MlpTensors w(params, h, f);
  k.copy(x.slice(0, t * h), x_in_);
  k.rmsnorm_forward(x, w.norm, xn_, rstd_, t, h);
  k.linear(xn_, w.gate, gate_, t, h, f);
  k.linear(xn_, w.up, up_, t, h, f);
  k.swiglu_forward(gate_, up_, act_, t, f);
  k.linear(act_, w.down, x, t, f, h, /*accumulate=*/true);  // residual
  return k.status();
}

Status MlpBlock::backward(Kernels& k, const Buffer& params, const Buffer& dx, const Buffer& dparams) {
  const std::int64_t t = t_, h = c_.hidden, f = c_.ffn;
  const MlpTensors w(params, h, f);
  const MlpTensors dw(dparams, h, f);
  ws_->reset();
  const Buffer dxn = ws_->take(t * h), dact = ws_->take(t * f), dgate = ws_->take(t * f), dup = ws_->take(t * f);
  k.linear_dw(act_, dx, dw.down, t, f, h);
  k.linear_dx(dx, w.down, dact, t, f, h);
  k.swiglu_backward(gate_, up_, dact, dgate, dup, t, f);
  k.linear_dw(xn_, dgate, dw.gate, t, h, f);
  k.linear_dw(xn_, dup, dw.up, t, h, f);
  k.linear_dx(dgate, w.gate, dxn, t, h, f);
  k.linear_dx(dup, w.up, dxn, t, h, f, /*accumulate=*/true);
  k.rmsnorm_backward(x_in_, w.norm, rstd_, dxn, dx, dw.norm, t, h, /*accumulate=*/true);
  return k.status();
}

// ---------------------------------------------------------------------------------------------------------
// Head: logits = norm(x) w_out, loss = sum of token cross-entropies
// ---------------------------------------------------------------------------------------------------------

Result<std::unique_ptr<Head>> Head::create(const ModelConfig& c, std::int64_t tokens, const Kernels& k,
                                           MemoryPool& pool, Workspace& ws) {
  std::unique_ptr<Head> b(new Head());
  b->c_ = c;
  b->t_ = tokens;
  const std::int64_t t = tokens, h = c.hidden, v = c.vocab;
  Saver save(pool, "activations");
  b->x_in_ = save(t * h, c.act);
  b->rstd_ = save(t, ScalarType::kFp32);
  b->xn_ = save(t * h, c.act);
  b->logits_ = save(t * v, c.act);
  b->reserve_ = save(k.cross_entropy_reserve(t, v), ScalarType::kFp32);
  b->targets_ = save(t, ScalarType::kInt32);
  HZP_RETURN_IF_ERROR(save.status());
  ws.need(t * h);  // dxn
  b->ws_ = &ws;
  return b;
}

Status Head::forward(Kernels& k, const Buffer& params, const Buffer& x, const Batch& batch) {
  const std::int64_t t = t_, h = c_.hidden, v = c_.vocab;
  const Buffer norm = params.slice(0, h), w_out = params.slice(h, h * v);
  k.copy(x.slice(0, t * h), x_in_);
  k.copy(batch.targets.slice(0, t), targets_);
  k.rmsnorm_forward(x, norm, xn_, rstd_, t, h);
  k.linear(xn_, w_out, logits_, t, h, v);
  k.cross_entropy_forward(logits_, targets_, reserve_, batch.loss_sum, t, v);
  return k.status();
}

Status Head::backward(Kernels& k, const Buffer& params, float scale, const Buffer& dx, const Buffer& dparams) {
  const std::int64_t t = t_, h = c_.hidden, v = c_.vocab;
  const Buffer norm = params.slice(0, h), w_out = params.slice(h, h * v);
  const Buffer dnorm = dparams.slice(0, h), dw_out = dparams.slice(h, h * v);
  ws_->reset();
  const Buffer dxn = ws_->take(t * h);
  const Buffer& dlogits = logits_;  // the logits are not needed past this point
  k.cross_entropy_backward(logits_, targets_, reserve_, scale, dlogits, t, v);
  k.linear_dw(xn_, dlogits, dw_out, t, h, v);
  k.linear_dx(dlogits, w_out, dxn, t, h, v);
  k.rmsnorm_backward(x_in_, norm, rstd_, dxn, dx, dnorm, t, h, /*accumulate=*/false);
  return k.status();
}

}  // namespace hzp::runtime
