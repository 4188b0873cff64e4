// Per-expert products of a grouped expert GEMM (expert_products.h), written as Kernels::linear, linear_dx
// and linear_dw write theirs.
#include "runtime/device/expert_products.h"

#include <algorithm>
#include <string>

namespace hzp::runtime {
namespace {

// Offsets are in rows of a and c; `rows` is how many rows both hold.
Status check_offsets(const std::int64_t* offsets, std::int64_t groups, std::int64_t rows, const char* kernel) {
  for (std::int64_t g = 0; g <= groups; ++g) {
    const std::int64_t lo = g == 0 ? 0 : offsets[g - 1];
    if (offsets[g] < lo || offsets[g] > rows)
      return Status::Internal(std::string(kernel) + ": expert offset " + std::to_string(g) + " is " +
                              std::to_string(offsets[g]) + ", outside [" + std::to_string(lo) + ", " +
                              std::to_string(rows) + "] (offsets must not decrease and stay within the " +
                              std::to_string(rows) + " rows)");
  }
  return Status::Ok();
}

// One product per expert with rows: make(g, first, n_rows) for each, once the offsets are checked.
template <typename Make>
Result<std::vector<MatmulArgs>> per_expert(const ExpertGemmArgs& e, const std::int64_t* offsets, std::int64_t rows,
                                           const char* kernel, Make make) {
  HZP_RETURN_IF_ERROR(check_offsets(offsets, e.groups, rows, kernel));
  std::vector<MatmulArgs> products;
  for (std::int64_t g = 0; g < e.groups; ++g) {
    const std::int64_t first = offsets[g], n_rows = offsets[g + 1] - first;
    if (n_rows > 0) products.push_back(make(g, first, n_rows));
  }
  return products;
}

}  // namespace

Result<std::vector<MatmulArgs>> expert_products(const ExpertGemmArgs& e, const std::int64_t* offsets) {
  const std::int64_t in_w = e.trans_w ? e.w_cols : e.w_rows, out_w = e.trans_w ? e.w_rows : e.w_cols;
  const std::int64_t rows = std::min(e.a.count / in_w, e.c.count / out_w);
  return per_expert(e, offsets, rows, "expert_gemm", [&](std::int64_t g, std::int64_t first, std::int64_t n_rows) {
    MatmulArgs p;
    p.trans_b = e.trans_w;
    p.m = n_rows, p.n = out_w, p.k = in_w;
    p.a = e.a.slice(first * in_w, n_rows * in_w), p.lda = in_w;
    p.b = e.w.slice(g * e.w_stride, e.w_rows * e.w_cols), p.ldb = e.w_cols;
    p.c = e.c.slice(first * out_w, n_rows * out_w), p.ldc = out_w;
    p.beta = e.accumulate ? 1.0f : 0.0f;
    return p;
  });
}

Result<std::vector<MatmulArgs>> expert_dw_products(const ExpertGemmArgs& e, const std::int64_t* offsets) {
  const std::int64_t rows = e.a.count / e.w_rows;
  return per_expert(e, offsets, rows, "expert_gemm_dw", [&](std::int64_t g, std::int64_t first, std::int64_t n_rows) {
    MatmulArgs p;
    p.trans_a = true;
    p.m = e.w_rows, p.n = e.w_cols, p.k = n_rows;
    p.a = e.a.slice(first * e.w_rows, n_rows * e.w_rows), p.lda = e.w_rows;
    p.b = e.c.slice(first * e.w_cols, n_rows * e.w_cols), p.ldb = e.w_cols;
    p.c = e.w.slice(g * e.w_stride, e.w_rows * e.w_cols), p.ldc = e.w_cols;
    p.beta = 1.0f;
    return p;
  });
}

}  // namespace hzp::runtime
