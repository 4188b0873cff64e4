// The CPU backend (cpu_device.h): the memory pool, events and streams, and the device that makes them, its
// kernels (cpu_kernels.h) and its Gloo communicators (gloo_comm.h; created lazily, so a device without a
// store is enough for kernels, streams and memory).
#include "runtime/backends/cpu/cpu_device.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <utility>

#include "runtime/backends/cpu/cpu_kernels.h"
#include "runtime/backends/cpu/gloo_comm.h"
#include "runtime/device/communicator.h"
#include "runtime/device/kernels.h"
#include "shared/base/memory_limits.h"

namespace hzp::runtime {

// --- MemoryPool ------------------------------------------------------------------------------------------

CpuMemoryPool::CpuMemoryPool(std::int64_t capacity_bytes, double host_share_bytes, int host_ranks) {
  // A negative capacity is an empty pool. Pieces are whole multiples of kPoolAlignment bytes
  // (pool_piece_bytes), so used_ stays aligned.
  capacity_ = capacity_bytes > 0 ? capacity_bytes : 0;
  if (capacity_ == 0) return;
  if (static_cast<double>(capacity_) > host_share_bytes) {
    constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
    char why[400];
    std::snprintf(why, sizeof why,
                  "the host memory pool needs %.2f GiB per rank: %d rank%s on this host would take %.2f GiB of the "
                  "%.2f GiB this machine allows (3/4 of its memory, or its limits); train fewer ranks per host, or "
                  "a smaller model, micro-batch or sequence",
                  static_cast<double>(capacity_) / GiB, host_ranks, host_ranks > 1 ? "s" : "",
                  static_cast<double>(capacity_) * host_ranks / GiB, host_share_bytes * host_ranks / GiB);
    refused_ = why;
    return;
  }
  base_ = static_cast<char*>(
      ::operator new(static_cast<std::size_t>(capacity_), std::align_val_t(kPoolAlignment), std::nothrow));
  // A failed allocation leaves base_ null: allocate() then reports it (a constructor cannot return a Status).
  if (base_ != nullptr) std::memset(base_, 0, static_cast<std::size_t>(capacity_));
}

CpuMemoryPool::~CpuMemoryPool() {
  if (base_ != nullptr) ::operator delete(base_, std::align_val_t(kPoolAlignment));
}

Result<Buffer> CpuMemoryPool::allocate(const std::string& category, std::int64_t count, ScalarType type) {
  if (count < 0)
    return Status::InvalidInput("memory pool: category '" + category + "' asked for a negative size (" +
                                std::to_string(count) + " elements)");
  if (!refused_.empty()) return Status::InvalidInput(refused_);
  if (capacity_ > 0 && base_ == nullptr)
    return Status::Internal("memory pool: the host could not allocate the pool's " + std::to_string(capacity_) +
                            " bytes (category '" + category + "' asked for " + std::to_string(count) + " " +
                            to_string(type) + " elements)");
  const std::int64_t free_bytes = capacity_ - used_;
  const std::int64_t requested = pool_piece_bytes(count, type);  // -1: not representable
  if (requested < 0 || requested > free_bytes)
    return Status::InvalidInput(
        "memory pool exhausted: category '" + category + "' requested " +
        (requested < 0 ? std::string("an impossible size") : std::to_string(requested) + " bytes") + " (" +
        std::to_string(count) + " " + to_string(type) + " elements) but only " + std::to_string(free_bytes) + " of " +
        std::to_string(capacity_) + " bytes are free");
  // A zero-size piece is a valid pointer into (or one past) the pool, never dereferenced.
  alignas(kPoolAlignment) static std::uint64_t empty_piece = 0;
  void* piece = base_ != nullptr ? static_cast<void*>(base_ + used_) : static_cast<void*>(&empty_piece);
  used_ += requested;
  by_category_[category] += requested;
  return Buffer{piece, count, type};
}

// --- Event -----------------------------------------------------------------------------------------------

void CpuEvent::complete(Status status) {
  const double now =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
  {
    // The lock orders the status write before any waiter's read of it, and makes "first call wins" atomic.
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    completed_us_ = now;
    status_ = std::move(status);
  }
  cv_.notify_all();  // every host and stream waiting on this event
}

double CpuEvent::completed_at_us() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_ ? completed_us_ : std::nan("");
}

bool CpuEvent::done() const {
  std::lock_guard<std::mutex> lock(mu_);  // done_ is written by the completing thread
  return done_;
}

Status CpuEvent::synchronize(std::chrono::milliseconds timeout) const {
  // The predicate re-checks done_ under the lock, so a completion between the check and the wait is not lost.
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [this] { return done_; }))
    return Status::Internal("event not complete after " + std::to_string(timeout.count()) + " ms (timed out)");
  return status_;
}

// --- Stream ----------------------------------------------------------------------------------------------

CpuStream::CpuStream(std::string name) : name_(std::move(name)) {
  thread_ = std::thread([this] { run(); });
}

