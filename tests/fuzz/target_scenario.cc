// Target "scenario": mutated scenario JSON through everything `hzp validate`, `hzp schedule` and `hzp plan`
// do in-process: parse_scenario_text, resolve and compile (compile.h: model cost, schedule, validation),
// estimate, dump_schedule, the resolved form (scenario_to_json, which must parse back) and plan_presets.
//
// Target "scenario_doc": the same documents decoded by parse_json_strict (json_io.h) and given to
// parse_scenario as a document, the path of `hzp collective --cluster FILE` and `hzp train` (which edit the
// document before parsing it); it stops after the resolved form, the rest being scenario's.
//
// Seeds: every *.json under scenarios/ and tests/data/ (good, bad and golden scenarios).
// Pass: every stage returns ok, or the first that does not returns kInvalidInput (compile: or
// kUnimplemented) with a clean message (checks.h); a schedule the validator refuses is a failure (kInternal:
// the builder made a schedule that deadlocks), and so is a resolved form that does not parse back.
#include <exception>

#include "shared/base/json_io.h"
#include "shared/compile/compile.h"
#include "shared/estimate/estimator.h"
#include "shared/plan/plan.h"
#include "shared/scenario/scenario_parser.h"
#include "tests/fuzz/checks.h"
#include "tests/fuzz/files.h"
#include "tests/fuzz/fuzz_target.h"
#include "tests/fuzz/mutate.h"
#include "tests/fuzz/sandbox.h"

namespace hzp::fuzz {
namespace {

class ScenarioTarget : public FuzzTarget {
 public:
  explicit ScenarioTarget(bool from_text) : from_text_(from_text) {}

  std::string prepare(const Context& context) override {
    for (const char* dir : {"/scenarios", "/tests/data"})
      for (const std::string& path : list_files(context.source_dir + dir, ".json"))
        if (auto text = read_file(path)) mutator_.add_seed(*text);
    if (mutator_.seed_count() == 0) return "no *.json seeds under " + context.source_dir + "/scenarios";
    return {};
  }

  std::string generate(Rng& rng) override { return mutator_.generate(rng); }

  void add_seed(const std::string& input) override { mutator_.add_seed(input); }

  const char* extension() const override { return ".json"; }

  Verdict run(const std::string& input) override {
    Result<Scenario> parsed = Status::Internal("not parsed");
    if (from_text_) {
      parsed = parse_scenario_text(input, "fuzz");
      if (auto stop = stop_on_error("parse_scenario_text", parsed.status())) return *stop;
    } else {
      const Result<nlohmann::json> doc = parse_json_strict(input, kMaxScenarioBytes);
      if (auto stop = stop_on_error("parse_json_strict", doc.status())) return *stop;
      parsed = parse_scenario(*doc, "fuzz");
      if (auto stop = stop_on_error("parse_scenario", parsed.status())) return *stop;
    }
    Result<Scenario> resolved_scenario = resolve(std::move(parsed).value());
    if (auto stop = stop_on_error("resolve", resolved_scenario.status())) return *stop;
    const Scenario& scenario = *resolved_scenario;

    // The resolved form `hzp validate` prints; it must serialise and parse back.
    std::string resolved;
    try {
      resolved = scenario_to_json(scenario).dump(2);
    } catch (const std::exception& e) {
      return Verdict::fail(std::string("scenario_to_json(...).dump() threw | ") + e.what());
    }
    auto again = parse_scenario(nlohmann::json::parse(resolved), scenario.name);
    if (!again.ok())
      return Verdict::fail("the resolved form does not parse back | " + printable(again.status().message(), 300));
    if (!from_text_) return Verdict::pass();

    auto compiled = compile(scenario);
    if (auto stop = stop_on_error("compile", compiled.status(), /*unimplemented_ok=*/true)) return *stop;
    auto analytic = estimate(compiled->scenario, compiled->cost, compiled->schedule);
    if (auto stop = stop_on_error("estimate", analytic.status())) return *stop;
    (void)dump_schedule(compiled->schedule, 0);
    auto plan = plan_presets(scenario);
    if (auto stop = stop_on_error("plan_presets", plan.status())) return *stop;
    return Verdict::pass();
  }

 private:
  bool from_text_;  // parse_scenario_text, else parse_json_strict + parse_scenario
  JsonMutator mutator_;
};

}  // namespace

std::unique_ptr<FuzzTarget> make_scenario_target() {
  return std::make_unique<ScenarioTarget>(/*from_text=*/true);
}

std::unique_ptr<FuzzTarget> make_scenario_doc_target() {
  return std::make_unique<ScenarioTarget>(/*from_text=*/false);
}

}  // namespace hzp::fuzz
