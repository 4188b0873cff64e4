// Tests of the CPU backend (runtime/backends/cpu): the memory pool, events and streams (ordering, cross-stream
// waits, poisoning, draining on destruction), the Gloo communicator checked op by op against locally computed
// results in every buffer type (moves bit-exact; sums exact, 16-bit sums rounded once from fp32), its argument
// errors, and the "cpu" device of the backend registry (with and without a store). Up to 4 ranks run as
// threads of this process, rendezvousing through a StoreServer on 127.0.0.1.
//
// Device memory is host memory on this backend, so the tests hand the communicators Buffers over host vectors.
// Catch2 assertions are not thread-safe: rank threads record failures as strings, checked on the main thread.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "runtime/backends/cpu/cpu_device.h"
#include "runtime/backends/cpu/gloo_comm.h"
#include "runtime/device/communicator.h"
#include "runtime/device/kernels.h"
#include "runtime/device/numeric.h"
#include "runtime/device/registry.h"
#include "runtime/store/store.h"

using namespace hzp;
using namespace hzp::runtime;
using namespace std::chrono_literals;

namespace {

// --- Streams and events ----------------------------------------------------------------------------------

Status wait_event(const EventPtr& e) {
  return e->synchronize(10s);
}

// --- Buffers over host vectors ---------------------------------------------------------------------------

template <typename T>
Buffer view(std::vector<T>& v, ScalarType t) {
  return Buffer{v.data(), static_cast<std::int64_t>(v.size()), t};
}
Buffer f32(std::vector<float>& v) {
  return view(v, ScalarType::kFp32);
}
Buffer i64(std::vector<std::int64_t>& v) {
  return view(v, ScalarType::kInt64);
}

// --- Multi-rank harness ----------------------------------------------------------------------------------

struct World {
  std::unique_ptr<StoreServer> server;
  StoreAddress address;
  std::shared_ptr<gloo::transport::Device> device;
};

World make_world() {
  World w;
  auto server = StoreServer::start("127.0.0.1", 0, "backend-test");
  REQUIRE(server.ok());
  w.server = std::move(server).value();
  w.address.port = w.server->port();
  w.address.token = "backend-test";
  auto device = make_gloo_device(GlooOptions{});
  if (!device.ok()) FAIL(device.status().message());
  w.device = std::move(device).value();
  return w;
}

GlooOptions opts_with_timeout(std::chrono::milliseconds t) {
  GlooOptions o;
  o.timeout = t;
  return o;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Per-rank failure log (Catch2 macros stay on the main thread).
struct Log {
  std::vector<std::string> failures;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  }
  void ok(const Status& s, const std::string& what) {
    if (!s.ok()) failures.push_back(what + ": " + s.message());
  }
  // A refused call: `code`, and a message holding every one of `parts`.
  void refused(const Status& s, StatusCode code, const std::vector<std::string>& parts, const std::string& what) {
    bool good = s.code() == code;
    for (const auto& p : parts) good = good && contains(s.message(), p);
    if (!good) failures.push_back(what + ": unexpected status '" + s.message() + "'");
  }
  // Bitwise equality (NaN payloads and signed zeros included).
  template <typename T>
  void same(const std::vector<T>& got, const std::vector<T>& want, const std::string& what) {
    if (got.size() != want.size()) {
      failures.push_back(what + ": size " + std::to_string(got.size()) + " != " + std::to_string(want.size()));
      return;
    }
    for (std::size_t i = 0; i < got.size(); ++i)
      if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
        failures.push_back(what + ": element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", expected " +
                           std::to_string(want[i]));
        return;
      }
  }
};

// Runs fn(global_rank, log) on `n` threads and checks every log on the main thread.
void run_ranks(int n, const std::function<void(int, Log&)>& fn) {
  std::vector<Log> logs(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        fn(r, logs[r]);
      } catch (const std::exception& e) {
        logs[r].failures.push_back(std::string("exception: ") + e.what());
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    INFO("rank " << r);
    for (const auto& f : logs[r].failures) FAIL_CHECK(f);
    CHECK(logs[r].failures.empty());
  }
}

std::unique_ptr<Communicator> connect(const World& w, int me, const std::vector<int>& ranks, const std::string& key,
                                      const std::string& name, Log& log,
                                      std::chrono::milliseconds timeout = std::chrono::milliseconds(10000)) {
  auto c = make_gloo_communicator(w.address, me, ranks, key, name, w.device, opts_with_timeout(timeout));
  if (!c.ok()) {
    log.failures.push_back("connect " + name + ": " + c.status().message());
    return nullptr;
  }
  return std::move(c).value();
}

// Deterministic, exactly representable test data: position p's element i.
float v(int p, std::int64_t i) {
  return static_cast<float>(p * 1000 + (i % 997));
}

