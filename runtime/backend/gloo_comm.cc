// The CPU backend's communicator: Gloo collectives over TCP (gloo_comm.h).
//
// One gloo::rendezvous::Context per communicator, connected as a full mesh through the hzp store under the
// communicator's key. Every collective passes the communicator's timeout to Gloo, and every Gloo exception
// becomes a Status "<op> on <name> (global ranks [a,b,..]) failed: <gloo message>". A Gloo failure (peer
// gone, timeout) closes the context's connections, so the communicator stays failed afterwards: later calls
// return an error at once, naming the first failure, instead of exchanging data over a broken mesh.
//
// Reduce-scatter is an all-to-all of the equal chunks followed by a local sum in position order: correct for
// every group size (Gloo's ReduceScatterHalvingDoubling is the older Algorithm API with int counts, no
// per-call timeout and per-instance buffer registration), and it moves the same (size-1)*count floats per
// rank as a ring.
//
// Each call reaching Gloo uses a fresh tag (a per-communicator sequence number, the same on every member that
// issues the same calls), so members that disagree on the sequence of calls time out instead of silently
// pairing a message of one collective with another.
#include "runtime/backend/gloo_comm.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <numeric>
#include <set>
#include <utility>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/alltoall.h>
#include <gloo/alltoallv.h>
#include <gloo/barrier.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

#include "runtime/store/gloo_store.h"

namespace hzp::runtime {

namespace {

// The largest buffer (in bytes) any call may describe: Gloo keeps sizes and offsets in size_t and the
// alltoallv counts in int64; staying within ptrdiff_t keeps every product and pointer offset defined.
constexpr std::int64_t kMaxBytes = std::numeric_limits<std::ptrdiff_t>::max() / 2;
constexpr std::int64_t kMaxFloats = kMaxBytes / static_cast<std::int64_t>(sizeof(float));

std::string ranks_string(const std::vector<int>& ranks) {
  std::string s = "[";
  for (std::size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) s.push_back(',');
    s.append(std::to_string(ranks[i]));
  }
  return s + "]";
}

bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  if (a_bytes == 0 || b_bytes == 0) return false;
  const auto pa = reinterpret_cast<std::uintptr_t>(a);
  const auto pb = reinterpret_cast<std::uintptr_t>(b);
  return pa < pb + b_bytes && pb < pa + a_bytes;
}

void sum_floats(void* c, const void* a, const void* b, std::size_t n) {
  float* out = static_cast<float*>(c);
  const float* x = static_cast<const float*>(a);
  const float* y = static_cast<const float*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = x[i] + y[i];
}

