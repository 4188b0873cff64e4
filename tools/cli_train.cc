#include "tools/cli_train.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "tools/cli.h"
#include "tools/cli_flags.h"

#include "runtime/launch/launcher.h"
#include "runtime/store/launch_env.h"
#include "runtime/train/trainer.h"

namespace hzp::cli {

constexpr long long kMaxLocalRanks = 4096;

const char* const kTrainHelp =
    "usage: hzp train SCENARIO [--set PATH=VALUE]... [--nproc N] [--gpus-per-node G] [--steps S] [--stop-after S] "
    "[--out DIR]\n"
    "                 [--data FILE] [--trace FILE] [--perfetto FILE] [--checkpoint-dir DIR] [--resume]\n"
    "                 [--timeout-s T] [--threads K] [--backend cpu]\n\n"
    "Trains the scenario's model (llama family, byte-level; training.precision fp32, or bf16 / fp16 with fp32\n"
    "master weights and Adam moments, fp16 with dynamic loss scaling) on CPU ranks with Gloo collectives, running\n"
    "the very schedule the core builds for its policy (hzp schedule shows it). The scenario's cluster size is\n"
    "replaced by N ranks, G per emulated node (default: N, one node), so hierarchical groups are exercised\n"
    "locally. Optimizer, steps and evaluation come from the scenario's \"run\" section (scenarios/README.md).\n\n"
    "  --nproc N           ranks to spawn on this machine, 1..4096 (default 1); under torchrun, srun or\n"
    "                      mpirun the rank, world size and store come from their environment instead\n"
    "                      (RANK/WORLD_SIZE/LOCAL_WORLD_SIZE, SLURM_PROCID/SLURM_NTASKS/SLURM_NTASKS_PER_NODE,\n"
    "                      OMPI_COMM_WORLD_RANK/SIZE/LOCAL_SIZE; MASTER_ADDR (a name or an address),\n"
    "                      MASTER_PORT or HZP_STORE_ADDR/PORT; HZP_STORE_TOKEN), and rank 0 hosts the store\n"
    "  --gpus-per-node G   ranks per emulated node, 1..4096 (default: all ranks of this machine, or the\n"
    "                      external launcher's ranks per host)\n"
    "  --steps S           override run.steps, 1..10^9\n"
    "  --stop-after S      leave after step S (with a checkpoint, if --checkpoint-dir); the schedule still spans\n"
    "                      run.steps, so a later --resume continues the same loss curve\n"
    "  --out DIR           metrics.jsonl (loss per step, val_loss), summary.json, memory_rank<r>.json\n"
    "  --data FILE         text to train on, byte-level (default: data/tinyshakespeare.txt of the repository;\n"
    "                      at most 1 GiB), or `random`: random tokens over the model's vocabulary, the same\n"
    "                      batches every step (speed benchmarks at any vocabulary; the loss falls by memorising)\n"
    "  --trace FILE        every executed op of every rank (format: traces/README.md); runs of at most 100 steps\n"
    "  --perfetto FILE     the same as a Perfetto / chrome://tracing timeline\n"
    "  --checkpoint-dir D  sharded checkpoints D/step_<S>/rank_<r>.bin and D/latest (run.checkpoint_interval);\n"
    "                      one job at a time per directory (D/.lock)\n"
    "  --overwrite-checkpoints  start over in a D that holds checkpoints (refused without it or --resume)\n"
    "  --resume            continue from D/latest: on the same ranks and policy the loss curve continues\n"
    "                      exactly; on another world size or policy the state is resharded (runtime/README.md)\n"
    "  --timeout-s T       bound on every collective and store wait, 1..86400 (default 60): a dead or hung\n"
    "                      rank makes the others fail with a message naming it, within T\n"
    "  --threads K         OpenBLAS threads per rank, 1..1024 (default: cores / ranks on this machine)\n"
    "  --backend B         the device the ranks run on (runtime/backends/registry.cc): cpu (default; host memory,\n"
    "                      the reference kernels, Gloo collectives); `hzp --version` lists the built backends\n"
    "  --set PATH=VALUE    edit the scenario before it resolves (repeatable; below); every rank applies it\n\n"
    "Output paths are checked before training starts. Each step prints k/total, loss, tokens/s, model GFLOP/s\n"
    "per rank on the host (MFU against the scenario's GPU type on a GPU backend), elapsed time and ETA; the end\n"
    "prints a summary and every file written. Ctrl-C (or SIGTERM, as Slurm and torchrun send it) stops every\n"
    "rank after the same step, with a checkpoint there when --checkpoint-dir is set, writes the outputs so far\n"
    "and exits 130 (\"interrupted\"); a second Ctrl-C stops at once.\n"
    "Exit codes: 0 ok, 2 bad input, 1 a rank failed (the launcher names the first lost rank), 130 "
    "interrupted.\n" HZP_SCENARIO_INPUT_HELP;

namespace {

int usage(const std::string& message) {
  std::fprintf(stderr, "hzp train: %s (see hzp train --help)\n", message.c_str());
  return 2;
}

// The training text: data/tinyshakespeare.txt of the working directory when there is one, else the one in
// the source tree this binary was built from.
std::string default_data_path() {
  const std::string local = "data/tinyshakespeare.txt";
  if (std::filesystem::exists(local)) return local;
  return std::string(HZP_SOURCE_DIR) + "/" + local;
}

// Standard input to TMPDIR/hzp-stdin-XXXXXX/stdin.json (so the scenario keeps the name "stdin").
// Read to one byte past a scenario's limit, as every command reads "-" (/dev/zero grew to GBs).
Result<std::filesystem::path> copy_stdin_scenario() {
  std::string text(kMaxScenarioBytes + 1, '\0');
  std::cin.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<std::size_t>(std::cin.gcount()));
  if (std::cin.bad()) return Status::InvalidInput("stdin: cannot be read");
  if (text.size() > kMaxScenarioBytes)
    return Status::InvalidInput("stdin: over " + std::to_string(kMaxScenarioBytes) + " bytes, not a scenario");
  std::string dir = (std::filesystem::temp_directory_path() / "hzp-stdin-XXXXXX").string();
  if (::mkdtemp(dir.data()) == nullptr) return Status::Internal("cannot create a folder for the stdin scenario");
  const std::filesystem::path file = std::filesystem::path(dir) / "stdin.json";
  if (Status s = write_file_atomic(file.string(), text); !s.ok()) return s;
  return file;
}

}  // namespace

