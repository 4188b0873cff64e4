// The CPU backend's communicator: Gloo collectives over TCP (gloo_comm.h).
//
// One gloo::rendezvous::Context per communicator, connected as a full mesh through the hzp store under the
// communicator's key. Every collective passes the communicator's timeout to Gloo, and every Gloo exception
// becomes a Status "<op> on <name> (global ranks [a,b,..]) failed: <gloo message>". A Gloo failure (peer
// gone, timeout) closes the context's connections, so the communicator stays failed afterwards: later calls
// return an error at once, naming the first failure, instead of exchanging data over a broken mesh.
//
// Data moves (all-gather, broadcast, all-to-all(v)) hand Gloo bytes, so every buffer type moves bit-exactly.
// Sums are typed: fp32, fp64 and int64 natively (int64 wraps around on overflow, as on a GPU); bf16 and fp16
// are summed in fp32 and rounded once (numeric.h). int32 sums are refused (kUnimplemented).
//
// Reduce-scatter is an all-to-all of the equal chunks followed by a local sum in position order: correct for
// every group size (Gloo's ReduceScatterHalvingDoubling is the older Algorithm API with int counts, no
// per-call timeout and per-instance buffer registration), and it moves the same (size-1)*count elements per
// rank as a ring. The fp32 sum is out = chunk 0, then += chunk 1, += chunk 2, ...: the order the runtime has
// always used, so fp32 results are bit-identical to it. The 16-bit types exchange their own bytes and widen
// the received chunks (exactly) before the same fp32 sum, which is the fp32 algorithm on widened inputs at
// half the traffic. All-reduce is gloo::allreduce with the type's sum (16-bit: on an fp32 copy).
//
// Each call reaching Gloo uses a fresh tag (a per-communicator sequence number, the same on every member that
// issues the same calls), so members that disagree on the sequence of calls time out instead of silently
// pairing a message of one collective with another.
#include "runtime/backends/cpu/gloo_comm.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <exception>
#include <limits>
#include <numeric>
#include <set>
#include <type_traits>
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

// a + b, wrapping around for int64 (signed overflow would be undefined; NCCL wraps).
template <typename T>
T add(T a, T b) {
  if constexpr (std::is_same_v<T, std::int64_t>) {
    return static_cast<std::int64_t>(static_cast<std::uint64_t>(a) + static_cast<std::uint64_t>(b));
  } else {
    return a + b;
  }
}

// Gloo's reduce function: c[i] = a[i] + b[i].
template <typename T>
void sum_into(void* c, const void* a, const void* b, std::size_t n) {
  T* out = static_cast<T*>(c);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (std::size_t i = 0; i < n; ++i) out[i] = add(x[i], y[i]);
}

// out[n] = row 0 + row 1 + ... + row (rows-1) of `rows` (consecutive rows of n), added in that order.
template <typename T>
void sum_rows(const T* rows, int count_rows, std::size_t n, T* out) {
  std::memmove(out, rows, n * sizeof(T));
  for (int j = 1; j < count_rows; ++j) {
    const T* row = rows + static_cast<std::size_t>(j) * n;
    for (std::size_t i = 0; i < n; ++i) out[i] = add(out[i], row[i]);
  }
}

std::string describe(const char* what, const Buffer& b) {
  return std::string(what) + " (" + std::to_string(b.count) + " " + to_string(b.type) + " elements)";
}

