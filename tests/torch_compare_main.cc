// torch_compare: the runtime's models (runtime/model/model.h) against an independent PyTorch implementation
// (tools/torch_reference.py, float64) on the same weights and tokens: the loss and every parameter gradient.
//
//   torch_compare path/to/tools/torch_reference.py
//
// Two tiny models, initialised with init_parameters: a dense one and one whose layer 1 is MoE; the MoE one
// again with its matrices scaled up 15x (sharp attention, SwiGLU and routing). The loss of one micro-batch is
//   L = (1 / T) * sum_t CE(token t) + aux_loss_coef * sum over MoE layers of aux
// with T = batch * seq tokens (the head's backward scale is 1 / T, the MoE backward's aux_grad_scale is
// aux_loss_coef). Passes when |L - L_ref| <= 1e-5 |L_ref| and, for every tensor, max |g - g_ref| <= 1e-4 max
// |g_ref|. Exit codes: 0 pass, 1 mismatch (or the reference failed), 2 usage, 77 skipped (no torch at
// /usr/bin/python3; ctest reports it as skipped).
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "runtime/model/model.h"

namespace {

using hzp::runtime::AttentionBlock;
using hzp::runtime::Embedding;
using hzp::runtime::Head;
using hzp::runtime::Layout;
using hzp::runtime::MlpBlock;
using hzp::runtime::ModelConfig;
using hzp::runtime::MoeBlock;
using nlohmann::json;

constexpr const char* kPython = "/usr/bin/python3";
constexpr double kLossTolerance = 1e-5;  // relative
constexpr double kGradTolerance = 1e-4;  // max abs diff relative to the tensor's max abs reference gradient

// One module's flat parameter buffer, its gradient, and the reference name prefix of its tensors.
struct Module {
  std::string prefix;  // e.g. "layers.1.attention."
  Layout layout;
  std::vector<float> params;
  std::vector<float> grads;
};

struct Case {
  std::string name;
  ModelConfig config;
  std::int64_t batch = 2;
  std::int64_t seq = 16;
  float matrix_scale = 1;  // multiplies every matrix after init: > 1 makes attention, SwiGLU and routing sharp
};

ModelConfig base_config() {
  ModelConfig c;
  c.vocab = 256;
  c.hidden = 32;
  c.heads = 4;
  c.ffn = 64;
  c.layers = 2;
  c.moe_layer = {false, false};
  c.aux_loss_coef = 0.01;
  return c;
}

// The C++ side of one case: modules initialised, forward + backward run, loss returned.
class CppModel {
 public:
  CppModel(const Case& tc, std::uint64_t seed)
      : c_(tc.config), batch_(tc.batch), seq_(tc.seq), matrix_scale_(tc.matrix_scale) {
    const std::int64_t tokens = batch_ * seq_;
    add("embedding.", hzp::runtime::embedding_layout(c_), 0, seed);
    for (int l = 0; l < c_.layers; ++l) {
      const std::string layer = "layers." + std::to_string(l) + ".";
      const std::uint64_t unit = static_cast<std::uint64_t>(l + 1) * 8;
      add(layer + "attention.", hzp::runtime::attention_layout(c_), unit, seed);
      attention_.push_back(std::make_unique<AttentionBlock>(c_, batch_, seq_));
      if (c_.moe_layer[static_cast<std::size_t>(l)]) {
        add(layer + "moe.", hzp::runtime::moe_router_layout(c_), unit + 1, seed);
        // Experts: one tensor id per global expert (placement-independent init), named experts.E.*.
        Module experts{layer + "experts.", hzp::runtime::experts_layout(c_, c_.experts), {}, {}};
        const Layout one = hzp::runtime::experts_layout(c_, 1);
        const std::int64_t size = hzp::runtime::layout_size(one);
        experts.params.resize(static_cast<std::size_t>(size * c_.experts));
        for (std::int64_t e = 0; e < c_.experts; ++e)
          hzp::runtime::init_parameters(c_, one, seed, (1ULL << 32) + unit * 1024 + static_cast<std::uint64_t>(e),
                                        experts.params.data() + e * size);
        for (float& w : experts.params) w *= matrix_scale_;
        experts.grads.assign(experts.params.size(), 0.0f);
        modules_.push_back(std::move(experts));
        moe_.push_back(std::make_unique<MoeBlock>(c_, batch_, seq_));
        mlp_.push_back(nullptr);
      } else {
        add(layer + "mlp.", hzp::runtime::mlp_layout(c_), unit + 1, seed);
        mlp_.push_back(std::make_unique<MlpBlock>(c_, batch_, seq_));
        moe_.push_back(nullptr);
      }
    }
    add("head.", hzp::runtime::head_layout(c_), 7, seed);
    embedding_ = std::make_unique<Embedding>(c_, tokens);
    head_ = std::make_unique<Head>(c_, tokens);

    std::mt19937 rng(static_cast<std::uint32_t>(seed));
    std::uniform_int_distribution<std::int32_t> byte(0, 255);
    ids_.resize(static_cast<std::size_t>(tokens));
    targets_.resize(static_cast<std::size_t>(tokens));
    for (auto& id : ids_) id = byte(rng);
    for (auto& t : targets_) t = byte(rng);
  }