// Arbitrary bit patterns (NaNs, infinities and subnormals included in the floating types): position p's
// element k, different per `salt`.
std::uint64_t bits(int p, std::int64_t k, int salt) {
  std::uint64_t x = (static_cast<std::uint64_t>(p) << 40) ^ (static_cast<std::uint64_t>(k) * 0x9E3779B97F4A7C15ull) ^
                    (static_cast<std::uint64_t>(salt) << 56);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

// The all_to_all_v test pattern: position p sends (p + 2j + count) % 3 * scale elements to position j (zero
// counts included).
std::int64_t v_count(int p, int j, std::int64_t count, std::int64_t scale) {
  return static_cast<std::int64_t>((p + 2 * j + count) % 3) * scale;
}

// Every op on fp32 buffers against its expected result; every member of the group runs the same sequence.
void check_every_op(Communicator& c, std::int64_t count, Log& log) {
  const int n = c.size(), me = c.rank();
  const std::string tag = c.name() + " count " + std::to_string(count) + " ";
  const auto N = static_cast<std::size_t>(count);

  // all_gather, out of place and in place.
  {
    std::vector<float> in(N), out(N * n, -1.0f), want(N * n);
    for (std::size_t i = 0; i < N; ++i) in[i] = v(me, i);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < N; ++i) want[j * N + i] = v(j, i);
    log.ok(c.all_gather(f32(in), f32(out)), tag + "all_gather");
    log.same(out, want, tag + "all_gather");
    std::vector<float> buf(N * n, -1.0f);
    std::copy(in.begin(), in.end(), buf.begin() + me * N);
    log.ok(c.all_gather(f32(buf).slice(me * count, count), f32(buf)), tag + "all_gather in place");
    log.same(buf, want, tag + "all_gather in place");
  }
  // reduce_scatter, out of place and with out = in.slice(rank * count, count).
  {
    std::vector<float> in(N * n), out(N, -1.0f), want(N, 0.0f);
    for (std::size_t k = 0; k < N * n; ++k) in[k] = v(me, k);
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < N; ++i) want[i] += v(p, me * N + i);
    log.ok(c.reduce_scatter(f32(in), f32(out)), tag + "reduce_scatter");
    log.same(out, want, tag + "reduce_scatter");
    log.ok(c.reduce_scatter(f32(in), f32(in).slice(me * count, count)), tag + "reduce_scatter in place");
    log.same(std::vector<float>(in.begin() + me * N, in.begin() + (me + 1) * N), want, tag + "reduce_scatter in place");
  }
  // all_reduce.
  {
    std::vector<float> data(N), want(N, 0.0f);
    for (std::size_t i = 0; i < N; ++i) data[i] = v(me, i);
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < N; ++i) want[i] += v(p, i);
    log.ok(c.all_reduce(f32(data)), tag + "all_reduce");
    log.same(data, want, tag + "all_reduce");
  }
  // broadcast from the last position (non-zero unless the group is one rank).
  {
    const int root = n - 1;
    std::vector<float> data(N), want(N);
    for (std::size_t i = 0; i < N; ++i) data[i] = v(me, i), want[i] = v(root, i);
    log.ok(c.broadcast(f32(data), root), tag + "broadcast");
    log.same(data, want, tag + "broadcast");
  }
  // all_to_all: chunk j of position p goes to position j.
  {
    std::vector<float> in(N * n), out(N * n, -1.0f), want(N * n);
    for (std::size_t k = 0; k < N * n; ++k) in[k] = v(me, k);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < N; ++i) want[j * N + i] = v(j, me * N + i);
    log.ok(c.all_to_all(f32(in), f32(out)), tag + "all_to_all");
    log.same(out, want, tag + "all_to_all");
  }
  // all_to_all_v with uneven and zero counts. The receive counts come from an all_to_all of the send counts,
  // as a caller learns them; `out` is a capacity larger than needed, whose tail stays untouched.
  {
    auto value = [](int from, int to, std::int64_t k) { return static_cast<float>(from * 10000 + to * 100 + k); };
    std::vector<std::int64_t> send_counts(n), recv_counts(n, -7), want_counts(n);
    std::vector<float> in, want;
    for (int j = 0; j < n; ++j) {
      send_counts[j] = v_count(me, j, count, 1);
      for (std::int64_t k = 0; k < send_counts[j]; ++k) in.push_back(value(me, j, k));
      want_counts[j] = v_count(j, me, count, 1);
      for (std::int64_t k = 0; k < want_counts[j]; ++k) want.push_back(value(j, me, k));
    }
    log.ok(c.all_to_all(i64(send_counts), i64(recv_counts)), tag + "all_to_all of the counts");
    log.same(recv_counts, want_counts, tag + "all_to_all_v recv counts");
    std::vector<float> out(want.size() + 2, 42.0f);
    log.ok(c.all_to_all_v(f32(in), i64(send_counts), f32(out), i64(recv_counts)), tag + "all_to_all_v");
    std::vector<float> want_out = want;
    want_out.insert(want_out.end(), {42.0f, 42.0f});
    log.same(out, want_out, tag + "all_to_all_v");
    // `in` inside `out` (the same memory): staged, not overwritten while sent.
    std::vector<float> both(std::max(in.size(), want.size()) + 1, 42.0f);
    std::copy(in.begin(), in.end(), both.begin());
    log.ok(c.all_to_all_v(f32(both).slice(0, static_cast<std::int64_t>(in.size())), i64(send_counts), f32(both),
                          i64(recv_counts)),
           tag + "all_to_all_v in place");
    log.same(std::vector<float>(both.begin(), both.begin() + want.size()), want, tag + "all_to_all_v in place");
  }
  log.ok(c.barrier(), tag + "barrier");
}

// Data moves of a buffer type stored as U (of the type's size): all_gather (out of place and in place),
// broadcast, all_to_all and all_to_all_v, every result bit-exact.
template <typename U>
void check_moves(Communicator& c, ScalarType t, std::int64_t count, Log& log) {
  const int n = c.size(), me = c.rank();
  const std::string tag = c.name() + " " + to_string(t) + " count " + std::to_string(count) + " ";
  const auto N = static_cast<std::size_t>(count);
  auto val = [&](int p, std::int64_t k) { return static_cast<U>(bits(p, k, static_cast<int>(t))); };
  {
    std::vector<U> in(N), out(N * n), want(N * n);
    for (std::size_t i = 0; i < N; ++i) in[i] = val(me, i);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < N; ++i) want[j * N + i] = val(j, i);
    log.ok(c.all_gather(view(in, t), view(out, t)), tag + "all_gather");
    log.same(out, want, tag + "all_gather");
    std::vector<U> buf(N * n);
    std::copy(in.begin(), in.end(), buf.begin() + me * N);
    log.ok(c.all_gather(view(buf, t).slice(me * count, count), view(buf, t)), tag + "all_gather in place");
    log.same(buf, want, tag + "all_gather in place");
  }
  {
    for (int root : {0, n - 1}) {
      std::vector<U> data(N), want(N);
      for (std::size_t i = 0; i < N; ++i) data[i] = val(me, i), want[i] = val(root, i);
      log.ok(c.broadcast(view(data, t), root), tag + "broadcast");
      log.same(data, want, tag + "broadcast from " + std::to_string(root));
    }
  }
  {
    std::vector<U> in(N * n), out(N * n), want(N * n);
    for (std::size_t k = 0; k < N * n; ++k) in[k] = val(me, k);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < N; ++i) want[j * N + i] = val(j, me * N + i);
    log.ok(c.all_to_all(view(in, t), view(out, t)), tag + "all_to_all");
    log.same(out, want, tag + "all_to_all");
  }
  {
    // Element k of what `from` sends `to`.
    auto value = [&](int from, int to, std::int64_t k) { return val(from * 64 + to, k); };
    std::vector<std::int64_t> send_counts(n), recv_counts(n);
    std::vector<U> in, want;
    for (int j = 0; j < n; ++j) {
      send_counts[j] = v_count(me, j, count, count);
      for (std::int64_t k = 0; k < send_counts[j]; ++k) in.push_back(value(me, j, k));
      recv_counts[j] = v_count(j, me, count, count);
      for (std::int64_t k = 0; k < recv_counts[j]; ++k) want.push_back(value(j, me, k));
    }
    std::vector<U> out(want.size());
    log.ok(c.all_to_all_v(view(in, t), i64(send_counts), view(out, t), i64(recv_counts)), tag + "all_to_all_v");
    log.same(out, want, tag + "all_to_all_v");
  }
}

