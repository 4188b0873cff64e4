// The CPU backend's communicator: Gloo over TCP, one Gloo context per (process group, stream), built by
// rendezvous through the hzp store (runtime/store). Every operation is bounded by `timeout`; a Gloo
// failure (peer closed the connection, timeout) becomes a Status naming the operation, the group and its
// global ranks, plus Gloo's message.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/backend/device.h"
#include "runtime/store/store.h"

namespace gloo::transport {
class Device;
}

namespace hzp::runtime {

// Where this process's store is and how to authenticate.
struct StoreAddress {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string token;
};

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

// The CPU device: host memory, one worker thread per stream, Gloo communicators through the store.
struct CpuDeviceOptions {
  StoreAddress store;
  int global_rank = 0;
  GlooOptions gloo;
};
Result<std::unique_ptr<Device>> make_cpu_device(const CpuDeviceOptions& options);

}  // namespace hzp::runtime