  // Forward and backward of one micro-batch; returns the loss (see the file comment).
  double run() {
    const std::int64_t tokens = batch_ * seq_;
    const float coef = static_cast<float>(c_.aux_loss_coef);
    std::vector<float> x(static_cast<std::size_t>(tokens * c_.hidden));
    std::size_t m = 0;
    embedding_->forward(modules_[m++].params.data(), ids_.data(), x.data());
    aux_.clear();
    for (int l = 0; l < c_.layers; ++l) {
      attention_[l]->forward(modules_[m++].params.data(), x.data());
      if (moe_[l]) {
        moe_[l]->forward(modules_[m].params.data(), modules_[m + 1].params.data(), x.data());
        aux_.push_back(moe_[l]->aux_loss());
        m += 2;
      } else {
        mlp_[l]->forward(modules_[m++].params.data(), x.data());
      }
    }
    ce_ = head_->forward(modules_[m].params.data(), x.data(), targets_.data()) / static_cast<double>(tokens);

    std::vector<float> dx(x.size());
    head_->backward(modules_[m].params.data(), 1.0f / static_cast<float>(tokens), dx.data(), modules_[m].grads.data());
    for (int l = c_.layers - 1; l >= 0; --l) {
      if (moe_[l]) {
        m -= 2;
        moe_[l]->backward(modules_[m].params.data(), modules_[m + 1].params.data(), coef, dx.data(),
                          modules_[m].grads.data(), modules_[m + 1].grads.data());
      } else {
        --m;
        mlp_[l]->backward(modules_[m].params.data(), dx.data(), modules_[m].grads.data());
      }
      --m;
      attention_[l]->backward(modules_[m].params.data(), dx.data(), modules_[m].grads.data());
    }
    --m;
    embedding_->backward(dx.data(), ids_.data(), modules_[m].grads.data());

    double loss = ce_;
    for (double a : aux_) loss += c_.aux_loss_coef * a;
    return loss;
  }

  // The reference's input: config, tokens, and every tensor by name.
  json input_document() const {
    json cfg = {{"vocab", c_.vocab},
                {"hidden", c_.hidden},
                {"heads", c_.heads},
                {"ffn", c_.ffn},
                {"layers", c_.layers},
                {"moe_layer", c_.moe_layer},
                {"experts", c_.experts},
                {"top_k", c_.top_k},
                {"expert_ffn", c_.expert_ffn},
                {"aux_loss_coef", c_.aux_loss_coef},
                {"batch", batch_},
                {"seq", seq_}};
    json params = json::object();
    for_each_tensor([&](const std::string& name, const hzp::runtime::TensorInfo& t, const Module& mod) {
      json shape = t.decay ? json::array({t.rows, t.cols}) : json::array({t.rows});
      params[name] = {
          {"shape", shape},
          {"data", std::vector<float>(mod.params.begin() + t.offset, mod.params.begin() + t.offset + t.size())}};
    });
    return {{"config", cfg}, {"ids", ids_}, {"targets", targets_}, {"params", params}};
  }

