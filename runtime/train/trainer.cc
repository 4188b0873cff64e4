// One rank of `hzp train`: scenario -> schedule -> executor over Gloo, the training loop, evaluation,
// checkpoints, metrics and traces; and the checks the launcher makes once before any rank starts.
#include <utility>  // before Boost.Asio headers pulled in by the store (g++ 12 needs std::exchange first)

#include "train/trainer.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <thread>

#include "backend/gloo_comm.h"
#include "files.h"
#include "json_io.h"
#include "model_math.h"
#include "planner.h"
#include "policy_registry.h"
#include "scenario_parser.h"
#include "schedule_validator.h"
#include "sharding.h"
#include "store/store.h"
#include "text.h"
#include "train/checkpoint.h"
#include "train/executor.h"
#include "trace_format.h"
#include "train/trace.h"

namespace hzp::runtime {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

// A trace holds every op of every step: it is meant for a few steps, not a whole run.
constexpr std::int64_t kMaxTracedSteps = 100;

// A small barrier over the store (host thread): every rank sets key/r, rank 0 (or everybody) waits for all.
Status store_barrier(StoreClient& store, const std::string& key, int rank, int world, bool all_wait, milliseconds timeout) {
  HZP_RETURN_IF_ERROR(store.set(key + "/" + std::to_string(rank), "1"));
  if (!all_wait && rank != 0) return Status::Ok();
  for (int r = 0; r < world; ++r) {
    auto got = store.get(key + "/" + std::to_string(r), timeout);
    if (!got.ok()) return Status::Internal("barrier '" + key + "': rank " + std::to_string(r) + " did not arrive: " + got.status().message());
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
    return "rank " + never + " never joined (did not reach the store: not started, crashed before the rendezvous, "
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

[[noreturn]] void die(const LaunchEnv& env, const Status& st) {
  const std::string note = lost_rank_note(env);
  std::fprintf(stderr, "hzp train: rank %d: %s%s%s\n", env.rank, note.c_str(), note.empty() ? "" : ": ",
               st.message().c_str());
  std::fflush(stderr);
  std::fflush(stdout);
  std::_Exit(1);
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
                                  " where 'latest' says " + std::to_string(latest) + "; the checkpoint is inconsistent");
  }
  return mine;
}

// The backend of --backend: the CPU device (Gloo through the store). A CUDA + NCCL device would be chosen
// here; none is built yet.
Result<std::unique_ptr<Device>> make_device(const TrainOptions& options, const LaunchEnv& env, milliseconds timeout) {
  if (options.backend != "cpu")
    return Status::InvalidInput("--backend " + quoted(options.backend, 20) +
                                ": this build has the cpu backend only (the CUDA + NCCL backend is not written yet)");
  CpuDeviceOptions cpu;
  cpu.store = StoreAddress{env.store_host, env.store_port, env.token};
  cpu.global_rank = env.rank;
  if (const char* a = std::getenv("HZP_GLOO_ADDR")) cpu.gloo.interface_address = a;
  cpu.gloo.timeout = timeout;
  return make_cpu_device(cpu);
}

}  // namespace

