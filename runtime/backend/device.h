// The runtime's device interface: what an executor needs from a machine to run the schedule IR, shaped after
// CUDA so that the CPU backend (cpu_device.*, Gloo collectives) and a CUDA + NCCL backend implement the same
// contract and the executor (runtime/train/) never forks:
//   Device        makes the rest: one memory pool, streams, and a communicator per (process group, stream).
//   MemoryPool    device memory allocated once; typed pieces (Buffer: pointer, count, dtype), accounted per
//                 category ("params", "grads", "optimizer", "pool:param_gather", ...).
//   Stream        an in-order queue. submit(work) runs `work` in stream order: the CPU backend runs it on the
//                 stream's worker thread when its turn comes; a GPU backend runs it on the host at once, and
//                 `work` enqueues kernels / NCCL calls on the stream (its Status is the launch's). Either
//                 way the returned Event completes when the work has, with its status.
//   Event         recorded on a stream, waited on by another stream (Stream::wait, cudaStreamWaitEvent) or by
//                 the host (synchronize, with a timeout).
//   Communicator  collectives over one process group, issued from the work of the stream it was made for
//                 (a CUDA backend binds its ncclComm to that stream): all-gather, reduce-scatter, all-reduce,
//                 broadcast, all-to-all(v), barrier, on typed buffers. Every wait is bounded by a timeout: a
//                 dead peer is an error, not a hang.
//
// Errors are values (Status). Once a work item on a stream fails, the stream is poisoned: later items are
// skipped, and every event recorded after the failure completes with the failure, so nothing waits forever.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "shared/schedule.h"
#include "shared/status.h"

namespace hzp::runtime {

// A typed piece of device memory.
struct Buffer {
  void* data = nullptr;
  std::int64_t count = 0;  // elements
  DType dtype = DType::kFp32;
  std::int64_t bytes() const { return count * dtype_bytes(dtype); }
  float* f32() const { return dtype == DType::kFp32 ? static_cast<float*>(data) : nullptr; }
};

class MemoryPool {
 public:
  virtual ~MemoryPool() = default;
  // `count` zero-initialised elements of `dtype`, 64-byte aligned. Exhaustion is an error naming the
  // category and the sizes.
  virtual Result<Buffer> allocate(const std::string& category, std::int64_t count, DType dtype) = 0;
  virtual std::int64_t capacity_bytes() const = 0;
  virtual std::int64_t used_bytes() const = 0;
  // Bytes handed out per category (including alignment padding of each piece).
  virtual const std::map<std::string, std::int64_t>& bytes_by_category() const = 0;
  // fp32 convenience: the pointer of allocate(category, floats, kFp32).
  Result<float*> allocate(const std::string& category, std::int64_t floats) {
    HZP_ASSIGN_OR_RETURN(Buffer b, allocate(category, floats, DType::kFp32));
    return b.f32();
  }
};

class Event {
 public:
  virtual ~Event() = default;
  virtual bool done() const = 0;
  // Host-side wait. Returns the event's status, or a timeout error after `timeout`.
  virtual Status synchronize(std::chrono::milliseconds timeout = std::chrono::hours(24)) const = 0;
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
  EventPtr enqueue(std::function<Status()> work) { return submit(std::move(work)); }
};

enum class ReduceOp { kSum };

// Collectives over one process group, in the group's rank order (position 0..size-1), called from the work
// of the stream the communicator was made for. Counts are elements of `dtype`. In-place use is allowed where
// noted. Backends may support fewer dtypes for reductions (the CPU backend sums fp32 only) and say so.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;  // my position in the group
  virtual int size() const = 0;
  virtual const std::vector<int>& global_ranks() const = 0;  // group position -> global rank
  virtual const std::string& name() const = 0;               // e.g. "param_shard[0,1,2,3]" for messages

  // out[size * count] = concatenation of every position's in[count], in position order. in may alias
  // out + rank() * count.
  virtual Status all_gather(const void* in, void* out, std::int64_t count, DType dtype) = 0;
  // in[size * count] summed over positions; out[count] = chunk rank() of the sum. out may alias
  // in + rank() * count.
  virtual Status reduce_scatter(const void* in, void* out, std::int64_t count, DType dtype) = 0;
  // In place: data[count] = sum over positions.
  virtual Status all_reduce(void* data, std::int64_t count, DType dtype) = 0;
  // In place: data[count] = root's data (root is a position).
  virtual Status broadcast(void* data, std::int64_t count, int root, DType dtype) = 0;
  // in[size * count]: chunk j goes to position j; out[size * count]: chunk j came from position j.
  virtual Status all_to_all(const void* in, void* out, std::int64_t count, DType dtype) = 0;
  // Variable sizes (fp32): send_counts[j] floats (consecutive in `in`) go to position j. On return
  // recv_counts[j] floats from position j are consecutive in `out` (resized). Counts are exchanged first.
  virtual Status all_to_all_v(const float* in, const std::vector<std::int64_t>& send_counts, std::vector<float>& out,
                              std::vector<std::int64_t>& recv_counts) = 0;
  virtual Status barrier() = 0;

