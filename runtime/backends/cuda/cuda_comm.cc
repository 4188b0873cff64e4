// The CUDA backend's communicators (cuda_comm.h): NCCL with a watchdog, and the host-staged Gloo path.
#include "runtime/backends/cuda/cuda_comm.h"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <utility>

#include "runtime/backends/cpu/gloo_comm.h"
#include "runtime/store/store.h"

namespace hzp::runtime {
namespace {

using Clock = std::chrono::steady_clock;

std::string cuda_error(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

std::string ranks_string(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s + "]";
}

Result<ncclDataType_t> nccl_type(ScalarType t) {
  switch (t) {
    case ScalarType::kFp32:
      return ncclFloat32;
    case ScalarType::kBf16:
      return ncclBfloat16;
    case ScalarType::kFp16:
      return ncclFloat16;
    case ScalarType::kFp64:
      return ncclFloat64;
    case ScalarType::kInt32:
      return ncclInt32;
    case ScalarType::kInt64:
      return ncclInt64;
  }
  return Status::Internal("no NCCL type for this buffer");
}

std::string hex(const void* data, std::size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

bool unhex(const std::string& s, void* data, std::size_t n) {
  if (s.size() != 2 * n) return false;
  auto* p = static_cast<unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) {
    auto nibble = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
    const int hi = nibble(s[2 * i]), lo = nibble(s[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    p[i] = static_cast<unsigned char>(hi * 16 + lo);
  }
  return true;
}

// Sizes every collective checks, whatever the transport (the CPU backend's rules, communicator.h).
struct Checks {
  std::string where;  // " on NAME (global ranks [..]) failed: "
  int size = 1;
  Status bad(const char* op, const std::string& why) const {
    return Status::InvalidInput(std::string(op) + where + why);
  }
  Status same_type(const char* op, const Buffer& a, const Buffer& b) const {
    if (a.type == b.type) return Status::Ok();
    return bad(op, std::string("in is ") + to_string(a.type) + " but out is " + to_string(b.type));
  }
  Status chunks(const char* op, const Buffer& whole, const Buffer& part) const {
    if (whole.count == part.count * size) return Status::Ok();
    return bad(op, std::to_string(whole.count) + " elements are not " + std::to_string(size) + " x " +
                       std::to_string(part.count));
  }
  Status summable(const char* op, ScalarType t) const {
    if (t != ScalarType::kInt32) return Status::Ok();
    return Status::Unimplemented(std::string(op) + where +
                                 "int32 sums are not supported (fp32, fp64, int64, bf16, fp16)");
  }
};

// Reads the two int64 count buffers of an all_to_all_v to the host (device memory: a copy and a wait on the
// stream) and checks them against the buffers.
Status read_counts(cudaStream_t stream, const Checks& c, const Buffer& in, const Buffer& send_counts, const Buffer& out,
                   const Buffer& recv_counts, std::vector<std::int64_t>& sends, std::vector<std::int64_t>& recvs) {
  constexpr const char* op = "all_to_all_v";
  for (const Buffer* b : {&send_counts, &recv_counts})
    if (b->type != ScalarType::kInt64 || b->count != c.size)
      return c.bad(op, "the count buffers must hold " + std::to_string(c.size) + " int64 elements");
  HZP_RETURN_IF_ERROR(c.same_type(op, in, out));
  sends.assign(static_cast<std::size_t>(c.size), 0);
  recvs.assign(static_cast<std::size_t>(c.size), 0);
  cudaError_t e = cudaMemcpyAsync(sends.data(), send_counts.data, sends.size() * 8, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(recvs.data(), recv_counts.data, recvs.size() * 8, cudaMemcpyDeviceToHost, stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream);  // the counts are produced by kernels on this stream
  if (e != cudaSuccess) return Status::Internal(std::string(op) + c.where + "reading the counts: " + cuda_error(e));
  std::int64_t send_total = 0, recv_total = 0;
  for (int j = 0; j < c.size; ++j) {
    if (sends[j] < 0 || recvs[j] < 0) return c.bad(op, "a negative count for position " + std::to_string(j));
    send_total += sends[j];
    recv_total += recvs[j];
  }
  if (send_total > in.count)
    return c.bad(op, "the send counts add up to " + std::to_string(send_total) + ", more than in's " +
                         std::to_string(in.count) + " elements");
  if (recv_total > out.count)
    return c.bad(op, "the receive counts add up to " + std::to_string(recv_total) +
                         ", more than the capacity of out (" + std::to_string(out.count) + " elements)");
  return Status::Ok();
}

// --- NCCL -------------------------------------------------------------------------------------------------------

class NcclCommunicator;

// Polls every NCCL communicator of the process for asynchronous errors and for collectives running past the
// timeout; either aborts that communicator and poisons its stream.
class Watchdog {
 public:
  Watchdog(int device, std::chrono::milliseconds timeout) : device_(device), timeout_(timeout) {
    thread_ = std::thread([this] { run(); });
  }
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void add(NcclCommunicator* c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.push_back(c);
  }
  void remove(NcclCommunicator* c) {
    std::lock_guard<std::mutex> lock(mu_);
    comms_.erase(std::remove(comms_.begin(), comms_.end(), c), comms_.end());
  }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  void run();
  int device_;
  std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<NcclCommunicator*> comms_;
  std::thread thread_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, std::vector<int> ranks, std::string name, cudaStream_t stream,
                   std::function<void(const Status&)> on_failure, Watchdog& watchdog)
      : comm_(comm),
        rank_(rank),
        ranks_(std::move(ranks)),
        name_(std::move(name)),
        stream_(stream),
        on_failure_(std::move(on_failure)),
        watchdog_(watchdog) {
    checks_.where = " on " + name_ + " (global ranks " + ranks_string(ranks_) + ") failed: ";
    checks_.size = static_cast<int>(ranks_.size());
    watchdog_.add(this);
  }
  ~NcclCommunicator() override {
    watchdog_.remove(this);
    // Abort, not destroy: destroying waits for the peers, which may be gone.
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
    std::lock_guard<std::mutex> lock(pending_mu_);
    for (auto& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : spare_) cudaEventDestroy(e);
    if (barrier_ != nullptr) cudaFree(barrier_);
  }

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }

  Status all_gather(const Buffer& in, const Buffer& out) override {
    constexpr const char* op = "all_gather";
    HZP_RETURN_IF_ERROR(checks_.same_type(op, in, out));
    HZP_RETURN_IF_ERROR(checks_.chunks(op, out, in));
    if (in.count == 0) return Status::Ok();
    HZP_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(in.type));
    return enqueue(
        op, [&] { return ncclAllGather(in.data, out.data, static_cast<std::size_t>(in.count), t, comm_, stream_); });
  }
  Status reduce_scatter(const Buffer& in, const Buffer& out) override {
    constexpr const char* op = "reduce_scatter";
    HZP_RETURN_IF_ERROR(checks_.same_type(op, in, out));
    HZP_RETURN_IF_ERROR(checks_.chunks(op, in, out));
    HZP_RETURN_IF_ERROR(checks_.summable(op, in.type));
    if (out.count == 0) return Status::Ok();
    HZP_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(in.type));
    return enqueue(op, [&] {
      return ncclReduceScatter(in.data, out.data, static_cast<std::size_t>(out.count), t, ncclSum, comm_, stream_);
    });
  }
  Status all_reduce(const Buffer& data) override {
    constexpr const char* op = "all_reduce";
    HZP_RETURN_IF_ERROR(checks_.summable(op, data.type));
    if (data.count == 0) return Status::Ok();
    HZP_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(data.type));
    return enqueue(op, [&] {
      return ncclAllReduce(data.data, data.data, static_cast<std::size_t>(data.count), t, ncclSum, comm_, stream_);
    });
  }
  Status broadcast(const Buffer& data, int root) override {
    constexpr const char* op = "broadcast";
    if (root < 0 || root >= size()) return checks_.bad(op, "root " + std::to_string(root) + " is not a position");
    if (data.count == 0) return Status::Ok();
    HZP_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(data.type));
    return enqueue(op, [&] {
      return ncclBroadcast(data.data, data.data, static_cast<std::size_t>(data.count), t, root, comm_, stream_);
    });
  }
  Status all_to_all(const Buffer& in, const Buffer& out) override {
    constexpr const char* op = "all_to_all";
    HZP_RETURN_IF_ERROR(checks_.same_type(op, in, out));
    if (in.count != out.count || in.count % size() != 0)
      return checks_.bad(op, "in and out must hold the same whole number of chunks per position");
    if (in.count == 0) return Status::Ok();
    HZP_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(in.type));
    const auto chunk = static_cast<std::size_t>(in.count / size());
    return enqueue(op, [&] { return ncclAlltoAll(in.data, out.data, chunk, t, comm_, stream_); });
  }
  Status all_to_all_v(const Buffer& in, const Buffer& send_counts, const Buffer& out,
                      const Buffer& recv_counts) override {
    constexpr const char* op = "all_to_all_v";
    std::vector<std::int64_t> sends, recvs;
    HZP_RETURN_IF_ERROR(read_counts(stream_, checks_, in, send_counts, out, recv_counts, sends, recvs));
    HZP_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(in.type));
    const std::size_t element = static_cast<std::size_t>(scalar_bytes(in.type));
    // One group of sends and receives: NCCL matches them pairwise and runs them concurrently.
    return enqueue(op, [&]() -> ncclResult_t {
      ncclResult_t r = ncclGroupStart();
      std::size_t send_at = 0, recv_at = 0;
      for (int j = 0; j < size() && r == ncclSuccess; ++j) {
        if (sends[j] > 0)
          r = ncclSend(static_cast<const char*>(in.data) + send_at * element, static_cast<std::size_t>(sends[j]), t, j,
                       comm_, stream_);
        if (r == ncclSuccess && recvs[j] > 0)
          r = ncclRecv(static_cast<char*>(out.data) + recv_at * element, static_cast<std::size_t>(recvs[j]), t, j,
                       comm_, stream_);
        send_at += static_cast<std::size_t>(sends[j]);
        recv_at += static_cast<std::size_t>(recvs[j]);
      }
      const ncclResult_t end = ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
  Status barrier() override {
    // An all-reduce of nothing is not a barrier in NCCL; one element of scratch on the device is.
    if (barrier_ == nullptr && cudaMalloc(&barrier_, sizeof(float)) != cudaSuccess)
      return Status::Internal("barrier" + checks_.where + "cannot allocate its scratch");
    return enqueue("barrier",
                   [&] { return ncclAllReduce(barrier_, barrier_, 1, ncclFloat32, ncclSum, comm_, stream_); });
  }

  // --- For the watchdog ---

  // Checks the communicator: an asynchronous error, or the oldest collective still running past `timeout`,
  // aborts it and poisons its stream. Returns false once aborted.
  bool check(std::chrono::milliseconds timeout) {
    if (aborted_.load()) return false;
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm_, &state);
    std::string why;
    if (state != ncclSuccess && state != ncclInProgress) {
      why = std::string("NCCL reported ") + ncclGetErrorString(state) + " (" + ncclGetLastError(comm_) +
            "): a peer died or the network failed";
    } else {
      std::lock_guard<std::mutex> lock(pending_mu_);
      while (!pending_.empty() && cudaEventQuery(pending_.front().event) == cudaSuccess) {
        spare_.push_back(pending_.front().event);
        pending_.pop_front();
      }
      if (!pending_.empty() && Clock::now() - pending_.front().started > timeout)
        why = std::string(pending_.front().op) + " did not complete within " +
              std::to_string(timeout.count() / 1000.0).substr(0, 6) + " s: a peer is dead, hung or far behind";
    }
    if (why.empty()) return true;
    fail(Status::Internal(std::string("NCCL") + checks_.where + why));
    return false;
  }

 private:
  // Runs one NCCL enqueue (non-blocking communicator: wait out ncclInProgress), then records an event the
  // watchdog follows.
  template <typename F>
  Status enqueue(const char* op, F&& call) {
    if (aborted_.load())
      return Status::Internal(std::string(op) + checks_.where + "the communicator was aborted (" + failure() + ")");
    ncclResult_t r = call();
    const auto deadline = Clock::now() + watchdog_.timeout();
    while (r == ncclInProgress) {
      if (Clock::now() > deadline) {
        fail(Status::Internal(std::string(op) + checks_.where + "enqueueing did not finish within the timeout"));
        return Status::Internal(failure());
      }
      std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommGetAsyncError(comm_, &r);
    }
    if (r != ncclSuccess)
      return Status::Internal(std::string(op) + checks_.where + ncclGetErrorString(r) + " (" + ncclGetLastError(comm_) +
                              ")");
    std::lock_guard<std::mutex> lock(pending_mu_);
    cudaEvent_t event = nullptr;
    if (!spare_.empty()) {
      event = spare_.back();
      spare_.pop_back();
    } else if (cudaEventCreateWithFlags(&event, cudaEventDisableTiming) != cudaSuccess) {
      return Status::Internal(std::string(op) + checks_.where + "cannot create an event");
    }
    cudaEventRecord(event, stream_);
    pending_.push_back({event, Clock::now(), op});
    return Status::Ok();
  }

  void fail(const Status& s) {
    {
      std::lock_guard<std::mutex> lock(failure_mu_);
      if (failure_.empty()) failure_ = s.message();
    }
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);  // ends the stuck kernels; the stream then moves on
    if (on_failure_) on_failure_(s);
  }
  std::string failure() {
    std::lock_guard<std::mutex> lock(failure_mu_);
    return failure_;
  }

  struct Pending {
    cudaEvent_t event;
    Clock::time_point started;
    const char* op;
  };

  ncclComm_t comm_;
  int rank_;
  std::vector<int> ranks_;
  std::string name_;
  cudaStream_t stream_;
  std::function<void(const Status&)> on_failure_;
  Watchdog& watchdog_;
  Checks checks_;
  std::atomic<bool> aborted_{false};
  std::mutex failure_mu_;
  std::string failure_;
  std::mutex pending_mu_;
  std::deque<Pending> pending_;
  std::vector<cudaEvent_t> spare_;
  void* barrier_ = nullptr;
};

