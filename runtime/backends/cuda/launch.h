// The CUDA backend's kernel launchers, one per operation of runtime/device/kernels.h (same arguments, plus the
// stream; already checked by the interface). Each enqueues its kernels and returns; launch errors are read
// by the caller (cudaGetLastError). Implemented by family: elementwise.cu, norms.cu, attention.cu, moe.cu,
// flash_attention.cu, gemm.cu. `scratch` is the Kernels' device workspace (fp32 partial sums), `scratch_floats` its
// size.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "runtime/backends/cuda/attention_geometry.h"
#include "runtime/device/kernels.h"

namespace hzp::runtime::cuda {

// Device scratch of one Kernels (one stream), allocated once when the Kernels are made: partial sums and
// row statistics (floats), exact sums (doubles), MoE run tables (ints), and cuBLASLt's workspace.
struct Workspace {
  float* floats = nullptr;
  std::int64_t float_count = 0;
  double* doubles = nullptr;
  std::int64_t double_count = 0;
  std::int64_t* ints = nullptr;
  std::int64_t int_count = 0;
  void* gemm = nullptr;
  std::size_t gemm_bytes = 0;
};

// elementwise.cu
void fill(const Buffer& x, double value, cudaStream_t s);
void cast(const Buffer& src, const Buffer& dst, cudaStream_t s);
void scale(const Buffer& x, float alpha, cudaStream_t s);
void add(const Buffer& src, const Buffer& dst, cudaStream_t s);
void sum_squares(const Buffer& x, std::int64_t replicas, const Buffer& acc, cudaStream_t s);
void clip_coefficient(const Buffer& norm_sq, double max_norm, double inv_loss_scale, const Buffer& norm,
                      const Buffer& coef, cudaStream_t s);
void adamw(const AdamWHyper& hyper, const std::vector<AdamWTensor>& tensors, cudaStream_t s);
void embedding_forward(const Buffer& table, const Buffer& ids, const Buffer& out, std::int64_t hidden, cudaStream_t s);
// Needs embedding_backward_ints(tokens, vocab) ints of the workspace.
void embedding_backward(const Buffer& dout, const Buffer& ids, const Buffer& dtable, std::int64_t hidden,
                        const Workspace& ws, cudaStream_t s);
inline std::int64_t embedding_backward_ints(std::int64_t tokens, std::int64_t vocab) {
  return 2 * vocab + 1 + 2 * tokens;
}
void rope_tables(const Buffer& cos, const Buffer& sin, std::int64_t seq, std::int64_t d, cudaStream_t s);
void rope(const Buffer& x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d, const Buffer& cos,
          const Buffer& sin, bool inverse, cudaStream_t s);
void swiglu_forward(const Buffer& gate, const Buffer& up, const Buffer& act, std::int64_t rows, std::int64_t width,
                    const Buffer& row_limit, cudaStream_t s);
void swiglu_backward(const Buffer& gate, const Buffer& up, const Buffer& dact, const Buffer& dgate, const Buffer& dup,
                     std::int64_t rows, std::int64_t width, const Buffer& row_limit, cudaStream_t s);

// norms.cu: RMSNorm, row softmax, cross-entropy.
void rmsnorm_forward(const Buffer& x, const Buffer& w, const Buffer& y, const Buffer& rstd, std::int64_t rows,
                     std::int64_t h, cudaStream_t s);
void rmsnorm_backward(const Buffer& x, const Buffer& w, const Buffer& rstd, const Buffer& dy, const Buffer& dx,
                      const Buffer& dw, std::int64_t rows, std::int64_t h, bool accumulate, const Workspace& ws,
                      cudaStream_t s);
void softmax_rows(const Buffer& x, const Buffer& p, std::int64_t rows, std::int64_t n, cudaStream_t s);
void softmax_rows_backward(const Buffer& p, const Buffer& dp, const Buffer& dx, std::int64_t rows, std::int64_t n,
                           cudaStream_t s);
void cross_entropy_forward(const Buffer& logits, const Buffer& targets, const Buffer& reserve, const Buffer& loss_sum,
                           std::int64_t rows, std::int64_t vocab, cudaStream_t s);
void cross_entropy_backward(const Buffer& logits, const Buffer& targets, const Buffer& reserve, float scale,
                            const Buffer& dlogits, std::int64_t rows, std::int64_t vocab, cudaStream_t s);

// attention.cu (indexing by AttentionGeometry, attention_geometry.h)
void attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                       const Buffer& out, const Buffer& lse, cudaStream_t s);
void attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                        const Buffer& out, const Buffer& dout, const Buffer& lse, const Buffer& dq, const Buffer& dk,
                        const Buffer& dv, const Workspace& ws, cudaStream_t s);

