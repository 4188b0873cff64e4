// One rank of `hzp train`: scenario -> schedule -> executor over Gloo, the training loop, evaluation,
// checkpoints, metrics and traces; and the checks the launcher makes once before any rank starts.
#include <utility>  // before Boost.Asio headers pulled in by the store (g++ 12 needs std::exchange first)

#include "runtime/train/trainer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <sstream>
#include <thread>

#include "runtime/device/registry.h"
#include "runtime/store/store.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/executor.h"
#include "runtime/train/trace.h"
#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"
#include "shared/model/model_math.h"
#include "shared/scenario/scenario_parser.h"
#include "shared/schedule/sharding.h"
#include "shared/trace/trace_format.h"

namespace hzp::runtime {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// A trace holds every op of every step: it is meant for a few steps, not a whole run.
constexpr std::int64_t kMaxTracedSteps = 100;

// A small barrier over the store (host thread): every rank sets key/r, rank 0 (or everybody) waits for all.
Status store_barrier(StoreClient& store, const std::string& key, int rank, int world, bool all_wait,
                     milliseconds timeout) {
  HZP_RETURN_IF_ERROR(store.set(key + "/" + std::to_string(rank), "1"));
  if (!all_wait && rank != 0) return Status::Ok();
  for (int r = 0; r < world; ++r) {
    auto got = store.get(key + "/" + std::to_string(r), timeout);
    if (!got.ok())
      return Status::Internal("barrier '" + key + "': rank " + std::to_string(r) +
                              " did not arrive: " + got.status().message());
  }
  return Status::Ok();
}

// Every rank bumps hzp/alive/<rank> in the store twice a second from its own thread and connection, so a
// rank that stops answering (stopped, hung, or dead under a launcher that cannot tell) can be named by the
// others: its counter stops moving.
class Heartbeat {
 public:
  Heartbeat(const LaunchEnv& env) : env_(env) {
    auto client = StoreClient::connect(env.store_host, env.store_port, env.token, milliseconds(5000));
    if (!client.ok()) return;  // the failure note then just lacks heartbeat information
    client_ = std::move(client).value();
    thread_ = std::thread([this] {
      for (long long beat = 0; !stop_; ++beat) {
        if (!client_->set("hzp/alive/" + std::to_string(env_.rank), std::to_string(beat)).ok()) return;
        for (int i = 0; i < 5 && !stop_; ++i) std::this_thread::sleep_for(milliseconds(100));
      }
    });
  }
  ~Heartbeat() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }

