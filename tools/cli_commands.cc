// The `hzp` subcommands but train (tools/cli_table.cc adds it): validate, plan, schedule, simulate, replay,
// import, calibrate, collective, compare. Each parses its flags, runs the core, prints, and
// returns an exit code (0 ok, 2 bad input, 1 internal error).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "shared/base/files.h"
#include "shared/base/json_io.h"
#include "shared/base/text.h"
#include "shared/calibrate/compute_fit.h"
#include "shared/compile/compile.h"
#include "shared/estimate/estimator.h"
#include "shared/model/model_math.h"
#include "shared/plan/plan.h"
#include "shared/plan/planner.h"
#include "shared/policy/policy_registry.h"
#include "shared/scenario/overrides.h"
#include "shared/scenario/scenario_parser.h"
#include "shared/schedule/sharding.h"
#include "shared/trace/import/kineto.h"
#include "shared/trace/trace_format.h"
#include "shared/trace/trace_replay.h"
#include "sim/breakdown.h"
#include "sim/executor.h"
#include "tools/cli.h"
#include "tools/cli_collective.h"
#include "tools/cli_compare.h"
#include "tools/cli_flags.h"
#include "tools/cli_search.h"
#include "tools/cli_sim_budget.h"
#include "tools/cli_steady.h"

