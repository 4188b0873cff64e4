// `hzp plan --search`: enumerate, rank analytically, simulate the top K (and the presets) in parallel
// SimGrid processes, and pick the fastest simulated candidate.
#include "tools/cli_search.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include <nlohmann/json.hpp>

#include "shared/base/files.h"
#include "shared/base/text.h"
#include "shared/compile/compile.h"
#include "shared/plan/plan.h"
#include "shared/plan/planner.h"
#include "shared/policy/policy_registry.h"
#include "shared/scenario/scenario_parser.h"
#include "shared/schedule/sharding.h"
#include "tools/cli.h"
#include "tools/cli_progress.h"

namespace hzp::cli {
namespace {

namespace fs = std::filesystem;

// Where a simulated candidate comes from: the sharding search (rank = its analytic rank), the ND search,
// or a preset for comparison.
enum class Origin { kSearch, kNd, kPreset };

struct Simulation {
  Origin origin = Origin::kPreset;
  int rank = 0;  // 1-based analytic rank in its search
  Scenario scenario;
  Estimate estimate;
  double simulated_step_s = -1;
  double simulated_mfu = 0;
  bool simulated_fits = false;
  std::string error = {};  // why the simulation failed; empty when it ran
  bool refused = false;    // it exited 2: refused past its budget (or its input)
};

// "#3" (the sharding search's third), "nd#1", or the preset's name.
std::string label(const Simulation& sim) {
  switch (sim.origin) {
    case Origin::kSearch:
      return "#" + std::to_string(sim.rank);
    case Origin::kNd:
      return "nd#" + std::to_string(sim.rank);
    case Origin::kPreset:
      break;
  }
  return to_string(sim.scenario.policy.preset);
}

std::string describe(const Scenario& s) {
  // An ND candidate: its mesh, micro-batch and recomputation say more than its data-axis sharding.
  if (s.mesh.tensor > 1 || s.mesh.pipeline > 1 || s.mesh.context > 1) return describe_nd(s);
  return sharding_notation(s.policy.sharding) + " prefetch " + std::to_string(s.policy.overlap.prefetch_depth) +
         (s.policy.overlap.separate_streams ? "" : " one-stream") + " mb " + std::to_string(s.training.micro_batch) +
         " rc " + to_string(s.training.recompute);
}

// The candidate's folder: what it holds, e.g. "03-P8x1-G8x4-OS8x4-pf1" (searched, analytic rank 3) or
// "zero3-P8x8-G8x8-OS8x8-pf1" (a preset).
std::string folder_name(const Simulation& sim) {
  const ShardingSpec& g = sim.scenario.policy.sharding;
  char buf[160];
  const ParallelSpec& par = sim.scenario.policy.parallel;
  std::snprintf(buf, sizeof buf, "P%dx%d-G%dx%d-OS%dx%d-pf%d%s-t%dp%dv%d%sc%d%s-mb%lld", g.params.s0, g.params.s1,
                g.grads.s0, g.grads.s1, g.optimizer.s0, g.optimizer.s1, sim.scenario.policy.overlap.prefetch_depth,
                sim.scenario.policy.overlap.separate_streams ? "" : "-onestream", par.tensor, par.pipeline,
                par.virtual_stages, par.sequence_parallel ? "sp" : "", par.context,
                par.context_comm == ContextComm::kAllToAll ? "a2a" : "",
                static_cast<long long>(sim.scenario.training.micro_batch));
  char rank[16];
  std::snprintf(rank, sizeof rank, "%02d", sim.rank);
  return safe_file_name((sim.origin == Origin::kSearch ? std::string(rank) : label(sim)) + "-" + buf);
}

// Runs `hzp simulate` for every entry, `jobs` processes at a time; one SimGrid engine per process.
void simulate_all(std::vector<Simulation>& sims, int jobs, const fs::path& dir, const std::vector<std::string>& flags) {
  std::vector<ChildSimulation> runs;
  for (Simulation& sim : sims) {
    const fs::path out = dir / folder_name(sim);
    std::error_code ec;
    fs::create_directories(out, ec);
    runs.push_back({sim.scenario, out, {}});
  }
  const auto started = std::chrono::steady_clock::now();
  std::size_t finished = 0;
  simulate_in_children(
      runs, jobs,
      [&](std::size_t i) {
        Simulation& sim = sims[i];
        ++finished;
        if (!runs[i].error.empty()) {
          sim.error = runs[i].error;
          sim.refused = runs[i].refused;
        } else {
          std::ifstream in(runs[i].out / "summary.json");
          const nlohmann::json summary = nlohmann::json::parse(in, nullptr, false);
          if (summary.is_discarded()) {
            sim.error = "unreadable summary.json";
          } else {
            sim.simulated_step_s = summary.value("step_time_s", -1.0);
            sim.simulated_mfu = summary.value("mfu", 0.0);
            sim.simulated_fits = summary.value("fits_memory", false);
          }
        }
        // A line per simulation (each takes seconds to minutes), on a terminal and in a log file alike.
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
        const std::string eta = finished < sims.size()
                                    ? ", ETA " + clock_text(elapsed / static_cast<double>(finished) *
                                                            static_cast<double>(sims.size() - finished))
                                    : "";
        std::fprintf(stderr, "plan: simulated %zu/%zu (%s), elapsed %s%s\n", finished, sims.size(), label(sim).c_str(),
                     clock_text(elapsed).c_str(), eta.c_str());
      },
      flags);
}

nlohmann::json sharding_json(const ShardingSpec& s) {
  auto g = [](ShardGroup x) { return nlohmann::json::array({x.s0, x.s1}); };
  return {{"params", g(s.params)}, {"grads", g(s.grads)}, {"optimizer", g(s.optimizer)}};
}

// Both searches' results, as ranked.
struct Searches {
  SearchResult zero;  // the sharding search under every micro-batch and recomputation setting
  SearchResult nd;    // the ND search
  double zero_s = 0, nd_s = 0;
};

std::string list_of(const std::vector<long long>& values) {
  std::string list;
  for (long long v : values) list += (list.empty() ? "" : "/") + std::to_string(v);
  return list;
}

// Seconds the sharding search spends per candidate and rank (compile and estimate), measured with
// `hzp plan scenarios/dense/llama2-7b-a800-64-zero3.json --search --set cluster.nodes=2048 ...` on the
// 2-core development machine: 4050 candidates x 16,384 ranks in 28 s.
constexpr double kSearchSecondsPerRankCandidate = 0.42e-6;

// The sharding search's time on the reference machine: each candidate is estimated over every rank's groups,
// so it grows with candidates x ranks (at 131,072 GPUs, minutes).
double sharding_search_seconds(const Scenario& scenario, long long candidates) {
  return kSearchSecondsPerRankCandidate * static_cast<double>(candidates) * scenario.cluster.world_size();
}

// Runs both analytic searches and prints what each considered; kInvalidInput etc. as the search says.
Result<Searches> search_both(const Scenario& scenario, int top_k) {
  Searches out;
  const SearchOptions options;
  const NdSearchOptions nd_options;
  auto t0 = std::chrono::steady_clock::now();
  // Say how long before the first candidate when that is more than a moment.
  ProgressLine searched("plan: estimated", "sharding candidates");
  const auto report = [&](long long done, long long total) {
    const double about = sharding_search_seconds(scenario, total);
    if (done == 0 && about >= 10)
      std::fprintf(stderr,
                   "plan: estimating %lld sharding candidates over %d ranks, about %s on a 2-core machine, then the "
                   "ND plans\n",
                   total, scenario.cluster.world_size(), clock_text(about).c_str());
    searched.update(done, total);
  };
  HZP_ASSIGN_OR_RETURN(out.zero, search_policies_and_training(scenario, options, nd_options.micro_batches, report));
  out.zero_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const SearchResult& r = out.zero;
  std::printf(
      "search: %lld candidates (%zu shardings x %zu prefetch depths x %zu stream settings, under every micro-batch "
      "of %s and recomputation that the batch allows): %lld do not fit in "
      "memory, %lld are invalid, %lld fold into an equivalent plan (another prefetch or recomputation of the same "
      "groups, streams and micro-batch within 0.1 %%), %zu ranked by the analytic "
      "estimator in %.3f s\n",
      r.candidates, r.shardings, options.prefetch_depths.size(), options.separate_streams.size(),
      list_of(nd_options.micro_batches).c_str(), r.rejected_memory, r.rejected_invalid, r.redundant, r.ranked.size(),
      out.zero_s);
  std::printf("%s\n", kShardingLegend);

  // ND parallelism (Megatron-style), searched with micro-batch and recomputation; the best is simulated
  // next to the ZeRO family's candidates.
  t0 = std::chrono::steady_clock::now();
  ProgressLine estimated("plan: estimated", "ND candidates");
  HZP_ASSIGN_OR_RETURN(out.nd, search_nd(scenario, nd_options, [&estimated](long long done, long long total) {
                         estimated.update(done, total);
                       }));
  out.nd_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const SearchResult& nd = out.nd;
  std::printf(
      "ND search: %lld candidates (tensor x pipeline x virtual stages x sequence parallel x context x micro-batch, "
      "each with "
      "the least recomputation that fits, ZeRO-1 on the data axis): %lld do not fit even with full recomputation, %lld "
      "are "
      "invalid, %zu ranked in %.3f s\n",
      nd.candidates, nd.rejected_memory, nd.rejected_invalid, nd.ranked.size(), out.nd_s);
  for (size_t i = 0; i < nd.ranked.size() && static_cast<int>(i) < top_k; ++i)
    std::printf("  nd#%-3zu %-80s est %.4f s, MFU %.1f%%, %.1f GiB\n", i + 1,
                describe_nd(nd.ranked[i].scenario).c_str(), nd.ranked[i].estimate.step_time_s,
                100 * nd.ranked[i].estimate.mfu, nd.ranked[i].estimate.memory.total() / (1024.0 * 1024 * 1024));
  return out;
}

// The top K searched candidates, the best ND plan, then every preset that fits, for comparison.
std::vector<Simulation> to_simulate(const Scenario& scenario, const Searches& found, int top_k) {
  std::vector<Simulation> sims;
  for (size_t i = 0; i < found.zero.ranked.size() && static_cast<int>(i) < top_k; ++i)
    sims.push_back(
        {Origin::kSearch, static_cast<int>(i + 1), found.zero.ranked[i].scenario, found.zero.ranked[i].estimate});
  if (!found.nd.ranked.empty())
    sims.push_back({.origin = Origin::kNd,
                    .rank = 1,
                    .scenario = found.nd.ranked[0].scenario,
                    .estimate = found.nd.ranked[0].estimate});
  for (const PolicyEntry& entry : policy_registry()) {
    if (!entry.in_plan) continue;
    auto variant = with_policy(scenario, entry.id);
    if (!variant.ok()) continue;
    auto est = evaluate(*variant);
    if (!est.ok() || !est->fits_memory) continue;
    sims.push_back({.origin = Origin::kPreset, .scenario = *variant, .estimate = *est});
  }
  return sims;
}

int tier(const Simulation& s) {
  return !s.error.empty() ? 2 : s.simulated_fits ? 0 : 1;
}

// Ranked by simulated step time: what ran and fits first, then what does not fit in memory (its speed is
// moot), then what failed. The presets are points of the search space too: the pick is the fastest
// simulated candidate that fits, so it is never slower than a preset that fits.
std::vector<size_t> simulated_order(const std::vector<Simulation>& sims) {
  std::vector<size_t> order(sims.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (tier(sims[a]) != tier(sims[b])) return tier(sims[a]) < tier(sims[b]);
    return sims[a].simulated_step_s < sims[b].simulated_step_s;
  });
  return order;
}

// The table of simulated candidates, and the comparison AsyncHZP's claim is about: the best ND plan
// against the best ZeRO-family plan, simulated.
void print_simulated(const std::vector<Simulation>& sims, const std::vector<size_t>& order, int best) {
  std::printf("\n%-8s %-60s %10s %10s %8s %s\n", "analytic", "policy (mb: micro-batch, rc: recompute)", "est s",
              "sim s", "MFU", "");
  for (size_t i : order) {
    const Simulation& s = sims[i];
    char simulated[32] = "failed", mfu[32] = "";
    if (s.error.empty()) {
      std::snprintf(simulated, sizeof simulated, s.simulated_fits ? "%.4f" : "(%.4f)", s.simulated_step_s);
      std::snprintf(mfu, sizeof mfu, s.simulated_fits ? "%.1f%%" : "(%.1f%%)", 100 * s.simulated_mfu);
    }
    const std::string note = static_cast<int>(i) == best ? "<- best"
                             : !s.error.empty()          ? s.error
                             : !s.simulated_fits         ? "NOT RUNNABLE: does not fit in memory when simulated"
                                                         : "";
    std::printf("%-8s %-60s %10.4f %10s %8s %s\n", label(s).c_str(), describe(s.scenario).c_str(),
                s.estimate.step_time_s, simulated, mfu, note.c_str());
  }
  int best_nd = -1, best_zero = -1;
  for (size_t i : order) {
    if (tier(sims[i]) != 0) continue;
    int& slot = sims[i].origin == Origin::kNd ? best_nd : best_zero;
    if (slot < 0) slot = static_cast<int>(i);
  }
  if (best_nd >= 0 && best_zero >= 0)
    std::printf(
        "best ND plan %s (%s): %.4f s; best ZeRO-family plan %s (%s): %.4f s; ND / ZeRO-family step time %.2fx\n",
        label(sims[best_nd]).c_str(), describe(sims[best_nd].scenario).c_str(), sims[best_nd].simulated_step_s,
        label(sims[best_zero]).c_str(), describe(sims[best_zero].scenario).c_str(), sims[best_zero].simulated_step_s,
        sims[best_nd].simulated_step_s / sims[best_zero].simulated_step_s);
}

nlohmann::json candidate_json(const Simulation& s) {
  const MemoryBreakdown& m = s.estimate.memory;
  return {{"policy", to_string(s.scenario.policy.preset)},
          {"rank", label(s)},
          {"folder", (fs::path("candidates") / folder_name(s)).string()},
          {"sharding", sharding_json(s.scenario.policy.sharding)},
          {"parallel", parallel_to_json(s.scenario.policy.parallel)},
          {"micro_batch", s.scenario.training.micro_batch},
          {"recompute", to_string(s.scenario.training.recompute)},
          {"overlap",
           {{"prefetch_depth", s.scenario.policy.overlap.prefetch_depth},
            {"separate_streams", s.scenario.policy.overlap.separate_streams}}},
          {"memory_bytes_per_gpu",
           {{"params", m.params},
            {"grads", m.grads},
            {"optimizer", m.optimizer},
            {"activations", m.activations},
            {"buffers", m.buffers},
            {"total", m.total()}}},
          {"comm_bytes_per_gpu", s.estimate.comm_bytes_per_gpu},
          {"estimated_step_time_s", s.estimate.step_time_s},
          {"estimated_mfu", s.estimate.mfu},
          {"fits_memory", s.estimate.fits_memory},
          {"simulated_step_time_s", s.error.empty() ? nlohmann::json(s.simulated_step_s) : nlohmann::json()},
          {"simulated_mfu", s.simulated_mfu},
          {"simulated_fits_memory", s.error.empty() ? nlohmann::json(s.simulated_fits) : nlohmann::json()},
          {"error", s.error}};
}

// plan.json (README.md documents it).
nlohmann::json plan_json(const Scenario& scenario, const Searches& found, const std::vector<Simulation>& sims,
                         const std::vector<size_t>& order, int best, int jobs, double sim_s) {
  nlohmann::json candidates = nlohmann::json::array();
  for (size_t i : order) candidates.push_back(candidate_json(sims[i]));
  const SearchResult &r = found.zero, &nd = found.nd;
  return {{"scenario", scenario.name},
          {"gpus", scenario.cluster.world_size()},
          {"search",
           {{"candidates", r.candidates},
            {"estimated", r.estimated},
            {"rejected_memory", r.rejected_memory},
            {"rejected_invalid", r.rejected_invalid},
            {"redundant", r.redundant},
            {"ranked", r.ranked.size()},
            {"analytic_ranking_s", found.zero_s},
            {"simulated", sims.size()},
            {"simulation_wall_s", sim_s},
            {"jobs", jobs}}},
          {"nd_search",
           {{"candidates", nd.candidates},
            {"estimated", nd.estimated},
            {"rejected_memory", nd.rejected_memory},
            {"rejected_invalid", nd.rejected_invalid},
            {"ranked", nd.ranked.size()},
            {"best", nd.ranked.empty() ? nlohmann::json() : nlohmann::json(describe_nd(nd.ranked[0].scenario))},
            {"best_estimated_step_time_s",
             nd.ranked.empty() ? nlohmann::json() : nlohmann::json(nd.ranked[0].estimate.step_time_s)}}},
          {"candidates", candidates},
          {"best", best >= 0 ? nlohmann::json(label(sims[best])) : nlohmann::json()}};
}

}  // namespace

