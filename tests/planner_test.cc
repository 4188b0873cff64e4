// The planner: its search space against an independent enumeration of AMSP's rules, the presets as
// points of that space, and — end to end — its simulated pick against every candidate simulated.
#include "tests/test_util.h"

#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "shared/plan/planner.h"
#include "shared/scenario/presets.h"

using namespace hzp;
using namespace hzp::test;

namespace {

// AMSP's rules (arXiv 2311.00257 §III) written out once more, independently of presets.cc: s0 | R, s1 | N, fill the
// node first, component-wise p <= g <= os with nesting, g in {p, os}.
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
  for (size_t i = 1; i < ranked.size(); ++i)
    CHECK(ranked[i - 1].estimate.step_time_s <= ranked[i].estimate.step_time_s);
  for (Policy preset : {Policy::kZero1, Policy::kZero2, Policy::kZero3, Policy::kHsdp}) {
    auto sharding = sharding_preset(preset, 8, 4);
    REQUIRE(sharding.ok());
    const Estimate preset_estimate = *evaluate(*with_policy(s, preset));
    bool found = false;
    for (const SearchCandidate& c : ranked)
      // Any prefetch depth: a deeper one that estimates the same as a shallower one is dropped.
      found = found || (c.scenario.policy.sharding == *sharding && c.scenario.policy.overlap.separate_streams);
    INFO(to_string(preset));
    CHECK(found);
    CHECK(ranked.front().estimate.step_time_s <= preset_estimate.step_time_s);
  }
  for (const SearchCandidate& c : ranked) CHECK(c.estimate.fits_memory);
}

TEST_CASE("the ND search takes the least recomputation that fits and accounts for every combination", "[planner][nd]") {
  // LLaMA-2 70B on 2 nodes of 8 A100-80GB: data parallelism alone (ZeRO-1) cannot hold its 70 B parameters'
  // replicated bf16 weights and gradients (280 GB); tensor and pipeline parallelism can.
  const Scenario s = scenario_from(scenario_json("llama2-70b", "dgx-a100", 2, "zero1", 4096, 32));
  NdSearchOptions options;
  options.micro_batches = {1, 2};
  auto found = search_nd(s, options);
  REQUIRE(found.ok());
  const SearchResult& r = *found;
  CHECK(r.candidates == r.rejected_memory + r.rejected_invalid + static_cast<long long>(r.ranked.size()));
  REQUIRE_FALSE(r.ranked.empty());
  for (std::size_t i = 0; i < r.ranked.size(); ++i) {
    const SearchCandidate& c = r.ranked[i];
    INFO(describe_nd(c.scenario));
    CHECK(c.estimate.fits_memory);
    CHECK(c.scenario.policy.preset == Policy::kZero1);
    if (i > 0) CHECK(c.estimate.step_time_s >= r.ranked[i - 1].estimate.step_time_s);
    // Less recomputation would not have fitted.
    if (c.scenario.training.recompute != Recompute::kNone) {
      Scenario less = c.scenario;
      less.training.recompute = Recompute::kNone;
      CHECK_FALSE(estimate_of(build(less)).fits_memory);
    }
  }
  const ParallelSpec& best = r.ranked.front().scenario.policy.parallel;
  CHECK(best.tensor * best.pipeline > 1);
}

TEST_CASE("the ND search tries context parallelism for long sequences only", "[planner][nd]") {
  NdSearchOptions options;
  options.micro_batches = {1};
  options.max_pipeline = 1;
  for (long long seq : {4096LL, 32768LL}) {
    INFO("seq_len " << seq);
    const Scenario s = scenario_from(scenario_json("llama2-7b", "dgx-a100", 2, "zero1", seq, 16));
    auto found = search_nd(s, options);
    REQUIRE(found.ok());
    int max_context = 1;
    for (const SearchCandidate& c : found->ranked) {
      const int cp = c.scenario.policy.parallel.context;
      CHECK(seq / cp >= options.min_context_tokens);
      if (cp > 1) CHECK(describe_nd(c.scenario).find("context " + std::to_string(cp)) != std::string::npos);
      max_context = std::max(max_context, cp);
    }
    CHECK(max_context == (seq == 4096 ? 1 : 8));  // 32768 / 8 = 4096 tokens per GPU
  }
}
