// The CUDA backend's Kernels (cuda_kernels.h): each operation enqueues its launcher's kernels (launch.h) on the
// stream's cudaStream_t and checks the launch; products go to cuBLASLt. Scratch (partial sums, MoE run tables,
// cuBLASLt's workspace) is allocated when the Kernels are made and grown by prepare(), before any step.
//
// A MoE layer's expert GEMMs run as one cuBLAS product per expert (expert_products.h), whose row counts the host
// must know: moe_group, which computes the experts' row offsets on the device, also copies them to pinned host
// memory behind an event of its stream, and the expert GEMMs that follow on this Kernels wait for that event
// once and reuse the copy (one wait per grouping: Megatron's grouped MLP likewise moves its tokens-per-expert to
// the host). The wait is the stream's own (Event::synchronize): a stream poisoned meanwhile, e.g. by the NCCL
// watchdog aborting a dead peer's communicator, ends it with that failure. The copy is reused only while
// nothing but expert GEMMs and SwiGLU ran on this Kernels since moe_group (what MoeBlock's expert stage does);
// any other call drops it, and offsets not staged so are copied and waited for at the GEMM.
#include "runtime/backends/cuda/cuda_kernels.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <string_view>

#include "runtime/backends/cuda/launch.h"
#include "runtime/device/expert_products.h"

namespace hzp::runtime {
namespace {

// Scratch every Kernels gets at once (enough for the kernel tests and small models; prepare() grows it).
constexpr std::int64_t kInitialFloats = 1 << 20;
constexpr std::int64_t kInitialDoubles = 1 << 12;
constexpr std::int64_t kInitialInts = 1 << 14;
constexpr std::size_t kGemmWorkspaceBytes = 32u << 20;  // cuBLASLt's recommendation for Hopper
constexpr std::int64_t kInitialExpertOffsets = 1 << 10;

class CudaKernels final : public Kernels {
 public:
  CudaKernels(Stream& stream, cudaStream_t s) : Kernels(stream), s_(s) {
    if (!gemm_.init_error().empty()) fail(Status::Internal("cuda kernels: " + gemm_.init_error()));
    if (Status st = grow(kInitialFloats, kInitialDoubles, kInitialInts); !st.ok()) fail(st);
    if (cudaMalloc(&ws_.gemm, kGemmWorkspaceBytes) == cudaSuccess)
      ws_.gemm_bytes = kGemmWorkspaceBytes;
    else
      fail(Status::Internal("cuda kernels: cannot allocate cuBLASLt's workspace of " +
                            std::to_string(kGemmWorkspaceBytes) + " bytes"));
    if (Status st = grow_host_offsets(kInitialExpertOffsets); !st.ok()) fail(st);
  }
  ~CudaKernels() override {
    cudaFree(ws_.floats);
    cudaFree(ws_.doubles);
    cudaFree(ws_.ints);
    cudaFree(ws_.gemm);
    cudaFreeHost(host_offsets_);  // synchronises with the device: a last offsets copy has landed
  }

  std::string backend() const override { return "cuda"; }
  std::int64_t attention_reserve(const AttentionShape&) const override { return 0; }  // recomputed from lse
  std::int64_t cross_entropy_reserve(std::int64_t rows, std::int64_t) const override {
    return 2 * rows;  // each row's log-sum-exp and token loss
  }

  Status prepare(const KernelLimits& l) override {
    const std::int64_t floats =
        std::max({l.rows > 0 ? std::min<std::int64_t>(l.rows, 256) * l.width : 0, l.attention_rows, kInitialFloats});
    const std::int64_t doubles = std::max(l.experts, kInitialDoubles);
    const std::int64_t ints =
        std::max({2 * l.moe_runs + 1, cuda::embedding_backward_ints(l.rows, l.vocab), kInitialInts});
    HZP_RETURN_IF_ERROR(grow_host_offsets(l.experts + 1));
    return grow(floats, doubles, ints);
  }

