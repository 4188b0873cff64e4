// Resharding a checkpoint onto another layout (reshard.h).
#include "runtime/train/reshard.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>

#include "shared/base/text.h"
#include "shared/compile/compile.h"
#include "shared/scenario/scenario_parser.h"

namespace hzp::runtime {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// A segment by what it holds, whichever rank and layout hold it.
using SegmentKey = std::tuple<int, int, int, bool, std::int64_t>;  // unit, module, state kind, experts, first expert
SegmentKey key_of(const Segment& s) {
  return {s.unit, s.module, static_cast<int>(s.state), s.experts, s.first_expert};
}

// One segment put back together: parameters, and the optimizer's fp32 master (16-bit training), m and v,
// over the segment's n real values, with what has been filled so far.
struct Whole {
  std::int64_t n = 0;
  std::vector<float> param, master, m, v;
  std::vector<char> have_param, have_optimizer;
};

// The writer's scenario: this one on the saved cluster shape, under the saved policy.
Result<Schedule> saved_schedule(const Scenario& scenario, const CheckpointHeader& saved) {
  const json& layout = saved.layout;
  if (!layout.contains("gpus_per_node") || !layout["gpus_per_node"].is_number_integer() || !layout.contains("policy") ||
      !layout["policy"].is_object())
    return Status::InvalidInput("its layout record lacks gpus_per_node or policy");
  const int per_node = layout["gpus_per_node"].get<int>();
  if (per_node < 1 || saved.world_size % per_node != 0)
    return Status::InvalidInput("its layout's gpus_per_node " + std::to_string(per_node) +
                                " does not divide its world " + std::to_string(saved.world_size));
  json doc = scenario_to_json(scenario);
  doc["policy"] = layout["policy"];
  auto old = parse_scenario(doc, scenario.name, ClusterOverride{saved.world_size / per_node, per_node});
  if (!old.ok()) return Status::InvalidInput("its saved policy does not fit this scenario: " + old.status().message());
  if (old->mesh.expert != scenario.mesh.expert)
    return Status::InvalidInput("it was written with expert parallelism " + std::to_string(old->mesh.expert) +
                                ", this run has " + std::to_string(scenario.mesh.expert) +
                                " (which experts a rank holds cannot change)");
  HZP_ASSIGN_OR_RETURN(Compiled compiled, compile(*old));
  return std::move(compiled.schedule);
}

int ep_position(const Scenario& scenario, const Schedule& schedule, int rank) {
  if (scenario.mesh.expert <= 1) return 0;
  const ProcessGroup& g = schedule.group_of(rank, schedule.role_expert_parallel);
  return static_cast<int>(std::find(g.ranks.begin(), g.ranks.end(), rank) - g.ranks.begin());
}

// Copies `from` (values of [begin, begin + size) in the segment's padded coordinates) into `into` over the real
// values, marking them.
void place(const std::vector<float>& from, std::int64_t begin, std::vector<float>& into, std::vector<char>& have) {
  const std::int64_t n = static_cast<std::int64_t>(into.size());
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(from.size()) && begin + i < n; ++i) {
    into[begin + i] = from[i];
    have[begin + i] = 1;
  }
}

// [begin, begin + size) of `from` over the real values, zeros beyond them (the padding).
std::vector<float> take(const std::vector<float>& from, std::int64_t begin, std::int64_t size) {
  std::vector<float> out(static_cast<std::size_t>(size), 0.0f);
  for (std::int64_t i = 0; i < size && begin + i < static_cast<std::int64_t>(from.size()); ++i)
    out[i] = from[begin + i];
  return out;
}

}  // namespace

json checkpoint_layout(const Scenario& scenario) {
  const json resolved = scenario_to_json(scenario);
  json model = resolved["model"];
  model.erase("name");  // a label: the shapes are what the state depends on
  // Fields the runtime refuses but at their defaults (model_config), left out so that checkpoints written before
  // they existed keep resuming.
  if (model["mla"].is_null()) model.erase("mla");
  if (model["moe"].is_object() && model["moe"]["shared_ffn_hidden"] == 0) model["moe"].erase("shared_ffn_hidden");
  return {{"gpus_per_node", scenario.cluster.gpus_per_node}, {"policy", resolved["policy"]}, {"model", model}};
}