namespace {

// Removes the candidate folders an earlier search left in `dir`: only those its plan.json (beside `dir`) names,
// and of those only the ones holding nothing but what a candidate's simulation writes (a link, or a folder with
// anything else, is left alone). The eighth attack of issue 35 found a second search beside the first's eight
// stale candidates; the tenth, a user's folder there removed because it looked like one.
void remove_earlier_candidates(const fs::path& dir) {
  static const std::set<std::string> ours = {"scenario.json",    "summary.json", "timeline.json",
                                             "timeline.json.gz", "stdout.txt",   "stderr.txt"};
  auto text = read_text_file((dir.parent_path() / "plan.json").string(), 64 << 20, Links::kNoLinks);
  if (!text.ok()) return;  // no earlier plan: nothing of ours to remove
  const nlohmann::json earlier = nlohmann::json::parse(*text, nullptr, false);
  if (!earlier.is_object() || !earlier.contains("candidates") || !earlier["candidates"].is_array()) return;
  std::vector<fs::path> stale;
  for (const nlohmann::json& c : earlier["candidates"]) {
    if (!c.is_object() || !c.contains("folder") || !c["folder"].is_string()) continue;
    const fs::path folder = c["folder"].get<std::string>();  // "candidates/NAME", as plan_json writes it
    if (folder.parent_path() != "candidates" || folder.filename() != safe_file_name(folder.filename().string()))
      continue;
    const fs::path p = dir / folder.filename();
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(p, ec)) || !fs::is_directory(p, ec)) continue;
    bool only_ours = true;
    std::error_code inner;  // its own: a folder that cannot be read is left alone, the others still looked at
    for (fs::directory_iterator f(p, inner), end; !inner && f != end; f.increment(inner))
      if (f->is_symlink(inner) || !f->is_regular_file(inner) || ours.count(f->path().filename().string()) == 0)
        only_ours = false;
    if (only_ours && !inner) stale.push_back(p);
  }
  std::error_code ec;
  for (const fs::path& p : stale) fs::remove_all(p, ec);
}

}  // namespace

