// Exhaustive sharding search ranked by the analytic estimator (see planner.h).
#include "shared/plan/planner.h"

#include <algorithm>

#include "shared/compile/compile.h"
#include "shared/model/model_math.h"
#include "shared/scenario/mesh.h"
#include "shared/scenario/pipeline_split.h"
#include "shared/scenario/presets.h"
#include "shared/scenario/scenario_parser.h"
#include "shared/schedule/sharding.h"

namespace hzp {

namespace {

// The scenario under every micro-batch and recomputation setting the search tries (its own first); those
// that do not parse (a micro-batch that does not split the batch) are left out.
std::vector<Scenario> training_variants(const Scenario& scenario, const std::vector<long long>& micro_batches) {
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
  return variants;
}

long long candidates_per_setting(const Scenario& scenario, const SearchOptions& options) {
  return static_cast<long long>(
      valid_shardings(scenario.mesh.replica.ranks_per_node, scenario.mesh.replica.nodes).size() *
      options.prefetch_depths.size() * options.separate_streams.size());
}

}  // namespace

long long search_candidate_count(const Scenario& scenario, const SearchOptions& options,
                                 const std::vector<long long>& micro_batches) {
  return candidates_per_setting(scenario, options) *
         static_cast<long long>(training_variants(scenario, micro_batches).size());
}

Result<SearchResult> search_policies_and_training(const Scenario& scenario, const SearchOptions& options,
                                                  const std::vector<long long>& micro_batches,
                                                  const std::function<void(long long, long long)>& progress) {
  const std::vector<Scenario> variants = training_variants(scenario, micro_batches);
  // Progress by candidate, from the first (every setting has as many): at 131,072 GPUs a setting takes
  // minutes, and reporting by setting left the command silent that long.
  const long long per_setting = candidates_per_setting(scenario, options);
  const long long total = per_setting * static_cast<long long>(variants.size());
  if (progress) progress(0, total);
  SearchResult all;
  for (std::size_t i = 0; i < variants.size(); ++i) {
    const long long before = per_setting * static_cast<long long>(i);
    HZP_ASSIGN_OR_RETURN(SearchResult r, search_policies(variants[i], options, [&](long long done, long long) {
                           if (progress) progress(before + std::min(done, per_setting), total);
                         }));
    all.candidates += r.candidates;
    all.shardings = r.shardings;
    all.estimated += r.estimated;
    all.rejected_memory += r.rejected_memory;
    all.rejected_invalid += r.rejected_invalid;
    all.redundant += r.redundant;
    for (SearchCandidate& c : r.ranked) all.ranked.push_back(std::move(c));
  }
  rank_candidates(all.ranked);
  all.redundant += fold_equivalent(all.ranked);  // e.g. selective recomputation that changes nothing (flash)
  return all;
}

std::vector<ParallelSpec> layer_splits(int layers, int pipeline, int virtual_stages) {
  ParallelSpec even;
  even.pipeline = pipeline;
  even.virtual_stages = virtual_stages;
  if (chunk_layers(layers, even).ok()) return {even};
  std::vector<ParallelSpec> out;
  // The embedding and/or the loss counted as layers (the first that splits), as LLaMA-3's 126 over 16 stages.
  for (auto [embedding, loss] : {std::pair{true, true}, {true, false}, {false, true}}) {
    ParallelSpec counted = even;
    counted.account_for_embedding_in_split = embedding;
    counted.account_for_loss_in_split = loss;
    if (chunk_layers(layers, counted).ok()) {
      out.push_back(counted);
      break;
    }
  }
  // Or the middle stages rounded up to whole chunks, the rest split between the first and the last stage.
  if (pipeline >= 3) {
    const int v = virtual_stages;
    const int middle = ((layers + pipeline - 1) / pipeline + v - 1) / v * v;
    const int rest = layers - middle * (pipeline - 2);
    ParallelSpec ends = even;
    ends.layers_in_first_stage = rest / 2 / v * v;
    ends.layers_in_last_stage = rest - ends.layers_in_first_stage;
    if (ends.layers_in_first_stage > 0 && chunk_layers(layers, ends).ok()) out.push_back(ends);
  }
  return out;
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
  if (p.layers_in_first_stage > 0 || p.layers_in_last_stage > 0)
    out += " with " + std::to_string(p.layers_in_first_stage) + " + " + std::to_string(p.layers_in_last_stage) +
           " layers in the first + last stage";
  if (p.account_for_embedding_in_split || p.account_for_loss_in_split)
    out += std::string(" with the ") +
           (p.account_for_embedding_in_split && p.account_for_loss_in_split ? "embedding and loss"
            : p.account_for_embedding_in_split                              ? "embedding"
                                                                            : "loss") +
           " counted as layers";
  return out + ", micro-batch " + std::to_string(s.training.micro_batch) + ", recompute " +
         to_string(s.training.recompute);
}

Result<SearchResult> search_nd(const Scenario& scenario, const NdSearchOptions& options,
                               const std::function<void(long long, long long)>& progress) {
  const ClusterSpec& c = scenario.cluster;
  const ModelSpec& m = scenario.model;
  std::vector<ParallelSpec> meshes;
  for (int t = 1; t <= c.gpus_per_node; ++t) {
    if (c.gpus_per_node % t != 0 || tensor_unsplit_field(m, t) != nullptr) continue;
    for (int p = 1; p <= std::min(options.max_pipeline, m.layers); ++p) {
      if (!make_mesh(c, ParallelSpec{t, p, 1, false}).ok()) continue;
      for (int v = 1; v <= (p > 1 ? options.max_virtual_stages : 1); ++v)
        for (const ParallelSpec& split : layer_splits(m.layers, p, v))
          for (int cp = 1; cp <= options.max_context; cp *= 2) {
            const std::int64_t seq = scenario.training.seq_len;
            if (cp > 1 && (seq % (2 * cp) != 0 || seq / cp < options.min_context_tokens)) break;
            for (ContextComm comm : {ContextComm::kRing, ContextComm::kAllToAll}) {
              if (comm == ContextComm::kAllToAll && (cp == 1 || ulysses_unsplit_heads(m, t, cp) != nullptr)) continue;
              for (bool sp : {false, true})
                if (!sp || t > 1) {
                  ParallelSpec mesh = split;
                  mesh.tensor = t;
                  mesh.sequence_parallel = sp;
                  mesh.context = cp;
                  mesh.context_comm = comm;
                  meshes.push_back(mesh);
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
        doc["policy"]["preset"] = to_string(Policy::kZero1);
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
  rank_candidates(result.ranked);
  return result;
}

}  // namespace hzp
