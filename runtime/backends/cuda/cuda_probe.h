// Runtime-API probe of the CUDA + NCCL backend: versions and visible devices, never aborting.
#pragma once

#include <string>

namespace hzp::runtime::cuda {

// e.g. "CUDA runtime 13000, NCCL 22803, 1 device: NVIDIA H100 80GB HBM3 (sm_90)" or, without a driver,
// "CUDA runtime 13000, NCCL 22803, no usable GPU: cudaErrorInsufficientDriver".
std::string probe();

}  // namespace hzp::runtime::cuda