CpuStream::~CpuStream() {
  {
    // Under the lock, so the worker sees stopping_ either before it sleeps or through the notification.
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // The worker drains the queue before returning: every event handed out completes, nothing waits forever.
  if (thread_.joinable()) thread_.join();
}

EventPtr CpuStream::submit(std::function<Status()> work) {
  auto event = std::make_shared<CpuEvent>();
  {
    // The queue is shared with the worker thread; the lock keeps submissions in one order.
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(work), event);
  }
  cv_.notify_one();  // the worker sleeps while the queue is empty
  return event;
}

void CpuStream::wait(EventPtr event) {
  if (event == nullptr) return;
  // Runs on this stream's worker: blocks it until the event completes and hands on the event's status, which
  // poisons the stream when the event failed. Events made by submit always complete (a poisoned stream
  // completes its events with the failure, a destroyed one drains first), so this never waits forever on
  // another stream's event. The loop re-arms the wait: Event::synchronize's bound is only a default.
  submit([event = std::move(event)]() -> Status {
    while (true) {
      Status s = event->synchronize(std::chrono::hours(1));
      if (event->done()) return s;
    }
  });
}

Status CpuStream::synchronize() {
  // The recorded event completes after everything before it, with the stream's first failure if poisoned.
  // The loop re-arms the host wait (the bound is only a default; the event always completes).
  EventPtr done = record();
  while (true) {
    Status s = done->synchronize(std::chrono::hours(1));
    if (done->done()) return s;
  }
}

void CpuStream::run() {
  while (true) {
    std::pair<std::function<Status()>, std::shared_ptr<CpuEvent>> item;
    {
      // Sleeps until there is work or the stream is being destroyed; the lock guards the shared queue.
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      item = std::move(queue_.front());
      queue_.pop_front();
    }
    if (!failure_.ok()) {
      item.second->complete(failure_);  // poisoned: skip the work, hand on the first failure
      continue;
    }
    Status status;
    try {
      status = item.first ? item.first() : Status::Ok();
    } catch (const std::exception& e) {
      status = Status::Internal("stream '" + name_ + "': work item threw: " + e.what());
    } catch (...) {
      status = Status::Internal("stream '" + name_ + "': work item threw a non-standard exception");
    }
    item.first = nullptr;  // release captures before signalling completion (a waiter may free what they hold)
    if (!status.ok()) failure_ = status;
    item.second->complete(std::move(status));
  }
}

// --- Device ----------------------------------------------------------------------------------------------

namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(BackendOptions options) : options_(std::move(options)) {}
  std::string description() const override {
    return "cpu (host memory, a thread per stream, reference kernels, Gloo over TCP)";
  }
  std::unique_ptr<MemoryPool> create_pool(std::int64_t capacity_bytes) override {
    const int host_ranks = std::max(1, options_.local_world_size);
    return std::make_unique<CpuMemoryPool>(capacity_bytes, memory_allowance() / host_ranks, host_ranks);
  }
  std::unique_ptr<Stream> create_stream(const std::string& name) override { return std::make_unique<CpuStream>(name); }
  std::unique_ptr<Kernels> create_kernels(Stream& stream) override { return make_cpu_kernels(stream); }
  // Gloo calls are blocking: issued from the stream's worker, they run in stream order, so one context per
  // (group, stream) is all the binding a stream needs.
  Result<std::unique_ptr<Communicator>> create_communicator(const std::vector<int>& ranks, const std::string& key,
                                                            const std::string& display_name, Stream&) override {
    if (options_.store.port == 0)
      return Status::InvalidInput("communicator " + display_name +
                                  ": no store: this device was made without a rendezvous store "
                                  "(BackendOptions.store.port is 0)");
    HZP_ASSIGN_OR_RETURN(std::shared_ptr<gloo::transport::Device> gloo, gloo_device());
    // The rendezvous keys live under hzp/comm/ in the store, apart from the trainer's own keys.
    return make_gloo_communicator(options_.store, options_.global_rank, ranks, "hzp/comm/" + key, display_name,
                                  std::move(gloo), gloo_options());
  }

 private:
  GlooOptions gloo_options() const {
    GlooOptions o;
    o.interface_address = options_.interface_address;
    o.timeout = options_.timeout;
    return o;
  }

  // The TCP device, made by the first communicator that asks (a device for kernels alone never binds a
  // socket). A failure is returned and not kept: the next call tries again.
  Result<std::shared_ptr<gloo::transport::Device>> gloo_device() {
    // Communicators may be created from several threads; the lock makes exactly one TCP device per CpuDevice.
    std::lock_guard<std::mutex> lock(gloo_mu_);
    if (gloo_ == nullptr) {
      HZP_ASSIGN_OR_RETURN(gloo_, make_gloo_device(gloo_options()));
    }
    return gloo_;
  }

  const BackendOptions options_;
  std::mutex gloo_mu_;
  std::shared_ptr<gloo::transport::Device> gloo_;  // guarded by gloo_mu_
};

}  // namespace

Result<std::unique_ptr<Device>> make_cpu_device(const BackendOptions& options) {
  // The kernels' matmuls run on OpenBLAS's threads: one setting for the whole process.
  if (options.host_threads > 0) openblas_set_num_threads(options.host_threads);
  return std::unique_ptr<Device>(std::make_unique<CpuDevice>(options));
}

}  // namespace hzp::runtime
