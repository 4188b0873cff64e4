// The planner end to end through the hzp command: its simulated pick against every candidate simulated.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "shared/plan/planner.h"
#include "tests/test_util.h"

using namespace hzp;
using namespace hzp::test;

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
    const std::string cmd = std::string("'") + HZP_BINARY + "' simulate '" + file.string() +
                            "' --timeline-ranks 1 --out '" + out.string() + "' >/dev/null 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    std::ifstream in(out / "summary.json");
    best = std::min(best, nlohmann::json::parse(in)["step_time_s"].get<double>());
  }
  INFO("picked " << picked << " s, best of " << i << " simulated " << best << " s");
  CHECK(picked <= best * 1.02);

  // The same folder searched again where nothing fits: exit 1, a plan.json that says so, and no best.json
  // of the earlier search left for a script to read.
  doc["cluster"]["gpu"] = {{"memory_GiB", 0.001}};
  std::ofstream(dir / "nomem.json") << doc.dump();
  const std::string none_cmd = std::string("'") + HZP_BINARY + "' plan '" + (dir / "nomem.json").string() +
                               "' --search --top 2 --jobs 1 --out '" + (dir / "plan").string() + "' >/dev/null 2>&1";
  const int status = std::system(none_cmd.c_str());
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  std::ifstream none_in(dir / "plan" / "plan.json");
  const nlohmann::json none = nlohmann::json::parse(none_in);
  CHECK(none["best"].is_null());
  CHECK(none["candidates"].empty());
  CHECK(!std::filesystem::exists(dir / "plan" / "best.json"));
  std::filesystem::remove_all(dir);
}
