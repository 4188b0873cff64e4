// `hzp simulate`'s simulation, with the steady state counted where it applies (cli_steady.h).
#include "tools/cli_steady.h"

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "tools/child_process.h"

namespace hzp::cli {
namespace {

// The first shorter run, in the child: its point, or its error with the error's code.
std::string first_run_report(const Compiled& first, sim::SimOptions options) {
  options.progress = false;
  options.timeline_max_ranks = 1;  // GPU 0's breakdown is all it reports
  auto r = sim::simulate(first, options);
  if (!r.ok()) return error_report(r.status());
  sim::SteadyPoint point{*r, sim::step_breakdown(first.schedule, *r, 0)};
  return nlohmann::json{{"point", sim::steady_point_json(point)}}.dump();
}

Result<sim::SteadyPoint> read_first_report(const sim::SteadyStatePlan& plan, Result<std::string> text) {
  const std::string what = "the simulation of " + std::to_string(plan.first) + " micro-batches (a child process)";
  if (!text.ok()) return Status::Internal(what + " " + text.status().message() + "; --exact simulates without it");
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (std::optional<Status> failed = read_error_report(j, what + ": ")) return *failed;
  if (!j.is_object() || !j.contains("point")) return Status::Internal(what + " reported nothing readable");
  return sim::steady_point_from_json(j["point"]);
}

}  // namespace

Result<Simulation> simulate_scenario(const Compiled& compiled, const sim::SteadyStatePlan& plan,
                                     const sim::SimOptions& options) {
  Simulation out;
  if (!plan.applies()) {
    HZP_ASSIGN_OR_RETURN(out.result, sim::simulate(compiled, options));
    out.breakdown = sim::step_breakdown(compiled.schedule, out.result, 0);
    return out;
  }
  const auto t0 = std::chrono::steady_clock::now();
  HZP_ASSIGN_OR_RETURN(Compiled first, compile(sim::with_micro_batches(compiled.scenario, plan.first)));
  HZP_ASSIGN_OR_RETURN(Compiled second, compile(sim::with_micro_batches(compiled.scenario, plan.second)));
  HZP_ASSIGN_OR_RETURN(Child child, Child::start([&] { return first_run_report(first, options); }));
  HZP_ASSIGN_OR_RETURN(sim::SimResult longer, sim::simulate(second, options));
  HZP_ASSIGN_OR_RETURN(sim::SteadyPoint shorter, read_first_report(plan, child.wait()));
  sim::StepBreakdown breakdown = sim::step_breakdown(second.schedule, longer, 0);
  HZP_ASSIGN_OR_RETURN(sim::SteadyPoint whole, sim::extrapolate(plan, compiled.scenario, compiled.cost, shorter,
                                                                {std::move(longer), breakdown}));
  out.result = std::move(whole.result);
  out.result.sim_wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.breakdown = whole.breakdown;
  out.drawn = std::move(second);
  return out;
}

}  // namespace hzp::cli