  // Calls f(reference name, tensor, module) for every tensor of every module.
  template <typename F>
  void for_each_tensor(F f) const {
    for (const Module& mod : modules_) {
      for (const hzp::runtime::TensorInfo& t : mod.layout) {
        // experts_layout names tensors "expertE.w_gate"; the reference calls them "experts.E.w_gate".
        std::string name = t.name;
        if (name.rfind("expert", 0) == 0) name = name.substr(6);
        f(mod.prefix + name, t, mod);
      }
    }
  }

  double ce() const { return ce_; }
  const std::vector<double>& aux() const { return aux_; }

 private:
  void add(const std::string& prefix, Layout layout, std::uint64_t tensor_id, std::uint64_t seed) {
    Module mod{prefix, std::move(layout), {}, {}};
    mod.params.resize(static_cast<std::size_t>(hzp::runtime::layout_size(mod.layout)));
    mod.grads.assign(mod.params.size(), 0.0f);
    hzp::runtime::init_parameters(c_, mod.layout, seed, tensor_id, mod.params.data());
    for (const hzp::runtime::TensorInfo& t : mod.layout)
      if (t.decay)
        for (std::int64_t i = 0; i < t.size(); ++i) mod.params[t.offset + i] *= matrix_scale_;
    modules_.push_back(std::move(mod));
  }

