// CUDA runtime + NCCL probe. Runtime API only: binaries linked to libcuda do not start without a driver.
#include "runtime/backends/cuda/cuda_probe.h"

#include <cuda_runtime.h>
#include <nccl.h>

namespace hzp::runtime::cuda {

std::string probe() {
  int runtime_version = 0, nccl_version = 0;
  cudaRuntimeGetVersion(&runtime_version);
  ncclGetVersion(&nccl_version);
  std::string out = "CUDA runtime " + std::to_string(runtime_version) + ", NCCL " + std::to_string(nccl_version);
  int count = 0;  // cudaGetDeviceCount leaves it unwritten on failure (e.g. no driver)
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0)
    return out + ", no usable GPU: " + (err != cudaSuccess ? cudaGetErrorName(err) : "0 devices");
  out += ", " + std::to_string(count) + " device" + (count > 1 ? "s" : "");
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
    out += std::string(": ") + prop.name + " (sm_" + std::to_string(prop.major) + std::to_string(prop.minor) + ")";
  return out;
}

}  // namespace hzp::runtime::cuda
