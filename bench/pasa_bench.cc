// pasa_bench: PASA's accuracy findings reproduced on the CPU reference (runtime/backends/cpu/attention_reference.h).
//
//   build/pasa_bench [--seq N] [--dim D] [--heads H] [--families quick|all] [--json FILE]
//
// For each family of random attention inputs (the paper's designed benchmarks: a large bias along the
// sequence, large amplitudes, heavy-tailed outliers, amplitudes growing along the sequence, and query and key
// "resonating" in phase or in opposition along the head dimension), every head of causal attention is run
// with standard flash attention in fp16 (scores rounded to fp16 before the 1/sqrt(d) scale), PASA in fp16,
// and flash attention in fp32, each against the exact fp64 softmax attention. Printed as a markdown table:
// whether fp16 flash attention overflows (an Inf or NaN in its output), and each algorithm's RMSE and
// relative RMSE (RMSE / RMS of the exact output), and worst |log-sum-exp| error. docs/pasa.md holds the table
// with the command that made it. Defaults follow the paper's reference code: seq 1407, head dim 128, key
// blocks of 128, beta 0.984497.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/backends/cpu/attention_reference.h"

namespace {

using hzp::runtime::round_to;
using hzp::runtime::ScalarType;
namespace ref = hzp::runtime::reference;

struct Family {
  std::string name;
  std::string description;
  // Fills q, k, v [seq x dim] (one head) for seed `seed`.
  std::function<void(std::vector<float>&, std::vector<float>&, std::vector<float>&, std::int64_t, std::int64_t,
                     std::uint32_t)>
      fill;
};

std::vector<Family> families(bool all) {
  std::vector<Family> f;
  auto uniform = [](double mean, double amp) {
    return [=](std::vector<float>& q, std::vector<float>& k, std::vector<float>& v, std::int64_t, std::int64_t,
               std::uint32_t seed) {
      std::mt19937 g(seed);
      std::uniform_real_distribution<double> u(-0.5, 0.5);
      for (auto* x : {&q, &k, &v})
        for (float& e : *x) e = static_cast<float>(u(g) * 2 * amp + mean);
    };
  };
  auto hybrid = [](double mean, double amp) {  // N(mean, 1) + N(0, amp) Bernoulli(0.001): rare large outliers
    return [=](std::vector<float>& q, std::vector<float>& k, std::vector<float>& v, std::int64_t, std::int64_t,
               std::uint32_t seed) {
      std::mt19937 g(seed);
      std::normal_distribution<double> n(0, 1);
      std::bernoulli_distribution rare(0.001);
      for (auto* x : {&q, &k, &v})
        for (float& e : *x) e = static_cast<float>(mean + n(g) + (rare(g) ? amp * n(g) : 0.0));
    };
  };
  auto growing = [](double gain) {  // amplitude growing along the sequence: (1 + gain t / seq) N(0, 1)
    return [=](std::vector<float>& q, std::vector<float>& k, std::vector<float>& v, std::int64_t seq, std::int64_t dim,
               std::uint32_t seed) {
      std::mt19937 g(seed);
      std::normal_distribution<double> n(0, 1);
      for (auto* x : {&q, &k})
        for (std::int64_t t = 0; t < seq; ++t)
          for (std::int64_t c = 0; c < dim; ++c)
            (*x)[t * dim + c] = static_cast<float>((1 + gain * static_cast<double>(t) / seq) * n(g));
      for (float& e : v) e = static_cast<float>(n(g));
    };
  };
  // Resonance: every q and k row follows one cosine along the head dimension (one random phase per head), in
  // phase (q.k = +A^2 d / 2) or in opposition (-A^2 d / 2), plus a little noise: every score is that large.
  auto resonance = [](double amp, bool opposite) {
    return [=](std::vector<float>& q, std::vector<float>& k, std::vector<float>& v, std::int64_t seq, std::int64_t dim,
               std::uint32_t seed) {
      std::mt19937 g(seed);
      std::normal_distribution<double> n(0, 1);
      std::uniform_real_distribution<double> phase(0, 2 * M_PI);
      const double freq = 3;  // periods over the head dimension
      const double p = phase(g);
      for (std::int64_t t = 0; t < seq; ++t) {
        for (std::int64_t c = 0; c < dim; ++c) {
          const double angle = 2 * M_PI * freq * static_cast<double>(c) / dim + p;
          q[t * dim + c] = static_cast<float>(amp * std::cos(angle) + 0.1 * n(g));
          k[t * dim + c] = static_cast<float>((opposite ? -amp : amp) * std::cos(angle) + 0.1 * n(g));
        }
      }
      for (float& e : v) e = static_cast<float>(n(g));
    };
  };
  f.push_back({"uniform mean 0, amp 0.5", "U(-0.5, 0.5)", uniform(0, 0.5)});
  if (all) f.push_back({"uniform mean 10, amp 0.5", "10 + U(-0.5, 0.5): a bias along the sequence", uniform(10, 0.5)});
  f.push_back({"uniform mean 20, amp 0.5", "20 + U(-0.5, 0.5)", uniform(20, 0.5)});
  f.push_back({"uniform mean 30, amp 0.5", "30 + U(-0.5, 0.5): scores ~ 30^2 d", uniform(30, 0.5)});
  if (all) f.push_back({"uniform mean 30, amp 5", "30 + U(-5, 5)", uniform(30, 5)});
  if (all) f.push_back({"uniform mean 0, amp 20", "U(-20, 20): large amplitudes", uniform(0, 20)});
  if (all) f.push_back({"hybrid mean 0, amp 10", "N(0,1) + N(0,10) Bernoulli(0.001)", hybrid(0, 10)});
  f.push_back({"hybrid mean 30, amp 10", "N(30,1) + N(0,10) Bernoulli(0.001)", hybrid(30, 10)});
  if (all) f.push_back({"growing amplitude x20", "(1 + 20 t/seq) N(0,1) for q, k", growing(20)});
  f.push_back({"growing amplitude x40", "(1 + 40 t/seq) N(0,1) for q, k", growing(40)});
  if (all) f.push_back({"resonance in phase, A 20", "q = k = 20 cos(...): q.k = +A^2 d/2", resonance(20, false)});
  f.push_back({"resonance in phase, A 33", "q = k = 33 cos(...)", resonance(33, false)});
  if (all) f.push_back({"resonance opposed, A 20", "k = -q = 20 cos(...): q.k = -A^2 d/2", resonance(20, true)});
  f.push_back({"resonance opposed, A 33", "k = -q = 33 cos(...)", resonance(33, true)});
  return f;
}

struct Error {
  double sum_sq = 0, ref_sq = 0, lse = 0;
  std::int64_t n = 0;
  bool overflow = false;
  void add(const float* out, const double* exact, std::int64_t count, const float* lse_got, const double* lse_exact,
           std::int64_t rows) {
    for (std::int64_t i = 0; i < count; ++i) {
      if (!std::isfinite(out[i])) {
        overflow = true;
        continue;
      }
      const double d = out[i] - exact[i];
      sum_sq += d * d;
      ref_sq += exact[i] * exact[i];
      ++n;
    }
    for (std::int64_t r = 0; r < rows; ++r)
      if (std::isfinite(lse_got[r])) lse = std::max(lse, std::abs(lse_got[r] - lse_exact[r]));
  }
  double rmse() const { return n ? std::sqrt(sum_sq / n) : NAN; }
  double relative() const { return n ? std::sqrt(sum_sq / ref_sq) : NAN; }
};

std::string cell(const Error& e) {
  char buf[96];
  if (e.overflow) {
    std::snprintf(buf, sizeof buf, "**overflow** (%.3g on the finite rest)", e.rmse());
  } else {
    std::snprintf(buf, sizeof buf, "%.3g (%.2g) lse %.2g", e.rmse(), e.relative(), e.lse);
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  std::int64_t seq = 1407, dim = 128, heads = 2;
  bool all = true;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "pasa_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    auto number = [&](std::int64_t lo, std::int64_t hi) {
      const std::string v = value();
      char* end = nullptr;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0' || x < lo || x > hi) {
        std::fprintf(stderr, "pasa_bench: %s must be an integer in [%lld, %lld], got '%s'\n", a.c_str(),
                     static_cast<long long>(lo), static_cast<long long>(hi), v.c_str());
        std::exit(2);
      }
      return static_cast<std::int64_t>(x);
    };
    if (a == "-h" || a == "--help") {
      std::printf(
          "usage: pasa_bench [--seq N] [--dim D] [--heads H] [--families quick|all] [--json FILE]\n\n"
          "PASA (arXiv 2503.01873) against standard flash attention in fp16 and fp32, each against the exact\n"
          "fp64 attention, on the paper's families of random inputs (causal, one kv head per query head).\n"
          "Defaults: seq 1407, dim 128 (even, >= 2), heads 2, all families. Prints a markdown table: overflow of\n"
          "fp16 flash attention, RMSE (relative RMSE) and worst log-sum-exp error of each algorithm.\n");
      return 0;
    } else if (a == "--seq") {
      seq = number(1, 1 << 16);
    } else if (a == "--dim") {
      dim = number(2, 1024);
      if (dim % 2 != 0) {
        std::fprintf(stderr, "pasa_bench: --dim must be even, got %lld\n", static_cast<long long>(dim));
        return 2;
      }
    } else if (a == "--heads") {
      heads = number(1, 64);
    } else if (a == "--families") {
      const std::string v = value();
      if (v != "quick" && v != "all") {
        std::fprintf(stderr, "pasa_bench: --families must be quick or all, got '%s'\n", v.c_str());
        return 2;
      }
      all = v == "all";
    } else if (a == "--json") {
      json_path = value();
    } else {
      std::fprintf(stderr, "pasa_bench: unknown argument '%s' (see --help)\n", a.c_str());
      return 2;
    }
  }
  const double beta = ref::pasa_default_beta();
  std::printf("seq %lld, head dim %lld, %lld heads per family, key blocks of %lld, beta %.7f\n\n",
              static_cast<long long>(seq), static_cast<long long>(dim), static_cast<long long>(heads),
              static_cast<long long>(ref::kPasaBlock), beta);
  std::printf("| inputs | fp16 flash overflows | fp16 flash | fp16 PASA | fp32 flash |\n|---|---|---|---|---|\n");
  nlohmann::json rows = nlohmann::json::array();
  std::vector<float> q(seq * dim), k(seq * dim), v(seq * dim), out(seq * dim), lse(seq);
  std::vector<double> exact(seq * dim), exact_lse(seq);
  for (const Family& f : families(all)) {
    Error fa16, pasa16, fa32;
    for (std::int64_t h = 0; h < heads; ++h) {
      f.fill(q, k, v, seq, dim, static_cast<std::uint32_t>(1000 + h));
      for (auto* x : {&q, &k, &v})  // the inputs are fp16 tensors
        for (float& e : *x) e = round_to(ScalarType::kFp16, e);
      const ref::Head head{q.data(), k.data(), v.data(), seq, dim, dim, dim};
      ref::exact_attention(head, exact.data(), dim, exact_lse.data());
      ref::flash_attention(head, ScalarType::kFp16, ref::kPasaBlock, out.data(), dim, lse.data());
      fa16.add(out.data(), exact.data(), seq * dim, lse.data(), exact_lse.data(), seq);
      ref::pasa_attention(head, ScalarType::kFp16, ref::kPasaBlock, beta, out.data(), dim, lse.data());
      pasa16.add(out.data(), exact.data(), seq * dim, lse.data(), exact_lse.data(), seq);
      ref::flash_attention(head, ScalarType::kFp32, ref::kPasaBlock, out.data(), dim, lse.data());
      fa32.add(out.data(), exact.data(), seq * dim, lse.data(), exact_lse.data(), seq);
    }
    std::printf("| %s | %s | %s | %s | %s |\n", f.name.c_str(), fa16.overflow ? "**yes**" : "no", cell(fa16).c_str(),
                cell(pasa16).c_str(), cell(fa32).c_str());
    std::fflush(stdout);
    auto row_of = [](const Error& e) {
      return nlohmann::json{
          {"overflow", e.overflow}, {"rmse", e.rmse()}, {"relative_rmse", e.relative()}, {"max_lse_error", e.lse}};
    };
    rows.push_back({{"family", f.name},
                    {"description", f.description},
                    {"fp16_flash", row_of(fa16)},
                    {"fp16_pasa", row_of(pasa16)},
                    {"fp32_flash", row_of(fa32)}});
  }
  std::printf("\ncells: RMSE against fp64 (relative RMSE) and the worst |log-sum-exp| error\n");
  if (!json_path.empty()) {
    std::ofstream out_file(json_path);
    if (!(out_file << rows.dump(1) << "\n")) {
      std::fprintf(stderr, "pasa_bench: cannot write %s\n", json_path.c_str());
      return 1;
    }
  }
  return 0;
}
