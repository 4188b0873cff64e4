// Rendezvous store server and client (protocol and limits in store.h).
//
// Thread per connection: a store serves the ranks of one job, tens to thousands of connections, each mostly
// idle, and one blocked thread per connection keeps every wait (a GET for a key, a slow peer) simple. What a
// peer can make the server hold is bounded by StoreLimits: at most max_connections threads, of which at most
// max_pending_handshakes unauthenticated, each of those for at most handshake_timeout; finished threads are
// joined by the accept thread as they end. Connection threads get a small stack (ConnectionThread): with
// glibc's default of `ulimit -s` (8 MiB) each idle peer reserved 8 MiB of address space, and 256 pending
// handshakes alone exhausted a process capped at 2 GiB (RLIMIT_AS).
//
// Connections are plain descriptors driven by poll() and non-blocking recv/send. Boost.Asio's synchronous
// operations cannot time out (after EAGAIN they poll with no timeout, so SO_RCVTIMEO does nothing) and open
// sockets without close-on-exec; Asio still parses addresses and binds the listening socket.
#include <utility>  // before Boost.Asio: g++ 12 with C++20 needs std::exchange declared first

#include "runtime/store/store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <cerrno>
#include <climits>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <system_error>
#include <thread>
#include <vector>

#include "runtime/store/hmac.h"

namespace hzp::runtime {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr Clock::time_point kNoDeadline = Clock::time_point::max();
constexpr char kMagic[8] = {'H', 'Z', 'P', 'S', 'T', 'O', 'R', '2'};
constexpr std::size_t kNonceBytes = 32;  // each side's challenge; a proof is an HMAC-SHA-256 (32 bytes)

Digest proof(const std::string& token, const char* who, const std::string& first, const std::string& second) {
  const std::string p = handshake_proof(token, std::string(who) == "server", first, second);
  Digest d;
  std::copy(p.begin(), p.end(), d.begin());
  return d;
}
constexpr std::uint32_t kMaxTokenBytes = 4096;
// A body being received is allocated at most this far ahead of the bytes that arrived, so a peer that
// announces a large value and sends little makes the server hold little.
constexpr std::size_t kReadChunk = 64 << 10;
enum : std::uint8_t { kSet = 1, kGet = 2 };

enum class Io { kOk, kClosed, kTimedOut, kFailed };

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// Owns a descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    reset(std::exchange(o.fd_, -1));
    return *this;
  }
  ~Fd() { reset(); }
  int get() const { return fd_; }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Waits until `fd` is ready for `events`, or has an error or hang-up (the next recv/send reports it).
Io wait_ready(int fd, short events, Clock::time_point deadline) {
  // Bounded: poll() returns by the deadline; EINTR repeats it with less time left. Without a deadline the
  // wait ends when the socket is shut down (the server's destructor does that).
  for (;;) {
    int timeout_ms = -1;
    if (deadline != kNoDeadline) {
      const long long left = std::chrono::ceil<milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return Io::kTimedOut;
      timeout_ms = static_cast<int>(std::min<long long>(left, INT_MAX));
    }
    pollfd p{fd, events, 0};
    const int r = ::poll(&p, 1, timeout_ms);
    if (r > 0) return Io::kOk;
    if (r == 0) return Io::kTimedOut;
    if (errno != EINTR) return Io::kFailed;
  }
}

// Reads exactly n bytes by the deadline.
Io read_exact(int fd, void* data, std::size_t n, Clock::time_point deadline) {
  char* p = static_cast<char*>(data);
  std::size_t done = 0;
  while (done < n) {  // each pass receives bytes, or waits with the deadline
    const ssize_t r = ::recv(fd, p + done, n - done, MSG_DONTWAIT);
    if (r > 0) {
      done += static_cast<std::size_t>(r);
      continue;
    }
    if (r == 0) return Io::kClosed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Io::kFailed;
    if (const Io w = wait_ready(fd, POLLIN, deadline); w != Io::kOk) return w;
  }
  return Io::kOk;
}