void Watchdog::run() {
  cudaSetDevice(device_);  // event queries need this thread on the communicators' device
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; });
    if (stopping_) break;
    for (NcclCommunicator* c : comms_) c->check(timeout_);
  }
}

class NcclFactory final : public CudaCommFactory {
 public:
  NcclFactory(const BackendOptions& options, int device) : options_(options), watchdog_(device, options.timeout) {}

  Result<std::unique_ptr<Communicator>> create(const std::vector<int>& ranks, const std::string& key,
                                               const std::string& display_name, cudaStream_t stream,
                                               std::function<void(const Status&)> on_failure) override {
    const std::string where =
        "NCCL communicator " + display_name + " (global ranks " + ranks_string(ranks) + ", key '" + key + "'): ";
    const auto me = std::find(ranks.begin(), ranks.end(), options_.global_rank);
    if (ranks.empty() || me == ranks.end()) return Status::InvalidInput(where + "this rank is not a member");
    const int position = static_cast<int>(me - ranks.begin());
    if (options_.store.port == 0) return Status::InvalidInput(where + "no store: this device was made without one");
    if (store_ == nullptr) {
      auto client =
          StoreClient::connect(options_.store.host, options_.store.port, options_.store.token, options_.timeout);
      if (!client.ok()) return Status::Internal(where + client.status().message());
      store_ = std::move(client).value();
    }
    // The first member makes the unique id and publishes it; the others read it (bounded by the timeout).
    ncclUniqueId id{};
    const std::string id_key = "hzp/nccl/" + key;
    if (position == 0) {
      if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess)
        return Status::Internal(where + "ncclGetUniqueId: " + ncclGetErrorString(r));
      HZP_RETURN_IF_ERROR(store_->set(id_key, hex(&id, sizeof(id))));
    } else {
      auto got = store_->get(id_key, options_.timeout);
      if (!got.ok()) return Status::Internal(where + "member 0 never published its id: " + got.status().message());
      if (!unhex(*got, &id, sizeof(id))) return Status::Internal(where + "a malformed id in the store");
    }
    // Non-blocking: a member that never joins is a timeout here, not a hang.
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, static_cast<int>(ranks.size()), id, position, &config);
    const auto deadline = Clock::now() + options_.timeout;
    while (r == ncclInProgress || (r == ncclSuccess && comm != nullptr && pending_init(comm))) {
      if (Clock::now() > deadline) {
        ncclCommAbort(comm);
        return Status::Internal(where + "not every member joined within the timeout");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      r = ncclSuccess;
    }
    if (r != ncclSuccess) {
      if (comm != nullptr) ncclCommAbort(comm);
      return Status::Internal(where + "ncclCommInitRankConfig: " + ncclGetErrorString(r));
    }
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    if (state != ncclSuccess) {
      ncclCommAbort(comm);
      return Status::Internal(where + "initialisation failed: " + ncclGetErrorString(state));
    }
    return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(comm, position, ranks, display_name, stream,
                                                                            std::move(on_failure), watchdog_));
  }

 private:
  static bool pending_init(ncclComm_t comm) {
    ncclResult_t state = ncclSuccess;
    ncclCommGetAsyncError(comm, &state);
    return state == ncclInProgress;
  }

  BackendOptions options_;
  Watchdog watchdog_;
  std::unique_ptr<StoreClient> store_;
};

