// A function run in a forked child process, its text returned through a pipe: SimGrid allows one simulation
// per process, and a crash inside one never takes the caller down (hzp simulate's steady state, the Python
// module's simulate).
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "shared/base/status.h"

namespace hzp::cli {

// Destroying a child that was not waited for kills it: a failure of the caller leaves no simulation running.
class Child {
 public:
  // Forks; the child runs `work`, writes what it returned to the pipe and exits 0 (std::bad_alloc: the JSON
  // {"code": kInvalidInput, "message": "out of memory ..."}). Its stderr goes to /dev/null unless
  // `keep_stderr`: its errors come back as text.
  static Result<Child> start(const std::function<std::string()>& work, bool keep_stderr = false);
  // The child's text, once it has exited; why there is none when it was killed or failed.
  Result<std::string> wait();

  Child(Child&& other) noexcept;
  Child& operator=(Child&&) = delete;
  ~Child();

 private:
  Child(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_ = -1;
  int fd_ = -1;
};

// A child's failure as its text ({"code", "message"}), and back: the Status (message after `prefix`), or
// nullopt when `report` is not a failure.
std::string error_report(const Status& status);
std::optional<Status> read_error_report(const nlohmann::json& report, const std::string& prefix = "");

}  // namespace hzp::cli