// Writes all n bytes by the deadline (a deadline of now: one attempt, whatever fits in the socket buffer).
Io write_all(int fd, const char* data, std::size_t n, Clock::time_point deadline) {
  std::size_t done = 0;
  while (done < n) {  // each pass sends bytes, or waits with the deadline
    const ssize_t r = ::send(fd, data + done, n - done, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r >= 0) {
      done += static_cast<std::size_t>(r);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Io::kFailed;
    if (const Io w = wait_ready(fd, POLLOUT, deadline); w != Io::kOk) return w;
  }
  return Io::kOk;
}

Io read_u32(int fd, std::uint32_t& v, Clock::time_point deadline) {
  unsigned char b[4];
  const Io io = read_exact(fd, b, 4, deadline);
  v = static_cast<std::uint32_t>(b[0]) | static_cast<std::uint32_t>(b[1]) << 8 |
      static_cast<std::uint32_t>(b[2]) << 16 | static_cast<std::uint32_t>(b[3]) << 24;
  return io;
}

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

// Keeps a buffer's allocation counted in a total (the server's buffered_bytes) while it lives.
class Counted {
 public:
  explicit Counted(std::atomic<std::uint64_t>& total) : total_(total) {}
  ~Counted() { total_ -= counted_; }
  Counted(const Counted&) = delete;
  Counted& operator=(const Counted&) = delete;
  void update(std::size_t bytes) {
    total_ += bytes;
    total_ -= counted_;
    counted_ = bytes;
  }

 private:
  std::atomic<std::uint64_t>& total_;
  std::size_t counted_ = 0;
};

// Reads n bytes into `out`, growing it as they arrive (kReadChunk at a time), never to the announced n up front.
Io read_growing(int fd, std::string& out, std::size_t n, Clock::time_point deadline, Counted* counted) {
  out.clear();
  while (out.size() < n) {  // each pass reads one chunk or fails
    const std::size_t have = out.size();
    out.resize(have + std::min(n - have, kReadChunk));
    if (counted) counted->update(out.capacity());
    if (const Io io = read_exact(fd, out.data() + have, out.size() - have, deadline); io != Io::kOk) return io;
  }
  return Io::kOk;
}

// Writes a reply: status, length, payload.
Io send_reply(int fd, StoreReply status, const std::string& payload, Clock::time_point deadline) {
  std::string head(1, static_cast<char>(status));
  put_u32(head, static_cast<std::uint32_t>(payload.size()));
  if (payload.size() <= kReadChunk) {  // one send for the common small reply
    head += payload;
    return write_all(fd, head.data(), head.size(), deadline);
  }
  const Io io = write_all(fd, head.data(), head.size(), deadline);
  return io == Io::kOk ? write_all(fd, payload.data(), payload.size(), deadline) : io;
}

// After a refusal: the reply goes out before the FIN (shutdown of the write side), and input already queued is
// drained (bounded) so that the close that follows sends a FIN rather than a reset.
void end_after_reply(int fd) {
  ::shutdown(fd, SHUT_WR);
  char sink[4096];
  for (int i = 0; i < 16 && ::recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {
  }
}

// Small request/reply messages: no Nagle delay between a reply's header and its payload.
void set_nodelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

struct Refusal {
  StoreReply status;
  std::string reason;
};

// A joinable thread with a small stack, for a connection: its deepest frame (a request with its 4 KiB sink)
// needs a few KiB, and kStack leaves room for sanitizer builds, whose frames are a few times larger. Like
// std::thread, it must be joined before it is destroyed; construction throws std::system_error when no thread
// can be started.
class ConnectionThread {
 public:
  static constexpr std::size_t kStack = 256 << 10;

  ConnectionThread() = default;
  explicit ConnectionThread(std::function<void()> body) {
    auto owned = std::make_unique<std::function<void()>>(std::move(body));
    pthread_attr_t attr;
    int err = ::pthread_attr_init(&attr);
    if (err == 0) err = ::pthread_attr_setstacksize(&attr, std::max<std::size_t>(kStack, PTHREAD_STACK_MIN));
    if (err == 0) err = ::pthread_create(&handle_, &attr, &run, owned.get());
    ::pthread_attr_destroy(&attr);
    if (err != 0) throw std::system_error(err, std::generic_category(), "pthread_create");
    owned.release();  // the thread owns it now
    joinable_ = true;
  }
  ConnectionThread(ConnectionThread&& o) noexcept : handle_(o.handle_), joinable_(std::exchange(o.joinable_, false)) {}
  ConnectionThread& operator=(ConnectionThread&& o) noexcept {
    if (joinable_) std::terminate();  // as std::thread: never silently detach
    handle_ = o.handle_;
    joinable_ = std::exchange(o.joinable_, false);
    return *this;
  }
  ConnectionThread(const ConnectionThread&) = delete;
  ConnectionThread& operator=(const ConnectionThread&) = delete;
  ~ConnectionThread() {
    if (joinable_) std::terminate();
  }

  void join() {
    if (!joinable_) return;
    ::pthread_join(handle_, nullptr);
    joinable_ = false;
  }

 private:
  static void* run(void* arg) {
    const std::unique_ptr<std::function<void()>> body(static_cast<std::function<void()>*>(arg));
    (*body)();
    return nullptr;
  }

  pthread_t handle_{};
  bool joinable_ = false;
};

}  // namespace

struct StoreServer::Impl {
  struct Connection {
    int fd;  // owned (closed) by the connection's thread; others only shutdown() it, under the mutex
    Clock::time_point accepted;
    bool authenticated = false;
    bool dropped = false;  // shut down by the server (stopping, or crowded out while pending): on its way out
    ConnectionThread thread;
  };
  using ConnectionIt = std::list<Connection>::iterator;

  std::string token;
  StoreLimits limits;
  asio::io_context io;
  tcp::acceptor acceptor{io};
  Fd wake;  // eventfd: a connection ended (reap it), or the destructor wants the accept thread to stop
  std::thread accept_thread;

  std::mutex mutex;                 // guards everything below except `buffered`
  std::condition_variable changed;  // a key was set, or stopping
  std::condition_variable ended;    // a connection left `connections`
  bool stopping = false;
  // Values are shared so that a GET reply copies nothing.
  std::map<std::string, std::shared_ptr<const std::string>> data;
  std::uint64_t stored_bytes = 0;          // keys + values in `data`
  std::uint64_t reserved_bytes = 0;        // keys + values announced by SETs still being received
  std::list<Connection> connections;       // in accept order: the first pending one is the oldest
  std::size_t pending = 0;                 // connections neither authenticated nor dropped
  std::vector<ConnectionThread> finished;  // threads of connections that ended, joined by the accept thread
  std::uint64_t accepted = 0;
  std::uint64_t refused = 0;
  std::uint64_t dropped = 0;
  std::atomic<std::uint64_t> buffered{0};

  void signal_wake() {
    const std::uint64_t one = 1;
    (void)!::write(wake.get(), &one, sizeof one);
  }

  // Caller holds the mutex.
  void drop(Connection& c) {
    if (c.dropped) return;
    ::shutdown(c.fd, SHUT_RDWR);  // wakes the connection's thread wherever it waits on the socket
    if (!c.authenticated) --pending;
    c.dropped = true;
  }

  void reap() {
    std::vector<ConnectionThread> done;
    {
      std::lock_guard<std::mutex> lock(mutex);
      done.swap(finished);
    }
    for (ConnectionThread& t : done) t.join();  // each has left `connections` and is returning
  }

  void accept_loop() {
    const int listen_fd = acceptor.native_handle();
    for (;;) {  // one accept or one reap per pass; ends when the destructor sets stopping and signals `wake`
      pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake.get(), POLLIN, 0}};
      const int r = ::poll(fds, 2, -1);
      if (r < 0 && errno != EINTR) ::poll(nullptr, 0, 100);  // out of kernel memory: pause, do not spin
      if (r > 0 && (fds[1].revents & POLLIN)) {
        std::uint64_t n = 0;
        (void)!::read(wake.get(), &n, sizeof n);
      }
      reap();
      {
        std::lock_guard<std::mutex> lock(mutex);
        if (stopping) return;
      }
      if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
      // Close-on-exec at once (accept4): the launcher forks ranks from another thread at any time.
      const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) {
        admit(fd);
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        // Out of descriptors (EMFILE) or memory: the peer waits in the backlog. Retry after a pause, or as soon
        // as a connection ends and frees a descriptor.
        pollfd w{wake.get(), POLLIN, 0};
        ::poll(&w, 1, 100);
      }
    }
  }

  // Gives an accepted socket its thread, or refuses it at once.
  void admit(int fd) {
    set_nodelay(fd);
    std::unique_lock<std::mutex> lock(mutex);
    ++accepted;
    if (connections.size() >= limits.max_connections) {
      ++refused;
      lock.unlock();
      refuse_at_once(fd, "connection limit (max_connections " + std::to_string(limits.max_connections) + ")");
      return;
    }
    if (pending >= std::min(limits.max_pending_handshakes, limits.max_connections)) {
      // Crowd out the oldest pending handshake rather than refuse this one: idle unauthenticated peers then
      // cannot lock out a rank, which completes its handshake at once.
      for (Connection& c : connections) {
        if (!c.authenticated && !c.dropped) {
          drop(c);
          ++dropped;
          break;
        }
      }
    }
    const ConnectionIt self =
        connections.insert(connections.end(), Connection{fd, Clock::now(), false, false, ConnectionThread()});
    ++pending;
    try {
      // Started under the mutex: the thread's last act moves `self->thread` to `finished`, under the same mutex.
      self->thread = ConnectionThread([this, self] { serve(self); });
    } catch (const std::system_error&) {  // no thread to be had: refuse like at the connection limit
      connections.erase(self);
      --pending;
      ++refused;
      lock.unlock();
      refuse_at_once(fd, "the store cannot start a thread for the connection");
    }
  }

  // Refusal from the accept thread, which must not block: one send attempt, then close.
  static void refuse_at_once(int fd, const std::string& reason) {
    (void)send_reply(fd, StoreReply::kBusy, reason, Clock::now());
    end_after_reply(fd);
    ::close(fd);
  }

  // A refusal from a connection's thread; the connection then ends (finish() closes it).
  void refuse(int fd, StoreReply status, const std::string& reason) {
    (void)send_reply(fd, status, reason, Clock::now() + limits.request_timeout);
    end_after_reply(fd);
  }

  void serve(ConnectionIt self) {
    if (handshake(self)) {
      // Requests, one per pass, until the peer leaves, breaks a rule, or the server stops.
      while (request(self->fd)) {
      }
    }
    finish(self);
  }

  // The connection's last act: leave the list, close, get reaped.
  void finish(ConnectionIt self) {
    const int fd = self->fd;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!self->authenticated && !self->dropped) --pending;
      finished.push_back(std::move(self->thread));
      connections.erase(self);
      // Under the mutex: the destructor, once it sees the list empty, joins this thread before destroying
      // the condition variable, so notifying here cannot outlive it.
      ended.notify_all();
    }
    // Nobody else can reach fd now (shutdown() is only called on listed connections), so its number cannot be
    // reused under another thread's shutdown(). shutdown() first: a process forked meanwhile may hold a copy.
    ::shutdown(fd, SHUT_RDWR);
    ::close(fd);
    signal_wake();
  }

  // Mutual proof of the token, within handshake_timeout of the accept; the token itself never travels. The
  // client sends the magic and its challenge; the server answers with its challenge and its proof (which the
  // client checks before it proves anything, so a stranger on the port learns nothing); the client sends its
  // proof, which the server checks. True once authenticated.
  bool handshake(ConnectionIt self) {
    const int fd = self->fd;
    const Clock::time_point deadline = self->accepted + limits.handshake_timeout;
    // Nothing on the heap until the client has sent its whole hello: a thread's first malloc may reserve a
    // 64 MiB arena, and a flood of idle connections must not (a 512 MiB process ran out of address space).
    char magic[sizeof kMagic];
    char nonce[kNonceBytes];
    Io io = read_exact(fd, magic, sizeof magic, deadline);
    if (io == Io::kOk && std::memcmp(magic, kMagic, sizeof kMagic) != 0) {
      refuse(fd, StoreReply::kMalformed, "bad magic: not an hzp store client of this version");
      return false;
    }
    if (io == Io::kOk) io = read_exact(fd, nonce, kNonceBytes, deadline);
    std::string client_nonce, server_nonce;
    if (io == Io::kOk) client_nonce.assign(nonce, kNonceBytes);
    if (io == Io::kOk) {
      server_nonce = random_bytes(kNonceBytes);
      if (server_nonce.empty()) {
        refuse(fd, StoreReply::kMalformed, "the server has no random source");
        return false;
      }
      const Digest mine = proof(token, "server", client_nonce, server_nonce);
      io = send_reply(fd, StoreReply::kOk, server_nonce + std::string(mine.begin(), mine.end()), deadline);
    }
    Digest theirs{};
    if (io == Io::kOk) io = read_exact(fd, theirs.data(), theirs.size(), deadline);
    if (io != Io::kOk) {
      std::lock_guard<std::mutex> lock(mutex);
      if (io == Io::kTimedOut) ++dropped;
      return false;
    }
    if (!same_digest(theirs, proof(token, "client", server_nonce, client_nonce))) {
      refuse(fd, StoreReply::kBadToken, "bad token");
      return false;
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (self->dropped) return false;  // crowded out, or the server stops
      self->authenticated = true;
      --pending;
    }
    return send_reply(fd, StoreReply::kOk, {}, Clock::now() + limits.request_timeout) == Io::kOk;
  }

  // Reads and answers one request. False when the connection is to end.
  bool request(int fd) {
    std::uint8_t op = 0;
    // No deadline between requests: ranks hold their connection for the whole run, idle most of it. The
    // destructor's shutdown() ends this wait.
    if (read_exact(fd, &op, 1, kNoDeadline) != Io::kOk) return false;
    const Clock::time_point deadline = Clock::now() + limits.request_timeout;
    if (op != kSet && op != kGet) {
      refuse(fd, StoreReply::kMalformed, "unknown op " + std::to_string(op));
      return false;
    }
    std::uint32_t key_len = 0;
    if (read_u32(fd, key_len, deadline) != Io::kOk) return false;
    if (key_len == 0) {
      refuse(fd, StoreReply::kMalformed, "empty key");
      return false;
    }
    if (key_len > limits.max_key_bytes) {
      refuse(fd, StoreReply::kTooLarge,
             "key of " + std::to_string(key_len) + " bytes > max_key_bytes " + std::to_string(limits.max_key_bytes));
      return false;
    }
    Counted key_bytes(buffered);
    std::string key;
    if (read_growing(fd, key, key_len, deadline, &key_bytes) != Io::kOk) return false;
    return op == kSet ? set(fd, key, deadline) : get(fd, key, deadline);
  }

  // Whether the store has room for key = value_len bytes. Caller holds the mutex.
  std::optional<Refusal> room_for(const std::string& key, std::uint64_t value_len) const {
    const auto found = data.find(key);
    if (found == data.end() && data.size() >= limits.max_keys)
      return Refusal{StoreReply::kTooManyKeys,
                     "the store holds max_keys (" + std::to_string(limits.max_keys) + ") keys"};
    const std::uint64_t replaced = found == data.end() ? 0 : key.size() + found->second->size();
    const std::uint64_t after = stored_bytes - replaced + reserved_bytes + key.size() + value_len;
    if (after > limits.max_total_bytes)
      return Refusal{StoreReply::kTooLarge, "the store would hold " + std::to_string(after) +
                                                " bytes > max_total_bytes " + std::to_string(limits.max_total_bytes)};
    return std::nullopt;
  }

  bool set(int fd, const std::string& key, Clock::time_point deadline) {
    std::uint32_t value_len = 0;
    if (read_u32(fd, value_len, deadline) != Io::kOk) return false;
    if (value_len > limits.max_value_bytes) {
      refuse(fd, StoreReply::kTooLarge,
             "value of " + std::to_string(value_len) + " bytes > max_value_bytes " +
                 std::to_string(limits.max_value_bytes));
      return false;
    }
    // Room is checked and reserved before the value is read, so the store's data and the values on their way
    // in stay within max_total_bytes together; the reservation is returned however this ends.
    std::optional<Refusal> refusal;
    {
      std::lock_guard<std::mutex> lock(mutex);
      refusal = room_for(key, value_len);
      if (!refusal) reserved_bytes += key.size() + value_len;
    }
    if (refusal) {
      refuse(fd, refusal->status, refusal->reason);
      return false;
    }
    std::string value;
    Io io;
    {
      Counted value_bytes(buffered);
      io = read_growing(fd, value, value_len, deadline, &value_bytes);
    }
    {
      std::lock_guard<std::mutex> lock(mutex);
      reserved_bytes -= key.size() + value_len;
      if (io != Io::kOk) return false;
      refusal = room_for(key, value_len);  // a concurrent SET of the same key may have grown it meanwhile
      if (!refusal) {
        auto& slot = data[key];
        stored_bytes -= slot ? key.size() + slot->size() : 0;
        stored_bytes += key.size() + value.size();
        slot = std::make_shared<const std::string>(std::move(value));
      }
    }
    if (refusal) {
      refuse(fd, refusal->status, refusal->reason);
      return false;
    }
    changed.notify_all();
    return send_reply(fd, StoreReply::kOk, {}, Clock::now() + limits.request_timeout) == Io::kOk;
  }

  bool get(int fd, const std::string& key, Clock::time_point deadline) {
    std::uint32_t timeout_ms = 0;
    if (read_u32(fd, timeout_ms, deadline) != Io::kOk) return false;
    const milliseconds wait = std::min(milliseconds(timeout_ms), limits.max_wait);
    std::shared_ptr<const std::string> value;
    {
      std::unique_lock<std::mutex> lock(mutex);
      // Woken by every SET and by the destructor; the predicate tells which.
      changed.wait_for(lock, wait, [&] { return stopping || data.count(key) > 0; });
      if (const auto found = data.find(key); found != data.end()) value = found->second;
    }
    static const std::string kEmpty;
    return send_reply(fd, value ? StoreReply::kOk : StoreReply::kTimeout, value ? *value : kEmpty,
                      Clock::now() + limits.request_timeout) == Io::kOk;
  }
};

