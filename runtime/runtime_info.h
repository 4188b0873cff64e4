// Which runtime backends this build has, for `hzp --version`.
#pragma once

#include <string>

namespace hzp::runtime {

// The registered backends (runtime/backends/registry.cc) and the CUDA toolchain's state, e.g.
// "backends: cpu; CUDA + NCCL toolchain: CUDA runtime 13000, NCCL 22803, no usable GPU: ..." or
// "backends: cpu; CUDA + NCCL toolchain: not built (configure with HZP_CUDA=AUTO|ON where nvcc and NCCL exist)".
std::string backend_description();

}  // namespace hzp::runtime