std::size_t bytes_of(std::int64_t floats) {
  return static_cast<std::size_t>(floats) * sizeof(float);
}

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(int rank, std::vector<int> ranks, std::string name,
                   std::shared_ptr<gloo::rendezvous::Context> context, std::chrono::milliseconds timeout)
      : rank_(rank),
        ranks_(std::move(ranks)),
        name_(std::move(name)),
        where_(" on " + name_ + " (global ranks " + ranks_string(ranks_) + ") failed: "),
        context_(std::move(context)),
        timeout_(timeout) {}

  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& global_ranks() const override { return ranks_; }
  const std::string& name() const override { return name_; }

  // The CPU models train in fp32: the Gloo communicator moves and sums fp32 only.
  Status all_gather(const void* in, void* out, std::int64_t count, DType dtype) override {
    HZP_RETURN_IF_ERROR(fp32_only("all_gather", dtype));
    return all_gather_f32(static_cast<const float*>(in), static_cast<float*>(out), count);
  }
  Status reduce_scatter(const void* in, void* out, std::int64_t count, DType dtype) override {
    HZP_RETURN_IF_ERROR(fp32_only("reduce_scatter", dtype));
    return reduce_scatter_f32(static_cast<const float*>(in), static_cast<float*>(out), count);
  }
  Status all_reduce(void* data, std::int64_t count, DType dtype) override {
    HZP_RETURN_IF_ERROR(fp32_only("all_reduce", dtype));
    return all_reduce_f32(static_cast<float*>(data), count);
  }
  Status broadcast(void* data, std::int64_t count, int root, DType dtype) override {
    HZP_RETURN_IF_ERROR(fp32_only("broadcast", dtype));
    return broadcast_f32(static_cast<float*>(data), count, root);
  }
  Status all_to_all(const void* in, void* out, std::int64_t count, DType dtype) override {
    HZP_RETURN_IF_ERROR(fp32_only("all_to_all", dtype));
    return all_to_all_f32(static_cast<const float*>(in), static_cast<float*>(out), count);
  }

 private:
  Status fp32_only(const char* op, DType dtype) const {
    if (dtype == DType::kFp32) return Status::Ok();
    return Status::Unimplemented(std::string(op) + " on " + name_ + ": the CPU backend (Gloo) moves fp32 only, not " +
                                 to_string(dtype));
  }

  Status all_gather_f32(const float* in, float* out, std::int64_t count) {
    constexpr const char* op = "all_gather";
    HZP_RETURN_IF_ERROR(check_count(op, count, size()));
    if (count == 0) return Status::Ok();
    if (in == nullptr || out == nullptr) return invalid(op, "null buffer");
    float* mine = out + static_cast<std::ptrdiff_t>(rank_) * count;
    const bool in_place = in == mine;
    const float* src = in;
    if (!in_place && overlaps(in, bytes_of(count), out, bytes_of(count * size()))) {
      scratch_.assign(in, in + count);  // in overlaps out elsewhere than at my chunk: stage it
      src = scratch_.data();
    }
    if (size() == 1) {
      if (!in_place) std::memmove(out, src, bytes_of(count));
      return Status::Ok();
    }
    return run(op, [&] {
      gloo::AllgatherOptions opts(context_);
      if (!in_place) opts.setInput(const_cast<float*>(src), static_cast<std::size_t>(count));
      opts.setOutput(out, static_cast<std::size_t>(count) * size());
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  Status reduce_scatter_f32(const float* in, float* out, std::int64_t count) {
    constexpr const char* op = "reduce_scatter";
    HZP_RETURN_IF_ERROR(check_count(op, count, size()));
    if (count == 0) return Status::Ok();
    if (in == nullptr || out == nullptr) return invalid(op, "null buffer");
    if (size() == 1) {
      if (in != out) std::memmove(out, in, bytes_of(count));
      return Status::Ok();
    }
    // Chunk j of every position lands in row j of scratch_ (the sum's addends for my chunk, in position
    // order); `in` is only read by the exchange, so out may alias any part of it.
    const std::size_t total = static_cast<std::size_t>(count) * size();
    scratch_.resize(total);
    Status s = run(op, [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(const_cast<float*>(in), total);
      opts.setOutput(scratch_.data(), total);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::alltoall(opts);
    });
    if (!s.ok()) return s;
    const std::size_t n = static_cast<std::size_t>(count);
    std::memmove(out, scratch_.data(), bytes_of(count));
    for (int j = 1; j < size(); ++j) {
      const float* row = scratch_.data() + static_cast<std::size_t>(j) * n;
      for (std::size_t i = 0; i < n; ++i) out[i] += row[i];
    }
    return Status::Ok();
  }

  Status all_reduce_f32(float* data, std::int64_t count) {
    constexpr const char* op = "all_reduce";
    HZP_RETURN_IF_ERROR(check_count(op, count, 1));
    if (count == 0 || size() == 1) return Status::Ok();
    if (data == nullptr) return invalid(op, "null buffer");
    return run(op, [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, static_cast<std::size_t>(count));
      opts.setReduceFunction(&sum_floats);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  Status broadcast_f32(float* data, std::int64_t count, int root) {
    constexpr const char* op = "broadcast";
    HZP_RETURN_IF_ERROR(check_count(op, count, 1));
    if (root < 0 || root >= size())
      return invalid(
          op, "root " + std::to_string(root) + " is not a position of the group (size " + std::to_string(size()) + ")");
    if (count == 0 || size() == 1) return Status::Ok();
    if (data == nullptr) return invalid(op, "null buffer");
    return run(op, [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data, static_cast<std::size_t>(count));  // in place on the root too
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  Status all_to_all_f32(const float* in, float* out, std::int64_t count) {
    constexpr const char* op = "all_to_all";
    HZP_RETURN_IF_ERROR(check_count(op, count, size()));
    if (count == 0) return Status::Ok();
    if (in == nullptr || out == nullptr) return invalid(op, "null buffer");
    const std::size_t total = static_cast<std::size_t>(count) * size();
    if (size() == 1) {
      if (in != out) std::memmove(out, in, bytes_of(count));
      return Status::Ok();
    }
    const float* src = in;
    if (overlaps(in, total * sizeof(float), out, total * sizeof(float))) {
      scratch_.assign(in, in + total);  // Gloo sends from `in` while it fills `out`
      src = scratch_.data();
    }
    return run(op, [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(const_cast<float*>(src), total);
      opts.setOutput(out, total);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::alltoall(opts);
    });
  }

 public:
  Status all_to_all_v(const float* in, const std::vector<std::int64_t>& send_counts, std::vector<float>& out,
                      std::vector<std::int64_t>& recv_counts) override {
    constexpr const char* op = "all_to_all_v";
    if (static_cast<int>(send_counts.size()) != size())
      return invalid(op, std::to_string(send_counts.size()) + " send counts for a group of " + std::to_string(size()));
    std::int64_t send_total = 0;
    for (std::size_t j = 0; j < send_counts.size(); ++j) {
      if (send_counts[j] < 0 || send_counts[j] > kMaxFloats - send_total)
        return invalid(op, "send count " + std::to_string(send_counts[j]) + " to position " + std::to_string(j) +
                               (send_counts[j] < 0 ? " is negative" : " exceeds the size limit"));
      send_total += send_counts[j];
    }
    if (send_total > 0 && in == nullptr) return invalid(op, "null input buffer");
    // `in` may point into `out`, which is resized below: stage it first.
    std::vector<float> staged;
    if (overlaps(in, bytes_of(send_total), out.data(), out.capacity() * sizeof(float))) {
      staged.assign(in, in + send_total);
      in = staged.data();
    }
    if (size() == 1) {
      recv_counts = send_counts;
      out.assign(in, in + send_total);
      return Status::Ok();
    }
    // The counts first: position j learns how much position i sends it.
    std::vector<std::int64_t> counts_in(send_counts), counts_out(send_counts.size(), 0);
    HZP_RETURN_IF_ERROR(run(op, [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(counts_in.data(), counts_in.size());
      opts.setOutput(counts_out.data(), counts_out.size());
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::alltoall(opts);
    }));
    std::int64_t recv_total = 0;
    for (std::size_t j = 0; j < counts_out.size(); ++j) {
      if (counts_out[j] < 0 || counts_out[j] > kMaxFloats - recv_total) {
        // The peers are now out of step with us; fail the communicator like a transport error.
        const Status s = Status::Internal(std::string(op) + where_ + "position " + std::to_string(j) +
                                          " announced an invalid count " + std::to_string(counts_out[j]));
        broken_ = s.message();
        return s;
      }
      recv_total += counts_out[j];
    }
    std::vector<float> received(static_cast<std::size_t>(recv_total));
    HZP_RETURN_IF_ERROR(run(op, [&] {
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(const_cast<float*>(in), send_counts);
      opts.setOutput(received.data(), counts_out);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::alltoallv(opts);
    }));
    out = std::move(received);
    recv_counts = std::move(counts_out);
    return Status::Ok();
  }

  Status barrier() override {
    constexpr const char* op = "barrier";
    if (size() == 1) return Status::Ok();
    return run(op, [&] {
      gloo::BarrierOptions opts(context_);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::barrier(opts);
    });
  }

 private:
  Status invalid(const char* op, const std::string& why) const {
    return Status::InvalidInput(std::string(op) + where_ + why);
  }

  // count >= 0 and `chunks` chunks of it stay within kMaxBytes.
  Status check_count(const char* op, std::int64_t count, int chunks) const {
    if (count < 0) return invalid(op, "negative count " + std::to_string(count));
    if (count > kMaxFloats / chunks)
      return invalid(op, "count " + std::to_string(count) + " x " + std::to_string(chunks) +
                             " chunks exceeds the size limit of " + std::to_string(kMaxFloats) + " floats");
    return Status::Ok();
  }

  std::uint32_t next_tag() { return tag_++; }

  // Runs one Gloo call; any exception becomes the op's error and fails the communicator for good.
  template <typename F>
  Status run(const char* op, F&& call) {
    if (!broken_.empty())
      return Status::Internal(std::string(op) + where_ + "the communicator is unusable after an earlier failure (" +
                              broken_ + ")");
    std::string what;
    try {
      call();
      return Status::Ok();
    } catch (const gloo::IoException& e) {
      what = e.what();
    } catch (const gloo::Exception& e) {
      what = e.what();
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
      what = "unknown exception";
    }
    Status s = Status::Internal(std::string(op) + where_ + what);
    broken_ = s.message();
    return s;
  }

  const int rank_;
  const std::vector<int> ranks_;
  const std::string name_;
  const std::string where_;                             // " on <name> (global ranks [..]) failed: "
  std::shared_ptr<gloo::rendezvous::Context> context_;  // null for a group of one
  const std::chrono::milliseconds timeout_;
  std::uint32_t tag_ = 0;
  std::string broken_;          // the first Gloo failure; non-empty = the context is unusable
  std::vector<float> scratch_;  // staging and reduce-scatter receive space, reused across calls
};

}  // namespace

Result<std::shared_ptr<gloo::transport::Device>> make_gloo_device(const GlooOptions& options) {
  // Gloo's TCP transport writes without MSG_NOSIGNAL: a peer that died would raise SIGPIPE and kill this
  // process before the failed operation could be reported. Ignore it process-wide (writes then fail with
  // EPIPE, which Gloo turns into an exception the communicator reports).
  std::signal(SIGPIPE, SIG_IGN);
  std::string host = options.interface_address;
  if (host.empty()) {  // like Gloo: this machine's hostname
    char name[256] = {};
    if (gethostname(name, sizeof(name) - 1) != 0)
      return Status::Internal(std::string("Gloo TCP device: gethostname failed: ") + std::strerror(errno));
    host = name;
  }
  // Resolve first: this Gloo version ignores getaddrinfo's error codes (it only checks for -1) and then walks
  // an uninitialised result list, so an unresolvable address would crash inside CreateDevice.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rv = getaddrinfo(host.c_str(), nullptr, &hints, &found);
  if (rv != 0 || found == nullptr)
    return Status::InvalidInput("Gloo TCP device: cannot resolve interface address '" + host +
                                "': " + (rv != 0 ? gai_strerror(rv) : "no address"));
  freeaddrinfo(found);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    if (device == nullptr) return Status::Internal("Gloo TCP device on '" + host + "': none created");
    return device;
  } catch (const std::exception& e) {  // e.g. the address is not one of this machine's (bind fails)
    return Status::InvalidInput("Gloo TCP device on '" + host + "' failed: " + e.what());
  }
}

Result<std::unique_ptr<Communicator>> make_gloo_communicator(const StoreAddress& store, int global_rank,
                                                             const std::vector<int>& ranks, const std::string& key,
                                                             const std::string& display_name,
                                                             std::shared_ptr<gloo::transport::Device> device,
                                                             const GlooOptions& options) {
  const std::string where =
      "rendezvous (key '" + key + "') on " + display_name + " (global ranks " + ranks_string(ranks) + ") failed: ";
  if (ranks.empty()) return Status::InvalidInput(where + "empty group");
  if (std::set<int>(ranks.begin(), ranks.end()).size() != ranks.size())
    return Status::InvalidInput(where + "a global rank appears twice");
  const auto me = std::find(ranks.begin(), ranks.end(), global_rank);
  if (me == ranks.end())
    return Status::InvalidInput(where + "global rank " + std::to_string(global_rank) + " is not a member");
  if (options.timeout.count() <= 0)
    return Status::InvalidInput(where + "timeout must be positive, got " + std::to_string(options.timeout.count()) +
                                " ms");
  const int rank = static_cast<int>(me - ranks.begin());
  const int size = static_cast<int>(ranks.size());
  if (size == 1)  // a group of one needs no connection: every op is a local copy
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(0, ranks, display_name, nullptr, options.timeout));
  if (key.empty()) return Status::InvalidInput(where + "empty key");
  if (device == nullptr) return Status::InvalidInput(where + "no Gloo device");

  auto client = StoreClient::connect(store.host, store.port, store.token, options.timeout);
  if (!client.ok()) return Status::Internal(where + client.status().message());
  try {
    GlooStore gloo_store(std::move(client).value(), options.timeout);
    gloo::rendezvous::PrefixStore prefixed(key, gloo_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, size);
    context->setTimeout(options.timeout);
    context->connectFullMesh(prefixed, device);
    // The store connection closes here; the context keeps its TCP pairs.
    return std::unique_ptr<Communicator>(
        std::make_unique<GlooCommunicator>(rank, ranks, display_name, std::move(context), options.timeout));
  } catch (const std::exception& e) {
    return Status::Internal(where + e.what());
  }
}

}  // namespace hzp::runtime

namespace hzp::runtime {
namespace {

class CpuDevice final : public Device {
 public:
  CpuDevice(CpuDeviceOptions options, std::shared_ptr<gloo::transport::Device> gloo)
      : options_(std::move(options)), gloo_(std::move(gloo)) {}
  std::string description() const override { return "cpu (host memory, a thread per stream, Gloo over TCP)"; }
  std::unique_ptr<MemoryPool> create_pool(std::int64_t capacity_bytes) override {
    return std::make_unique<CpuMemoryPool>(capacity_bytes);
  }
  std::unique_ptr<Stream> create_stream(const std::string& name) override { return std::make_unique<CpuStream>(name); }
  // Gloo calls are blocking: issued from the stream's worker, they run in stream order, so one context per
  // (group, stream) is all the binding a stream needs.
  Result<std::unique_ptr<Communicator>> create_communicator(const std::vector<int>& ranks, const std::string& key,
                                                            const std::string& display_name, Stream&) override {
    // The rendezvous keys live under hzp/comm/ in the store, apart from the trainer's own keys.
    return make_gloo_communicator(options_.store, options_.global_rank, ranks, "hzp/comm/" + key, display_name, gloo_,
                                  options_.gloo);
  }

 private:
  CpuDeviceOptions options_;
  std::shared_ptr<gloo::transport::Device> gloo_;
};

}  // namespace

Result<std::unique_ptr<Device>> make_cpu_device(const CpuDeviceOptions& options) {
  HZP_ASSIGN_OR_RETURN(auto gloo, make_gloo_device(options.gloo));
  return std::unique_ptr<Device>(std::make_unique<CpuDevice>(options, std::move(gloo)));
}

}  // namespace hzp::runtime
