// The rendezvous key-value store of the runtime: a small TCP server on Boost.Asio and its client.
//
// Ranks publish and look up connection details (Gloo addresses, NCCL unique ids) by key. The server binds
// 127.0.0.1 unless told otherwise, checks a shared token on connect, bounds every message, and bounds every
// wait: a GET for a key nobody sets returns kTimeout instead of hanging, which is how a dead rank turns into
// an error on the others.
//
// Wire protocol (all integers little-endian u32 unless noted):
//   handshake   client: "HZPSTORE" u32 token_len, token      server: u8 status (0 ok, 5 bad token: closes)
//   request     u8 op (1 SET, 2 GET), u32 key_len, key, [SET: u32 value_len, value], [GET: u32 timeout_ms]
//   reply       u8 status (0 ok, 2 timeout, 3 malformed, 4 too large), u32 len, payload (GET: the value)
// A malformed or oversized request gets its status and the connection is closed.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "status.h"

namespace hzp::runtime {

enum class StoreReply : std::uint8_t { kOk = 0, kTimeout = 2, kMalformed = 3, kTooLarge = 4, kBadToken = 5 };

struct StoreLimits {
  std::uint32_t max_key_bytes = 1024;
  std::uint32_t max_value_bytes = 64u << 20;
  std::chrono::milliseconds max_wait{60000};  // a GET never waits longer, whatever the client asks
};

class StoreServer {
 public:
  // Binds `address:port` (port 0 picks a free one, see port()). Errors if the address cannot be bound.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& address, std::uint16_t port, std::string token,
                                                    StoreLimits limits = {});
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const { return port_; }

 private:
  struct Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl, std::uint16_t port);
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_;
};

class StoreClient {
 public:
  // Connects and authenticates; kInvalidInput for a refused token, kInternal for network errors.
  static Result<std::unique_ptr<StoreClient>> connect(const std::string& host, std::uint16_t port,
                                                      const std::string& token,
                                                      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~StoreClient();

  Status set(const std::string& key, const std::string& value);
  // Waits up to `timeout` (capped by the server's max_wait) for the key; kInternal with "timed out" after.
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout);

 private:
  struct Impl;
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hzp::runtime