// Native sums (fp64, int64) of x(p, k): exact, so any order of additions gives `want`.
template <typename T, typename X>
void check_native_sums(Communicator& c, ScalarType t, std::int64_t count, X x, Log& log) {
  const int n = c.size(), me = c.rank();
  const std::string tag = c.name() + " " + to_string(t) + " count " + std::to_string(count) + " ";
  const auto N = static_cast<std::size_t>(count);
  std::vector<T> in(N * n), out(N), want(N, T{0});
  for (std::size_t k = 0; k < N * n; ++k) in[k] = x(me, k);
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < N; ++i) want[i] += x(p, me * N + i);
  log.ok(c.reduce_scatter(view(in, t), view(out, t)), tag + "reduce_scatter");
  log.same(out, want, tag + "reduce_scatter");
  log.ok(c.reduce_scatter(view(in, t), view(in, t).slice(me * count, count)), tag + "reduce_scatter in place");
  log.same(std::vector<T>(in.begin() + me * N, in.begin() + (me + 1) * N), want, tag + "reduce_scatter in place");

  std::vector<T> data(N), want_all(N, T{0});
  for (std::size_t i = 0; i < N; ++i) data[i] = x(me, i);
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < N; ++i) want_all[i] += x(p, i);
  log.ok(c.all_reduce(view(data, t)), tag + "all_reduce");
  log.same(data, want_all, tag + "all_reduce");
}

// bf16 / fp16 sums: the fp32 sum of the inputs' values, rounded once to the type. The inputs are multiples of
// 1/16 below 2048 (after their own rounding), so their fp32 sum is exact in any order and `want` does not
// depend on how Gloo orders the additions; they are large enough that most sums need rounding.
void check_16bit_sums(Communicator& c, ScalarType t, std::int64_t count, Log& log) {
  const int n = c.size(), me = c.rank();
  const std::string tag = c.name() + " " + to_string(t) + " count " + std::to_string(count) + " ";
  const auto N = static_cast<std::size_t>(count);
  auto x = [](int p, std::int64_t k) {
    return static_cast<float>((p * 9001 + (k * 31) % 4001) * (k % 2 != 0 ? -1 : 1)) / 16.0f;
  };
  auto encoded = [&](int p, std::size_t len) {
    std::vector<float> f(len);
    for (std::size_t k = 0; k < len; ++k) f[k] = x(p, k);
    std::vector<std::uint16_t> e(len);
    encode_floats(t, f.data(), static_cast<std::int64_t>(len), e.data());
    return e;
  };
  // The value position p's element k holds, and the rounded fp32 sum of `sums`.
  auto held = [&](int p, std::int64_t k) { return round_to(t, x(p, k)); };
  bool rounded = false;  // whether some sum was not representable (so the test sees the rounding)
  auto round_once = [&](const std::vector<float>& sums) {
    std::vector<std::uint16_t> e(sums.size());
    encode_floats(t, sums.data(), static_cast<std::int64_t>(sums.size()), e.data());
    for (float s : sums) rounded = rounded || round_to(t, s) != s;
    return e;
  };

  std::vector<std::uint16_t> in = encoded(me, N * n), out(N);
  std::vector<float> sums(N, 0.0f);
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < N; ++i) sums[i] += held(p, me * N + i);
  const std::vector<std::uint16_t> want = round_once(sums);
  log.ok(c.reduce_scatter(view(in, t), view(out, t)), tag + "reduce_scatter");
  log.same(out, want, tag + "reduce_scatter");
  log.ok(c.reduce_scatter(view(in, t), view(in, t).slice(me * count, count)), tag + "reduce_scatter in place");
  log.same(std::vector<std::uint16_t>(in.begin() + me * N, in.begin() + (me + 1) * N), want,
           tag + "reduce_scatter in place");

  std::vector<std::uint16_t> data = encoded(me, N);
  std::vector<float> all_sums(N, 0.0f);
  for (int p = 0; p < n; ++p)
    for (std::size_t i = 0; i < N; ++i) all_sums[i] += held(p, i);
  const std::vector<std::uint16_t> want_all = round_once(all_sums);
  log.ok(c.all_reduce(view(data, t)), tag + "all_reduce");
  log.same(data, want_all, tag + "all_reduce");
  if (n > 1 && count >= 7) log.expect(rounded, tag + "the test data never needed rounding");
}

// fp32 reduce_scatter adds in position order (out = chunk 0, += chunk 1, ...): with inexact data, where the
// order shows in the last bits, the result is that sum bit for bit (the runtime's results do not change).
void check_fp32_sum_order(Communicator& c, std::int64_t count, Log& log) {
  const int n = c.size(), me = c.rank();
  const std::string tag = c.name() + " fp32 order count " + std::to_string(count) + " ";
  const auto N = static_cast<std::size_t>(count);
  auto x = [](int p, std::size_t k) {
    return (p % 2 != 0 ? -1.0f : 1.0f) * (static_cast<float>(k % 13) + 0.1f) * std::pow(10.0f, static_cast<float>(p));
  };
  std::vector<float> in(N * n), out(N), want(N);
  for (std::size_t k = 0; k < N * n; ++k) in[k] = x(me, k);
  for (std::size_t i = 0; i < N; ++i) {
    want[i] = x(0, me * N + i);
    for (int p = 1; p < n; ++p) want[i] += x(p, me * N + i);
  }
  log.ok(c.reduce_scatter(f32(in), f32(out)), tag + "reduce_scatter");
  log.same(out, want, tag + "reduce_scatter");
}

// all_to_all_v where position 0 sends and receives nothing, with null buffers (and the others exchange).
void check_all_to_all_v_empty(Communicator& c, Log& log) {
  const int n = c.size(), me = c.rank();
  const std::string tag = c.name() + " all_to_all_v with an empty position ";
  auto sends = [](int p, int j) { return p == 0 || j == 0 ? std::int64_t{0} : std::int64_t{p + j}; };
  auto value = [](int from, int to, std::int64_t k) { return std::int64_t{from} * 1000000 + to * 1000 + k; };
  std::vector<std::int64_t> send_counts(n), recv_counts(n), in, want;
  for (int j = 0; j < n; ++j) {
    send_counts[j] = sends(me, j);
    for (std::int64_t k = 0; k < send_counts[j]; ++k) in.push_back(value(me, j, k));
    recv_counts[j] = sends(j, me);
    for (std::int64_t k = 0; k < recv_counts[j]; ++k) want.push_back(value(j, me, k));
  }
  std::vector<std::int64_t> out(want.size());
  const Buffer in_b = in.empty() ? Buffer{nullptr, 0, ScalarType::kInt64} : i64(in);
  const Buffer out_b = out.empty() ? Buffer{nullptr, 0, ScalarType::kInt64} : i64(out);
  log.ok(c.all_to_all_v(in_b, i64(send_counts), out_b, i64(recv_counts)), tag);
  log.same(out, want, tag);
}

