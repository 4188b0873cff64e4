// Target "store": raw bytes against a live StoreServer on 127.0.0.1 (runtime/store/store.h): handshakes
// with good, wrong and oversized tokens, SET and GET requests with lying lengths, unknown ops, huge
// timeouts, then byte-level damage. Loopback only; one server per case, a few connections per case.
//
// Tolerant of the server's limits (they are being changed): it asks nothing of which status a request gets,
// only that the server
//   - survives (the case's process does not crash, hang or run out of memory),
//   - answers in whole frames (u8 status, u32 length, that many bytes),
//   - closes a connection after the client's EOF (checked on a few connections only, flag bit 1: today's
//     server keeps every socket until it stops, and one such finding should not hide the others),
//   - still serves a well-behaved client afterwards (StoreClient set + get, retried for a while once a flood
//     of connections has closed: a server may refuse connections beyond a limit, but not die of them),
//   - shuts down (destructor) while a client stalls halfway through a request.
//
// Case format: "HZPFUZZSTORE1\n", then per connection: u8 flags (bit 0: stall: send and keep the connection
// open to the end; bit 1: expect the server to close it after the client's EOF; bit 2: flood: open
// kFloodConnections connections that send these bytes and stay open until just before the health check;
// bit 3: authenticate first, the mutual handshake done by hand with the job's token; bit 4: the same with a
// wrong token), u32 length (little-endian), that many bytes to send. A connection whose bytes begin with the
// handshake of the protocol before the mutual proof ("HZPSTORE", u32 length, the token) is read as bit 3 and
// the rest of its bytes (the regression corpus was written so). All connections are open at once; replies are read
// until the server goes quiet.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/store/store.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/sandbox.h"

namespace hzp::fuzz {
namespace {

using runtime::StoreClient;
using runtime::StoreLimits;
using runtime::StoreServer;

constexpr char kHeader[] = "HZPFUZZSTORE1\n";
constexpr char kToken[] = "fuzz-token-0123456789";
constexpr std::chrono::milliseconds kMaxWait{50};  // the server's GET bound in these cases
// Replies are complete once no connection has said anything for this long (a GET waits at most kMaxWait);
// a connection that must be closed gets kCloseBound more.
constexpr std::chrono::milliseconds kQuiet{150};
constexpr std::chrono::milliseconds kCloseBound{1000};
constexpr std::chrono::seconds kMaxReading{5};
constexpr int kSendTimeoutMs = 500;
constexpr std::size_t kMaxConnections = 6;

constexpr int kFloodConnections = 300;

struct Connection {
  bool flood = false;         // kFloodConnections of these, open until just before the health check
  bool stall = false;         // send, but never finish: the connection stays open to the end of the case
  bool expect_close = false;  // after the client's EOF the server must close this connection
  int auth = 0;               // 1: the handshake by hand with the job's token first; 2: with a wrong one
  std::string bytes;
};

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

std::uint32_t get_u32(const std::string& in, std::size_t at) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(in[at + static_cast<std::size_t>(i)]);
  return v;
}

std::string encode(const std::vector<Connection>& conns) {
  std::string out = kHeader;
  for (const Connection& c : conns) {
    out.push_back(static_cast<char>((c.stall ? 1 : 0) | (c.expect_close ? 2 : 0) | (c.flood ? 4 : 0) |
                                    (c.auth == 1 ? 8 : 0) | (c.auth == 2 ? 16 : 0)));
    put_u32(out, static_cast<std::uint32_t>(c.bytes.size()));
    out += c.bytes;
  }
  return out;
}

std::vector<Connection> decode(const std::string& in) {
  std::vector<Connection> out;
  std::size_t pos = in.rfind(kHeader, 0) == 0 ? sizeof kHeader - 1 : 0;
  while (pos + 5 <= in.size() && out.size() < kMaxConnections) {
    Connection c;
    c.stall = (in[pos] & 1) != 0;
    c.expect_close = (in[pos] & 2) != 0;
    c.flood = (in[pos] & 4) != 0;
    c.auth = (in[pos] & 8) != 0 ? 1 : (in[pos] & 16) != 0 ? 2 : 0;
    const std::size_t len = get_u32(in, pos + 1);
    pos += 5;
    c.bytes = in.substr(pos, std::min(len, in.size() - pos));
    pos += c.bytes.size();
    const std::string legacy = std::string("HZPSTORE") + std::string("\x15\0\0\0", 4) + kToken;
    if (c.auth == 0 && c.bytes.rfind(legacy, 0) == 0) {
      c.auth = 1;
      c.bytes = c.bytes.substr(legacy.size());
    }
    out.push_back(std::move(c));
  }
  return out;
}

int connect_loopback(std::uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// The mutual handshake (store.h) by hand with `token`, replies read and dropped; the server's answer to a
// wrong token (a refusal, then end of stream) is left for the reply checks to see.
void authenticate(int fd, const std::string& token) {
  const std::string challenge(32, 'f');
  const std::string hello = "HZPSTOR2" + challenge;
  if (::send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(hello.size())) return;
  std::string answer;
  char buf[128];
  for (pollfd p{fd, POLLIN, 0}; answer.size() < 5 + 64 && ::poll(&p, 1, 1000) > 0;) {
    const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, 5 + 64 - answer.size()), 0);
    if (n <= 0) return;
    answer.append(buf, static_cast<std::size_t>(n));
  }
  if (answer.size() != 5 + 64 || answer[0] != 0) return;
  const std::string mine = runtime::handshake_proof(token, false, answer.substr(5, 32), challenge);
  if (::send(fd, mine.data(), mine.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(mine.size())) return;
  // The final reply, whole: a refusal carries its reason.
  std::string reply;
  for (std::size_t want = 5; reply.size() < want;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 1000) <= 0) return;
    const ssize_t n = ::recv(fd, buf, std::min(sizeof buf, want - reply.size()), 0);
    if (n <= 0) return;
    reply.append(buf, static_cast<std::size_t>(n));
    if (reply.size() == 5) want = 5 + get_u32(reply, 1);
  }
}

