// Rendezvous store server and client (protocol in store.h). Thread per connection: a store serves the
// ranks of one job, tens to hundreds of connections, each mostly idle.
#include <utility>  // before Boost.Asio: g++ 12 with C++20 needs std::exchange declared first

#include "store/store.h"

#include <sys/socket.h>
#include <sys/time.h>

#include <boost/asio.hpp>
#include <cstring>

namespace hzp::runtime {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

constexpr char kMagic[8] = {'H', 'Z', 'P', 'S', 'T', 'O', 'R', 'E'};
constexpr std::uint32_t kMaxTokenBytes = 4096;
enum : std::uint8_t { kSet = 1, kGet = 2 };

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Reads exactly n bytes; false on EOF, error or timeout.
bool read_exact(tcp::socket& s, void* data, std::size_t n) {
  boost::system::error_code ec;
  asio::read(s, asio::buffer(data, n), ec);
  return !ec;
}

bool read_u32(tcp::socket& s, std::uint32_t& v) {
  unsigned char b[4];
  if (!read_exact(s, b, 4)) return false;
  v = static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 | static_cast<std::uint32_t>(b[2]) << 16 |
      static_cast<std::uint32_t>(b[3]) << 24;
  return true;
}

bool write_all(tcp::socket& s, const std::string& data) {
  boost::system::error_code ec;
  asio::write(s, asio::buffer(data), ec);
  return !ec;
}

bool reply(tcp::socket& s, StoreReply status, const std::string& payload = {}) {
  std::string out(1, static_cast<char>(status));
  put_u32(out, static_cast<std::uint32_t>(payload.size()));
  out += payload;
  return write_all(s, out);
}

// Bounds a blocking read or write on the socket (the client's view of a dead peer).
void set_socket_timeout(tcp::socket& s, std::chrono::milliseconds timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>((timeout.count() % 1000) * 1000);
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(s.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

}  // namespace

struct StoreServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  std::string token;
  StoreLimits limits;
  std::mutex mutex;
  std::condition_variable changed;
  std::map<std::string, std::string> data;
  std::vector<std::shared_ptr<tcp::socket>> sockets;
  std::vector<std::thread> threads;
  std::thread accept_thread;
  std::atomic<bool> stopping{false};

  void accept_loop() {
    while (!stopping) {
      auto socket = std::make_shared<tcp::socket>(io);
      boost::system::error_code ec;
      acceptor.accept(*socket, ec);
      if (ec) break;  // closed by the destructor, or a fatal acceptor error
      std::lock_guard<std::mutex> lock(mutex);
      sockets.push_back(socket);
      threads.emplace_back([this, socket] { serve(*socket); });
    }
  }

  void serve(tcp::socket& s) {
    // Handshake: magic, token. A wrong token is refused before anything else is read.
    char magic[sizeof kMagic];
    std::uint32_t token_len = 0;
    if (!read_exact(s, magic, sizeof magic) || std::memcmp(magic, kMagic, sizeof kMagic) != 0 ||
        !read_u32(s, token_len) || token_len > kMaxTokenBytes) {
      reply(s, StoreReply::kMalformed);
      return;
    }
    std::string offered(token_len, '\0');
    if (!read_exact(s, offered.data(), token_len) || offered != token) {
      reply(s, StoreReply::kBadToken);
      return;
    }
    if (!reply(s, StoreReply::kOk)) return;
    while (!stopping) {
      std::uint8_t op = 0;
      std::uint32_t key_len = 0;
      if (!read_exact(s, &op, 1)) return;  // the client went away
      if ((op != kSet && op != kGet) || !read_u32(s, key_len)) {
        reply(s, StoreReply::kMalformed);
        return;
      }
      if (key_len == 0 || key_len > limits.max_key_bytes) {
        reply(s, key_len == 0 ? StoreReply::kMalformed : StoreReply::kTooLarge);
        return;
      }
      std::string key(key_len, '\0');
      if (!read_exact(s, key.data(), key_len)) return;
      if (op == kSet) {
        std::uint32_t value_len = 0;
        if (!read_u32(s, value_len)) return;
        if (value_len > limits.max_value_bytes) {
          reply(s, StoreReply::kTooLarge);
          return;
        }
        std::string value(value_len, '\0');
        if (!read_exact(s, value.data(), value_len)) return;
        {
          std::lock_guard<std::mutex> lock(mutex);
          data[key] = std::move(value);
        }
        changed.notify_all();
        if (!reply(s, StoreReply::kOk)) return;
        continue;
      }
      std::uint32_t timeout_ms = 0;
      if (!read_u32(s, timeout_ms)) return;
      const auto wait = std::min(std::chrono::milliseconds(timeout_ms), limits.max_wait);
      std::string value;
      bool found = false;
      {
        std::unique_lock<std::mutex> lock(mutex);
        found = changed.wait_for(lock, wait, [&] { return stopping || data.count(key) > 0; }) && data.count(key) > 0;
        if (found) value = data[key];
      }
      if (!reply(s, found ? StoreReply::kOk : StoreReply::kTimeout, value)) return;
    }
  }
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl, std::uint16_t port) : impl_(std::move(impl)), port_(port) {}

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& address, std::uint16_t port,
                                                        std::string token, StoreLimits limits) {
  auto impl = std::make_unique<Impl>();
  impl->token = std::move(token);
  impl->limits = limits;
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  if (ec) return Status::InvalidInput("store: bad listen address '" + address + "': " + ec.message());
  const tcp::endpoint endpoint(ip, port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec)
    return Status::InvalidInput("store: cannot listen on " + address + ":" + std::to_string(port) + ": " + ec.message());
  const std::uint16_t bound = impl->acceptor.local_endpoint().port();
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->accept_loop(); });
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl), bound));
}

