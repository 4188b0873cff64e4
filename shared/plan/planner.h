// The planner: the sharding search (compile/search.h) over every micro-batch and recomputation setting, and
// the ND (tensor x pipeline x context) search, ranked by the analytic estimator. Simulating the top
// candidates is the CLI's job (one SimGrid process each).
#pragma once

#include <functional>
#include <vector>

#include "shared/base/status.h"
#include "shared/compile/search.h"
#include "shared/estimate/estimator.h"
#include "shared/scenario/scenario.h"

namespace hzp {

// search_policies over the scenario under every micro-batch in `micro_batches` that splits its global batch
// and every recomputation setting (the scenario's own first), merged and ranked as one list: what
// `hzp plan --search` ranks, so that the ZeRO family and the ND search choose micro-batch and
// recomputation alike. The counts add up over the settings; `shardings` is per setting. `progress(done,
// total)` counts candidates: once with 0 before the first is estimated, then now and then.
Result<SearchResult> search_policies_and_training(const Scenario& scenario, const SearchOptions& options,
                                                  const std::vector<long long>& micro_batches,
                                                  const std::function<void(long long, long long)>& progress = {});

// How many candidates search_policies_and_training estimates (what its progress counts to), without
// estimating any.
long long search_candidate_count(const Scenario& scenario, const SearchOptions& options,
                                 const std::vector<long long>& micro_batches);

// The layer splits the ND search tries for pipeline x virtual_stages chunks (pipeline_split.h): the even one
// when the chunks divide the layers; otherwise the embedding and/or loss counted as layers (the first of
// both, the embedding, the loss that splits) and the middle stages rounded up to whole chunks with the rest
// in the first and last stage, those that split. Empty when none does.
std::vector<ParallelSpec> layer_splits(int layers, int pipeline, int virtual_stages);

// ND plans (Megatron-style): every (tensor, pipeline, virtual_stages, sequence_parallel, context,
// micro_batch) the model and cluster allow (the parser's rules: tensor inside a node dividing heads and widths, stages
// whole nodes or equal parts of one, the layers split over pipeline x virtual_stages chunks (layer_splits), the global
// batch into micro-batches of the data axis), each with the least recomputation that fits (none, then selective, then
// full), the data axis sharded as ZeRO-1 (Megatron's distributed optimizer), everything else as the
// scenario says. Ranked like search_policies; `candidates` counts the combinations, rejected_memory those
// that fit under no recomputation, rejected_invalid those the parser refuses.
struct NdSearchOptions {
  std::vector<long long> micro_batches = {1, 2, 4};
  int max_virtual_stages = 2;
  int max_pipeline = 64;
  // Context parallelism: powers of two up to this, while each GPU keeps at least min_context_tokens of a
  // sequence (below a few thousand tokens the key / value exchange outgrows the attention that hides it).
  int max_context = 16;
  long long min_context_tokens = 4096;
};
Result<SearchResult> search_nd(const Scenario& scenario, const NdSearchOptions& options,
                               const std::function<void(long long, long long)>& progress = {});
// "tensor 8 x pipeline 4 x context 2 (interleaved 2, sequence parallel), micro-batch 2, recompute full": what an ND
// candidate chose.
std::string describe_nd(const Scenario& scenario);

}  // namespace hzp