 private:
  LaunchEnv env_;
  std::unique_ptr<StoreClient> client_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Names the lost rank: the launcher publishes a rank that died (hzp/lost); a rank that never set
// hzp/joined/<rank> never reached the rendezvous; otherwise ranks whose heartbeat did not move for two
// seconds.
std::string lost_rank_note(const LaunchEnv& env) {
  auto client = StoreClient::connect(env.store_host, env.store_port, env.token, milliseconds(2000));
  if (!client.ok()) return "store unreachable (" + client.status().message() + "); the rank hosting it may be lost";
  auto lost = (*client)->get("hzp/lost", milliseconds(1500));
  if (lost.ok()) return "lost rank " + *lost;
  std::string never;
  for (int r = 0; r < env.world_size; ++r)
    if (!(*client)->get("hzp/joined/" + std::to_string(r), milliseconds(50)).ok())
      never += (never.empty() ? "" : ", ") + std::to_string(r);
  if (!never.empty())
    return "rank " + never +
           " never joined (did not reach the store: not started, crashed before the rendezvous, "
           "or started with another HZP_STORE_TOKEN / MASTER_PORT)";
  auto beats = [&] {
    std::vector<std::string> v(env.world_size);
    for (int r = 0; r < env.world_size; ++r) {
      auto b = (*client)->get("hzp/alive/" + std::to_string(r), milliseconds(50));
      v[r] = b.ok() ? *b : "";
    }
    return v;
  };
  const std::vector<std::string> before = beats();
  std::this_thread::sleep_for(milliseconds(2000));
  const std::vector<std::string> after = beats();
  std::string stale;
  for (int r = 0; r < env.world_size; ++r)
    if (r != env.rank && before[r] == after[r]) stale += (stale.empty() ? "" : ", ") + std::to_string(r);
  if (stale.empty()) return "";
  return "lost rank " + stale + " (no heartbeat for 2 s: stopped, hung or dead)";
}

std::string clock_text(double seconds) {
  const long long s = std::llround(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  return buf;
}

// Every rank exchanges the step its checkpoint resumes at (or its error) through the store, so that one
// damaged or foreign file stops every rank with the same message instead of desynchronised training.
Result<std::int64_t> agree_on_resume(StoreClient& store, const LaunchEnv& env, const Result<std::int64_t>& mine,
                                     std::int64_t latest, milliseconds timeout) {
  HZP_RETURN_IF_ERROR(store.set("hzp/resume/" + std::to_string(env.rank),
                                mine.ok() ? "ok " + std::to_string(*mine) : "error " + mine.status().message()));
  if (!mine.ok()) return mine.status();
  for (int r = 0; r < env.world_size; ++r) {
    auto got = store.get("hzp/resume/" + std::to_string(r), timeout);
    if (!got.ok()) return Status::Internal("--resume: rank " + std::to_string(r) + " did not report its checkpoint");
    if (got->rfind("error ", 0) == 0)
      return Status::InvalidInput("--resume: rank " + std::to_string(r) + " cannot resume: " + got->substr(6));
    if (*got != "ok " + std::to_string(latest))
      return Status::InvalidInput("--resume: rank " + std::to_string(r) + " resumes at step " + got->substr(3) +
                                  " where 'latest' says " + std::to_string(latest) +
                                  "; the checkpoint is inconsistent");
  }
  return mine;
}

// The backend of --backend, from the registry (runtime/backends/registry.cc), with this rank's store and
// rendezvous settings.
Result<std::unique_ptr<Device>> make_device(const TrainOptions& options, const LaunchEnv& env, milliseconds timeout,
                                            int host_threads, int local_ranks) {
  BackendOptions b;
  b.host_threads = host_threads;
  b.store = StoreAddress{env.store_host, env.store_port, env.token};
  b.global_rank = env.rank;
  b.local_rank = env.local_rank;
  b.local_world_size = local_ranks;
  if (const char* a = std::getenv("HZP_GLOO_ADDR")) b.interface_address = a;
  b.timeout = timeout;
  auto device = hzp::runtime::make_device(options.backend, b);
  if (!device.ok())
    return Status::InvalidInput("--backend " + quoted(options.backend, 20) + ": " + device.status().message());
  return device;
}

// Set by SIGINT / SIGTERM: stop after the current step. A second signal ends the process at once.
volatile std::sig_atomic_t g_stop_signal = 0;
void on_stop_signal(int signal) {
  if (g_stop_signal) {
    std::signal(signal, SIG_DFL);
    std::raise(signal);
  }
  g_stop_signal = 1;
}

// Whether the schedule all-reduces the gradient norm (training.grad_clip, fp16's overflow check).
bool takes_grad_norm(const Schedule& schedule) {
  for (const Program& program : schedule.programs)
    for (const Op& op : program.ops)
      if (const auto* c = std::get_if<CollectiveOp>(&op.body); c && c->purpose == CollectivePurpose::kGradNorm)
        return true;
  return false;
}

}  // namespace

Result<Scenario> load_train_scenario(const TrainOptions& options, int world_size) {
  std::string name;
  auto loaded = load_scenario_document(options.scenario_path, options.sets, &name);
  if (!loaded.ok()) return loaded.status();
  const int g = options.gpus_per_node > 0 ? options.gpus_per_node : world_size;
  if (world_size % g != 0)
    return Status::InvalidInput("--gpus-per-node " + std::to_string(g) + " does not divide --nproc " +
                                std::to_string(world_size));
  // The scenario runs on this job's ranks, whatever cluster size it names.
  const ClusterOverride ranks{world_size / g, g};
  auto parsed = parse_scenario(*loaded, name, ranks);
  if (!parsed.ok())
    return Status::InvalidInput(printable(options.scenario_path, 200) + " (with " + std::to_string(world_size / g) +
                                " nodes x " + std::to_string(g) + " ranks): " + parsed.status().message());
  Scenario s = std::move(parsed).value();
  if (options.steps > 0) s.run.steps = options.steps;
  return s;
}

Result<PreparedRun> prepare_run(const TrainOptions& options, int world_size) {
  PreparedRun run;
  HZP_ASSIGN_OR_RETURN(const Scenario scenario, load_train_scenario(options, world_size));
  HZP_ASSIGN_OR_RETURN(run.compiled, compile(scenario));
  HZP_RETURN_IF_ERROR(runtime_supports(run.compiled.scenario));
  if (options.data_path == ByteDataset::kRandom) {
    run.data = ByteDataset::random_tokens(run.compiled.scenario.model.vocab, run.compiled.scenario.training.seq_len);
  } else {
    HZP_ASSIGN_OR_RETURN(run.data, ByteDataset::load(options.data_path, run.compiled.scenario.training.seq_len));
  }
  if (run.data.vocab() != run.compiled.scenario.model.vocab)
    return Status::InvalidInput("model.vocab: the byte-level tokenizer of --data has " +
                                std::to_string(run.data.vocab()) + " tokens, the model says " +
                                std::to_string(run.compiled.scenario.model.vocab) +
                                " (--data random trains on random tokens of any vocabulary)");
  if (options.stop_after > run.compiled.scenario.run.steps)
    return Status::InvalidInput("--stop-after " + std::to_string(options.stop_after) + " is past the run's " +
                                std::to_string(run.compiled.scenario.run.steps) +
                                " steps (run.steps or --steps): it would never stop the run early");
  const std::int64_t steps = options.stop_after > 0 ? std::min(options.stop_after, run.compiled.scenario.run.steps)
                                                    : run.compiled.scenario.run.steps;
  if ((!options.trace_path.empty() || !options.perfetto_path.empty()) && steps > kMaxTracedSteps)
    return Status::InvalidInput("--trace / --perfetto record every op of every step: at most " +
                                std::to_string(kMaxTracedSteps) + " steps (this run has " + std::to_string(steps) +
                                "; use --steps or --stop-after)");
  return run;
}

namespace {

// Whether `name` is prefix<digits>suffix (step_12, rank_3.bin).
bool digits_after(const std::string& name, const char* prefix, const char* suffix) {
  const std::size_t p = std::strlen(prefix), q = std::strlen(suffix);
  if (name.size() <= p + q || name.rfind(prefix, 0) != 0 || name.compare(name.size() - q, q, suffix) != 0) return false;
  return name.substr(p, name.size() - p - q).find_first_not_of("0123456789") == std::string::npos;
}

// The first entry of `dir` named step_<digits> that holds a rank file (rank_<r>.bin; a folder of only
// temporary files is what a writer killed before its first rename leaves), or that is not a folder (a file or
// a link in a step's place), else "".
std::string first_step_dir(const std::string& dir) {
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (!digits_after(name, "step_", "")) continue;
    if (!it->is_directory(ec) || it->is_symlink(ec)) return name;
    std::error_code inner;
    for (auto f = fs::directory_iterator(it->path(), inner); !inner && f != fs::directory_iterator();
         f.increment(inner))
      if (digits_after(f->path().filename().string(), "rank_", ".bin")) return name;
  }
  return "";
}

}  // namespace