Result<std::vector<std::vector<float>>> reshard_state(const std::string& step_dir, const CheckpointHeader& saved,
                                                      const Scenario& scenario, const ModelConfig& cfg,
                                                      const StateLayout& mine, std::int64_t max_step) {
  const std::string shown = "--resume: " + printable(step_dir, 200);
  if (saved.layout.is_null())
    return Status::InvalidInput(shown + " was written by another layout (world " + std::to_string(saved.world_size) +
                                ", policy " + quoted(saved.policy, 40) +
                                ") before checkpoints recorded theirs: it resumes only on that layout");
  auto old = saved_schedule(scenario, saved);
  if (!old.ok()) return Status::InvalidInput(shown + " cannot be resharded: " + old.status().message());
  const bool sixteen_bit = saved.precision != "fp32";
  std::map<SegmentKey, Whole> wholes;  // only the segments this rank holds
  for (const Segment& s : mine.segments()) {
    Whole& w = wholes[key_of(s)];
    w.n = s.n;
    for (auto* v : {&w.param, &w.m, &w.v}) v->assign(static_cast<std::size_t>(s.n), 0.0f);
    if (sixteen_bit) w.master.assign(static_cast<std::size_t>(s.n), 0.0f);
    w.have_param.assign(static_cast<std::size_t>(s.n), 0);
    w.have_optimizer.assign(static_cast<std::size_t>(s.n), 0);
  }
  for (int r = 0; r < saved.world_size; ++r) {
    HZP_ASSIGN_OR_RETURN(StateLayout theirs, StateLayout::build(*old, cfg, r, ep_position(scenario, *old, r)));
    const std::string file = (fs::path(step_dir) / ("rank_" + std::to_string(r) + ".bin")).string();
    HZP_ASSIGN_OR_RETURN(CheckpointHeader header, read_checkpoint_header(file));
    // Each field named with both values: rank_0.bin itself can be the one whose header was changed.
    const std::string which = "rank_" + std::to_string(r) + ".bin";
    auto differs = [&](const char* field, const std::string& here, const std::string& expected) {
      return Status::InvalidInput(shown + ": " + which + " says " + field + " " + here + ", where " + expected +
                                  " is expected (the world's rank 0 header and the file's place)");
    };
    if (header.rank != r) return differs("rank", std::to_string(header.rank), std::to_string(r));
    if (header.world_size != saved.world_size)
      return differs("world_size", std::to_string(header.world_size), std::to_string(saved.world_size));
    if (header.precision != saved.precision) return differs("precision", header.precision, saved.precision);
    if (header.next_step != saved.next_step)
      return differs("next_step", std::to_string(header.next_step), std::to_string(saved.next_step));
    if (header.adam_steps != saved.adam_steps)
      return differs("adam_steps", std::to_string(header.adam_steps), std::to_string(saved.adam_steps));
    if (header.segments.size() != theirs.segments().size())
      return Status::InvalidInput(shown + ": rank_" + std::to_string(r) + ".bin has " +
                                  std::to_string(header.segments.size()) + " segments; its layout rebuilt has " +
                                  std::to_string(theirs.segments().size()));
    HZP_ASSIGN_OR_RETURN(auto parts, read_checkpoint_payload(file, header, max_step));
    std::size_t part = 0;
    for (int i = 0; i < static_cast<int>(theirs.segments().size()); ++i) {
      const Segment& s = theirs.segment(i);
      if (header.segments[i] != std::pair{theirs.param_floats(i), theirs.optimizer_floats(i)})
        return Status::InvalidInput(shown + ": rank_" + std::to_string(r) + ".bin segment " + std::to_string(i) +
                                    " has other sizes than its layout rebuilt (was the model changed?)");
      auto found = wholes.find(key_of(s));
      const std::size_t first = part;
      part += sixteen_bit ? 4 : 3;
      if (found == wholes.end()) continue;
      Whole& w = found->second;
      if (w.n != s.n) return Status::InvalidInput(shown + ": a segment of another size (was the model changed?)");
      place(parts[first], theirs.position(s.state).p * theirs.param_floats(i), w.param, w.have_param);
      const std::int64_t begin = theirs.optimizer_begin(i);
      std::vector<char> ignored(static_cast<std::size_t>(w.n));
      std::size_t k = first + 1;
      if (sixteen_bit) place(parts[k++], begin, w.master, ignored);
      place(parts[k++], begin, w.m, ignored);
      place(parts[k], begin, w.v, w.have_optimizer);
    }
  }
  std::vector<std::vector<float>> state;
  for (int i = 0; i < static_cast<int>(mine.segments().size()); ++i) {
    const Segment& s = mine.segment(i);
    const Whole& w = wholes.at(key_of(s));
    if (std::count(w.have_param.begin(), w.have_param.end(), 0) != 0 ||
        std::count(w.have_optimizer.begin(), w.have_optimizer.end(), 0) != 0)
      return Status::InvalidInput(shown + ": its files do not cover segment " + std::to_string(i) +
                                  " of this rank (unit " + std::to_string(s.unit) + ")");
    state.push_back(take(w.param, mine.position(s.state).p * mine.param_floats(i), mine.param_floats(i)));
    const std::int64_t begin = mine.optimizer_begin(i);
    if (sixteen_bit) state.push_back(take(w.master, begin, mine.optimizer_floats(i)));
    state.push_back(take(w.m, begin, mine.optimizer_floats(i)));
    state.push_back(take(w.v, begin, mine.optimizer_floats(i)));
  }
  return state;
}

}  // namespace hzp::runtime
