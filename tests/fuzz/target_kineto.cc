// Target "kineto": PyTorch profiler traces (Chrome trace JSON) as `hzp import` reads them.
//
// Seeds: the shipped profiles (traces/kineto/*.json.gz), each cut to its metadata, its annotations (the
// forward / backward / optimizer ranges) and every K-th launch with the GPU work it launched (matched by
// args.correlation), about 300 events, so that a case is small and still imports. Cases are JSON mutations
// of those documents (JsonMutator: semantic and wild) and byte damage.
// Run: parse_json_strict with the import's limits, read_kineto, then for each 1-GPU scenario the profiles
// were recorded for, check_kineto_against and kineto_to_trace (as `--no-check` would); a trace it makes must
// write out and read back with trace_from_json — import never writes what replay refuses.
// Pass: ok, or kInvalidInput with a clean message (checks.h) at any stage.
#include <set>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"
#include "shared/compile/compile.h"
#include "shared/cost/duration_model.h"
#include "shared/scenario/scenario_parser.h"
#include "shared/trace/import/kineto.h"
#include "tests/fuzz/checks.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/mutate.h"

namespace hzp::fuzz {
namespace {

using nlohmann::json;

constexpr std::size_t kSeedLaunches = 120;  // launches kept per seed (each with its GPU op and flow events)

// `doc` cut to its metadata, annotations and every K-th correlated launch, K chosen to keep ~kSeedLaunches.
json cut_profile(const json& doc) {
  const json& events = doc.at("traceEvents");
  std::set<std::int64_t> correlations;
  for (const json& e : events)
    if (e.contains("args") && e["args"].is_object() && e["args"].contains("correlation") &&
        e["args"]["correlation"].is_number_integer())
      correlations.insert(e["args"]["correlation"].get<std::int64_t>());
  const std::size_t every = std::max<std::size_t>(1, correlations.size() / kSeedLaunches);
  std::set<std::int64_t> kept;
  std::size_t k = 0;
  for (std::int64_t c : correlations)
    if (k++ % every == 0) kept.insert(c);
  json out = doc;
  json cut = json::array();
  for (const json& e : events) {
    const std::string cat = e.value("cat", "");
    const bool annotation = cat == "user_annotation" || cat == "gpu_user_annotation" || cat.empty() || cat == "Trace";
    const bool launch = e.contains("args") && e["args"].is_object() && e["args"].contains("correlation") &&
                        e["args"]["correlation"].is_number_integer() &&
                        kept.count(e["args"]["correlation"].get<std::int64_t>()) > 0;
    if (annotation || launch) cut.push_back(e);
  }
  out["traceEvents"] = std::move(cut);
  return out;
}

class KinetoTarget : public FuzzTarget {
 public:
  std::string prepare(const Context& context) override {
    const std::string dir = context.source_dir + "/traces/kineto/";
    for (const char* name : {"kineto_llama134m_b16_t1024.json.gz", "kineto_moe_e8top2_b16_t1024.json.gz",
                             "kineto_ddp_gloo_2ranks_rank0.json.gz"}) {
      auto text = read_maybe_gzip_file(dir + name, kMaxKinetoBytes);
      if (!text.ok()) return "traces/kineto/" + std::string(name) + ": " + text.status().message();
      json doc = json::parse(*text, nullptr, false);
      if (doc.is_discarded() || !doc.contains("traceEvents")) return "unreadable traces/kineto/" + std::string(name);
      seeds_.push_back(cut_profile(doc).dump());
      mutator_.add_seed(seeds_.back());
    }
    for (const char* name : {"llama134m-h100.json", "moe-e8top2-h100.json"}) {
      auto scenario = load_scenario_file(context.source_dir + "/scenarios/kineto/" + name, {});
      if (!scenario.ok()) return std::string("scenarios/kineto/") + name + ": " + scenario.status().message();
      auto compiled = compile(*scenario);
      if (!compiled.ok()) return std::string("scenarios/kineto/") + name + ": " + compiled.status().message();
      runs_.push_back(std::move(*compiled));
    }
    // The cut seeds must still import (else every case stops at the reader and the target tests little):
    // each its own scenario's (the llama and MoE profiles; the DDP one is of 2 ranks, read only).
    for (std::size_t i = 0; i < runs_.size(); ++i) {
      auto doc = parse_json_strict(seeds_[i], static_cast<std::size_t>(kMaxKinetoBytes));
      auto profile = doc.ok() ? read_kineto(*doc, "seed") : Result<KinetoProfile>(doc.status());
      if (!profile.ok()) return "a cut seed does not read: " + profile.status().message();
      const RooflineDurations roofline(runs_[i].scenario.cluster);
      auto imported = kineto_to_trace({*profile}, runs_[i].scenario, runs_[i].schedule, roofline, false);
      if (!imported.ok()) return "a cut seed does not import: " + imported.status().message();
    }
    return "";
  }
  std::string generate(Rng& rng) override { return mutator_.generate(rng); }
  void add_seed(const std::string& input) override { mutator_.add_seed(input); }
  Verdict run(const std::string& input) override {
    auto doc = parse_json_strict(
        input, JsonLimits{static_cast<std::size_t>(kMaxKinetoBytes), kMaxJsonDepth, 0, 3 * kMaxKinetoEvents});
    if (auto stop = stop_on_error("parse_json_strict", doc.status())) return *stop;
    auto profile = read_kineto(*doc, "case.json");
    if (auto stop = stop_on_error("read_kineto", profile.status())) return *stop;
    for (const Compiled& run : runs_) {
      if (auto stop = stop_on_error("check_kineto_against", check_kineto_against({*profile}, run.scenario));
          stop && !stop->passed)
        return *stop;
      const RooflineDurations roofline(run.scenario.cluster);
      for (bool idle : {false, true}) {
        auto imported = kineto_to_trace({*profile}, run.scenario, run.schedule, roofline, idle);
        if (auto stop = stop_on_error("kineto_to_trace", imported.status())) {
          if (!stop->passed) return *stop;
          continue;
        }
        auto back = trace_from_json(trace_to_json(imported->trace));
        if (!back.ok())
          return Verdict::fail("import made a trace that replay refuses: " + printable(back.status().message(), 300));
        if (back->events.size() != imported->trace.events.size())
          return Verdict::fail("an imported trace loses events when read back");
      }
    }
    return Verdict::pass();
  }
  const char* extension() const override { return ".json"; }

 private:
  JsonMutator mutator_;
  std::vector<std::string> seeds_;
  std::vector<Compiled> runs_;
};

}  // namespace

std::unique_ptr<FuzzTarget> make_kineto_target() {
  return std::make_unique<KinetoTarget>();
}

}  // namespace hzp::fuzz