Status check_outputs(const TrainOptions& options, const Scenario& scenario, int world_size) {
  // Every output file up front: none is an input, a FIFO, a device or a directory, none is another, and
  // each folder is writable.
  std::vector<NamedPath> outputs;
  if (!options.out_dir.empty()) {
    HZP_RETURN_IF_ERROR(ensure_writable_dir(options.out_dir, "--out"));
    std::vector<std::string> names = {"summary.json", "metrics.jsonl"};
    for (int r = 0; r < world_size; ++r) names.push_back("memory_rank" + std::to_string(r) + ".json");
    outputs = files_in_dir("--out", options.out_dir, names);
  }
  for (const auto& [flag, path] :
       {std::pair{"--trace", options.trace_path}, std::pair{"--perfetto", options.perfetto_path}})
    if (!path.empty()) outputs.push_back({flag, path});
  std::vector<NamedPath> inputs = {{"SCENARIO", options.scenario_path}, {"--data", options.data_path}};
  if (!scenario.model.hf_config_path.empty()) inputs.push_back({"model.from_hf_config", scenario.model.hf_config_path});
  HZP_RETURN_IF_ERROR(check_output_files(outputs, inputs));
  // Nor a checkpoint's file: `latest`, `.lock` or anything in a step folder (a resumed run reads them).
  if (!options.checkpoint_dir.empty()) {
    std::error_code ec;
    const fs::path dir = fs::weakly_canonical(fs::absolute(options.checkpoint_dir, ec), ec);
    for (const auto& [what, path] : outputs) {
      std::error_code ec2;
      const fs::path at = fs::weakly_canonical(fs::absolute(path, ec2), ec2);
      if (ec || ec2 || at.parent_path().empty()) continue;
      const fs::path rel = at.lexically_relative(dir);
      const std::string head = rel.empty() ? "" : rel.begin()->string();
      if (head == "latest" || head == ".lock" || head.rfind("step_", 0) == 0)
        return Status::InvalidInput(what + " " + printable(path, 200) + ": is a checkpoint file of --checkpoint-dir " +
                                    printable(options.checkpoint_dir, 200) + ", which it would overwrite");
    }
  }
  if (!options.checkpoint_dir.empty())
    HZP_RETURN_IF_ERROR(ensure_writable_dir(options.checkpoint_dir, "--checkpoint-dir"));
  if (options.resume) {
    HZP_ASSIGN_OR_RETURN(const std::int64_t latest, read_latest(options.checkpoint_dir));
    // A step folder past `latest` (a run killed before it moved `latest`, or `latest` moved back by hand)
    // would be overwritten by the resumed run: refused, as a fresh run into checkpoints is.
    std::error_code ec;
    for (auto it = fs::directory_iterator(options.checkpoint_dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (!digits_after(name, "step_", "") || name.size() > 5 + 18) continue;
      if (std::stoll(name.substr(5)) > latest)
        return Status::InvalidInput("--resume: --checkpoint-dir " + printable(options.checkpoint_dir, 200) + " holds " +
                                    name + ", past its latest (step " + std::to_string(latest) +
                                    "), which the resumed run would overwrite: remove it, or write its step into " +
                                    "latest to resume from it");
    }
  }
  // A new run into a directory of checkpoints would replace them and move `latest` back: only when asked.
  // Anything named `latest` counts, a link (even one that loops) or a FIFO too.
  // So does a step folder without `latest` (a run killed between its rank files and `latest`, a deleted
  // `latest`): its rank files would be replaced.
  std::error_code ec;
  if (!options.checkpoint_dir.empty() && !options.resume && !options.overwrite_checkpoints) {
    const bool has_latest = fs::exists(fs::symlink_status(fs::path(options.checkpoint_dir) / "latest", ec));
    std::string step_dir = has_latest ? "" : first_step_dir(options.checkpoint_dir);
    if (has_latest || !step_dir.empty()) {
      auto latest = read_latest(options.checkpoint_dir);
      return Status::InvalidInput("--checkpoint-dir " + printable(options.checkpoint_dir, 200) + " holds checkpoints" +
                                  (latest.ok()  ? " (the latest at step " + std::to_string(*latest) + ")"
                                   : has_latest ? ""
                                                : " (" + printable(step_dir, 60) + ", with no latest)") +
                                  ": continue them with --resume, or start over with --overwrite-checkpoints");
    }
  }
  // A step folder that is a link (or not a folder) is refused when a checkpoint is written there: say so
  // now, not after the steps before it have trained.
  if (!options.checkpoint_dir.empty()) {
    for (auto it = fs::directory_iterator(options.checkpoint_dir, ec); !ec && it != fs::directory_iterator();
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      std::error_code kind;
      if (name.rfind("step_", 0) == 0 && (it->is_symlink(kind) || !it->is_directory(kind)))
        return Status::InvalidInput("--checkpoint-dir " + printable(options.checkpoint_dir, 200) + ": " +
                                    printable(name, 60) +
                                    " is not a folder (a link or a file): hzp writes no checkpoint through it");
    }
  }
  return Status::Ok();
}

namespace {

// What every rank of a run must agree on: the scenario as compiled, the step and checkpoint flags, the
// backend and the training data. Ranks an external launcher starts with another --set or data file would
// otherwise train inconsistently (another learning rate on each shard) or abort in a collective of another size.
nlohmann::json run_fingerprint(const TrainOptions& o, const PreparedRun& prepared) {
  nlohmann::json doc = scenario_to_json(prepared.compiled.scenario);
  doc["train flags"] = {{"--steps", o.steps},
                        {"--stop-after", o.stop_after},
                        {"--resume", o.resume},
                        {"--overwrite-checkpoints", o.overwrite_checkpoints},
                        {"--checkpoint-dir given", !o.checkpoint_dir.empty()},
                        {"--backend", o.backend}};
  char hash[24];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(prepared.data.content_hash()));
  doc["--data"] = {{"train_bytes", prepared.data.train_bytes()}, {"content hash", hash}};
  return doc;
}

// The first place two fingerprints differ: "model.layers is 3 on rank 1, 2 on rank 0".
std::string first_difference(const nlohmann::json& a, const nlohmann::json& b, const std::string& a_name,
                             const std::string& b_name, const std::string& path = "") {
  if (a.is_object() && b.is_object()) {
    for (const auto& [key, value] : b.items()) {
      auto it = a.find(key);
      if (it == a.end()) return path + key + " is missing on " + a_name;
      if (*it != value) return first_difference(*it, value, a_name, b_name, path + key + ".");
    }
    for (const auto& [key, value] : a.items())
      if (!b.contains(key)) return path + key + " is missing on " + b_name;
  }
  return (path.empty() ? std::string("the run") : path.substr(0, path.size() - 1)) + " is " + printable(a.dump(), 60) +
         " on " + a_name + ", " + printable(b.dump(), 60) + " on " + b_name;
}

// One rank's run in four phases — join (store, device, executor, resume point), train (the step loop with
// evaluation and checkpoints), write (memory, traces, summary), leave (the exit barrier). A phase returns 0
// to go on or the process exit code. Errors before the rank depends on its peers are plain (exit 2 for bad
// input, 1 otherwise); after, they are fatal: the message names a lost rank where one can be found and goes
// to the caller's FatalHandler, which `hzp train` uses to end the process at once.
class RankRun {
 public:
  RankRun(const TrainOptions& options, const LaunchEnv& env, const PreparedRun& prepared, FatalHandler on_fatal)
      : options_(options),
        env_(env),
        scenario_(prepared.compiled.scenario),
        cost_(prepared.compiled.cost),
        schedule_(prepared.compiled.schedule),
        prepared_(prepared),
        on_fatal_(std::move(on_fatal)),
        lead_(env.rank == 0),
        timeout_(static_cast<long long>(options.timeout_s) * 1000),
        tokens_per_step_(prepared.compiled.scenario.training.global_batch *
                         prepared.compiled.scenario.training.seq_len),
        // Model FLOPs per rank per step: MFU against the scenario's GPU type on a GPU backend, as the simulator
        // reports it; on the host, GFLOP/s per rank (a GPU's MFU of a CPU run says nothing).
        flops_per_rank_step_(prepared.compiled.cost.model_flops *
                             static_cast<double>(prepared.compiled.scenario.grad_accum_steps())),
        peak_(prepared.compiled.scenario.cluster.gpu.peak_flops),
        on_host_(options.backend == "cpu"),
        takes_norm_(takes_grad_norm(prepared.compiled.schedule)) {}

  int join();
  Status check_same_run();
  int train();
  int write_outputs();
  int leave();
  bool interrupted() const { return interrupted_; }

 private:
  // Bad input that every rank finds (a checkpoint of another model) is said once: rank 0 says it and
  // publishes it, and a rank that finds the same says nothing.
  int fail(const Status& st) const {
    const bool bad_input = st.code() == StatusCode::kInvalidInput;
    constexpr const char* kBadInputKey = "hzp/bad_input/0";
    bool said = false;
    if (bad_input && store_ && env_.rank != 0) {
      auto rank0 = store_->get(kBadInputKey, milliseconds(1000));
      said = rank0.ok() && *rank0 == st.message();
    }
    if (!said) std::fprintf(stderr, "hzp train: rank %d: %s\n", env_.rank, st.message().c_str());
    if (bad_input && store_ && env_.rank == 0) (void)store_->set(kBadInputKey, st.message());
    return bad_input ? 2 : 1;
  }
  // Reported once even when a stream thread and the main thread both fail.
  int fatal(const Status& st) {
    if (fatal_reported_.exchange(true)) return 1;
    const std::string note = lost_rank_note(env_);
    const int code = st.code() == StatusCode::kInvalidInput ? 2 : 1;  // bad input found during the run says so
    on_fatal_("hzp train: rank " + std::to_string(env_.rank) + ": " + note + (note.empty() ? "" : ": ") + st.message(),
              code);
    return code;
  }
  int evaluate(std::int64_t step_shown, bool before_training);
  std::string speed_basis() const {
    if (on_host_) return "speed in model GFLOP/s per rank (the host backend)";
    char text[96];
    std::snprintf(text, sizeof text, "MFU against %s (%.0f TFLOP/s)", scenario_.cluster.gpu.type.c_str(), peak_ / 1e12);
    return text;
  }
  int checkpoint(std::int64_t steps_done);
  int write_traces();
  double mfu(double seconds, std::int64_t steps) const {
    return seconds > 0 ? flops_per_rank_step_ * static_cast<double>(steps) / (seconds * peak_) : 0.0;
  }
  double gflops_per_rank(double seconds, std::int64_t steps) const {
    return seconds > 0 ? flops_per_rank_step_ * static_cast<double>(steps) / seconds / 1e9 : 0.0;
  }
  // "MFU 41.2 %" against the scenario's GPU, or "3.1 GFLOP/s/rank" on the host.
  std::string speed_text(double seconds, std::int64_t steps) const {
    char text[64];
    if (on_host_)
      std::snprintf(text, sizeof text, "%.3g GFLOP/s/rank", gflops_per_rank(seconds, steps));
    else
      std::snprintf(text, sizeof text, "MFU %.3g %%", 100 * mfu(seconds, steps));
    return text;
  }

  const TrainOptions& options_;
  LaunchEnv env_;
  const Scenario& scenario_;
  const ModelCost& cost_;
  const Schedule& schedule_;
  const PreparedRun& prepared_;
  const FatalHandler on_fatal_;
  std::atomic<bool> fatal_reported_{false};
  const bool lead_;
  const milliseconds timeout_;
  const std::int64_t tokens_per_step_;
  const double flops_per_rank_step_;
  const double peak_;
  bool interrupted_ = false;  // stopped early by an interrupt (exit 130 once the outputs are written)
  const bool on_host_;        // the CPU backend: speed in GFLOP/s, not a GPU's MFU
  const bool takes_norm_;     // the schedule all-reduces the gradient norm (clipping, fp16): it is reported
  int host_threads_ = 1;      // the CPU backend's kernel threads per rank
  int local_ranks_ = 1;       // ranks on this host (GPU backends: do they share a device?)

  std::unique_ptr<CheckpointDirLock> lock_;  // external launchers: rank 0 holds the checkpoint directory
  std::unique_ptr<StoreServer> server_;
  std::unique_ptr<StoreClient> store_;
  std::unique_ptr<Device> device_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> metrics_{nullptr, &std::fclose};
  std::int64_t first_step_ = 0;
  std::int64_t end_step_ = 0;
  bool nothing_to_train_ = false;  // resumed at the last step: no step, no output
  double train_seconds_ = 0;
  std::chrono::steady_clock::time_point joined_at_;
  double setup_seconds_ = 0;  // from join() to the first step: store, device, weights, communicators
  std::int64_t trained_ = 0;
  StepMetrics last_;
  double last_val_ = -1;
  std::vector<std::string> checkpoints_written_;
  std::vector<std::string> wrote_;
};

// Every rank publishes its run (run_fingerprint) and rank 0 compares each with its own, then publishes the
// verdict: a rank started with another scenario, --set, --data or step flag is refused by every rank, before
// any collective. Rank 0 hosts the store under an external launcher: on a refusal it waits (a few seconds at
// most) until every rank has read the verdict before leaving.
Status RankRun::check_same_run() {
  const std::string text = run_fingerprint(options_, prepared_).dump();
  HZP_RETURN_IF_ERROR(store_->set("hzp/run/" + std::to_string(env_.rank), text));
  constexpr const char* kVerdict = "hzp/run_verdict";
  auto missing = [&](int r, const Status& st) {  // named as a lost rank is ("rank 1 never joined ...")
    const std::string note = lost_rank_note(env_);
    return Status::Internal(!note.empty()
                                ? note
                                : "rank " + std::to_string(r) + " did not publish its run within --timeout-s " +
                                      std::to_string(options_.timeout_s) + " (" + st.message() + ")");
  };
  if (!lead_) {
    auto verdict = store_->get(kVerdict, timeout_);
    if (!verdict.ok()) return missing(0, verdict.status());
    (void)store_->set("hzp/run_seen/" + std::to_string(env_.rank), "1");
    return verdict->empty() ? Status::Ok() : Status::InvalidInput(*verdict);
  }
  std::string verdict;
  for (int r = 1; r < env_.world_size && verdict.empty(); ++r) {
    auto theirs = store_->get("hzp/run/" + std::to_string(r), timeout_);
    if (!theirs.ok()) return missing(r, theirs.status());
    if (*theirs == text) continue;
    const std::string rank = "rank " + std::to_string(r);
    verdict = rank + " was started with another run than rank 0: " +
              first_difference(nlohmann::json::parse(*theirs, nullptr, /*allow_exceptions=*/false),
                               nlohmann::json::parse(text), rank, "rank 0") +
              " (every rank needs the same scenario, --set, --data and step flags)";
  }
  HZP_RETURN_IF_ERROR(store_->set(kVerdict, verdict));
  if (verdict.empty()) return Status::Ok();
  for (int r = 1; r < env_.world_size; ++r)
    (void)store_->get("hzp/run_seen/" + std::to_string(r), std::min(timeout_, milliseconds(5000)));
  return Status::InvalidInput(verdict);
}

int RankRun::join() {
  joined_at_ = std::chrono::steady_clock::now();
  // Under hzp's launcher these checks already passed once, before any rank started.
  if (!env_.hosted_by_launcher && lead_) {
    if (Status st = check_outputs(options_, scenario_, env_.world_size); !st.ok()) return fail(st);
    if (!options_.checkpoint_dir.empty()) {
      auto locked = CheckpointDirLock::acquire(options_.checkpoint_dir);
      if (!locked.ok()) return fail(locked.status());
      lock_ = std::move(locked).value();
    }
  }
  // Host threads (the CPU backend's kernels): the ranks of this host share its cores.
  const int local = env_.local_world_size > 0 ? env_.local_world_size
                    : options_.nproc > 0      ? options_.nproc
                                              : env_.world_size;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  host_threads_ = options_.threads > 0 ? options_.threads : std::max(1, cores / std::max(1, local));
  local_ranks_ = std::max(1, local);

  auto address = resolve_ipv4(env_.store_host, "the store address (HZP_STORE_ADDR or MASTER_ADDR)");
  if (!address.ok()) return fail(address.status());
  env_.store_host = *address;
  // The store: hzp's launcher hosts it; under torchrun / Slurm / mpirun rank 0 does.
  if (!env_.hosted_by_launcher && lead_) {
    StoreLimits limits;
    limits.max_wait = timeout_;
    auto started = StoreServer::start(env_.store_host, env_.store_port, env_.token, limits);
    if (!started.ok()) return fail(started.status());
    server_ = std::move(started).value();
  }
  // Under an external launcher rank 0 may not be listening yet: retry refused connections until the timeout
  // (a refused token is final).
  auto store_or = StoreClient::connect(env_.store_host, env_.store_port, env_.token, timeout_);
  for (auto until = std::chrono::steady_clock::now() + timeout_; !store_or.ok() &&
                                                                 store_or.status().code() == StatusCode::kInternal &&
                                                                 std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(100));
    store_or = StoreClient::connect(env_.store_host, env_.store_port, env_.token, timeout_);
  }
  if (!store_or.ok()) return fail(store_or.status());
  store_ = std::move(store_or).value();
  if (Status st = store_->set("hzp/joined/" + std::to_string(env_.rank), "1"); !st.ok()) return fail(st);
  if (Status st = check_same_run(); !st.ok()) return fail(st);

  auto device_or = make_device(options_, env_, timeout_, host_threads_, local_ranks_);
  if (!device_or.ok()) return fail(device_or.status());
  device_ = std::move(device_or).value();
  auto executor_or = Executor::create(scenario_, schedule_, env_.rank, &prepared_.data, *device_,
                                      [this](const Status& st) { fatal(st); });
  if (!executor_or.ok())
    return executor_or.status().code() == StatusCode::kInvalidInput ? fail(executor_or.status())
                                                                    : fatal(executor_or.status());
  executor_ = std::move(executor_or).value();
  executor_->set_tracing(!options_.trace_path.empty() || !options_.perfetto_path.empty());

  if (lead_ && !options_.out_dir.empty()) {
    // O_NOFOLLOW: a metrics.jsonl that is a symlink must not lead hzp to write into the file it points at.
    // O_NONBLOCK, then a regular file only: opening a FIFO with no reader for writing would wait forever.
    const std::string metrics_path = (fs::path(options_.out_dir) / "metrics.jsonl").string();
    int fd =
        ::open(metrics_path.c_str(),
               O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (options_.resume ? O_APPEND : O_TRUNC), 0644);
    std::string why = fd < 0 ? (errno == ENXIO ? "a FIFO with no reader" : std::strerror(errno)) : "";
    struct stat info {};
    if (fd >= 0 && (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode))) {
      ::close(fd);
      fd = -1;
      why = S_ISFIFO(info.st_mode) ? "a FIFO" : "not a regular file";
    }
    if (fd >= 0) {
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      metrics_.reset(::fdopen(fd, options_.resume ? "a" : "w"));
      if (!metrics_) ::close(fd);
    }
    if (!metrics_)
      return fail(Status::InvalidInput("--out: cannot write " + printable(metrics_path, 200) + ": " +
                                       (why.empty() ? "fdopen failed" : why)));
  }
  if (options_.resume) {
    auto latest = read_latest(options_.checkpoint_dir);
    if (!latest.ok()) return fail(latest.status());
    const std::string file = checkpoint_file(options_.checkpoint_dir, *latest, env_.rank);
    auto agreed = agree_on_resume(*store_, env_, executor_->load(file), *latest, timeout_);
    if (!agreed.ok()) return fail(agreed.status());
    first_step_ = *agreed;
    if (lead_) std::printf("resumed from %s at step %lld\n", file.c_str(), static_cast<long long>(first_step_));
  }
  const RunSpec& run = scenario_.run;
  end_step_ = options_.stop_after > 0 ? std::min(run.steps, options_.stop_after) : run.steps;
  if (first_step_ >= end_step_) {  // resumed at (or past) the last step: say so, write nothing
    nothing_to_train_ = true;
    if (lead_)
      std::printf(
          "hzp train: the checkpoint is at step %lld and the run ends at step %lld (%s): nothing to train, "
          "nothing written\n",
          static_cast<long long>(first_step_), static_cast<long long>(end_step_),
          options_.stop_after > 0 && options_.stop_after < run.steps ? "--stop-after" : "run.steps");
    return 0;
  }
  setup_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - joined_at_).count();
  if (lead_) {
    std::printf(
        "hzp train: %s, policy %s %s, %d ranks (%d per node), %lld params, %lld tokens/step, steps %lld..%lld "
        "of %lld; %s; set up in %.1f s\n",
        scenario_.name.c_str(), to_string(schedule_.policy), sharding_notation(scenario_.policy.sharding).c_str(),
        env_.world_size, scenario_.cluster.gpus_per_node, static_cast<long long>(cost_.params),
        static_cast<long long>(tokens_per_step_), static_cast<long long>(first_step_ + 1),
        static_cast<long long>(end_step_), static_cast<long long>(run.steps), speed_basis().c_str(), setup_seconds_);
    std::fflush(stdout);
  }
  return 0;
}

