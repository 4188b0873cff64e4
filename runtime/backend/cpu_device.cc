// The CPU backend's memory pool, events and streams (device.h).
#include "runtime/backend/device.h"

#include <cstring>
#include <exception>
#include <limits>
#include <new>
#include <utility>

namespace hzp::runtime {

namespace {

constexpr std::int64_t kAlignment = 64;

std::int64_t round_up(std::int64_t bytes) {
  return (bytes + kAlignment - 1) / kAlignment * kAlignment;
}

}  // namespace

// --- MemoryPool ------------------------------------------------------------------------------------------

CpuMemoryPool::CpuMemoryPool(std::int64_t capacity_bytes) {
  // A negative capacity is an empty pool. Pieces are whole multiples of 64 bytes, so used_ stays aligned.
  capacity_ = capacity_bytes > 0 ? capacity_bytes : 0;
  if (capacity_ == 0) return;
  base_ = static_cast<char*>(
      ::operator new(static_cast<std::size_t>(capacity_), std::align_val_t(kAlignment), std::nothrow));
  // A failed allocation leaves base_ null: allocate() then reports it (a constructor cannot return a Status).
  if (base_ != nullptr) std::memset(base_, 0, static_cast<std::size_t>(capacity_));
}

CpuMemoryPool::~CpuMemoryPool() {
  if (base_ != nullptr) ::operator delete(base_, std::align_val_t(kAlignment));
}

Result<Buffer> CpuMemoryPool::allocate(const std::string& category, std::int64_t count, DType dtype) {
  const std::int64_t element = dtype_bytes(dtype);
  if (count < 0)
    return Status::InvalidInput("memory pool: category '" + category + "' asked for a negative size (" +
                                std::to_string(count) + " elements)");
  if (capacity_ > 0 && base_ == nullptr)
    return Status::Internal("memory pool: the host could not allocate the pool's " + std::to_string(capacity_) +
                            " bytes (category '" + category + "' asked for " + std::to_string(count) + " elements)");
  const std::int64_t free_bytes = capacity_ - used_;
  const std::int64_t max_count = (std::numeric_limits<std::int64_t>::max() - kAlignment) / element;
  const std::int64_t requested =
      count <= max_count ? round_up(count * element) : std::numeric_limits<std::int64_t>::max();
  if (count > max_count || requested > free_bytes)
    return Status::InvalidInput(
        "memory pool exhausted: category '" + category + "' requested " +
        (count > max_count ? std::string("an impossible size") : std::to_string(requested) + " bytes") + " (" +
        std::to_string(count) + " " + to_string(dtype) + " elements) but only " + std::to_string(free_bytes) + " of " +
        std::to_string(capacity_) + " bytes are free");
  // A zero-size piece is a valid pointer into (or one past) the pool, never dereferenced.
  alignas(kAlignment) static float empty_piece = 0.0f;
  void* piece = base_ != nullptr ? static_cast<void*>(base_ + used_) : static_cast<void*>(&empty_piece);
  used_ += requested;
  by_category_[category] += requested;
  return Buffer{piece, count, dtype};
}

// --- Event -----------------------------------------------------------------------------------------------

void CpuEvent::complete(Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    done_ = true;
    status_ = std::move(status);
  }
  cv_.notify_all();
}

bool CpuEvent::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

Status CpuEvent::synchronize(std::chrono::milliseconds timeout) const {
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
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

EventPtr CpuStream::submit(std::function<Status()> work) {
  auto event = std::make_shared<CpuEvent>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.emplace_back(std::move(work), event);
  }
  cv_.notify_one();
  return event;
}

void CpuStream::wait(EventPtr event) {
  if (event == nullptr) return;
  // Runs on this stream's worker: blocks it until the event completes and hands on the event's status, which
  // poisons the stream when the event failed. Events made by enqueue always complete (a poisoned stream
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
    item.first = nullptr;  // release captures before signalling completion
    if (!status.ok()) failure_ = status;
    item.second->complete(std::move(status));
  }
}

}  // namespace hzp::runtime
