// The forked child and its supervision (protocol in sandbox.h).
#include "tests/fuzz/sandbox.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>

namespace hzp::fuzz {
namespace {

// Exit status the child uses when operator new fails under RLIMIT_AS.
constexpr int kOutOfMemoryExit = 97;
constexpr std::size_t kMaxReasonBytes = 4096;

int verdict_fd = -1;  // the child's end of the verdict pipe, for the new-handler

void write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n <= 0) return;
    done += static_cast<std::size_t>(n);
  }
}

[[noreturn]] void out_of_memory() {
  // No allocation here: the heap is what just ran out.
  static const char kMessage[] = "Mallocation failed under the memory limit";
  if (verdict_fd >= 0) (void)!::write(verdict_fd, kMessage, sizeof kMessage - 1);
  ::_exit(kOutOfMemoryExit);
}

[[noreturn]] void child_main(const std::function<Verdict()>& body, const SandboxLimits& limits, int fd) {
  ::setpgid(0, 0);
  verdict_fd = fd;
  const int null_in = ::open("/dev/null", O_RDONLY);
  const int out = ::open(limits.output_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (null_in >= 0) ::dup2(null_in, 0);
  if (out >= 0) {
    ::dup2(out, 1);
    ::dup2(out, 2);
  }
  const rlim_t bytes = static_cast<rlim_t>(limits.memory_mib) << 20;
  const rlimit as{bytes, bytes};
  ::setrlimit(RLIMIT_AS, &as);
  const rlimit no_core{0, 0};
  ::setrlimit(RLIMIT_CORE, &no_core);
  std::set_new_handler(out_of_memory);

  std::string message;
  try {
    const Verdict v = body();
    message = v.passed ? "P" : "F" + v.reason;
  } catch (const std::bad_alloc&) {
    out_of_memory();
  } catch (const std::exception& e) {
    message = std::string("Funcaught exception | ") + e.what();
  } catch (...) {
    message = "Funcaught exception of a non-std type";
  }
  if (message.size() > kMaxReasonBytes) message.resize(kMaxReasonBytes);
  write_all(fd, message);
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(0);  // no atexit handlers or static destructors of the parent's copy
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string read_tail(const std::string& path, std::size_t bytes) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return {};
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  const long start = size > static_cast<long>(bytes) ? size - static_cast<long>(bytes) : 0;
  std::fseek(f, start, SEEK_SET);
  std::string text(static_cast<std::size_t>(size - start), '\0');
  const std::size_t got = std::fread(text.data(), 1, text.size(), f);
  text.resize(got);
  std::fclose(f);
  return text;
}

}  // namespace

const char* to_string(Outcome outcome) {
  switch (outcome) {
    case Outcome::kPassed:
      return "passed";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kCrashed:
      return "crashed";
    case Outcome::kTimedOut:
      return "timed out";
    case Outcome::kOutOfMemory:
      return "out of memory";
    case Outcome::kNoVerdict:
      return "no verdict";
  }
  return "?";
}

std::string printable(const std::string& text, std::size_t max_bytes) {
  std::string out;
  for (unsigned char c : text) {
    if (out.size() >= max_bytes) {
      out += "...";
      break;
    }
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

SandboxResult run_in_sandbox(const std::function<Verdict()>& body, const SandboxLimits& limits) {
  int fds[2];
  SandboxResult result;
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    result.outcome = Outcome::kNoVerdict;
    result.reason = std::string("harness: pipe: ") + std::strerror(errno);
    return result;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    child_main(body, limits, fds[1]);
  }
  ::close(fds[1]);
  if (pid < 0) {
    ::close(fds[0]);
    result.outcome = Outcome::kNoVerdict;
    result.reason = std::string("harness: fork: ") + std::strerror(errno);
    return result;
  }
  ::setpgid(pid, pid);  // also here, so the group exists before the child gets to run

  // Read the verdict until the child closes the pipe (it exits) or the deadline passes.
  const auto deadline = start + std::chrono::duration<double>(limits.timeout_s);
  std::string verdict;
  bool timed_out = false;
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) continue;  // the loop re-checks the deadline
    char buf[4096];
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    verdict.append(buf, static_cast<std::size_t>(n));
  }
  ::close(fds[0]);
  if (timed_out) ::kill(-pid, SIGKILL), ::kill(pid, SIGKILL);
  int status = 0;
  rusage usage{};
  while (::wait4(pid, &status, 0, &usage) < 0 && errno == EINTR) {
  }
  ::kill(-pid, SIGKILL);  // whatever the case spawned and left behind
  result.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.max_rss_mib = usage.ru_maxrss / 1024;
  result.output_tail = printable(read_tail(limits.output_path, 800), 1200);

  char limits_text[96];
  std::snprintf(limits_text, sizeof limits_text, " (limits: %.0f s, %zu MiB)", limits.timeout_s, limits.memory_mib);
  if (timed_out) {
    result.outcome = Outcome::kTimedOut;
    result.reason = "still running after the deadline, killed" + std::string(limits_text);
  } else if (WIFSIGNALED(status)) {
    result.outcome = Outcome::kCrashed;
    result.reason = "killed by " + signal_name(WTERMSIG(status));
    if (!verdict.empty() && verdict[0] == 'M')
      result.reason += " after an allocation failed" + std::string(limits_text);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == kOutOfMemoryExit) {
    result.outcome = Outcome::kOutOfMemory;
    result.reason = "an allocation failed under the memory limit" + std::string(limits_text);
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !verdict.empty() && verdict[0] == 'P') {
    result.outcome = Outcome::kPassed;
  } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && !verdict.empty() && verdict[0] == 'F') {
    result.outcome = Outcome::kFailed;
    result.reason = verdict.substr(1);
  } else {
    result.outcome = Outcome::kNoVerdict;
    result.reason = "the case exited with status " + std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) +
                    " without a verdict (exit() or _exit() inside the code under test?)";
  }
  return result;
}

}  // namespace hzp::fuzz