  // fp32 forms.
  Status all_gather(const float* in, float* out, std::int64_t count) {
    return all_gather(in, out, count, DType::kFp32);
  }
  Status reduce_scatter(const float* in, float* out, std::int64_t count) {
    return reduce_scatter(in, out, count, DType::kFp32);
  }
  Status all_reduce(float* data, std::int64_t count) { return all_reduce(data, count, DType::kFp32); }
  Status broadcast(float* data, std::int64_t count, int root) { return broadcast(data, count, root, DType::kFp32); }
  Status all_to_all(const float* in, float* out, std::int64_t count) {
    return all_to_all(in, out, count, DType::kFp32);
  }

  // The collective submitted on `s`, returning its event.
  EventPtr all_gather_async(Stream& s, const float* in, float* out, std::int64_t count) {
    return s.submit([=, this] { return all_gather(in, out, count); });
  }
  EventPtr reduce_scatter_async(Stream& s, const float* in, float* out, std::int64_t count) {
    return s.submit([=, this] { return reduce_scatter(in, out, count); });
  }
  EventPtr all_reduce_async(Stream& s, float* data, std::int64_t count) {
    return s.submit([=, this] { return all_reduce(data, count); });
  }
  EventPtr broadcast_async(Stream& s, float* data, std::int64_t count, int root) {
    return s.submit([=, this] { return broadcast(data, count, root); });
  }
  EventPtr all_to_all_async(Stream& s, const float* in, float* out, std::int64_t count) {
    return s.submit([=, this] { return all_to_all(in, out, count); });
  }
};

// A machine to run on: its kind ("cpu", "cuda"), memory, streams and communicators.
class Device {
 public:
  virtual ~Device() = default;
  virtual std::string description() const = 0;
  virtual std::unique_ptr<MemoryPool> create_pool(std::int64_t capacity_bytes) = 0;
  virtual std::unique_ptr<Stream> create_stream(const std::string& name) = 0;
  // The communicator of the group `ranks` (global ranks in group order; contains this rank), for use from
  // `stream`. `key` is the same on every member and unique per (group, stream).
  virtual Result<std::unique_ptr<Communicator>> create_communicator(const std::vector<int>& ranks,
                                                                    const std::string& key,
                                                                    const std::string& display_name,
                                                                    Stream& stream) = 0;
};

// --- The CPU implementation ------------------------------------------------------------------------------

// One allocation made up front; allocate() hands out 64-byte aligned pieces and never frees (the runtime
// sizes everything before the first step).
class CpuMemoryPool final : public MemoryPool {
 public:
  explicit CpuMemoryPool(std::int64_t capacity_bytes);
  ~CpuMemoryPool() override;
  CpuMemoryPool(const CpuMemoryPool&) = delete;
  CpuMemoryPool& operator=(const CpuMemoryPool&) = delete;
  using MemoryPool::allocate;
  Result<Buffer> allocate(const std::string& category, std::int64_t count, DType dtype) override;
  std::int64_t capacity_bytes() const override { return capacity_; }
  std::int64_t used_bytes() const override { return used_; }
  const std::map<std::string, std::int64_t>& bytes_by_category() const override { return by_category_; }

 private:
  std::int64_t capacity_ = 0;
  std::int64_t used_ = 0;
  char* base_ = nullptr;
  std::map<std::string, std::int64_t> by_category_;
};

// Completion flag with a status; set once, waited on by any number of threads.
class CpuEvent final : public Event {
 public:
  // Marks the event complete (with `status`); wakes every waiter. Later calls are ignored.
  void complete(Status status);
  bool done() const override;
  Status synchronize(std::chrono::milliseconds timeout = std::chrono::hours(24)) const override;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};

// An in-order work queue executed by its own worker thread (AsyncHZP's "dedicated background threads" are
// the communication streams).
class CpuStream final : public Stream {
 public:
  explicit CpuStream(std::string name);
  ~CpuStream() override;  // finishes queued work, then joins the thread
  CpuStream(const CpuStream&) = delete;
  CpuStream& operator=(const CpuStream&) = delete;

  const std::string& name() const override { return name_; }
  EventPtr submit(std::function<Status()> work) override;
  void wait(EventPtr event) override;
  EventPtr record() override {
    return submit([] { return Status::Ok(); });
  }
  Status synchronize() override;

 private:
  void run();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<Status()>, std::shared_ptr<CpuEvent>>> queue_;
  bool stopping_ = false;
  Status failure_;  // first failure (touched only by the worker thread)
  std::thread thread_;
};

}  // namespace hzp::runtime
