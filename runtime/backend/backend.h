// The runtime's device abstraction, shaped after CUDA so a CUDA + NCCL backend can implement the same
// contract (runtime/README.md):
//   MemoryPool    device memory allocated once; named sub-allocations, accounted per category.
//   Stream        an in-order queue of work. On the CPU backend each stream is one worker thread (AsyncHZP's
//                 "dedicated background threads" are the communication streams); on GPU a cudaStream_t.
//   Event         recorded on a stream, waited on by another stream or by the host (cudaEventRecord /
//                 cudaStreamWaitEvent / cudaEventSynchronize).
//   Communicator  one per process group (and per stream that uses it): asynchronous all-gather,
//                 reduce-scatter, all-reduce, broadcast and all-to-all bound to a stream, each returning an
//                 Event as its handle. Every wait is bounded by a timeout: a dead peer is an error, not a hang.
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

#include "status.h"

namespace hzp::runtime {

// One allocation made up front; allocate() hands out 64-byte aligned pieces and never frees (the runtime
// sizes everything before the first step). Exhaustion is an error naming the category and the sizes.
class MemoryPool {
 public:
  explicit MemoryPool(std::int64_t capacity_bytes);
  ~MemoryPool();
  MemoryPool(const MemoryPool&) = delete;
  MemoryPool& operator=(const MemoryPool&) = delete;

  // Zero-initialised floats.
  Result<float*> allocate(const std::string& category, std::int64_t floats);
  std::int64_t capacity_bytes() const { return capacity_; }
  std::int64_t used_bytes() const { return used_; }
  // Bytes handed out per category (including alignment padding of each piece).
  const std::map<std::string, std::int64_t>& bytes_by_category() const { return by_category_; }

 private:
  std::int64_t capacity_ = 0;
  std::int64_t used_ = 0;
  char* base_ = nullptr;
  std::map<std::string, std::int64_t> by_category_;
};

// Completion flag with a status; set once, waited on by any number of threads.
class Event {
 public:
  Event() = default;
  // Marks the event complete (with `status`); wakes every waiter. Later calls are ignored.
  void complete(Status status);
  bool done() const;
  // Host-side wait. Returns the event's status, or a timeout error after `timeout`.
  Status synchronize(std::chrono::milliseconds timeout = std::chrono::hours(24)) const;

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  Status status_;
};
using EventPtr = std::shared_ptr<Event>;

// An in-order work queue executed by its own worker thread.
class Stream {
 public:
  explicit Stream(std::string name);
  ~Stream();  // finishes queued work, then joins the thread
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  const std::string& name() const { return name_; }
  // Queues `work`; it runs after everything queued before it. Returns an event completed when it has run
  // (with its status), or with the stream's earlier failure if the stream is poisoned (the work is skipped).
  EventPtr enqueue(std::function<Status()> work);
  // Work queued after this call starts only once `event` is complete; if the event failed, the stream is
  // poisoned with that failure. (cudaStreamWaitEvent.)
  void wait(EventPtr event);
  // An event completed when everything queued so far has run. (cudaEventRecord.)
  EventPtr record() { return enqueue([] { return Status::Ok(); }); }
  // Host waits for everything queued so far; returns the first failure of the stream, if any.
  Status synchronize();

 private:
  void run();
  std::string name_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<std::function<Status()>, EventPtr>> queue_;
  bool stopping_ = false;
  Status failure_;  // first failure (touched only by the worker thread)
  std::thread thread_;
};

enum class ReduceOp { kSum };

// Collectives over one process group, in the group's rank order (position 0..size-1). Blocking calls run on
// the calling thread; the *_async forms enqueue the blocking call on a stream and return its event. Buffers
// are floats; counts are elements. In-place use is allowed where noted.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;                             // my position in the group
  virtual int size() const = 0;
  virtual const std::vector<int>& global_ranks() const = 0;  // group position -> global rank
  virtual const std::string& name() const = 0;              // e.g. "param_shard[0,1,2,3]" for messages

  // out[size * count] = concatenation of every position's in[count], in position order. in may alias
  // out + rank() * count.
  virtual Status all_gather(const float* in, float* out, std::int64_t count) = 0;
  // in[size * count] summed over positions; out[count] = chunk rank() of the sum. out may alias
  // in + rank() * count.
  virtual Status reduce_scatter(const float* in, float* out, std::int64_t count) = 0;
  // In place: data[count] = sum over positions.
  virtual Status all_reduce(float* data, std::int64_t count) = 0;
  // In place: data[count] = root's data (root is a position).
  virtual Status broadcast(float* data, std::int64_t count, int root) = 0;
  // in[size * count]: chunk j goes to position j; out[size * count]: chunk j came from position j.
  virtual Status all_to_all(const float* in, float* out, std::int64_t count) = 0;
  // Variable sizes: send_counts[j] floats (consecutive in `in`) go to position j. On return recv_counts[j]
  // floats from position j are consecutive in `out` (resized). Counts are exchanged first.
  virtual Status all_to_all_v(const float* in, const std::vector<std::int64_t>& send_counts, std::vector<float>& out,
                              std::vector<std::int64_t>& recv_counts) = 0;
  virtual Status barrier() = 0;

  EventPtr all_gather_async(Stream& s, const float* in, float* out, std::int64_t count) {
    return s.enqueue([=, this] { return all_gather(in, out, count); });
  }
  EventPtr reduce_scatter_async(Stream& s, const float* in, float* out, std::int64_t count) {
    return s.enqueue([=, this] { return reduce_scatter(in, out, count); });
  }
  EventPtr all_reduce_async(Stream& s, float* data, std::int64_t count) {
    return s.enqueue([=, this] { return all_reduce(data, count); });
  }
  EventPtr broadcast_async(Stream& s, float* data, std::int64_t count, int root) {
    return s.enqueue([=, this] { return broadcast(data, count, root); });
  }
  EventPtr all_to_all_async(Stream& s, const float* in, float* out, std::int64_t count) {
    return s.enqueue([=, this] { return all_to_all(in, out, count); });
  }
};

}  // namespace hzp::runtime
