// The planner: its search space against an independent enumeration of AMSP's rules, the presets as
// points of that space, and — end to end — its simulated pick against every candidate simulated.
#include "test_util.h"

#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "planner.h"
#include "presets.h"

using namespace hzp;
using namespace hzp::test;

namespace {

// AMSP's rules (arXiv 2311.00257 §III) written out once more, independently of presets.cc: s0 | R, s1 | N, fill the node first,
// component-wise p <= g <= os with nesting, g in {p, os}.
bool brief_valid(ShardGroup p, ShardGroup g, ShardGroup os, int R, int N) {
  for (ShardGroup x : {p, g, os}) {
    if (R % x.s0 || N % x.s1) return false;
    if (x.s1 > 1 && x.s0 != R) return false;
  }
  auto nests = [](ShardGroup a, ShardGroup b) { return b.s0 % a.s0 == 0 && b.s1 % a.s1 == 0; };
  return nests(p, g) && nests(g, os) && (g == p || g == os);
}

}  // namespace

TEST_CASE("search space: every sharding the rules allow, and nothing else", "[planner]") {
  for (auto [R, N] : {std::pair{8, 4}, std::pair{16, 16}, std::pair{8, 1}}) {
    std::set<std::tuple<int, int, int, int, int, int>> expected, got;
    for (int a = 1; a <= R; ++a)
      for (int b = 1; b <= N; ++b)
        for (int c = 1; c <= R; ++c)
          for (int d = 1; d <= N; ++d)
            for (int e = 1; e <= R; ++e)
              for (int f = 1; f <= N; ++f)
                if (brief_valid({a, b}, {c, d}, {e, f}, R, N)) expected.insert({a, b, c, d, e, f});
    for (const ShardingSpec& s : valid_shardings(R, N))
      got.insert({s.params.s0, s.params.s1, s.grads.s0, s.grads.s1, s.optimizer.s0, s.optimizer.s1});
    INFO(R << " x " << N);
    CHECK(got == expected);
    CHECK(valid_shardings(R, N).size() == expected.size());  // no duplicates
  }
}

TEST_CASE("search: every fitting preset is a candidate, ranking is by estimated step time", "[planner]") {
  const Scenario s = scenario_from(scenario_json("llama2-7b", "a800", 4, "zero3", 4096, 32 * 2));
  auto result = search_policies(s, SearchOptions{});
  REQUIRE(result.ok());
  const auto& ranked = result->ranked;
  REQUIRE(!ranked.empty());
  for (size_t i = 1; i < ranked.size(); ++i) CHECK(ranked[i - 1].estimate.step_time_s <= ranked[i].estimate.step_time_s);
  for (const char* preset : {"zero1", "zero2", "zero3", "hsdp"}) {
    auto sharding = sharding_preset(preset, 8, 4);
    REQUIRE(sharding.ok());
    const Estimate preset_estimate = *evaluate(*with_policy(s, preset));
    bool found = false;
    for (const SearchCandidate& c : ranked)
      // Any prefetch depth: a deeper one that estimates the same as a shallower one is dropped.
      found = found || (c.scenario.policy.sharding == *sharding && c.scenario.policy.overlap.separate_streams);
    INFO(preset);
    CHECK(found);
    CHECK(ranked.front().estimate.step_time_s <= preset_estimate.step_time_s);
  }
  for (const SearchCandidate& c : ranked) CHECK(c.estimate.fits_memory);
}

TEST_CASE("planner pick, simulated, is within 2 % of every candidate simulated (64 GPUs)", "[planner][sim]") {
  // A small model keeps each simulation short; 8 x 8 A800, 2 micro-batches.
  nlohmann::json doc = scenario_json("llama2-7b", "a800", 8, "zero3", 1024, 64 * 2);
  doc["model"]["layers"] = 4;
  doc["name"] = "planner-64";
  const Scenario s = scenario_from(doc);
  const auto dir = std::filesystem::temp_directory_path() / ("hzp_planner_test_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto scenario_file = dir / "scenario.json";
  std::ofstream(scenario_file) << doc.dump();
  const std::string plan_cmd = std::string("'") + HZP_BINARY + "' plan '" + scenario_file.string() +
                               "' --search --top 8 --jobs 2 --out '" + (dir / "plan").string() + "' >/dev/null 2>&1";
  REQUIRE(std::system(plan_cmd.c_str()) == 0);
  std::ifstream plan_in(dir / "plan" / "plan.json");
  const nlohmann::json plan = nlohmann::json::parse(plan_in);
  double picked = -1;
  for (const auto& c : plan["candidates"])
    if (c["rank"] == plan["best"]) picked = c["simulated_step_time_s"].get<double>();
  REQUIRE(picked > 0);
  REQUIRE(std::filesystem::exists(dir / "plan" / "best.json"));

  // Every candidate of the search, simulated, each in its own process.
  auto result = search_policies(s, SearchOptions{});
  REQUIRE(result.ok());
  double best = 1e30;
  int i = 0;
  for (const SearchCandidate& c : result->ranked) {
    const auto file = dir / ("c" + std::to_string(i) + ".json");
    const auto out = dir / ("c" + std::to_string(i++));
    std::ofstream(file) << scenario_to_json(c.scenario).dump();
    const std::string cmd = std::string("'") + HZP_BINARY + "' simulate '" + file.string() + "' --timeline-ranks 1 --out '" +
                            out.string() + "' >/dev/null 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::ifstream in(out / "summary.json");
    best = std::min(best, nlohmann::json::parse(in)["step_time_s"].get<double>());
  }
  INFO("picked " << picked << " s, best of " << i << " simulated " << best << " s");
  CHECK(picked <= best * 1.02);
  std::filesystem::remove_all(dir);
}
