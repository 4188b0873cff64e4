// How a model's transformer layers split over the pipeline's model chunks (pipeline x virtual_stages), as
// Megatron-core's get_num_layers_to_build does it:
// - evenly, when the chunks divide the layers;
// - with `layers_in_first_stage` and/or `layers_in_last_stage` (--decoder-first/last-pipeline-num-layers),
//   those stages hold that many and the other stages the rest, evenly;
// - or with the embedding and/or the loss counted as a layer (--account-for-embedding/loss-in-pipeline-split):
//   the chunks divide layers + 1 or + 2, and the first (last) chunk holds one transformer layer fewer beside
//   the embedding (the output layer and loss).
// A stage's layers split evenly over its virtual stages. Every chunk holds at least one layer, except that
// with the embedding (loss) counted the first (last) chunk may hold the embedding (the output layer and
// loss) alone: LLaMA-3's 126 layers over 16 stages x 8 virtual, "the first model chunk on the first stage
// has only the embedding" (Llama 3 paper, §3.3.2). The two ways are not combined (Megatron refuses it too).
// What the split is for: LLaMA-3.1 405B's 126 layers over 8 or 16 stages, DeepSeek-V3's 61 over 16.
#pragma once

#include <vector>

#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp {

// The transformer layers of each model chunk, in model order (chunk k runs on stage k % pipeline as its
// virtual stage k / pipeline); kInvalidInput naming the policy.parallel field that does not fit `layers`.
Result<std::vector<int>> chunk_layers(int layers, const ParallelSpec& parallel);

// The transformer layers pipeline stage `stage` holds, over its virtual stages.
int stage_layers(const std::vector<int>& chunks, int pipeline, int stage);

}  // namespace hzp