// --- Host-staged (ranks sharing a GPU) --------------------------------------------------------------------------

// Pinned host memory that only grows.
class PinnedBuffer {
 public:
  ~PinnedBuffer() {
    if (data_ != nullptr) cudaFreeHost(data_);
  }
  Result<Buffer> get(std::int64_t count, ScalarType type) {
    const auto bytes = static_cast<std::size_t>(count * scalar_bytes(type));
    if (bytes > bytes_) {
      if (data_ != nullptr) cudaFreeHost(data_);
      data_ = nullptr;
      bytes_ = 0;
      if (cudaMallocHost(&data_, std::max<std::size_t>(bytes, 64)) != cudaSuccess)
        return Status::Internal("cannot pin " + std::to_string(bytes) + " bytes of host memory for staging");
      bytes_ = std::max<std::size_t>(bytes, 64);
    }
    return Buffer{data_, count, type};
  }

 private:
  void* data_ = nullptr;
  std::size_t bytes_ = 0;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(std::unique_ptr<Communicator> host, cudaStream_t stream)
      : host_(std::move(host)), stream_(stream) {
    checks_.where = " on " + host_->name() + " (global ranks " + ranks_string(host_->global_ranks()) + ") failed: ";
    checks_.size = host_->size();
  }
  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  const std::vector<int>& global_ranks() const override { return host_->global_ranks(); }
  const std::string& name() const override { return host_->name(); }