int run_plan_search(const Scenario& scenario, int top_k, int jobs, const std::string& out_dir,
                    const std::vector<std::string>& budget_flags, double max_search_seconds) {
  // The search's own cost, before it starts (issue 35's eighth attack: at 100,000 GPUs and more it ran for
  // minutes past a --max-sim-seconds of 10). One estimated under 10 s always runs: the budget is for searches
  // that take minutes, not for the seconds the per-candidate constant cannot resolve.
  const long long candidates = search_candidate_count(scenario, SearchOptions{}, NdSearchOptions{}.micro_batches);
  if (const double about = sharding_search_seconds(scenario, candidates);
      max_search_seconds > 0 && about > std::max(max_search_seconds, 10.0)) {
    std::fprintf(stderr,
                 "hzp: error: plan --search would estimate %lld sharding candidates over %d ranks, about %s on a "
                 "2-core machine, past the budget of %g s (--max-sim-seconds; raise it, or 0 for no limit)\n",
                 candidates, scenario.cluster.world_size(), clock_text(about).c_str(), max_search_seconds);
    return 2;
  }
  // Where results go is checked before any work: a run that cannot write its plan is refused up front. The
  // candidates' folder is hzp's: a link there would take the candidates (and the clean-up) elsewhere.
  const fs::path dir = fs::path(out_dir) / "candidates";
  if (std::error_code ec; fs::is_symlink(fs::symlink_status(dir, ec))) {
    std::fprintf(stderr,
                 "hzp: error: --out: %s is a symbolic link; the search writes its candidates there and "
                 "does not follow links (remove it or choose another --out)\n",
                 printable(dir.string(), 200).c_str());
    return 2;
  }
  if (Status st = ensure_writable_dir(dir.string(), "--out"); !st.ok()) {
    std::fprintf(stderr, "hzp: error: %s\n", st.message().c_str());
    return 2;
  }
  // Progress on stderr: rewritten in place on a terminal, plain lines every few seconds in a log file.
  auto found = search_both(scenario, top_k);
  if (!found.ok()) {
    std::fprintf(stderr, "hzp: error: %s\n", found.status().message().c_str());
    return found.status().code() == StatusCode::kInvalidInput ? 2 : 1;
  }
  // A best.json of an earlier search in the same folder must not outlive this one's plan.json, nor its
  // candidates' folders, which `hzp compare DIR/candidates/NAME` would read as this search's.
  std::error_code ignored;
  fs::remove(fs::path(out_dir) / "best.json", ignored);
  remove_earlier_candidates(dir);
  const bool none_fit = found->zero.ranked.empty() && found->nd.ranked.empty();
  if (none_fit)
    std::printf("no sharding fits in %.1f GiB per GPU\n", scenario.cluster.gpu.memory_bytes / (1024.0 * 1024 * 1024));
  std::vector<Simulation> sims = none_fit ? std::vector<Simulation>{} : to_simulate(scenario, *found, top_k);
  const auto t1 = std::chrono::steady_clock::now();
  if (!sims.empty())  // each simulation takes seconds to minutes: say what comes before the first one ends
    std::fprintf(stderr,
                 "plan: simulating %zu candidates, %d at a time; each estimates its cost first and is refused past "
                 "its budget (--max-sim-seconds, default 600 s; its estimate: %s/<candidate>/stderr.txt)\n",
                 sims.size(), jobs, dir.c_str());
  simulate_all(sims, jobs, dir, budget_flags);
  const double sim_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  const std::vector<size_t> order = simulated_order(sims);
  const int best = !order.empty() && tier(sims[order.front()]) == 0 ? static_cast<int>(order.front()) : -1;
  if (!none_fit) {
    print_simulated(sims, order, best);
    std::printf("simulated %zu scenarios with %d parallel processes in %.1f s; each in %s/<candidate>/\n", sims.size(),
                jobs, sim_s, dir.c_str());
  }

  const nlohmann::json plan = plan_json(scenario, *found, sims, order, best, jobs, sim_s);
  if (Status st = write_file_atomic((fs::path(out_dir) / "plan.json").string(), plan.dump(2) + "\n"); !st.ok()) {
    std::fprintf(stderr, "hzp: error: %s\n", st.message().c_str());
    return 2;
  }
  if (best < 0) {  // exit 1, as a search that finds nothing runnable; plan.json says what was tried
    const bool none_ran =
        !none_fit && std::all_of(sims.begin(), sims.end(), [](const Simulation& s) { return !s.error.empty(); });
    // Every candidate refused past the budget the user set: exit 2, as compare does for the same refusal.
    const bool all_refused =
        none_ran && std::all_of(sims.begin(), sims.end(), [](const Simulation& s) { return s.refused; });
    if (all_refused) {
      std::fprintf(stderr,
                   "hzp: error: every candidate's simulation was refused past its budget (--max-sim-seconds / "
                   "--max-sim-GiB; each one's estimate is above); wrote %s/plan.json\n",
                   out_dir.c_str());
      return 2;
    }
    if (none_ran)
      std::printf("wrote %s/plan.json; no candidate could be simulated (each one's error is above)\n", out_dir.c_str());
    else
      std::printf("wrote %s/plan.json; no %s candidate fits in memory\n", out_dir.c_str(),
                  none_fit ? "estimated" : "simulated");
    return 1;
  }
  nlohmann::json winner = scenario_to_json(sims[best].scenario);
  winner["name"] = scenario.name + "-best";
  if (Status st = write_file_atomic((fs::path(out_dir) / "best.json").string(), winner.dump(2) + "\n"); !st.ok()) {
    std::fprintf(stderr, "hzp: error: %s\n", st.message().c_str());
    return 2;
  }
  std::printf("wrote %s/plan.json and %s/best.json (%s)\n", out_dir.c_str(), out_dir.c_str(),
              describe(sims[best].scenario).c_str());
  return 0;
}

