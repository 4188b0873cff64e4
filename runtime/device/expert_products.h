// A grouped expert GEMM (kernels.h, ExpertGemmArgs) as one ordinary product per expert, once the experts' row
// offsets are known on the host. A backend whose matrix library takes each product's sizes from the host
// (cuBLAS) runs a grouped GEMM this way; products of experts that received no rows are left out (their c rows
// do not exist, and W_g += 0 changes nothing). Plain C++, so the CPU tests check it against expert_gemm itself.
#pragma once

#include <cstdint>
#include <vector>

#include "runtime/device/kernels.h"
#include "shared/base/status.h"

namespace hzp::runtime {

// expert_gemm:    c_g (+)= a_g op(W_g) for each expert g with rows.
// expert_gemm_dw: W_g += a_g^T c_g     for each expert g with rows.
// `offsets` holds args.groups + 1 host values; they must start at 0 or more, never decrease and end within
// the rows of a and c, else the error names the offending offset.
Result<std::vector<MatmulArgs>> expert_products(const ExpertGemmArgs& args, const std::int64_t* offsets);
Result<std::vector<MatmulArgs>> expert_dw_products(const ExpertGemmArgs& args, const std::int64_t* offsets);

}  // namespace hzp::runtime
