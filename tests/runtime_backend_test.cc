// The CPU backend (runtime/backend): the memory pool, events and streams (ordering, cross-stream waits,
// poisoning, draining on destruction), and the Gloo communicator checked op by op against locally computed
// results, with 4 ranks as threads of this process rendezvousing through a StoreServer on 127.0.0.1.
//
// Catch2 assertions are not thread-safe: rank threads record failures as strings, checked on the main thread.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "runtime/backend/device.h"
#include "runtime/backend/gloo_comm.h"
#include "runtime/store/store.h"

using namespace hzp;
using namespace hzp::runtime;
using namespace std::chrono_literals;

namespace {

// --- Streams and events ----------------------------------------------------------------------------------

Status wait_event(const EventPtr& e) {
  return e->synchronize(10s);
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

// Per-rank failure log (Catch2 macros stay on the main thread).
struct Log {
  std::vector<std::string> failures;
  void expect(bool ok, const std::string& what) {
    if (!ok) failures.push_back(what);
  }
  void ok(const Status& s, const std::string& what) {
    if (!s.ok()) failures.push_back(what + ": " + s.message());
  }
  void same(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
    if (got.size() != want.size()) {
      failures.push_back(what + ": size " + std::to_string(got.size()) + " != " + std::to_string(want.size()));
      return;
    }
    for (std::size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i]) {
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

// Every op on `c` against its expected result; every member of the group runs the same sequence.
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
    log.ok(c.all_gather(in.data(), out.data(), count), tag + "all_gather");
    log.same(out, want, tag + "all_gather");
    std::vector<float> buf(N * n, -1.0f);
    std::copy(in.begin(), in.end(), buf.begin() + me * N);
    log.ok(c.all_gather(buf.data() + me * N, buf.data(), count), tag + "all_gather in place");
    log.same(buf, want, tag + "all_gather in place");
  }
  // reduce_scatter, out of place and with out aliasing in + rank * count.
  {
    std::vector<float> in(N * n), out(N, -1.0f), want(N, 0.0f);
    for (std::size_t k = 0; k < N * n; ++k) in[k] = v(me, k);
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < N; ++i) want[i] += v(p, me * N + i);
    log.ok(c.reduce_scatter(in.data(), out.data(), count), tag + "reduce_scatter");
    log.same(out, want, tag + "reduce_scatter");
    log.ok(c.reduce_scatter(in.data(), in.data() + me * N, count), tag + "reduce_scatter in place");
    log.same(std::vector<float>(in.begin() + me * N, in.begin() + (me + 1) * N), want, tag + "reduce_scatter in place");
  }
  // all_reduce.
  {
    std::vector<float> data(N), want(N, 0.0f);
    for (std::size_t i = 0; i < N; ++i) data[i] = v(me, i);
    for (int p = 0; p < n; ++p)
      for (std::size_t i = 0; i < N; ++i) want[i] += v(p, i);
    log.ok(c.all_reduce(data.data(), count), tag + "all_reduce");
    log.same(data, want, tag + "all_reduce");
  }
  // broadcast from the last position (non-zero unless the group is one rank).
  {
    const int root = n - 1;
    std::vector<float> data(N), want(N);
    for (std::size_t i = 0; i < N; ++i) data[i] = v(me, i), want[i] = v(root, i);
    log.ok(c.broadcast(data.data(), count, root), tag + "broadcast");
    log.same(data, want, tag + "broadcast");
  }
  // all_to_all: chunk j of position p goes to position j.
  {
    std::vector<float> in(N * n), out(N * n, -1.0f), want(N * n);
    for (std::size_t k = 0; k < N * n; ++k) in[k] = v(me, k);
    for (int j = 0; j < n; ++j)
      for (std::size_t i = 0; i < N; ++i) want[j * N + i] = v(j, me * N + i);
    log.ok(c.all_to_all(in.data(), out.data(), count), tag + "all_to_all");
    log.same(out, want, tag + "all_to_all");
  }
  // all_to_all_v with uneven and zero counts: position p sends (p + 2j + count) % 3 floats to position j.
  {
    auto sends = [&](int p, int j) { return static_cast<std::int64_t>((p + 2 * j + count) % 3); };
    auto value = [](int from, int to, std::int64_t k) { return static_cast<float>(from * 10000 + to * 100 + k); };
    std::vector<std::int64_t> send_counts(n), want_counts(n);
    std::vector<float> in, want;
    for (int j = 0; j < n; ++j) {
      send_counts[j] = sends(me, j);
      for (std::int64_t k = 0; k < send_counts[j]; ++k) in.push_back(value(me, j, k));
      want_counts[j] = sends(j, me);
      for (std::int64_t k = 0; k < want_counts[j]; ++k) want.push_back(value(j, me, k));
    }
    std::vector<float> out = {42.0f};
    std::vector<std::int64_t> recv_counts;
    log.ok(c.all_to_all_v(in.data(), send_counts, out, recv_counts), tag + "all_to_all_v");
    log.expect(recv_counts == want_counts, tag + "all_to_all_v recv counts");
    log.same(out, want, tag + "all_to_all_v");
  }
  log.ok(c.barrier(), tag + "barrier");
}

}  // namespace

