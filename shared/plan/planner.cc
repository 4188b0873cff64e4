// Exhaustive sharding search ranked by the analytic estimator (see planner.h).
#include "shared/plan/planner.h"

#include <algorithm>

#include "shared/model/model_math.h"
#include "shared/plan/plan.h"
#include "shared/scenario/presets.h"
#include "shared/scenario/scenario_parser.h"
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
  HZP_ASSIGN_OR_RETURN(const DataAxis axis, data_axis(c, scenario.policy.parallel));
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
    if (scenario.policy.expert_parallel == 1 && scenario.policy.parallel.pipeline == 1 &&
        states + cost.activation_bytes + cost.transient_bytes > c.gpu.memory_bytes) {
      result.rejected_memory +=
          static_cast<long long>(options.prefetch_depths.size() * options.separate_streams.size());
      done += static_cast<long long>(options.prefetch_depths.size() * options.separate_streams.size());
      continue;
    }
    for (int depth : options.prefetch_depths)
      for (bool streams : options.separate_streams) {
        Scenario candidate = scenario;
        candidate.policy.preset = "amsp";
        candidate.policy.sharding = sharding;
        candidate.policy.overlap.prefetch_depth = depth;
        candidate.policy.overlap.separate_streams = streams;
        ++done;
        if (progress && done % 64 == 0) progress(done, total);
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
  std::stable_sort(result.ranked.begin(), result.ranked.end(), [](const SearchCandidate& a, const SearchCandidate& b) {
    if (a.estimate.step_time_s != b.estimate.step_time_s) return a.estimate.step_time_s < b.estimate.step_time_s;
    return a.estimate.comm_bytes_per_gpu < b.estimate.comm_bytes_per_gpu;
  });
  // A deeper prefetch that buys nothing estimates the same time with more memory: keep the shallowest, so
  // the top K the CLI simulates are distinct policies.
  std::vector<SearchCandidate> distinct;
  for (SearchCandidate& c : result.ranked) {
    const bool redundant = std::any_of(distinct.begin(), distinct.end(), [&](const SearchCandidate& d) {
      return d.scenario.policy.sharding == c.scenario.policy.sharding &&
             d.scenario.policy.overlap.separate_streams == c.scenario.policy.overlap.separate_streams &&
             d.estimate.step_time_s == c.estimate.step_time_s;
    });
    if (!redundant) distinct.push_back(std::move(c));
  }
  result.redundant = static_cast<long long>(result.ranked.size() - distinct.size());
  result.ranked = std::move(distinct);
  return result;
}

Result<SearchResult> search_policies_and_training(const Scenario& scenario, const SearchOptions& options,
                                                  const std::vector<long long>& micro_batches,
                                                  const std::function<void(long long, long long)>& progress) {
  std::vector<Scenario> variants = {scenario};
  const nlohmann::json base = scenario_to_json(scenario);
  for (long long mb : micro_batches)
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      if (mb == scenario.training.micro_batch && r == scenario.training.recompute) continue;
      nlohmann::json doc = base;
      doc["training"]["micro_batch"] = mb;
      doc["training"]["recompute"] = to_string(r);
      if (Result<Scenario> v = parse_scenario(doc, scenario.name); v.ok()) variants.push_back(std::move(v).value());
    }
  SearchResult all;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    HZP_ASSIGN_OR_RETURN(SearchResult r, search_policies(variants[i], options));
    if (progress) progress(static_cast<long long>(i + 1), static_cast<long long>(variants.size()));
    all.candidates += r.candidates;
    all.shardings = r.shardings;
    all.estimated += r.estimated;
    all.rejected_memory += r.rejected_memory;
    all.rejected_invalid += r.rejected_invalid;
    all.redundant += r.redundant;
    for (SearchCandidate& c : r.ranked) all.ranked.push_back(std::move(c));
  }
  std::stable_sort(all.ranked.begin(), all.ranked.end(), [](const SearchCandidate& a, const SearchCandidate& b) {
    if (a.estimate.step_time_s != b.estimate.step_time_s) return a.estimate.step_time_s < b.estimate.step_time_s;
    return a.estimate.comm_bytes_per_gpu < b.estimate.comm_bytes_per_gpu;
  });
  return all;
}

std::string describe_nd(const Scenario& s) {
  const ParallelSpec& p = s.policy.parallel;
  std::string out = "tensor " + std::to_string(p.tensor) + " x pipeline " + std::to_string(p.pipeline);
  if (p.context > 1)
    out +=
        " x context " + std::to_string(p.context) + (p.context_comm == ContextComm::kAllToAll ? " (all-to-all)" : "");
  if (p.virtual_stages > 1 || p.sequence_parallel) {
    out += " (";
    if (p.virtual_stages > 1) out += "interleaved " + std::to_string(p.virtual_stages);
    if (p.virtual_stages > 1 && p.sequence_parallel) out += ", ";
    if (p.sequence_parallel) out += "sequence parallel";
    out += ")";
  }
  return out + ", micro-batch " + std::to_string(s.training.micro_batch) + ", recompute " +
         to_string(s.training.recompute);
}

