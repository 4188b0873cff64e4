// The local launcher of `hzp train` (see launcher.h).
#include <utility>  // before Boost.Asio headers pulled in by the store (g++ 12 needs std::exchange first)

#include "runtime/launch/launcher.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>

#include "runtime/store/store.h"
#include "runtime/train/checkpoint.h"

extern char** environ;

namespace hzp::runtime {
namespace {

std::string random_token() {
  std::ifstream urandom("/dev/urandom", std::ios::binary);
  unsigned char bytes[16] = {};
  if (!urandom.read(reinterpret_cast<char*>(bytes), sizeof bytes)) {
    std::random_device rd;
    for (unsigned char& b : bytes) b = static_cast<unsigned char>(rd());
  }
  static const char* hex = "0123456789abcdef";
  std::string token;
  for (unsigned char b : bytes) {
    token += hex[b >> 4];
    token += hex[b & 15];
  }
  return token;
}

std::string describe(int status) {
  if (WIFSIGNALED(status))
    return std::string("killed by signal ") + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
           ")";
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

volatile sig_atomic_t g_interrupted = 0;
void on_signal(int) {
  g_interrupted = g_interrupted + 1;  // (not ++: volatile)
}

}  // namespace

int launch_local(const TrainOptions& options, const std::vector<std::string>& argv_tail) {
  const int n = options.nproc > 0 ? options.nproc : 1;
  // Bad scenarios, flags, data and output paths are reported once, here, before any rank starts.
  auto prepared = prepare_run(options, n);
  Status checked = prepared.ok() ? check_outputs(options, prepared->compiled.scenario, n) : prepared.status();
  std::unique_ptr<CheckpointDirLock> lock;  // held for the job's lifetime; released if the launcher dies
  if (checked.ok() && !options.checkpoint_dir.empty()) {
    auto locked = CheckpointDirLock::acquire(options.checkpoint_dir);
    if (locked.ok())
      lock = std::move(locked).value();
    else
      checked = locked.status();
  }
  if (!checked.ok()) {
    std::fprintf(stderr, "hzp train: %s\n", checked.message().c_str());
    return checked.code() == StatusCode::kInvalidInput ? 2 : 1;
  }
  const std::string token = random_token();
  StoreLimits limits;
  limits.max_wait = std::chrono::milliseconds(static_cast<long long>(options.timeout_s) * 1000);
  auto server = StoreServer::start("127.0.0.1", 0, token, limits);
  if (!server.ok()) {
    std::fprintf(stderr, "hzp train: cannot start the store: %s\n", server.status().message().c_str());
    return 1;
  }
  const std::uint16_t port = (*server)->port();
  auto client = StoreClient::connect("127.0.0.1", port, token);
  if (!client.ok()) {
    std::fprintf(stderr, "hzp train: cannot reach the store: %s\n", client.status().message().c_str());
    return 1;
  }

  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len <= 0) {
    std::fprintf(stderr, "hzp train: cannot find this executable (/proc/self/exe)\n");
    return 1;
  }
  self[len] = '\0';
  std::vector<std::string> args = {self, "train"};
  args.insert(args.end(), argv_tail.begin(), argv_tail.end());