// Validation loss, printed and logged by rank 0; `step_shown` is 1-based (0 before training).
int RankRun::evaluate(std::int64_t step_shown, bool before_training) {
  auto val = executor_->evaluate(scenario_.run.eval_batches);
  if (!val.ok()) return fatal(val.status());
  last_val_ = *val;
  if (!lead_) return 0;
  if (before_training)
    std::printf("before training | val_loss %.6f\n", *val);
  else
    std::printf("step %lld/%lld | val_loss %.6f\n", static_cast<long long>(step_shown),
                static_cast<long long>(end_step_), *val);
  if (metrics_)
    std::fprintf(metrics_.get(), "%s\n", nlohmann::json({{"step", step_shown}, {"val_loss", *val}}).dump().c_str());
  return 0;
}

// Every rank writes its file; `latest` moves only once every rank's file is in place.
int RankRun::checkpoint(std::int64_t steps_done) {
  const std::string& dir = options_.checkpoint_dir;
  const fs::path file = checkpoint_file(dir, steps_done, env_.rank);
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  // A step directory that is a symlink (or not a directory) would take the rank files out of the checkpoint
  // directory: refused, never written through.
  const fs::file_status step_dir = fs::symlink_status(file.parent_path(), ec);
  if (ec || !fs::is_directory(step_dir))
    return fatal(Status::InvalidInput("--checkpoint-dir: " + printable(file.parent_path().string(), 200) +
                                      (fs::is_symlink(step_dir) ? " is a symlink" : " is not a directory") +
                                      "; hzp writes checkpoints only into directories of its own"));
  if (Status st = executor_->save(file.string(), steps_done); !st.ok()) return fatal(st);
  if (Status st =
          store_barrier(*store_, "hzp/ckpt/" + std::to_string(steps_done), env_.rank, env_.world_size, false, timeout_);
      !st.ok())
    return fatal(st);
  if (lead_) {
    if (Status st = write_latest(dir, steps_done); !st.ok()) return fatal(st);
    checkpoints_written_.push_back(file.parent_path().string());
  }
  return 0;
}

