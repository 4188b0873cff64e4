// The CPU backend's kernels: the reference implementation of runtime/device/kernels.h. fp32 matmuls go to
// OpenBLAS sgemm; 16-bit matmuls widen their operands to fp32, multiply with sgemm and round the result once;
// every other kernel is a plain loop in fp32 (fp64 where the interface says) that rounds each result to its
// buffer's type with round-to-nearest-even (runtime/device/numeric.h). In fp32 the arithmetic, and its order,
// is what the runtime computed before the kernel interface existed, so fp32 training is bit-identical to it.
//
// Reserves: attention keeps its probabilities (fp32 [batch x heads x seq x seq]) and cross-entropy its
// softmax (fp32 [rows x vocab]), so the backward reads them instead of recomputing. Given an empty reserve,
// attention's backward recomputes its probabilities from the saved log-sum-exp, as flash attention does.
#pragma once

#include <memory>

#include "runtime/device/kernels.h"

namespace hzp::runtime {

std::unique_ptr<Kernels> make_cpu_kernels(Stream& stream);

}  // namespace hzp::runtime
