// The runtime's backends, by name: one table (runtime/backends/registry.cc, above the backends it names)
// with a line per backend folder under runtime/backends/. `hzp train --backend NAME` and the backend-parameterised
// tests pick from it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/device.h"
#include "shared/base/status.h"

namespace hzp::runtime {

// Where this process's rendezvous store is and how to authenticate (runtime/store).
struct StoreAddress {
  std::string host = "127.0.0.1";
  std::uint16_t port = 0;
  std::string token;
};

// What every backend is made from. A device made without a store (port 0) has no communicators: enough for
// kernels, streams and memory (the kernel tests).
struct BackendOptions {
  StoreAddress store;
  int global_rank = 0;
  int local_rank = 0;                           // which accelerator of the host (GPU backends)
  int local_world_size = 1;                     // ranks on this host (GPU backends: do they share a device?)
  std::string interface_address = "127.0.0.1";  // address the communicators' transport binds to
  std::chrono::milliseconds timeout{60000};     // every collective and rendezvous wait
  int host_threads = 0;                         // host threads for kernels (CPU backend: OpenBLAS); 0 = leave as is
};

struct BackendEntry {
  const char* name;
  const char* description;
  Result<std::unique_ptr<Device>> (*make)(const BackendOptions& options);
};

// The backends this build has, in registration order (cpu first).
const std::vector<BackendEntry>& backends();
// The backend `name`, or kInvalidInput listing the built ones (the message does not repeat the name).
Result<std::unique_ptr<Device>> make_device(const std::string& name, const BackendOptions& options);

}  // namespace hzp::runtime