int RankRun::train() {
  if (nothing_to_train_) return 0;
  const RunSpec& run = scenario_.run;
  // Fault injection for tests: HZP_FAULT_KILL_RANK / _STEP pick the victim and the step, HZP_FAULT_SIGNAL
  // "STOP" freezes it instead of killing it (a hung rank); HZP_FAULT_NAN_STEP makes that step's loss NaN on
  // every rank (a diverged step).
  const char* nan_step = std::getenv("HZP_FAULT_NAN_STEP");
  // HZP_FAULT_OVERFLOW_STEP: that step runs with an fp16 loss scale of 2^40, so its gradients overflow.
  if (const char* overflow = std::getenv("HZP_FAULT_OVERFLOW_STEP")) executor_->inject_overflow(std::atoll(overflow));
  const char* kill_rank = std::getenv("HZP_FAULT_KILL_RANK");
  const char* kill_step = std::getenv("HZP_FAULT_KILL_STEP");
  const char* kill_signal = std::getenv("HZP_FAULT_SIGNAL");
  heartbeat_ = std::make_unique<Heartbeat>(env_);  // until the rank leaves
  const auto started = std::chrono::steady_clock::now();
  // The starting point of the validation curve (ln 256 = 5.55 for untrained byte-level weights).
  if (run.eval_interval > 0 && first_step_ == 0)
    if (int rc = evaluate(0, true); rc != 0) return rc;
  for (std::int64_t step = first_step_; step < end_step_; ++step) {
    if (kill_rank && kill_step && std::atoi(kill_rank) == env_.rank && std::atoll(kill_step) == step) {
      std::fprintf(stderr, "hzp train: rank %d: HZP_FAULT_KILL_* (signal %s) at step %lld\n", env_.rank,
                   kill_signal != nullptr ? kill_signal : "KILL", static_cast<long long>(step));
      std::fflush(stderr);
      std::raise(kill_signal != nullptr && std::string(kill_signal) == "STOP" ? SIGSTOP : SIGKILL);
    }
    auto m = executor_->train_step(step, g_stop_signal != 0);
    if (!m.ok()) return fatal(m.status());
    if (nan_step != nullptr && std::atoll(nan_step) == step) m->loss = std::nan("");
    // Every rank holds the same all-reduced loss: a diverged run stops everywhere, said once.
    // (An fp16 step whose gradients overflowed was skipped by design: its norm is Inf, the loss is not.)
    if (!std::isfinite(m->loss) || (!m->skipped && !std::isfinite(m->grad_norm))) {
      if (lead_)
        std::fprintf(stderr,
                     "hzp train: training diverged at step %lld (loss %g, gradient norm %g): stopping before "
                     "the non-finite state is checkpointed; lower run.lr or set training.grad_clip\n",
                     static_cast<long long>(step), m->loss, m->grad_norm);
      std::fflush(stderr);
      return 1;
    }
    last_ = *m;
    train_seconds_ += m->seconds;
    ++trained_;
    const bool final_step = step + 1 == end_step_;
    if (lead_) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const double eta = elapsed / static_cast<double>(trained_) * static_cast<double>(end_step_ - step - 1);
      char scaler[64] = "";
      if (scenario_.training.precision == Precision::kFp16)
        std::snprintf(scaler, sizeof scaler, " | scale %g%s", m->loss_scale, m->skipped ? " (overflow: skipped)" : "");
      // Steps are numbered from 1 (the optimizer steps done), here, in metrics.jsonl and in checkpoints.
      char aux[32] = "", norm[32] = "";
      if (scenario_.model.has_moe) std::snprintf(aux, sizeof aux, " | aux %.4f", m->aux_loss);
      if (takes_norm_) std::snprintf(norm, sizeof norm, " | norm %.3f", m->grad_norm);
      std::printf("step %lld/%lld | loss %.6f%s | lr %.2e%s%s | %.3f s | %.0f tok/s | %s | elapsed %s | ETA %s\n",
                  static_cast<long long>(step + 1), static_cast<long long>(end_step_), m->loss, aux, m->lr, norm,
                  scaler, m->seconds, tokens_per_step_ / m->seconds, speed_text(m->seconds, 1).c_str(),
                  clock_text(elapsed).c_str(), clock_text(eta).c_str());
      if (metrics_) {
        nlohmann::json line = {{"step", step + 1}, {"loss", m->loss}, {"lr", m->lr}, {"seconds", m->seconds}};
        if (scenario_.model.has_moe) line["aux_loss"] = m->aux_loss;
        if (takes_norm_) line["grad_norm"] = m->grad_norm;
        if (scenario_.training.precision == Precision::kFp16) {  // the loss scaler's state
          line["loss_scale"] = m->loss_scale;
          line["skipped"] = m->skipped;
          if (m->skipped) line["grad_norm"] = nullptr;  // Inf: not JSON
        }
        std::fprintf(metrics_.get(), "%s\n", line.dump().c_str());
      }
    }
    if ((run.eval_interval > 0 && (step + 1) % run.eval_interval == 0) || final_step)
      if (int rc = evaluate(step + 1, false); rc != 0) return rc;
    if (lead_) std::fflush(stdout);
    if (metrics_) std::fflush(metrics_.get());
    // An interrupt (Ctrl-C, SIGTERM from Slurm or torchrun) on any rank stops every rank after the same step,
    // with a checkpoint there when a checkpoint directory is set.
    const bool stop = m->stop && !final_step;
    if (!options_.checkpoint_dir.empty() &&
        ((run.checkpoint_interval > 0 && (step + 1) % run.checkpoint_interval == 0) || final_step || stop))
      if (int rc = checkpoint(step + 1); rc != 0) return rc;
    if (stop) {
      interrupted_ = true;
      if (lead_) {
        const std::string saved =
            fs::path(checkpoint_file(options_.checkpoint_dir, step + 1, 0)).parent_path().string();
        std::printf("hzp train: interrupted after step %lld of %lld; %s\n", static_cast<long long>(step + 1),
                    static_cast<long long>(end_step_),
                    options_.checkpoint_dir.empty() ? "no --checkpoint-dir, so the run cannot be continued"
                                                    : ("checkpoint " + saved + "; continue with --resume").c_str());
        std::fflush(stdout);
      }
      break;
    }
  }
  return 0;
}

