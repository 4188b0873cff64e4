// `hzp train`: the rank process (run_rank) and its options. The launcher (launch/launcher.h) spawns ranks
// that call run_rank; torchrun / Slurm / mpirun can start them directly (launch/launch_env.h).
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "launch/launch_env.h"
#include "model_math.h"
#include "scenario.h"
#include "schedule.h"
#include "status.h"
#include "train/data.h"

namespace hzp::runtime {

struct TrainOptions {
  std::string scenario_path;
  int nproc = 0;                 // ranks; 0 = 1 (or the launcher environment's world size)
  int gpus_per_node = 0;         // emulated node size; 0 = nproc (one node)
  std::int64_t steps = 0;        // 0 = the scenario's run.steps
  std::int64_t stop_after = 0;   // > 0: leave after this many steps of the run (a preempted job); the learning-
                                 // rate schedule still spans run.steps, so --resume continues the same curve
  std::string out_dir;           // metrics.jsonl, summary.json, memory_rank<r>.json
  std::string data_path;
  std::string trace_path;        // --trace FILE
  std::string perfetto_path;     // --perfetto FILE
  std::string checkpoint_dir;
  bool resume = false;
  int timeout_s = 60;            // every collective and store wait; a dead rank is detected within it
  int threads = 0;               // OpenBLAS threads per rank; 0 = cores / local ranks
  std::string backend = "cpu";   // the device the ranks run on (runtime/backend/device.h)
};

// The scenario as the ranks run it: the file with cluster.nodes x cluster.gpus_per_node replaced by the
// emulated world (nproc ranks, gpus_per_node per node), auto sharding resolved.
Result<Scenario> load_train_scenario(const TrainOptions& options, int world_size);

// Everything a rank needs that can be checked before any rank starts: the scenario, its model cost, the
// validated schedule, the runtime's support for it, and the training text. The launcher calls this once
// so that a bad scenario or flag is reported once, before ranks exist; each rank calls it again.
struct PreparedRun {
  Scenario scenario;
  ModelCost cost;
  Schedule schedule;
  ByteDataset data;
};
Result<PreparedRun> prepare_run(const TrainOptions& options, int world_size);

// Output paths are writable before any work starts: --out, the folders of --trace / --perfetto,
// --checkpoint-dir (and its `latest` with --resume).
Status check_outputs(const TrainOptions& options);

// Runs one rank to completion. Returns the process exit code (0 ok, 1 failure, 2 bad input); fatal errors
// on a stream end the process at once (std::_Exit(1)) after printing which rank was lost, if known.
int run_rank(const TrainOptions& options, const LaunchEnv& env);

}  // namespace hzp::runtime
