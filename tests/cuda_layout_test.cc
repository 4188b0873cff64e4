// The CUDA backend hands row-major products to cuBLASLt as column-major ones (runtime/backends/cuda/gemm_layout.h).
// The first GPU run found those layouts transposed (cuBLASLt refused every transposed product), so they are
// checked here without a GPU: a column-major product computed exactly as cuBLASLt defines it, on the operands as
// gemm_layout.h describes them, must equal the row-major product, for every transpose combination.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "runtime/backends/cuda/gemm_layout.h"

namespace {

using hzp::runtime::cuda::LtOperand;

// Element (r, c) of op(X) for a column-major operand X as cuBLASLt reads it.
double lt_element(const std::vector<double>& mem, const LtOperand& x, std::int64_t r, std::int64_t c) {
  if (x.transposed) std::swap(r, c);
  REQUIRE(r < static_cast<std::int64_t>(x.rows));
  REQUIRE(c < static_cast<std::int64_t>(x.cols));
  return mem[static_cast<std::size_t>(r + c * x.ld)];
}

}  // namespace

TEST_CASE("cuda gemm layouts: cuBLASLt's column-major product is the row-major product", "[cuda][gemm]") {
  const std::int64_t m = 3, n = 5, k = 7;
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      CAPTURE(trans_a, trans_b);
      // Row-major storage: A is m x k (k x m when trans_a), B is k x n (n x k when trans_b), padded by 2.
      const std::int64_t lda = (trans_a ? m : k) + 2, ldb = (trans_b ? k : n) + 2;
      std::vector<double> a(static_cast<std::size_t>((trans_a ? k : m) * lda)),
          b(static_cast<std::size_t>((trans_b ? n : k) * ldb));
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = static_cast<double>((i * 7) % 11) - 5.0;
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = static_cast<double>((i * 5) % 13) - 6.0;
      auto a_at = [&](std::int64_t i, std::int64_t p) { return trans_a ? a[p * lda + i] : a[i * lda + p]; };
      auto b_at = [&](std::int64_t p, std::int64_t j) { return trans_b ? b[j * ldb + p] : b[p * ldb + j]; };

      const LtOperand lt_b = hzp::runtime::cuda::lt_first_operand(trans_b, n, k, ldb);
      const LtOperand lt_a = hzp::runtime::cuda::lt_second_operand(trans_a, m, k, lda);
      CHECK(lt_b.ld >= static_cast<std::int64_t>(lt_b.rows));  // what cuBLASLt requires of a layout
      CHECK(lt_a.ld >= static_cast<std::int64_t>(lt_a.rows));
      // D (column-major n x m, ld n) = op(B') [n x k] op(A') [k x m]; read row-major it is C [m x n].
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          double lt = 0.0, reference = 0.0;
          for (std::int64_t p = 0; p < k; ++p) {
            lt += lt_element(b, lt_b, j, p) * lt_element(a, lt_a, p, i);
            reference += a_at(i, p) * b_at(p, j);
          }
          CHECK(lt == reference);
        }
      }
    }
  }
}
