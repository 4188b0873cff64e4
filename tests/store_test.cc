// The rendezvous store: round trips, waiting for a key another rank sets, bounded waits (a dead rank is a
// timeout, not a hang), and refusal of a bad token, malformed requests and oversized values.
#include <utility>  // before Boost.Asio (g++ 12 needs std::exchange first)

#include <catch2/catch.hpp>

#include <boost/asio.hpp>
#include <chrono>
#include <thread>

#include <gloo/allreduce_ring.h>
#include <gloo/rendezvous/context.h>
#include <gloo/transport/tcp/device.h>

#include "store/gloo_store.h"
#include "store/store.h"

using namespace hzp;
using namespace hzp::runtime;
using namespace std::chrono_literals;

namespace {

std::unique_ptr<StoreServer> serve(StoreLimits limits = {}) {
  auto server = StoreServer::start("127.0.0.1", 0, "secret", limits);
  REQUIRE(server.ok());
  return std::move(server).value();
}

std::unique_ptr<StoreClient> client(const StoreServer& server, const std::string& token = "secret") {
  auto c = StoreClient::connect("127.0.0.1", server.port(), token, 2s);
  if (!c.ok()) FAIL(c.status().message());
  return std::move(c).value();
}

// Sends raw bytes after a valid handshake and returns the status byte of the reply (or -1 if closed).
int raw_request(const StoreServer& server, const std::string& bytes, bool handshake = true) {
  boost::asio::io_context io;
  boost::asio::ip::tcp::socket s(io);
  s.connect({boost::asio::ip::make_address("127.0.0.1"), server.port()});
  std::string hello = "HZPSTORE";
  hello += std::string("\x06\x00\x00\x00", 4) + "secret";
  boost::system::error_code ec;
  if (handshake) {
    boost::asio::write(s, boost::asio::buffer(hello), ec);
    char ok[5];
    boost::asio::read(s, boost::asio::buffer(ok, 5), ec);
    if (ec || ok[0] != 0) return -1;
  }
  boost::asio::write(s, boost::asio::buffer(bytes), ec);
  char status = 0;
  boost::asio::read(s, boost::asio::buffer(&status, 1), ec);
  return ec ? -1 : static_cast<unsigned char>(status);
}

}  // namespace

TEST_CASE("store: set then get, and get waits for a key another client sets", "[store]") {
  auto server = serve();
  auto a = client(*server), b = client(*server);
  REQUIRE(a->set("rank0/addr", std::string("127.0.0.1:1234\0binary", 21)).ok());
  auto v = b->get("rank0/addr", 1s);
  REQUIRE(v.ok());
  CHECK(*v == std::string("127.0.0.1:1234\0binary", 21));
  std::thread later([&] {
    std::this_thread::sleep_for(100ms);
    REQUIRE(a->set("nccl/unique_id", "abc").ok());
  });
  auto waited = b->get("nccl/unique_id", 5s);
  later.join();
  REQUIRE(waited.ok());
  CHECK(*waited == "abc");
}

TEST_CASE("store: a key nobody sets is a timeout, not a hang", "[store]") {
  StoreLimits limits;
  limits.max_wait = 200ms;  // the server caps what a client may ask for
  auto server = serve(limits);
  auto c = client(*server);
  const auto t0 = std::chrono::steady_clock::now();
  auto v = c->get("rank7/addr", 10s);
  const auto waited = std::chrono::steady_clock::now() - t0;
  REQUIRE_FALSE(v.ok());
  CHECK_THAT(v.status().message(), Catch::Contains("timed out"));
  CHECK(waited < 5s);
}

TEST_CASE("store: a bad token is refused with a clear error", "[store]") {
  auto server = serve();
  auto c = StoreClient::connect("127.0.0.1", server->port(), "guess", 2s);
  REQUIRE_FALSE(c.ok());
  CHECK(c.status().code() == StatusCode::kInvalidInput);
  CHECK_THAT(c.status().message(), Catch::Contains("refused the token"));
  // The store still serves good clients.
  CHECK(client(*server)->set("k", "v").ok());
}

TEST_CASE("store: malformed and oversized requests are refused, the server keeps serving", "[store]") {
  StoreLimits limits;
  limits.max_value_bytes = 16;
  auto server = serve(limits);
  CHECK(raw_request(*server, "NOTMAGIC\x00\x00\x00\x00", /*handshake=*/false) == 3);  // bad handshake
  CHECK(raw_request(*server, std::string("\x09\x01\x00\x00\x00k", 6)) == 3);          // unknown op
  CHECK(raw_request(*server, std::string("\x01\x00\x00\x00\x00", 5)) == 3);           // empty key
  CHECK(raw_request(*server, std::string("\x02\xff\xff\xff\x7f", 5)) == 4);           // key too long
  auto c = client(*server);
  auto big = c->set("k", std::string(17, 'x'));
  REQUIRE_FALSE(big.ok());
  CHECK_THAT(big.message(), Catch::Contains("too large"));
  CHECK(client(*server)->set("k", std::string(16, 'x')).ok());
}

TEST_CASE("store: bad addresses are errors; stopping the server releases a waiting client", "[store]") {
  CHECK_FALSE(StoreServer::start("not-an-ip", 0, "t").ok());
  CHECK_FALSE(StoreClient::connect("127.0.0.1", 1, "t", 500ms).ok());  // nothing listens on port 1
  auto server = serve();
  auto c = client(*server);
  std::thread stopper([&] {
    std::this_thread::sleep_for(100ms);
    server.reset();
  });
  auto v = c->get("never", 30s);
  stopper.join();
  CHECK_FALSE(v.ok());
}

TEST_CASE("store: two Gloo contexts rendezvous through it and all-reduce", "[store][gloo]") {
  auto server = serve();
  constexpr int kRanks = 2;
  std::vector<std::vector<float>> data(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kRanks; ++r) {
    data[r] = {1.0f + r, 10.0f * (r + 1), -3.0f};
    ranks.emplace_back([&, r] {
      try {
        auto c = StoreClient::connect("127.0.0.1", server->port(), "secret", 5s);
        if (!c.ok()) throw std::runtime_error(c.status().message());
        GlooStore store(std::move(c).value(), 10s);
        auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
        auto context = std::make_shared<gloo::rendezvous::Context>(r, kRanks);
        context->setTimeout(10s);
        context->connectFullMesh(store, device);
        std::vector<float*> ptrs = {data[r].data()};
        gloo::AllreduceRing<float>(context, ptrs, static_cast<int>(data[r].size())).run();
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kRanks; ++r) {
    INFO("rank " << r << ": " << errors[r]);
    CHECK(errors[r].empty());
    CHECK(data[r] == std::vector<float>{3.0f, 30.0f, -6.0f});
  }
}

TEST_CASE("store: a Gloo rendezvous with a missing peer fails with the key, not a hang", "[store][gloo]") {
  StoreLimits limits;
  limits.max_wait = 300ms;
  auto server = serve(limits);
  auto c = StoreClient::connect("127.0.0.1", server->port(), "secret", 5s);
  REQUIRE(c.ok());
  GlooStore store(std::move(c).value(), 300ms);
  auto device = gloo::transport::tcp::CreateDevice("127.0.0.1");
  auto context = std::make_shared<gloo::rendezvous::Context>(0, 2);  // rank 1 never comes
  context->setTimeout(1s);
  try {
    context->connectFullMesh(store, device);
    FAIL("connectFullMesh succeeded without rank 1");
  } catch (const gloo::Exception& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("store"));
  }
}