StoreServer::StoreServer(std::unique_ptr<Impl> impl, std::uint16_t port) : impl_(std::move(impl)), port_(port) {}

Result<std::unique_ptr<StoreServer>> StoreServer::start(const std::string& address, std::uint16_t port,
                                                        std::string token, StoreLimits limits) {
  const std::pair<const char*, bool> nonzero[] = {
      {"max_key_bytes", limits.max_key_bytes > 0},
      {"max_value_bytes", limits.max_value_bytes > 0},
      {"max_total_bytes", limits.max_total_bytes > 0},
      {"max_keys", limits.max_keys > 0},
      {"max_connections", limits.max_connections > 0},
      {"max_pending_handshakes", limits.max_pending_handshakes > 0},
      {"handshake_timeout", limits.handshake_timeout.count() > 0},
      {"request_timeout", limits.request_timeout.count() > 0},
  };
  for (const auto& [name, ok] : nonzero)
    if (!ok) return Status::InvalidInput(std::string("store: limit ") + name + " must be > 0");
  if (limits.max_wait.count() < 0) return Status::InvalidInput("store: limit max_wait must be >= 0");

  auto impl = std::make_unique<Impl>();
  impl->token = std::move(token);
  impl->limits = limits;
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(address, ec);
  if (ec) return Status::InvalidInput("store: bad listen address '" + address + "': " + ec.message());
  const tcp::endpoint endpoint(ip, port);
  const std::string where = address + ":" + std::to_string(port);
  // Close-on-exec from creation: ranks the launcher forks must not inherit the listening socket. Non-blocking:
  // a peer that leaves between poll() and accept4() must not block the accept thread.
  const int listen_fd = ::socket(endpoint.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (listen_fd < 0) return Status::Internal("store: cannot create a socket for " + where + ": " + errno_text(errno));
  impl->acceptor.assign(endpoint.protocol(), listen_fd, ec);
  if (ec) {
    ::close(listen_fd);
    return Status::Internal("store: cannot use the socket for " + where + ": " + ec.message());
  }
  impl->acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return Status::InvalidInput("store: cannot listen on " + where + ": " + ec.message());
  const int wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) return Status::Internal("store: eventfd: " + errno_text(errno));
  impl->wake.reset(wake);
  const std::uint16_t bound = impl->acceptor.local_endpoint().port();
  Impl* raw = impl.get();
  impl->accept_thread = std::thread([raw] { raw->accept_loop(); });
  return std::unique_ptr<StoreServer>(new StoreServer(std::move(impl), bound));
}

