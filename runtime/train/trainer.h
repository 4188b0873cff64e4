// `hzp train`: the rank process (run_rank) and its options. The launcher (launch/launcher.h) spawns ranks
// that call run_rank; torchrun / Slurm / mpirun can start them directly (store/launch_env.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/store/launch_env.h"
#include "runtime/train/data.h"
#include "shared/base/status.h"
#include "shared/compile/compile.h"
#include "shared/ir/schedule.h"
#include "shared/model/model_math.h"
#include "shared/scenario/scenario.h"

namespace hzp::runtime {

// A rank's (and the launcher's) exit status after an interrupt that it stopped on cleanly: 128 + SIGINT, as
// shells report Ctrl-C.
inline constexpr int kExitInterrupted = 130;

struct TrainOptions {
  std::string scenario_path;
  int nproc = 0;                // ranks; 0 = 1 (or the launcher environment's world size)
  int gpus_per_node = 0;        // emulated node size; 0 = nproc (one node)
  std::int64_t steps = 0;       // 0 = the scenario's run.steps
  std::int64_t stop_after = 0;  // > 0: leave after this many steps of the run (a preempted job); the learning-
                                // rate schedule still spans run.steps, so --resume continues the same curve
  std::string out_dir;          // metrics.jsonl, summary.json, memory_rank<r>.json
  std::string data_path;
  std::string trace_path;     // --trace FILE
  std::string perfetto_path;  // --perfetto FILE
  std::string checkpoint_dir;
  bool resume = false;
  bool overwrite_checkpoints = false;  // a new run may replace the checkpoints of --checkpoint-dir
  int timeout_s = 60;                  // every collective and store wait; a dead rank is detected within it
  int threads = 0;                     // OpenBLAS threads per rank; 0 = cores / local ranks
  std::string backend = "cpu";         // the device the ranks run on (runtime/device/registry.h)
  std::vector<std::string> sets;       // --set PATH=VALUE on the scenario as written (overrides.h apply_set)
};

// The scenario as the ranks run it: the file parsed with cluster.nodes x cluster.gpus_per_node replaced by
// the emulated world (nproc ranks, gpus_per_node per node; scenario_parser.h ClusterOverride).
Result<Scenario> load_train_scenario(const TrainOptions& options, int world_size);

// Everything a rank needs that can be checked before any rank starts: the scenario, its model cost, the
// validated schedule, the runtime's support for it, and the training text. The launcher calls this once
// so that a bad scenario or flag is reported once, before ranks exist; each rank calls it again.
struct PreparedRun {
  Compiled compiled;  // the scenario compiled (compile/compile.h): auto sharding resolved, schedule validated
  ByteDataset data;
};
Result<PreparedRun> prepare_run(const TrainOptions& options, int world_size);

// Output paths are writable before any work starts: --out (summary.json, metrics.jsonl and every rank's
// memory file), --trace / --perfetto, --checkpoint-dir (and its `latest` with --resume). No output is an
// input (the scenario, its Hugging Face config, --data), another output, or a checkpoint's file.
Status check_outputs(const TrainOptions& options, const Scenario& scenario, int world_size);

// Told about an error the rank cannot recover from once it depends on its peers (a collective failed, a peer
// was lost), with a one-line message naming the lost rank where it can be found; called at most once, maybe
// from a stream's thread. The caller decides: `hzp train` prints the line and ends the process at once,
// since other streams may still wait on collectives with a dead peer, with `exit_code` (2 for bad input found
// during the run, such as a symlinked checkpoint step directory; 1 otherwise). If it returns, run_rank
// returns exit_code.
using FatalHandler = std::function<void(const std::string& message, int exit_code)>;

// Runs one rank to completion. Returns the process exit code (0 ok, 1 failure, 2 bad input).
int run_rank(const TrainOptions& options, const LaunchEnv& env, const FatalHandler& on_fatal);

}  // namespace hzp::runtime
