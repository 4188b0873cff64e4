// The rendezvous key-value store of the runtime: a small TCP server and its client.
//
// Ranks publish and look up connection details (Gloo addresses, NCCL unique ids) by key. The server binds
// 127.0.0.1 unless told otherwise, proves a shared token both ways on connect, and bounds everything a peer can make
// it hold: connections, pending handshakes, the time a handshake or a request may take, the bytes of a key,
// a value and the whole store, and the number of keys (StoreLimits). A GET for a key nobody sets returns
// kTimeout instead of hanging, which is how a dead rank turns into an error on the others.
//
// Wire protocol (all integers little-endian u32 unless noted):
//   handshake   mutual proof of the job's token, which never travels (a stranger listening on the port
//               learns nothing: the client proves itself only after the server has):
//               client: "HZPSTOR2", its 32-byte challenge C
//               server: a reply (below), status 0 with payload S (its 32-byte challenge) and
//                       handshake_proof(token, server, C, S); or 3 malformed (bad magic), or 7 busy (sent at
//                       once, before the handshake is read, when it already holds max_connections connections)
//               client: checks the server's proof (a mismatch ends the connection, nothing sent), then sends
//                       handshake_proof(token, client, S, C)
//               server: a reply with status 0 ok or 5 bad token
//   request     u8 op (1 SET, 2 GET), u32 key_len (1..max_key_bytes), key,
//               [SET: u32 value_len (<= max_value_bytes), value], [GET: u32 timeout_ms]
//   reply       u8 status, u32 len, payload
//               status 0 ok (GET: the payload is the value), 2 timeout (the GET's key did not appear in
//               min(timeout_ms, max_wait)), 3 malformed (unknown op, empty key), 4 too large (key or value
//               above its limit, or the SET would take the store's keys and values, with those of SETs still
//               being received, above max_total_bytes), 5 bad token,
//               6 too many keys (the SET would create a key beyond max_keys), 7 busy (connection limit).
//               On a refusal (3 to 7) the payload is a short human-readable reason.
// Connection rules:
//   - After any status other than 0 and 2 the server closes the connection: the client gets the reply, then
//     end of stream. Statuses 0 and 2 keep it open for the next request.
//   - A handshake not complete within handshake_timeout of the accept, or a request not complete within
//     request_timeout of its first byte, is closed without a reply. An authenticated connection may stay idle
//     between requests for as long as it likes (ranks hold theirs for the whole run).
//   - When max_pending_handshakes connections are still in their handshake, a new connection drops the oldest
//     of them (closed without a reply), so idle unauthenticated peers cannot lock ranks out.
//   - Replies are sent within request_timeout, or the connection is closed.
//   - A key or value is received in 64 KiB steps as its bytes arrive, never allocated at its announced size.
// Sockets (the listening one, accepted ones, the client's) are close-on-exec: processes the launcher spawns do
// not inherit them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "shared/base/status.h"

namespace hzp::runtime {

// HMAC-SHA-256 under `token` of "hzp-store server" (or "hzp-store client") and the two challenges, the
// server's proof taking (client's, server's) and the client's (server's, client's): 32 bytes.
std::string handshake_proof(const std::string& token, bool server, const std::string& first, const std::string& second);

enum class StoreReply : std::uint8_t {
  kOk = 0,
  kTimeout = 2,
  kMalformed = 3,
  kTooLarge = 4,
  kBadToken = 5,
  kTooManyKeys = 6,
  kBusy = 7,
};

// What one server lets its peers make it hold. Every field must be > 0, max_wait >= 0 (start() says which is
// not).
struct StoreLimits {
  std::uint32_t max_key_bytes = 1024;
  std::uint32_t max_value_bytes = 64u << 20;
  std::uint64_t max_total_bytes = 1ull << 30;  // keys + values held, and being received by SETs; kTooLarge beyond
  std::uint32_t max_keys = 1u << 20;           // distinct keys held; kTooManyKeys beyond
  std::chrono::milliseconds max_wait{60000};   // a GET never waits longer, whatever the client asks
  // Open connections, authenticated or not; one thread each. Beyond it a new connection gets kBusy and is
  // closed at once. The process needs RLIMIT_NOFILE above this (`ulimit -n`), or accepts wait for descriptors.
  std::uint32_t max_connections = 4096;
  // Connections still in their handshake (no token checked yet); the oldest is dropped for a new one beyond
  // it. Effective limit: min(max_pending_handshakes, max_connections).
  std::uint32_t max_pending_handshakes = 256;
  std::chrono::milliseconds handshake_timeout{5000};  // from accept to the token checked
  std::chrono::milliseconds request_timeout{30000};   // from a request's first byte to its last; also per reply
};

// A snapshot of what the server holds, for tests and monitoring.
struct StoreStats {
  std::size_t connections = 0;         // open, in handshake or authenticated
  std::size_t pending_handshakes = 0;  // of those, not authenticated yet
  std::size_t threads = 0;             // connection threads not yet joined (running, or ended and not reaped)
  std::uint64_t buffered_bytes = 0;    // allocated for requests being received (and keys of waiting GETs)
  std::uint64_t stored_bytes = 0;      // keys + values held
  std::size_t keys = 0;
  std::uint64_t accepted_connections = 0;  // ever accepted, refused ones included
  std::uint64_t refused_connections = 0;   // closed with kBusy at max_connections
  std::uint64_t dropped_handshakes = 0;    // closed for handshake_timeout or for a newer pending connection
};

class StoreServer {
 public:
  // Binds `address:port` (port 0 picks a free one, see port()). Errors if the address cannot be bound or a
  // limit is zero.
  static Result<std::unique_ptr<StoreServer>> start(const std::string& address, std::uint16_t port, std::string token,
                                                    StoreLimits limits = {});
  // Closes every connection (a waiting GET returns kTimeout) and joins every thread.
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  std::uint16_t port() const { return port_; }
  StoreStats stats() const;

 private:
  struct Impl;
  explicit StoreServer(std::unique_ptr<Impl> impl, std::uint16_t port);
  std::unique_ptr<Impl> impl_;
  std::uint16_t port_;
};

class StoreClient {
 public:
  // Connects and authenticates within `timeout`; kInvalidInput for a refused token, kInternal for network
  // errors and a busy server (retryable).
  static Result<std::unique_ptr<StoreClient>> connect(const std::string& host, std::uint16_t port,
                                                      const std::string& token,
                                                      std::chrono::milliseconds timeout = std::chrono::seconds(10));
  ~StoreClient();

  // kInvalidInput when the store refuses the key or value (too large, too many keys: the message says which
  // limit); kInternal for network errors. After a refusal or a network error the connection is closed and
  // every later call fails with the first error: connect again.
  Status set(const std::string& key, const std::string& value);
  // Waits up to `timeout` (capped by the server's max_wait) for the key; kInternal with "timed out" after.
  Result<std::string> get(const std::string& key, std::chrono::milliseconds timeout);

 private:
  struct Impl;
  explicit StoreClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace hzp::runtime