// --- MemoryPool ------------------------------------------------------------------------------------------

TEST_CASE("backend: the memory pool hands out zeroed, 64-byte aligned pieces accounted per category", "[backend]") {
  CpuMemoryPool pool(4096);
  CHECK(pool.capacity_bytes() == 4096);
  auto a = pool.allocate("params", 1);   // 4 bytes -> one 64-byte piece
  auto b = pool.allocate("grads", 17);   // 68 bytes -> 128
  auto c = pool.allocate("params", 16);  // 64 bytes -> 64
  auto d = pool.allocate("scratch", 0);  // nothing
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(c.ok());
  REQUIRE(d.ok());
  for (float* p : {*a, *b, *c}) CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
  CHECK(*b - *a == 16);
  CHECK(*c - *b == 32);
  for (int i = 0; i < 17; ++i) CHECK((*b)[i] == 0.0f);
  CHECK(pool.used_bytes() == 256);
  CHECK(pool.bytes_by_category().at("params") == 128);
  CHECK(pool.bytes_by_category().at("grads") == 128);
  CHECK(pool.bytes_by_category().at("scratch") == 0);
}

TEST_CASE("backend: memory pool exhaustion names the category and the sizes", "[backend]") {
  CpuMemoryPool pool(1024);
  REQUIRE(pool.allocate("params", 200).ok());  // 800 -> 832 bytes
  auto big = pool.allocate("optimizer", 100);  // 400 -> 448 bytes > 192 free
  REQUIRE_FALSE(big.ok());
  CHECK_THAT(big.status().message(), Catch::Contains("optimizer") && Catch::Contains("448 bytes (100 fp32 elements)") &&
                                         Catch::Contains("192 of 1024 bytes are free"));
  CHECK(pool.used_bytes() == 832);             // a failed request takes nothing
  CHECK(pool.allocate("optimizer", 48).ok());  // exactly the rest
  CHECK(pool.used_bytes() == 1024);
  CHECK_FALSE(pool.allocate("x", 1).ok());
  CHECK_FALSE(pool.allocate("x", -1).ok());
  CHECK_FALSE(pool.allocate("x", std::numeric_limits<std::int64_t>::max()).ok());
  CpuMemoryPool empty(0);
  CHECK_FALSE(empty.allocate("x", 1).ok());
  CHECK(empty.allocate("x", 0).ok());
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
    events.push_back(s.enqueue([&, i] {
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
  a.enqueue([&] {
    std::this_thread::sleep_for(100ms);
    produced = true;
    return Status::Ok();
  });
  EventPtr ready = a.record();
  b.wait(ready);
  auto consumed = b.enqueue([&] {
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
  auto before = a.enqueue([&] { return ++ran_a, Status::Ok(); });
  auto fails = a.enqueue([&] { return ++ran_a, Status::Internal("all_gather on g failed: boom"); });
  auto after = a.enqueue([&] { return ++ran_a, Status::Ok(); });
  auto recorded = a.record();
  b.enqueue([&] { return ++ran_b, Status::Ok(); });
  b.wait(recorded);
  auto b_after = b.enqueue([&] { return ++ran_b, Status::Ok(); });

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
  auto threw = c.enqueue([]() -> Status { throw std::runtime_error("kaboom"); });
  CHECK_THAT(wait_event(threw).message(), Catch::Contains("kaboom") && Catch::Contains("thrower"));
}

TEST_CASE("backend: a stream waiting on an event that completes late is released, not hung", "[backend]") {
  CpuStream s("waiter");
  auto manual = std::make_shared<CpuEvent>();
  s.wait(manual);
  std::atomic<bool> ran{false};
  auto later = s.enqueue([&] { return ran = true, Status::Ok(); });
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
      events.push_back(s.enqueue([&] {
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
    // Zero counts are no-ops; bad arguments are errors naming the op and the group, never crashes.
    log.ok(four->all_reduce(nullptr, 0), "all_reduce of 0");
    log.ok(four->all_gather(nullptr, nullptr, 0), "all_gather of 0");
    for (Communicator* c : {solo.get(), four.get()}) {
      float x = 0.0f;
      const Status neg = c->all_gather(&x, &x, -1);
      log.expect(neg.code() == StatusCode::kInvalidInput &&
                     neg.message().find("all_gather on " + c->name() + " (global ranks [") == 0,
                 "negative count: " + neg.message());
      const Status huge = c->reduce_scatter(&x, &x, std::numeric_limits<std::int64_t>::max());
      log.expect(huge.code() == StatusCode::kInvalidInput, "huge count: " + huge.message());
      const Status root = c->broadcast(&x, 1, c->size());
      log.expect(root.code() == StatusCode::kInvalidInput && root.message().find("root") != std::string::npos,
                 "bad root: " + root.message());
      std::vector<float> out;
      std::vector<std::int64_t> rc;
      const Status counts = c->all_to_all_v(&x, std::vector<std::int64_t>(c->size() + 1, 0), out, rc);
      log.expect(counts.code() == StatusCode::kInvalidInput, "wrong send count length: " + counts.message());
      const Status negv = c->all_to_all_v(&x, std::vector<std::int64_t>(c->size(), -1), out, rc);
      log.expect(negv.code() == StatusCode::kInvalidInput, "negative send count: " + negv.message());
    }
    // The communicator still works after argument errors.
    check_every_op(*four, 3, log);
  });
}

TEST_CASE("backend: the async forms run the collectives on a stream", "[backend][gloo]") {
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
    std::vector<EventPtr> events = {
        c->all_gather_async(s, gin.data(), gout.data(), N),
        c->reduce_scatter_async(s, rsin.data(), rsout.data(), N),
        c->all_reduce_async(s, ar.data(), N),
        c->broadcast_async(s, bc.data(), N, 2),
        c->all_to_all_async(s, a2ain.data(), a2aout.data(), N),
    };
    for (auto& e : events) log.ok(wait_event(e), "async event");
    log.ok(s.synchronize(), "stream");
    log.same(gout, gwant, "async all_gather");
    log.same(rsout, rswant, "async reduce_scatter");
    log.same(ar, arwant, "async all_reduce");
    log.same(bc, bcwant, "async broadcast");
    log.same(a2aout, a2awant, "async all_to_all");
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
      compute->all_reduce_async(sa, reduced[r].data(), N);
      comm->all_gather_async(sb, shards[r].data(), gathered[r].data(), N);
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
      const Status s = c->all_reduce(data.data(), 16);  // rank 1 never calls it
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
      const Status s = c->all_reduce(data.data(), 16);
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