// Traces: every rank writes its events, rank 0 merges them once all are written.
int RankRun::write_traces() {
  const std::string base =
      options_.trace_path.empty() ? options_.perfetto_path + ".hzp-trace.json" : options_.trace_path;
  const std::string part = base + ".rank" + std::to_string(env_.rank);
  // As text, one event at a time, and no larger than hzp replay (and the merge below) reads.
  auto text = trace_json_text(rank_trace(scenario_, schedule_, env_.rank, executor_->trace()));
  if (!text.ok()) return fatal(text.status().prefixed("--trace: "));
  if (Status st = write_file_atomic(part, *text); !st.ok()) return fatal(st);
  if (Status st = store_barrier(*store_, "hzp/trace", env_.rank, env_.world_size, false, timeout_); !st.ok())
    return fatal(st);
  if (!lead_) return 0;
  std::vector<Trace> parts;
  for (int r = 0; r < env_.world_size; ++r) {
    const std::string path = base + ".rank" + std::to_string(r);
    auto t = load_trace_file(path);
    if (!t.ok()) return fatal(Status::Internal("trace: " + t.status().message()));
    parts.push_back(std::move(t).value());
    std::error_code ec;
    fs::remove(path, ec);
  }
  auto trace = merge_traces(std::move(parts));
  if (!trace.ok()) return fatal(trace.status());
  if (!options_.trace_path.empty()) {
    auto merged = trace_json_text(*trace);
    if (!merged.ok()) return fatal(merged.status().prefixed("--trace: "));
    if (Status st = write_file_atomic(options_.trace_path, *merged); !st.ok()) return fatal(st);
    wrote_.push_back(options_.trace_path + " (trace)");
  }
  if (!options_.perfetto_path.empty()) {
    if (Status st = write_json_atomic(options_.perfetto_path, perfetto_from_trace(*trace)); !st.ok()) return fatal(st);
    wrote_.push_back(options_.perfetto_path + " (Perfetto timeline)");
  }
  return 0;
}

