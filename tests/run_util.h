// Helpers for the tests that run the hzp command as a user would: run a shell command and keep its output,
// make a fresh scratch folder.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace hzp::test {

// The training text the runtime tests use (200 kB of tinyshakespeare).
inline const std::string kTrainingText = std::string(HZP_TEST_DATA_DIR) + "/tinyshakespeare_200k.txt";

struct RunResult {
  int code = -1;       // exit code, or 128 + signal
  std::string output;  // stdout and stderr, interleaved
  double seconds = 0;
};

inline RunResult run(const std::string& command) {
  namespace fs = std::filesystem;
  static int counter = 0;
  const fs::path log =
      fs::temp_directory_path() / ("hzp_run_" + std::to_string(::getpid()) + "_" + std::to_string(counter++) + ".log");
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system((command + " > " + log.string() + " 2>&1").c_str());
  RunResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log);
  std::stringstream ss;
  ss << in.rdbuf();
  r.output = ss.str();
  fs::remove(log);
  return r;
}

// An empty folder under the temporary directory, unique to this process.
inline std::filesystem::path fresh_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("hzp_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// A TCP port on 127.0.0.1 that was free a moment ago (the kernel's pick for port 0), for tests that start
// ranks with a fixed MASTER_PORT; a port derived from the pid could already be taken by anything.
inline int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = 20000 + ::getpid() % 20000;  // fallback
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  if (fd >= 0) ::close(fd);
  return port;
}

}  // namespace hzp::test