// Sends what the server will take within kSendTimeoutMs per write; the server may close early (a refused
// token) or stop reading, which is fine.
void send_all(int fd, const std::string& bytes) {
  timeval tv{0, kSendTimeoutMs * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

// Reads every connection until it ends (EOF or reset) or until all have been quiet for kQuiet; then waits up
// to kCloseBound more for the connections that must be closed.
void read_replies(const std::vector<int>& fds, const std::vector<Connection>& conns, std::vector<std::string>& replies,
                  std::vector<bool>& eof) {
  const auto give_up = std::chrono::steady_clock::now() + kMaxReading;
  auto pass = [&](bool only_must_close, std::chrono::milliseconds quiet) {
    for (;;) {
      std::vector<pollfd> polls;
      std::vector<std::size_t> which;
      for (std::size_t i = 0; i < fds.size(); ++i) {
        if (eof[i] || conns[i].stall || (only_must_close && !conns[i].expect_close)) continue;
        polls.push_back({fds[i], POLLIN, 0});
        which.push_back(i);
      }
      if (polls.empty() || std::chrono::steady_clock::now() > give_up) return;
      if (::poll(polls.data(), polls.size(), static_cast<int>(quiet.count())) <= 0) return;  // quiet
      for (std::size_t k = 0; k < polls.size(); ++k) {
        if (polls[k].revents == 0) continue;
        char buf[65536];
        const ssize_t n = ::recv(polls[k].fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n > 0)
          replies[which[k]].append(buf, static_cast<std::size_t>(n));
        else if (n == 0 || (errno != EAGAIN && errno != EINTR))
          eof[which[k]] = true;
      }
    }
  };
  pass(false, kQuiet);
  pass(true, kCloseBound);
}

// Empty when `replies` is a sequence of whole frames (`ended`: the server closed; else the last frame may
// still be on its way); else what is wrong.
std::string frame_problem(const std::string& replies, bool ended) {
  std::size_t pos = 0;
  while (pos < replies.size()) {
    if (!ended) {
      if (pos + 5 > replies.size() || pos + 5 + get_u32(replies, pos + 1) > replies.size()) return {};
    }
    if (pos + 5 > replies.size()) return "a reply frame cut inside its header at byte " + std::to_string(pos);
    const std::size_t len = get_u32(replies, pos + 1);
    if (pos + 5 + len > replies.size())
      return "a reply frame of " + std::to_string(len) + " bytes cut after " + std::to_string(replies.size() - pos - 5);
    pos += 5 + len;
  }
  return {};
}

class StoreTarget : public FuzzTarget {
 public:
  std::string prepare(const Context&) override { return {}; }
  const char* extension() const override { return ".bin"; }

  std::string describe(const std::string& input) const override {
    std::string out;
    for (const Connection& c : decode(input))
      out += (out.empty() ? "" : "; ") + std::string(c.flood ? std::to_string(kFloodConnections) + " x " : "") +
             std::string(c.stall ? "stalled " : "") + std::string(c.expect_close ? "must-close " : "") +
             "connection of " + std::to_string(c.bytes.size()) + " bytes: " + printable(c.bytes.substr(0, 48), 120);
    return out.empty() ? "no connections" : out;
  }

  std::string generate(Rng& rng) override {
    std::vector<Connection> conns(1 + rng.below(4));
    for (Connection& c : conns) {
      c.flood = rng.chance(1);
      c.stall = !c.flood && rng.chance(8);
      c.expect_close = !c.stall && !c.flood && rng.chance(5);
      c.bytes = handshake(rng, c.auth);
      const std::size_t requests = rng.below(6);
      for (std::size_t i = 0; i < requests; ++i) c.bytes += request(rng);
      if (rng.chance(20)) damage(rng, c.bytes);
    }
    return encode(conns);
  }

  Verdict run(const std::string& input) override {
    StoreLimits limits;
    limits.max_wait = kMaxWait;
    const std::vector<Connection> conns = decode(input);
    std::vector<int> fds;
    Verdict verdict;
    {
      auto server = StoreServer::start("127.0.0.1", 0, kToken, limits);
      if (!server.ok()) return Verdict::fail("StoreServer::start failed | " + server.status().message());
      const std::uint16_t port = (*server)->port();
      // Send every connection's bytes, then read every reply together until the server goes quiet.
      std::vector<int> flood;
      for (std::size_t i = 0; i < conns.size() && verdict.passed; ++i) {
        for (int k = 0; conns[i].flood && k < kFloodConnections; ++k) {
          const int fd = connect_loopback(port);
          if (fd < 0) break;  // refused beyond a limit: allowed
          flood.push_back(fd);
          send_all(fd, conns[i].bytes);
        }
        const int fd = connect_loopback(port);
        if (fd < 0) {
          verdict = Verdict::fail("cannot connect to the store | connection " + std::to_string(i + 1) + ": " +
                                  std::strerror(errno));
          break;
        }
        fds.push_back(fd);
        if (conns[i].auth != 0) authenticate(fd, conns[i].auth == 1 ? kToken : "wrong-token");
        send_all(fd, conns[i].bytes);
        if (!conns[i].stall) ::shutdown(fd, SHUT_WR);
      }
      std::vector<std::string> replies(fds.size());
      std::vector<bool> eof(fds.size(), false);
      if (verdict.passed) read_replies(fds, conns, replies, eof);
      for (std::size_t i = 0; i < fds.size() && verdict.passed; ++i) {
        if (conns[i].stall) continue;
        if (std::string problem = frame_problem(replies[i], eof[i]); !problem.empty())
          verdict = Verdict::fail("malformed reply stream | connection " + std::to_string(i + 1) + ": " + problem);
        else if (conns[i].expect_close && !eof[i])
          verdict = Verdict::fail("the server did not close a connection after the client's EOF | connection " +
                                  std::to_string(i + 1) + ", still open " + std::to_string(kCloseBound.count()) +
                                  " ms later");
      }
      for (int fd : flood) ::close(fd);
      if (verdict.passed) verdict = health_check(port, flood.empty() ? 1 : 20);
    }  // the server shuts down here, with stalled and unclosed connections still open
    for (int fd : fds) ::close(fd);
    return verdict;
  }

 private:
  // A good client's SET and GET; `tries` connection attempts 100 ms apart (a flood's sockets take a moment
  // to be noticed closed).
  static Verdict health_check(std::uint16_t port, int tries) {
    auto client = StoreClient::connect("127.0.0.1", port, kToken, std::chrono::seconds(3));
    for (int t = 1; t < tries && !client.ok(); ++t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      client = StoreClient::connect("127.0.0.1", port, kToken, std::chrono::seconds(3));
    }
    if (!client.ok())
      return Verdict::fail("a good client cannot connect after the case | " + client.status().message());
    if (Status s = (*client)->set("fuzz/health", "ok"); !s.ok())
      return Verdict::fail("a good client's SET failed after the case | " + s.message());
    auto got = (*client)->get("fuzz/health", std::chrono::milliseconds(100));
    if (!got.ok()) return Verdict::fail("a good client's GET failed after the case | " + got.status().message());
    if (*got != "ok") return Verdict::fail("a good client's GET returned the wrong value | " + printable(*got, 100));
    return Verdict::pass();
  }

  // A connection's opening: mostly the real handshake (done by hand, `auth`), sometimes a wrong token, a bad
  // magic, the protocol before the mutual proof, or a hello cut short.
  static std::string handshake(Rng& rng, int& auth) {
    const int roll = static_cast<int>(rng.below(100));
    auth = 0;
    if (roll < 4) return "HZPSTORF" + std::string(32, 'c');
    if (roll < 12) {
      auth = 2;
      return {};
    }
    if (roll < 16) {  // the old protocol, a token length far beyond the token
      std::string out = "HZPSTORE";
      static const std::vector<std::uint32_t> lens = {4096, 4097, 65536, 0xffffffffu};
      put_u32(out, rng.pick(lens));
      return out + kToken;
    }
    if (roll < 20) {
      const std::string hello = "HZPSTOR2" + std::string(32, 'c');
      return hello.substr(0, rng.below(hello.size()));  // cut short
    }
    auth = 1;
    return {};
  }

  static std::string key(Rng& rng) {
    switch (rng.below(8)) {
      case 0:
        return "";
      case 1:
        return std::string(1024, 'k');
      case 2:
        return std::string(1025, 'k');
      case 3:
        return std::string(rng.chance(50) ? 4096 : 70000, 'k');
      case 4:
        return std::string("bin\0\xff\x01", 6);
      default:
        return "rank" + std::to_string(rng.below(4));
    }
  }

  // One request, sometimes with lengths that do not match the bytes that follow.
  static std::string request(Rng& rng) {
    std::string out;
    const int roll = static_cast<int>(rng.below(100));
    const bool set = roll < 45;
    out.push_back(static_cast<char>(roll < 90 ? (set ? 1 : 2) : rng.pick(std::vector<int>{0, 3, 255})));
    const std::string k = key(rng);
    if (rng.chance(85)) {
      put_u32(out, static_cast<std::uint32_t>(k.size()));
    } else {
      static const std::vector<std::uint32_t> lies = {0, 1024, 1025, 65536, 0xffffffffu};
      put_u32(out, rng.pick(lies));
    }
    out += k;
    if (set) {
      std::string value(rng.chance(90) ? rng.below(64) : (rng.chance(50) ? 100000 : 1 << 20), 'v');
      if (rng.chance(85)) {
        put_u32(out, static_cast<std::uint32_t>(value.size()));
      } else {
        static const std::vector<std::uint32_t> lies = {64u << 20, (64u << 20) + 1, 256u << 20, 0xffffffffu, 1000000};
        put_u32(out, rng.pick(lies));
      }
      out += value;
    } else {
      static const std::vector<std::uint32_t> timeouts = {0, 0, 0, 1, 1, 10, 100000, 0xffffffffu};
      put_u32(out, rng.pick(timeouts));
    }
    return out;
  }

  static void damage(Rng& rng, std::string& bytes) {
    if (bytes.empty()) return;
    const std::size_t at = rng.below(bytes.size());
    switch (rng.below(3)) {
      case 0:
        bytes[at] = static_cast<char>(bytes[at] ^ (1 << rng.below(8)));
        break;
      case 1:
        bytes.resize(at);
        break;
      default:
        bytes.insert(at, std::string(1 + rng.below(8), static_cast<char>(rng.below(256))));
        break;
    }
  }
};

}  // namespace

std::unique_ptr<FuzzTarget> make_store_target() {
  return std::make_unique<StoreTarget>();
}

}  // namespace hzp::fuzz
