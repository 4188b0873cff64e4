// The CUDA backend's device (cuda_device.h): memory pool, streams and events on the CUDA runtime API, and
// the device that makes them, its kernels and its communicators (NCCL, or host-staged Gloo where ranks share
// a GPU). Only the runtime API is used: a binary linked to the driver API does not start without a GPU.
//
// Streams: submit(work) runs `work` on the calling thread at once (it enqueues kernels and NCCL calls on the
// stream) and records an event after it. A failure of the work, or one found later (a kernel fault, a
// communicator aborted by the watchdog), poisons the stream: later work is skipped and every later event and
// synchronisation returns that failure, so nothing waits forever.
#include "runtime/backends/cuda/cuda_device.h"

#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/backends/cuda/cuda_comm.h"
#include "runtime/backends/cuda/cuda_kernels.h"
#include "runtime/device/communicator.h"
#include "runtime/device/kernels.h"

namespace hzp::runtime {
namespace {

using Clock = std::chrono::steady_clock;

std::string cuda_error(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

double host_now_us() {
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

// --- Memory pool ------------------------------------------------------------------------------------------------

// One cudaMalloc made up front, zeroed; allocate() hands out kPoolAlignment-aligned pieces and never frees.
class CudaMemoryPool final : public MemoryPool {
 public:
  explicit CudaMemoryPool(std::int64_t capacity_bytes) {
    capacity_ = capacity_bytes > 0 ? capacity_bytes : 0;
    if (capacity_ == 0) return;
    cudaError_t e = cudaMalloc(&base_, static_cast<std::size_t>(capacity_));
    if (e == cudaSuccess) e = cudaMemset(base_, 0, static_cast<std::size_t>(capacity_));
    if (e != cudaSuccess) {
      error_ = cuda_error(e);
      if (base_ != nullptr) cudaFree(base_);
      base_ = nullptr;
      cudaGetLastError();  // a failed allocation is not sticky; keep the context usable
    }
  }
  ~CudaMemoryPool() override {
    if (base_ != nullptr) cudaFree(base_);
  }
  CudaMemoryPool(const CudaMemoryPool&) = delete;
  CudaMemoryPool& operator=(const CudaMemoryPool&) = delete;

  using MemoryPool::allocate;
  Result<Buffer> allocate(const std::string& category, std::int64_t count, ScalarType type) override {
    if (count < 0)
      return Status::InvalidInput("memory pool: category '" + category + "' asked for a negative size (" +
                                  std::to_string(count) + " elements)");
    if (capacity_ > 0 && base_ == nullptr)
      return Status::Internal("memory pool: cudaMalloc of the pool's " + std::to_string(capacity_) + " bytes failed (" +
                              error_ + "); category '" + category + "' asked for " + std::to_string(count) +
                              " elements");
    const std::int64_t bytes = pool_piece_bytes(count, type);
    const std::int64_t free_bytes = capacity_ - used_;
    if (bytes < 0 || bytes > free_bytes)
      return Status::InvalidInput("memory pool exhausted: category '" + category + "' requested " +
                                  (bytes < 0 ? std::string("an impossible size") : std::to_string(bytes) + " bytes") +
                                  " (" + std::to_string(count) + " " + to_string(type) + " elements) but only " +
                                  std::to_string(free_bytes) + " of " + std::to_string(capacity_) + " bytes are free");
    void* piece = base_ != nullptr ? static_cast<char*>(base_) + used_ : nullptr;
    used_ += bytes;
    by_category_[category] += bytes;
    return Buffer{piece, count, type};
  }
  std::int64_t capacity_bytes() const override { return capacity_; }
  std::int64_t used_bytes() const override { return used_; }
  const std::map<std::string, std::int64_t>& bytes_by_category() const override { return by_category_; }

 private:
  std::int64_t capacity_ = 0, used_ = 0;
  void* base_ = nullptr;
  std::string error_;
  std::map<std::string, std::int64_t> by_category_;
};

// --- Events and streams -----------------------------------------------------------------------------------------

// The time base of event timestamps: an event recorded and waited for at device creation, and the host's
// steady clock at that moment (µs).
struct TimeBase {
  cudaEvent_t event = nullptr;
  double host_us = 0;
};

// The poison of a stream: shared with its events (so an event recorded after a failure reports it) and with
// the watchdog (which poisons a stream whose communicator it aborted).
struct Poison {
  std::mutex mu;
  Status status;
  void set(const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    if (status.ok()) status = s;
  }
  Status get() {
    std::lock_guard<std::mutex> lock(mu);
    return status;
  }
};

// Polls until `event` has completed or `deadline` passes; a stream's failure ends the wait at once.
Status wait_event(cudaEvent_t event, const std::shared_ptr<Poison>& poison, Clock::time_point deadline,
                  const std::string& what) {
  for (int spins = 0;; ++spins) {
    if (Status p = poison->get(); !p.ok()) return p;
    const cudaError_t e = cudaEventQuery(event);
    if (e == cudaSuccess) return Status::Ok();
    if (e != cudaErrorNotReady) return Status::Internal(what + ": " + cuda_error(e));
    if (Clock::now() >= deadline) return Status::Internal(what + ": not complete before the deadline (timed out)");
    // Spin briefly (most waits are short), then sleep: a host wait should not take a core from the ranks.
    if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

class CudaEvent final : public Event {
 public:
  CudaEvent(cudaEvent_t event, std::shared_ptr<Poison> poison, Status status, const TimeBase* base)
      : event_(event), poison_(std::move(poison)), status_(std::move(status)), base_(base) {}
  ~CudaEvent() override {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  bool done() const override {
    if (!status_.ok() || !poison_->get().ok()) return true;
    const cudaError_t e = cudaEventQuery(event_);
    return e != cudaErrorNotReady;
  }
  Status synchronize(std::chrono::milliseconds timeout = std::chrono::hours(24)) const override {
    if (!status_.ok()) return status_;
    return wait_event(event_, poison_, Clock::now() + timeout, "event");
  }
  double completed_at_us() const override {
    float ms = 0;
    if (event_ == nullptr || base_ == nullptr || cudaEventElapsedTime(&ms, base_->event, event_) != cudaSuccess) {
      cudaGetLastError();
      return std::nan("");
    }
    return base_->host_us + 1000.0 * static_cast<double>(ms);
  }
  cudaEvent_t handle() const { return event_; }
  const Status& status() const { return status_; }

 private:
  cudaEvent_t event_;
  std::shared_ptr<Poison> poison_;
  Status status_;
  const TimeBase* base_;
};

class CudaStream final : public Stream {
 public:
  CudaStream(std::string name, const TimeBase* base) : name_(std::move(name)), base_(base) {
    const cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (e != cudaSuccess) poison_->set(Status::Internal("stream '" + name_ + "': " + cuda_error(e)));
  }
  ~CudaStream() override {
    if (stream_ != nullptr) {
      cudaStreamSynchronize(stream_);  // finish queued work before anything it uses goes away
      cudaStreamDestroy(stream_);
    }
  }
  CudaStream(const CudaStream&) = delete;
  CudaStream& operator=(const CudaStream&) = delete;

  const std::string& name() const override { return name_; }

  EventPtr submit(std::function<Status()> work) override {
    if (Status p = poison_->get(); !p.ok()) return failed(p);
    Status status;
    try {
      status = work ? work() : Status::Ok();
    } catch (const std::exception& e) {
      status = Status::Internal("stream '" + name_ + "': work item threw: " + e.what());
    }
    if (!status.ok()) {
      poison_->set(status);
      return failed(status);
    }
    return record();
  }

  void wait(EventPtr event) override {
    if (event == nullptr) return;
    auto* e = dynamic_cast<CudaEvent*>(event.get());
    if (e == nullptr) {  // not one of ours: wait on the host (correct, if slower)
      if (Status s = event->synchronize(); !s.ok()) poison_->set(s);
      return;
    }
    if (!e->status().ok()) return poison_->set(e->status());
    const cudaError_t r = cudaStreamWaitEvent(stream_, e->handle(), 0);
    if (r != cudaSuccess)
      poison_->set(Status::Internal("stream '" + name_ + "' waiting on an event: " + cuda_error(r)));
  }

  EventPtr record() override {
    if (Status p = poison_->get(); !p.ok()) return failed(p);
    cudaEvent_t event = nullptr;
    cudaError_t e = cudaEventCreate(&event);  // with timing: traces read the ops' start and end from events
    if (e == cudaSuccess) e = cudaEventRecord(event, stream_);
    if (e != cudaSuccess) {
      if (event != nullptr) cudaEventDestroy(event);
      const Status s = Status::Internal("stream '" + name_ + "': recording an event: " + cuda_error(e));
      poison_->set(s);
      return failed(s);
    }
    return std::make_shared<CudaEvent>(event, poison_, Status::Ok(), base_);
  }

  Status synchronize() override {
    EventPtr done = record();
    const Status s = done->synchronize();
    if (!s.ok()) return s;
    // A kernel fault surfaces here even when the event itself completed.
    const cudaError_t e = cudaStreamQuery(stream_);
    if (e != cudaSuccess && e != cudaErrorNotReady) {
      const Status f = Status::Internal("stream '" + name_ + "': " + cuda_error(e));
      poison_->set(f);
      return f;
    }
    return poison_->get();
  }

  cudaStream_t handle() const { return stream_; }
  const std::shared_ptr<Poison>& poison() const { return poison_; }

 private:
  EventPtr failed(const Status& s) { return std::make_shared<CudaEvent>(nullptr, poison_, s, base_); }

  std::string name_;
  const TimeBase* base_;
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<Poison> poison_ = std::make_shared<Poison>();
};

// --- The device --------------------------------------------------------------------------------------------------

class CudaDevice final : public Device {
 public:
  CudaDevice(const BackendOptions& options, int device, bool shared, std::string name)
      : options_(options), device_(device), shared_(shared), name_(std::move(name)) {
    cudaEventCreate(&base_.event);
    cudaEventRecord(base_.event, nullptr);
    cudaEventSynchronize(base_.event);
    base_.host_us = host_now_us();
  }
  ~CudaDevice() override {
    comms_.reset();  // communicators (and their watchdog) before the streams they enqueue on
    if (base_.event != nullptr) cudaEventDestroy(base_.event);
  }

  std::string description() const override {
    return "cuda:" + std::to_string(device_) + " (" + name_ + "; " +
           (shared_ ? "ranks share this GPU: host-staged Gloo collectives" : "NCCL collectives") + ")";
  }
  std::unique_ptr<MemoryPool> create_pool(std::int64_t capacity_bytes) override {
    return std::make_unique<CudaMemoryPool>(capacity_bytes);
  }
  std::unique_ptr<Stream> create_stream(const std::string& name) override {
    return std::make_unique<CudaStream>(name, &base_);
  }
  std::unique_ptr<Kernels> create_kernels(Stream& stream) override {
    auto* s = dynamic_cast<CudaStream*>(&stream);
    return make_cuda_kernels(stream, s != nullptr ? s->handle() : nullptr);
  }
  Result<std::unique_ptr<Communicator>> create_communicator(const std::vector<int>& ranks, const std::string& key,
                                                            const std::string& display_name, Stream& stream) override {
    auto* s = dynamic_cast<CudaStream*>(&stream);
    if (s == nullptr) return Status::Internal("cuda communicator " + display_name + ": not a CUDA stream");
    if (comms_ == nullptr) {
      HZP_ASSIGN_OR_RETURN(comms_, CudaCommFactory::create(options_, device_, shared_));
    }
    return comms_->create(ranks, key, display_name, s->handle(),
                          [poison = s->poison()](const Status& failure) { poison->set(failure); });
  }

 private:
  BackendOptions options_;
  int device_;
  bool shared_;
  std::string name_;
  TimeBase base_;
  std::unique_ptr<CudaCommFactory> comms_;
};

}  // namespace

Result<std::unique_ptr<Device>> make_cuda_device(const BackendOptions& options) {
  int count = 0;  // cudaGetDeviceCount leaves it unwritten on failure (no driver)
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return Status::InvalidInput(std::string("no usable GPU: ") +
                                (e != cudaSuccess ? cudaGetErrorName(e) : "0 devices"));
  }
  const int device = options.local_rank % count;
  if (const cudaError_t s = cudaSetDevice(device); s != cudaSuccess)
    return Status::InvalidInput("cudaSetDevice(" + std::to_string(device) + "): " + cuda_error(s));
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device);
  // NCCL refuses two ranks of one communicator on one GPU: where this host's ranks outnumber its GPUs, the
  // collectives go through the host (HZP_CUDA_COLLECTIVES=staged forces that path, =nccl forbids it).
  bool shared = options.local_world_size > count;
  if (const char* mode = std::getenv("HZP_CUDA_COLLECTIVES")) {
    const std::string m = mode;
    if (m == "staged") {
      shared = true;
    } else if (m == "nccl") {
      if (shared)
        return Status::InvalidInput("HZP_CUDA_COLLECTIVES=nccl: " + std::to_string(options.local_world_size) +
                                    " ranks on this host share " + std::to_string(count) +
                                    " GPU(s), which NCCL refuses; use staged (or fewer ranks)");
    } else if (!m.empty()) {
      return Status::InvalidInput("HZP_CUDA_COLLECTIVES must be \"nccl\" or \"staged\", got '" + m.substr(0, 20) + "'");
    }
  }
  const std::string name = std::string(prop.name) + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
                           ", " + std::to_string(prop.totalGlobalMem >> 30) + " GiB";
  return std::unique_ptr<Device>(std::make_unique<CudaDevice>(options, device, shared, name));
}

}  // namespace hzp::runtime
