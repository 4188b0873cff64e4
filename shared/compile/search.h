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
  long long redundant = 0;         // fit, but estimate the same as a shallower prefetch of the same policy
};

// `progress(done, total)` is called now and then (may be empty).
Result<SearchResult> search_policies(const Scenario& scenario, const SearchOptions& options,
                                     const std::function<void(long long, long long)>& progress = {});

// Fastest first; ties: fewer bytes per GPU, then the order given (stable).
void rank_candidates(std::vector<SearchCandidate>& candidates);

}  // namespace hzp
