// How gemm.cu hands a row-major product to cuBLASLt, which is column-major: row-major C[m x n] = op(A) op(B)
// is column-major C'[n x m] = op(B') op(A'), where B' and A' are the same memory read column-major, i.e. the
// transposes of our B and A. Plain C++ (no CUDA) so the shapes are tested on machines without a GPU.
#pragma once

#include <cstdint>

namespace hzp::runtime::cuda {

// One operand as cuBLASLt sees it: a column-major rows x cols matrix with leading dimension ld, multiplied
// transposed when `transposed`.
struct LtOperand {
  std::uint64_t rows = 0, cols = 0;
  std::int64_t ld = 0;
  bool transposed = false;
};

// cuBLASLt's first operand (our B): stored row-major as k x n (n x k when trans_b), so read column-major it
// has n rows (k when trans_b).
inline LtOperand lt_first_operand(bool trans_b, std::int64_t n, std::int64_t k, std::int64_t ldb) {
  return {static_cast<std::uint64_t>(trans_b ? k : n), static_cast<std::uint64_t>(trans_b ? n : k), ldb, trans_b};
}

// cuBLASLt's second operand (our A): stored row-major as m x k (k x m when trans_a), so k rows (m when trans_a).
inline LtOperand lt_second_operand(bool trans_a, std::int64_t m, std::int64_t k, std::int64_t lda) {
  return {static_cast<std::uint64_t>(trans_a ? m : k), static_cast<std::uint64_t>(trans_a ? k : m), lda, trans_a};
}

}  // namespace hzp::runtime::cuda
