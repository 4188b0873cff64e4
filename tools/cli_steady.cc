// `hzp simulate`'s simulation, with the steady state counted where it applies (cli_steady.h).
#include "tools/cli_steady.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <new>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

namespace hzp::cli {
namespace {

// A function run in a forked child process, whose text comes back through a pipe. Destroying a child that
// was not waited for kills it: a failure of this process leaves no simulation running.
class Child {
 public:
  static Result<Child> start(const std::function<std::string()>& work) {
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
      // Its errors come back as text; its warnings would repeat this process's.
      if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, STDERR_FILENO);
      std::string text;
      try {
        text = work();
      } catch (const std::bad_alloc&) {
        text = nlohmann::json{{"code", static_cast<int>(StatusCode::kInvalidInput)},
                              {"message", "out of memory (std::bad_alloc)"}}
                   .dump();
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

  // The child's text, once it has exited; why there is none when it failed.
  Result<std::string> wait() {
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

  Child(Child&& other) noexcept : pid_(std::exchange(other.pid_, -1)), fd_(std::exchange(other.fd_, -1)) {}
  Child& operator=(Child&&) = delete;
  ~Child() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
      }
    }
    if (fd_ >= 0) ::close(fd_);
  }

 private:
  Child(pid_t pid, int fd) : pid_(pid), fd_(fd) {}
  pid_t pid_ = -1;
  int fd_ = -1;
};

// The first shorter run, in the child: its point, or its error with the error's code.
std::string first_run_report(const Compiled& first, sim::SimOptions options) {
  options.progress = false;
  options.timeline_max_ranks = 1;  // GPU 0's breakdown is all it reports
  auto r = sim::simulate(first, options);
  if (!r.ok())
    return nlohmann::json{{"code", static_cast<int>(r.status().code())}, {"message", r.status().message()}}.dump();
  sim::SteadyPoint point{*r, sim::step_breakdown(first.schedule, *r, 0)};
  return nlohmann::json{{"point", sim::steady_point_json(point)}}.dump();
}

Result<sim::SteadyPoint> read_first_report(const sim::SteadyStatePlan& plan, Result<std::string> text) {
  const std::string what = "the simulation of " + std::to_string(plan.first) + " micro-batches (a child process)";
  if (!text.ok()) return Status::Internal(what + " " + text.status().message() + "; --exact simulates without it");
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("message") && j["message"].is_string()) {
    const int code = j.value("code", static_cast<int>(StatusCode::kInternal));
    const std::string message = what + ": " + j["message"].get<std::string>();
    return code == static_cast<int>(StatusCode::kInvalidInput) ? Status::InvalidInput(message)
                                                               : Status::Internal(message);
  }
  if (!j.is_object() || !j.contains("point")) return Status::Internal(what + " reported nothing readable");
  return sim::steady_point_from_json(j["point"]);
}

}  // namespace

Result<Simulation> simulate_scenario(const Compiled& compiled, const sim::SteadyStatePlan& plan,
                                     const sim::SimOptions& options) {
  Simulation out;
  if (!plan.applies()) {
    HZP_ASSIGN_OR_RETURN(out.result, sim::simulate(compiled, options));
    out.breakdown = sim::step_breakdown(compiled.schedule, out.result, 0);
    return out;
  }
  const auto t0 = std::chrono::steady_clock::now();
  HZP_ASSIGN_OR_RETURN(Compiled first, compile(sim::with_micro_batches(compiled.scenario, plan.first)));
  HZP_ASSIGN_OR_RETURN(Compiled second, compile(sim::with_micro_batches(compiled.scenario, plan.second)));
  HZP_ASSIGN_OR_RETURN(Child child, Child::start([&] { return first_run_report(first, options); }));
  HZP_ASSIGN_OR_RETURN(sim::SimResult longer, sim::simulate(second, options));
  HZP_ASSIGN_OR_RETURN(sim::SteadyPoint shorter, read_first_report(plan, child.wait()));
  sim::StepBreakdown breakdown = sim::step_breakdown(second.schedule, longer, 0);
  HZP_ASSIGN_OR_RETURN(sim::SteadyPoint whole, sim::extrapolate(plan, compiled.scenario, compiled.cost, shorter,
                                                                {std::move(longer), breakdown}));
  out.result = std::move(whole.result);
  out.result.sim_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.breakdown = whole.breakdown;
  out.drawn = std::move(second);
  return out;
}

}  // namespace hzp::cli
