// The runtime's device interface: what an executor needs from a machine to run the schedule IR, shaped after
// CUDA so that every backend (runtime/backends/<name>/) implements the same contract and the executor
// (runtime/train/) and the models (runtime/model/) never fork:
//   Device        makes the rest: one memory pool, streams, kernels bound to a stream, and a communicator per
//                 (process group, stream).
//   MemoryPool    device memory allocated once; typed pieces (Buffer: pointer, count, ScalarType), accounted
//                 per category ("params", "grads", "optimizer", "activations", "pool:param_gather", ...).
//   Stream        an in-order queue. submit(work) runs `work` in stream order: the CPU backend runs it on the
//                 stream's worker thread when its turn comes; a GPU backend runs it on the host at once, and
//                 `work` enqueues kernels / NCCL calls on the stream (its Status is the launch's). Either
//                 way the returned Event completes when the work has, with its status.
//   Event         recorded on a stream, waited on by another stream (Stream::wait, cudaStreamWaitEvent) or by
//                 the host (synchronize, with a timeout).
//   Kernels       (kernels.h) every numeric operation of the models and the optimizer, issued on one stream.
//   Communicator  (communicator.h) collectives over one process group, issued from its stream's work.
//
// Device memory is not host memory: code outside a backend moves data between them only through
// Kernels::copy_from_host / copy_to_host, and never dereferences Buffer::data.
//
// Errors are values (Status). Once a work item on a stream fails, the stream is poisoned: later items are
// skipped, and every event recorded after the failure completes with the failure, so nothing waits forever.
#pragma once

#include <cassert>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/numeric.h"
#include "shared/base/status.h"

namespace hzp::runtime {

class Communicator;
class Kernels;

// A typed view of device memory: `count` elements of `type` at `data`. Views are cheap to copy; slicing is
// pointer arithmetic, valid for device pointers too.
struct Buffer {
  void* data = nullptr;
  std::int64_t count = 0;
  ScalarType type = ScalarType::kFp32;

  std::int64_t bytes() const { return count * scalar_bytes(type); }
  bool empty() const { return count == 0; }
  // Elements [offset, offset + n) of this view (n = -1: to the end).
  Buffer slice(std::int64_t offset, std::int64_t n = -1) const {
    assert(offset >= 0 && offset <= count && (n < 0 || offset + n <= count));
    return Buffer{static_cast<char*>(data) + offset * scalar_bytes(type), n < 0 ? count - offset : n, type};
  }
  // The raw pointer, for backends only (in device memory on a GPU backend).
  template <typename T>
  T* as() const {
    return static_cast<T*>(data);
  }
};

class MemoryPool {
 public:
  virtual ~MemoryPool() = default;
  // `count` zero-initialised elements of `type`, aligned to alignment() bytes. Exhaustion is an error naming
  // the category and the sizes.
  virtual Result<Buffer> allocate(const std::string& category, std::int64_t count, ScalarType type) = 0;
  virtual std::int64_t capacity_bytes() const = 0;
  virtual std::int64_t used_bytes() const = 0;
  // Bytes handed out per category (including alignment padding of each piece).
  virtual const std::map<std::string, std::int64_t>& bytes_by_category() const = 0;

  Result<Buffer> allocate(const std::string& category, std::int64_t count, DType dtype) {
    return allocate(category, count, scalar_type(dtype));
  }
};

// Every piece of a pool starts on this boundary (a cache line; cudaMalloc gives 256, so a GPU pool keeps
// its base aligned and rounds pieces to this).
inline constexpr std::int64_t kPoolAlignment = 64;
std::int64_t pool_piece_bytes(std::int64_t count, ScalarType type);  // count elements, rounded up

// A pool that hands out no memory and only adds up what was asked (null Buffers of the asked sizes): run the
// allocations once against it to learn the capacity, then again against the device's pool.
class SizingPool final : public MemoryPool {
 public:
  using MemoryPool::allocate;
  Result<Buffer> allocate(const std::string& category, std::int64_t count, ScalarType type) override;
  std::int64_t capacity_bytes() const override { return used_; }
  std::int64_t used_bytes() const override { return used_; }
  const std::map<std::string, std::int64_t>& bytes_by_category() const override { return by_category_; }

 private:
  std::int64_t used_ = 0;
  std::map<std::string, std::int64_t> by_category_;
};

class Event {
 public:
  virtual ~Event() = default;
  virtual bool done() const = 0;
  // Host-side wait. Returns the event's status, or a timeout error after `timeout`.
  virtual Status synchronize(std::chrono::milliseconds timeout = std::chrono::hours(24)) const = 0;
  // When the event completed, on the host's steady clock in microseconds (the clock every trace uses), once
  // done(); NaN where the backend cannot tell. Traces time each op between two events.
  virtual double completed_at_us() const { return std::nan(""); }
};
using EventPtr = std::shared_ptr<Event>;

class Stream {
 public:
  virtual ~Stream() = default;
  virtual const std::string& name() const = 0;
  // Queues `work` after everything queued before (see the top of this file for what "runs" means per
  // backend). Returns an event completed when it has run (with its status), or with the stream's earlier
  // failure if the stream is poisoned (the work is skipped).
  virtual EventPtr submit(std::function<Status()> work) = 0;
  // Work submitted after this call starts only once `event` is complete; if the event failed, the stream is
  // poisoned with that failure. (cudaStreamWaitEvent.)
  virtual void wait(EventPtr event) = 0;
  // An event completed when everything submitted so far has run. (cudaEventRecord.)
  virtual EventPtr record() = 0;
  // Host waits for everything submitted so far; returns the first failure of the stream, if any.
  virtual Status synchronize() = 0;
};

// A machine to run on: its kind ("cpu", "cuda"), memory, streams, kernels and communicators.
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string description() const = 0;
  virtual std::unique_ptr<MemoryPool> create_pool(std::int64_t capacity_bytes) = 0;
  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  // The kernels issued on `stream` (the stream outlives them). Calls are made from that stream's work, or
  // from the host while nothing else runs on the stream.
  virtual std::unique_ptr<Kernels> create_kernels(Stream& stream) = 0;
  // The communicator of the group `ranks` (global ranks in group order; contains this rank), for use from
  // `stream`. `key` is the same on every member and unique per (group, stream).
  virtual Result<std::unique_ptr<Communicator>> create_communicator(const std::vector<int>& ranks,
                                                                    const std::string& key,
                                                                    const std::string& display_name,
                                                                    Stream& stream) = 0;
};

}  // namespace hzp::runtime