StoreServer::~StoreServer() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.stopping = true;
  }
  s.changed.notify_all();  // waiting GETs answer kTimeout (or the value) now
  s.signal_wake();
  s.accept_thread.join();  // no connection is admitted after this
  std::vector<ConnectionThread> threads;
  {
    std::unique_lock<std::mutex> lock(s.mutex);
    for (Impl::Connection& c : s.connections) s.drop(c);
    // Bounded: every connection's thread wakes from its shutdown socket or from `stopping`, and leaves.
    s.ended.wait(lock, [&] { return s.connections.empty(); });
    threads.swap(s.finished);
  }
  for (ConnectionThread& t : threads) t.join();
  boost::system::error_code ec;
  s.acceptor.close(ec);
}

StoreStats StoreServer::stats() const {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.mutex);
  StoreStats st;
  st.connections = s.connections.size();
  st.pending_handshakes = s.pending;
  st.threads = s.connections.size() + s.finished.size();
  st.buffered_bytes = s.buffered.load();
  st.stored_bytes = s.stored_bytes;
  st.keys = s.data.size();
  st.accepted_connections = s.accepted;
  st.refused_connections = s.refused;
  st.dropped_handshakes = s.dropped;
  return st;
}

struct StoreClient::Impl {
  Fd fd;
  std::string where;  // host:port, for messages
  milliseconds timeout{10000};
  Status closed;  // the error that closed the connection; ok while it is usable