// Every buffer type: moves bit-exact, sums exact (16-bit: rounded once), int32 sums refused.
void check_every_type(Communicator& c, std::int64_t count, Log& log) {
  check_fp32_sum_order(c, count, log);
  check_all_to_all_v_empty(c, log);
  check_moves<std::uint32_t>(c, ScalarType::kFp32, count, log);
  check_moves<std::uint16_t>(c, ScalarType::kBf16, count, log);
  check_moves<std::uint16_t>(c, ScalarType::kFp16, count, log);
  check_moves<std::uint64_t>(c, ScalarType::kFp64, count, log);
  check_moves<std::uint32_t>(c, ScalarType::kInt32, count, log);
  check_moves<std::uint64_t>(c, ScalarType::kInt64, count, log);
  check_16bit_sums(c, ScalarType::kBf16, count, log);
  check_16bit_sums(c, ScalarType::kFp16, count, log);
  // fp64 values that fp32 cannot hold, int64 values that fp64 cannot hold: only native sums get them right.
  check_native_sums<double>(
      c, ScalarType::kFp64, count, [](int p, std::int64_t k) { return 1e10 + p * 1000.0 + (k % 997) + 0.5; }, log);
  check_native_sums<std::int64_t>(
      c, ScalarType::kInt64, count,
      [](int p, std::int64_t k) { return (p % 2 != 0 ? -1 : 1) * ((std::int64_t{1} << 58) + p * 1000003 + k); }, log);
  const std::string tag = c.name() + " int32 count " + std::to_string(count) + " ";
  std::vector<std::int32_t> a(static_cast<std::size_t>(count) * c.size()), b(static_cast<std::size_t>(count));
  log.refused(c.reduce_scatter(view(a, ScalarType::kInt32), view(b, ScalarType::kInt32)), StatusCode::kUnimplemented,
              {"reduce_scatter on " + c.name(), "int32"}, tag + "reduce_scatter");
  log.refused(c.all_reduce(view(b, ScalarType::kInt32)), StatusCode::kUnimplemented,
              {"all_reduce on " + c.name(), "int32"}, tag + "all_reduce");
}

// Bad arguments: kInvalidInput naming the op, the group and the bad buffer; nothing is sent, so every member
// may run these in any order.
void check_argument_errors(Communicator& c, Log& log) {
  const int n = c.size();
  const std::string tag = c.name() + " ";
  auto bad = [&](const Status& s, const std::string& op, const std::vector<std::string>& parts,
                 const std::string& what) {
    std::vector<std::string> all = {op + " on " + c.name() + " (global ranks ["};
    all.insert(all.end(), parts.begin(), parts.end());
    log.refused(s, StatusCode::kInvalidInput, all, tag + what);
    log.expect(s.message().rfind(op + " on ", 0) == 0, tag + what + ": message does not start with the op");
  };
  std::vector<float> f(4 * n + 4, 0.0f);
  std::vector<std::uint16_t> h(4 * n + 4, 0);
  const Buffer fb = f32(f), hb = view(h, ScalarType::kBf16);

  bad(c.all_gather(fb.slice(0, 2), hb.slice(0, 2 * n)), "all_gather", {"fp32", "bf16"}, "type mismatch");
  bad(c.all_gather(fb.slice(0, 2), fb.slice(0, 2 * n + 1)), "all_gather", {"out (" + std::to_string(2 * n + 1)},
      "wrong out size");
  bad(c.reduce_scatter(fb.slice(0, 2 * n + 1), fb.slice(0, 2)), "reduce_scatter", {"in (" + std::to_string(2 * n + 1)},
      "wrong in size");
  bad(c.reduce_scatter(hb.slice(0, 2 * n), fb.slice(0, 2)), "reduce_scatter", {"bf16", "fp32"}, "type mismatch");
  bad(c.all_to_all(fb.slice(0, 2 * n), fb.slice(0, 2 * n + 1)), "all_to_all", {"out (", "in ("}, "in/out mismatch");
  if (n > 1)
    bad(c.all_to_all(fb.slice(0, n + 1), fb.slice(0, n + 1)), "all_to_all", {"in (", "equal chunks"},
        "indivisible count");
  bad(c.all_to_all(fb.slice(0, 2 * n), hb.slice(0, 2 * n)), "all_to_all", {"fp32", "bf16"}, "type mismatch");
  bad(c.all_reduce(Buffer{f.data(), -1, ScalarType::kFp32}), "all_reduce", {"data", "negative"}, "negative count");
  bad(c.all_reduce(Buffer{nullptr, 4, ScalarType::kFp32}), "all_reduce", {"data", "null"}, "null buffer");
  bad(c.reduce_scatter(Buffer{f.data(), std::numeric_limits<std::int64_t>::max(), ScalarType::kFp32}, fb.slice(0, 1)),
      "reduce_scatter", {"in (", "size limit"}, "huge count");
  bad(c.broadcast(fb.slice(0, 1), n), "broadcast", {"root"}, "bad root");
  bad(c.broadcast(fb.slice(0, 1), -1), "broadcast", {"root"}, "negative root");

  // all_to_all_v: the count buffers (int64, one per position), their sums against in and out's capacity.
  std::vector<std::int64_t> ones(n + 1, 1), zeros(n, 0), negative(n, 0), too_many(n, 0);
  std::vector<float> fcounts(n, 1.0f);
  negative[n - 1] = -1;
  too_many[0] = 5;
  const Buffer counts1 = i64(ones).slice(0, n), zero = i64(zeros);
  bad(c.all_to_all_v(fb.slice(0, n), f32(fcounts), fb.slice(0, n), counts1), "all_to_all_v", {"send_counts", "int64"},
      "fp32 send counts");
  bad(c.all_to_all_v(fb.slice(0, n), counts1, fb.slice(0, n), i64(ones)), "all_to_all_v",
      {"recv_counts (" + std::to_string(n + 1)}, "too many recv counts");
  bad(c.all_to_all_v(fb.slice(0, n), i64(negative), fb.slice(0, n), zero), "all_to_all_v",
      {"send_counts[" + std::to_string(n - 1) + "]", "negative"}, "negative send count");
  bad(c.all_to_all_v(fb.slice(0, n), zero, fb.slice(0, n), i64(negative)), "all_to_all_v",
      {"recv_counts[" + std::to_string(n - 1) + "]", "negative"}, "negative recv count");
  bad(c.all_to_all_v(fb.slice(0, 4), i64(too_many), fb.slice(0, 8), zero), "all_to_all_v", {"send_counts[0]", "in ("},
      "sends beyond in");
  bad(c.all_to_all_v(fb.slice(0, 8), zero, fb.slice(0, 4), i64(too_many)), "all_to_all_v",
      {"recv_counts[0]", "capacity", "out ("}, "capacity too small");
  bad(c.all_to_all_v(fb.slice(0, n), counts1, hb.slice(0, n), counts1), "all_to_all_v", {"fp32", "bf16"},
      "type mismatch");
  if (n == 1)  // a group of one receives exactly what it sends itself
    bad(c.all_to_all_v(fb.slice(0, 2), i64(ones).slice(0, 1), fb.slice(0, 8), i64(too_many).slice(0, 1)),
        "all_to_all_v", {"recv_counts[0] = 5", "sends itself 1"}, "solo count mismatch");

  // Zero counts are no-ops, null pointers included.
  const Buffer null0{nullptr, 0, ScalarType::kFp32};
  log.ok(c.all_reduce(null0), tag + "all_reduce of 0");
  log.ok(c.all_gather(null0, null0), tag + "all_gather of 0");
  log.ok(c.reduce_scatter(null0, null0), tag + "reduce_scatter of 0");
  log.ok(c.all_to_all(null0, null0), tag + "all_to_all of 0");
  log.ok(c.broadcast(null0, 0), tag + "broadcast of 0");
}

}  // namespace

