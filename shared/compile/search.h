// The sharding search: every valid (s_p, s_g, s_os) sharding of the replica axis (AMSP's rules,
// presets.h check_sharding) x prefetch depth x separate streams, memory-filtered and ranked by the analytic
// estimator. compile() runs it for "sharding": "auto"; the planner (plan/planner.h) runs it per micro-batch
// and recomputation setting. Each candidate is compiled (compile.h) without "auto", so the recursion stops.
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
  long long redundant = 0;         // fit, but fold into an equivalent plan ranked before them (fold_equivalent)
};

// `progress(done, total)` is called now and then (may be empty).
Result<SearchResult> search_policies(const Scenario& scenario, const SearchOptions& options,
                                     const std::function<void(long long, long long)>& progress = {});

// Two estimated step times within this fraction of each other are a tie: the estimate cannot tell them apart
// (its inputs are far coarser), so the plan needing less memory ranks first.
inline constexpr double kEstimateTie = 1e-3;

// Fastest first (equal times: fewer bytes per GPU); within a run of ties, less memory per GPU first.
void rank_candidates(std::vector<SearchCandidate>& candidates);

// Folds, in a ranked list, each candidate into the same plan ranked before it (the same groups, streams,
// parallel layout and micro-batch: it differs only in prefetch depth or recomputation) when their step
// times tie; of the two, the one needing less memory stays. What remains is ranked again. Returns how many
// were folded. The top of the list is then distinct plans.
long long fold_equivalent(std::vector<SearchCandidate>& ranked);

}  // namespace hzp