  Status all_gather(const Buffer& in, const Buffer& out) override {
    return run(
        "all_gather", {in}, out.count, [&](const Buffer& a, const Buffer& b) { return host_->all_gather(a, b); }, out);
  }
  Status reduce_scatter(const Buffer& in, const Buffer& out) override {
    return run(
        "reduce_scatter", {in}, out.count,
        [&](const Buffer& a, const Buffer& b) { return host_->reduce_scatter(a, b); }, out);
  }
  Status all_reduce(const Buffer& data) override {
    return run(
        "all_reduce", {data}, 0, [&](const Buffer& a, const Buffer&) { return host_->all_reduce(a); }, data);
  }
  Status broadcast(const Buffer& data, int root) override {
    return run(
        "broadcast", {data}, 0, [&](const Buffer& a, const Buffer&) { return host_->broadcast(a, root); }, data);
  }
  Status all_to_all(const Buffer& in, const Buffer& out) override {
    return run(
        "all_to_all", {in}, out.count, [&](const Buffer& a, const Buffer& b) { return host_->all_to_all(a, b); }, out);
  }
  Status all_to_all_v(const Buffer& in, const Buffer& send_counts, const Buffer& out,
                      const Buffer& recv_counts) override {
    std::vector<std::int64_t> sends, recvs;
    HZP_RETURN_IF_ERROR(read_counts(stream_, checks_, in, send_counts, out, recv_counts, sends, recvs));
    std::int64_t received = 0;
    for (std::int64_t n : recvs) received += n;
    HZP_ASSIGN_OR_RETURN(Buffer a, a_.get(in.count, in.type));
    HZP_ASSIGN_OR_RETURN(Buffer b, b_.get(out.count, out.type));
    HZP_RETURN_IF_ERROR(copy(a.data, in.data, static_cast<std::size_t>(in.bytes()), cudaMemcpyDeviceToHost));
    const Buffer host_sends{sends.data(), static_cast<std::int64_t>(sends.size()), ScalarType::kInt64};
    const Buffer host_recvs{recvs.data(), static_cast<std::int64_t>(recvs.size()), ScalarType::kInt64};
    HZP_RETURN_IF_ERROR(host_->all_to_all_v(a, host_sends, b, host_recvs));
    // Only the received rows come back: the rest of `out` keeps its contents, as on every backend.
    return copy(out.data, b.data, static_cast<std::size_t>(received * scalar_bytes(out.type)), cudaMemcpyHostToDevice);
  }
  Status barrier() override { return host_->barrier(); }