 protected:
  void do_fill(const Buffer& x, double value) override {
    cuda::fill(x, value, s_);
    after("fill");
  }
  void do_copy(const Buffer& src, const Buffer& dst) override {
    staged_ = nullptr;
    if (src.count > 0 && src.data != dst.data)
      check_api(
          cudaMemcpyAsync(dst.data, src.data, static_cast<std::size_t>(dst.bytes()), cudaMemcpyDeviceToDevice, s_),
          "copy");
  }
  void do_cast(const Buffer& src, const Buffer& dst) override {
    if (src.type == dst.type) return do_copy(src, dst);
    cuda::cast(src, dst, s_);
    after("cast");
  }
  // From pageable host memory the copy is staged before cudaMemcpyAsync returns, so the caller may reuse its
  // buffer at once; to pageable host memory it returns once the data has arrived.
  void do_copy_from_host(const void* src, const Buffer& dst) override {
    staged_ = nullptr;
    if (dst.count > 0)
      check_api(cudaMemcpyAsync(dst.data, src, static_cast<std::size_t>(dst.bytes()), cudaMemcpyHostToDevice, s_),
                "copy_from_host");
  }
  void do_copy_to_host(const Buffer& src, void* dst) override {
    if (src.count > 0)
      check_api(cudaMemcpyAsync(dst, src.data, static_cast<std::size_t>(src.bytes()), cudaMemcpyDeviceToHost, s_),
                "copy_to_host");
  }
  void do_scale(const Buffer& x, float alpha) override {
    cuda::scale(x, alpha, s_);
    after("scale");
  }
  void do_add(const Buffer& src, const Buffer& dst) override {
    cuda::add(src, dst, s_);
    after("add");
  }
  void do_sum_squares(const Buffer& x, std::int64_t replicas, const Buffer& acc) override {
    cuda::sum_squares(x, replicas, acc, s_);
    after("sum_squares");
  }
  void do_clip_coefficient(const Buffer& norm_sq, double max_norm, double inv_loss_scale, const Buffer& norm,
                           const Buffer& coef) override {
    cuda::clip_coefficient(norm_sq, max_norm, inv_loss_scale, norm, coef, s_);
    after("clip_coefficient");
  }
  void do_adamw(const AdamWHyper& hyper, const std::vector<AdamWTensor>& tensors) override {
    cuda::adamw(hyper, tensors, s_);
    after("adamw");
  }
  void do_matmul(const MatmulArgs& args) override {
    const std::string error = gemm_.run(args, ws_, s_);
    if (!error.empty()) return fail(Status::Internal("kernel matmul (cuda): " + error));
    after("matmul");
  }
  void do_embedding_forward(const Buffer& table, const Buffer& ids, const Buffer& out, std::int64_t hidden) override {
    cuda::embedding_forward(table, ids, out, hidden, s_);
    after("embedding_forward");
  }
  void do_embedding_backward(const Buffer& dout, const Buffer& ids, const Buffer& dtable,
                             std::int64_t hidden) override {
    if (!scratch("embedding_backward", 0, 0, cuda::embedding_backward_ints(ids.count, dtable.count / hidden))) return;
    cuda::embedding_backward(dout, ids, dtable, hidden, ws_, s_);
    after("embedding_backward");
  }
  void do_rmsnorm_forward(const Buffer& x, const Buffer& w, const Buffer& y, const Buffer& rstd, std::int64_t rows,
                          std::int64_t h) override {
    cuda::rmsnorm_forward(x, w, y, rstd, rows, h, s_);
    after("rmsnorm_forward");
  }
  void do_rmsnorm_backward(const Buffer& x, const Buffer& w, const Buffer& rstd, const Buffer& dy, const Buffer& dx,
                           const Buffer& dw, std::int64_t rows, std::int64_t h, bool accumulate) override {
    if (!scratch("rmsnorm_backward", h, 0, 0)) return;  // at least one row of partial sums
    cuda::rmsnorm_backward(x, w, rstd, dy, dx, dw, rows, h, accumulate, ws_, s_);
    after("rmsnorm_backward");
  }
  void do_rope_tables(const Buffer& cos, const Buffer& sin, std::int64_t seq, std::int64_t d) override {
    cuda::rope_tables(cos, sin, seq, d, s_);
    after("rope_tables");
  }
  void do_rope(const Buffer& x, std::int64_t rows, std::int64_t seq, std::int64_t heads, std::int64_t d,
               const Buffer& cos, const Buffer& sin, bool inverse) override {
    cuda::rope(x, rows, seq, heads, d, cos, sin, inverse, s_);
    after("rope");
  }
  void do_swiglu_forward(const Buffer& gate, const Buffer& up, const Buffer& act, std::int64_t rows, std::int64_t width,
                         const Buffer& row_limit) override {
    cuda::swiglu_forward(gate, up, act, rows, width, row_limit, s_);
    after("swiglu_forward");
  }
  void do_swiglu_backward(const Buffer& gate, const Buffer& up, const Buffer& dact, const Buffer& dgate,
                          const Buffer& dup, std::int64_t rows, std::int64_t width, const Buffer& row_limit) override {
    cuda::swiglu_backward(gate, up, dact, dgate, dup, rows, width, row_limit, s_);
    after("swiglu_backward");
  }
  void do_softmax_rows(const Buffer& x, const Buffer& p, std::int64_t rows, std::int64_t n) override {
    cuda::softmax_rows(x, p, rows, n, s_);
    after("softmax_rows");
  }
  void do_softmax_rows_backward(const Buffer& p, const Buffer& dp, const Buffer& dx, std::int64_t rows,
                                std::int64_t n) override {
    cuda::softmax_rows_backward(p, dp, dx, rows, n, s_);
    after("softmax_rows_backward");
  }
  void do_attention_forward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                            const Buffer& out, const Buffer& lse, const Buffer&) override {
    if (shape.algorithm == AttentionAlgorithm::kPasa && !cuda::flash_attention_supported(shape, q, k, v, out))
      return fail(Status::Unimplemented(
          "kernel attention_forward (cuda): PASA's GPU kernel takes fp16 with head_dim a multiple of 16 up to 128 "
          "and 16-byte aligned buffers (got " +
          std::string(to_string(q.type)) + ", head_dim " + std::to_string(shape.head_dim) + ")"));
    if (!cuda::flash_attention_supported(shape, q, k, v, out) &&
        !shared_fits("attention_forward", shape.head_dim + shape.seq))
      return;
    cuda::attention_forward(shape, q, k, v, out, lse, s_);
    after("attention_forward");
  }
  void do_attention_backward(const AttentionShape& shape, const Buffer& q, const Buffer& k, const Buffer& v,
                             const Buffer& out, const Buffer& dout, const Buffer& lse, const Buffer&, const Buffer& dq,
                             const Buffer& dk, const Buffer& dv) override {
    if (!scratch("attention_backward", shape.batch * shape.heads * shape.seq, 0, 0) ||
        (!cuda::flash_attention_supported(shape, q, k, v, dout) &&
         !shared_fits("attention_backward", 4 * shape.head_dim + 2 * shape.seq)))
      return;
    cuda::attention_backward(shape, q, k, v, out, dout, lse, dq, dk, dv, ws_, s_);
    after("attention_backward");
  }
  void do_cross_entropy_forward(const Buffer& logits, const Buffer& targets, const Buffer& reserve,
                                const Buffer& loss_sum, std::int64_t rows, std::int64_t vocab) override {
    cuda::cross_entropy_forward(logits, targets, reserve, loss_sum, rows, vocab, s_);
    after("cross_entropy_forward");
  }
  void do_cross_entropy_backward(const Buffer& logits, const Buffer& targets, const Buffer& reserve, float scale,
                                 const Buffer& dlogits, std::int64_t rows, std::int64_t vocab) override {
    cuda::cross_entropy_backward(logits, targets, reserve, scale, dlogits, rows, vocab, s_);
    after("cross_entropy_backward");
  }
  void do_moe_topk(const Buffer& probs, const Buffer& selected, const Buffer& weight, const Buffer& psum,
                   const Buffer& expert_count, std::int64_t t, std::int64_t experts, std::int64_t k) override {
    cuda::moe_topk(probs, selected, weight, psum, expert_count, t, experts, k, s_);
    after("moe_topk");
  }
  void do_moe_aux_loss(const Buffer& probs, const Buffer& expert_count, const Buffer& fraction, const Buffer& aux_sum,
                       std::int64_t t, std::int64_t experts, std::int64_t k) override {
    if (!scratch("moe_aux_loss", 0, experts, 0)) return;
    cuda::moe_aux_loss(probs, expert_count, fraction, aux_sum, t, experts, k, ws_, s_);
    after("moe_aux_loss");
  }
  void do_moe_permute(const Buffer& x, const Buffer& selected, const Buffer& expert_count, const Buffer& rows,
                      const Buffer& send_row, std::int64_t t, std::int64_t experts, std::int64_t k,
                      std::int64_t h) override {
    cuda::moe_permute(x, selected, expert_count, rows, send_row, t, experts, k, h, s_);
    after("moe_permute");
  }
  void do_moe_combine(const Buffer& rows, const Buffer& send_row, const Buffer& weight, const Buffer& x, std::int64_t t,
                      std::int64_t k, std::int64_t h, bool accumulate) override {
    cuda::moe_combine(rows, send_row, weight, x, t, k, h, accumulate, s_);
    after("moe_combine");
  }
  void do_moe_combine_backward(const Buffer& dx, const Buffer& rows, const Buffer& send_row, const Buffer& weight,
                               const Buffer& grad_rows, const Buffer& dweight, std::int64_t t, std::int64_t k,
                               std::int64_t h) override {
    cuda::moe_combine_backward(dx, rows, send_row, weight, grad_rows, dweight, t, k, h, s_);
    after("moe_combine_backward");
  }
  void do_moe_router_backward(const Buffer& dweight, const Buffer& weight, const Buffer& selected, const Buffer& psum,
                              const Buffer& fraction, float aux_coef, const Buffer& dp, std::int64_t t,
                              std::int64_t experts, std::int64_t k) override {
    cuda::moe_router_backward(dweight, weight, selected, psum, fraction, aux_coef, dp, t, experts, k, s_);
    after("moe_router_backward");
  }
  void do_moe_group(const Buffer& recv, const Buffer& counts, const Buffer& grouped, const Buffer& order,
                    const Buffer& offsets, std::int64_t sources, std::int64_t local, std::int64_t h) override {
    if (!scratch("moe_group", 0, 0, 2 * sources * local + 1)) return;
    cuda::moe_group(recv, counts, grouped, order, offsets, sources, local, h, ws_, s_);
    after("moe_group");
    stage_offsets(offsets, local + 1);
  }
  void do_moe_ungroup(const Buffer& grouped, const Buffer& order, const Buffer& offsets, const Buffer& out,
                      std::int64_t local, std::int64_t width) override {
    cuda::moe_ungroup(grouped, order, offsets, out, local, width, s_);
    after("moe_ungroup");
  }
  void do_sum_counts(const Buffer& counts, const Buffer& out, std::int64_t n, std::int64_t local,
                     std::int64_t multiplier) override {
    cuda::sum_counts(counts, out, n, local, multiplier, s_);
    after("sum_counts");
  }
  void do_expert_gemm(const ExpertGemmArgs& args) override {
    const std::int64_t* offsets = offsets_on_host("expert_gemm", args.offsets, args.groups + 1);
    if (offsets == nullptr) return;
    run_products("expert_gemm", expert_products(args, offsets));
  }
  void do_expert_gemm_dw(const ExpertGemmArgs& args) override {
    const std::int64_t* offsets = offsets_on_host("expert_gemm_dw", args.offsets, args.groups + 1);
    if (offsets == nullptr) return;
    run_products("expert_gemm_dw", expert_dw_products(args, offsets));
  }

