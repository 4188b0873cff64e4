// Running hzp from a fuzz target (spawn.h).
#include "tests/fuzz/spawn.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "shared/base/text.h"
#include "tests/fuzz/checks.h"
#include "tests/fuzz/files.h"

extern char** environ;

namespace hzp::fuzz {
namespace {

constexpr std::size_t kMaxStderrBytes = 64 << 10;

// Variables through which a launcher hands `hzp train` its rank: never passed on, so train stays local.
bool launcher_variable(const std::string& name) {
  static const std::set<std::string> names = {
      "RANK",        "WORLD_SIZE",   "LOCAL_RANK",   "LOCAL_WORLD_SIZE",     "MASTER_ADDR",
      "MASTER_PORT", "SLURM_PROCID", "SLURM_NTASKS", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"};
  return names.count(name) > 0 || name.rfind("HZP_", 0) == 0;
}

// " (TYPE)" when stderr says an exception of TYPE escaped (std::terminate's message), else "".
std::string escaped_exception(const std::string& err) {
  static const std::string kTerminate = "terminate called after throwing an instance of '";
  static const std::string kSimGrid = "Uncaught exception ";
  std::size_t at = err.find(kTerminate);
  if (at != std::string::npos) {
    at += kTerminate.size();
    return " (" + printable(err.substr(at, err.find('\'', at) - at), 80) + ")";
  }
  at = err.find(kSimGrid);
  if (at != std::string::npos) {
    at += kSimGrid.size();
    return " (" + printable(err.substr(at, err.find(':', at) - at), 80) + ")";
  }
  return {};
}

}  // namespace

HzpRun run_hzp(std::vector<std::string> args, const std::string& dir) {
  const std::string err_path = dir + "/.stderr", out_path = dir + "/.stdout";
  HzpRun run;
  const pid_t pid = fork();
  if (pid == 0) {
    const int null_fd = open("/dev/null", O_RDWR);
    const int err_fd = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int out_fd = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(null_fd, 0);
    dup2(out_fd, 1);
    dup2(err_fd, 2);
    if (chdir(dir.c_str()) != 0) _exit(126);
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      if (!launcher_variable(kv.substr(0, kv.find('=')))) env.push_back(kv);
    }
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  if (pid < 0) {
    run.status = 127 << 8;
    run.err = "harness: fork failed";
    return run;
  }
  while (waitpid(pid, &run.status, 0) < 0 && errno == EINTR) {
  }
  run.err = read_file(err_path).value_or("");
  run.out = read_file(out_path).value_or("");
  return run;
}

int exit_code(const HzpRun& run) {
  return WIFEXITED(run.status) ? WEXITSTATUS(run.status) : -1;
}

Verdict judge_hzp_exit(const HzpRun& run) {
  const std::string& err = run.err;
  const std::string tail = printable(err.size() > 400 ? err.substr(err.size() - 400) : err, 600);
  if (WIFSIGNALED(run.status)) {
    const char* abbrev = sigabbrev_np(WTERMSIG(run.status));
    return Verdict::fail(std::string("hzp killed by SIG") + (abbrev ? abbrev : "?") + escaped_exception(err) + " | " +
                         tail);
  }
  const int code = WEXITSTATUS(run.status);
  if (code != 0 && code != 2) return Verdict::fail("hzp exit code " + std::to_string(code) + " | " + tail);
  if (code == 0) return Verdict::pass();
  if (err.size() > kMaxStderrBytes)
    return Verdict::fail("hzp wrote " + std::to_string(err.size()) + " bytes to stderr before exit 2 | " + tail);
  // Line by line; a carriage return ends a line too (plan --search redraws its progress line with it).
  std::size_t pos = 0;
  while (pos < err.size()) {
    std::size_t end = err.find_first_of("\r\n", pos);
    if (end == std::string::npos) end = err.size();
    const std::string line = err.substr(pos, end - pos);
    pos = end + 1;
    if (line.empty()) continue;
    if (std::string problem = message_problem(line); !problem.empty())
      return Verdict::fail("hzp exit 2 with a bad stderr line: " + problem + " | " + printable(line, 300));
  }
  return Verdict::pass();
}

}  // namespace hzp::fuzz
