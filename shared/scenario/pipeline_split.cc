// The pipeline's layer split (pipeline_split.h).
#include "shared/scenario/pipeline_split.h"

#include <string>

namespace hzp {
namespace {

Status bad(const std::string& field, const std::string& what) {
  return Status::InvalidInput("policy.parallel." + field + ": " + what);
}

}  // namespace

Result<std::vector<int>> chunk_layers(int layers, const ParallelSpec& par) {
  const int p = par.pipeline, v = par.virtual_stages, chunks = p * v;
  const bool first = par.layers_in_first_stage > 0, last = par.layers_in_last_stage > 0;
  const bool counted = par.account_for_embedding_in_split || par.account_for_loss_in_split;
  const std::string shape = "pipeline " + std::to_string(p) + (v > 1 ? " x virtual_stages " + std::to_string(v) : "");
  if ((first || last || counted) && p == 1)
    return bad(first  ? "layers_in_first_stage"
               : last ? "layers_in_last_stage"
                      : "account_for_embedding_in_split",
               "needs pipeline > 1");
  if ((first || last) && counted)
    return bad(first ? "layers_in_first_stage" : "layers_in_last_stage",
               "is not combined with account_for_embedding_in_split / account_for_loss_in_split (Megatron refuses "
               "both at once)");
  std::vector<int> per_stage(p, 0);
  if (first || last) {
    const int given = par.layers_in_first_stage + par.layers_in_last_stage;
    const int others = p - (first ? 1 : 0) - (last ? 1 : 0);
    const int rest = layers - given;
    const std::string field = first ? "layers_in_first_stage" : "layers_in_last_stage";
    if (rest < 0 || (others == 0 && rest != 0) || (others > 0 && (rest <= 0 || rest % others != 0)))
      return bad(field, "leaves " + std::to_string(rest) + " of the " + std::to_string(layers) +
                            " layers for the other " + std::to_string(others) +
                            " stages, which must hold them evenly (at least one each)");
    for (int s = 0; s < p; ++s) per_stage[s] = others > 0 ? rest / others : 0;
    if (first) per_stage[0] = par.layers_in_first_stage;
    if (last) per_stage[p - 1] = par.layers_in_last_stage;
    std::vector<int> out(chunks);
    for (int s = 0; s < p; ++s) {
      if (per_stage[s] % v != 0)
        return bad(s == 0 && first      ? "layers_in_first_stage"
                   : s == p - 1 && last ? "layers_in_last_stage"
                                        : field,
                   "stage " + std::to_string(s) + " holds " + std::to_string(per_stage[s]) +
                       " layers, which its virtual_stages (" + std::to_string(v) + ") must split evenly");
      for (int i = 0; i < v; ++i) out[i * p + s] = per_stage[s] / v;
    }
    return out;
  }
  const int counted_layers =
      layers + (par.account_for_embedding_in_split ? 1 : 0) + (par.account_for_loss_in_split ? 1 : 0);
  if (counted_layers % chunks != 0) {
    const std::string what = counted ? std::to_string(layers) + " layers with the embedding or loss counted (" +
                                           std::to_string(counted_layers) + ")"
                                     : std::to_string(layers) + " layers";
    return bad(v > 1 ? "virtual_stages" : "pipeline",
               shape + " (" + std::to_string(chunks) + " chunks) must divide the " + what +
                   "; uneven stages: layers_in_first_stage / layers_in_last_stage, or "
                   "account_for_embedding_in_split / account_for_loss_in_split");
  }
  std::vector<int> out(chunks, counted_layers / chunks);
  if (par.account_for_embedding_in_split) --out.front();
  if (par.account_for_loss_in_split) --out.back();
  return out;
}

int stage_layers(const std::vector<int>& chunks, int pipeline, int stage) {
  int n = 0;
  for (std::size_t k = static_cast<std::size_t>(stage); k < chunks.size(); k += static_cast<std::size_t>(pipeline))
    n += chunks[k];
  return n;
}

}  // namespace hzp
