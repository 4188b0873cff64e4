// `hzp compare`: two runs of hzp's models side by side (cli_compare.h). Each side is read into the keys of
// `hzp simulate`'s summary.json, whatever it came from, and the table is one row per metric.
#include "tools/cli_compare.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"
#include "shared/compile/compile.h"
#include "shared/estimate/estimator.h"
#include "shared/scenario/scenario_parser.h"
#include "tools/cli.h"
#include "tools/cli_flags.h"
#include "tools/cli_search.h"
#include "tools/cli_sim_budget.h"

namespace hzp::cli {

const char* const kCompareHelp =
    "usage: hzp compare A [B] [--simulate [--out DIR] [--max-sim-seconds S] [--max-sim-GiB G] [--exact]]\n"
    "                   [--json FILE] [--set PATH=VALUE]...\n\n"
    "Puts two runs side by side: every metric of A and B, B - A and B / A. A and B are each a scenario file\n"
    "(- for stdin), a summary.json written by hzp simulate or hzp replay, or a folder holding one (hzp simulate\n"
    "--out DIR, or a candidate of hzp plan --search: DIR/candidates/NAME). Scenarios are estimated\n"
    "analytically (no contention: hzp plan's numbers), or with --simulate run in the simulator, each in its own\n"
    "process (DIR/a-NAME, DIR/b-NAME; DIR defaults to out/compare). Without B, B is A with the --set edits: hzp "
    "compare S.json --set\n"
    "policy.preset=zero1 asks what ZeRO-1 would change. With B, the edits apply to both scenarios.\n"
    "Rows: step time, tokens/s/GPU, MFU, compute, exposed communication, memory per GPU by category, traffic\n"
    "per GPU, and from simulations the step's breakdown by phase and by parallel dimension (hzp simulate).\n"
    "--json FILE writes {\"a\", \"b\": {source, kind}, \"rows\": [{metric, unit, a, b, delta, ratio}]}.\n"
    "With --simulate, each simulation is held to --max-sim-seconds and --max-sim-GiB as hzp simulate's is,\n"
    "and --exact simulates every rank (hzp simulate --exact).\n"
    "Exit 0, 2 on bad input (either side) or a simulation refused past its budget, 1 when a simulation "
    "fails.\n" HZP_SCENARIO_INPUT_HELP;

namespace {

namespace fs = std::filesystem;

int usage_error(const std::string& message) {
  std::fprintf(stderr, "hzp compare: %s (see hzp compare --help)\n", message.c_str());
  return 2;
}

int fail(const Status& status) {
  std::fprintf(stderr, "hzp compare: %s\n", status.message().c_str());
  return status.code() == StatusCode::kInvalidInput ? 2 : 1;
}

// One side: where it came from, how its numbers were made, and the numbers under summary.json's keys.
struct Side {
  std::string source;
  std::string kind;                  // "estimate", "simulation", "summary"
  std::optional<Scenario> scenario;  // a scenario still to estimate or simulate
  nlohmann::json summary;
  std::vector<NamedPath> read;  // the files it was read from: no output may replace them
};

// A summary.json of hzp simulate / replay: an object with a step time and a GPU count.
bool is_summary(const nlohmann::json& doc) {
  return doc.is_object() && doc.contains("step_time_s") && doc.contains("gpus");
}

// A side from the command line: a summary (file or folder) is read as it is; anything else is a scenario.
Result<Side> read_side(const std::string& arg, const std::vector<std::string>& sets, const std::string& label) {
  Side side{arg, "summary", std::nullopt, {}, {{label, arg}}};
  std::error_code ec;
  const fs::path folder_summary = fs::path(arg) / "summary.json";
  if (arg != "-" && fs::is_directory(arg, ec)) {
    if (!fs::exists(folder_summary, ec))
      return Status::InvalidInput(printable(arg, 200) + ": a folder without summary.json (hzp simulate --out DIR)");
    side.read = {{label, folder_summary.string()}};
    HZP_ASSIGN_OR_RETURN(side.summary, load_json_file(folder_summary.string(), 64 << 20));
    if (!is_summary(side.summary))
      return Status::InvalidInput(printable(folder_summary.string(), 200) + ": not a summary of hzp simulate");
    return side;
  }
  if (arg != "-") {
    auto doc = load_json_file(arg, 64 << 20);
    if (doc.ok() && is_summary(*doc)) {
      side.summary = std::move(doc).value();
      return side;
    }
  }
  HZP_ASSIGN_OR_RETURN(Scenario scenario, load_scenario_file(arg, sets));
  if (!scenario.model.hf_config_path.empty())
    side.read.push_back({label + " model.from_hf_config", scenario.model.hf_config_path});
  side.kind = "estimate";
  side.scenario = std::move(scenario);
  return side;
}

// The number at a dotted path, if there is one.
std::optional<double> number_at(const nlohmann::json& doc, const std::string& path) {
  const nlohmann::json* at = &doc;
  for (std::size_t begin = 0; begin <= path.size();) {
    const std::size_t dot = std::min(path.find('.', begin), path.size());
    const std::string key = path.substr(begin, dot - begin);
    if (!at->is_object() || !at->contains(key)) return std::nullopt;
    at = &(*at)[key];
    begin = dot + 1;
  }
  if (!at->is_number()) return std::nullopt;
  return at->get<double>();
}

struct Metric {
  std::string label, path, unit;
  double scale = 1;
};

std::vector<Metric> metrics(const nlohmann::json& a, const nlohmann::json& b) {
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  std::vector<Metric> rows = {
      {"GPUs", "gpus", "", 1},
      {"step time", "step_time_s", "s", 1},
      {"throughput", "tokens_per_gpu_per_s", "tok/s/GPU", 1},
      {"MFU", "mfu", "%", 100},
      {"compute", "compute_s", "s", 1},
      {"exposed communication", "exposed_comm_s", "s", 1},
      {"overlap", "overlap_fraction", "%", 100},
      {"memory per GPU", "peak_memory_bytes", "GiB", 1 / GiB},
  };
  for (const char* c : {"params", "grads", "optimizer", "activations", "buffers"})
    rows.push_back({std::string("  ") + c, std::string("peak_memory_breakdown_bytes.") + c, "GiB", 1 / GiB});
  rows.push_back({"traffic intra-node", "comm_bytes.intra_node_per_gpu", "GB/GPU", 1e-9});
  rows.push_back({"traffic inter-node", "comm_bytes.inter_node_per_gpu", "GB/GPU", 1e-9});
  for (const char* phase : {"forward", "backward", "recompute", "optimizer"})
    rows.push_back({std::string("GPU 0 ") + phase, std::string("breakdown.compute_s.") + phase, "s", 1});
  for (const char* dim : {"data", "tensor", "pipeline", "expert", "context"}) {
    const std::string base = std::string("breakdown.comm_s.") + dim;
    if (!number_at(a, base + ".transfer") && !number_at(b, base + ".transfer")) continue;
    rows.push_back({std::string("GPU 0 ") + dim + " comm", base + ".transfer", "s", 1});
    rows.push_back({std::string("GPU 0 ") + dim + " exposed", base + ".exposed", "s", 1});
  }
  rows.push_back({"GPU 0 idle / bubble", "breakdown.idle_s", "s", 1});
  return rows;
}

// Estimates or simulates the sides that are scenarios.
Status evaluate_sides(std::vector<Side*> sides, bool simulate, const fs::path& out_dir,
                      const std::vector<NamedPath>& inputs, const std::vector<std::string>& budget_flags) {
  if (!simulate) {
    for (Side* s : sides) {
      if (s->scenario) {
        HZP_ASSIGN_OR_RETURN(Compiled compiled, compile(*s->scenario));
        HZP_ASSIGN_OR_RETURN(Estimate e, estimate(compiled.scenario, compiled.cost, compiled.schedule));
        s->summary = estimate_to_json(*s->scenario, e);
      }
    }
    return Status::Ok();
  }
  std::vector<ChildSimulation> runs;
  std::vector<Side*> simulated;
  for (std::size_t i = 0; i < sides.size(); ++i) {
    Side* s = sides[i];
    if (!s->scenario) continue;
    const fs::path out = out_dir / (std::string(i == 0 ? "a-" : "b-") + safe_file_name(s->scenario->name));
    HZP_RETURN_IF_ERROR(ensure_writable_dir(out.string(), "--out"));
    // What the simulation writes there (simulate_in_children, hzp simulate) replaces no input (A a folder).
    HZP_RETURN_IF_ERROR(check_output_files(files_in_dir("--out", out.string(),
                                                        {"scenario.json", "summary.json", "timeline.json",
                                                         "timeline.json.gz", "stdout.txt", "stderr.txt"}),
                                           inputs));
    runs.push_back({*s->scenario, out, {}});
    simulated.push_back(s);
  }
  simulate_in_children(runs, 2, {}, budget_flags);
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (runs[i].refused) return Status::InvalidInput(simulated[i]->source + ": " + runs[i].error);
    if (!runs[i].error.empty()) return Status::Internal(simulated[i]->source + ": " + runs[i].error);
    HZP_ASSIGN_OR_RETURN(simulated[i]->summary, load_json_file((runs[i].out / "summary.json").string(), 64 << 20));
    simulated[i]->kind = "simulation (" + runs[i].out.string() + ")";
  }
  return Status::Ok();
}

}  // namespace