 private:
  // A launch error (bad configuration, no kernel image for this GPU) becomes the sticky error; errors from a
  // kernel that already ran surface at the stream's next synchronisation.
  void after(const char* kernel) {
    // Every launch but the expert stage's (moe_group stages after its own) drops the staged offsets.
    const std::string_view k = kernel;
    if (k != "expert_gemm" && k != "expert_gemm_dw" && k != "swiglu_forward" && k != "swiglu_backward")
      staged_ = nullptr;
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
      fail(Status::Internal(std::string("kernel ") + kernel + " (cuda): " + cudaGetErrorName(e) + ": " +
                            cudaGetErrorString(e)));
  }
  void check_api(cudaError_t e, const char* what) {
    if (e != cudaSuccess)
      fail(Status::Internal(std::string("kernel ") + what + " (cuda): " + cudaGetErrorName(e) + ": " +
                            cudaGetErrorString(e)));
  }

  // The scratch holds `floats`, `doubles` and `ints` elements, else the call fails naming prepare().
  bool scratch(const char* kernel, std::int64_t floats, std::int64_t doubles, std::int64_t ints) {
    if (floats <= ws_.float_count && doubles <= ws_.double_count && ints <= ws_.int_count) return true;
    fail(Status::Internal(std::string("kernel ") + kernel + " (cuda): the call needs more scratch than prepared (" +
                          std::to_string(floats) + " floats, " + std::to_string(doubles) + " doubles, " +
                          std::to_string(ints) + " ints; have " + std::to_string(ws_.float_count) + ", " +
                          std::to_string(ws_.double_count) + ", " + std::to_string(ws_.int_count) +
                          "): call Kernels::prepare with the run's sizes"));
    return false;
  }

