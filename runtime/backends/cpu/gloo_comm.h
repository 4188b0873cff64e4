// The CPU backend's communicator: Gloo over TCP, one Gloo context per (process group, stream), built by
// rendezvous through the hzp store (runtime/store). Every operation is bounded by `timeout`; a Gloo
// failure (peer closed the connection, timeout) becomes a Status naming the operation, the group and its
// global ranks, plus Gloo's message.
//
// Types: data moves (all-gather, broadcast, all-to-all(v)) take any buffer type. Sums: fp32, fp64 and int64
// natively; bf16 and fp16 are widened to fp32, summed, and rounded once (NCCL sums 16-bit types in their own
// precision hop by hop, so a GPU run's sums may differ in the last bits).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/communicator.h"
#include "runtime/device/registry.h"

namespace gloo::transport {
class Device;
}

namespace hzp::runtime {

struct GlooOptions {
  std::string interface_address = "127.0.0.1";  // address the TCP device binds to
  std::chrono::milliseconds timeout{60000};     // connect and every collective
};

// A TCP device shared by every context of this process. Sets SIGPIPE to ignored (see gloo_comm.cc).
Result<std::shared_ptr<gloo::transport::Device>> make_gloo_device(const GlooOptions& options);

// Creates the communicator of the group `ranks` (global ranks in group order; must contain `global_rank`).
// `key` must be the same on every member and unique per context (e.g. "param_shard/0/compute"): the store
// keys of its rendezvous are prefixed with it. Each communicator opens its own store
// connection for the rendezvous.
Result<std::unique_ptr<Communicator>> make_gloo_communicator(const StoreAddress& store, int global_rank,
                                                             const std::vector<int>& ranks, const std::string& key,
                                                             const std::string& display_name,
                                                             std::shared_ptr<gloo::transport::Device> device,
                                                             const GlooOptions& options);

}  // namespace hzp::runtime