namespace {

// The last non-empty line of a child's stderr (its refusal or error), at most 400 characters; "" if none.
std::string last_line(const fs::path& path) {
  auto text = read_text_file(path.string(), 1 << 20);
  if (!text.ok()) return "";
  std::string t = *text;
  while (!t.empty() && (t.back() == '\n' || t.back() == '\r')) t.pop_back();
  const std::size_t nl = t.rfind('\n');
  std::string line = nl == std::string::npos ? t : t.substr(nl + 1);
  return line.size() > 400 ? line.substr(0, 400) + "..." : line;
}

}  // namespace

void simulate_in_children(std::vector<ChildSimulation>& runs, int jobs, const std::function<void(std::size_t)>& done,
                          const std::vector<std::string>& flags) {
  std::map<pid_t, std::size_t> running;
  auto reap_one = [&] {
    int status = 0;
    const pid_t pid = waitpid(-1, &status, 0);
    auto it = running.find(pid);
    if (it == running.end()) return;
    const std::size_t i = it->second;
    running.erase(it);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !fs::exists(runs[i].out / "summary.json")) {
      const std::string why = last_line(runs[i].out / "stderr.txt");
      runs[i].refused = WIFEXITED(status) && WEXITSTATUS(status) == 2;
      runs[i].error = std::string(runs[i].refused ? "simulation refused" : "simulation failed") + " (" +
                      (runs[i].out / "stderr.txt").string() + ")" + (why.empty() ? "" : ": " + why);
    }
    if (done) done(i);
  };
  for (std::size_t next = 0; next < runs.size(); ++next) {
    while (static_cast<int>(running.size()) >= jobs) reap_one();
    ChildSimulation& run = runs[next];
    // A simulation's folder is named by hzp inside --out: one that is a symlink would take its files, and
    // the earlier files they replace, out of --out (the ninth attack of issue 35). Refused, not followed.
    if (std::error_code ec; fs::is_symlink(fs::symlink_status(run.out, ec))) {
      run.refused = true;
      run.error = printable(run.out.string(), 200) +
                  " is a symlink: hzp writes a simulation's files only into a folder of its own (remove the link)";
      if (done) done(next);
      continue;
    }
    const fs::path file = run.out / "scenario.json";
    if (Status st = write_file_atomic(file.string(), scenario_to_json(run.scenario).dump(2) + "\n"); !st.ok()) {
      run.error = st.message();
      if (done) done(next);
      continue;
    }
    const std::string stdout_path = (run.out / "stdout.txt").string(), stderr_path = (run.out / "stderr.txt").string();
    // New files, never through what a folder left over from an earlier run holds there (a link, a FIFO).
    for (const std::string& path : {stdout_path, stderr_path}) ::unlink(path.c_str());
    std::vector<std::string> args = {file.string(), "--out", run.out.string(), "--timeline-ranks", "8"};
    args.insert(args.end(), flags.begin(), flags.end());
    // `hzp simulate` in a forked child (SimGrid allows one engine per process; this one has none): the same
    // code as the binary's command without executing the binary again, so it runs where the process is not
    // hzp (the Python module's plan(search=True)).
    std::fflush(nullptr);  // nothing buffered here is written twice
    const pid_t pid = ::fork();
    if (pid == 0) {
      constexpr int kNew = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
      const int out = ::open(stdout_path.c_str(), kNew, 0644), err = ::open(stderr_path.c_str(), kNew, 0644);
      if (out < 0 || err < 0 || ::dup2(out, STDOUT_FILENO) < 0 || ::dup2(err, STDERR_FILENO) < 0) ::_exit(1);
      int rc = 1;
      try {
        const Command* simulate = find_core_command("simulate");
        rc = simulate == nullptr ? 1 : simulate->run(args);
      } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "hzp: error: out of memory: the simulation needs more than this process may use\n");
        rc = 2;
      }
      std::fflush(nullptr);
      ::_exit(rc);
    }
    if (pid > 0) {
      running[pid] = next;
    } else {
      run.error = std::string("could not fork a simulation: ") + std::strerror(errno);
      if (done) done(next);
    }
  }
  while (!running.empty()) reap_one();
}

}  // namespace hzp::cli