// flash_attention.cu: tensor-core kernels for bf16 / fp16, head_dim 16..128 in steps of 16, 16-byte aligned
// buffers (and not HZP_CUDA_ATTENTION=simple); attention.cu's launchers use them when this says so. PASA
// (fp16 only) has no other kernels: its forward is flash_mma.cu's at head_dim 64 and 128, flash_attention.cu's
// WMMA one otherwise; its backward is flash attention's.
bool flash_attention_supported(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                               const Buffer& out);
void flash_attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                             const Buffer& out, const Buffer& lse, cudaStream_t s);
void flash_attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                              const Buffer& dout, const Buffer& lse, const float* delta, const Buffer& dq,
                              const Buffer& dk, const Buffer& dv, cudaStream_t s);
// HZP_CUDA_ATTENTION, read at each call: "simple" (attention.cu's kernels), "wmma" (flash_attention.cu's), or
// unset for the fastest that applies.
const char* attention_kernel_choice();

// flash_mma.cu: flash attention 2 on mma.sync at head_dim 64 and 128 (bf16 / fp16, and PASA's fp16 forward;
// 16-byte aligned buffers: flash_attention_supported), used by flash_attention.cu's launchers when it applies
// and mma_attention_shared_bytes fits the device.
bool mma_attention_supported(const AttentionShape& shape);
std::size_t mma_attention_shared_bytes(std::int64_t head_dim);
void mma_attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                           const Buffer& out, const Buffer& lse, cudaStream_t s);
void mma_attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                            const Buffer& dout, const Buffer& lse, const float* delta, const Buffer& dq,
                            const Buffer& dk, const Buffer& dv, cudaStream_t s);

// moe.cu
void moe_topk(const Buffer& probs, const Buffer& selected, const Buffer& weight, const Buffer& psum,
              const Buffer& expert_count, std::int64_t t, std::int64_t experts, std::int64_t k, cudaStream_t s);
void moe_aux_loss(const Buffer& probs, const Buffer& expert_count, const Buffer& fraction, const Buffer& aux_sum,
                  std::int64_t t, std::int64_t experts, std::int64_t k, const Workspace& ws, cudaStream_t s);
void moe_permute(const Buffer& x, const Buffer& selected, const Buffer& expert_count, const Buffer& rows,
                 const Buffer& send_row, std::int64_t t, std::int64_t experts, std::int64_t k, std::int64_t h,
                 cudaStream_t s);
void moe_combine(const Buffer& rows, const Buffer& send_row, const Buffer& weight, const Buffer& x, std::int64_t t,
                 std::int64_t k, std::int64_t h, bool accumulate, cudaStream_t s);
void moe_combine_backward(const Buffer& dx, const Buffer& rows, const Buffer& send_row, const Buffer& weight,
                          const Buffer& grad_rows, const Buffer& dweight, std::int64_t t, std::int64_t k,
                          std::int64_t h, cudaStream_t s);
void moe_router_backward(const Buffer& dweight, const Buffer& weight, const Buffer& selected, const Buffer& psum,
                         const Buffer& fraction, float aux_coef, const Buffer& dp, std::int64_t t, std::int64_t experts,
                         std::int64_t k, cudaStream_t s);
void moe_group(const Buffer& recv, const Buffer& counts, const Buffer& grouped, const Buffer& order,
               const Buffer& offsets, std::int64_t sources, std::int64_t local, std::int64_t h, const Workspace& ws,
               cudaStream_t s);
void moe_ungroup(const Buffer& grouped, const Buffer& order, const Buffer& offsets, const Buffer& out,
                 std::int64_t local, std::int64_t width, cudaStream_t s);
void sum_counts(const Buffer& counts, const Buffer& out, std::int64_t n, std::int64_t local, std::int64_t multiplier,
                cudaStream_t s);

// gemm.cu: cuBLASLt. One Gemm per Kernels (its handle and algorithm cache are not thread-safe).
class Gemm {
 public:
  Gemm();
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;
  // An error message, or "" when the product was enqueued.
  std::string run(const MatmulArgs& args, const Workspace& ws, cudaStream_t s);
  // The same product for shapes that change from call to call (batch 1): no per-shape algorithm cache.
  std::string run_varying(const MatmulArgs& args, const Workspace& ws, cudaStream_t s);
  const std::string& init_error() const { return init_error_; }

 private:
  struct Impl;
  Impl* impl_;
  std::string init_error_;
};

}  // namespace hzp::runtime::cuda