StoreServer::~StoreServer() {
  impl_->stopping = true;
  impl_->changed.notify_all();
  boost::system::error_code ec;
  // Unblock the accept and every connection's read; then join.
  // shutdown() wakes the blocked accept(); the descriptor is closed only after the thread has left it.
  ::shutdown(impl_->acceptor.native_handle(), SHUT_RDWR);
  impl_->accept_thread.join();
  impl_->acceptor.close(ec);
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (auto& s : impl_->sockets) s->shutdown(tcp::socket::shutdown_both, ec);
    threads.swap(impl_->threads);
  }
  for (std::thread& t : threads) t.join();
}

struct StoreClient::Impl {
  asio::io_context io;
  tcp::socket socket{io};
  std::chrono::milliseconds timeout{10000};

  Result<std::string> roundtrip(const std::string& request, std::chrono::milliseconds wait) {
    // The socket waits a little longer than the server may, so a timeout is the server's answer.
    set_socket_timeout(socket, wait + timeout);
    if (!write_all(socket, request)) return Status::Internal("store: connection lost while sending");
    std::uint8_t status = 0;
    std::uint32_t len = 0;
    if (!read_exact(socket, &status, 1) || !read_u32(socket, len))
      return Status::Internal("store: no reply from the store within " + std::to_string((wait + timeout).count()) + " ms");
    std::string payload(len, '\0');
    if (len > 0 && !read_exact(socket, payload.data(), len)) return Status::Internal("store: truncated reply");
    switch (static_cast<StoreReply>(status)) {
      case StoreReply::kOk: return payload;
      case StoreReply::kTimeout: return Status::Internal("store: timed out waiting for the key");
      case StoreReply::kTooLarge: return Status::InvalidInput("store: request refused: too large");
      default: return Status::Internal("store: request refused (status " + std::to_string(status) + ")");
    }
  }
};

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const std::string& host, std::uint16_t port,
                                                          const std::string& token, std::chrono::milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  impl->timeout = timeout;
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(host, ec);
  if (ec) return Status::InvalidInput("store: bad address '" + host + "': " + ec.message());
  impl->socket.connect(tcp::endpoint(ip, port), ec);
  if (ec) return Status::Internal("store: cannot connect to " + host + ":" + std::to_string(port) + ": " + ec.message());
  set_socket_timeout(impl->socket, timeout);
  std::string hello(kMagic, sizeof kMagic);
  put_u32(hello, static_cast<std::uint32_t>(token.size()));
  hello += token;
  std::uint8_t status = 0;
  std::uint32_t len = 0;
  if (!write_all(impl->socket, hello) || !read_exact(impl->socket, &status, 1) || !read_u32(impl->socket, len))
    return Status::Internal("store: handshake with " + host + ":" + std::to_string(port) + " failed");
  if (status == static_cast<std::uint8_t>(StoreReply::kBadToken))
    return Status::InvalidInput("store: " + host + ":" + std::to_string(port) + " refused the token");
  if (status != 0) return Status::Internal("store: handshake refused (status " + std::to_string(status) + ")");
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

Status StoreClient::set(const std::string& key, const std::string& value) {
  std::string request(1, static_cast<char>(kSet));
  put_u32(request, static_cast<std::uint32_t>(key.size()));
  request += key;
  put_u32(request, static_cast<std::uint32_t>(value.size()));
  request += value;
  auto r = impl_->roundtrip(request, std::chrono::milliseconds(0));
  return r.ok() ? Status::Ok() : r.status();
}

Result<std::string> StoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::string request(1, static_cast<char>(kGet));
  put_u32(request, static_cast<std::uint32_t>(key.size()));
  request += key;
  put_u32(request, static_cast<std::uint32_t>(timeout.count()));
  return impl_->roundtrip(request, timeout);
}

}  // namespace hzp::runtime
