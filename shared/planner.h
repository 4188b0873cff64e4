// The planner's search space and analytic ranking: every valid (s_p, s_g, s_os) sharding (AMSP rules,
// presets.h check_sharding) x prefetch depth x overlap on/off, memory-filtered, ranked by the analytic
// estimator. Simulating the top candidates is the CLI's job (one SimGrid process each).
#pragma once

#include <functional>
#include <vector>

#include "shared/estimator.h"
#include "shared/scenario.h"
#include "shared/status.h"

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

// For "sharding": "auto": replaces the scenario's policy by the search's analytic best (groups, prefetch,
// streams; preset stays "amsp"). A no-op without auto_sharding; kInvalidInput when nothing fits.
Status resolve_auto_sharding(Scenario& scenario);

// `progress(done, total)` is called now and then (may be empty).
Result<SearchResult> search_policies(const Scenario& scenario, const SearchOptions& options,
                                     const std::function<void(long long, long long)>& progress = {});

}  // namespace hzp