Result<Scenario> load_train_scenario(const TrainOptions& options, int world_size) {
  auto loaded = load_json_file(options.scenario_path, kMaxScenarioBytes);
  if (!loaded.ok()) return loaded.status();
  nlohmann::json doc = std::move(loaded).value();
  if (!doc.is_object()) return Status::InvalidInput(printable(options.scenario_path, 200) + ": scenario: must be an object");
  const int g = options.gpus_per_node > 0 ? options.gpus_per_node : world_size;
  if (world_size % g != 0)
    return Status::InvalidInput("--gpus-per-node " + std::to_string(g) + " does not divide --nproc " + std::to_string(world_size));
  if (!doc.contains("cluster") || !doc["cluster"].is_object())
    return Status::InvalidInput("cluster: must be an object (hzp train replaces its nodes and gpus_per_node)");
  doc["cluster"]["nodes"] = world_size / g;
  doc["cluster"]["gpus_per_node"] = g;
  // One emulated NIC per rank unless the scenario says otherwise (a preset's 8 NICs cannot rail-map 3 ranks).
  if (!doc["cluster"].contains("nic")) doc["cluster"]["nic"] = nlohmann::json::object();
  if (doc["cluster"]["nic"].is_object() && !doc["cluster"]["nic"].contains("per_node")) doc["cluster"]["nic"]["per_node"] = g;
  auto parsed = parse_scenario(doc, fs::path(options.scenario_path).stem().string());
  if (!parsed.ok())
    return Status::InvalidInput(printable(options.scenario_path, 200) + " (with " + std::to_string(world_size / g) +
                                " nodes x " + std::to_string(g) + " ranks): " + parsed.status().message());
  Scenario s = std::move(parsed).value();
  if (s.policy.auto_sharding) HZP_RETURN_IF_ERROR(resolve_auto_sharding(s));
  if (options.steps > 0) s.run.steps = options.steps;
  return s;
}

Result<PreparedRun> prepare_run(const TrainOptions& options, int world_size) {
  PreparedRun run;
  HZP_ASSIGN_OR_RETURN(run.scenario, load_train_scenario(options, world_size));
  run.cost = model_cost(run.scenario.model, run.scenario.training);
  HZP_ASSIGN_OR_RETURN(run.schedule, build_schedule(run.scenario, run.cost));
  HZP_RETURN_IF_ERROR(validate_schedule(run.schedule));
  HZP_RETURN_IF_ERROR(runtime_supports(run.scenario));
  HZP_ASSIGN_OR_RETURN(run.data, ByteDataset::load(options.data_path, run.scenario.training.seq_len));
  const std::int64_t steps = options.stop_after > 0 ? std::min(options.stop_after, run.scenario.run.steps) : run.scenario.run.steps;
  if ((!options.trace_path.empty() || !options.perfetto_path.empty()) && steps > kMaxTracedSteps)
    return Status::InvalidInput("--trace / --perfetto record every op of every step: at most " +
                                std::to_string(kMaxTracedSteps) + " steps (this run has " + std::to_string(steps) +
                                "; use --steps or --stop-after)");
  return run;
}

Status check_outputs(const TrainOptions& options) {
  if (!options.out_dir.empty()) HZP_RETURN_IF_ERROR(ensure_writable_dir(options.out_dir, "--out"));
  for (const auto& [flag, path] : {std::pair{"--trace", options.trace_path}, std::pair{"--perfetto", options.perfetto_path}}) {
    if (path.empty()) continue;
    if (fs::is_directory(path)) return Status::InvalidInput(std::string(flag) + " " + printable(path, 200) + ": is a directory");
    const fs::path parent = fs::path(path).parent_path();
    HZP_RETURN_IF_ERROR(ensure_writable_dir(parent.empty() ? "." : parent.string(), flag));
  }
  if (!options.checkpoint_dir.empty()) HZP_RETURN_IF_ERROR(ensure_writable_dir(options.checkpoint_dir, "--checkpoint-dir"));
  if (options.resume) HZP_RETURN_IF_ERROR(read_latest(options.checkpoint_dir).status());
  return Status::Ok();
}

