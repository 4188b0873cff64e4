// The planner: its search space against an independent enumeration of AMSP's rules, the presets as
// points of that space, and — end to end — its simulated pick against every candidate simulated.
#include "tests/test_util.h"

#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "shared/compile/compile.h"
#include "shared/plan/plan.h"
#include "shared/plan/planner.h"
#include "shared/scenario/pipeline_split.h"
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
    CHECK(ranked[i - 1].estimate.step_time_s <= ranked[i].estimate.step_time_s * (1 + kEstimateTie));  // ties: memory
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
    if (i > 0) CHECK(c.estimate.step_time_s * (1 + kEstimateTie) >= r.ranked[i - 1].estimate.step_time_s);
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

TEST_CASE("the ND search splits layers unevenly where the stages cannot hold them evenly", "[planner][nd]") {
  // 30 layers: 4 stages cannot hold them evenly; the embedding and loss counted make 32 (8 per stage, 7 in
  // the first and last), and 8 per middle stage leaves 14 for the ends (7 + 7).
  std::vector<ParallelSpec> splits = layer_splits(30, 4, 1);
  REQUIRE(splits.size() == 2);
  CHECK(chunk_layers(30, splits[0]).value() == std::vector<int>{7, 8, 8, 7});
  CHECK(splits[0].account_for_embedding_in_split);
  CHECK(chunk_layers(30, splits[1]).value() == std::vector<int>{7, 8, 8, 7});
  CHECK(splits[1].layers_in_first_stage == 7);
  CHECK(layer_splits(32, 4, 2).size() == 1);  // the even split only
  CHECK(layer_splits(31, 2, 1).size() == 1);  // 33 does not split in two: the embedding alone
  CHECK(layer_splits(31, 2, 1)[0].account_for_embedding_in_split);
  CHECK_FALSE(layer_splits(31, 2, 1)[0].account_for_loss_in_split);
  // 26 layers of LLaMA-2 7B's width over 2 nodes: pipeline 4 is searched, as the embedding and loss counted
  // (28 / 4 = 7) and as 6 + 7 + 7 + 6.
  nlohmann::json doc = scenario_json("llama2-7b", "dgx-a100", 2, "zero1", 4096, 32);
  doc["model"]["layers"] = 26;
  const Scenario s = scenario_from(doc);
  NdSearchOptions options;
  options.micro_batches = {1};
  options.max_virtual_stages = 1;
  auto found = search_nd(s, options);
  REQUIRE(found.ok());
  std::set<std::string> uneven;
  for (const SearchCandidate& c : found->ranked)
    if (c.scenario.policy.parallel.pipeline == 4 && c.scenario.policy.parallel.tensor == 1)
      uneven.insert(describe_nd(c.scenario));
  CHECK(uneven ==
        std::set<std::string>{
            "tensor 1 x pipeline 4 with 6 + 6 layers in the first + last stage, micro-batch 1, recompute none",
            "tensor 1 x pipeline 4 with the embedding and loss counted as layers, micro-batch 1, recompute none"});
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

TEST_CASE("search: the ranked plans are distinct, and tied estimates rank by memory", "[planner]") {
  // With flash attention selective recomputation changes nothing, and a deeper prefetch often buys
  // nothing: such variants of a plan fold into it, so the candidates the CLI simulates are distinct plans.
  const Scenario s = scenario_from(scenario_json("llama2-7b", "a800", 4, "zero3", 4096, 32 * 2));
  auto result = search_policies_and_training(s, SearchOptions{}, {1, 2});
  REQUIRE(result.ok());
  const auto& ranked = result->ranked;
  REQUIRE(ranked.size() > 1);
  CHECK(result->candidates ==
        result->rejected_memory + result->rejected_invalid + result->redundant + static_cast<long long>(ranked.size()));
  CHECK(result->redundant > 0);
  auto tie = [](double a, double b) { return std::abs(a - b) <= kEstimateTie * std::min(a, b); };
  for (std::size_t i = 0; i < ranked.size(); ++i)
    for (std::size_t j = i + 1; j < ranked.size(); ++j) {
      const Scenario &a = ranked[i].scenario, &b = ranked[j].scenario;
      const bool same = a.policy.sharding == b.policy.sharding &&
                        a.policy.overlap.separate_streams == b.policy.overlap.separate_streams &&
                        a.training.micro_batch == b.training.micro_batch;
      INFO(i << " vs " << j);
      CHECK_FALSE((same && tie(ranked[i].estimate.step_time_s, ranked[j].estimate.step_time_s)));
    }
  // Within a run of ties, less memory first: a 60.7 GiB plan no longer beats a 44.1 GiB one by 0.001 %.
  auto candidate = [&](double step_s, double memory_gib) {
    SearchCandidate c{s, {}};
    c.estimate.step_time_s = step_s;
    c.estimate.memory.params = memory_gib * (1 << 30);
    return c;
  };
  std::vector<SearchCandidate> tied = {candidate(1.0, 60.7), candidate(1.00001, 44.1), candidate(1.1, 10)};
  rank_candidates(tied);
  CHECK(tied[0].estimate.step_time_s == 1.00001);
  CHECK(tied[1].estimate.step_time_s == 1.0);
  CHECK(tied[2].estimate.step_time_s == 1.1);
}

TEST_CASE("plan: when nothing fits, the fewest nodes on which each policy would", "[planner]") {
  // LLaMA-2 70B on one node of 8 H100s: no preset fits; the advice is checked against scenarios written out
  // independently at its size and one node fewer, with the same micro-batches per GPU. With 8 the search
  // evaluates 2 (what a stage can hold in flight) and must find the same sizes and the same memory.
  for (const int micro_batches : {2, 8}) {
    INFO(micro_batches << " micro-batches per GPU");
    auto at = [&](int nodes, const std::string& policy, Recompute recompute) {
      nlohmann::json doc = scenario_json("llama2-70b", "dgx-h100", nodes, policy, 4096, micro_batches * 8 * nodes);
      doc["training"]["recompute"] = to_string(recompute);
      return evaluate(scenario_from(doc));
    };
    const Scenario s = scenario_from(scenario_json("llama2-70b", "dgx-h100", 1, "zero3", 4096, micro_batches * 8));
    auto plan = plan_presets(s);
    REQUIRE(plan.ok());
    REQUIRE(plan->best == -1);
    REQUIRE(!plan->would_fit.empty());
    int fitting = 0;
    for (const FitAdvice& a : plan->would_fit) {
      INFO(to_string(a.policy) << " " << to_string(a.recompute) << " on " << a.nodes << " nodes");
      if (a.nodes == 0) {
        auto largest = at(kMaxAdviceNodes, to_string(a.policy), a.recompute);
        REQUIRE(largest.ok());
        CHECK_FALSE(largest->fits_memory);
        continue;
      }
      ++fitting;
      CHECK(a.gpus == 8 * a.nodes);
      auto there = at(a.nodes, to_string(a.policy), a.recompute);
      REQUIRE(there.ok());
      CHECK(there->fits_memory);
      CHECK(there->memory.total() == a.memory.total());
      CHECK(a.memory.total() <= s.cluster.gpu.memory_bytes);
      if (a.nodes > 1) {
        auto fewer = at(a.nodes - 1, to_string(a.policy), a.recompute);
        REQUIRE(fewer.ok());
        CHECK_FALSE(fewer->fits_memory);
      }
    }
    CHECK(fitting > 0);
    // Without recomputation a 4096-token sequence's activations alone outgrow 80 GiB: no size helps.
    for (const FitAdvice& a : plan->would_fit)
      if (a.recompute == Recompute::kNone) CHECK(a.nodes == 0);
    const std::string table = plan_table(s, *plan);
    CHECK(table.find("what would fit") != std::string::npos);
    CHECK(plan_to_json(s, *plan).at("would_fit").size() == plan->would_fit.size());
  }
}
