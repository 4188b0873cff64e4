// Backend availability for `hzp --version`.
#include "runtime/runtime_info.h"

#ifdef HZP_HAVE_CUDA
#include "runtime/cuda/cuda_probe.h"
#endif

namespace hzp::runtime {

std::string backend_description() {
#ifdef HZP_HAVE_CUDA
  return "cpu (Gloo), cuda (" + cuda::probe() + ")";
#else
  return "cpu (Gloo), cuda (not built: configure with HZP_CUDA=AUTO|ON where nvcc and NCCL exist)";
#endif
}

}  // namespace hzp::runtime
