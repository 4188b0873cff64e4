// The backend table (registry.h): adding a backend is its folder plus one line here.
#include "runtime/device/registry.h"

#include "runtime/backends/cpu/cpu_device.h"
#ifdef HZP_HAVE_CUDA_BACKEND
#include "runtime/backends/cuda/cuda_device.h"
#endif

namespace hzp::runtime {

const std::vector<BackendEntry>& backends() {
  // clang-format off
  static const std::vector<BackendEntry> table = {
    {"cpu", "host memory, a worker thread per stream, the reference kernels (OpenBLAS), Gloo over TCP", make_cpu_device},
#ifdef HZP_HAVE_CUDA_BACKEND
    {"cuda", "one GPU per rank: cudaMalloc'd pool, CUDA streams and events, CUDA kernels, NCCL", make_cuda_device},
#endif
  };
  // clang-format on
  return table;
}

Result<std::unique_ptr<Device>> make_device(const std::string& name, const BackendOptions& options) {
  std::string known;
  for (const BackendEntry& b : backends()) {
    if (name == b.name) return b.make(options);
    known += (known.empty() ? "" : ", ") + std::string(b.name);
  }
  return Status::InvalidInput("no such backend in this build (it has: " + known + ")");
}

}  // namespace hzp::runtime
