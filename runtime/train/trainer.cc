// One rank of `hzp train`: scenario -> schedule -> executor over Gloo, the training loop, evaluation,
// checkpoints, metrics and traces.
#include <utility>  // before Boost.Asio headers pulled in by the store (BRIEF §4)

#include "train/trainer.h"

#include <cblas.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "backend/gloo_comm.h"
#include "model_math.h"
#include "planner.h"
#include "policy_registry.h"
#include "scenario_parser.h"
#include "schedule_validator.h"
#include "store/store.h"
#include "train/data.h"
#include "train/executor.h"
#include "train/trace.h"

namespace hzp::runtime {
namespace {

namespace fs = std::filesystem;
using std::chrono::milliseconds;

std::string default_data_path() {
  for (const char* p : {"../shared/data/tinyshakespeare.txt", "data/tinyshakespeare.txt"})
    if (fs::exists(p)) return p;
  return "../shared/data/tinyshakespeare.txt";
}

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

// Names the lost rank: the launcher publishes a rank that died (hzp/lost); otherwise ranks whose heartbeat
// did not move for two seconds.
std::string lost_rank_note(const LaunchEnv& env) {
  auto client = StoreClient::connect(env.store_host, env.store_port, env.token, milliseconds(2000));
  if (!client.ok()) return "store unreachable (" + client.status().message() + "); the rank hosting it may be lost";
  auto lost = (*client)->get("hzp/lost", milliseconds(1500));
  if (lost.ok()) return "lost rank " + *lost;
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

}  // namespace

Result<Scenario> load_train_scenario(const TrainOptions& options, int world_size) {
  std::ifstream in(options.scenario_path);
  if (!in) return Status::InvalidInput(options.scenario_path + ": cannot read the scenario");
  std::stringstream text;
  text << in.rdbuf();
  // Strict parse first (duplicate keys, syntax), then again with the emulated cluster size.
  nlohmann::json doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    auto strict = parse_scenario_text(text.str(), fs::path(options.scenario_path).stem().string());
    return Status::InvalidInput(options.scenario_path + ": " +
                                (strict.ok() ? std::string("not a JSON object") : strict.status().message()));
  }
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
  auto parsed = parse_scenario_text(doc.dump(), fs::path(options.scenario_path).stem().string());
  if (!parsed.ok())
    return Status::InvalidInput(options.scenario_path + " (with " + std::to_string(world_size / g) + " nodes x " +
                                std::to_string(g) + " ranks): " + parsed.status().message());
  Scenario s = std::move(parsed).value();
  if (s.policy.auto_sharding) HZP_RETURN_IF_ERROR(resolve_auto_sharding(s));
  if (options.steps > 0) s.run.steps = options.steps;
  return s;
}

int run_rank(const TrainOptions& options, const LaunchEnv& env) {
  // A peer that dies closes its sockets: writing to them must be an error from Gloo or the store, not a
  // SIGPIPE that kills this rank before it can say what happened.
  std::signal(SIGPIPE, SIG_IGN);
  auto fail = [&](const Status& st) {
    std::fprintf(stderr, "hzp train: rank %d: %s\n", env.rank, st.message().c_str());
    return st.code() == StatusCode::kInvalidInput ? 2 : 1;
  };
  auto scenario_or = load_train_scenario(options, env.world_size);
  if (!scenario_or.ok()) return fail(scenario_or.status());
  const Scenario& scenario = *scenario_or;
  const ModelCost cost = model_cost(scenario.model, scenario.training);
  auto schedule_or = build_schedule(scenario, cost);
  if (!schedule_or.ok()) return fail(schedule_or.status());
  const Schedule& schedule = *schedule_or;
  if (Status st = validate_schedule(schedule); !st.ok()) return fail(st);

  // Threads: the ranks of this machine share its cores.
  const int local = options.nproc > 0 ? options.nproc : env.world_size;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(options.threads > 0 ? options.threads : std::max(1, cores / std::max(1, local)));

  auto data_or = ByteDataset::load(options.data_path.empty() ? default_data_path() : options.data_path,
                                   scenario.training.seq_len);
  if (!data_or.ok()) return fail(data_or.status());
  const ByteDataset data = std::move(data_or).value();

  const milliseconds timeout(static_cast<long long>(options.timeout_s) * 1000);
  // The store: hzp's launcher hosts it; under torchrun / Slurm / mpirun rank 0 does.
  std::unique_ptr<StoreServer> server;
  if (!env.hosted_by_launcher && env.rank == 0) {
    const std::string bind = env.store_host == "localhost" ? "127.0.0.1" : env.store_host;
    StoreLimits limits;
    limits.max_wait = timeout;
    auto started = StoreServer::start(bind, env.store_port, env.token, limits);
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

  GlooOptions gloo;
  if (const char* a = std::getenv("HZP_GLOO_ADDR")) gloo.interface_address = a;
  gloo.timeout = timeout;
  auto device_or = make_gloo_device(gloo);
  if (!device_or.ok()) return fail(device_or.status());
  auto device = *device_or;
  const StoreAddress address{env.store_host, env.store_port, env.token};
  CommunicatorFactory factory = [&](const std::vector<int>& ranks, const std::string& key, const std::string& name) {
    return make_gloo_communicator(address, env.rank, ranks, "hzp/comm/" + key, name, device, gloo);
  };
  auto on_fatal = [env](const Status& st) { die(env, st); };
  auto executor_or = Executor::create(scenario, schedule, env.rank, &data, factory, on_fatal);
  if (!executor_or.ok()) {
    if (executor_or.status().code() == StatusCode::kInvalidInput) return fail(executor_or.status());
    die(env, executor_or.status());
  }
  Executor& executor = **executor_or;
  executor.set_tracing(!options.trace_path.empty() || !options.perfetto_path.empty());

  const bool lead = env.rank == 0;
  const std::string out_dir = options.out_dir;
  std::FILE* metrics = nullptr;
  if (!out_dir.empty()) {
    std::error_code ec;
    fs::create_directories(out_dir, ec);
    if (lead) {
      metrics = std::fopen((fs::path(out_dir) / "metrics.jsonl").c_str(), options.resume ? "a" : "w");
      if (metrics == nullptr) return fail(Status::InvalidInput("--out: cannot write " + out_dir + "/metrics.jsonl"));
    }
  }

  std::int64_t first_step = 0;
  const std::string ckpt = options.checkpoint_dir;
  if (options.resume) {
    std::ifstream latest(fs::path(ckpt) / "latest");
    std::int64_t step = -1;
    if (!(latest >> step) || step < 0)
      return fail(Status::InvalidInput("--resume: no checkpoint in '" + ckpt + "' (missing or unreadable 'latest')"));
    const fs::path file = fs::path(ckpt) / ("step_" + std::to_string(step)) / ("rank_" + std::to_string(env.rank) + ".bin");
    auto loaded = executor.load(file.string());
    if (!loaded.ok()) return fail(loaded.status());
    first_step = *loaded;
    if (lead) std::printf("resumed from %s at step %lld\n", file.c_str(), static_cast<long long>(first_step));
  }

  const RunSpec& run = scenario.run;
  const std::int64_t tokens_per_step = scenario.training.global_batch * scenario.training.seq_len;
  if (lead) {
    std::printf("hzp train: %s, policy %s, %d ranks (%d per node), %lld params, %lld tokens/step, steps %lld\n",
                scenario.name.c_str(), schedule.policy.c_str(), env.world_size, scenario.cluster.gpus_per_node,
                static_cast<long long>(cost.params), static_cast<long long>(tokens_per_step),
                static_cast<long long>(run.steps));
    std::fflush(stdout);
  }
  double train_seconds = 0;
  std::int64_t trained = 0;
  StepMetrics last;
  double last_val = -1;
  // Fault injection for tests: HZP_FAULT_KILL_RANK / _STEP pick the victim and the step, HZP_FAULT_SIGNAL
  // "STOP" freezes it instead of killing it (a hung rank).
  const char* kill_rank = std::getenv("HZP_FAULT_KILL_RANK");
  const char* kill_step = std::getenv("HZP_FAULT_KILL_STEP");
  const char* kill_signal = std::getenv("HZP_FAULT_SIGNAL");
  const Heartbeat heartbeat(env);
  // The starting point of the validation curve (ln 256 = 5.55 for untrained byte-level weights).
  if (run.eval_interval > 0 && first_step == 0) {
    auto val = executor.evaluate(run.eval_batches);
    if (!val.ok()) die(env, val.status());
    if (lead) {
      std::printf("before training | val_loss %.6f\n", *val);
      if (metrics) std::fprintf(metrics, "%s\n", nlohmann::json({{"step", -1}, {"val_loss", *val}}).dump().c_str());
    }
  }
  const std::int64_t end_step = options.stop_after > 0 ? std::min(run.steps, options.stop_after) : run.steps;
  for (std::int64_t step = first_step; step < end_step; ++step) {
    if (kill_rank && kill_step && std::atoi(kill_rank) == env.rank && std::atoll(kill_step) == step) {
      std::fprintf(stderr, "hzp train: rank %d: HZP_FAULT_KILL_* (signal %s) at step %lld\n", env.rank,
                   kill_signal != nullptr ? kill_signal : "KILL", static_cast<long long>(step));
      std::fflush(stderr);
      std::raise(kill_signal != nullptr && std::string(kill_signal) == "STOP" ? SIGSTOP : SIGKILL);
    }
    auto m = executor.train_step(step);
    if (!m.ok()) die(env, m.status());
    last = *m;
    train_seconds += m->seconds;
    ++trained;
    const bool final_step = step + 1 == end_step;
    if (lead) {
      std::printf("step %5lld | loss %.6f | aux %.4f | lr %.2e | norm %.3f | %.3f s | %.0f tok/s\n",
                  static_cast<long long>(step), m->loss, m->aux_loss, m->lr, m->grad_norm, m->seconds,
                  tokens_per_step / m->seconds);
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
        std::printf("step %5lld | val_loss %.6f\n", static_cast<long long>(step), *val);
        if (metrics) std::fprintf(metrics, "%s\n", nlohmann::json({{"step", step}, {"val_loss", *val}}).dump().c_str());
      }
    }
    if (lead) std::fflush(stdout);
    if (metrics) std::fflush(metrics);
    if (!ckpt.empty() && ((run.checkpoint_interval > 0 && (step + 1) % run.checkpoint_interval == 0) || final_step)) {
      const fs::path dir = fs::path(ckpt) / ("step_" + std::to_string(step + 1));
      std::error_code ec;
      fs::create_directories(dir, ec);
      Status st = executor.save((dir / ("rank_" + std::to_string(env.rank) + ".bin")).string(), step + 1);
      if (!st.ok()) die(env, st);
      // `latest` moves only once every rank's file is in place.
      st = store_barrier(*store, "hzp/ckpt/" + std::to_string(step + 1), env.rank, env.world_size, false, timeout);
      if (!st.ok()) die(env, st);
      if (lead) {
        const fs::path latest = fs::path(ckpt) / "latest";
        {
          std::ofstream out(latest.string() + ".tmp", std::ios::trunc);
          out << step + 1 << "\n";
        }
        fs::rename(latest.string() + ".tmp", latest, ec);
        if (ec) die(env, Status::Internal("checkpoint: cannot update " + latest.string() + ": " + ec.message()));
      }
    }
  }

  // Per-rank memory: measured buffers next to the core's model of them.
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
    Status st = write_json_atomic((fs::path(out_dir) / ("memory_rank" + std::to_string(env.rank) + ".json")).string(), mem, 2);
    if (!st.ok()) return fail(st);
  }