  // The attention kernels keep one row of scores (and q, dO) in shared memory: `floats` must fit the device.
  bool shared_fits(const char* kernel, std::int64_t floats) {
    int device = 0, limit = 0;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (floats * static_cast<std::int64_t>(sizeof(float)) <= limit) return true;
    fail(Status::Unimplemented(std::string("kernel ") + kernel + " (cuda): a row of " + std::to_string(floats) +
                               " fp32 scores does not fit the block's " + std::to_string(limit) +
                               " bytes of shared memory (the simple attention kernels cap the sequence near " +
                               std::to_string(limit / 8) + " tokens)"));
    return false;
  }

  // --- The experts' row offsets on the host (the file comment) ---

  // After moe_group on this stream: copy its `n` offsets to the pinned buffer, ready once offsets_ready_ is.
  void stage_offsets(const Buffer& offsets, std::int64_t n) {
    staged_ = nullptr;
    offsets_ready_.reset();
    if (n > host_offsets_count_) return;  // offsets_on_host reports it
    check_api(cudaMemcpyAsync(host_offsets_, offsets.data, static_cast<std::size_t>(n) * sizeof(std::int64_t),
                              cudaMemcpyDeviceToHost, s_),
              "moe_group (offsets to the host)");
    if (!status().ok()) return;
    offsets_ready_ = stream().record();
    staged_ = offsets.data, staged_count_ = n;
  }
  // The `n` offsets at `offsets` on the host, or nullptr after failing this Kernels.
  const std::int64_t* offsets_on_host(const char* kernel, const Buffer& offsets, std::int64_t n) {
    if (n > host_offsets_count_) {
      fail(Status::Internal(std::string("kernel ") + kernel + " (cuda): " + std::to_string(n - 1) +
                            " experts are more than prepared (" + std::to_string(host_offsets_count_ - 1) +
                            "): call Kernels::prepare with the run's experts"));
      return nullptr;
    }
    if (offsets.data != staged_ || n > staged_count_) stage_offsets(offsets, n);
    if (offsets_ready_ == nullptr) return nullptr;  // stage_offsets failed this Kernels
    if (Status st = offsets_ready_->synchronize(); !st.ok()) {
      staged_ = nullptr;
      fail(Status::Internal(std::string("kernel ") + kernel +
                            " (cuda): waiting for the experts' row offsets: " + st.message()));
      return nullptr;
    }
    return host_offsets_;
  }
  void run_products(const char* kernel, const Result<std::vector<MatmulArgs>>& products) {
    if (!products.ok())
      return fail(Status::Internal(std::string("kernel ") + kernel + " (cuda): " + products.status().message()));
    for (const MatmulArgs& p : *products) {
      const std::string error = gemm_.run_varying(p, ws_, s_);
      if (!error.empty()) return fail(Status::Internal(std::string("kernel ") + kernel + " (cuda): " + error));
    }
    after(kernel);
  }
  Status grow_host_offsets(std::int64_t n) {
    if (n <= host_offsets_count_) return Status::Ok();
    cudaFreeHost(host_offsets_);
    host_offsets_ = nullptr;
    host_offsets_count_ = 0;
    staged_ = nullptr;
    if (cudaMallocHost(reinterpret_cast<void**>(&host_offsets_), static_cast<std::size_t>(n) * sizeof(std::int64_t)) !=
        cudaSuccess)
      return Status::Internal("cuda kernels: cannot allocate " + std::to_string(n) + " pinned expert offsets");
    host_offsets_count_ = n;
    return Status::Ok();
  }

