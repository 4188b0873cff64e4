// The CUDA backend's communicators (cuda_comm.cc), made by one factory per device:
//   NCCL            one ncclComm per (process group, stream), made with ncclCommInitRankConfig (non-blocking)
//                   from an ncclUniqueId that the group's first member publishes in the store under the
//                   communicator's key; every collective is enqueued on the communicator's stream. A watchdog
//                   thread polls ncclCommGetAsyncError and each collective's completion: an asynchronous error
//                   or a collective older than the timeout (a dead or hung peer) aborts the communicator
//                   (ncclCommAbort) and poisons its stream with a message naming the op and the group.
//   host-staged     where ranks share a GPU: each collective copies its input to pinned host memory, runs the
//                   CPU backend's Gloo communicator on it, and copies the result back (synchronising the
//                   stream: slow, for tests on one GPU).
// all_to_all_v reads its two count buffers (device memory) back to the host before the exchange: NCCL's
// send/receive take host counts. That is one small device-to-host copy and wait per MoE exchange.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/communicator.h"
#include "runtime/device/registry.h"

namespace hzp::runtime {

class CudaCommFactory {
 public:
  // `device`: the CUDA device of this rank; `staged`: ranks share it (host-staged collectives).
  static Result<std::unique_ptr<CudaCommFactory>> create(const BackendOptions& options, int device, bool staged);
  virtual ~CudaCommFactory() = default;
  // `on_failure` poisons the communicator's stream when a failure is found after the collective was enqueued.
  virtual Result<std::unique_ptr<Communicator>> create(const std::vector<int>& ranks, const std::string& key,
                                                       const std::string& display_name, cudaStream_t stream,
                                                       std::function<void(const Status&)> on_failure) = 0;
};

}  // namespace hzp::runtime