  ModelConfig c_;
  std::int64_t batch_, seq_;
  float matrix_scale_;
  std::vector<Module> modules_;  // embedding, per layer attention + (mlp | router, experts), head
  std::unique_ptr<Embedding> embedding_;
  std::vector<std::unique_ptr<AttentionBlock>> attention_;
  std::vector<std::unique_ptr<MlpBlock>> mlp_;
  std::vector<std::unique_ptr<MoeBlock>> moe_;
  std::unique_ptr<Head> head_;
  std::vector<std::int32_t> ids_, targets_;
  double ce_ = 0;
  std::vector<double> aux_;
};

bool torch_available() {
  if (!std::filesystem::exists(kPython)) return false;
  const std::string cmd = std::string(kPython) + " -c 'import torch' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

// Runs one case; prints its table; returns whether it matched.
bool compare(const Case& tc, const std::string& script, const std::filesystem::path& dir) {
  CppModel model(tc, 20240601);
  const double loss = model.run();

  const std::filesystem::path in = dir / (tc.name + "_in.json");
  const std::filesystem::path out = dir / (tc.name + "_out.json");
  {
    std::ofstream f(in);
    f << model.input_document().dump();
  }
  const std::string cmd = std::string(kPython) + " '" + script + "' '" + in.string() + "' '" + out.string() + "'";
  if (std::system(cmd.c_str()) != 0) {
    std::printf("torch_compare: %s: the reference failed: %s\n", tc.name.c_str(), cmd.c_str());
    return false;
  }
  json ref;
  try {
    std::ifstream f(out);
    ref = json::parse(f);
  } catch (const json::exception& e) {
    std::printf("torch_compare: %s: cannot read %s: %s\n", tc.name.c_str(), out.string().c_str(), e.what());
    return false;
  }

  bool ok = true;
  const double ref_loss = ref.at("loss").get<double>();
  const double loss_rel = std::abs(loss - ref_loss) / std::abs(ref_loss);
  std::printf("\n== %s: loss %.9f (torch %.9f, rel diff %.2e), ce %.9f (torch %.9f)", tc.name.c_str(), loss, ref_loss,
              loss_rel, model.ce(), ref.at("ce").get<double>());
  for (std::size_t i = 0; i < model.aux().size(); ++i)
    std::printf(", aux %.9f (torch %.9f)", model.aux()[i], ref.at("aux").at(i).get<double>());
  if (!ref.at("min_router_gap").is_null())
    std::printf("\n   smallest router logit gap at the top-k boundary: %.3e", ref.at("min_router_gap").get<double>());
  std::printf("\n");
  if (!(loss_rel <= kLossTolerance)) {
    std::printf("   MISMATCH: loss relative difference %.3e > %.0e\n", loss_rel, kLossTolerance);
    ok = false;
  }

  std::printf("   %-28s %8s %12s %12s %10s\n", "tensor", "size", "max|g_ref|", "max|diff|", "rel");
  double worst = 0;
  model.for_each_tensor([&](const std::string& name, const hzp::runtime::TensorInfo& t, const Module& mod) {
    if (!ref.at("grads").contains(name)) {
      std::printf("   %-28s MISSING in the reference\n", name.c_str());
      ok = false;
      return;
    }
    const std::vector<double> g_ref = ref.at("grads").at(name).get<std::vector<double>>();
    if (static_cast<std::int64_t>(g_ref.size()) != t.size()) {
      std::printf("   %-28s size %zu in the reference, %lld here\n", name.c_str(), g_ref.size(),
                  static_cast<long long>(t.size()));
      ok = false;
      return;
    }
    double ref_max = 0, diff_max = 0;
    for (std::int64_t i = 0; i < t.size(); ++i) {
      ref_max = std::max(ref_max, std::abs(g_ref[i]));
      diff_max = std::max(diff_max, std::abs(static_cast<double>(mod.grads[t.offset + i]) - g_ref[i]));
    }
    const double rel = ref_max > 0 ? diff_max / ref_max : (diff_max > 0 ? INFINITY : 0.0);
    worst = std::max(worst, rel);
    const bool pass = rel <= kGradTolerance;
    std::printf("   %-28s %8lld %12.4e %12.4e %10.2e%s\n", name.c_str(), static_cast<long long>(t.size()), ref_max,
                diff_max, rel, pass ? "" : "  MISMATCH");
    ok = ok && pass;
  });
  std::printf("   worst gradient rel diff %.2e (tolerance %.0e)\n", worst, kGradTolerance);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: torch_compare path/to/tools/torch_reference.py\n");
    return 2;
  }
  if (!torch_available()) {
    std::printf("torch_compare: SKIPPED: /usr/bin/python3 with torch not found (CI installs python3-torch)\n");
    return 77;
  }
  const std::string script = argv[1];
  if (!std::filesystem::exists(script)) {
    std::fprintf(stderr, "torch_compare: no reference script at %s\n", script.c_str());
    return 2;
  }

  Case dense{"dense", base_config()};
  Case moe{"moe", base_config()};
  moe.config.moe_layer = {false, true};
  moe.config.experts = 4;
  moe.config.top_k = 2;
  moe.config.expert_ffn = 32;

  // The same MoE model with matrices 15x the init (std 0.3): far from the near-linear regime of the init.
  Case sharp = moe;
  sharp.name = "moe_sharp";
  sharp.matrix_scale = 15;

  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("hzp_torch_compare_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bool ok = true;
  for (const Case& tc : {dense, moe, sharp}) ok = compare(tc, script, dir) && ok;

  if (!ok) {
    std::printf("\ntorch_compare: FAILED: the C++ model differs from the PyTorch reference (inputs kept in %s)\n",
                dir.string().c_str());
    return 1;
  }
  std::filesystem::remove_all(dir);
  std::printf("\ntorch_compare: PASSED: loss and all parameter gradients match PyTorch (dense, moe, moe_sharp)\n");
  return 0;
}