namespace hzp::cli {
namespace {

int exit_code(const Status& status) {
  return status.code() == StatusCode::kInvalidInput ? 2 : 1;
}

int fail(const Status& status) {
  std::fprintf(stderr, "hzp: error: %s\n", status.message().c_str());
  return exit_code(status);
}

int usage_error(const std::string& command, const std::string& message) {
  std::fprintf(stderr, "hzp %s: %s (see hzp %s --help)\n", command.c_str(), message.c_str(), command.c_str());
  return 2;
}

// Positional scenario plus --flag VALUE options (cli_flags.h); anything else is a usage error.
struct Args {
  std::optional<std::string> scenario;
  ParsedArgs parsed;
  std::optional<std::string> get(const std::string& flag) const { return parsed.get(flag); }
  bool has(const std::string& flag) const { return parsed.has(flag); }
  std::vector<std::string> sets() const { return parsed.all("--set"); }  // --set PATH=VALUE, in order
};

Result<Args> parse_args(const std::vector<std::string>& argv, const std::vector<std::string>& flags,
                        bool scenario_required = true, const std::vector<std::string>& switches = {}) {
  std::vector<Flag> specs;
  for (const std::string& f : flags) specs.push_back({f.c_str(), true});
  for (const std::string& f : switches) specs.push_back({f.c_str(), false});
  specs.push_back({"--set", true, /*repeatable=*/true});
  HZP_ASSIGN_OR_RETURN(ParsedArgs parsed, parse_flags(argv, specs, 1));
  Args out;
  if (!parsed.positional.empty()) out.scenario = parsed.positional.front();
  out.parsed = std::move(parsed);
  if (!out.scenario && scenario_required) return Status::InvalidInput("missing SCENARIO argument");
  return out;
}

// Writes `text` to DIR/name atomically and durably (files.h): a reader never sees a half-written file and
// an earlier result is replaced only by a complete one.
Status write_output(const std::string& dir, const std::string& name, const std::string& text) {
  HZP_RETURN_IF_ERROR(ensure_writable_dir(dir, "--out"));
  return write_file_atomic((std::filesystem::path(dir) / name).string(), text);
}

// What a scenario read from `path` read: the file (SCENARIO) and the Hugging Face config its model starts
// from, if any — the files no output may replace.
std::vector<NamedPath> scenario_inputs(const std::string& path, const Scenario& scenario,
                                       const char* what = "SCENARIO") {
  std::vector<NamedPath> inputs = {{what, path}};
  if (!scenario.model.hf_config_path.empty()) inputs.push_back({"model.from_hf_config", scenario.model.hf_config_path});
  return inputs;
}

// Checks up front (files.h) the files write_sim_outputs writes into DIR: none may be an input, a FIFO, a
// device or a directory, and DIR must be writable.
Status check_sim_outputs(const std::string& dir, const std::vector<NamedPath>& inputs) {
  return check_output_files(files_in_dir("--out", dir, {"summary.json", "timeline.json", "timeline.json.gz"}), inputs);
}

// A timeline of more JSON than this is written gzipped (a 256-GPU tensor x pipeline step writes ~140 MB).
constexpr std::size_t kTimelineGzipBytes = 32u << 20;

// A simulation's outputs, as `hzp simulate` writes them: DIR/summary.json (the given summary) and
// DIR/timeline.json, or DIR/timeline.json.gz above kTimelineGzipBytes (Perfetto opens either; the other
// name is removed, so a folder never holds two timelines of different runs); then says so. 0, or the exit
// code of the failure.
// `breakdown`: GPU 0's, when it is not the spans' (a counted steady state).
int write_sim_outputs(const std::string& dir, const nlohmann::json& summary, const Scenario& scenario,
                      const Schedule& schedule, const sim::SimResult& r, bool always_gzip = false,
                      const sim::StepBreakdown* breakdown = nullptr) {
  nlohmann::json with_breakdown = summary;
  with_breakdown["breakdown"] = sim::breakdown_json(breakdown ? *breakdown : sim::step_breakdown(schedule, r, 0));
  if (Status s = write_output(dir, "summary.json", with_breakdown.dump(2) + "\n"); !s.ok()) return fail(s);
  std::string timeline = sim::timeline_text(scenario, schedule, r) + "\n";
  const std::size_t json_bytes = timeline.size();
  const bool gzipped = always_gzip || json_bytes > kTimelineGzipBytes;
  if (gzipped) {
    auto packed = gzip_text(timeline);
    if (!packed.ok()) return fail(packed.status());
    timeline = std::move(packed).value();
  }
  const std::string name = gzipped ? "timeline.json.gz" : "timeline.json";
  if (Status s = write_output(dir, name, timeline); !s.ok()) return fail(s);
  std::error_code ignored;
  std::filesystem::remove(std::filesystem::path(dir) / (gzipped ? "timeline.json" : "timeline.json.gz"), ignored);
  std::printf("wrote %s/summary.json and %s/%s (open in ui.perfetto.dev; %zu GPUs recorded", dir.c_str(), dir.c_str(),
              name.c_str(), r.timeline_ranks.size());
  if (gzipped && !always_gzip)
    std::printf("; %.0f MB of JSON gzipped to %.0f MB, above %zu MiB; --timeline-ranks K records fewer GPUs",
                static_cast<double>(json_bytes) / 1e6, static_cast<double>(timeline.size()) / 1e6,
                kTimelineGzipBytes >> 20);
  std::printf(")\n");
  return 0;
}

// Every command reads scenarios through here: the file ("-": stdin) with its --set assignments, parsed, then
// "sharding": "auto" resolved (compile's first stage), saying what it picked.
Result<Scenario> load(const std::string& path, const std::vector<std::string>& sets) {
  HZP_ASSIGN_OR_RETURN(Scenario parsed, load_scenario_file(path, sets));
  const bool was_auto = parsed.policy.auto_sharding;
  HZP_ASSIGN_OR_RETURN(Scenario scenario, resolve(std::move(parsed)));
  if (was_auto)
    std::fprintf(stderr,
                 "hzp: policy.sharding \"auto\" -> %s, prefetch %d (the planner's analytic pick; `hzp plan "
                 "--search` also simulates the top candidates; %s)\n",
                 sharding_notation(scenario.policy.sharding).c_str(), scenario.policy.overlap.prefetch_depth,
                 kShardingLegend);
  return scenario;
}

int run_validate(const std::vector<std::string>& argv) {
  auto args = parse_args(argv, {});
  if (!args.ok()) return usage_error("validate", args.status().message());
  auto scenario = load(*args->scenario, args->sets());
  if (!scenario.ok()) return fail(scenario.status());
  std::printf("%s\n", scenario_to_json(*scenario).dump(2).c_str());
  auto compiled = compile(*scenario);
  if (!compiled.ok()) {
    if (compiled.status().code() != StatusCode::kUnimplemented) return fail(compiled.status());
    std::fprintf(stderr, "hzp validate: scenario is valid; note: %s\n", compiled.status().message().c_str());
    return 0;
  }
  const Schedule* schedule = &compiled->schedule;
  std::fprintf(stderr,
               "hzp validate: ok — %s, %lld parameters, mesh %s, %lld micro-batches/step, schedule of %zu "
               "ops per rank (stage 0) on %zu streams, %zu process groups, no deadlock\n",
               scenario->name.c_str(), static_cast<long long>(parameter_count(scenario->model)),
               scenario->mesh.describe().c_str(), static_cast<long long>(scenario->grad_accum_steps()),
               schedule->programs[0].ops.size(), schedule->streams.size(), schedule->groups.size());
  return 0;
}

// `hzp calibrate --trace TRACE`: the efficiencies of the trace's scenario fitted to its recorded op times.
int calibrate_from_trace(const std::string& path, const std::optional<std::string>& out) {
  if (out)
    if (Status st = check_output_files({{"--out", *out}}, {{"--trace", path}}); !st.ok()) return fail(st);
  auto trace = load_trace_file(path);
  if (!trace.ok()) return fail(trace.status());
  auto recorded = parse_scenario(trace->scenario_config, trace->scenario);
  if (!recorded.ok()) return fail(Status::InvalidInput("trace scenario_config: " + recorded.status().message()));
  auto compiled = compile(*recorded);
  if (!compiled.ok()) return fail(compiled.status());
  // A fit to compute faster than the GPU's peak would calibrate to nonsense (the tenth attack of issue 35:
  // compute recorded in no time, the fit made from the optimizer's ops alone).
  const std::vector<double> speed = compute_speed_over_peak(*trace, compiled->schedule, recorded->cluster.gpu);
  if (auto fastest = std::max_element(speed.begin(), speed.end()); fastest != speed.end() && *fastest > 1) {
    char times[32];
    std::snprintf(times, sizeof times, "%.3g", *fastest);
    return fail(Status::InvalidInput("calibrate --trace: rank " + std::to_string(fastest - speed.begin()) +
                                     "'s compute ops ran at " + std::string(times) +
                                     " x the peak FLOP/s of cluster.gpu (" + recorded->cluster.gpu.type +
                                     "): not the times of a run on this GPU (edited, or recorded on another clock)"));
  }
  auto fit = fit_compute_to_trace(*compiled, *trace);
  if (!fit.ok()) return fail(fit.status());
  const Efficiency& table = recorded->cluster.efficiency;
  std::printf("calibrated %s from %s (%d rank%s, %lld timed ops): compute + optimizer per rank and step\n",
              recorded->name.c_str(), printable(path, 120).c_str(), trace->world_size,
              trace->world_size == 1 ? "" : "s", fit->points);
  std::printf("  recorded      %.6f s\n  table         %.6f s (%s, the scenario's efficiencies)\n", fit->recorded_s,
              fit->table_s, recorded->cluster.gpu.type.c_str());
  std::printf("  gemm          %.4f -> %.4f (fraction of peak FLOP/s)\n", table.gemm, fit->efficiency.gemm);
  std::printf("  memory_bound  %.4f -> %.4f (fraction of HBM bandwidth)%s\n", table.memory_bound,
              fit->efficiency.memory_bound,
              fit->both ? "" : "\n  (the ops did not separate the two: both scaled by one factor)");
  std::printf("  fitted        %.6f s\n", fit->fitted_s);
  const nlohmann::json snippet = {
      {"efficiency", {{"gemm", fit->efficiency.gemm}, {"memory_bound", fit->efficiency.memory_bound}}}};
  std::printf("put this in the \"cluster\" of scenarios on the same GPU:\n  %s\n", snippet.dump().c_str());
  if (out) {
    Scenario calibrated = *recorded;
    calibrated.cluster.efficiency = fit->efficiency;
    if (Status st = write_file_atomic(*out, scenario_to_json(calibrated).dump(2) + "\n"); !st.ok()) return fail(st);
    std::printf("wrote %s (the trace's scenario, resolved, with the fitted efficiencies)\n", out->c_str());
  }
  return 0;
}

int run_calibrate(const std::vector<std::string>& argv) {
  auto args = parse_args(argv, {"--tokens-per-gpu-s", "--step-time-s", "--mfu", "--out", "--trace"}, false);
  if (!args.ok()) return usage_error("calibrate", args.status().message());
  if (auto trace = args->get("--trace")) {
    if (args->scenario || args->has("--tokens-per-gpu-s") || args->has("--step-time-s") || args->has("--mfu"))
      return usage_error("calibrate", "--trace takes the scenario and the measurement from the trace: give neither");
    return calibrate_from_trace(*trace, args->get("--out"));
  }
  if (!args->scenario) return usage_error("calibrate", "missing SCENARIO argument");
  std::optional<OneNodeMeasurement> measured;
  const std::pair<const char*, MeasureKind> kinds[] = {{"--tokens-per-gpu-s", MeasureKind::kTokensPerGpuPerS},
                                                       {"--step-time-s", MeasureKind::kStepTimeS},
                                                       {"--mfu", MeasureKind::kMfu}};
  for (const auto& [flag, kind] : kinds) {
    if (!args->has(flag)) continue;
    if (measured) return usage_error("calibrate", "give one measurement (--tokens-per-gpu-s, --step-time-s or --mfu)");
    // --mfu is a fraction: its range says so up front (compute_fit.h refuses 1 and above too).
    auto v = parse_number_flag(flag, *args->get(flag), 1e-9, kind == MeasureKind::kMfu ? 0.999999 : 1e12);
    if (!v.ok()) return usage_error("calibrate", v.status().message());
    measured = OneNodeMeasurement{kind, *v};
  }
  if (!measured)
    return usage_error("calibrate", "missing the measurement (--tokens-per-gpu-s, --step-time-s or --mfu)");
  auto scenario = load(*args->scenario, args->sets());
  if (!scenario.ok()) return fail(scenario.status());
  if (auto out = args->get("--out"))
    if (Status st = check_output_files({{"--out", *out}}, scenario_inputs(*args->scenario, *scenario)); !st.ok())
      return fail(st);
  auto fit = fit_compute_efficiency(*scenario, *measured);
  if (!fit.ok()) return fail(fit.status());
  const Efficiency& table = scenario->cluster.efficiency;
  std::printf("calibrated %s on one node (%d x %s): measured step %.4f s, table efficiencies give %.4f s\n",
              scenario->name.c_str(), scenario->cluster.gpus_per_node, scenario->cluster.gpu.type.c_str(),
              fit->measured_step_s, fit->table_step_s);
  std::printf("  gemm          %.4f -> %.4f (fraction of peak FLOP/s)\n", table.gemm, fit->efficiency.gemm);
  std::printf("  memory_bound  %.4f -> %.4f (fraction of HBM bandwidth)\n", table.memory_bound,
              fit->efficiency.memory_bound);
  std::printf("  fitted step   %.4f s (exposed communication %.4f s on this node)\n", fit->fitted_step_s,
              fit->exposed_comm_s);
  const nlohmann::json snippet = {{"efficiency",
                                   {{"gemm", fit->efficiency.gemm},
                                    {"memory_bound", fit->efficiency.memory_bound},
                                    {"intra_node", fit->efficiency.intra_node},
                                    {"inter_node", fit->efficiency.inter_node}}}};
  std::printf("put this in the \"cluster\" of the multi-node scenarios (same GPU, model and micro-batch):\n  %s\n",
              snippet.dump().c_str());
  if (const auto out = args->get("--out")) {
    Scenario calibrated = *scenario;
    calibrated.cluster.efficiency = fit->efficiency;
    if (Status st = write_file_atomic(*out, scenario_to_json(calibrated).dump(2) + "\n"); !st.ok()) return fail(st);
    std::printf("wrote %s (the scenario, resolved, with the fitted efficiencies)\n", out->c_str());
  }
  return 0;
}

// Ranges of the numeric flags (documented in each command's help).
constexpr long long kMaxTop = 1000;
constexpr long long kMaxJobs = 64;
constexpr long long kMaxSimSteps = 1000;
constexpr long long kMaxTimelineRanks = 4096;
// Without --timeline-ranks, a timeline records up to 64 GPUs but stops near this many op spans: writing 1.7 M
// spans (the Grok-1-like recipe's 71 GPUs) took 20 s and 3 GB, and Perfetto's UI slows down well before that.
constexpr double kDefaultTimelineSpans = 500e3;

int run_plan(const std::vector<std::string>& argv) {
  auto args = parse_args(argv, {"--out", "--top", "--jobs", "--max-sim-seconds", "--max-sim-GiB"}, true,
                         {"--search", "--exact"});
  if (!args.ok()) return usage_error("plan", args.status().message());
  const bool search = args->has("--search");
  if (!search && (args->has("--top") || args->has("--jobs") || args->has("--max-sim-seconds") ||
                  args->has("--max-sim-GiB") || args->has("--exact")))
    return usage_error("plan", "--top, --jobs, --max-sim-seconds, --max-sim-GiB and --exact need --search");
  auto budget = read_sim_budget([&](const char* flag) { return args->get(flag); });
  if (!budget.ok()) return usage_error("plan", budget.status().message());
  std::vector<std::string> budget_flags;  // checked here, passed on as given to each candidate's simulation
  for (const char* flag : {"--max-sim-seconds", "--max-sim-GiB"})
    if (auto v = args->get(flag)) budget_flags.insert(budget_flags.end(), {flag, *v});
  if (args->has("--exact")) budget_flags.push_back("--exact");  // every rank of every candidate
  auto scenario = load(*args->scenario, args->sets());
  if (!scenario.ok()) return fail(scenario.status());
  if (search) {
    long long top = 8, jobs = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    for (auto [flag, field, max] : {std::tuple{"--top", &top, kMaxTop}, std::tuple{"--jobs", &jobs, kMaxJobs}}) {
      if (auto v = args->get(flag)) {
        auto n = parse_int_flag(flag, *v, 1, max);
        if (!n.ok()) return usage_error("plan", n.status().message());
        *field = *n;
      }
    }
    const std::string out = args->get("--out").value_or("out/" + safe_file_name(scenario->name) + "-plan");
    if (Status st = check_output_files(files_in_dir("--out", out, {"plan.json", "best.json"}),
                                       scenario_inputs(*args->scenario, *scenario));
        !st.ok())
      return fail(st);
    // OUT/candidates is where the search writes (and clears) its candidates' folders: never an input's place.
    const std::string candidates = (std::filesystem::path(out) / "candidates").string();
    for (const NamedPath& in : scenario_inputs(*args->scenario, *scenario))
      if (is_inside(in.path, candidates))
        return fail(
            Status::InvalidInput(in.what + " " + printable(in.path, 200) + " is inside " + printable(candidates, 200) +
                                 ", where plan --search writes its candidates: move it or choose another --out"));
    return run_plan_search(*scenario, static_cast<int>(top), static_cast<int>(jobs), out, budget_flags,
                           budget->max_seconds);
  }
  if (auto out = args->get("--out"))
    if (Status st =
            check_output_files(files_in_dir("--out", *out, {"plan.json"}), scenario_inputs(*args->scenario, *scenario));
        !st.ok())
      return fail(st);
  auto plan = plan_presets(*scenario);
  if (!plan.ok()) return fail(plan.status());
  std::printf("%s", plan_table(*scenario, *plan).c_str());
  if (auto out = args->get("--out")) {
    if (Status s = write_output(*out, "plan.json", plan_to_json(*scenario, *plan).dump(2) + "\n"); !s.ok())
      return fail(s);
    std::printf("wrote %s/plan.json\n", out->c_str());
  }
  return 0;
}

int run_schedule(const std::vector<std::string>& argv) {
  auto args = parse_args(argv, {"--rank"});
  if (!args.ok()) return usage_error("schedule", args.status().message());
  auto scenario = load(*args->scenario, args->sets());
  if (!scenario.ok()) return fail(scenario.status());
  int rank = 0;
  if (auto r = args->get("--rank")) {
    if (*r == "all") {
      rank = -1;
    } else {
      auto n = parse_int_flag("--rank", *r, 0, scenario->data_parallel() - 1);
      if (!n.ok()) return usage_error("schedule", n.status().message() + " (or 'all')");
      rank = static_cast<int>(*n);
    }
  }
  auto compiled = compile(*scenario);
  if (!compiled.ok()) return fail(compiled.status());
  if (rank < 0) {
    // Every rank's line lists the members of each of its groups: quadratic in the world. The dump is built
    // in memory before it is printed, so a size past this is refused before it is built.
    constexpr double kMaxDumpBytes = 512.0 * 1024 * 1024;
    const Schedule& s = compiled->schedule;
    const double digits = std::to_string(s.world_size).size() + 1.0;
    double bytes = 0;
    for (int r = 0; r < s.world_size; ++r)
      for (int g : s.rank_groups[r])
        if (g >= 0) bytes += static_cast<double>(s.groups[g].ranks.size()) * digits;
    for (const Program& p : s.programs) bytes += 100.0 * static_cast<double>(p.ops.size());
    if (bytes > kMaxDumpBytes) {
      std::fprintf(stderr,
                   "hzp schedule: --rank all would print about %.0f MB (the members of every rank's groups, %d "
                   "ranks), past %.0f MB: print one rank with --rank R\n",
                   bytes / 1e6, s.world_size, kMaxDumpBytes / 1e6);
      return 2;
    }
  }
  std::printf("%s", dump_schedule(compiled->schedule, rank).c_str());
  return 0;
}

// `hzp simulate` without a scenario runs scenarios/default.json: from the working directory if it is there,
// else from the source tree the binary was built from.
std::string default_scenario_path() {
  const std::string local = "scenarios/default.json";
  if (std::filesystem::exists(local)) return local;
  return std::string(HZP_SOURCE_DIR) + "/" + local;
}

int run_simulate(const std::vector<std::string>& argv) {
  auto args = parse_args(argv, {"--out", "--steps", "--timeline-ranks", "--max-sim-seconds", "--max-sim-GiB"},
                         /*scenario_required=*/false, {"--timeline-gz", "--exact"});
  if (!args.ok()) return usage_error("simulate", args.status().message());
  const std::string path = args->scenario.value_or(default_scenario_path());
  sim::SimOptions options;
  options.exact = args->has("--exact");
  auto budget = read_sim_budget([&](const char* flag) { return args->get(flag); });
  if (!budget.ok()) return usage_error("simulate", budget.status().message());
  options.budget = *budget;
  options.progress = true;
  options.progress_interval_s = ::isatty(STDERR_FILENO) == 1 ? 2 : 10;  // a log file: fewer lines
  for (auto [flag, field, max] : {std::tuple{"--steps", &options.steps, kMaxSimSteps},
                                  std::tuple{"--timeline-ranks", &options.timeline_max_ranks, kMaxTimelineRanks}}) {
    if (auto v = args->get(flag)) {
      auto n = parse_int_flag(flag, *v, 1, max);
      if (!n.ok()) return usage_error("simulate", n.status().message());
      *field = static_cast<int>(*n);
    }
  }
  auto scenario = load(path, args->sets());
  if (!scenario.ok()) return fail(scenario.status());
  const std::string out_dir = args->get("--out").value_or("out/" + safe_file_name(scenario->name));
  if (Status s = check_sim_outputs(out_dir, scenario_inputs(path, *scenario)); !s.ok()) return fail(s);
  auto compiled = compile(*scenario);
  if (!compiled.ok()) return fail(compiled.status());
  const Schedule* schedule = &compiled->schedule;
  const sim::SteadyStatePlan steady = sim::plan_steady_state(*scenario, options);
  const bool timeline_capped = !args->get("--timeline-ranks") && [&] {
    std::size_t ops = 0;
    for (const Program& p : schedule->programs) ops = std::max(ops, p.ops.size());
    // A counted steady state draws its longer run: about second / M of the ops.
    const double drawn = steady.applies() ? static_cast<double>(steady.second) / steady.micro_batches : 1.0;
    const double fit = kDefaultTimelineSpans / (static_cast<double>(ops) * drawn * options.steps);
    if (fit >= options.timeline_max_ranks) return false;
    options.timeline_max_ranks = std::max(1, static_cast<int>(fit));
    return true;
  }();
  auto analytic = estimate(*scenario, compiled->cost, *schedule);
  if (!analytic.ok()) return fail(analytic.status());
  std::fprintf(stderr, "sim: %s — %s, %s on %d GPUs, %zu ops per rank per step\n", scenario->name.c_str(),
               scenario->model.name.c_str(), to_string(scenario->policy.preset), scenario->cluster.world_size(),
               schedule->programs[0].ops.size());
  auto simulation = simulate_scenario(*compiled, steady, options);
  if (!simulation.ok()) return fail(simulation.status());
  const sim::SimResult& r = simulation->result;
  const Schedule& drawn = simulation->schedule(*compiled);
  constexpr double GiB = 1024.0 * 1024.0 * 1024.0;
  const MemoryBreakdown& m = r.memory;
  std::printf("simulated %s: %s, %s on %d GPUs (%d x %d %s), %d step%s\n", scenario->name.c_str(),
              scenario->model.name.c_str(), to_string(scenario->policy.preset), r.gpus, scenario->cluster.nodes,
              scenario->cluster.gpus_per_node, scenario->cluster.gpu.type.c_str(), r.steps, r.steps > 1 ? "s" : "");
  std::printf("  step time     %.4f s  (compute %.4f s, exposed communication %.4f s, overlap %.1f %%)\n",
              r.step_time_s, r.compute_s, r.exposed_comm_s, 100 * r.overlap_fraction);
  std::printf("%s", sim::breakdown_text(simulation->breakdown, scenario->mesh.pipeline > 1).c_str());
  std::printf("  analytic      %.4f s  (estimator, no contention)\n", analytic->step_time_s);
  std::printf("  throughput    %.0f tokens/s, %.0f tokens/s/GPU, %.1f TFLOP/s/GPU, MFU %.1f %%%s\n", r.tokens_per_s,
              r.tokens_per_gpu_per_s, r.tflops_per_gpu, 100 * r.mfu,
              r.fits_memory ? "" : "  -- NOT RUNNABLE: does not fit in GPU memory");
  std::printf("  mesh          %s\n", scenario->mesh.describe().c_str());
  std::printf("  sharding      %s (%s)\n", sharding_notation(scenario->policy.sharding).c_str(), kShardingLegend);
  std::printf("  memory        %s (params %.2f, grads %.2f, optimizer %.2f, activations %.2f, buffers %.2f GiB)\n",
              r.memory_verdict.c_str(), m.params / GiB, m.grads / GiB, m.optimizer / GiB, m.activations / GiB,
              m.buffers / GiB);
  std::printf("  traffic/GPU   %.3f GB intra-node, %.3f GB inter-node per step\n", r.comm_bytes_intra_node / 1e9,
              r.comm_bytes_inter_node / 1e9);
  std::printf("  simulation    %lld ops, %lld collectives in %.2f s wall (%.0f ops/s; estimated %.2f s, %.2f GiB)\n",
              r.ops_executed, r.collectives, r.sim_wall_s, r.sim_wall_s > 0 ? r.ops_executed / r.sim_wall_s : 0.0,
              r.cost_estimate.seconds, r.cost_estimate.resident_bytes / GiB);
  if (r.symmetric)
    std::printf(
        "  symmetry      %lld ops simulated: one rank per program; %lld collectives ran flows, the others "
        "share no link with a representative's (--exact: every rank, every flow)\n",
        r.ops_simulated, r.collectives_with_flows);
  else
    std::printf("  symmetry      every rank simulated (%s)\n", r.symmetry_note.c_str());
  if (steady.applies())
    std::printf(
        "  steady state  %lld and %lld of the %lld micro-batches simulated, the other %lld counted: after the "
        "warm-up they repeat every %lld (the timeline draws the %lld; --exact simulates all)\n",
        static_cast<long long>(steady.first), static_cast<long long>(steady.second),
        static_cast<long long>(steady.micro_batches), static_cast<long long>(steady.micro_batches - steady.second),
        static_cast<long long>(steady.period), static_cast<long long>(steady.second));
  if (timeline_capped)
    std::printf(
        "  timeline      %zu GPUs recorded, not 64: a default timeline stops near %.0fk op spans "
        "(--timeline-ranks K records more)\n",
        r.timeline_ranks.size(), kDefaultTimelineSpans / 1e3);
  return write_sim_outputs(out_dir, sim::summary_json(*scenario, r), *scenario, drawn, r, args->has("--timeline-gz"),
                           &simulation->breakdown);
}

// `hzp import KINETO... --scenario S`: PyTorch profiler traces (one per rank) as an hzp trace of S's
// schedule (shared/trace/import/kineto.h), for `hzp replay` and its what-ifs.
int run_import(const std::vector<std::string>& argv) {
  auto parsed = parse_flags(
      argv,
      {{"--scenario", true}, {"--out", true}, {"--include-idle", false}, {"--no-check", false}, {"--set", true, true}},
      1 << 16);
  if (!parsed.ok()) return usage_error("import", parsed.status().message());
  if (parsed->positional.empty()) return usage_error("import", "missing the profiler trace file(s)");
  auto scenario_path = parsed->get("--scenario");
  if (!scenario_path) return usage_error("import", "missing --scenario (the model, cluster and policy the traces ran)");
  // Two kinds of file are given: an error of the scenario's says so.
  auto loaded = load_scenario_file(*scenario_path, parsed->all("--set"));
  if (!loaded.ok()) return fail(loaded.status().prefixed("--scenario: "));
  auto compiled = compile(*loaded);
  if (!compiled.ok()) return fail(compiled.status().prefixed("--scenario: "));
  const Scenario* scenario = &compiled->scenario;
  const Schedule* schedule = &compiled->schedule;
  const std::string out = parsed->get("--out").value_or("out/import-" + safe_file_name(scenario->name) + ".json");
  std::vector<NamedPath> inputs = scenario_inputs(*scenario_path, *scenario, "--scenario");
  for (const std::string& path : parsed->positional) inputs.push_back({"profile", path});
  if (Status s = check_output_files({{"--out", out}}, inputs); !s.ok()) return fail(s);
  if (static_cast<int>(parsed->positional.size()) != schedule->world_size)
    return fail(Status::InvalidInput("the scenario has " + std::to_string(schedule->world_size) + " ranks; " +
                                     std::to_string(parsed->positional.size()) +
                                     " profiler files were given (one per rank)"));

  std::vector<KinetoProfile> profiles;
  for (const std::string& path : parsed->positional) {
    auto p = load_kineto_file(path);
    if (!p.ok()) return fail(p.status());
    // A trace holds at most kMaxTraceSteps steps: said before a table of a million rows is printed.
    if (static_cast<std::int64_t>(p->steps.size()) > kMaxTraceSteps)
      return fail(Status::InvalidInput(printable(path, 200) + ": " + std::to_string(p->steps.size()) +
                                       " training steps, more than the " + std::to_string(kMaxTraceSteps) +
                                       " an hzp trace holds (profile fewer steps)"));
    std::printf("%s: %s, %zu step%s, %lld GPU events%s\n", printable(path, 120).c_str(),
                p->device.empty() ? "device not named" : p->device.c_str(), p->steps.size(),
                p->steps.size() == 1 ? "" : "s", p->gpu_events,
                p->rank >= 0 ? (", rank " + std::to_string(p->rank)).c_str() : "");
    std::printf("  %4s %11s %11s %11s %11s %11s %6s\n", "step", "kernels_ms", "forward_ms", "backward_ms",
                "optimizer_ms", "gpu_idle_ms", "comms");
    constexpr std::size_t kRowsShown = 20;
    for (std::size_t k = 0; k < std::min(p->steps.size(), kRowsShown); ++k) {
      const KinetoStep& st = p->steps[k];
      double first = 1e300, last = 0, busy = 0;
      for (int ph = 0; ph < kKinetoPhases; ++ph)
        if (st.busy_us[ph] > 0) {
          first = std::min(first, st.first_us[ph]);
          last = std::max(last, st.last_us[ph]);
          busy += st.busy_us[ph];
        }
      std::printf("  %4zu %11.3f %11.3f %11.3f %11.3f %11.3f %6zu\n", k, st.kernel_us / 1e3, st.busy_us[0] / 1e3,
                  st.busy_us[1] / 1e3, st.busy_us[2] / 1e3, std::max(0.0, last - first - busy) / 1e3,
                  st.collectives.size());
    }
    if (p->steps.size() > kRowsShown) std::printf("  ... %zu more steps\n", p->steps.size() - kRowsShown);
    if (p->unattributed > 0)
      std::printf("  %lld GPU op%s (%.3f ms) launched outside every step's forward/backward/optimizer: ignored\n",
                  p->unattributed, p->unattributed == 1 ? "" : "s", p->unattributed_us / 1e3);
    if (p->collectives_unsized > 0)
      std::printf(
          "  note: %lld NCCL kernel%s launched by a record_param_comms whose size cannot be read (the first: "
          "%s): sized by the scenario's schedule\n",
          p->collectives_unsized, p->collectives_unsized == 1 ? "" : "s", p->unsized_example.c_str());
    profiles.push_back(std::move(*p));
  }
  if (!parsed->has("--no-check"))
    if (Status s = check_kineto_against(profiles, *scenario); !s.ok()) return fail(s);
  const RooflineDurations roofline(scenario->cluster);
  auto imported = kineto_to_trace(std::move(profiles), *scenario, *schedule, roofline, parsed->has("--include-idle"));
  if (!imported.ok()) return fail(imported.status());
  // The profile cannot say how many layers or tokens ran (its module times are not readable), but a scenario
  // that makes its compute faster than the GPU's peak is not the model it ran (the eleventh attack of issue
  // 35: --set model.layers=24 on a 12-layer profile, or training.seq_len 1000x): refused before anything is
  // written, as calibrate --trace would refuse the trace.
  if (!parsed->has("--no-check")) {
    const std::vector<double> speed = compute_speed_over_peak(imported->trace, *schedule, scenario->cluster.gpu);
    if (auto fastest = std::max_element(speed.begin(), speed.end()); fastest != speed.end() && *fastest > 1) {
      char times[32];
      std::snprintf(times, sizeof times, "%.3g", *fastest);
      return fail(Status::InvalidInput(
          "--scenario: with this scenario's model and batch, rank " + std::to_string(fastest - speed.begin()) +
          "'s profiled compute would run at " + times + " x the peak FLOP/s of cluster.gpu (" +
          scenario->cluster.gpu.type +
          "): the scenario is not what the profile ran (check model.layers, hidden, ffn_hidden, vocab, "
          "training.seq_len and micro_batch); --no-check imports it anyway"));
    }
  }
  for (const std::string& note : imported->notes) std::printf("note: %s\n", note.c_str());
  std::vector<double> compute(schedule->world_size, 0);
  for (const TraceEvent& e : imported->trace.events)
    if (e.kind == TraceKind::kCompute || e.kind == TraceKind::kOptimizerStep)
      compute[e.rank] += (e.end_us - e.start_us) / 1e3 / imported->steps;
  std::printf("trace of %s (%s, %d rank%s, %d step%s): compute + optimizer per step, rank 0: %.3f ms%s\n",
              scenario->name.c_str(), to_string(schedule->policy), schedule->world_size,
              schedule->world_size == 1 ? "" : "s", imported->steps, imported->steps == 1 ? "" : "s", compute[0],
              parsed->has("--include-idle") ? " (GPU idle gaps inside each phase included)" : "");
  auto text = trace_json_text(imported->trace);
  if (!text.ok()) return fail(text.status());
  if (Status s = write_file_atomic(out, *text); !s.ok()) return fail(s);
  std::printf("wrote %s (hzp replay %s [--scenario OVERRIDES.json])\n", out.c_str(), out.c_str());
  return 0;
}

// `hzp replay TRACE`: the trace's scenario rebuilt, its schedule run by the simulator with the recorded
// compute, optimizer and collective times (shared/trace/trace_replay.h); recorded vs replayed step time per rank.
// With --scenario OVERRIDES.json: a what-if — the overrides merged into the recorded scenario, the schedule
// rebuilt for it, compute at the trace's rates per FLOP (TraceRates), the network simulated.
int run_replay(const std::vector<std::string>& argv) {
  auto args =
      parse_args(argv, {"--out", "--scenario", "--steps", "--timeline-ranks", "--max-sim-seconds", "--max-sim-GiB"});
  if (!args.ok()) return usage_error("replay", args.status().message());
  int timeline_ranks = kMaxTimelineRanks;
  if (auto v = args->get("--timeline-ranks")) {
    auto n = parse_int_flag("--timeline-ranks", *v, 1, kMaxTimelineRanks);
    if (!n.ok()) return usage_error("replay", n.status().message());
    timeline_ranks = static_cast<int>(*n);
  }
  auto budget = read_sim_budget([&](const char* flag) { return args->get(flag); });
  if (!budget.ok()) return usage_error("replay", budget.status().message());
  auto trace = load_trace_file(*args->scenario);
  if (!trace.ok()) return fail(trace.status());
  if (trace->events.empty()) return fail(Status::InvalidInput("trace " + *args->scenario + " has no events"));
  {
    // Every rank recorded, and recorded time: a rank missing would be timed by the roofline as if measured,
    // and a rank whose events all start and end at one instant replays as a step of 0 s (issue 35's eighth
    // attack: one 1 µs event among zero-length ones gave a summary of zeros and an empty table).
    std::vector<char> seen(static_cast<std::size_t>(std::max(trace->world_size, 0)), 0);
    std::vector<double> longest_us(seen.size(), 0);
    for (const TraceEvent& e : trace->events)
      if (e.rank >= 0 && e.rank < trace->world_size) {
        seen[e.rank] = 1;
        longest_us[e.rank] = std::max(longest_us[e.rank], e.end_us - e.start_us);
      }
    for (int r = 0; r < trace->world_size; ++r) {
      if (!seen[r])
        return fail(Status::InvalidInput("trace " + printable(*args->scenario, 200) + " has no events of rank " +
                                         std::to_string(r) + " of its " + std::to_string(trace->world_size) +
                                         ": a trace records every rank"));
      if (longest_us[r] <= 0)
        return fail(Status::InvalidInput("trace " + printable(*args->scenario, 200) + ": every event of rank " +
                                         std::to_string(r) +
                                         " starts and ends at the same instant: no time was recorded"));
    }
  }
  auto recorded_scenario = parse_scenario(trace->scenario_config, trace->scenario);
  if (!recorded_scenario.ok())
    return fail(Status::InvalidInput("trace scenario_config: " + recorded_scenario.status().message()));
  auto recorded_run = compile(*recorded_scenario);
  if (!recorded_run.ok()) return fail(recorded_run.status());
  const Schedule* recorded_schedule = &recorded_run->schedule;
  const std::vector<double> before = recorded_step_times(*trace);
  double recorded_mean = 0;
  for (double t : before) recorded_mean += t / static_cast<double>(before.size());

  const std::optional<std::string> overrides_path = args->get("--scenario");
  if (overrides_path || !args->sets().empty()) {
    Result<nlohmann::json> overrides = nlohmann::json::object();
    if (overrides_path) overrides = load_json_file(*overrides_path, kMaxScenarioBytes);
    if (!overrides.ok()) return fail(Status::InvalidInput("--scenario: " + overrides.status().message()));
    if (!overrides->is_object())
      return fail(Status::InvalidInput("--scenario: " + printable(*overrides_path, 200) + " is not a JSON object"));
    for (const std::string& set : args->sets())  // on the overrides, so presets resolve as in the file
      if (Status st = apply_set(*overrides, set); !st.ok()) return fail(st);
    auto merged = apply_overrides(trace->scenario_config, *overrides);
    if (!merged.ok()) return fail(Status::InvalidInput("--scenario: " + merged.status().message()));
    auto scenario = parse_scenario(*merged, trace->scenario + "-what-if");
    if (!scenario.ok())
      return fail(
          Status::InvalidInput("--scenario (merged into the trace's scenario): " + scenario.status().message()));
    sim::SimOptions options;
    options.budget = *budget;
    if (args->get("--timeline-ranks")) options.timeline_max_ranks = timeline_ranks;
    if (auto v = args->get("--steps")) {
      auto n = parse_int_flag("--steps", *v, 1, kMaxSimSteps);
      if (!n.ok()) return usage_error("replay", n.status().message());
      options.steps = static_cast<int>(*n);
    }
    const std::string out_dir = args->get("--out").value_or("out/what-if-" + safe_file_name(scenario->name));
    if (Status s =
            check_sim_outputs(out_dir, {{"TRACE", *args->scenario}, {"--scenario", overrides_path.value_or("")}});
        !s.ok())
      return fail(s);
    auto compiled = compile(*scenario);
    if (!compiled.ok()) return fail(compiled.status());
    const Schedule* schedule = &compiled->schedule;
    const RooflineDurations recorded_roofline(recorded_scenario->cluster);
    auto rates = TraceRates::make(*trace, *recorded_schedule, recorded_roofline, scenario->cluster.gpu);
    if (!rates.ok()) return fail(rates.status());
    options.durations = &*rates;
    options.progress = true;
    auto result = sim::simulate(*compiled, options);
    if (!result.ok()) return fail(result.status());
    const sim::SimResult& r = *result;
    std::printf("what-if from %s (recorded: %s, %d ranks, %.6f s per step)\n", args->scenario->c_str(),
                trace->policy.c_str(), trace->world_size, recorded_mean);
    std::printf("  now           %s, %s on %d GPUs (%d x %d %s), micro-batch %lld x %lld tokens\n",
                scenario->model.name.c_str(), to_string(scenario->policy.preset), r.gpus, scenario->cluster.nodes,
                scenario->cluster.gpus_per_node, scenario->cluster.gpu.type.c_str(),
                static_cast<long long>(scenario->training.micro_batch),
                static_cast<long long>(scenario->training.seq_len));
    std::printf(
        "  compute       at the trace's seconds per FLOP of each module and phase (scaled by each op's "
        "FLOPs); %lld op%s not in the trace timed by the roofline\n",
        rates->fallbacks(), rates->fallbacks() == 1 ? "" : "s");
    std::printf("  network       simulated on the scenario's cluster\n");
    std::printf("  step time     %.6f s  (compute %.6f s, exposed communication %.6f s)\n", r.step_time_s, r.compute_s,
                r.exposed_comm_s);
    std::printf("  throughput    %.0f tokens/s/GPU%s\n", r.tokens_per_gpu_per_s,
                r.fits_memory ? "" : "  -- NOT RUNNABLE: does not fit in GPU memory");
    nlohmann::json summary = sim::summary_json(*scenario, r);
    summary["what_if"] = {{"trace", *args->scenario},
                          {"recorded_step_s", recorded_mean},
                          {"overrides", *overrides},
                          {"ops_not_in_trace", rates->fallbacks()}};
    return write_sim_outputs(out_dir, summary, *scenario, *schedule, r);
  }

  if (args->get("--steps")) return usage_error("replay", "--steps applies to a what-if (--scenario) only");
  // The recorded times already hold each GPU's own speed and the slowdown of the communication that ran
  // beside its compute: no modelled variability or interference on top.
  Compiled replayed = *recorded_run;
  replayed.scenario.cluster.compute_spread = 0;
  replayed.scenario.cluster.overlap_slowdown = 0;
  const Scenario& scenario = replayed.scenario;
  const Schedule& schedule = replayed.schedule;
  const std::string out_dir = args->get("--out").value_or("out/replay-" + safe_file_name(scenario.name));
  if (Status s = check_sim_outputs(out_dir, {{"TRACE", *args->scenario}}); !s.ok()) return fail(s);
  const RooflineDurations roofline(scenario.cluster);
  auto recorded = TraceDurations::make(*trace, schedule, roofline);
  if (!recorded.ok()) return fail(recorded.status());
  sim::SimOptions options;
  options.budget = *budget;
  options.steps = recorded->steps();
  options.timeline_max_ranks = static_cast<int>(std::min<long long>(trace->world_size, timeline_ranks));
  options.durations = &*recorded;
  options.collectives = &*recorded;
  auto result = sim::simulate(replayed, options);
  if (!result.ok()) return fail(result.status());
  const sim::SimResult& r = *result;

  // Replayed step time per rank, measured as the recorded one is: first op start to last op end, / steps.
  std::vector<double> first(trace->world_size, 1e300), last(trace->world_size, 0);
  for (const sim::OpSpan& span : r.spans) {
    first[span.rank] = std::min(first[span.rank], span.start);
    last[span.rank] = std::max(last[span.rank], span.end);
  }
  // The replay runs the recorded ops back to back: it has none of the recorded idle time (host work, launch
  // gaps, and in an imported trace the gaps between phases), so it is compared with both.
  const std::vector<double> busy = recorded_busy_times(*trace);
  nlohmann::json per_rank = nlohmann::json::array();
  double worst = 0, most_idle = 0;
  bool any_compared = false;
  std::printf("replayed %s (%s, %d ranks, %d step%s) with its recorded durations\n", args->scenario->c_str(),
              trace->policy.c_str(), trace->world_size, r.steps, r.steps > 1 ? "s" : "");
  std::printf(
      "  per step: recorded = the trace's (first op start to last op end), busy = the part of it in which an\n"
      "  op of the rank ran, replayed = the replay's; error = replayed vs recorded\n");
  std::printf("  %4s %14s %14s %14s %8s\n", "rank", "recorded_s", "busy_s", "replayed_s", "error");
  for (int rank = 0; rank < trace->world_size; ++rank) {
    if (!(last[rank] > first[rank])) continue;  // not among the simulator's recorded ranks (over 4096)
    const double replayed = (last[rank] - first[rank]) / r.steps;
    // A recorded step under a nanosecond (an empty or damaged trace; subnormal times) has no relative error.
    constexpr double kShortestComparedS = 1e-9;
    const bool compared = before[rank] >= kShortestComparedS;
    const double error = compared ? (replayed - before[rank]) / before[rank] : 0;
    const double idle = compared ? 1 - busy[rank] / before[rank] : 0;
    worst = std::max(worst, std::abs(error));
    any_compared = any_compared || compared;
    most_idle = std::max(most_idle, idle);
    char error_text[32] = "-";
    if (compared) std::snprintf(error_text, sizeof error_text, "%+.2f%%", 100 * error);
    std::printf("  %4d %14.6f %14.6f %14.6f %8s\n", rank, before[rank], busy[rank], replayed, error_text);
    per_rank.push_back({{"rank", rank},
                        {"recorded_step_s", before[rank]},
                        {"recorded_busy_s", busy[rank]},
                        {"replayed_step_s", replayed},
                        {"error", compared ? nlohmann::json(error) : nlohmann::json(nullptr)}});
  }
  // No rank compared (every recorded step under a nanosecond): the worst error is undefined, not 0 % (issue
  // 35's ninth attack).
  if (any_compared)
    std::printf(
        "  worst |error| %.2f %% (replayed vs recorded step); %lld op%s not in the trace timed by the "
        "roofline\n",
        100 * worst, recorded->fallbacks(), recorded->fallbacks() == 1 ? "" : "s");
  else
    std::printf(
        "  worst |error| undefined: no rank's recorded step reaches a nanosecond; %lld op%s not in the trace "
        "timed by the roofline\n",
        recorded->fallbacks(), recorded->fallbacks() == 1 ? "" : "s");
  if (most_idle > 0.05)
    std::printf(
        "  note: up to %.0f %% of a recorded step is idle (no op of the rank running), which the replay does\n"
        "  not have; for an imported PyTorch trace, `hzp import --include-idle` keeps that time inside each\n"
        "  phase\n",
        100 * most_idle);
  // Times replay as recorded, whatever they imply; a trace faster than its GPU's peak is not a run of it
  // (issue 35's eighth attack: a trace scaled by 1e-7 replayed at 10,761 TFLOP/s per A100 with no word). Each
  // rank's recorded busy time (its ops, communication included: a lower bound on its compute's rate) against
  // the model FLOPs of a step (the ninth: one rank's near-zero op times hid behind the others', and the
  // replayed step, not the recorded one, gave the rate).
  const double flops_at_peak_s = r.mfu * r.step_time_s;  // a step's model FLOPs / the GPU's peak FLOP/s
  double fastest = 0;
  int fastest_rank = -1;
  // And each rank's compute alone, op by op (the tenth: compute recorded in no time, hidden by the rank's
  // collectives in its busy time).
  const std::vector<double> compute_speed = compute_speed_over_peak(*trace, schedule, scenario.cluster.gpu);
  for (int rank = 0; rank < trace->world_size; ++rank) {
    const double implied = std::max(
        busy[rank] > 0 ? flops_at_peak_s / busy[rank] : std::numeric_limits<double>::infinity(), compute_speed[rank]);
    if (implied > fastest) {
      fastest = implied;
      fastest_rank = rank;
    }
  }
  const bool past_peak = fastest > 1;
  if (past_peak)
    std::printf(
        "  note: rank %d's recorded times imply %.3g TFLOP/s, %.3gx the %s's peak of %.0f: they are not the times\n"
        "  of a run on this GPU (edited, or recorded on another clock), and this replay's speed is not one either\n",
        fastest_rank, fastest * scenario.cluster.gpu.peak_flops * 1e-12, fastest, scenario.cluster.gpu.type.c_str(),
        scenario.cluster.gpu.peak_flops * 1e-12);
  nlohmann::json summary = sim::summary_json(scenario, r);
  summary["replay"] = {{"trace", *args->scenario},
                       {"faster_than_peak", past_peak},
                       {"steps", r.steps},
                       {"ops_not_in_trace", recorded->fallbacks()},
                       {"worst_abs_error", any_compared ? nlohmann::json(worst) : nlohmann::json(nullptr)},
                       {"max_idle_fraction", most_idle},
                       {"ranks", per_rank}};
  return write_sim_outputs(out_dir, summary, scenario, schedule, r);
}

}  // namespace

const std::vector<Command>& core_commands() {
  static const std::vector<Command> table = {
      {"validate", "check a scenario and print its resolved form",
       "usage: hzp validate SCENARIO [--set PATH=VALUE]...\n\n"
       "Parses SCENARIO strictly (unknown keys, wrong types and invalid sharding are errors naming the JSON\n"
       "path), prints the fully resolved scenario as JSON (presets expanded, every field explicit), builds\n"
       "its schedule and proves it deadlock-free. Exit 0 valid, 2 invalid, 1 internal error.\n" HZP_SCENARIO_INPUT_HELP,
       run_validate},
      {"plan", "compare every preset policy: memory, communication, step time, MFU",
       "usage: hzp plan SCENARIO [--out DIR] [--set PATH=VALUE]...\n"
       "       hzp plan SCENARIO --search [--top K] [--jobs J] [--out DIR] [--max-sim-seconds S] [--max-sim-GiB G]\n"
       "                          [--exact]\n\n"
       "For each preset policy (ddp, zero1, zero2, zero3, hsdp — plus the scenario's own sharding when it is\n"
       "not one of them) on the scenario's model, cluster and training setup: memory per GPU by category,\n"
       "whether it fits, bytes each GPU sends per step, and the analytic step time and MFU. The best is the\n"
       "fastest that fits. --out DIR writes DIR/plan.json (format in README.md).\n\n"
       "--search enumerates every valid (s_p, s_g, s_os) sharding (AMSP rules) x prefetch depth {0,1,2} x\n"
       "overlap on/off, drops what does not fit, ranks the rest with the analytic estimator, simulates the\n"
       "top K (default 8) and every fitting preset in SimGrid, J processes at a time (default: the cores),\n"
       "and writes DIR/plan.json (every simulated candidate with estimated and simulated step time), and\n"
       "DIR/best.json, the fastest simulated candidate as a ready-to-run scenario (DIR defaults to\n"
       "out/<scenario>-plan). Progress goes to stderr. Each simulation estimates its cost first and is refused\n"
       "past its budget, as hzp simulate's: --max-sim-seconds and --max-sim-GiB apply to each of them, and\n"
       "--max-sim-seconds to the analytic search too (estimated from its candidates and ranks, refused past it\n"
       "when that is 10 s or more). --exact simulates every rank and micro-batch of every candidate (hzp\n"
       "simulate --exact).\n\n"
       "When no preset fits, it also says what would: per policy and recomputation setting, the fewest nodes\n"
       "(micro-batch and micro-batches per GPU kept) on which it fits, with its memory per "
       "GPU.\n" HZP_SCENARIO_INPUT_HELP,
       run_plan},
      {"schedule", "dump a rank's schedule IR (ops, streams, groups, pools)",
       "usage: hzp schedule SCENARIO [--rank R|all] [--set PATH=VALUE]...\n\n"
       "Prints the deterministic text form of the schedule the scenario's policy builds for rank R (default\n"
       "0; 'all' prints every rank's groups and every distinct program): streams, buffer pools, process\n"
       "groups, then ops in program order with their stream and dependencies.\n" HZP_SCENARIO_INPUT_HELP,
       run_schedule},
      {"simulate", "simulate a training step on the SimGrid model of the cluster",
       "usage: hzp simulate [SCENARIO] [--out DIR] [--steps N] [--timeline-ranks K] [--timeline-gz] [--exact]\n"
       "                    [--max-sim-seconds S] [--max-sim-GiB G] [--set PATH=VALUE]...\n\n"
       "Runs the scenario's schedule on a SimGrid model of its cluster (NVSwitch or full-mesh nodes, NIC\n"
       "rails, fat-tree) with every collective as flows that share links. SCENARIO defaults to\n"
       "scenarios/default.json. Prints a summary and writes DIR/summary.json and DIR/timeline.json (Chrome /\n"
       "Perfetto trace: one process per GPU, one thread per stream; all GPUs up to K = 64 (by default fewer where\n"
       "64 would record more than 500k op spans), else a sample of\n"
       "node 0 and evenly spaced nodes; above 32 MiB of JSON it is DIR/timeline.json.gz, which Perfetto opens as\n"
       "well: a smaller K samples fewer GPUs; --timeline-gz gzips it at any size). DIR defaults to out/<scenario "
       "name>. --steps N runs N steps back to\n"
       "back (default 1). An out-of-memory scenario is simulated and reported as such (fits_memory "
       "false).\nRanks that run the same program are simulated once, with the flows of every group that may share a\n"
       "link with theirs (sim/symmetry.h); a step of M >= 5 P micro-batches (P: the pipeline's depth, else 1)\n"
       "is simulated as two of 2 P and 3 P run side by side, its steady state extrapolated (sim/steady_state.h;\n"
       "the timeline draws the 3 P). --exact simulates every rank and every micro-batch.\n" HZP_SCENARIO_INPUT_HELP
       "\n" HZP_SIM_BUDGET_HELP,
       run_simulate},
      {"calibrate", "fit compute efficiencies to a one-node measurement (throughput, step time or MFU) or a trace",
       "usage: hzp calibrate SCENARIO (--tokens-per-gpu-s X | --step-time-s X | --mfu X) [--out FILE]\n"
       "                     [--set PATH=VALUE]...\n"
       "       hzp calibrate --trace TRACE [--out FILE]\n\n"
       "SCENARIO describes a run measured on ONE node (cluster.nodes 1, that run's model, micro-batch, global\n"
       "batch and policy); the flag gives its measurement: tokens per GPU per second, seconds per optimizer\n"
       "step, or MFU as a fraction (model FLOPs / (step time x the GPU's peak)). The GEMM and memory-bound\n"
       "efficiencies of cluster.efficiency are scaled by one common factor until the analytic step time of the\n"
       "scenario equals the measurement; the network efficiencies are left alone. Prints the fitted values and\n"
       "the JSON to put in the multi-node scenarios, whose prediction then comes from the schedule and the\n"
       "network model alone. --out FILE writes the resolved scenario with the fitted efficiencies.\n"
       "Exit 2 for a multi-node scenario or a measurement faster than the GPU's peak allows.\n\n"
       "hzp calibrate --trace TRACE [--out FILE] fits the two efficiencies of the trace's own scenario to the\n"
       "times of every compute and optimizer op it recorded (hzp train --trace, hzp import): each op is a point\n"
       "of the roofline t = FLOPs / (peak x gemm) + bytes / (HBM x memory_bound), fitted by least squares on\n"
       "the relative error, then scaled so that the compute per step equals the recorded one (one common\n"
       "factor when the ops do not separate the two). Communication is not used, so a trace of any size will\n"
       "do. --out FILE writes the trace's scenario with the fitted efficiencies.\n" HZP_SCENARIO_INPUT_HELP,
       run_calibrate},
      {"replay", "re-run a recorded trace (hzp train --trace) in the simulator, as recorded or as a what-if",
       "usage: hzp replay TRACE [--out DIR] [--timeline-ranks K] [--max-sim-seconds S] [--max-sim-GiB G]\n"
       "       hzp replay TRACE [--scenario OVERRIDES.json] [--set PATH=VALUE]... [--steps N] [--out DIR]\n"
       "                        [--timeline-ranks K] [--max-sim-seconds S] [--max-sim-GiB G]\n\n"
       "Reads TRACE (traces/README.md, format v1) and rebuilds the schedule from the scenario it recorded.\n"
       "Without --scenario it runs that schedule in the SimGrid executor with the recorded durations: compute\n"
       "and optimizer ops take what the same op took in the same step, each collective its recorded transfer\n"
       "time (last member's arrival to end); no per-GPU spread or overlap slowdown on top (the recorded times\n"
       "hold both). Prints recorded vs replayed step time per rank and writes\n"
       "DIR/summary.json (hzp simulate's plus a \"replay\" object) and DIR/timeline.json (default DIR:\n"
       "out/replay-<scenario name>). A trace that does not match the schedule its scenario rebuilds is an\n"
       "error naming the event.\n\n"
       "With --scenario, a what-if: OVERRIDES.json is merged key by key into the recorded scenario (another\n"
       "cluster, scale, policy, micro-batch or sequence; the strict scenario rules apply to the result), the\n"
       "schedule is rebuilt for it, every compute op runs at the seconds per FLOP its module and phase ran at\n"
       "in the trace (so it scales with the op's FLOPs), the optimizer at the recorded seconds per parameter,\n"
       "and the collectives are simulated on the new cluster. --steps N simulates N steps (default 1). Writes\n"
       "DIR/summary.json (plus a \"what_if\" object) and DIR/timeline.json (default DIR:\n"
       "out/what-if-<scenario name>). --timeline-ranks K records at most K GPUs on the timeline (as hzp\n"
       "simulate's). --set PATH=VALUE (repeatable) is a what-if too, one field at a time\n"
       "(hzp replay TRACE --set cluster.nodes=64), applied to OVERRIDES.json when both are "
       "given.\n\n" HZP_SIM_BUDGET_HELP,
       run_replay},
      {"import", "PyTorch profiler (Kineto) traces in: an hzp trace that hzp replay runs",
       "usage: hzp import KINETO.json[.gz] [KINETO...] --scenario SCENARIO.json [--out TRACE.json]\n"
       "                  [--include-idle] [--no-check] [--set PATH=VALUE]...\n\n"
       "Reads PyTorch profiler Chrome traces (plain or gzipped; one file per rank, ordered by their\n"
       "distributedInfo.rank when recorded, else as given) of the run SCENARIO describes (its model,\n"
       "micro-batch, cluster and policy; as many ranks as files). Steps come from ProfilerStep# ranges, else\n"
       "from forward annotations (record_function(\"forward\"), DistributedDataParallel.forward, ...); GPU\n"
       "kernels, memsets and device copies take the phase (forward, backward, optimizer) of the CPU call that\n"
       "launched them; NCCL kernels and gloo ranges are the collectives, with their sizes. The traces name no\n"
       "modules, so each phase's GPU time is spread over the schedule's ops of that phase in proportion to\n"
       "their roofline times. Collectives match the schedule's one to one when the counts per kind agree, else\n"
       "their recorded time is spread by bytes (a note says so). --include-idle also spreads each phase's GPU\n"
       "idle gaps (a launch-bound run). Prints each file's steps (kernel time, compute per phase, idle,\n"
       "collectives) and writes TRACE.json (traces/README.md, format v1; default out/import-<scenario>.json)\n"
       "for hzp replay, as recorded or as a what-if (--scenario OVERRIDES.json). The traces are checked\n"
       "against SCENARIO first: the GPU they ran on against cluster.gpu, and token routing (gather, scatter\n"
       "and index kernels per layer) against whether the model has MoE layers, and the scenario's compute\n"
       "FLOPs against the recorded times (a model or batch that would make them faster than the GPU's peak is\n"
       "not the one profiled); --no-check skips that. A GPU stream whose events overlap (one CUDA stream runs\n"
       "one kernel at a time) is refused.\n" HZP_SCENARIO_INPUT_HELP,
       run_import},
      {"collective", "simulated nccl-tests: one collective over a range of sizes", collective_help(),
       run_collective_command},
      {"compare", "two scenarios, simulations or plan candidates side by side, with the deltas", kCompareHelp,
       run_compare_command},
  };
  return table;
}

const Command* find_core_command(const std::string& name) {
  for (const Command& c : core_commands())
    if (name == c.name) return &c;
  return nullptr;
}

}  // namespace hzp::cli
