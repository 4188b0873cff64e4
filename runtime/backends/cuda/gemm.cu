// Every matrix product of the CUDA backend through cuBLASLt (launch.h): row-major C = alpha op(A) op(B) +
// beta C, strided-batched, fp32 / bf16 / fp16 operands with fp32 accumulation (CUBLAS_COMPUTE_32F: no TF32,
// so fp32 products are what the CPU reference computes up to summation order), C in the operands' type or
// fp32. Row-major C = A B is column-major C^T = B^T A^T, so B is cuBLASLt's first operand. The algorithm of
// each shape is chosen once by cuBLASLt's heuristic and cached, with the pointers' real alignment declared.
// Products whose sizes change from call to call (an expert's rows: run_varying) go to cublasGemmEx instead, which
// picks its algorithm per call: a per-shape cache would miss on nearly every call and grow without end.
#include <cublasLt.h>
#include <cublas_v2.h>

#include <climits>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "runtime/backends/cuda/cuda_common.cuh"
#include "runtime/backends/cuda/gemm_layout.h"
#include "runtime/backends/cuda/launch.h"

namespace hzp::runtime::cuda {
namespace {

cudaDataType_t data_type(ScalarType t) {
  switch (t) {
    case ScalarType::kBf16:
      return CUDA_R_16BF;
    case ScalarType::kFp16:
      return CUDA_R_16F;
    default:
      return CUDA_R_32F;
  }
}

// The largest power of two (at most 256) dividing the address: what the algorithm may assume.
std::uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::uint32_t align = 256;  // (an address or stride of 0 is aligned to anything)
  while (align > 1 && a % align != 0) align /= 2;
  return align;
}

std::string status_text(cublasStatus_t s) {
  return std::string("cuBLAS status ") + std::to_string(static_cast<int>(s));
}

// Everything that selects an algorithm.
using ShapeKey = std::tuple<int, int, int, bool, bool, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                            std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t, std::int64_t,
                            std::uint32_t, std::uint32_t, std::uint32_t, bool>;

}  // namespace

struct Gemm::Impl {
  cublasLtHandle_t handle = nullptr;
  cublasHandle_t blas = nullptr;  // run_varying's
  std::map<ShapeKey, cublasLtMatmulAlgo_t> algos;
};

Gemm::Gemm() : impl_(new Impl) {
  cublasStatus_t s = cublasLtCreate(&impl_->handle);
  if (s != CUBLAS_STATUS_SUCCESS) init_error_ = "cublasLtCreate failed: " + status_text(s);
  s = cublasCreate(&impl_->blas);
  if (s != CUBLAS_STATUS_SUCCESS && init_error_.empty()) init_error_ = "cublasCreate failed: " + status_text(s);
}

Gemm::~Gemm() {
  if (impl_->handle != nullptr) cublasLtDestroy(impl_->handle);
  if (impl_->blas != nullptr) cublasDestroy(impl_->blas);
  delete impl_;
}