  Status grow(std::int64_t floats, std::int64_t doubles, std::int64_t ints) {
    auto regrow = [](auto*& p, std::int64_t& have, std::int64_t want, const char* what) -> Status {
      if (want <= have) return Status::Ok();
      cudaFree(p);
      p = nullptr;
      have = 0;
      if (cudaMalloc(reinterpret_cast<void**>(&p), static_cast<std::size_t>(want) * sizeof(*p)) != cudaSuccess)
        return Status::Internal(std::string("cuda kernels: cannot allocate ") + std::to_string(want) + " " + what +
                                " of scratch");
      have = want;
      return Status::Ok();
    };
    HZP_RETURN_IF_ERROR(regrow(ws_.floats, ws_.float_count, floats, "floats"));
    HZP_RETURN_IF_ERROR(regrow(ws_.doubles, ws_.double_count, doubles, "doubles"));
    return regrow(ws_.ints, ws_.int_count, ints, "ints");
  }

  cudaStream_t s_;
  cuda::Workspace ws_;
  cuda::Gemm gemm_;
  std::int64_t* host_offsets_ = nullptr;  // pinned
  std::int64_t host_offsets_count_ = 0;
  EventPtr offsets_ready_;        // the stream's event after the copy into host_offsets_
  const void* staged_ = nullptr;  // the device offsets whose copy host_offsets_ holds (once offsets_ready_)
  std::int64_t staged_count_ = 0;
};

}  // namespace

std::unique_ptr<Kernels> make_cuda_kernels(Stream& stream, cudaStream_t s) {
  return std::make_unique<CudaKernels>(stream, s);
}

}  // namespace hzp::runtime
