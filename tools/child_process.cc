// A function run in a forked child process (child_process.h).
#include "tools/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <utility>

#include <nlohmann/json.hpp>

namespace hzp::cli {

Result<Child> Child::start(const std::function<std::string()>& work, bool keep_stderr) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return Status::Internal(std::string("pipe: ") + std::strerror(errno));
  std::fflush(nullptr);  // nothing buffered is written twice
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return Status::Internal(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    if (!keep_stderr)
      if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, STDERR_FILENO);
    std::string text;
    try {
      text = work();
    } catch (const std::bad_alloc&) {
      text = error_report(Status::InvalidInput("out of memory (std::bad_alloc)"));
    }
    for (std::size_t done = 0; done < text.size();) {
      const ssize_t n = ::write(fds[1], text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ::_exit(1);
      done += static_cast<std::size_t>(n);
    }
    ::_exit(0);
  }
  ::close(fds[1]);
  return Child(pid, fds[0]);
}

Result<std::string> Child::wait() {
  std::string text;
  char buffer[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd_, buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buffer, static_cast<std::size_t>(n));
  }
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  if (WIFSIGNALED(status))
    return Status::Internal("killed by signal " + std::to_string(WTERMSIG(status)) + " (" +
                            strsignal(WTERMSIG(status)) + ")");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return Status::Internal("exited with status " + std::to_string(WEXITSTATUS(status)));
  return text;
}

Child::Child(Child&& other) noexcept : pid_(std::exchange(other.pid_, -1)), fd_(std::exchange(other.fd_, -1)) {}

Child::~Child() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
    }
  }
  if (fd_ >= 0) ::close(fd_);
}

std::string error_report(const Status& status) {
  return nlohmann::json{{"code", static_cast<int>(status.code())}, {"message", status.message()}}.dump();
}

std::optional<Status> read_error_report(const nlohmann::json& report, const std::string& prefix) {
  if (!report.is_object() || !report.contains("message") || !report["message"].is_string()) return std::nullopt;
  const std::string message = prefix + report["message"].get<std::string>();
  return report.value("code", static_cast<int>(StatusCode::kInternal)) == static_cast<int>(StatusCode::kInvalidInput)
             ? Status::InvalidInput(message)
             : Status::Internal(message);
}

}  // namespace hzp::cli
