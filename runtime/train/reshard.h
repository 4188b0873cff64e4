// Resuming a checkpoint written by another layout — another world size, node size or sharding policy — as
// PyTorch's distributed checkpoints and DeepSpeed's universal checkpoints do: every segment's parameters,
// fp32 masters and Adam moments are put back together from the writer's shards (its layout rebuilt from the
// scenario with the saved cluster shape and policy), and this rank takes its own pieces of them.
//
// What must stay: the model, the training precision and the expert-parallel size (which experts a rank
// holds); a checkpoint without the saved layout (written before it) cannot be resharded. Each rank reads
// every file of the step, so resharding reads world x world' files: meant for resuming on another machine
// size, not for every step.
#pragma once

#include <string>
#include <vector>

#include "runtime/model/model.h"
#include "runtime/train/checkpoint.h"
#include "runtime/train/state_layout.h"
#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp::runtime {

// The layout record a checkpoint carries (CheckpointHeader::layout) for `scenario`.
nlohmann::json checkpoint_layout(const Scenario& scenario);

// This rank's state in `mine`'s layout, in the checkpoint payload's order (per segment: parameter shard,
// fp32 master in 16-bit training, Adam m, v), from the files of `step_dir` that `saved` (rank 0's header)
// describes. kInvalidInput naming what disagrees when the checkpoint cannot be resharded.
Result<std::vector<std::vector<float>>> reshard_state(const std::string& step_dir, const CheckpointHeader& saved,
                                                      const Scenario& scenario, const ModelConfig& cfg,
                                                      const StateLayout& mine, std::int64_t max_step);

}  // namespace hzp::runtime