  // Traces: every rank writes its events, rank 0 merges them once all are written.
  if (!options.trace_path.empty() || !options.perfetto_path.empty()) {
    const std::string base = options.trace_path.empty() ? options.perfetto_path + ".hzp-trace.json" : options.trace_path;
    const std::string part = base + ".rank" + std::to_string(env.rank);
    Status st = write_json_atomic(part, trace_events_json(schedule, env.rank, executor.trace()));
    if (!st.ok()) die(env, st);
    st = store_barrier(*store, "hzp/trace", env.rank, env.world_size, false, timeout);
    if (!st.ok()) die(env, st);
    if (lead) {
      std::vector<nlohmann::json> parts;
      for (int r = 0; r < env.world_size; ++r) {
        const std::string path = base + ".rank" + std::to_string(r);
        std::ifstream in(path);
        nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
        if (j.is_discarded()) die(env, Status::Internal("trace: cannot read " + path));
        parts.push_back(std::move(j));
        std::error_code ec;
        fs::remove(path, ec);
      }
      const nlohmann::json trace = merge_trace(scenario, schedule, parts);
      if (!options.trace_path.empty()) {
        st = write_json_atomic(options.trace_path, trace);
        if (!st.ok()) die(env, st);
      }
      if (!options.perfetto_path.empty()) {
        st = write_json_atomic(options.perfetto_path, perfetto_from_trace(trace));
        if (!st.ok()) die(env, st);
      }
    }
  }

  if (lead && !out_dir.empty()) {
    nlohmann::json summary = {{"scenario", scenario.name},
                              {"policy", schedule.policy},
                              {"world_size", env.world_size},
                              {"gpus_per_node", scenario.cluster.gpus_per_node},
                              {"params", cost.params},
                              {"steps_run", trained},
                              {"final_loss", last.loss},
                              {"final_val_loss", last_val},
                              {"train_seconds", train_seconds},
                              {"tokens_per_second", train_seconds > 0 ? trained * tokens_per_step / train_seconds : 0.0}};
    Status st = write_json_atomic((fs::path(out_dir) / "summary.json").string(), summary, 2);
    if (!st.ok()) return fail(st);
  }
  // Rank 0 leaves last: it may host the store the others still use.
  Status st = store_barrier(*store, "hzp/exit", env.rank, env.world_size, false, timeout);
  if (!st.ok()) die(env, st);
  return 0;
}

}  // namespace hzp::runtime