  // Reads a reply by the deadline; an Io failure is returned as a message.
  Result<std::pair<std::uint8_t, std::string>> read_reply(Clock::time_point deadline, milliseconds waited) {
    std::uint8_t status = 0;
    std::uint32_t len = 0;
    Io io = read_exact(fd.get(), &status, 1, deadline);
    if (io == Io::kOk) io = read_u32(fd.get(), len, deadline);
    std::string payload;
    if (io == Io::kOk) io = read_growing(fd.get(), payload, len, deadline, nullptr);
    const int err = errno;
    switch (io) {
      case Io::kOk:
        return std::make_pair(status, std::move(payload));
      case Io::kTimedOut:
        return Status::Internal("no reply from the store " + where + " within " + std::to_string(waited.count()) +
                                " ms");
      case Io::kClosed:
        return Status::Internal("the store " + where + " closed the connection");
      case Io::kFailed:
        break;
    }
    return Status::Internal("connection to the store " + where + " lost: " + errno_text(err));
  }

  // Sends a request and reads its reply. The reply may take `wait` (a GET's wait, capped by the server) plus
  // `timeout`: a little longer than the server may take, so a timeout is the server's answer.
  Result<std::string> roundtrip(const std::string& what, const std::string& request, milliseconds wait) {
    if (!closed.ok()) return closed;
    Status failed;
    if (const Io io = write_all(fd.get(), request.data(), request.size(), Clock::now() + timeout); io != Io::kOk) {
      failed = Status::Internal(
          "store: " + what + ": cannot send to " + where + ": " +
          (io == Io::kTimedOut ? "not sent within " + std::to_string(timeout.count()) + " ms" : errno_text(errno)));
    } else {
      auto reply = read_reply(Clock::now() + wait + timeout, wait + timeout);
      if (!reply.ok()) {
        failed = Status::Internal("store: " + what + ": " + reply.status().message());
      } else {
        const auto& [status, payload] = *reply;
        switch (static_cast<StoreReply>(status)) {
          case StoreReply::kOk:
            return payload;
          case StoreReply::kTimeout:
            return Status::Internal("store: " + what + ": timed out waiting for the key");
          case StoreReply::kTooLarge:
            failed = Status::InvalidInput("store: " + what + " refused: too large: " + payload);
            break;
          case StoreReply::kTooManyKeys:
            failed = Status::InvalidInput("store: " + what + " refused: too many keys: " + payload);
            break;
          default:
            failed =
                Status::Internal("store: " + what + " refused (status " + std::to_string(status) + "): " + payload);
        }
      }
    }
    // The server closes after a refusal, and after a lost or late reply the stream is out of step: every later
    // call gets this error.
    closed = failed;
    fd.reset();
    return failed;
  }
};