// --- MemoryPool ------------------------------------------------------------------------------------------

TEST_CASE("backend: the memory pool hands out zeroed, 64-byte aligned typed pieces accounted per category",
          "[backend]") {
  CpuMemoryPool pool(4096);
  CHECK(pool.capacity_bytes() == 4096);
  auto a = pool.allocate("params", 1, ScalarType::kFp32);   // 4 bytes -> one 64-byte piece
  auto b = pool.allocate("grads", 17, ScalarType::kFp32);   // 68 bytes -> 128
  auto c = pool.allocate("params", 16, ScalarType::kFp32);  // 64 bytes -> 64
  auto d = pool.allocate("scratch", 0, ScalarType::kFp32);  // nothing
  auto e = pool.allocate("acts", 33, ScalarType::kBf16);    // 66 bytes -> 128
  auto f = pool.allocate("counts", 8, ScalarType::kInt64);  // 64 bytes -> 64
  auto g = pool.allocate("params", 3, DType::kFp16);        // the schedule's dtype: 6 bytes -> 64
  for (auto* r : {&a, &b, &c, &d, &e, &f, &g}) REQUIRE(r->ok());
  for (auto* r : {&a, &b, &c, &e, &f, &g}) CHECK(reinterpret_cast<std::uintptr_t>(r->value().data) % 64 == 0);
  CHECK(b->as<char>() - a->as<char>() == 64);
  CHECK(c->as<char>() - b->as<char>() == 128);
  CHECK(d->data != nullptr);  // a zero-size piece is a valid pointer
  CHECK(b->count == 17);
  CHECK(b->type == ScalarType::kFp32);
  CHECK(e->type == ScalarType::kBf16);
  CHECK(e->bytes() == 66);
  CHECK(g->type == ScalarType::kFp16);
  for (int i = 0; i < 17; ++i) CHECK(b->as<float>()[i] == 0.0f);
  for (int i = 0; i < 33; ++i) CHECK(e->as<std::uint16_t>()[i] == 0);
  CHECK(pool.used_bytes() == 64 + 128 + 64 + 0 + 128 + 64 + 64);
  CHECK(pool.bytes_by_category().at("params") == 192);
  CHECK(pool.bytes_by_category().at("grads") == 128);
  CHECK(pool.bytes_by_category().at("scratch") == 0);
  CHECK(pool.bytes_by_category().at("acts") == 128);
  CHECK(pool.bytes_by_category().at("counts") == 64);
  CHECK(pool_piece_bytes(33, ScalarType::kBf16) == 128);  // the rounding the pool uses
}

TEST_CASE("backend: memory pool exhaustion names the category and the sizes", "[backend]") {
  CpuMemoryPool pool(1024);
  REQUIRE(pool.allocate("params", 200, ScalarType::kFp32).ok());  // 800 -> 832 bytes
  auto big = pool.allocate("optimizer", 100, ScalarType::kFp32);  // 400 -> 448 bytes > 192 free
  REQUIRE_FALSE(big.ok());
  CHECK_THAT(big.status().message(), Catch::Contains("optimizer") && Catch::Contains("448 bytes (100 fp32 elements)") &&
                                         Catch::Contains("192 of 1024 bytes are free"));
  auto wide = pool.allocate("acts", 100, ScalarType::kFp64);  // 800 bytes
  REQUIRE_FALSE(wide.ok());
  CHECK_THAT(wide.status().message(), Catch::Contains("acts") && Catch::Contains("832 bytes (100 fp64 elements)"));
  CHECK(pool.used_bytes() == 832);                                // a failed request takes nothing
  CHECK(pool.allocate("optimizer", 96, ScalarType::kBf16).ok());  // exactly the rest
  CHECK(pool.used_bytes() == 1024);
  CHECK_FALSE(pool.allocate("x", 1, ScalarType::kFp32).ok());
  auto full_zero = pool.allocate("x", 0, ScalarType::kInt64);  // still fits: zero bytes
  REQUIRE(full_zero.ok());
  CHECK(full_zero->data != nullptr);
  auto negative = pool.allocate("x", -1, ScalarType::kFp32);
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().code() == StatusCode::kInvalidInput);
  CHECK_THAT(negative.status().message(), Catch::Contains("'x'") && Catch::Contains("negative"));
  for (ScalarType t : {ScalarType::kFp32, ScalarType::kBf16, ScalarType::kInt64}) {
    auto impossible = pool.allocate("huge", std::numeric_limits<std::int64_t>::max(), t);
    REQUIRE_FALSE(impossible.ok());
    CHECK(impossible.status().code() == StatusCode::kInvalidInput);
    CHECK_THAT(impossible.status().message(), Catch::Contains("'huge'") && Catch::Contains("impossible size"));
  }
  CpuMemoryPool empty(0);
  CHECK_FALSE(empty.allocate("x", 1, ScalarType::kFp32).ok());
  auto nothing = empty.allocate("x", 0, ScalarType::kFp32);
  REQUIRE(nothing.ok());
  CHECK(nothing->data != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(nothing->data) % kPoolAlignment == 0);
}

// --- Events and streams ----------------------------------------------------------------------------------

TEST_CASE("backend: an event completes once, and a host wait on an unfinished one times out", "[backend]") {
  CpuEvent e;
  CHECK_FALSE(e.done());
  const auto t = e.synchronize(50ms);
  CHECK_FALSE(t.ok());
  CHECK_THAT(t.message(), Catch::Contains("timed out"));
  e.complete(Status::Internal("first"));
  e.complete(Status::Ok());  // ignored
  CHECK(e.done());
  CHECK(e.synchronize(0ms).message() == "first");
}