int RankRun::write_outputs() {
  if (nothing_to_train_) return 0;
  const std::string& out_dir = options_.out_dir;
  // Per-rank memory: measured buffers next to the core's model of them.
  if (!out_dir.empty()) {
    nlohmann::json pools = nlohmann::json::object();
    for (const BufferPool& p : schedule_.pools)
      pools[p.name] = static_cast<double>(p.slots) * static_cast<double>(p.slot_bytes);
    nlohmann::json mem = {{"rank", env_.rank},
                          {"measured", executor_->memory()},
                          {"model",
                           {{"params", schedule_.state_bytes[0].params},
                            {"grads", schedule_.state_bytes[0].grads},
                            {"optimizer", schedule_.state_bytes[0].optimizer},
                            {"pools", pools}}}};
    Status st = write_file_atomic((fs::path(out_dir) / ("memory_rank" + std::to_string(env_.rank) + ".json")).string(),
                                  mem.dump(2) + "\n");
    if (!st.ok()) return fail(st);
    if (metrics_) wrote_.push_back((fs::path(out_dir) / "metrics.jsonl").string());
    wrote_.push_back((fs::path(out_dir) / "memory_rank<r>.json").string() + " (" + std::to_string(env_.world_size) +
                     " ranks)");
  }
  if (!options_.trace_path.empty() || !options_.perfetto_path.empty())
    if (int rc = write_traces(); rc != 0) return rc;
  if (lead_ && !out_dir.empty()) {
    nlohmann::json summary = {
        {"scenario", scenario_.name},
        {"policy", to_string(schedule_.policy)},
        {"sharding", sharding_notation(scenario_.policy.sharding)},
        {"world_size", env_.world_size},
        {"gpus_per_node", scenario_.cluster.gpus_per_node},
        {"params", cost_.params},
        {"steps_run", trained_},
        {"final_loss", last_.loss},
        {"final_val_loss", last_val_},
        {"train_seconds", train_seconds_},
        {"setup_seconds", setup_seconds_},
        {"tokens_per_second", train_seconds_ > 0 ? trained_ * tokens_per_step_ / train_seconds_ : 0.0},
        {"model_gflops_per_second_per_rank", gflops_per_rank(train_seconds_, trained_)}};
    if (!on_host_) {  // a GPU's MFU of a CPU run says nothing
      summary["mfu"] = mfu(train_seconds_, trained_);
      summary["mfu_peak_of"] = scenario_.cluster.gpu.type;
    }
    Status st = write_file_atomic((fs::path(out_dir) / "summary.json").string(), summary.dump(2) + "\n");
    if (!st.ok()) return fail(st);
    wrote_.push_back((fs::path(out_dir) / "summary.json").string());
  }
  if (lead_) {
    for (const std::string& dir : checkpoints_written_) wrote_.push_back(dir + " (checkpoint)");
    std::printf("hzp train: done: %lld steps in %.1f s (%.0f tokens/s, %s), final loss %.4f, validation loss %.4f\n",
                static_cast<long long>(trained_), train_seconds_,
                train_seconds_ > 0 ? trained_ * tokens_per_step_ / train_seconds_ : 0.0,
                speed_text(train_seconds_, trained_).c_str(), last_.loss, last_val_);
    if (!wrote_.empty()) std::printf("  wrote %s\n", hzp::join(wrote_, "\n  wrote ").c_str());
    std::fflush(stdout);
  }
  return 0;
}