std::string handshake_proof(const std::string& token, bool server, const std::string& first,
                            const std::string& second) {
  // HMAC-SHA-256 under the token of a label and both challenges: neither side's proof can be replayed as
  // the other's, or on another connection.
  const Digest d = hmac_sha256(token, std::string(server ? "hzp-store server" : "hzp-store client") + first + second);
  return std::string(d.begin(), d.end());
}

StoreClient::StoreClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StoreClient::~StoreClient() = default;

Result<std::unique_ptr<StoreClient>> StoreClient::connect(const std::string& host, std::uint16_t port,
                                                          const std::string& token, milliseconds timeout) {
  auto impl = std::make_unique<Impl>();
  impl->timeout = timeout;
  impl->where = host + ":" + std::to_string(port);
  const std::string& where = impl->where;
  if (token.size() > kMaxTokenBytes)
    return Status::InvalidInput("store: token of " + std::to_string(token.size()) + " bytes > 4096");
  boost::system::error_code ec;
  const auto ip = asio::ip::make_address(host, ec);
  if (ec) return Status::InvalidInput("store: bad address '" + host + "': " + ec.message());
  const tcp::endpoint endpoint(ip, port);
  const Clock::time_point deadline = Clock::now() + timeout;
  // Close-on-exec: the launcher's own client is open while it forks the ranks.
  impl->fd.reset(::socket(endpoint.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  const int fd = impl->fd.get();
  if (fd < 0) return Status::Internal("store: cannot create a socket: " + errno_text(errno));
  if (::connect(fd, endpoint.data(), static_cast<socklen_t>(endpoint.size())) != 0) {
    if (errno != EINPROGRESS && errno != EINTR)
      return Status::Internal("store: cannot connect to " + where + ": " + errno_text(errno));
    if (wait_ready(fd, POLLOUT, deadline) != Io::kOk)
      return Status::Internal("store: cannot connect to " + where + ": no answer within " +
                              std::to_string(timeout.count()) + " ms");
    int err = 0;
    socklen_t len = sizeof err;
    ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) return Status::Internal("store: cannot connect to " + where + ": " + errno_text(err));
  }
  set_nodelay(fd);
  // The handshake (store.h): the server proves it holds the token before this client proves anything, so a
  // stranger listening on the port learns nothing it could use.
  const std::string client_nonce = random_bytes(kNonceBytes);
  if (client_nonce.empty()) return Status::Internal("store: no random source for the handshake");
  const std::string hello = std::string(kMagic, sizeof kMagic) + client_nonce;
  // A refusal sent before the hello was read may reset the connection under the send; the reply, if it came,
  // is still read below.
  (void)write_all(fd, hello.data(), hello.size(), deadline);
  auto challenge = impl->read_reply(deadline, timeout);
  if (!challenge.ok())
    return Status::Internal("store: handshake with " + where + " failed: " + challenge.status().message());
  auto refused = [&](std::uint8_t status, const std::string& payload) -> Status {
    switch (static_cast<StoreReply>(status)) {
      case StoreReply::kBadToken:
        return Status::InvalidInput("store: " + where + " refused the token");
      case StoreReply::kBusy:
        return Status::Internal("store: " + where + " is busy: " + payload + "; try again later");
      default:
        return Status::Internal("store: handshake refused by " + where + " (status " + std::to_string(status) +
                                "): " + payload);
    }
  };
  if (challenge->first != static_cast<std::uint8_t>(StoreReply::kOk))
    return refused(challenge->first, challenge->second);
  const std::string& answer = challenge->second;
  Digest server_proof{};
  if (answer.size() == kNonceBytes + server_proof.size())
    std::memcpy(server_proof.data(), answer.data() + kNonceBytes, server_proof.size());
  const std::string server_nonce = answer.substr(0, std::min(answer.size(), kNonceBytes));
  if (answer.size() != kNonceBytes + server_proof.size() ||
      !same_digest(server_proof, proof(token, "server", client_nonce, server_nonce)))
    return Status::InvalidInput("store: " + where +
                                " did not prove it holds this job's token: this rank has another token "
                                "(HZP_STORE_TOKEN), or another process is listening on that port; nothing secret "
                                "was sent to it");
  const Digest mine = proof(token, "client", server_nonce, client_nonce);
  if (write_all(fd, reinterpret_cast<const char*>(mine.data()), mine.size(), deadline) != Io::kOk)
    return Status::Internal("store: handshake with " + where + " failed: the connection closed");
  auto reply = impl->read_reply(deadline, timeout);
  if (!reply.ok()) return Status::Internal("store: handshake with " + where + " failed: " + reply.status().message());
  if (reply->first != static_cast<std::uint8_t>(StoreReply::kOk)) return refused(reply->first, reply->second);
  return std::unique_ptr<StoreClient>(new StoreClient(std::move(impl)));
}

Status StoreClient::set(const std::string& key, const std::string& value) {
  if (key.size() > UINT32_MAX || value.size() > UINT32_MAX)
    return Status::InvalidInput("store: SET '" + key.substr(0, 64) + "': key or value above 4 GiB");
  std::string request(1, static_cast<char>(kSet));
  put_u32(request, static_cast<std::uint32_t>(key.size()));
  request += key;
  put_u32(request, static_cast<std::uint32_t>(value.size()));
  request += value;
  auto r = impl_->roundtrip("SET '" + key.substr(0, 64) + "'", request, milliseconds(0));
  return r.ok() ? Status::Ok() : r.status();
}

Result<std::string> StoreClient::get(const std::string& key, milliseconds timeout) {
  if (key.size() > UINT32_MAX) return Status::InvalidInput("store: GET: key above 4 GiB");
  const milliseconds wait = std::clamp(timeout, milliseconds(0), milliseconds(UINT32_MAX));
  std::string request(1, static_cast<char>(kGet));
  put_u32(request, static_cast<std::uint32_t>(key.size()));
  request += key;
  put_u32(request, static_cast<std::uint32_t>(wait.count()));
  return impl_->roundtrip("GET '" + key.substr(0, 64) + "'", request, wait);
}

}  // namespace hzp::runtime
