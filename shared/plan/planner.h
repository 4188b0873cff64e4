// The planner's search space and analytic ranking: every valid (s_p, s_g, s_os) sharding (AMSP rules,
// presets.h check_sharding) x prefetch depth x overlap on/off, memory-filtered, ranked by the analytic
// estimator. Simulating the top candidates is the CLI's job (one SimGrid process each).
#pragma once

#include <functional>
#include <vector>

#include "shared/base/status.h"
#include "shared/estimate/estimator.h"
#include "shared/scenario/scenario.h"

namespace hzp {

// Every (s0, s1) group a state can use on gpus_per_node x nodes: s0 | R with s1 = 1, or s0 = R with s1 | N.
std::vector<ShardGroup> candidate_groups(int gpus_per_node, int nodes);

// Every sharding that passes check_sharding, in a deterministic order.
std::vector<ShardingSpec> valid_shardings(int gpus_per_node, int nodes);

struct SearchOptions {
  std::vector<int> prefetch_depths = {0, 1, 2};
  std::vector<bool> separate_streams = {true, false};
};

struct SearchCandidate {
  Scenario scenario;  // the input scenario with this candidate's policy (preset "amsp", explicit groups)
  Estimate estimate;
};

struct SearchResult {
  std::vector<SearchCandidate> ranked;  // fitting candidates, fastest first (ties: fewer bytes, then order);
                                        // a deeper prefetch with the same estimate as a shallower one is dropped
  // Every enumerated candidate lands in exactly one of the last four counts:
  //   candidates == rejected_memory + rejected_invalid + redundant + ranked.size()
  long long candidates = 0;        // shardings x prefetch depths x stream settings
  std::size_t shardings = 0;       // valid shardings of the data axis
  long long estimated = 0;         // built and estimated (the rest failed on model states alone)
  long long rejected_memory = 0;   // do not fit: model states alone, or the estimate's peak
  long long rejected_invalid = 0;  // refused by the scheduler (e.g. uneven expert groups)
  long long redundant = 0;         // fit, but estimate the same as a shallower prefetch of the same policy
};

// search_policies over the scenario under every micro-batch in `micro_batches` that splits its global batch
// and every recomputation setting (the scenario's own first), merged and ranked as one list: what
// `hzp plan --search` ranks, so that the ZeRO family and the ND search choose micro-batch and
// recomputation alike. The counts add up over the settings; `shardings` is per setting.
Result<SearchResult> search_policies_and_training(const Scenario& scenario, const SearchOptions& options,
                                                  const std::vector<long long>& micro_batches,
                                                  const std::function<void(long long, long long)>& progress = {});

// ND plans (Megatron-style): every (tensor, pipeline, virtual_stages, sequence_parallel, context,
// micro_batch) the model and cluster allow (the parser's rules: tensor inside a node dividing heads and widths, stages
// whole nodes or equal parts of one, layers dividing into pipeline x virtual_stages chunks, the global batch into
// micro-batches of the data axis), each with the least recomputation that fits (none, then selective, then
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

// For "sharding": "auto": replaces the scenario's policy by the search's analytic best (groups, prefetch,
// streams; preset stays "amsp"). A no-op without auto_sharding; kInvalidInput when nothing fits.
Status resolve_auto_sharding(Scenario& scenario);

// `progress(done, total)` is called now and then (may be empty).
Result<SearchResult> search_policies(const Scenario& scenario, const SearchOptions& options,
                                     const std::function<void(long long, long long)>& progress = {});

}  // namespace hzp