TEST_CASE("backend: a stream runs its work in order on its own thread", "[backend]") {
  CpuStream s("compute");
  CHECK(s.name() == "compute");
  std::vector<int> order;
  std::vector<EventPtr> events;
  const auto caller = std::this_thread::get_id();
  std::atomic<bool> other_thread{true};
  for (int i = 0; i < 200; ++i)
    events.push_back(s.submit([&, i] {
      if (std::this_thread::get_id() == caller) other_thread = false;
      order.push_back(i);
      return Status::Ok();
    }));
  REQUIRE(s.synchronize().ok());
  for (auto& e : events) CHECK(e->done());
  REQUIRE(order.size() == 200);
  for (int i = 0; i < 200; ++i) CHECK(order[i] == i);
  CHECK(other_thread);
}

TEST_CASE("backend: a stream waiting on another stream's event starts later work only after it", "[backend]") {
  CpuStream a("comm"), b("compute");
  std::atomic<bool> produced{false};
  std::atomic<bool> seen_before{false};
  a.submit([&] {
    std::this_thread::sleep_for(100ms);
    produced = true;
    return Status::Ok();
  });
  EventPtr ready = a.record();
  b.wait(ready);
  auto consumed = b.submit([&] {
    seen_before = produced.load();
    return Status::Ok();
  });
  REQUIRE(wait_event(consumed).ok());
  CHECK(seen_before);
  CHECK(ready->done());
  CHECK(b.synchronize().ok());
}

TEST_CASE("backend: a failure poisons the stream, its later events and a stream waiting on them", "[backend]") {
  CpuStream a("comm"), b("compute");
  std::atomic<int> ran_a{0}, ran_b{0};
  auto before = a.submit([&] { return ++ran_a, Status::Ok(); });
  auto fails = a.submit([&] { return ++ran_a, Status::Internal("all_gather on g failed: boom"); });
  auto after = a.submit([&] { return ++ran_a, Status::Ok(); });
  auto recorded = a.record();
  b.submit([&] { return ++ran_b, Status::Ok(); });
  b.wait(recorded);
  auto b_after = b.submit([&] { return ++ran_b, Status::Ok(); });

  CHECK(wait_event(before).ok());
  CHECK(wait_event(fails).message() == "all_gather on g failed: boom");
  CHECK(wait_event(after).message() == "all_gather on g failed: boom");
  CHECK(wait_event(recorded).message() == "all_gather on g failed: boom");
  CHECK(wait_event(b_after).message() == "all_gather on g failed: boom");  // no hang: completes with the failure
  CHECK(a.synchronize().message() == "all_gather on g failed: boom");
  CHECK(b.synchronize().message() == "all_gather on g failed: boom");
  CHECK(ran_a == 2);  // the item after the failure was skipped
  CHECK(ran_b == 1);  // only the work before the wait ran

  // A throwing work item is a failure too.
  CpuStream c("thrower");
  auto threw = c.submit([]() -> Status { throw std::runtime_error("kaboom"); });
  CHECK_THAT(wait_event(threw).message(), Catch::Contains("kaboom") && Catch::Contains("thrower"));
}

TEST_CASE("backend: a stream waiting on an event that completes late is released, not hung", "[backend]") {
  CpuStream s("waiter");
  auto manual = std::make_shared<CpuEvent>();
  s.wait(manual);
  std::atomic<bool> ran{false};
  auto later = s.submit([&] { return ran = true, Status::Ok(); });
  std::this_thread::sleep_for(50ms);
  CHECK_FALSE(ran);
  manual->complete(Status::Internal("peer died"));
  CHECK(wait_event(later).message() == "peer died");
  CHECK_FALSE(ran);
}

TEST_CASE("backend: destroying a stream finishes its queued work first", "[backend]") {
  std::atomic<int> done{0};
  std::vector<EventPtr> events;
  {
    CpuStream s("drain");
    for (int i = 0; i < 20; ++i)
      events.push_back(s.submit([&] {
        std::this_thread::sleep_for(2ms);
        ++done;
        return Status::Ok();
      }));
  }
  CHECK(done == 20);
  for (auto& e : events) CHECK(e->done());
}

// --- Gloo communicators ----------------------------------------------------------------------------------

TEST_CASE("backend: Gloo communicators of 1, 2, 3 and 4 ranks match locally computed results", "[backend][gloo]") {
  World w = make_world();
  run_ranks(4, [&](int me, Log& log) {
    // Size 1: no rendezvous, no network, copies only.
    auto solo = connect(w, me, {me}, "", "solo[" + std::to_string(me) + "]", log);
    // Pairs {0,1} and {2,3}; a permuted group of three {2,0,3} (rank 1 not a member); all four.
    const std::vector<int> pair = me < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    auto two = connect(w, me, pair, "pair/" + std::to_string(pair[0]), "pair" + std::to_string(pair[0]), log);
    std::unique_ptr<Communicator> three;
    if (me != 1) three = connect(w, me, {2, 0, 3}, "three", "three[2,0,3]", log);
    auto four = connect(w, me, {0, 1, 2, 3}, "four", "four[0,1,2,3]", log);
    if (!log.failures.empty()) return;

    log.expect(solo->size() == 1 && solo->rank() == 0, "solo shape");
    log.expect(two->size() == 2 && two->rank() == me % 2, "pair shape");
    log.expect(two->global_ranks() == pair, "pair global ranks");
    if (three) log.expect(three->size() == 3 && three->rank() == (me == 2 ? 0 : me == 0 ? 1 : 2), "three shape");
    log.expect(four->size() == 4 && four->rank() == me && four->name() == "four[0,1,2,3]", "four shape");

    for (std::int64_t count : {1, 7, 70001}) {
      check_every_op(*solo, count, log);
      check_every_op(*two, count, log);
      if (three) check_every_op(*three, count, log);
      check_every_op(*four, count, log);
    }
    // Bad arguments are errors naming the op, the group and the buffer, never crashes.
    for (Communicator* c : {solo.get(), two.get(), four.get()}) check_argument_errors(*c, log);
    // The communicators still work after argument errors.
    check_every_op(*two, 3, log);
    check_every_op(*four, 3, log);
  });
}