int run_compare_command(const std::vector<std::string>& args) {
  auto parsed = parse_flags(args,
                            {{"--simulate", false},
                             {"--json", true},
                             {"--out", true},
                             {"--set", true, true},
                             {"--max-sim-seconds", true},
                             {"--max-sim-GiB", true},
                             {"--exact", false}},
                            2);
  if (!parsed.ok()) return usage_error(parsed.status().message());
  // The simulations' budget, checked here and passed on as given (hzp plan --search does the same).
  std::vector<std::string> budget_flags;
  if (auto budget = read_sim_budget([&](const char* flag) { return parsed->get(flag); }); !budget.ok())
    return usage_error(budget.status().message());
  for (const char* flag : {"--max-sim-seconds", "--max-sim-GiB"})
    if (auto v = parsed->get(flag)) {
      if (!parsed->has("--simulate")) return usage_error(std::string(flag) + " needs --simulate");
      budget_flags.insert(budget_flags.end(), {flag, *v});
    }
  if (parsed->has("--exact")) {  // every rank simulated (hzp simulate --exact)
    if (!parsed->has("--simulate")) return usage_error("--exact needs --simulate");
    budget_flags.push_back("--exact");
  }
  const std::vector<std::string> sets = parsed->all("--set");
  if (parsed->positional.empty()) return usage_error("missing A");
  if (parsed->positional.size() == 1 && sets.empty()) return usage_error("give B, or --set edits that make B from A");
  const bool b_given = parsed->positional.size() == 2;
  const std::string a_arg = parsed->positional[0];
  const std::string b_arg = b_given ? parsed->positional[1] : a_arg;
  if (a_arg == "-" && b_arg == "-")
    return usage_error(b_given ? "stdin can be only one side" : "without B, A cannot be stdin");
  auto a = read_side(a_arg, b_given ? sets : std::vector<std::string>{}, "A");
  if (!a.ok()) return fail(a.status());
  auto b = read_side(b_arg, sets, "B");
  if (!b.ok()) return fail(b.status());
  std::vector<NamedPath> inputs = a->read;
  inputs.insert(inputs.end(), b->read.begin(), b->read.end());
  if (auto path = parsed->get("--json"))
    if (Status st = check_output_files({{"--json", *path}}, inputs); !st.ok()) return fail(st);
  if (b_given && !sets.empty())  // edits that a summary would silently not take
    for (const auto* side : {&*a, &*b})
      if (!side->scenario)
        return usage_error("--set edits both sides' scenarios; " + printable(side == &*a ? a_arg : b_arg, 100) +
                           " is a summary");
  if (!b_given) {
    if (!a->scenario) return usage_error("--set edits a scenario; " + printable(a_arg, 100) + " is a summary");
    b->source = a_arg + " --set " + join(sets, " --set ");
  }
  const fs::path out_dir = parsed->get("--out").value_or("out/compare");
  if (Status st = evaluate_sides({&*a, &*b}, parsed->has("--simulate"), out_dir, inputs, budget_flags); !st.ok())
    return fail(st);

  std::printf("A  %s  (%s)\nB  %s  (%s)\n", a->source.c_str(), a->kind.c_str(), b->source.c_str(), b->kind.c_str());
  std::printf("%-24s %-10s %14s %14s %14s %9s\n", "metric", "unit", "A", "B", "B - A", "B / A");
  nlohmann::json rows = nlohmann::json::array();
  for (const Metric& m : metrics(a->summary, b->summary)) {
    const auto x = number_at(a->summary, m.path), y = number_at(b->summary, m.path);
    if (!x && !y) continue;
    auto cell = [](std::optional<double> v) {
      char text[32] = "-";
      if (v) std::snprintf(text, sizeof text, "%.4g", *v);
      return std::string(text);
    };
    std::optional<double> xa, yb, delta, ratio;
    if (x) xa = *x * m.scale;
    if (y) yb = *y * m.scale;
    if (xa && yb) delta = *yb - *xa;
    // No ratio against a value that is zero but for rounding (an overlap of 2e-13 %: "206236189530.981x").
    if (xa && yb && *xa != 0 && std::abs(*xa) >= 1e-9 * std::abs(*yb)) ratio = *yb / *xa;
    char ratio_text[32] = "-";
    if (ratio) std::snprintf(ratio_text, sizeof ratio_text, "%.3fx", *ratio);
    std::printf("%-24s %-10s %14s %14s %14s %9s\n", m.label.c_str(), m.unit.c_str(), cell(xa).c_str(), cell(yb).c_str(),
                cell(delta).c_str(), ratio_text);
    auto value = [](std::optional<double> v) { return v ? nlohmann::json(*v) : nlohmann::json(nullptr); };
    rows.push_back({{"metric", m.path},
                    {"unit", m.unit},
                    {"a", value(xa)},
                    {"b", value(yb)},
                    {"delta", value(delta)},
                    {"ratio", value(ratio)}});
  }
  const bool a_fits = a->summary.value("fits_memory", true), b_fits = b->summary.value("fits_memory", true);
  if (!a_fits || !b_fits)
    std::printf("does not fit in GPU memory: %s\n", !a_fits && !b_fits ? "A and B" : !a_fits ? "A" : "B");
  if (auto path = parsed->get("--json")) {
    const nlohmann::json out = {{"a", {{"source", a->source}, {"kind", a->kind}}},
                                {"b", {{"source", b->source}, {"kind", b->kind}}},
                                {"rows", rows}};
    if (Status st = write_file_atomic(*path, out.dump(2) + "\n"); !st.ok()) return fail(st);
  }
  return 0;
}

}  // namespace hzp::cli
