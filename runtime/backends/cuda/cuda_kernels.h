// The CUDA backend's kernels: runtime/device/kernels.h on one cudaStream_t. Simple, correct kernels first
// (elementwise.cu, norms.cu, attention.cu, moe.cu) and cuBLASLt for every product (gemm.cu); checked against
// the CPU reference by `HZP_KERNEL_BACKEND=cuda build/tests/hzp_kernel_tests`.
//
// Reserves: attention keeps none (the backward recomputes the probabilities from the log-sum-exp);
// cross-entropy keeps each row's log-sum-exp and token loss (2 x rows fp32). Reductions run in a different
// order than the CPU reference's; MoE and embedding orders are the reference's. An out-of-range token id
// or expert cannot be reported from the device: it reads as NaN in the output instead.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "runtime/device/kernels.h"

namespace hzp::runtime {

std::unique_ptr<Kernels> make_cuda_kernels(Stream& stream, cudaStream_t s);

}  // namespace hzp::runtime