// Rank 0 leaves last: it may host the store the others still use.
int RankRun::leave() {
  if (Status st = store_barrier(*store_, "hzp/exit", env_.rank, env_.world_size, false, timeout_); !st.ok())
    return fatal(st);
  return 0;
}

}  // namespace

int run_rank(const TrainOptions& options, const LaunchEnv& env, const FatalHandler& on_fatal) {
  // A peer that dies closes its sockets: writing to them must be an error from Gloo or the store, not a
  // SIGPIPE that kills this rank before it can say what happened.
  std::signal(SIGPIPE, SIG_IGN);
  auto prepared = prepare_run(options, env.world_size);
  if (!prepared.ok()) {
    std::fprintf(stderr, "hzp train: rank %d: %s\n", env.rank, prepared.status().message().c_str());
    return prepared.status().code() == StatusCode::kInvalidInput ? 2 : 1;
  }
  // SIGINT / SIGTERM ask to stop after the current step (train); the second one stops at once.
  struct sigaction stop {};
  stop.sa_handler = on_stop_signal;
  stop.sa_flags = SA_RESTART;  // Gloo's and the store's system calls go on
  sigaction(SIGINT, &stop, nullptr);
  sigaction(SIGTERM, &stop, nullptr);
  RankRun run(options, env, *prepared, on_fatal);
  for (int (RankRun::*phase)() : {&RankRun::join, &RankRun::train, &RankRun::write_outputs, &RankRun::leave})
    if (int rc = (run.*phase)(); rc != 0) return rc;
  return run.interrupted() ? kExitInterrupted : 0;
}

}  // namespace hzp::runtime