TEST_CASE("backend: Gloo collectives move every buffer type bit-exactly and sum fp64, int64, bf16 and fp16",
          "[backend][gloo]") {
  World w = make_world();
  run_ranks(4, [&](int me, Log& log) {
    auto solo = connect(w, me, {me}, "", "solo[" + std::to_string(me) + "]", log);
    const std::vector<int> pair = me < 2 ? std::vector<int>{0, 1} : std::vector<int>{2, 3};
    auto two = connect(w, me, pair, "tpair/" + std::to_string(pair[0]), "tpair" + std::to_string(pair[0]), log);
    std::unique_ptr<Communicator> three;
    if (me != 1) three = connect(w, me, {2, 0, 3}, "tthree", "tthree[2,0,3]", log);
    auto four = connect(w, me, {0, 1, 2, 3}, "tfour", "tfour[0,1,2,3]", log);
    if (!log.failures.empty()) return;
    for (std::int64_t count : {1, 7, 3001}) {
      check_every_type(*solo, count, log);
      check_every_type(*two, count, log);
      if (three) check_every_type(*three, count, log);
      check_every_type(*four, count, log);
    }
  });
}

TEST_CASE("backend: collectives submitted on a stream run there, in order", "[backend][gloo]") {
  World w = make_world();
  run_ranks(4, [&](int me, Log& log) {
    auto c = connect(w, me, {0, 1, 2, 3}, "async", "async[0,1,2,3]", log);
    if (!c) return;
    const int n = 4;
    const std::size_t N = 1000;
    std::vector<float> gin(N), gout(N * n), rsin(N * n), rsout(N), ar(N), bc(N), a2ain(N * n), a2aout(N * n);
    std::vector<float> gwant(N * n), rswant(N, 0.0f), arwant(N, 0.0f), bcwant(N), a2awant(N * n);
    for (std::size_t i = 0; i < N; ++i) {
      gin[i] = ar[i] = bc[i] = v(me, i);
      bcwant[i] = v(2, i);
      for (int p = 0; p < n; ++p) {
        gwant[p * N + i] = v(p, i);
        rswant[i] += v(p, me * N + i);
        arwant[i] += v(p, i);
        a2awant[p * N + i] = v(p, me * N + i);
      }
    }
    for (std::size_t k = 0; k < N * n; ++k) rsin[k] = a2ain[k] = v(me, k);
    CpuStream s("comm" + std::to_string(me));
    Communicator& comm = *c;
    std::vector<EventPtr> events = {
        s.submit([&] { return comm.all_gather(f32(gin), f32(gout)); }),
        s.submit([&] { return comm.reduce_scatter(f32(rsin), f32(rsout)); }),
        s.submit([&] { return comm.all_reduce(f32(ar)); }),
        s.submit([&] { return comm.broadcast(f32(bc), 2); }),
        s.submit([&] { return comm.all_to_all(f32(a2ain), f32(a2aout)); }),
    };
    for (auto& e : events) log.ok(wait_event(e), "stream event");
    log.ok(s.synchronize(), "stream");
    log.same(gout, gwant, "stream all_gather");
    log.same(rsout, rswant, "stream reduce_scatter");
    log.same(ar, arwant, "stream all_reduce");
    log.same(bc, bcwant, "stream broadcast");
    log.same(a2aout, a2awant, "stream all_to_all");
  });
}

TEST_CASE("backend: two communicators over the same ranks work concurrently from two streams", "[backend][gloo]") {
  World w = make_world();
  run_ranks(4, [&](int me, Log& log) {
    auto compute = connect(w, me, {0, 1, 2, 3}, "dp/compute", "dp[0,1,2,3]/compute", log);
    auto comm = connect(w, me, {0, 1, 2, 3}, "dp/comm", "dp[0,1,2,3]/comm", log);
    if (!compute || !comm) return;
    CpuStream sa("compute" + std::to_string(me)), sb("comm" + std::to_string(me));
    constexpr int kRounds = 20;
    constexpr std::size_t N = 4096;
    std::vector<std::vector<float>> reduced(kRounds, std::vector<float>(N)),
        gathered(kRounds, std::vector<float>(N * 4));
    std::vector<std::vector<float>> shards(kRounds, std::vector<float>(N));
    for (int r = 0; r < kRounds; ++r)
      for (std::size_t i = 0; i < N; ++i) reduced[r][i] = v(me, i + r), shards[r][i] = v(me, i * 3 + r);
    for (int r = 0; r < kRounds; ++r) {
      sa.submit([&, r] { return compute->all_reduce(f32(reduced[r])); });
      sb.submit([&, r] { return comm->all_gather(f32(shards[r]), f32(gathered[r])); });
    }
    log.ok(sa.synchronize(), "compute stream");
    log.ok(sb.synchronize(), "comm stream");
    for (int r = 0; r < kRounds; ++r) {
      std::vector<float> want_r(N, 0.0f), want_g(N * 4);
      for (int p = 0; p < 4; ++p)
        for (std::size_t i = 0; i < N; ++i) want_r[i] += v(p, i + r), want_g[p * N + i] = v(p, i * 3 + r);
      log.same(reduced[r], want_r, "round " + std::to_string(r) + " all_reduce");
      log.same(gathered[r], want_g, "round " + std::to_string(r) + " all_gather");
    }
  });
}

TEST_CASE("backend: a rank that never joins a collective is an error naming the group, not a hang", "[backend][gloo]") {
  World w = make_world();
  std::promise<void> rank0_done;
  auto rank0_done_f = rank0_done.get_future().share();
  std::string error, later_error, peer_error;
  std::chrono::milliseconds waited{0};
  run_ranks(2, [&](int me, Log& log) {
    auto c = connect(w, me, {0, 1}, "fault", "fault_pair", log, 1000ms);
    if (me == 0) {
      if (!c) return rank0_done.set_value();
      std::vector<float> data(16, 1.0f);
      const auto t0 = std::chrono::steady_clock::now();
      const Status s = c->all_reduce(f32(data));  // rank 1 never calls it
      waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0);
      error = s.message();
      log.expect(!s.ok(), "all_reduce without the peer succeeded");
      later_error = c->barrier().message();  // the communicator stays failed
      c.reset();
      rank0_done.set_value();
    } else {
      rank0_done_f.wait();  // stays out of the all_reduce; then finds its peer gone
      if (!c) return;
      std::vector<float> data(16, 1.0f);
      const Status s = c->all_reduce(f32(data));
      log.expect(!s.ok(), "all_reduce with a departed peer succeeded");
      peer_error = s.message();
    }
  });
  INFO(error);
  CHECK_THAT(error, Catch::StartsWith("all_reduce on fault_pair (global ranks [0,1]) failed: "));
  CHECK(waited < 5s);
  CHECK_THAT(later_error,
             Catch::StartsWith("barrier on fault_pair (global ranks [0,1]) failed: ") && Catch::Contains("unusable"));
  CHECK_THAT(peer_error, Catch::StartsWith("all_reduce on fault_pair (global ranks [0,1]) failed: "));
}