Result<SearchResult> search_nd(const Scenario& scenario, const NdSearchOptions& options,
                               const std::function<void(long long, long long)>& progress) {
  const ClusterSpec& c = scenario.cluster;
  const ModelSpec& m = scenario.model;
  std::vector<ParallelSpec> meshes;
  for (int t = 1; t <= c.gpus_per_node; ++t) {
    if (c.gpus_per_node % t != 0 || m.heads % t != 0 || m.kv_heads % t != 0 || m.ffn_hidden % t != 0 ||
        m.moe.expert_ffn_hidden % t != 0)
      continue;
    for (int p = 1; p <= std::min(options.max_pipeline, m.layers); ++p) {
      if (!data_axis(c, ParallelSpec{t, p, 1, false}).ok()) continue;
      for (int v = 1; v <= (p > 1 ? options.max_virtual_stages : 1); ++v) {
        if (m.layers % (p * v) != 0) continue;
        for (int cp = 1; cp <= options.max_context; cp *= 2) {
          const std::int64_t seq = scenario.training.seq_len;
          if (cp > 1 && (seq % (2 * cp) != 0 || seq / cp < options.min_context_tokens)) break;
          for (ContextComm comm : {ContextComm::kRing, ContextComm::kAllToAll}) {
            if (comm == ContextComm::kAllToAll && (cp == 1 || ulysses_unsplit_heads(m, t, cp) != nullptr)) continue;
            for (bool sp : {false, true})
              if (!sp || t > 1) meshes.push_back({t, p, v, sp, cp, comm});
          }
        }
      }
    }
  }
  const Recompute recomputes[] = {Recompute::kNone, Recompute::kSelective, Recompute::kFull};
  SearchResult result;
  result.candidates = static_cast<long long>(meshes.size() * options.micro_batches.size());
  long long done = 0;
  const nlohmann::json base = scenario_to_json(scenario);
  for (const ParallelSpec& par : meshes)
    for (long long mb : options.micro_batches) {
      if (progress && ++done % 16 == 0) progress(done, result.candidates);
      bool fitted = false, parsed = false;
      for (Recompute r : recomputes) {
        nlohmann::json doc = base;
        doc["training"]["micro_batch"] = mb;
        doc["training"]["recompute"] = to_string(r);
        doc["policy"]["preset"] = "zero1";
        doc["policy"].erase("sharding");
        doc["policy"]["parallel"] = parallel_to_json(par);
        Result<Scenario> candidate = parse_scenario(doc, scenario.name);
        if (!candidate.ok()) break;  // the batch does not split this way, or the mesh is refused
        parsed = true;
        auto est = evaluate(*candidate);
        if (!est.ok()) {
          if (est.status().code() == StatusCode::kInternal) return est.status();
          parsed = false;
          break;
        }
        ++result.estimated;
        if (!est->fits_memory) continue;
        est->timings.clear();
        result.ranked.push_back({std::move(candidate).value(), std::move(est).value()});
        fitted = true;
        break;
      }
      if (!parsed)
        ++result.rejected_invalid;
      else if (!fitted)
        ++result.rejected_memory;
    }
  if (progress) progress(result.candidates, result.candidates);
  std::stable_sort(result.ranked.begin(), result.ranked.end(), [](const SearchCandidate& a, const SearchCandidate& b) {
    if (a.estimate.step_time_s != b.estimate.step_time_s) return a.estimate.step_time_s < b.estimate.step_time_s;
    return a.estimate.comm_bytes_per_gpu < b.estimate.comm_bytes_per_gpu;
  });
  return result;
}

Status resolve_auto_sharding(Scenario& scenario) {
  if (!scenario.policy.auto_sharding) return Status::Ok();
  Scenario fixed = scenario;
  fixed.policy.auto_sharding = false;
  HZP_ASSIGN_OR_RETURN(SearchResult found, search_policies(fixed, SearchOptions{}));
  if (found.ranked.empty())
    return Status::InvalidInput("policy.sharding: \"auto\" found no sharding that fits in GPU memory");
  scenario.policy = found.ranked.front().scenario.policy;
  scenario.policy.preset = "amsp";
  scenario.policy.auto_sharding = false;
  return Status::Ok();
}

}  // namespace hzp