// Bytes of a validated buffer (count within kMaxBytes).
std::size_t bytes_of(const Buffer& b) {
  return static_cast<std::size_t>(b.count) * static_cast<std::size_t>(scalar_bytes(b.type));
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

  Status all_gather(const Buffer& in, const Buffer& out) override {
    constexpr const char* op = "all_gather";
    HZP_RETURN_IF_ERROR(check_buffer(op, "in", in));
    HZP_RETURN_IF_ERROR(check_buffer(op, "out", out));
    HZP_RETURN_IF_ERROR(check_same_type(op, "in", in, "out", out));
    if (out.count % size() != 0 || out.count / size() != in.count)
      return invalid(
          op, describe("out", out) + " must hold " + std::to_string(size()) + " positions x " + describe("in", in));
    if (in.count == 0) return Status::Ok();
    const std::size_t n = bytes_of(in);
    char* mine = out.as<char>() + static_cast<std::size_t>(rank_) * n;
    const bool in_place = in.data == mine;
    const void* src = in.data;
    if (!in_place && overlaps(in.data, n, out.data, bytes_of(out)))
      src = stage(in.data, n);  // in overlaps out elsewhere than at my chunk: Gloo would overwrite it
    if (size() == 1) {
      if (!in_place) std::memmove(out.data, src, n);
      return Status::Ok();
    }
    return run(op, [&] {
      gloo::AllgatherOptions opts(context_);
      if (!in_place) opts.setInput(const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(src)), n);
      opts.setOutput(out.as<std::uint8_t>(), bytes_of(out));
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allgather(opts);
    });
  }

  Status reduce_scatter(const Buffer& in, const Buffer& out) override {
    constexpr const char* op = "reduce_scatter";
    HZP_RETURN_IF_ERROR(check_buffer(op, "in", in));
    HZP_RETURN_IF_ERROR(check_buffer(op, "out", out));
    HZP_RETURN_IF_ERROR(check_same_type(op, "in", in, "out", out));
    HZP_RETURN_IF_ERROR(check_summable(op, in.type));
    if (in.count % size() != 0 || in.count / size() != out.count)
      return invalid(
          op, describe("in", in) + " must hold " + std::to_string(size()) + " positions x " + describe("out", out));
    if (out.count == 0) return Status::Ok();
    if (size() == 1) {  // a sum of one addend: exact in every type
      if (in.data != out.data) std::memmove(out.data, in.data, bytes_of(out));
      return Status::Ok();
    }
    // Chunk j of every position lands in row j of the scratch space (the sum's addends for my chunk, in
    // position order); `in` is only read by the exchange, so out may alias any part of it.
    const std::size_t total = bytes_of(in);
    void* rows = scratch(total);
    HZP_RETURN_IF_ERROR(run(op, [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(const_cast<std::uint8_t*>(in.as<const std::uint8_t>()), total);
      opts.setOutput(static_cast<std::uint8_t*>(rows), total);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::alltoall(opts);
    }));
    const auto n = static_cast<std::size_t>(out.count);
    switch (out.type) {
      case ScalarType::kFp32:
        sum_rows(static_cast<const float*>(rows), size(), n, out.as<float>());
        break;
      case ScalarType::kFp64:
        sum_rows(static_cast<const double*>(rows), size(), n, out.as<double>());
        break;
      case ScalarType::kInt64:
        sum_rows(static_cast<const std::int64_t*>(rows), size(), n, out.as<std::int64_t>());
        break;
      default: {  // bf16, fp16: widen every row (exact), sum in fp32 in position order, round once
        wide_.resize(n * static_cast<std::size_t>(size()));
        decode_floats(out.type, rows, out.count * size(), wide_.data());
        wide_out_.resize(n);
        sum_rows(wide_.data(), size(), n, wide_out_.data());
        encode_floats(out.type, wide_out_.data(), out.count, out.data);
      }
    }
    return Status::Ok();
  }

  Status all_reduce(const Buffer& data) override {
    constexpr const char* op = "all_reduce";
    HZP_RETURN_IF_ERROR(check_buffer(op, "data", data));
    HZP_RETURN_IF_ERROR(check_summable(op, data.type));
    if (data.count == 0 || size() == 1) return Status::Ok();
    const auto n = static_cast<std::size_t>(data.count);
    switch (data.type) {
      case ScalarType::kFp32:
        return all_reduce_typed(op, data.as<float>(), n);
      case ScalarType::kFp64:
        return all_reduce_typed(op, data.as<double>(), n);
      case ScalarType::kInt64:
        return all_reduce_typed(op, data.as<std::int64_t>(), n);
      default: {  // bf16, fp16: the fp32 all-reduce of the widened values, rounded once
        wide_.resize(n);
        decode_floats(data.type, data.data, data.count, wide_.data());
        HZP_RETURN_IF_ERROR(all_reduce_typed(op, wide_.data(), n));
        encode_floats(data.type, wide_.data(), data.count, data.data);
        return Status::Ok();
      }
    }
  }

  Status broadcast(const Buffer& data, int root) override {
    constexpr const char* op = "broadcast";
    HZP_RETURN_IF_ERROR(check_buffer(op, "data", data));
    if (root < 0 || root >= size())
      return invalid(
          op, "root " + std::to_string(root) + " is not a position of the group (size " + std::to_string(size()) + ")");
    if (data.count == 0 || size() == 1) return Status::Ok();
    return run(op, [&] {
      gloo::BroadcastOptions opts(context_);
      opts.setOutput(data.as<std::uint8_t>(), bytes_of(data));  // in place on the root too
      opts.setRoot(root);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::broadcast(opts);
    });
  }

  Status all_to_all(const Buffer& in, const Buffer& out) override {
    constexpr const char* op = "all_to_all";
    HZP_RETURN_IF_ERROR(check_buffer(op, "in", in));
    HZP_RETURN_IF_ERROR(check_buffer(op, "out", out));
    HZP_RETURN_IF_ERROR(check_same_type(op, "in", in, "out", out));
    if (out.count != in.count) return invalid(op, describe("out", out) + " must match " + describe("in", in));
    if (in.count % size() != 0)
      return invalid(op, describe("in", in) + " do not split into " + std::to_string(size()) + " equal chunks");
    if (in.count == 0) return Status::Ok();
    const std::size_t total = bytes_of(in);
    if (size() == 1) {
      if (in.data != out.data) std::memmove(out.data, in.data, total);
      return Status::Ok();
    }
    const void* src = in.data;
    if (overlaps(in.data, total, out.data, total)) src = stage(in.data, total);  // Gloo sends while it fills out
    return run(op, [&] {
      gloo::AlltoallOptions opts(context_);
      opts.setInput(const_cast<std::uint8_t*>(static_cast<const std::uint8_t*>(src)), total);
      opts.setOutput(out.as<std::uint8_t>(), total);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::alltoall(opts);
    });
  }

  Status all_to_all_v(const Buffer& in, const Buffer& send_counts, const Buffer& out,
                      const Buffer& recv_counts) override {
    constexpr const char* op = "all_to_all_v";
    HZP_RETURN_IF_ERROR(check_buffer(op, "in", in));
    HZP_RETURN_IF_ERROR(check_buffer(op, "out", out));
    HZP_RETURN_IF_ERROR(check_same_type(op, "in", in, "out", out));
    // The counts are in device memory, which on this backend is host memory: read them directly.
    std::vector<std::int64_t> sends, recvs;
    HZP_RETURN_IF_ERROR(read_counts(op, "send_counts", send_counts, sends));
    HZP_RETURN_IF_ERROR(read_counts(op, "recv_counts", recv_counts, recvs));
    std::int64_t send_total = 0, recv_total = 0;
    for (int j = 0; j < size(); ++j) {
      if (sends[j] < 0 || sends[j] > in.count - send_total)
        return invalid(
            op, "send_counts[" + std::to_string(j) + "] = " + std::to_string(sends[j]) +
                    (sends[j] < 0 ? " is negative" : ": the send counts add up to more than " + describe("in", in)));
      send_total += sends[j];
      if (recvs[j] < 0 || recvs[j] > out.count - recv_total)
        return invalid(op, "recv_counts[" + std::to_string(j) + "] = " + std::to_string(recvs[j]) +
                               (recvs[j] < 0 ? " is negative"
                                             : ": the receive counts add up to more than the capacity of " +
                                                   describe("out", out)));
      recv_total += recvs[j];
    }
    const int element = scalar_bytes(in.type);
    const auto send_bytes = static_cast<std::size_t>(send_total) * element;
    const auto recv_bytes = static_cast<std::size_t>(recv_total) * element;
    const void* src = in.data;
    if (overlaps(in.data, send_bytes, out.data, recv_bytes))
      src = stage(in.data, send_bytes);  // Gloo sends from `in` while it fills `out`
    if (size() == 1) {
      if (recvs[0] != sends[0])
        return invalid(op, "recv_counts[0] = " + std::to_string(recvs[0]) + " but this position sends itself " +
                               std::to_string(sends[0]) + " (send_counts[0])");
      if (send_bytes > 0) std::memmove(out.data, src, send_bytes);
      return Status::Ok();
    }
    // Gloo takes per-position element counts of its element type: bytes here.
    for (auto* counts : {&sends, &recvs})
      for (std::int64_t& c : *counts) c *= element;
    // Zero totals may come with null buffers; Gloo gets a valid (never touched) address instead.
    static std::uint8_t nothing = 0;
    auto* send_ptr = const_cast<std::uint8_t*>(src != nullptr ? static_cast<const std::uint8_t*>(src) : &nothing);
    auto* recv_ptr = out.data != nullptr ? out.as<std::uint8_t>() : &nothing;
    return run(op, [&] {
      gloo::AlltoallvOptions opts(context_);
      opts.setInput(send_ptr, sends);
      opts.setOutput(recv_ptr, recvs);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::alltoallv(opts);
    });
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

  // A buffer any call may take: count >= 0, within kMaxBytes, and not null when it holds anything.
  Status check_buffer(const char* op, const char* what, const Buffer& b) const {
    if (b.count < 0) return invalid(op, std::string(what) + " has a negative count " + std::to_string(b.count));
    if (b.count > kMaxBytes / scalar_bytes(b.type))
      return invalid(op, describe(what, b) + " exceeds the size limit of " + std::to_string(kMaxBytes) + " bytes");
    if (b.count > 0 && b.data == nullptr) return invalid(op, describe(what, b) + " is a null buffer");
    return Status::Ok();
  }

  Status check_same_type(const char* op, const char* a_name, const Buffer& a, const char* b_name,
                         const Buffer& b) const {
    if (a.type == b.type) return Status::Ok();
    return invalid(op, std::string(a_name) + " is " + to_string(a.type) + " but " + b_name + " is " +
                           to_string(b.type) + " (the types must match)");
  }

  Status check_summable(const char* op, ScalarType t) const {
    if (t == ScalarType::kInt32)
      return Status::Unimplemented(std::string(op) + where_ +
                                   "the CPU backend (Gloo) does not sum int32 buffers (it sums fp32, fp64, int64, "
                                   "bf16 and fp16)");
    return Status::Ok();
  }

  // The size() int64 counts of `b` (device memory = host memory here) into `counts`.
  Status read_counts(const char* op, const char* what, const Buffer& b, std::vector<std::int64_t>& counts) const {
    if (b.type != ScalarType::kInt64 || b.count != size())
      return invalid(op,
                     describe(what, b) + " must be " + std::to_string(size()) + " int64 elements (one per position)");
    if (b.data == nullptr) return invalid(op, describe(what, b) + " is a null buffer");
    const auto* p = b.as<const std::int64_t>();
    counts.assign(p, p + size());
    return Status::Ok();
  }

  template <typename T>
  Status all_reduce_typed(const char* op, T* data, std::size_t n) {
    return run(op, [&] {
      gloo::AllreduceOptions opts(context_);
      opts.setOutput(data, n);
      opts.setReduceFunction(&sum_into<T>);
      opts.setTag(next_tag());
      opts.setTimeout(timeout_);
      gloo::allreduce(opts);
    });
  }

  // `bytes` bytes of scratch space, 8-byte aligned (any element type), reused across calls.
  void* scratch(std::size_t bytes) {
    scratch_.resize((bytes + sizeof(std::uint64_t) - 1) / sizeof(std::uint64_t));
    return scratch_.data();
  }
  const void* stage(const void* src, std::size_t bytes) {
    void* copy = scratch(bytes);
    std::memcpy(copy, src, bytes);
    return copy;
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
  std::string broken_;  // the first Gloo failure; non-empty = the context is unusable
  // Reused across calls (a communicator is used from one stream, so one call at a time): staging and
  // reduce-scatter receive space, and the fp32 copies of 16-bit sums.
  std::vector<std::uint64_t> scratch_;
  std::vector<float> wide_, wide_out_;
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