int run_train_command(const std::vector<std::string>& args) {
  auto parsed = parse_flags(args,
                            {{"--nproc", true},
                             {"--gpus-per-node", true},
                             {"--steps", true},
                             {"--stop-after", true},
                             {"--out", true},
                             {"--data", true},
                             {"--trace", true},
                             {"--perfetto", true},
                             {"--checkpoint-dir", true},
                             {"--resume", false},
                             {"--overwrite-checkpoints", false},
                             {"--timeout-s", true},
                             {"--threads", true},
                             {"--backend", true},
                             {"--set", true, /*repeatable=*/true}},
                            1);
  if (!parsed.ok()) return usage(parsed.status().message());
  const ParsedArgs& a = *parsed;
  runtime::TrainOptions o;
  if (a.positional.empty()) return usage("missing SCENARIO");
  o.scenario_path = a.positional.front();
  struct IntFlag {
    const char* name;
    long long max;
    long long* out;
  };
  long long nproc = 0, gpus_per_node = 0, steps = 0, stop_after = 0, timeout_s = 60, threads = 0;
  for (const IntFlag& f :
       {IntFlag{"--nproc", kMaxLocalRanks, &nproc}, IntFlag{"--gpus-per-node", kMaxLocalRanks, &gpus_per_node},
        IntFlag{"--steps", 1'000'000'000, &steps}, IntFlag{"--stop-after", 1'000'000'000, &stop_after},
        IntFlag{"--timeout-s", 86400, &timeout_s}, IntFlag{"--threads", 1024, &threads}}) {
    if (auto v = a.get(f.name)) {
      auto n = parse_int_flag(f.name, *v, 1, f.max);
      if (!n.ok()) return usage(n.status().message());
      *f.out = *n;
    }
  }
  o.nproc = static_cast<int>(nproc);
  o.gpus_per_node = static_cast<int>(gpus_per_node);
  o.steps = steps;
  o.stop_after = stop_after;
  o.timeout_s = static_cast<int>(timeout_s);
  o.threads = static_cast<int>(threads);
  o.out_dir = a.get("--out").value_or("");
  o.data_path = a.get("--data").value_or(default_data_path());
  o.trace_path = a.get("--trace").value_or("");
  o.perfetto_path = a.get("--perfetto").value_or("");
  o.checkpoint_dir = a.get("--checkpoint-dir").value_or("");
  o.resume = a.has("--resume");
  o.overwrite_checkpoints = a.has("--overwrite-checkpoints");
  if (o.resume && o.overwrite_checkpoints) return usage("--resume and --overwrite-checkpoints exclude each other");
  o.backend = a.get("--backend").value_or("cpu");
  o.sets = a.all("--set");
  if (o.resume && o.checkpoint_dir.empty()) return usage("--resume needs --checkpoint-dir");
  if (o.overwrite_checkpoints && o.checkpoint_dir.empty())
    return usage("--overwrite-checkpoints needs --checkpoint-dir (the checkpoints it may replace)");

  auto env = runtime::detect_launch_env([](const char* name) { return std::getenv(name); });
  if (!env.ok()) {
    std::fprintf(stderr, "hzp train: %s\n", env.status().message().c_str());
    return 2;
  }
  if (!env->has_value()) {
    if (o.scenario_path != "-") return runtime::launch_local(o, args);
    // The ranks read the scenario themselves: stdin goes to a file they can open, for the job's lifetime.
    auto copied = copy_stdin_scenario();
    if (!copied.ok()) return usage(copied.status().message());
    std::vector<std::string> ranks_args = args;
    for (std::size_t i = 0; i < ranks_args.size(); ++i) {  // the positional "-", not a flag's value
      const bool flag_value = i > 0 && ranks_args[i - 1].rfind("--", 0) == 0 && ranks_args[i - 1] != "--resume";
      if (ranks_args[i] == "-" && !flag_value) ranks_args[i] = copied->string();
    }
    o.scenario_path = copied->string();
    const int rc = runtime::launch_local(o, ranks_args);
    std::error_code ignored;
    std::filesystem::remove_all(copied->parent_path(), ignored);
    return rc;
  }
  if (o.scenario_path == "-")
    return usage("a scenario from stdin needs hzp's own launcher (--nproc); under " + (*env)->source +
                 " give every rank the file");
  runtime::LaunchEnv& e = **env;
  if (a.has("--nproc") && !e.hosted_by_launcher && o.nproc != e.world_size)
    return usage("--nproc " + std::to_string(o.nproc) + " disagrees with the " + e.source + " world size " +
                 std::to_string(e.world_size));
  if (!e.hosted_by_launcher) o.nproc = e.world_size;
  // Under an external launcher a node is what the launcher put on one host, unless --gpus-per-node says.
  if (o.gpus_per_node == 0 && e.local_world_size > 0 && e.world_size % e.local_world_size == 0)
    o.gpus_per_node = e.local_world_size;
  // A fatal error after the ranks joined: other streams of this process may wait on a dead peer's collective
  // until their timeout, and destructors may block on its sockets, so leave at once.
  return runtime::run_rank(o, e, [](const std::string& message, int exit_code) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
    std::fflush(stdout);
    std::_Exit(exit_code);
  });
}

}  // namespace hzp::cli