 private:
  // Copies `in` to pinned memory (a), runs `op` on the host (into b when out_count > 0, else in place on a) and
  // copies the result to `result`, waiting on the stream before and after (the host reads and the next
  // collective reuses the staging).
  template <typename Op>
  Status run(const char* name, std::initializer_list<Buffer> ins, std::int64_t out_count, Op&& op,
             const Buffer& result) {
    const Buffer& in = *ins.begin();
    HZP_ASSIGN_OR_RETURN(Buffer a, a_.get(in.count, in.type));
    Buffer b = a;
    if (out_count > 0) {
      HZP_ASSIGN_OR_RETURN(b, b_.get(out_count, result.type));
    }
    HZP_RETURN_IF_ERROR(copy(a.data, in.data, static_cast<std::size_t>(in.bytes()), cudaMemcpyDeviceToHost));
    if (Status s = op(a, b); !s.ok()) return s;
    (void)name;
    return copy(result.data, b.data, static_cast<std::size_t>(result.bytes()), cudaMemcpyHostToDevice);
  }

  Status copy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
    if (bytes == 0) return Status::Ok();
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, kind, stream_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
    if (e != cudaSuccess) return Status::Internal("staging" + checks_.where + cuda_error(e));
    return Status::Ok();
  }

  std::unique_ptr<Communicator> host_;
  cudaStream_t stream_;
  Checks checks_;
  PinnedBuffer a_, b_;
};

