// The CPU backend: host memory, one worker thread per stream, the reference kernels (cpu_kernels.h) and Gloo
// communicators over TCP (gloo_comm.h). It implements runtime/device/ and is registered as "cpu" in
// runtime/backends/registry.cc.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>

#include "runtime/device/device.h"
#include "runtime/device/registry.h"

namespace hzp::runtime {

// One allocation made up front; allocate() hands out kPoolAlignment-aligned pieces and never frees (the
// runtime sizes everything before the first step).
class CpuMemoryPool final : public MemoryPool {
 public:
  // `host_share_bytes`: what this rank may take of the host's memory (its share of memory_allowance()); a pool
  // past it is not allocated (overcommit would let the allocation succeed and the kernel's OOM killer end a
  // rank, or another process, mid-run) and every allocate() says why, as bad input.
  explicit CpuMemoryPool(std::int64_t capacity_bytes, double host_share_bytes = std::numeric_limits<double>::infinity(),
                         int host_ranks = 1);
  ~CpuMemoryPool() override;
  CpuMemoryPool(const CpuMemoryPool&) = delete;
  CpuMemoryPool& operator=(const CpuMemoryPool&) = delete;
  using MemoryPool::allocate;
  Result<Buffer> allocate(const std::string& category, std::int64_t count, ScalarType type) override;
  std::int64_t capacity_bytes() const override { return capacity_; }
  std::int64_t used_bytes() const override { return used_; }
  const std::map<std::string, std::int64_t>& bytes_by_category() const override { return by_category_; }

 private:
  std::int64_t capacity_ = 0;
  std::int64_t used_ = 0;
  char* base_ = nullptr;
  std::string refused_;  // why the pool was not allocated (past the host's share), or empty
  std::map<std::string, std::int64_t> by_category_;
};

// Completion flag with a status; set once, waited on by any number of threads.
class CpuEvent final : public Event {
 public:
  // Marks the event complete (with `status`); wakes every waiter. Later calls are ignored.
  void complete(Status status);
  bool done() const override;
  Status synchronize(std::chrono::milliseconds timeout = std::chrono::hours(24)) const override;
  double completed_at_us() const override;  // stamped by complete()

 private:
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  double completed_us_ = 0;
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

// The CPU device. Communicators rendezvous through the store of `options` (none without a store port).
Result<std::unique_ptr<Device>> make_cpu_device(const BackendOptions& options);

}  // namespace hzp::runtime
