#include "cli_train.h"

#include <charconv>
#include <cstdio>
#include <cstdlib>

#include "launch/launch_env.h"
#include "launch/launcher.h"
#include "train/trainer.h"

namespace hzp::cli {

const char* const kTrainHelp =
    "usage: hzp train SCENARIO [--nproc N] [--gpus-per-node G] [--steps S] [--stop-after S] [--out DIR]\n"
    "                 [--data FILE] [--trace FILE] [--perfetto FILE] [--checkpoint-dir DIR] [--resume]\n"
    "                 [--timeout-s T] [--threads K]\n\n"
    "Trains the scenario's model (llama family, fp32, byte-level) on CPU ranks with Gloo collectives, running\n"
    "the very schedule the core builds for its policy (hzp schedule shows it). The scenario's cluster size is\n"
    "replaced by N ranks, G per emulated node (default: N, one node), so hierarchical groups are exercised\n"
    "locally. Optimizer, steps and evaluation come from the scenario's \"run\" section (scenarios/README.md).\n\n"
    "  --nproc N           ranks to spawn on this machine (default 1); under torchrun, srun or mpirun the\n"
    "                      rank, world size and store come from their environment instead (RANK/WORLD_SIZE,\n"
    "                      SLURM_PROCID/SLURM_NTASKS, OMPI_COMM_WORLD_RANK/SIZE; MASTER_ADDR, MASTER_PORT or\n"
    "                      HZP_STORE_ADDR/PORT; HZP_STORE_TOKEN), and rank 0 hosts the store\n"
    "  --steps S           override run.steps\n"
    "  --stop-after S      leave after step S (with a checkpoint, if --checkpoint-dir); the schedule still spans\n"
    "                      run.steps, so a later --resume continues the same loss curve\n"
    "  --out DIR           metrics.jsonl (loss per step, val_loss), summary.json, memory_rank<r>.json\n"
    "  --data FILE         text to train on (default ../shared/data/tinyshakespeare.txt)\n"
    "  --trace FILE        every executed op of every rank (format: traces/README.md)\n"
    "  --perfetto FILE     the same as a Perfetto / chrome://tracing timeline\n"
    "  --checkpoint-dir D  sharded checkpoints D/step_<S>/rank_<r>.bin and D/latest (run.checkpoint_interval)\n"
    "  --resume            continue from D/latest (same ranks and policy); the loss curve continues exactly\n"
    "  --timeout-s T       bound on every collective and store wait (default 60): a dead or hung rank makes\n"
    "                      the others fail with a message naming it, within T\n"
    "  --threads K         OpenBLAS threads per rank (default: cores / ranks)\n\n"
    "Exit codes: 0 ok, 2 bad input, 1 a rank failed (the launcher names the first lost rank).\n";

namespace {

int usage(const std::string& message) {
  std::fprintf(stderr, "hzp train: %s (see hzp train --help)\n", message.c_str());
  return 2;
}

bool to_int(const std::string& s, long long min, long long& out) {
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && p == s.data() + s.size() && out >= min;
}

}  // namespace

int run_train_command(const std::vector<std::string>& args) {
  runtime::TrainOptions o;
  bool nproc_given = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--resume") {
      o.resume = true;
      continue;
    }
    if (a.rfind("--", 0) != 0) {
      if (!o.scenario_path.empty()) return usage("unexpected argument '" + a + "'");
      o.scenario_path = a;
      continue;
    }
    if (i + 1 >= args.size()) return usage("option " + a + " needs a value");
    const std::string v = args[++i];
    long long x = 0;
    if (a == "--nproc" || a == "--gpus-per-node" || a == "--steps" || a == "--stop-after" || a == "--timeout-s" || a == "--threads") {
      if (!to_int(v, 1, x)) return usage(a + " must be a positive integer, got '" + v + "'");
      if (a == "--nproc") o.nproc = static_cast<int>(x), nproc_given = true;
      if (a == "--gpus-per-node") o.gpus_per_node = static_cast<int>(x);
      if (a == "--steps") o.steps = x;
      if (a == "--stop-after") o.stop_after = x;
      if (a == "--timeout-s") o.timeout_s = static_cast<int>(x);
      if (a == "--threads") o.threads = static_cast<int>(x);
    } else if (a == "--out") {
      o.out_dir = v;
    } else if (a == "--data") {
      o.data_path = v;
    } else if (a == "--trace") {
      o.trace_path = v;
    } else if (a == "--perfetto") {
      o.perfetto_path = v;
    } else if (a == "--checkpoint-dir") {
      o.checkpoint_dir = v;
    } else {
      return usage("unknown option " + a);
    }
  }
  if (o.scenario_path.empty()) return usage("missing SCENARIO");
  if (o.resume && o.checkpoint_dir.empty()) return usage("--resume needs --checkpoint-dir");
  if (o.nproc > 4096) return usage("--nproc " + std::to_string(o.nproc) + " is more local ranks than supported (4096)");

  auto env = runtime::detect_launch_env([](const char* name) { return std::getenv(name); });
  if (!env.ok()) {
    std::fprintf(stderr, "hzp train: %s\n", env.status().message().c_str());
    return 2;
  }
  if (!env->has_value()) return runtime::launch_local(o, args);
  const runtime::LaunchEnv& e = **env;
  if (nproc_given && !e.hosted_by_launcher && o.nproc != e.world_size)
    return usage("--nproc " + std::to_string(o.nproc) + " disagrees with the " + e.source + " world size " +
                 std::to_string(e.world_size));
  if (!e.hosted_by_launcher) o.nproc = e.world_size;
  return runtime::run_rank(o, e);
}

}  // namespace hzp::cli
