// The sharding search (search.h).
#include "shared/compile/search.h"

#include <algorithm>
#include <cmath>

#include "shared/compile/compile.h"
#include "shared/model/model_math.h"
#include "shared/scenario/presets.h"
#include "shared/schedule/sharding.h"

namespace hzp {

std::vector<ShardGroup> candidate_groups(int gpus_per_node, int nodes) {
  std::vector<ShardGroup> groups;
  for (int s0 = 1; s0 <= gpus_per_node; ++s0)
    if (gpus_per_node % s0 == 0) groups.push_back({s0, 1});
  for (int s1 = 2; s1 <= nodes; ++s1)
    if (nodes % s1 == 0) groups.push_back({gpus_per_node, s1});  // fill the node first
  return groups;
}

std::vector<ShardingSpec> valid_shardings(int gpus_per_node, int nodes) {
  const std::vector<ShardGroup> groups = candidate_groups(gpus_per_node, nodes);
  std::vector<ShardingSpec> out;
  for (const ShardGroup& p : groups)
    for (const ShardGroup& os : groups)
      for (int which = 0; which < (p == os ? 1 : 2); ++which) {  // grads sharded like params, or like OS
        const ShardingSpec s{p, which == 0 ? p : os, os};
        if (check_sharding(s, gpus_per_node, nodes, "").ok()) out.push_back(s);
      }
  return out;
}

Result<SearchResult> search_policies(const Scenario& scenario, const SearchOptions& options,
                                     const std::function<void(long long, long long)>& progress) {
  const ClusterSpec& c = scenario.cluster;
  const ReplicaAxis& axis = scenario.mesh.replica;
  const std::vector<ShardingSpec> shardings = valid_shardings(axis.ranks_per_node, axis.nodes);
  const ModelCost cost = scenario_cost(scenario);
  const StateBytes bytes = state_bytes_per_param(scenario.training.precision, scenario.policy.comm.grad_reduce_in_fp32);
  const long long total =
      static_cast<long long>(shardings.size() * options.prefetch_depths.size() * options.separate_streams.size());
  SearchResult result;
  result.candidates = total;
  result.shardings = shardings.size();
  long long done = 0;
  for (const ShardingSpec& sharding : shardings) {
    // Model states plus activations must fit before anything else is worth building (buffers come later,
    // from the schedule). Without expert parallelism this is exact; with it, the expert part shards
    // further, so the dense formula only over-estimates and the check stays a safe filter when EP = 1.
    const double psi = static_cast<double>(cost.params);
    const double states = bytes.param * psi / sharding.params.size() + bytes.grad * psi / sharding.grads.size() +
                          bytes.optimizer * psi / sharding.optimizer.size();
    // Pipeline stages hold different layers and micro-batches in flight: the schedule decides (below).
    if (scenario.mesh.expert == 1 && scenario.mesh.pipeline == 1 &&
        states + cost.activation_bytes + cost.transient_bytes > c.gpu.memory_bytes) {
      result.rejected_memory +=
          static_cast<long long>(options.prefetch_depths.size() * options.separate_streams.size());
      done += static_cast<long long>(options.prefetch_depths.size() * options.separate_streams.size());
      continue;
    }
    for (int depth : options.prefetch_depths)
      for (bool streams : options.separate_streams) {
        Scenario candidate = scenario;
        candidate.policy.preset = Policy::kAmsp;
        candidate.policy.sharding = sharding;
        candidate.policy.overlap.prefetch_depth = depth;
        candidate.policy.overlap.separate_streams = streams;
        ++done;
        if (progress && done % 64 == 0) progress(done, total);
        if (!streams && candidate.policy.parallel.tensor_comm_overlap) {  // the parser's rule: it needs its stream
          ++result.rejected_invalid;
          continue;
        }
        auto est = evaluate(candidate);
        if (!est.ok()) {
          if (est.status().code() == StatusCode::kInternal) return est.status();
          ++result.rejected_invalid;
          continue;
        }
        ++result.estimated;
        if (!est->fits_memory) {
          ++result.rejected_memory;
          continue;
        }
        est->timings.clear();
        result.ranked.push_back({std::move(candidate), std::move(est).value()});
      }
  }
  if (progress) progress(total, total);
  rank_candidates(result.ranked);
  // A deeper prefetch that buys nothing estimates (about) the same time with more memory: fold it into the
  // shallower one, so the top K the CLI simulates are distinct plans.
  result.redundant = fold_equivalent(result.ranked);
  return result;
}

namespace {

bool ties(double a, double b) {
  return std::abs(a - b) <= kEstimateTie * std::min(a, b);
}

// The same plan up to a setting that only moves time: prefetch depth, recomputation.
bool same_plan(const Scenario& a, const Scenario& b) {
  return a.policy.sharding == b.policy.sharding &&
         a.policy.overlap.separate_streams == b.policy.overlap.separate_streams &&
         a.policy.parallel == b.policy.parallel && a.training.micro_batch == b.training.micro_batch;
}

}  // namespace

void rank_candidates(std::vector<SearchCandidate>& candidates) {
  std::stable_sort(candidates.begin(), candidates.end(), [](const SearchCandidate& a, const SearchCandidate& b) {
    if (a.estimate.step_time_s != b.estimate.step_time_s) return a.estimate.step_time_s < b.estimate.step_time_s;
    return a.estimate.comm_bytes_per_gpu < b.estimate.comm_bytes_per_gpu;
  });
  // Runs of ties (each within kEstimateTie of the run's fastest): less memory first.
  for (std::size_t begin = 0; begin < candidates.size();) {
    std::size_t end = begin + 1;
    while (end < candidates.size() &&
           ties(candidates[begin].estimate.step_time_s, candidates[end].estimate.step_time_s))
      ++end;
    std::stable_sort(candidates.begin() + static_cast<std::ptrdiff_t>(begin),
                     candidates.begin() + static_cast<std::ptrdiff_t>(end),
                     [](const SearchCandidate& a, const SearchCandidate& b) {
                       return a.estimate.memory.total() < b.estimate.memory.total();
                     });
    begin = end;
  }
}

long long fold_equivalent(std::vector<SearchCandidate>& ranked) {
  std::vector<SearchCandidate> distinct;
  for (SearchCandidate& c : ranked) {
    auto same = std::find_if(distinct.begin(), distinct.end(), [&](const SearchCandidate& kept) {
      return same_plan(kept.scenario, c.scenario) && ties(kept.estimate.step_time_s, c.estimate.step_time_s);
    });
    if (same == distinct.end())
      distinct.push_back(std::move(c));
    else if (c.estimate.memory.total() < same->estimate.memory.total())
      *same = std::move(c);  // the variant needing less memory stands for the plan, in its place
  }
  const auto folded = static_cast<long long>(ranked.size() - distinct.size());
  ranked = std::move(distinct);
  rank_candidates(ranked);  // a replacement may be slower by a tie than the place it took
  return folded;
}

}  // namespace hzp