std::string Gemm::run_varying(const MatmulArgs& a, const Workspace& ws, cudaStream_t stream) {
  if (!init_error_.empty()) return init_error_;
  if (a.batch != 1) return "run_varying takes one product, not a batch of " + std::to_string(a.batch);
  if (a.m == 0 || a.n == 0) return "";
  if (a.k == 0) return run(a, ws, stream);  // C = beta C, as run does it
  for (std::int64_t v : {a.m, a.n, a.k, a.lda, a.ldb, a.ldc})
    if (v > INT_MAX) return "a size of " + std::to_string(v) + " is past cublasGemmEx's int";
  // The same column-major view as run's (gemm_layout.h): D[n x m] = op(B') op(A').
  const LtOperand lt_b = lt_first_operand(a.trans_b, a.n, a.k, a.ldb);
  const LtOperand lt_a = lt_second_operand(a.trans_a, a.m, a.k, a.lda);
  std::string error;
  auto check = [&](cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS && error.empty()) error = std::string(what) + ": " + status_text(s);
  };
  // One stream's products run one after another, so they may share its cuBLASLt workspace.
  check(cublasSetStream(impl_->blas, stream), "cublasSetStream");
  check(cublasSetWorkspace(impl_->blas, ws.gemm, ws.gemm_bytes), "cublasSetWorkspace");
  if (error.empty()) {
    const float alpha = a.alpha, beta = a.beta;
    check(cublasGemmEx(impl_->blas, lt_b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
                       lt_a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N, static_cast<int>(a.n), static_cast<int>(a.m),
                       static_cast<int>(a.k), &alpha, a.b.data, data_type(a.b.type), static_cast<int>(lt_b.ld),
                       a.a.data, data_type(a.a.type), static_cast<int>(lt_a.ld), &beta, a.c.data, data_type(a.c.type),
                       static_cast<int>(a.ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
  }
  if (!error.empty())
    error += " (m " + std::to_string(a.m) + ", n " + std::to_string(a.n) + ", k " + std::to_string(a.k) + ", " +
             to_string(a.a.type) + " -> " + to_string(a.c.type) + ")";
  return error;
}

std::string Gemm::run(const MatmulArgs& a, const Workspace& ws, cudaStream_t stream) {
  if (!init_error_.empty()) return init_error_;
  if (a.m == 0 || a.n == 0) return "";
  if (a.k == 0) {  // no products: C = beta C, as sgemm does
    for (std::int64_t i = 0; i < a.batch; ++i) {
      for (std::int64_t r = 0; r < a.m; ++r) {
        const Buffer row = a.c.slice(i * a.stride_c + r * a.ldc, a.n);
        if (a.beta == 0.0f)
          fill(row, 0.0, stream);
        else
          scale(row, a.beta, stream);
      }
    }
    return "";
  }
  const cudaDataType_t ab = data_type(a.a.type), ct = data_type(a.c.type);
  // cuBLASLt's view (column-major, gemm_layout.h): D[n x m] = op(B') op(A') with B' = our B, A' = our A.
  const LtOperand lt_b = lt_first_operand(a.trans_b, a.n, a.k, a.ldb);
  const LtOperand lt_a = lt_second_operand(a.trans_a, a.m, a.k, a.lda);
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t lb = nullptr, la = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  std::string error;
  auto check = [&](cublasStatus_t s, const char* what) {
    if (s != CUBLAS_STATUS_SUCCESS && error.empty()) error = std::string(what) + ": " + status_text(s);
    return s == CUBLAS_STATUS_SUCCESS;
  };
  const cublasOperation_t op_b = lt_b.transposed ? CUBLAS_OP_T : CUBLAS_OP_N,
                          op_a = lt_a.transposed ? CUBLAS_OP_T : CUBLAS_OP_N;
  check(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  if (error.empty()) {
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof(op_b)), "TRANSA");
    check(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)), "TRANSB");
  }
  check(cublasLtMatrixLayoutCreate(&lb, ab, lt_b.rows, lt_b.cols, lt_b.ld), "layout B");
  check(cublasLtMatrixLayoutCreate(&la, ab, lt_a.rows, lt_a.cols, lt_a.ld), "layout A");
  check(cublasLtMatrixLayoutCreate(&lc, ct, a.n, a.m, a.ldc), "layout C");
  if (error.empty() && a.batch > 1) {
    const int batch = static_cast<int>(a.batch);
    const std::int64_t strides[3] = {a.stride_b, a.stride_a, a.stride_c};
    cublasLtMatrixLayout_t layouts[3] = {lb, la, lc};
    for (int i = 0; i < 3; ++i) {
      check(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &batch, sizeof(batch)),
            "batch count");
      check(cublasLtMatrixLayoutSetAttribute(layouts[i], CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &strides[i],
                                             sizeof(strides[i])),
            "batch stride");
    }
  }
  // Batch items start stride elements apart: the alignment every item keeps.
  auto item_alignment = [&](const Buffer& m, std::int64_t stride) {
    std::uint32_t align = alignment(m.data);
    if (a.batch > 1)
      align = std::min(
          align, alignment(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(stride) * scalar_bytes(m.type))));
    return align;
  };
  const std::uint32_t align_b = item_alignment(a.b, a.stride_b), align_a = item_alignment(a.a, a.stride_a),
                      align_c = item_alignment(a.c, a.stride_c);
  const ShapeKey key{static_cast<int>(a.a.type),
                     static_cast<int>(a.c.type),
                     0,
                     a.trans_a,
                     a.trans_b,
                     a.m,
                     a.n,
                     a.k,
                     a.lda,
                     a.ldb,
                     a.ldc,
                     a.batch,
                     a.stride_a,
                     a.stride_b,
                     a.stride_c,
                     align_a,
                     align_b,
                     align_c,
                     a.beta != 0.0f};
  auto cached = impl_->algos.find(key);
  if (error.empty() && cached == impl_->algos.end()) {
    check(cublasLtMatmulPreferenceCreate(&pref), "preference");
    const std::uint64_t bytes = ws.gemm_bytes;
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)),
          "workspace");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b,
                                               sizeof(align_b)),
          "alignment A");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a,
                                               sizeof(align_a)),
          "alignment B");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                               sizeof(align_c)),
          "alignment C");
    check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                               sizeof(align_c)),
          "alignment D");
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (error.empty() &&
        check(cublasLtMatmulAlgoGetHeuristic(impl_->handle, op, lb, la, lc, lc, pref, 1, &result, &found),
              "cublasLtMatmulAlgoGetHeuristic")) {
      if (found == 0)
        error = "cuBLASLt has no algorithm for this product";
      else
        cached = impl_->algos.emplace(key, result.algo).first;
    }
  }
  if (error.empty()) {
    const float alpha = a.alpha, beta = a.beta;
    check(cublasLtMatmul(impl_->handle, op, &alpha, a.b.data, lb, a.a.data, la, &beta, a.c.data, lc, a.c.data, lc,
                         &cached->second, ws.gemm, ws.gemm_bytes, stream),
          "cublasLtMatmul");
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  for (cublasLtMatrixLayout_t l : {lb, la, lc})
    if (l != nullptr) cublasLtMatrixLayoutDestroy(l);
  if (op != nullptr) cublasLtMatmulDescDestroy(op);
  if (!error.empty())
    error += " (m " + std::to_string(a.m) + ", n " + std::to_string(a.n) + ", k " + std::to_string(a.k) + ", " +
             to_string(a.a.type) + " -> " + to_string(a.c.type) + ")";
  return error;
}

}  // namespace hzp::runtime::cuda
