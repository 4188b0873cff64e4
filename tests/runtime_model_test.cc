// The runtime's models (runtime/model/model.h): configuration checks, layouts against the core's parameter
// counts, deterministic initialisation, and finite-difference gradient checks of every module (w.r.t. its
// parameters and its input) and of a whole tiny dense + MoE model; expert parallelism emulated with two
// MoeBlocks exchanging rows by hand must match ep = 1.
//
// Gradient checks use central differences of a scalar objective accumulated in double: along one random
// direction v, (L(θ+εv) - L(θ-εv)) / 2ε against <g, v>, and per coordinate on the largest-gradient and a
// few random coordinates. Set HZP_MODEL_TEST_VERBOSE=1 to print the relative errors.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "runtime/model/kernels.h"
#include "runtime/model/model.h"
#include "shared/model_math.h"

namespace hzp::runtime {
namespace {

using Vec = std::vector<float>;

// V = 256 (byte-level), h = 16, 4 heads of 4, 2 layers, layer 1 MoE with 4 experts, top-2.
ModelConfig tiny_config() {
  ModelConfig c;
  c.vocab = 256;
  c.hidden = 16;
  c.heads = 4;
  c.ffn = 24;
  c.layers = 2;
  c.moe_layer = {false, true};
  c.experts = 4;
  c.top_k = 2;
  c.expert_ffn = 12;
  c.aux_loss_coef = 0.01;
  return c;
}

constexpr std::int64_t kBatch = 2;
constexpr std::int64_t kSeq = 8;
constexpr std::int64_t kTokens = kBatch * kSeq;

Vec random_vec(std::size_t n, std::mt19937& rng, float stddev = 1.0f, float mean = 0.0f) {
  std::normal_distribution<float> dist(mean, stddev);
  Vec v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Test weights larger than the training init so that attention, SwiGLU and routing are far from linear:
// matrices N(0, 0.3^2), norm weights around 1.
Vec random_params(const Layout& layout, std::mt19937& rng) {
  Vec p(static_cast<std::size_t>(layout_size(layout)));
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const TensorInfo& t : layout)
    for (std::int64_t i = 0; i < t.size(); ++i) p[t.offset + i] = t.decay ? 0.3f * dist(rng) : 1.0f + 0.1f * dist(rng);
  return p;
}

std::vector<std::int32_t> random_ids(std::int64_t n, std::mt19937& rng) {
  std::uniform_int_distribution<std::int32_t> dist(0, 255);
  std::vector<std::int32_t> ids(static_cast<std::size_t>(n));
  for (auto& id : ids) id = dist(rng);
  return ids;
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

bool verbose() {
  return std::getenv("HZP_MODEL_TEST_VERBOSE") != nullptr;
}

// Central-difference check of `grad` (the analytic dL/dθ) against `loss` evaluated with θ perturbed in place
// (θ is restored afterwards). The perturbation actually applied in fp32 (θ+ - θ-) is what <g, ·> is taken
// with, so rounding of θ ± εv does not count as error. `scale` (optional, per coordinate) multiplies the
// perturbation, e.g. to make it relative to each tensor's magnitude.
void check_gradient(const std::string& what, Vec& theta, const Vec& grad, const std::function<double()>& loss,
                    double eps, std::mt19937& rng, const Vec* scale = nullptr, double directional_tol = 2e-2,
                    double coordinate_tol = 5e-2) {
  REQUIRE(theta.size() == grad.size());
  const Vec saved = theta;
  auto central = [&](const Vec& direction, double& analytic) {
    Vec plus(theta.size()), minus(theta.size());
    for (std::size_t i = 0; i < theta.size(); ++i) {
      const double step = eps * direction[i] * (scale != nullptr ? (*scale)[i] : 1.0f);
      plus[i] = static_cast<float>(saved[i] + step);
      minus[i] = static_cast<float>(saved[i] - step);
    }
    analytic = 0;
    for (std::size_t i = 0; i < theta.size(); ++i)
      analytic += static_cast<double>(grad[i]) * (static_cast<double>(plus[i]) - minus[i]) / (2 * eps);
    theta = plus;
    const double lp = loss();
    theta = minus;
    const double lm = loss();
    theta = saved;
    return (lp - lm) / (2 * eps);
  };

  // Along a random direction.
  const Vec v = random_vec(theta.size(), rng);
  double analytic = 0;
  const double numeric = central(v, analytic);
  const double directional_rel = std::abs(numeric - analytic) / std::max(std::abs(analytic), 1e-12);
  INFO(what << ": directional numeric " << numeric << " analytic " << analytic);
  CHECK(directional_rel < directional_tol);

  // Per coordinate: the 3 largest |g| (scaled as the perturbation is) and 3 random ones; the error is taken
  // relative to max(|g_i|, 5% of the largest).
  auto scaled = [&](std::size_t i) {
    return std::abs(static_cast<double>(grad[i])) * (scale != nullptr ? (*scale)[i] : 1.0f);
  };
  std::vector<std::size_t> idx(theta.size());
  for (std::size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  const std::size_t top = std::min<std::size_t>(3, idx.size());
  std::partial_sort(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(top), idx.end(),
                    [&](std::size_t a, std::size_t b) { return scaled(a) > scaled(b); });
  const double gmax = scaled(idx[0]);
  std::vector<std::size_t> coords(idx.begin(), idx.begin() + static_cast<std::ptrdiff_t>(top));
  std::uniform_int_distribution<std::size_t> pick(0, theta.size() - 1);
  for (int i = 0; i < 3; ++i) coords.push_back(pick(rng));
  double coordinate_rel = 0;
  for (std::size_t i : coords) {
    Vec e(theta.size(), 0.0f);
    e[i] = 1.0f;
    double a = 0;
    const double n = central(e, a);
    const double rel = std::abs(n - a) / std::max({std::abs(a), 0.05 * gmax, 1e-12});
    INFO(what << ": coordinate " << i << " numeric " << n << " analytic " << a);
    CHECK(rel < coordinate_tol);
    coordinate_rel = std::max(coordinate_rel, rel);
  }
  if (verbose())
    std::printf("  fd %-28s directional rel err %.2e  coordinates max rel err %.2e\n", what.c_str(), directional_rel,
                coordinate_rel);
}

// Router decisions recomputed independently in double: each token's selected expert set (sorted), and the
// smallest gap between the k-th and (k+1)-th router logit (how far the routing is from changing; softmax is
// monotonic, so comparing logits is comparing probabilities).
struct Routing {
  std::vector<std::int32_t> sets;
  double margin = 0;
};
Routing reference_routing(const ModelConfig& c, const float* router, const float* x, std::int64_t tokens) {
  const std::int64_t h = c.hidden, e = c.experts, k = c.top_k;
  Routing r;
  r.margin = 1e30;
  for (std::int64_t t = 0; t < tokens; ++t) {
    double ms = 0;
    for (std::int64_t i = 0; i < h; ++i) ms += static_cast<double>(x[t * h + i]) * x[t * h + i];
    const double rs = 1.0 / std::sqrt(ms / static_cast<double>(h) + 1e-5);
    std::vector<double> logits(static_cast<std::size_t>(e), 0.0);
    for (std::int64_t i = 0; i < h; ++i)
      for (std::int64_t j = 0; j < e; ++j) logits[j] += x[t * h + i] * rs * router[i] * router[h + i * e + j];
    std::vector<std::int32_t> order(static_cast<std::size_t>(e));
    for (std::int64_t j = 0; j < e; ++j) order[j] = static_cast<std::int32_t>(j);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    if (k < e) r.margin = std::min(r.margin, logits[order[k - 1]] - logits[order[k]]);
    std::vector<std::int32_t> set(order.begin(), order.begin() + k);
    std::sort(set.begin(), set.end());
    r.sets.insert(r.sets.end(), set.begin(), set.end());
  }
  return r;
}

// One MoE layer with ep = 1: L = sum(out * R) + aux_scale * aux.
struct MoeObjective {
  ModelConfig c;
  MoeBlock block;
  Vec r;
  double aux_scale;
  Routing base;
  bool routing_changed = false;

  MoeObjective(const ModelConfig& cfg, Vec r_in, double aux)
      : c(cfg), block(cfg, kBatch, kSeq), r(std::move(r_in)), aux_scale(aux) {}

  double loss(const Vec& router, const Vec& experts, const Vec& input) {
    const Routing now = reference_routing(c, router.data(), input.data(), kTokens);
    if (now.sets != base.sets) routing_changed = true;
    Vec out = input;
    block.forward(router.data(), experts.data(), out.data());
    return dot(out, r) + aux_scale * block.aux_loss();
  }
};

// ---------------------------------------------------------------------------------------------------------

TEST_CASE("model_config accepts llama and refuses what the runtime cannot train, naming the field", "[model]") {
  ModelSpec m;
  m.family = ModelFamily::kLlama;
  m.layers = 2;
  m.hidden = 16;
  m.heads = 4;
  m.kv_heads = 4;
  m.ffn_hidden = 24;
  m.vocab = 256;
  m.has_moe = true;
  m.moe.experts = 4;
  m.moe.top_k = 2;
  m.moe.expert_ffn_hidden = 12;
  m.moe.layers = {1};

  auto ok = model_config(m);
  REQUIRE(ok.ok());
  CHECK(ok->hidden == 16);
  CHECK(ok->head_dim() == 4);
  CHECK(ok->moe_layer == std::vector<bool>{false, true});
  CHECK(ok->experts == 4);
  CHECK(ok->top_k == 2);
  CHECK(ok->expert_ffn == 12);

  auto refused = [](const ModelSpec& spec, const std::string& path) {
    auto r = model_config(spec);
    REQUIRE_FALSE(r.ok());
    INFO(r.status().message());
    CHECK(r.status().code() == StatusCode::kInvalidInput);
    CHECK(r.status().message().rfind(path + ": ", 0) == 0);
  };
  ModelSpec gpt = m;
  gpt.family = ModelFamily::kGpt;
  refused(gpt, "model.family");
  CHECK(model_config(gpt).status().message().find("gpt") != std::string::npos);
  ModelSpec gqa = m;
  gqa.kv_heads = 2;
  refused(gqa, "model.kv_heads");
  ModelSpec learned = m;
  learned.position = PositionEmbedding::kLearned;
  refused(learned, "model.position");
  ModelSpec tied = m;
  tied.tied_embeddings = true;
  refused(tied, "model.tied_embeddings");
  ModelSpec big_vocab = m;
  big_vocab.vocab = 32000;
  refused(big_vocab, "model.vocab");
  ModelSpec odd_head = m;
  odd_head.hidden = 20;  // head_dim 5
  refused(odd_head, "model.heads");
  ModelSpec indivisible = m;
  indivisible.hidden = 18;
  refused(indivisible, "model.heads");
}

TEST_CASE("model layouts have the core's per-module parameter counts", "[model]") {
  ModelSpec m;
  m.family = ModelFamily::kLlama;
  m.layers = 2;
  m.hidden = 16;
  m.heads = 4;
  m.kv_heads = 4;
  m.ffn_hidden = 24;
  m.vocab = 256;
  TrainingSpec training;
  training.seq_len = kSeq;
  training.micro_batch = kBatch;
  training.global_batch = kBatch;

  SECTION("dense") {
    const ModelConfig c = *model_config(m);
    const ModelCost cost = model_cost(m, training);
    REQUIRE(cost.modules.size() == 6);
    CHECK(layout_size(embedding_layout(c)) == cost.modules[0].params);
    CHECK(layout_size(attention_layout(c)) == cost.modules[1].params);
    CHECK(layout_size(mlp_layout(c)) == cost.modules[2].params);
    CHECK(layout_size(head_layout(c)) == cost.modules[5].params);
  }
  SECTION("moe") {
    m.has_moe = true;
    m.moe.experts = 4;
    m.moe.top_k = 2;
    m.moe.expert_ffn_hidden = 12;
    m.moe.layers = {1};
    const ModelConfig c = *model_config(m);
    const ModelCost cost = model_cost(m, training);
    REQUIRE(cost.modules.size() == 6);
    REQUIRE(cost.modules[4].kind == ModuleKind::kMoe);
    CHECK(layout_size(mlp_layout(c)) == cost.modules[2].params);
    CHECK(layout_size(moe_router_layout(c)) + layout_size(experts_layout(c, c.experts)) == cost.modules[4].params);
    CHECK(layout_size(experts_layout(c, c.experts)) == cost.modules[4].expert_params);
    CHECK(layout_size(experts_layout(c, 2)) * 2 == layout_size(experts_layout(c, 4)));
  }
  // Every layout tiles its buffer: consecutive, no gaps.
  const ModelConfig c = tiny_config();
  for (const Layout& layout : {embedding_layout(c), attention_layout(c), mlp_layout(c), moe_router_layout(c),
                               experts_layout(c, 3), head_layout(c)}) {
    std::int64_t offset = 0;
    for (const TensorInfo& t : layout) {
      CHECK(t.offset == offset);
      CHECK(t.decay == (t.cols > 1));
      offset += t.size();
    }
  }
}

TEST_CASE("init_parameters is deterministic and independent of expert placement", "[model]") {
  const ModelConfig c = tiny_config();
  const Layout one = experts_layout(c, 1);
  const std::int64_t expert_size = layout_size(one);
  const std::uint64_t seed = 1234;
  const std::uint64_t expert_id_base = 100;

  // All experts on one rank, and experts 2..3 on rank 1 of ep = 2: one tensor id per global expert.
  Vec global(static_cast<std::size_t>(expert_size * c.experts));
  for (std::int64_t e = 0; e < c.experts; ++e)
    init_parameters(c, one, seed, expert_id_base + static_cast<std::uint64_t>(e), global.data() + e * expert_size);
  Vec rank1(static_cast<std::size_t>(expert_size * 2));
  for (std::int64_t i = 0; i < 2; ++i)
    init_parameters(c, one, seed, expert_id_base + 2 + static_cast<std::uint64_t>(i), rank1.data() + i * expert_size);
  CHECK(std::equal(rank1.begin(), rank1.end(), global.begin() + 2 * expert_size));

  const Layout attn = attention_layout(c);
  Vec a(static_cast<std::size_t>(layout_size(attn))), b(a.size()), other(a.size());
  init_parameters(c, attn, seed, 8, a.data());
  init_parameters(c, attn, seed, 8, b.data());
  init_parameters(c, attn, seed, 9, other.data());
  CHECK(a == b);
  CHECK(a != other);

  // Norm weights 1; matrices N(0, 0.02), wo scaled by 1/sqrt(2 layers).
  auto stddev = [](const float* p, std::int64_t n) {
    double s = 0;
    for (std::int64_t i = 0; i < n; ++i) s += static_cast<double>(p[i]) * p[i];
    return std::sqrt(s / static_cast<double>(n));
  };
  for (std::int64_t i = 0; i < c.hidden; ++i) CHECK(a[i] == 1.0f);
  const Layout emb = embedding_layout(c);
  Vec wte(static_cast<std::size_t>(layout_size(emb)));
  init_parameters(c, emb, seed, 0, wte.data());
  CHECK(stddev(wte.data(), static_cast<std::int64_t>(wte.size())) == Approx(0.02).epsilon(0.05));
  CHECK(stddev(a.data() + attn[4].offset, attn[4].size()) == Approx(0.02 / std::sqrt(2.0 * c.layers)).epsilon(0.15));
}

TEST_CASE("kernels: top-k breaks ties to the lower index, rotary backward inverts forward", "[model]") {
  const float p[] = {0.1f, 0.3f, 0.3f, 0.2f, 0.3f, 0.05f};
  std::int32_t idx[4];
  kernels::top_k(p, 6, 3, idx);
  CHECK(std::vector<std::int32_t>(idx, idx + 3) == std::vector<std::int32_t>{1, 2, 4});
  kernels::top_k(p, 6, 4, idx);
  CHECK(std::vector<std::int32_t>(idx, idx + 4) == std::vector<std::int32_t>{1, 2, 4, 3});
  const float uniform[] = {0.25f, 0.25f, 0.25f, 0.25f};
  kernels::top_k(uniform, 4, 2, idx);
  CHECK(std::vector<std::int32_t>(idx, idx + 2) == std::vector<std::int32_t>{0, 1});

  // Rotation by position: position 0 is the identity, and backward (the transpose) undoes forward.
  std::mt19937 rng(11);
  const std::int64_t heads = 2, d = 8, seq = 5, rows = 2 * seq;
  Vec cos_t(static_cast<std::size_t>(seq * d / 2)), sin_t(cos_t.size());
  kernels::rope_tables(seq, d, cos_t.data(), sin_t.data());
  const Vec x = random_vec(static_cast<std::size_t>(rows * heads * d), rng);
  Vec y = x;
  kernels::rope_forward(y.data(), rows, seq, heads, d, cos_t.data(), sin_t.data());
  for (std::int64_t i = 0; i < heads * d; ++i) CHECK(y[i] == x[i]);
  CHECK(y[heads * d] != x[heads * d]);
  kernels::rope_backward(y.data(), rows, seq, heads, d, cos_t.data(), sin_t.data());
  for (std::size_t i = 0; i < x.size(); ++i) CHECK(y[i] == Approx(x[i]).margin(1e-6));
}

TEST_CASE("Embedding gradient matches finite differences", "[model]") {
  const ModelConfig c = tiny_config();
  std::mt19937 rng(1);
  Embedding emb(c, kTokens);
  Vec params = random_params(embedding_layout(c), rng);
  const auto ids = random_ids(kTokens, rng);
  const Vec r = random_vec(static_cast<std::size_t>(kTokens * c.hidden), rng);
  auto loss = [&] {
    Vec x(r.size());
    emb.forward(params.data(), ids.data(), x.data());
    return dot(x, r);
  };
  Vec grad(params.size(), 0.0f);
  emb.backward(r.data(), ids.data(), grad.data());
  check_gradient("embedding wte", params, grad, loss, 1e-2, rng);
}

// A residual block (attention or dense MLP): L = sum(block(x) * R), gradients w.r.t. params and x.
template <typename Block>
void check_residual_block(const std::string& name, const Layout& layout, std::uint32_t seed) {
  const ModelConfig c = tiny_config();
  std::mt19937 rng(seed);
  Block block(c, kBatch, kSeq);
  Vec params = random_params(layout, rng);
  Vec x = random_vec(static_cast<std::size_t>(kTokens * c.hidden), rng);
  const Vec r = random_vec(x.size(), rng);
  auto loss = [&] {
    Vec out = x;
    block.forward(params.data(), out.data());
    return dot(out, r);
  };
  loss();
  Vec dparams(params.size(), 0.5f);  // nonzero: backward must accumulate
  Vec dx = r;
  block.backward(params.data(), dx.data(), dparams.data());
  for (float& g : dparams) g -= 0.5f;
  check_gradient(name + " params", params, dparams, loss, 1e-3, rng);
  check_gradient(name + " x", x, dx, loss, 1e-3, rng);
}

TEST_CASE("AttentionBlock gradients match finite differences", "[model]") {
  check_residual_block<AttentionBlock>("attention", attention_layout(tiny_config()), 2);
}

TEST_CASE("MlpBlock gradients match finite differences", "[model]") {
  check_residual_block<MlpBlock>("mlp", mlp_layout(tiny_config()), 3);
}

TEST_CASE("AttentionBlock is causal", "[model]") {
  const ModelConfig c = tiny_config();
  std::mt19937 rng(4);
  AttentionBlock block(c, kBatch, kSeq);
  const Vec params = random_params(attention_layout(c), rng);
  Vec x = random_vec(static_cast<std::size_t>(kTokens * c.hidden), rng);
  Vec changed = x;
  // Change the last token of sequence 0: nothing before it, and nothing in sequence 1, may move.
  for (std::int64_t i = 0; i < c.hidden; ++i) changed[(kSeq - 1) * c.hidden + i] += 1.0f;
  Vec out_a = x, out_b = changed;
  block.forward(params.data(), out_a.data());
  block.forward(params.data(), out_b.data());
  for (std::int64_t t = 0; t < kTokens; ++t) {
    if (t == kSeq - 1) continue;
    for (std::int64_t i = 0; i < c.hidden; ++i) REQUIRE(out_a[t * c.hidden + i] == out_b[t * c.hidden + i]);
  }
}

TEST_CASE("Head gradients match finite differences", "[model]") {
  const ModelConfig c = tiny_config();
  std::mt19937 rng(5);
  Head head(c, kTokens);
  Vec params = random_params(head_layout(c), rng);
  Vec x = random_vec(static_cast<std::size_t>(kTokens * c.hidden), rng);
  const auto targets = random_ids(kTokens, rng);
  const float scale = 1.0f / static_cast<float>(kTokens);
  auto loss = [&] { return head.forward(params.data(), x.data(), targets.data()) * scale; };

  // forward returns the sum of token cross-entropies.
  Vec zero_head(params.size(), 0.0f);
  for (std::int64_t i = 0; i < c.hidden; ++i) zero_head[i] = 1.0f;
  CHECK(head.forward(zero_head.data(), x.data(), targets.data()) ==
        Approx(static_cast<double>(kTokens) * std::log(256.0)).epsilon(1e-6));

  loss();
  Vec dparams(params.size(), 0.25f);
  Vec dx(x.size(), 7.0f);  // overwritten
  head.backward(params.data(), scale, dx.data(), dparams.data());
  for (float& g : dparams) g -= 0.25f;
  check_gradient("head params", params, dparams, loss, 1e-3, rng);
  check_gradient("head x", x, dx, loss, 1e-3, rng);
}

TEST_CASE("MoeBlock gradients (incl. aux loss) match finite differences", "[model]") {
  const ModelConfig c = tiny_config();
  std::mt19937 rng(6);
  const Vec x = random_vec(static_cast<std::size_t>(kTokens * c.hidden), rng);
  MoeObjective obj(c, random_vec(x.size(), rng), /*aux=*/2.0);
  Vec router = random_params(moe_router_layout(c), rng);
  Vec experts = random_params(experts_layout(c, c.experts), rng);
  Vec input = x;
  obj.base = reference_routing(c, router.data(), x.data(), kTokens);
  INFO("routing margin " << obj.base.margin);
  REQUIRE(obj.base.margin > 1e-2);  // no near-tie: small perturbations keep the routing

  auto loss = [&] { return obj.loss(router, experts, input); };
  loss();
  CHECK(obj.block.aux_loss() > 0.5);  // E * sum f_e P_e is 1 when perfectly balanced
  Vec drouter(router.size(), 0.5f), dexperts(experts.size(), 0.5f);
  Vec dx = obj.r;
  obj.block.backward(router.data(), experts.data(), static_cast<float>(obj.aux_scale), dx.data(), drouter.data(),
                     dexperts.data());
  for (float& g : drouter) g -= 0.5f;
  for (float& g : dexperts) g -= 0.5f;

  const double eps = 1e-4;
  check_gradient("moe router", router, drouter, loss, eps, rng);
  check_gradient("moe experts", experts, dexperts, loss, eps, rng);
  check_gradient("moe x", input, dx, loss, eps, rng);
  CHECK_FALSE(obj.routing_changed);

  // The aux loss alone (R = 0) also reaches the router weights.
  MoeObjective aux_only(c, Vec(x.size(), 0.0f), 1.0);
  aux_only.base = obj.base;
  auto aux_loss = [&] { return aux_only.loss(router, experts, input); };
  aux_loss();
  Vec d2(router.size(), 0.0f), de2(experts.size(), 0.0f), dx2(x.size(), 0.0f);
  aux_only.block.backward(router.data(), experts.data(), 1.0f, dx2.data(), d2.data(), de2.data());
  check_gradient("moe aux-only router", router, d2, aux_loss, eps, rng);
  CHECK(*std::max_element(de2.begin(), de2.end()) == 0.0f);
  CHECK_FALSE(aux_only.routing_changed);
}

// Rows of `buffer` cut by `counts` (floats per destination rank).
std::vector<Vec> split(const Vec& buffer, const std::vector<std::int64_t>& counts) {
  std::vector<Vec> parts;
  std::int64_t offset = 0;
  for (std::int64_t n : counts) {
    parts.emplace_back(buffer.begin() + offset, buffer.begin() + offset + n);
    offset += n;
  }
  REQUIRE(offset == static_cast<std::int64_t>(buffer.size()));
  return parts;
}

// The all-to-all of two ranks: rank j receives part j of every rank's buffer, rank 0's first.
std::vector<Vec> all_to_all(const std::vector<std::vector<Vec>>& sent) {
  std::vector<Vec> received(sent.size());
  for (std::size_t j = 0; j < sent.size(); ++j)
    for (const auto& from : sent) received[j].insert(received[j].end(), from[j].begin(), from[j].end());
  return received;
}

// The reverse exchange: rank j's result rows go back to each sender in the order it received them.
std::vector<Vec> all_to_all_back(const std::vector<Vec>& results, const std::vector<std::vector<std::int64_t>>& rows,
                                 std::int64_t width) {
  // rows[i][j] = rows rank i sent to rank j.
  std::vector<Vec> back(rows.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    for (std::size_t j = 0; j < results.size(); ++j) {
      std::int64_t start = 0;
      for (std::size_t p = 0; p < i; ++p) start += rows[p][j];
      back[i].insert(back[i].end(), results[j].begin() + start * width,
                     results[j].begin() + (start + rows[i][j]) * width);
    }
  }
  return back;
}

void check_close(const Vec& a, const Vec& b, const std::string& what, double tol = 1e-5) {
  REQUIRE(a.size() == b.size());
  double scale = 1e-30, diff = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
  }
  INFO(what << ": max abs diff " << diff << " max abs " << scale);
  CHECK(diff <= tol * scale);
}

TEST_CASE("MoeBlock with ep = 2 (rows exchanged by hand) equals ep = 1", "[model]") {
  const ModelConfig c = tiny_config();
  const std::int64_t h = c.hidden;
  std::mt19937 rng(7);
  const Vec router = random_params(moe_router_layout(c), rng);
  const Vec experts = random_params(experts_layout(c, c.experts), rng);
  const std::int64_t half = layout_size(experts_layout(c, c.experts / 2));
  const std::vector<Vec> local_experts = {Vec(experts.begin(), experts.begin() + half),
                                          Vec(experts.begin() + half, experts.end())};
  // Two ranks, each with its own micro-batch and output gradient.
  const std::vector<Vec> x = {random_vec(static_cast<std::size_t>(kTokens * h), rng),
                              random_vec(static_cast<std::size_t>(kTokens * h), rng)};
  const std::vector<Vec> r = {random_vec(x[0].size(), rng), random_vec(x[0].size(), rng)};
  const float aux_scale = 0.7f;

  // Reference: ep = 1 on each rank's tokens with all experts.
  std::vector<Vec> ref_out = x, ref_dx = r, ref_drouter(2, Vec(router.size(), 0.0f));
  Vec ref_dexperts(experts.size(), 0.0f);
  std::vector<double> ref_aux(2);
  for (int i = 0; i < 2; ++i) {
    MoeBlock block(c, kBatch, kSeq);
    block.forward(router.data(), experts.data(), ref_out[i].data());
    ref_aux[i] = block.aux_loss();
    block.backward(router.data(), experts.data(), aux_scale, ref_dx[i].data(), ref_drouter[i].data(),
                   ref_dexperts.data());
  }

  // ep = 2: rank i routes its tokens; rank j runs experts [2j, 2j+2) on the rows of both ranks.
  // The blocks own raw Impl pointers (not copyable): one object per rank, by reference.
  MoeBlock rank0(c, kBatch, kSeq, 2), rank1(c, kBatch, kSeq, 2);
  MoeBlock* ranks[2] = {&rank0, &rank1};
  std::vector<Vec> out = x, send(2), expert_out(2);
  std::vector<std::vector<std::int64_t>> counts(2), rows(2, std::vector<std::int64_t>(2));
  std::vector<std::vector<Vec>> parts(2);
  for (int i = 0; i < 2; ++i) {
    ranks[i]->route_forward(router.data(), out[i].data(), send[i], counts[i]);
    REQUIRE(counts[i].size() == 2);
    for (int j = 0; j < 2; ++j) rows[i][j] = counts[i][j] / (h + 1);
    parts[i] = split(send[i], counts[i]);
  }
  const std::vector<Vec> recv = all_to_all(parts);
  for (int j = 0; j < 2; ++j) ranks[j]->experts_forward(local_experts[j].data(), recv[j], expert_out[j]);
  const std::vector<Vec> returned = all_to_all_back(expert_out, rows, h);
  for (int i = 0; i < 2; ++i) ranks[i]->combine_forward(returned[i], out[i].data());

  // Backward through the same exchanges.
  std::vector<Vec> dx = r, send_grad(2), out_grad(2), drouter(2, Vec(router.size(), 0.0f));
  std::vector<Vec> dexperts(2, Vec(static_cast<std::size_t>(half), 0.0f));
  std::vector<std::vector<std::int64_t>> grad_counts(2);
  for (int i = 0; i < 2; ++i) {
    ranks[i]->combine_backward(dx[i].data(), send_grad[i], grad_counts[i]);
    for (int j = 0; j < 2; ++j) REQUIRE(grad_counts[i][j] == rows[i][j] * h);
    parts[i] = split(send_grad[i], grad_counts[i]);
  }
  const std::vector<Vec> recv_grad = all_to_all(parts);
  for (int j = 0; j < 2; ++j)
    ranks[j]->experts_backward(local_experts[j].data(), recv_grad[j], out_grad[j], dexperts[j].data());
  const std::vector<Vec> returned_grad = all_to_all_back(out_grad, rows, h);
  for (int i = 0; i < 2; ++i)
    ranks[i]->route_backward(router.data(), returned_grad[i], aux_scale, dx[i].data(), drouter[i].data());

  for (int i = 0; i < 2; ++i) {
    const std::string rank = "rank " + std::to_string(i);
    CHECK(ranks[i]->aux_loss() == Approx(ref_aux[i]).epsilon(1e-12));
    check_close(out[i], ref_out[i], rank + " output");
    check_close(dx[i], ref_dx[i], rank + " dx");
    check_close(drouter[i], ref_drouter[i], rank + " drouter");
  }
  Vec all_dexperts = dexperts[0];
  all_dexperts.insert(all_dexperts.end(), dexperts[1].begin(), dexperts[1].end());
  check_close(all_dexperts, ref_dexperts, "dexperts");
  // Both ranks did send rows to both holders (the exchange was exercised).
  CHECK(rows[0][0] > 0);
  CHECK(rows[0][1] > 0);
  CHECK(rows[1][0] > 0);
  CHECK(rows[1][1] > 0);
}

// Embedding, layer 0 (attention + dense MLP), layer 1 (attention + MoE), head; all parameters in one vector.
// Loss = mean token cross-entropy + aux_loss_coef * aux of the MoE layer.
struct TinyModel {
  ModelConfig c = tiny_config();
  std::vector<Layout> layouts;
  std::vector<std::int64_t> offsets;
  Vec theta;
  std::vector<std::int32_t> ids, targets;
  Embedding emb{c, kTokens};
  AttentionBlock attn0{c, kBatch, kSeq}, attn1{c, kBatch, kSeq};
  MlpBlock mlp0{c, kBatch, kSeq};
  MoeBlock moe1{c, kBatch, kSeq};
  Head head{c, kTokens};
  Vec moe_input;  // x entering the MoE block in the last forward

  enum Module { kEmb, kAttn0, kMlp0, kAttn1, kRouter1, kExperts1, kHead, kModules };

  explicit TinyModel(std::mt19937& rng) {
    layouts = {embedding_layout(c),  attention_layout(c),          mlp_layout(c), attention_layout(c),
               moe_router_layout(c), experts_layout(c, c.experts), head_layout(c)};
    std::int64_t total = 0;
    for (const Layout& l : layouts) {
      offsets.push_back(total);
      total += layout_size(l);
    }
    // Test weights (random_params), not the training init: at N(0, 0.02) every gradient but the head's is so
    // small that finite differences of the loss drown in fp32 rounding.
    theta.resize(static_cast<std::size_t>(total));
    for (int m = 0; m < kModules; ++m) {
      const Vec p = random_params(layouts[m], rng);
      std::copy(p.begin(), p.end(), at(m));
    }
    ids = random_ids(kTokens, rng);
    targets = random_ids(kTokens, rng);
  }
  float* at(int m) { return theta.data() + offsets[m]; }

  double loss() {
    Vec x(static_cast<std::size_t>(kTokens * c.hidden));
    emb.forward(at(kEmb), ids.data(), x.data());
    attn0.forward(at(kAttn0), x.data());
    mlp0.forward(at(kMlp0), x.data());
    attn1.forward(at(kAttn1), x.data());
    moe_input = x;
    moe1.forward(at(kRouter1), at(kExperts1), x.data());
    const double ce = head.forward(at(kHead), x.data(), targets.data());
    return ce / kTokens + c.aux_loss_coef * moe1.aux_loss();
  }

  Vec gradient() {
    loss();
    Vec g(theta.size(), 0.0f);
    Vec dx(static_cast<std::size_t>(kTokens * c.hidden));
    auto grad_at = [&](int m) { return g.data() + offsets[m]; };
    head.backward(at(kHead), 1.0f / kTokens, dx.data(), grad_at(kHead));
    moe1.backward(at(kRouter1), at(kExperts1), static_cast<float>(c.aux_loss_coef), dx.data(), grad_at(kRouter1),
                  grad_at(kExperts1));
    attn1.backward(at(kAttn1), dx.data(), grad_at(kAttn1));
    mlp0.backward(at(kMlp0), dx.data(), grad_at(kMlp0));
    attn0.backward(at(kAttn0), dx.data(), grad_at(kAttn0));
    emb.backward(dx.data(), ids.data(), grad_at(kEmb));
    return g;
  }
};

TEST_CASE("Whole tiny dense + MoE model: loss gradient matches finite differences", "[model]") {
  std::mt19937 rng(8);
  TinyModel model(rng);
  const Vec g = model.gradient();
  const ModelConfig& c = model.c;
  const Routing base = reference_routing(c, model.at(TinyModel::kRouter1), model.moe_input.data(), kTokens);
  INFO("routing margin " << base.margin);
  REQUIRE(base.margin > 2e-2);

  // Perturbations relative to each tensor's RMS (the embedding is 0.02, norm weights 1).
  Vec scale(model.theta.size());
  for (int m = 0; m < TinyModel::kModules; ++m) {
    for (const TensorInfo& t : model.layouts[m]) {
      const float* p = model.at(m) + t.offset;
      double sq = 0;
      for (std::int64_t i = 0; i < t.size(); ++i) sq += static_cast<double>(p[i]) * p[i];
      std::fill_n(scale.begin() + model.offsets[m] + t.offset, t.size(),
                  static_cast<float>(std::sqrt(sq / static_cast<double>(t.size()))));
    }
  }
  bool routing_changed = false;
  auto loss = [&] {
    const double l = model.loss();
    if (reference_routing(c, model.at(TinyModel::kRouter1), model.moe_input.data(), kTokens).sets != base.sets)
      routing_changed = true;
    return l;
  };
  check_gradient("whole model", model.theta, g, loss, 1e-3, rng, &scale);
  CHECK_FALSE(routing_changed);

  // Each module's slice along its own random direction, so that small gradients are checked too.
  const char* names[] = {"model embedding", "model attn0",    "model mlp0", "model attn1",
                         "model router1",   "model experts1", "model head"};
  for (int m = 0; m < TinyModel::kModules; ++m) {
    const std::int64_t n = layout_size(model.layouts[m]);
    Vec slice(model.theta.begin() + model.offsets[m], model.theta.begin() + model.offsets[m] + n);
    const Vec gslice(g.begin() + model.offsets[m], g.begin() + model.offsets[m] + n);
    const Vec sslice(scale.begin() + model.offsets[m], scale.begin() + model.offsets[m] + n);
    Vec saved = model.theta;
    auto slice_loss = [&] {
      std::copy(slice.begin(), slice.end(), model.theta.begin() + model.offsets[m]);
      return loss();
    };
    check_gradient(names[m], slice, gslice, slice_loss, 1e-3, rng, &sslice);
    model.theta = saved;
  }
  CHECK_FALSE(routing_changed);
}

}  // namespace
}  // namespace hzp::runtime
