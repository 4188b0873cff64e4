// Backend availability for `hzp --version`.
#include "runtime/runtime_info.h"

#include "runtime/device/registry.h"

#ifdef HZP_HAVE_CUDA
#include "runtime/backends/cuda/cuda_probe.h"
#endif

namespace hzp::runtime {

std::string backend_description() {
  std::string names;
  for (const BackendEntry& b : backends()) names += (names.empty() ? "" : ", ") + std::string(b.name);
#ifdef HZP_HAVE_CUDA
  return "backends: " + names + "; CUDA + NCCL toolchain: " + cuda::probe();
#else
  return "backends: " + names +
         "; CUDA + NCCL toolchain: not built (configure with HZP_CUDA=AUTO|ON where nvcc and NCCL exist)";
#endif
}

}  // namespace hzp::runtime
