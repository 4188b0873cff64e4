// _hzp: the C++ side of the hzp Python package (python/hzp/__init__.py wraps it). Every function takes and
// returns JSON text and reports errors as values — a tuple (code, text): code 0 with the result, 2 with a
// bad-input message (the package raises hzp.ScenarioError, a ValueError), 1 with an internal error
// (RuntimeError) — so no C++ exception crosses into Python. Simulations run in a forked child process (SimGrid
// allows one engine per process; a crash in one never takes the interpreter down) with the GIL released.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/files.h"
#include "shared/calibrate/compute_fit.h"
#include "shared/compile/compile.h"
#include "shared/estimate/estimator.h"
#include "shared/plan/plan.h"
#include "shared/scenario/overrides.h"
#include "shared/scenario/scenario_parser.h"
#include "sim/breakdown.h"
#include "sim/executor.h"
#include "sim/steady_state.h"
#include "tools/child_process.h"
#include "tools/cli.h"
#include "tools/cli_steady.h"

namespace py = pybind11;

namespace hzp {
namespace {

using Reply = std::tuple<int, std::string>;

Reply reply(const Status& status) {
  return {status.code() == StatusCode::kInvalidInput ? 2 : 1, status.message()};
}

// The scenario as the CLI reads it: the document, then its `--set` assignments, parsed, "auto" resolved.
Result<Scenario> load(const std::string& text, const std::vector<std::string>& sets) {
  nlohmann::json doc = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::InvalidInput("the scenario is not JSON");
  for (const std::string& set : sets) HZP_RETURN_IF_ERROR(apply_set(doc, set));
  HZP_ASSIGN_OR_RETURN(Scenario parsed, parse_scenario(doc, "scenario"));
  return resolve(std::move(parsed));
}

Reply resolved(const std::string& text, const std::vector<std::string>& sets) {
  auto s = load(text, sets);
  if (!s.ok()) return reply(s.status());
  return {0, scenario_to_json(*s).dump()};
}

// The analytic estimate (shared/estimate/estimator.h) with the fields of summary.json it has.
Reply estimated(const std::string& text) {
  auto s = load(text, {});
  if (!s.ok()) return reply(s.status());
  auto c = compile(*s);
  if (!c.ok()) return reply(c.status());
  auto e = estimate(c->scenario, c->cost, c->schedule);
  if (!e.ok()) return reply(e.status());
  return {0, estimate_to_json(c->scenario, *e).dump()};
}

// `hzp plan`'s plan.json: every preset policy estimated.
Reply planned(const std::string& text) {
  auto s = load(text, {});
  if (!s.ok()) return reply(s.status());
  auto p = plan_presets(*s);
  if (!p.ok()) return reply(p.status());
  return {0, plan_to_json(*s, *p).dump()};
}

// `hzp simulate`'s summary.json (with its breakdown), simulated in a child process.
Reply simulated(const std::string& text, int steps, bool exact, double max_sim_seconds, double max_sim_gib) {
  auto s = load(text, {});
  if (!s.ok()) return reply(s.status());
  if (steps < 1 || steps > 1000)
    return reply(Status::InvalidInput("steps: expected an integer in [1, 1000], got " + std::to_string(steps)));
  auto c = compile(*s);
  if (!c.ok()) return reply(c.status());
  sim::SimOptions options;
  options.steps = steps;
  options.exact = exact;
  options.timeline_max_ranks = 1;  // GPU 0's breakdown; no timeline is written
  // As --max-sim-seconds (0: no limit) and --max-sim-GiB; negative: the defaults (sim/cost.h).
  if (max_sim_seconds >= 0) options.budget.max_seconds = max_sim_seconds;
  if (max_sim_gib > 0) options.budget.max_bytes = max_sim_gib * 1024.0 * 1024.0 * 1024.0;
  const sim::SteadyStatePlan steady = sim::plan_steady_state(c->scenario, options);
  auto child = cli::Child::start([&] {
    auto r = cli::simulate_scenario(*c, steady, options);
    if (!r.ok()) return cli::error_report(r.status());
    nlohmann::json summary = sim::summary_json(c->scenario, r->result);
    summary["breakdown"] = sim::breakdown_json(r->breakdown);
    summary.erase("timeline_ranks");
    return nlohmann::json{{"summary", summary}}.dump();
  });
  if (!child.ok()) return reply(child.status());
  Result<std::string> out = Status::Internal("");
  {
    py::gil_scoped_release release;
    out = child->wait();
  }
  if (!out.ok()) return {1, "the simulation (a child process) " + out.status().message()};
  const nlohmann::json j = nlohmann::json::parse(*out, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("summary")) return {0, j["summary"].dump()};
  if (std::optional<Status> failed = cli::read_error_report(j)) return reply(*failed);
  return {1, "the simulation (a child process) reported nothing readable"};
}

// `hzp calibrate SCENARIO --tokens-per-gpu-s X | --step-time-s X | --mfu X`: the fitted efficiencies, the steps
// before and after, and the scenario with them (what --out writes).
Reply calibrated(const std::string& text, const std::string& kind, double value) {
  auto s = load(text, {});
  if (!s.ok()) return reply(s.status());
  OneNodeMeasurement measured;
  measured.value = value;
  if (kind == "tokens_per_gpu_s")
    measured.kind = MeasureKind::kTokensPerGpuPerS;
  else if (kind == "step_time_s")
    measured.kind = MeasureKind::kStepTimeS;
  else if (kind == "mfu")
    measured.kind = MeasureKind::kMfu;
  else
    return reply(Status::InvalidInput("measurement: expected tokens_per_gpu_s, step_time_s or mfu, got " + kind));
  // The CLI's flag ranges: a fraction for the MFU, else (0, 1e12].
  if (!(value >= 1e-9 && value <= (measured.kind == MeasureKind::kMfu ? 0.999999 : 1e12)))
    return reply(Status::InvalidInput(kind + ": out of range, got " + std::to_string(value)));
  auto fit = fit_compute_efficiency(*s, measured);
  if (!fit.ok()) return reply(fit.status());
  Scenario calibrated = *s;
  calibrated.cluster.efficiency = fit->efficiency;
  const Efficiency& e = fit->efficiency;
  const nlohmann::json out = {
      {"efficiency",
       {{"gemm", e.gemm},
        {"memory_bound", e.memory_bound},
        {"intra_node", e.intra_node},
        {"inter_node", e.inter_node}}},
      {"table_efficiency",
       {{"gemm", s->cluster.efficiency.gemm}, {"memory_bound", s->cluster.efficiency.memory_bound}}},
      {"measured_step_s", fit->measured_step_s},
      {"table_step_s", fit->table_step_s},
      {"fitted_step_s", fit->fitted_step_s},
      {"exposed_comm_s", fit->exposed_comm_s},
      {"scenario", scenario_to_json(calibrated)},
  };
  return {0, out.dump()};
}

// `hzp NAME ARGS`, a core command (tools/cli.h: every one but train), in a child process: a crash or an exit
// there never reaches the interpreter. Its stdout goes to /dev/null (what it writes into files is the
// result), its stderr is captured: {0, ""}, or {its exit code, its error line without the command's prefix}.
Reply command(const std::string& name, const std::vector<std::string>& args) {
  const cli::Command* found = cli::find_core_command(name);
  if (found == nullptr) return {2, "'" + name + "' is not an hzp command the module runs"};
  char dir_template[] = "/tmp/hzp-command-XXXXXX";
  if (::mkdtemp(dir_template) == nullptr) return {1, name + ": no temporary folder"};
  const std::filesystem::path dir = dir_template;
  const std::string err_path = (dir / "stderr.txt").string();
  auto child = cli::Child::start(
      [&] {
        if (const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC); null >= 0) ::dup2(null, STDOUT_FILENO);
        if (const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600); err >= 0)
          ::dup2(err, STDERR_FILENO);
        const int rc = found->run(args);
        std::fflush(nullptr);
        return nlohmann::json{{"rc", rc}}.dump();
      },
      /*keep_stderr=*/true);
  if (!child.ok()) return reply(child.status());
  Result<std::string> out = Status::Internal("");
  {
    py::gil_scoped_release release;
    out = child->wait();
  }
  auto text = read_text_file(err_path, 64 << 20);
  const std::string err = text.ok() ? *text : std::string();
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  if (!out.ok()) return {1, "hzp " + name + " (a child process) " + out.status().message()};
  const nlohmann::json j = nlohmann::json::parse(*out, nullptr, /*allow_exceptions=*/false);
  if (std::optional<Status> failed = cli::read_error_report(j)) return reply(*failed);  // out of memory
  const int rc = j.is_object() ? j.value("rc", 1) : 1;
  if (rc == 0) return {0, ""};
  // The error line (the first that says "error", else the last line), without the command's prefixes.
  std::string message;
  for (std::size_t at = 0; at < err.size();) {
    const std::size_t nl = std::min(err.find('\n', at), err.size());
    const std::string line = err.substr(at, nl - at);
    if (!line.empty() && (message.empty() || message.find("error") == std::string::npos)) message = line;
    at = nl + 1;
  }
  for (const std::string& prefix : {"hzp " + name + ": ", std::string("hzp: error: ")})
    if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
  return {rc == 2 ? 2 : 1, message.empty() ? "hzp " + name + " failed (exit " + std::to_string(rc) + ")" : message};
}

}  // namespace
}  // namespace hzp

PYBIND11_MODULE(_hzp, m) {
  m.doc() = "hzp's C++ core and simulator (use the hzp package, not this module)";
  m.def("resolve", &hzp::resolved, py::arg("scenario_json"), py::arg("sets"));
  m.def("estimate", &hzp::estimated, py::arg("scenario_json"));
  m.def("plan", &hzp::planned, py::arg("scenario_json"));
  m.def("simulate", &hzp::simulated, py::arg("scenario_json"), py::arg("steps"), py::arg("exact"),
        py::arg("max_sim_seconds"), py::arg("max_sim_gib"));
  m.def("calibrate", &hzp::calibrated, py::arg("scenario_json"), py::arg("kind"), py::arg("value"));
  m.def("command", &hzp::command, py::arg("name"), py::arg("args"));
}