class StagedFactory final : public CudaCommFactory {
 public:
  explicit StagedFactory(const BackendOptions& options) : options_(options) {}

  Result<std::unique_ptr<Communicator>> create(const std::vector<int>& ranks, const std::string& key,
                                               const std::string& display_name, cudaStream_t stream,
                                               std::function<void(const Status&)>) override {
    if (options_.store.port == 0)
      return Status::InvalidInput("communicator " + display_name + ": no store: this device was made without one");
    GlooOptions gloo;
    gloo.interface_address = options_.interface_address;
    gloo.timeout = options_.timeout;
    if (device_ == nullptr) {
      HZP_ASSIGN_OR_RETURN(device_, make_gloo_device(gloo));
    }
    HZP_ASSIGN_OR_RETURN(auto host, make_gloo_communicator(options_.store, options_.global_rank, ranks,
                                                           "hzp/comm/" + key, display_name, device_, gloo));
    return std::unique_ptr<Communicator>(std::make_unique<StagedCommunicator>(std::move(host), stream));
  }

 private:
  BackendOptions options_;
  std::shared_ptr<gloo::transport::Device> device_;
};

}  // namespace

Result<std::unique_ptr<CudaCommFactory>> CudaCommFactory::create(const BackendOptions& options, int device,
                                                                 bool staged) {
  if (staged) return std::unique_ptr<CudaCommFactory>(std::make_unique<StagedFactory>(options));
  return std::unique_ptr<CudaCommFactory>(std::make_unique<NcclFactory>(options, device));
}

}  // namespace hzp::runtime
