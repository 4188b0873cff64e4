// The CUDA + NCCL backend: one GPU per rank (local rank modulo the visible GPUs), a pool carved from one
// cudaMalloc, a CUDA stream per IR stream with events for cross-stream waits, the CUDA kernels
// (cuda_kernels.h), and NCCL communicators — or, where ranks share a GPU (NCCL refuses two ranks on one
// device), the host-staged path: device <-> pinned host copies around the CPU backend's Gloo communicators.
// Registered as "cuda" in runtime/backends/registry.cc when nvcc and NCCL were found at configure time.
#pragma once

#include <memory>

#include "runtime/device/device.h"
#include "runtime/device/registry.h"

namespace hzp::runtime {

// Fails (kInvalidInput, naming the CUDA error) where no GPU can be used, e.g. "no usable GPU:
// cudaErrorInsufficientDriver" on a machine without a driver.
Result<std::unique_ptr<Device>> make_cuda_device(const BackendOptions& options);

}  // namespace hzp::runtime