TEST_CASE("backend: a rendezvous with a missing member fails naming the group, bad groups are refused",
          "[backend][gloo]") {
  World w = make_world();
  const auto t0 = std::chrono::steady_clock::now();
  auto c = make_gloo_communicator(w.address, 0, {0, 1}, "lonely", "lonely_pair", w.device, opts_with_timeout(500ms));
  REQUIRE_FALSE(c.ok());
  CHECK(std::chrono::steady_clock::now() - t0 < 5s);
  CHECK_THAT(c.status().message(), Catch::Contains("lonely_pair (global ranks [0,1])"));

  CHECK(make_gloo_communicator(w.address, 2, {0, 1}, "k", "g", w.device, {}).status().code() ==
        StatusCode::kInvalidInput);
  CHECK(make_gloo_communicator(w.address, 0, {0, 0}, "k", "g", w.device, {}).status().code() ==
        StatusCode::kInvalidInput);
  CHECK(make_gloo_communicator(w.address, 0, {}, "k", "g", w.device, {}).status().code() == StatusCode::kInvalidInput);
  CHECK(make_gloo_communicator(w.address, 0, {0, 1}, "k", "g", nullptr, {}).status().code() ==
        StatusCode::kInvalidInput);
  StoreAddress wrong = w.address;
  wrong.token = "guess";
  auto refused = make_gloo_communicator(wrong, 0, {0, 1}, "k", "g", w.device, opts_with_timeout(500ms));
  REQUIRE_FALSE(refused.ok());
  CHECK_THAT(refused.status().message(), Catch::Contains("g (global ranks [0,1])"));
  GlooOptions bad_address;
  bad_address.interface_address = "not-an-address.invalid";
  auto unresolvable = make_gloo_device(bad_address);
  REQUIRE_FALSE(unresolvable.ok());
  CHECK_THAT(unresolvable.status().message(), Catch::Contains("not-an-address.invalid"));
  bad_address.interface_address = "192.0.2.1";  // TEST-NET-1: resolvable, but not an address of this machine
  CHECK_FALSE(make_gloo_device(bad_address).ok());
}

// --- The "cpu" device ------------------------------------------------------------------------------------

TEST_CASE("backend: the cpu device without a store has memory, streams and kernels but no communicators", "[backend]") {
  auto made = make_device("cpu", BackendOptions{});
  REQUIRE(made.ok());
  Device& device = *made.value();
  CHECK(device.description() == "cpu (host memory, a thread per stream, reference kernels, Gloo over TCP)");
  auto pool = device.create_pool(4096);
  REQUIRE(pool != nullptr);
  auto buffer = pool->allocate("x", 8, ScalarType::kFp32);
  REQUIRE(buffer.ok());
  auto stream = device.create_stream("compute");
  REQUIRE(stream != nullptr);
  CHECK(stream->name() == "compute");
  auto kernels = device.create_kernels(*stream);
  REQUIRE(kernels != nullptr);
  CHECK(&kernels->stream() == stream.get());
  // The kernels run from the stream's work; the host reads the result after synchronising.
  std::vector<float> host = {1, 2, 3, 4, 5, 6, 7, 8}, back(8, -1.0f), filled(8, -1.0f);
  const Buffer b = *buffer;
  stream->submit([&] {
    kernels->copy_from_host(host.data(), b);
    kernels->copy_to_host(b, back.data());
    kernels->fill(b, 3.0);
    kernels->copy_to_host(b, filled.data());
    return kernels->status();
  });
  REQUIRE(stream->synchronize().ok());
  CHECK(back == host);
  CHECK(filled == std::vector<float>(8, 3.0f));

  for (const std::vector<int>& ranks : {std::vector<int>{0}, std::vector<int>{0, 1}}) {
    auto c = device.create_communicator(ranks, "k", "no_store_group", *stream);
    REQUIRE_FALSE(c.ok());
    CHECK(c.status().code() == StatusCode::kInvalidInput);
    CHECK_THAT(c.status().message(), Catch::Contains("no store: this device was made without a rendezvous store"));
  }

  auto nope = make_device("nope", BackendOptions{});
  REQUIRE_FALSE(nope.ok());
  CHECK(nope.status().code() == StatusCode::kInvalidInput);
  CHECK_THAT(nope.status().message(), Catch::Contains("cpu"));  // the backends this build has
}

TEST_CASE("backend: the cpu device's communicators rendezvous through its store under hzp/comm/", "[backend][gloo]") {
  World w = make_world();
  run_ranks(4, [&](int me, Log& log) {
    BackendOptions options;
    options.store = w.address;
    options.global_rank = me;
    options.timeout = 10s;
    auto made = make_device("cpu", options);
    if (!made.ok()) return log.failures.push_back("make_device: " + made.status().message());
    Device& device = *made.value();
    auto stream = device.create_stream("comm" + std::to_string(me));
    // Even ranks through the device, odd ranks straight through Gloo with the prefixed key: they meet only if
    // the device puts its keys under "hzp/comm/".
    std::unique_ptr<Communicator> c;
    if (me % 2 == 0) {
      auto made_c = device.create_communicator({0, 1, 2, 3}, "dev", "dev[0,1,2,3]", *stream);
      if (!made_c.ok()) return log.failures.push_back("create_communicator: " + made_c.status().message());
      c = std::move(made_c).value();
    } else {
      c = connect(w, me, {0, 1, 2, 3}, "hzp/comm/dev", "dev[0,1,2,3]", log);
      if (!c) return;
    }
    auto solo = device.create_communicator({me}, "solo", "solo", *stream);
    if (!solo.ok()) return log.failures.push_back("solo: " + solo.status().message());
    // Work on the stream, as the executor issues it.
    Communicator& comm = *c;
    std::vector<std::int64_t> data = {me, 10 * me}, want = {0 + 1 + 2 + 3, 0 + 10 + 20 + 30};
    std::vector<float> shard(5, static_cast<float>(me)), gathered(20), gwant;
    for (int p = 0; p < 4; ++p) gwant.insert(gwant.end(), 5, static_cast<float>(p));
    stream->submit([&] { return comm.all_reduce(i64(data)); });
    stream->submit([&] { return comm.all_gather(f32(shard), f32(gathered)); });
    log.ok(stream->synchronize(), "device communicator");
    log.same(data, want, "device all_reduce");
    log.same(gathered, gwant, "device all_gather");
    check_every_op(*solo.value(), 5, log);
  });

  // The TCP device is made on the first communicator: a bad interface address only fails there.
  BackendOptions bad;
  bad.store = w.address;
  bad.interface_address = "not-an-address.invalid";
  auto made = make_device("cpu", bad);
  REQUIRE(made.ok());
  auto stream = made.value()->create_stream("s");
  auto c = made.value()->create_communicator({0, 1}, "bad", "bad_pair", *stream);
  REQUIRE_FALSE(c.ok());
  CHECK_THAT(c.status().message(), Catch::Contains("not-an-address.invalid"));
}