int run_rank(const TrainOptions& options, const LaunchEnv& launched) {
  // A peer that dies closes its sockets: writing to them must be an error from Gloo or the store, not a
  // SIGPIPE that kills this rank before it can say what happened.
  std::signal(SIGPIPE, SIG_IGN);
  LaunchEnv env = launched;
  auto fail = [&](const Status& st) {
    std::fprintf(stderr, "hzp train: rank %d: %s\n", env.rank, st.message().c_str());
    return st.code() == StatusCode::kInvalidInput ? 2 : 1;
  };
  // Under hzp's launcher every check below already passed once, before any rank started.
  auto prepared_or = prepare_run(options, env.world_size);
  if (!prepared_or.ok()) return fail(prepared_or.status());
  const PreparedRun& prepared = *prepared_or;
  const Scenario& scenario = prepared.scenario;
  const ModelCost& cost = prepared.cost;
  const Schedule& schedule = prepared.schedule;
  const bool lead = env.rank == 0;
  std::unique_ptr<CheckpointDirLock> lock;  // external launchers: rank 0 holds the checkpoint directory
  if (!env.hosted_by_launcher && lead) {
    if (Status st = check_outputs(options); !st.ok()) return fail(st);
    if (!options.checkpoint_dir.empty()) {
      auto locked = CheckpointDirLock::acquire(options.checkpoint_dir);
      if (!locked.ok()) return fail(locked.status());
      lock = std::move(locked).value();
    }
  }

  // Threads: the ranks of this host share its cores.
  const int local = env.local_world_size > 0 ? env.local_world_size : options.nproc > 0 ? options.nproc : env.world_size;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(options.threads > 0 ? options.threads : std::max(1, cores / std::max(1, local)));

  auto address = resolve_ipv4(env.store_host, "the store address (HZP_STORE_ADDR or MASTER_ADDR)");
  if (!address.ok()) return fail(address.status());
  env.store_host = *address;
  const milliseconds timeout(static_cast<long long>(options.timeout_s) * 1000);
  // The store: hzp's launcher hosts it; under torchrun / Slurm / mpirun rank 0 does.
  std::unique_ptr<StoreServer> server;
  if (!env.hosted_by_launcher && lead) {
    StoreLimits limits;
    limits.max_wait = timeout;
    auto started = StoreServer::start(env.store_host, env.store_port, env.token, limits);
    if (!started.ok()) return fail(started.status());
    server = std::move(started).value();
  }
  // Under an external launcher rank 0 may not be listening yet: retry refused connections until the timeout
  // (a refused token is final).
  auto store_or = StoreClient::connect(env.store_host, env.store_port, env.token, timeout);
  for (auto until = std::chrono::steady_clock::now() + timeout;
       !store_or.ok() && store_or.status().code() == StatusCode::kInternal && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(milliseconds(100));
    store_or = StoreClient::connect(env.store_host, env.store_port, env.token, timeout);
  }
  if (!store_or.ok()) return fail(store_or.status());
  std::unique_ptr<StoreClient> store = std::move(store_or).value();
  if (Status st = store->set("hzp/joined/" + std::to_string(env.rank), "1"); !st.ok()) return fail(st);

  auto device_or = make_device(options, env, timeout);
  if (!device_or.ok()) return fail(device_or.status());
  std::unique_ptr<Device> device = std::move(device_or).value();
  auto on_fatal = [env](const Status& st) { die(env, st); };
  auto executor_or = Executor::create(scenario, schedule, env.rank, &prepared.data, *device, on_fatal);
  if (!executor_or.ok()) {
    if (executor_or.status().code() == StatusCode::kInvalidInput) return fail(executor_or.status());
    die(env, executor_or.status());
  }
  Executor& executor = **executor_or;
  executor.set_tracing(!options.trace_path.empty() || !options.perfetto_path.empty());

  const std::string out_dir = options.out_dir;
  std::FILE* metrics = nullptr;
  if (lead && !out_dir.empty()) {
    metrics = std::fopen((fs::path(out_dir) / "metrics.jsonl").c_str(), options.resume ? "a" : "w");
    if (metrics == nullptr) return fail(Status::InvalidInput("--out: cannot write " + out_dir + "/metrics.jsonl"));
  }

  std::int64_t first_step = 0;
  const std::string ckpt = options.checkpoint_dir;
  if (options.resume) {
    auto latest = read_latest(ckpt);
    if (!latest.ok()) return fail(latest.status());
    const std::string file = checkpoint_file(ckpt, *latest, env.rank);
    auto agreed = agree_on_resume(*store, env, executor.load(file), *latest, timeout);
    if (!agreed.ok()) return fail(agreed.status());
    first_step = *agreed;
    if (lead) std::printf("resumed from %s at step %lld\n", file.c_str(), static_cast<long long>(first_step));
  }

  const RunSpec& run = scenario.run;
  const std::int64_t tokens_per_step = scenario.training.global_batch * scenario.training.seq_len;
  // MFU against the scenario's GPU type (model FLOPs per rank per step / (step time x peak)), as the
  // simulator reports it, so a CPU run and its simulated GPU cluster read on one scale.
  const double flops_per_rank_step = cost.model_flops * static_cast<double>(scenario.grad_accum_steps());
  const double peak = scenario.cluster.gpu.peak_flops;
  const std::int64_t end_step = options.stop_after > 0 ? std::min(run.steps, options.stop_after) : run.steps;
  if (lead) {
    std::printf("hzp train: %s, policy %s %s, %d ranks (%d per node), %lld params, %lld tokens/step, steps %lld..%lld "
                "of %lld; MFU against %s (%.0f TFLOP/s)\n",
                scenario.name.c_str(), schedule.policy.c_str(), sharding_notation(scenario.policy.sharding).c_str(),
                env.world_size, scenario.cluster.gpus_per_node, static_cast<long long>(cost.params),
                static_cast<long long>(tokens_per_step), static_cast<long long>(first_step + 1),
                static_cast<long long>(end_step), static_cast<long long>(run.steps), scenario.cluster.gpu.type.c_str(),
                peak / 1e12);
    std::fflush(stdout);
  }
  double train_seconds = 0;
  std::int64_t trained = 0;
  StepMetrics last;
  double last_val = -1;
  // Fault injection for tests: HZP_FAULT_KILL_RANK / _STEP pick the victim and the step, HZP_FAULT_SIGNAL
  // "STOP" freezes it instead of killing it (a hung rank); HZP_FAULT_NAN_STEP makes that step's loss NaN on
  // every rank (a diverged step).
  const char* nan_step = std::getenv("HZP_FAULT_NAN_STEP");
  const char* kill_rank = std::getenv("HZP_FAULT_KILL_RANK");
  const char* kill_step = std::getenv("HZP_FAULT_KILL_STEP");
  const char* kill_signal = std::getenv("HZP_FAULT_SIGNAL");
  const Heartbeat heartbeat(env);
  const auto started = std::chrono::steady_clock::now();
  // The starting point of the validation curve (ln 256 = 5.55 for untrained byte-level weights).
  if (run.eval_interval > 0 && first_step == 0) {
    auto val = executor.evaluate(run.eval_batches);
    if (!val.ok()) die(env, val.status());
    if (lead) {
      std::printf("before training | val_loss %.6f\n", *val);
      if (metrics) std::fprintf(metrics, "%s\n", nlohmann::json({{"step", -1}, {"val_loss", *val}}).dump().c_str());
    }
  }
  std::vector<std::string> checkpoints_written;
  for (std::int64_t step = first_step; step < end_step; ++step) {
    if (kill_rank && kill_step && std::atoi(kill_rank) == env.rank && std::atoll(kill_step) == step) {
      std::fprintf(stderr, "hzp train: rank %d: HZP_FAULT_KILL_* (signal %s) at step %lld\n", env.rank,
                   kill_signal != nullptr ? kill_signal : "KILL", static_cast<long long>(step));
      std::fflush(stderr);
      std::raise(kill_signal != nullptr && std::string(kill_signal) == "STOP" ? SIGSTOP : SIGKILL);
    }
    auto m = executor.train_step(step);
    if (!m.ok()) die(env, m.status());
    if (nan_step != nullptr && std::atoll(nan_step) == step) m->loss = std::nan("");
    // Every rank holds the same all-reduced loss: a diverged run stops everywhere, said once.
    if (!std::isfinite(m->loss) || !std::isfinite(m->grad_norm)) {
      if (lead)
        std::fprintf(stderr, "hzp train: training diverged at step %lld (loss %g, gradient norm %g): stopping before "
                     "the non-finite state is checkpointed; lower run.lr or set training.grad_clip\n",
                     static_cast<long long>(step), m->loss, m->grad_norm);
      std::fflush(stderr);
      return 1;
    }
    last = *m;
    train_seconds += m->seconds;
    ++trained;
    const bool final_step = step + 1 == end_step;
    if (lead) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      const double eta = elapsed / static_cast<double>(trained) * static_cast<double>(end_step - step - 1);
      std::printf("step %lld/%lld | loss %.6f | aux %.4f | lr %.2e | norm %.3f | %.3f s | %.0f tok/s | MFU %.3g %% | "
                  "elapsed %s | ETA %s\n",
                  static_cast<long long>(step + 1), static_cast<long long>(end_step), m->loss, m->aux_loss, m->lr,
                  m->grad_norm, m->seconds, tokens_per_step / m->seconds, 100 * flops_per_rank_step / (m->seconds * peak),
                  clock_text(elapsed).c_str(), clock_text(eta).c_str());
      if (metrics) {
        nlohmann::json line = {{"step", step},         {"loss", m->loss},       {"aux_loss", m->aux_loss},
                               {"grad_norm", m->grad_norm}, {"lr", m->lr}, {"seconds", m->seconds}};
        std::fprintf(metrics, "%s\n", line.dump().c_str());
      }
    }
    if ((run.eval_interval > 0 && (step + 1) % run.eval_interval == 0) || final_step) {
      auto val = executor.evaluate(run.eval_batches);
      if (!val.ok()) die(env, val.status());
      last_val = *val;
      if (lead) {
        std::printf("step %lld/%lld | val_loss %.6f\n", static_cast<long long>(step + 1), static_cast<long long>(end_step), *val);
        if (metrics) std::fprintf(metrics, "%s\n", nlohmann::json({{"step", step}, {"val_loss", *val}}).dump().c_str());
      }
    }
    if (lead) std::fflush(stdout);
    if (metrics) std::fflush(metrics);
    if (!ckpt.empty() && ((run.checkpoint_interval > 0 && (step + 1) % run.checkpoint_interval == 0) || final_step)) {
      const fs::path file = checkpoint_file(ckpt, step + 1, env.rank);
      std::error_code ec;
      fs::create_directories(file.parent_path(), ec);
      Status st = executor.save(file.string(), step + 1);
      if (!st.ok()) die(env, st);
      // `latest` moves only once every rank's file is in place.
      st = store_barrier(*store, "hzp/ckpt/" + std::to_string(step + 1), env.rank, env.world_size, false, timeout);
      if (!st.ok()) die(env, st);
      if (lead) {
        st = write_latest(ckpt, step + 1);
        if (!st.ok()) die(env, st);
        checkpoints_written.push_back(file.parent_path().string());
      }
    }
  }

  // Per-rank memory: measured buffers next to the core's model of them.
  std::vector<std::string> wrote;
  if (!out_dir.empty()) {
    nlohmann::json pools = nlohmann::json::object();
    for (const BufferPool& p : schedule.pools) pools[p.name] = static_cast<double>(p.slots) * static_cast<double>(p.slot_bytes);
    nlohmann::json mem = {{"rank", env.rank},
                          {"measured", executor.memory()},
                          {"model",
                           {{"params", schedule.state_bytes.params},
                            {"grads", schedule.state_bytes.grads},
                            {"optimizer", schedule.state_bytes.optimizer},
                            {"pools", pools}}}};
    Status st = write_file_atomic((fs::path(out_dir) / ("memory_rank" + std::to_string(env.rank) + ".json")).string(),
                                  mem.dump(2) + "\n");
    if (!st.ok()) return fail(st);
    if (metrics) wrote.push_back((fs::path(out_dir) / "metrics.jsonl").string());
    wrote.push_back((fs::path(out_dir) / "memory_rank<r>.json").string() + " (" + std::to_string(env.world_size) + " ranks)");
  }

  // Traces: every rank writes its events, rank 0 merges them once all are written.
  if (!options.trace_path.empty() || !options.perfetto_path.empty()) {
    const std::string base = options.trace_path.empty() ? options.perfetto_path + ".hzp-trace.json" : options.trace_path;
    const std::string part = base + ".rank" + std::to_string(env.rank);
    Status st = write_json_atomic(part, trace_to_json(rank_trace(scenario, schedule, env.rank, executor.trace())));
    if (!st.ok()) die(env, st);
    st = store_barrier(*store, "hzp/trace", env.rank, env.world_size, false, timeout);
    if (!st.ok()) die(env, st);
    if (lead) {
      std::vector<Trace> parts;
      for (int r = 0; r < env.world_size; ++r) {
        const std::string path = base + ".rank" + std::to_string(r);
        auto t = load_trace_file(path);
        if (!t.ok()) die(env, Status::Internal("trace: " + t.status().message()));
        parts.push_back(std::move(t).value());
        std::error_code ec;
        fs::remove(path, ec);
      }
      auto trace = merge_traces(std::move(parts));
      if (!trace.ok()) die(env, trace.status());
      if (!options.trace_path.empty()) {
        st = write_json_atomic(options.trace_path, trace_to_json(*trace));
        if (!st.ok()) die(env, st);
        wrote.push_back(options.trace_path + " (trace)");
      }
      if (!options.perfetto_path.empty()) {
        st = write_json_atomic(options.perfetto_path, perfetto_from_trace(*trace));
        if (!st.ok()) die(env, st);
        wrote.push_back(options.perfetto_path + " (Perfetto timeline)");
      }
    }
  }

  if (lead && !out_dir.empty()) {
    nlohmann::json summary = {{"scenario", scenario.name},
                              {"policy", schedule.policy},
                              {"sharding", sharding_notation(scenario.policy.sharding)},
                              {"world_size", env.world_size},
                              {"gpus_per_node", scenario.cluster.gpus_per_node},
                              {"params", cost.params},
                              {"steps_run", trained},
                              {"final_loss", last.loss},
                              {"final_val_loss", last_val},
                              {"train_seconds", train_seconds},
                              {"tokens_per_second", train_seconds > 0 ? trained * tokens_per_step / train_seconds : 0.0},
                              {"mfu", train_seconds > 0 ? flops_per_rank_step * trained / (train_seconds * peak) : 0.0},
                              {"mfu_peak_of", scenario.cluster.gpu.type}};
    Status st = write_file_atomic((fs::path(out_dir) / "summary.json").string(), summary.dump(2) + "\n");
    if (!st.ok()) return fail(st);
    wrote.push_back((fs::path(out_dir) / "summary.json").string());
  }
  if (lead) {
    for (const std::string& dir : checkpoints_written) wrote.push_back(dir + " (checkpoint)");
    std::printf("hzp train: done: %lld steps in %.1f s (%.0f tokens/s, MFU %.3g %% of %s), final loss %.4f, "
                "validation loss %.4f\n",
                static_cast<long long>(trained), train_seconds,
                train_seconds > 0 ? trained * tokens_per_step / train_seconds : 0.0,
                train_seconds > 0 ? 100 * flops_per_rank_step * trained / (train_seconds * peak) : 0.0,
                scenario.cluster.gpu.type.c_str(), last.loss, last_val);
    if (!wrote.empty()) std::printf("  wrote %s\n", join(wrote, "\n  wrote ").c_str());
    std::fflush(stdout);
  }
  // Rank 0 leaves last: it may host the store the others still use.
  Status st = store_barrier(*store, "hzp/exit", env.rank, env.world_size, false, timeout);
  if (!st.ok()) die(env, st);
  return 0;
}

}  // namespace hzp::runtime