  const int per_node = options.gpus_per_node > 0 ? options.gpus_per_node : n;
  const pid_t launcher = ::getpid();
  std::map<pid_t, int> rank_of;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      const std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      static const char* ours[] = {"RANK",           "WORLD_SIZE",    "LOCAL_RANK",      "LOCAL_WORLD_SIZE",
                                   "MASTER_ADDR",    "MASTER_PORT",   "HZP_STORE_TOKEN", "HZP_LAUNCHED",
                                   "HZP_STORE_ADDR", "HZP_STORE_PORT"};
      bool skip = false;
      for (const char* o : ours) skip = skip || key == o;
      if (!skip) env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(n));
    env.push_back("LOCAL_RANK=" + std::to_string(r % per_node));
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(per_node));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("HZP_STORE_TOKEN=" + token);
    env.push_back("HZP_LAUNCHED=1");
    std::vector<char*> argv, envp;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (std::string& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "hzp train: fork failed: %s\n", std::strerror(errno));
      for (const auto& [p, rank] : rank_of) kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      // A rank dies with its launcher (kill -9 of `hzp train` must not leave ranks training as orphans):
      // the kernel sends SIGKILL when the parent exits; if it already has, exit now.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != launcher) std::_Exit(1);
      // Its own process group: a terminal's Ctrl-C reaches the launcher alone, which asks each rank once to
      // stop after its step (a rank stops at once on a second signal).
      ::setpgid(0, 0);
      execve(self, argv.data(), envp.data());
      std::fprintf(stderr, "hzp train: cannot start rank %d: %s\n", r, std::strerror(errno));
      std::_Exit(127);
    }
    rank_of[pid] = r;
  }

  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // the store's connections to dead ranks

  // Supervise: reap children; the first abnormal exit is published so survivors can name it.
  std::map<int, int> status_of;  // rank -> wait status
  int first_failed = -1;
  auto deadline = std::chrono::steady_clock::time_point::max();
  const auto grace = std::chrono::seconds(options.timeout_s + 10);
  bool killed_stragglers = false;
  bool interrupt_forwarded = false;
  while (static_cast<int>(status_of.size()) < n) {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, WNOHANG);
    if (pid > 0 && rank_of.count(pid)) {
      const int r = rank_of[pid];
      status_of[r] = status;
      const bool bad = !(WIFEXITED(status) &&
                         (WEXITSTATUS(status) == 0 || (g_interrupted && WEXITSTATUS(status) == kExitInterrupted)));
      if (bad && first_failed < 0 && g_interrupted < 2) {  // a second interrupt killed it: not a failure
        first_failed = r;
        const std::string what = std::to_string(r) + " (" + describe(status) + ")";
        // Exit 2: the rank said what was wrong with its input; anything else may leave it silent.
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 2))
          std::fprintf(stderr, "hzp train: rank %s\n", what.c_str());
        // A rank killed by a signal is lost; one that exited reported its own error (often a consequence).
        if (WIFSIGNALED(status)) (void)(*client)->set("hzp/lost", what);
        deadline = std::chrono::steady_clock::now() + grace;
      }
      continue;
    }
    // An interrupt: the ranks (which a terminal's Ctrl-C reaches too; a kill of the launcher alone does not)
    // are asked to stop after their current step, with a checkpoint there; a second one stops them at once.
    if (g_interrupted == 1 && !interrupt_forwarded && first_failed < 0) {
      std::fprintf(stderr,
                   "hzp train: interrupted; every rank stops after its current step%s (Ctrl-C again to stop at "
                   "once)\n",
                   options.checkpoint_dir.empty() ? "" : " and writes a checkpoint");
      for (const auto& [p, r] : rank_of)
        if (!status_of.count(r)) kill(p, SIGINT);
      interrupt_forwarded = true;
      deadline = std::chrono::steady_clock::now() + grace;
    }
    if (g_interrupted > 1 && !killed_stragglers) {
      std::fprintf(stderr, "hzp train: interrupted again; stopping every rank now\n");
      for (const auto& [p, r] : rank_of)
        if (!status_of.count(r)) kill(p, SIGKILL);
      killed_stragglers = true;
    }
    if (!killed_stragglers && std::chrono::steady_clock::now() > deadline) {
      for (const auto& [p, r] : rank_of)
        if (!status_of.count(r)) {
          std::fprintf(stderr, "hzp train: rank %d still running %lld s after the failure; killing it\n", r,
                       static_cast<long long>(grace.count()));
          kill(p, SIGKILL);
        }
      killed_stragglers = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  bool all_ok = true;
  bool all_bad_input = true;
  for (const auto& [r, status] : status_of) {
    const bool ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    all_ok = all_ok && ok;
    all_bad_input = all_bad_input && WIFEXITED(status) && WEXITSTATUS(status) == 2;
  }
  if (all_ok) return 0;
  // Stopped by an interrupt, every rank cleanly (130) or having finished (0): not a failure.
  const bool clean_stop = std::all_of(status_of.begin(), status_of.end(), [](const auto& rs) {
    return WIFEXITED(rs.second) && (WEXITSTATUS(rs.second) == 0 || WEXITSTATUS(rs.second) == kExitInterrupted);
  });
  if (clean_stop) {
    std::fprintf(stderr, "hzp train: interrupted\n");
    return kExitInterrupted;
  }
  if (g_interrupted && first_failed < 0) {
    std::fprintf(stderr, "hzp train: interrupted; the ranks were stopped before their step ended\n");
    return kExitInterrupted;
  }
  if (all_bad_input) return 2;  // every rank said why (rank 0 once for all, when they agree)
  std::string summary;
  for (const auto& [r, status] : status_of) {
    const bool joined = (*client)->get("hzp/joined/" + std::to_string(r), std::chrono::milliseconds(20)).ok();
    summary +=
        "\n  rank " + std::to_string(r) + ": " + describe(status) + (joined ? "" : " (never joined the rendezvous)");
  }
  std::fprintf(stderr, "hzp train: failed%s%s\n",
               first_failed >= 0 ? (" (first to fail: rank " + std::to_string(first_failed) + ")").c_str() : "",
               summary.c_str());
  // Bad input: every rank said so, or the first to fail did (the others then lost it: a symlinked output
  // refused on rank 0 leaves rank 1 without its peer).
  const auto first = status_of.find(first_failed);
  const bool first_bad_input = first != status_of.end() && WIFEXITED(first->second) && WEXITSTATUS(first->second) == 2;
  return all_bad_input || first_bad_input ? 2 : 1;
}

}  // namespace hzp::runtime
