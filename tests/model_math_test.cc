// Tests for shared/model_math: parameter counts against published totals, per-module model FLOPs against the
// closed form of docs/model_math.md, activation memory against Korthikanti et al. 2022, and the recompute / flash /
// MoE relationships docs/model_math.md derives.
#include "shared/model/model_math.h"
#include "shared/scenario/presets.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <string>

namespace hzp {
namespace {

ModelSpec llama(int layers, std::int64_t hidden, int heads, int kv_heads, std::int64_t ffn) {
  return llama_model("test-llama", layers, hidden, heads, kv_heads, ffn, 32000, 4096);
}

ModelSpec llama2_7b() {
  return llama(32, 4096, 32, 32, 11008);
}
ModelSpec llama2_70b() {
  return llama(80, 8192, 64, 8, 28672);
}

ModelSpec mixtral_8x7b() {
  ModelSpec m = llama(32, 4096, 32, 8, 14336);
  m.has_moe = true;
  m.moe.experts = 8;
  m.moe.top_k = 2;
  m.moe.expert_ffn_hidden = 14336;
  for (int layer = 0; layer < m.layers; ++layer) m.moe.layers.push_back(layer);
  return m;
}

// GPT-2 small (124M): LayerNorm, GELU, learned positions, tied head.
ModelSpec gpt2_small() {
  ModelSpec m;
  m.name = "test-gpt2";
  m.family = ModelFamily::kGpt;
  m.mlp = MlpKind::kGelu;
  m.layers = 12;
  m.hidden = 768;
  m.heads = 12;
  m.kv_heads = 12;
  m.ffn_hidden = 4 * 768;
  m.vocab = 50257;
  m.tied_embeddings = true;
  m.position = PositionEmbedding::kLearned;
  m.max_positions = 1024;
  return m;
}

// Nemotron-4 15B (Parmar et al. 2024, arXiv 2402.16819, Table 1): squared-ReLU MLP of two matrices, GQA,
// untied 256k vocabulary, no biases.
ModelSpec nemotron4_15b() {
  ModelSpec m = llama_model("test-nemotron4-15b", 32, 6144, 48, 8, 24576, 256000, 4096);
  m.mlp = MlpKind::kSquaredRelu;
  return m;
}

TrainingSpec training(std::int64_t micro_batch, std::int64_t seq_len, Recompute recompute = Recompute::kNone,
                      bool flash = true) {
  TrainingSpec t;
  t.micro_batch = micro_batch;
  t.seq_len = seq_len;
  t.global_batch = micro_batch;
  t.precision = Precision::kBf16;
  t.recompute = recompute;
  t.flash_attention = flash;
  return t;
}

double sum_over(const ModelCost& cost, double ModuleCost::*field) {
  double total = 0;
  for (const ModuleCost& m : cost.modules) total += m.*field;
  return total;
}

const ModuleCost& module_at(const ModelCost& cost, ModuleKind kind, int layer) {
  for (const ModuleCost& m : cost.modules) {
    if (m.kind == kind && m.layer == layer) return m;
  }
  FAIL("no module " << to_string(kind) << " at layer " << layer);
  return cost.modules.front();
}

TEST_CASE("parameter counts match published totals", "[model_math]") {
  CHECK(parameter_count(llama2_7b()) == 6'738'415'616);
  CHECK(parameter_count(llama2_70b()) == 68'976'648'192);
  CHECK(parameter_count(mixtral_8x7b()) == 46'702'792'704);
  // HF GPT2Model("gpt2").num_parameters(): biases, LayerNorm bias, 1024 learned positions, tied head.
  CHECK(parameter_count(gpt2_small()) == 124'439'808);

  for (const ModelSpec& m : {llama2_7b(), llama2_70b(), mixtral_8x7b(), gpt2_small()}) {
    const ModelCost cost = model_cost(m, training(1, 128));
    std::int64_t summed = 0;
    for (const ModuleCost& module : cost.modules) summed += module.params;
    CHECK(cost.params == parameter_count(m));
    CHECK(summed == cost.params);
  }
}

TEST_CASE("parameters sit in the module that owns them", "[model_math]") {
  const ModelSpec gpt = gpt2_small();
  const ModelCost cost = model_cost(gpt, training(1, 128));
  CHECK(cost.modules.front().params == (50257 + 1024) * 768);  // token + position tables
  CHECK(cost.modules.back().params == 2 * 768);                // tied: only the final LayerNorm

  const ModelCost llama_cost = model_cost(llama2_7b(), training(1, 128));
  CHECK(llama_cost.modules.back().params == 4096 + 32000 * 4096);  // final RMSNorm + output matrix
  CHECK(llama_cost.modules.front().params == 32000 * 4096);        // rotary: no position table
}

TEST_CASE("modules come in schedule order with MoE where the spec says", "[model_math]") {
  ModelSpec m = llama(4, 256, 4, 2, 512);
  m.has_moe = true;
  m.moe = {4, 2, 384, {1, 3}};
  CHECK_FALSE(m.is_moe_layer(0));
  CHECK(m.is_moe_layer(1));
  CHECK(m.is_moe_layer(3));
  CHECK_FALSE(m.is_moe_layer(4));
  m.has_moe = false;
  CHECK_FALSE(m.is_moe_layer(1));
  m.has_moe = true;

  const ModelCost cost = model_cost(m, training(2, 64));
  REQUIRE(cost.modules.size() == 2 + 2 * 4);
  CHECK(cost.modules[0].kind == ModuleKind::kEmbedding);
  CHECK(cost.modules[0].layer == -1);
  const ModuleKind expected_mlp[] = {ModuleKind::kMlp, ModuleKind::kMoe, ModuleKind::kMlp, ModuleKind::kMoe};
  for (int layer = 0; layer < 4; ++layer) {
    CHECK(cost.modules[1 + 2 * layer].kind == ModuleKind::kAttention);
    CHECK(cost.modules[1 + 2 * layer].layer == layer);
    CHECK(cost.modules[2 + 2 * layer].kind == expected_mlp[layer]);
    CHECK(cost.modules[2 + 2 * layer].layer == layer);
  }
  CHECK(cost.modules.back().kind == ModuleKind::kHead);
  CHECK(cost.modules.back().layer == -1);
  CHECK(std::string(to_string(ModuleKind::kMoe)) == "moe");
  CHECK(std::string(to_string(ModuleKind::kAttention)) == "attention");
}

TEST_CASE("the closed-form FLOP count against a hand computation", "[model_math]") {
  // llama2-7b, B = 1, s = 4096: L = 32, h = 4096, n_kv/n_h = 1, s/h = 1, n_h·d/h = 1, f/h = 11008/4096.
  //   attention term  (1 + 1 + 1)·1             = 3
  //   MLP term        2.6875 · 1 · 1.5          = 4.03125
  //   logits term     32000 / (2·32·4096)       = 0.1220703125
  //   bracket                                   = 7.1533203125 = 7 + 157/1024
  //   12·B·s·L·h² = 12·4096·32·4096²            = 26,388,279,066,624
  //   F = 26,388,279,066,624·7 + (26,388,279,066,624/1024)·157
  //     = 184,717,953,466,368 + 25,769,803,776·157
  //     = 184,717,953,466,368 + 4,045,859,192,832 = 188,763,812,659,200
  CHECK(model_flops_formula(llama2_7b(), 1, 4096) == Approx(188'763'812'659'200.0).epsilon(1e-12));
}

TEST_CASE("per-module model FLOPs sum to the closed-form count", "[model_math]") {
  struct Case {
    ModelSpec model;
    std::int64_t micro_batch, seq_len;
  };
  ModelSpec mixed = llama(6, 512, 8, 2, 1376);
  mixed.has_moe = true;
  mixed.moe = {8, 2, 704, {1, 4, 5}};
  const Case cases[] = {
      {llama2_7b(), 1, 4096},
      {llama2_70b(), 1, 4096},
      {mixtral_8x7b(), 2, 4096},
      {gpt2_small(), 8, 1024},                       // GELU: the (3/2) becomes (2/2), see model_flops_formula
      {nemotron4_15b(), 1, 4096},                    // squared ReLU: two matrices without GPT's biases
      {mixed, 4, 256},                               // dense/MoE mix: MLP term averaged over layers
      {*model_preset("deepseek-v3"), 1, 4096},       // MLA, shared experts, dense first layers
      {*model_preset("deepseek-v2-lite"), 2, 2048},  // MLA without a query latent
  };
  for (const Case& c : cases) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      for (bool flash : {true, false}) {
        const ModelCost cost = model_cost(c.model, training(c.micro_batch, c.seq_len, r, flash));
        const double formula = model_flops_formula(c.model, c.micro_batch, c.seq_len);
        INFO(c.model.name << " layers " << c.model.layers << " recompute " << static_cast<int>(r) << " flash "
                          << flash);
        CHECK(cost.model_flops == Approx(formula).epsilon(1e-9));
        CHECK(sum_over(cost, &ModuleCost::model_flops) == Approx(formula).epsilon(1e-9));
      }
    }
  }
}

TEST_CASE("backward is 2x forward, a causal flash kernel executes half the core and recomputes QK^T", "[model_math]") {
  const ModelSpec m = llama2_7b();
  const double b = 2, s = 2048, heads = 32, d = 128;
  const double qk = 2 * b * s * s * heads * d;                                    // QK^T in full, and as much for P.V
  const double linear = 2 * b * s * 4096 * (3 * 4096) + 2 * b * s * 4096 * 4096;  // QKV + O forward
  const ModelCost flash = model_cost(m, training(2, 2048, Recompute::kNone, true));
  const ModelCost plain = model_cost(m, training(2, 2048, Recompute::kNone, false));
  for (std::size_t i = 0; i < flash.modules.size(); ++i) {
    const ModuleCost& f = flash.modules[i];
    const ModuleCost& p = plain.modules[i];
    INFO(to_string(f.kind) << " layer " << f.layer);
    CHECK(p.bwd_flops == Approx(2 * p.fwd_flops));
    CHECK(p.fwd_flash_flops + p.bwd_flash_flops + p.recompute_flash_flops == 0);
    if (f.kind == ModuleKind::kAttention) {
      // Unfused, the core in full, as Megatron counts it; the causal flash kernel skips the masked half, and
      // its backward recomputes (half of) QK^T: 2.5 times its forward.
      CHECK(p.fwd_flops == Approx(linear + 2 * qk));
      CHECK(f.fwd_flash_flops == Approx(qk));
      CHECK(f.bwd_flash_flops == Approx(2.5 * qk));
      CHECK(f.fwd_flops == Approx(linear + f.fwd_flash_flops));
      CHECK(f.bwd_flops == Approx(2 * linear + f.bwd_flash_flops));
      CHECK(f.flash_head_dim == 128);
      CHECK(f.flash_seq == s);
    } else {
      CHECK(p.fwd_flops == f.fwd_flops);
      CHECK(f.bwd_flops == Approx(2 * f.fwd_flops));
    }
  }
  // Model FLOPs count the core in full and never see the flash recompute: 3x forward (norms, router aside).
  CHECK(flash.model_flops == Approx(plain.model_flops));
  // Full recompute redoes the flash forward; ring context parallelism gives each kernel call s / c keys,
  // Ulysses the whole sequence.
  const ModuleCost again =
      module_at(model_cost(m, training(2, 2048, Recompute::kFull, true)), ModuleKind::kAttention, 0);
  CHECK(again.recompute_flash_flops == Approx(again.fwd_flash_flops));
  for (const ContextComm comm : {ContextComm::kRing, ContextComm::kAllToAll}) {
    ParallelSpec par;
    par.context = 4;
    par.context_comm = comm;
    const ModuleCost cp =
        module_at(model_cost(m, training(2, 2048, Recompute::kNone, true), par), ModuleKind::kAttention, 0);
    CHECK(cp.fwd_flash_flops == Approx(qk / 4));
    CHECK(cp.flash_seq == (comm == ContextComm::kRing ? s / 4 : s));
  }
}

TEST_CASE("activations match Korthikanti et al., with and without the dropout terms", "[model_math]") {
  // Their §4.1 count assumes ffn = 4h, n_kv = n_h, 2-byte activations, LayerNorm, GELU, a materialised
  // softmax (the GPT family without flash attention) and dropout after the softmax and after each block.
  ModelSpec m = gpt2_small();
  m.layers = 4;
  m.hidden = 1024;
  m.heads = 16;
  m.kv_heads = 16;
  m.ffn_hidden = 4 * 1024;
  const double s = 2048, b = 2, h = 1024, a = 16;
  const double korthikanti = 34 * s * b * h + 5 * a * s * s * b;
  const double dropout_terms = a * s * s * b        // attention dropout mask (1 byte per score)
                               + 2 * a * s * s * b  // attention dropout output kept for P·V; without
                                                    // dropout P·V reads the softmax output, already counted
                               + 2 * s * b * h;     // masks of the two dropouts after attention and MLP
  CHECK(korthikanti - dropout_terms == 32 * s * b * h + 2 * a * s * s * b);

  for (const bool dropout : {false, true}) {
    INFO("dropout " << dropout);
    TrainingSpec t = training(2, 2048, Recompute::kNone, false);
    t.attention_dropout = dropout ? 0.1 : 0;
    t.hidden_dropout = dropout ? 0.1 : 0;
    const ModelCost cost = model_cost(m, t);
    const double expected_layer = dropout ? korthikanti : korthikanti - dropout_terms;
    for (int layer = 0; layer < m.layers; ++layer) {
      const double ours = module_at(cost, ModuleKind::kAttention, layer).activation_bytes +
                          module_at(cost, ModuleKind::kMlp, layer).activation_bytes;
      CHECK(ours == Approx(expected_layer).epsilon(1e-12));
    }
  }
}

TEST_CASE("dropout costs a pass over the scores without flash attention, nothing with it", "[model_math]") {
  // GPT-2 small shape, micro-batch 2 x 1024 tokens, bf16.
  const ModelSpec m = gpt2_small();
  const double b = 2, s = 1024, h = static_cast<double>(m.hidden), a = m.heads, e = 2;
  const double scores = b * a * s * s, tokens = b * s;
  auto layer0 = [&](bool flash, double attention, double hidden, ModuleKind kind) {
    TrainingSpec t = training(2, 1024, Recompute::kNone, flash);
    t.attention_dropout = attention;
    t.hidden_dropout = hidden;
    return module_at(model_cost(m, t), kind, 0);
  };
  const ModuleCost plain = layer0(false, 0, 0, ModuleKind::kAttention);
  const ModuleCost dropped = layer0(false, 0.1, 0, ModuleKind::kAttention);
  // Forward reads P, writes P' and a 1-byte mask; backward reads dP' and the mask, writes dP.
  CHECK(dropped.fwd_mem_bytes - plain.fwd_mem_bytes == Approx(scores * (2 * e + 1)));
  CHECK(dropped.bwd_mem_bytes - plain.bwd_mem_bytes == Approx(scores * (2 * e + 1)));
  CHECK(dropped.fwd_flops == plain.fwd_flops);
  // The probability does not matter, only whether there is dropout.
  CHECK(layer0(false, 0.5, 0, ModuleKind::kAttention).fwd_mem_bytes == dropped.fwd_mem_bytes);
  // Flash attention fuses it: no traffic, nothing kept.
  const ModuleCost flash = layer0(true, 0, 0, ModuleKind::kAttention);
  const ModuleCost flash_dropped = layer0(true, 0.1, 0, ModuleKind::kAttention);
  CHECK(flash_dropped.fwd_mem_bytes == flash.fwd_mem_bytes);
  CHECK(flash_dropped.activation_bytes == flash.activation_bytes);
  // Hidden dropout, fused into the residual add: a mask written, read back and kept, in both blocks.
  for (const ModuleKind kind : {ModuleKind::kAttention, ModuleKind::kMlp}) {
    const ModuleCost without = layer0(true, 0, 0, kind);
    const ModuleCost with = layer0(true, 0, 0.1, kind);
    CHECK(with.fwd_mem_bytes - without.fwd_mem_bytes == Approx(tokens * h));
    CHECK(with.bwd_mem_bytes - without.bwd_mem_bytes == Approx(tokens * h));
    CHECK(with.activation_bytes - without.activation_bytes == Approx(tokens * h));
  }
}

TEST_CASE("recompute settings trade activations for recompute FLOPs", "[model_math]") {
  const ModelSpec m = llama2_7b();
  const double b = 1, s = 4096, h = 4096, heads = 32, e = 2;
  const double probs = b * heads * s * s * e;
  const double core_fwd = 4 * b * s * s * heads * (h / heads);
  const double logits_fp32 = b * s * 32000 * 4;

  SECTION("without flash attention") {
    const ModelCost none = model_cost(m, training(1, 4096, Recompute::kNone, false));
    const ModelCost selective = model_cost(m, training(1, 4096, Recompute::kSelective, false));
    const ModelCost full = model_cost(m, training(1, 4096, Recompute::kFull, false));

    CHECK(none.activation_bytes - selective.activation_bytes == Approx(32 * probs));
    CHECK(sum_over(none, &ModuleCost::recompute_flops) == 0);
    CHECK(sum_over(selective, &ModuleCost::recompute_flops) == Approx(32 * core_fwd));
    CHECK(sum_over(selective, &ModuleCost::recompute_mem_bytes) == Approx(32 * 2 * probs));  // softmax r + w

    // Full: the layer input per layer, plus the head's two saved inputs; embedding saves nothing.
    CHECK(full.activation_bytes == Approx(32 * b * s * h * e + 2 * b * s * h * e));
    double layer_fwd = 0, layer_fwd_mem = 0;
    for (const ModuleCost& c : full.modules) {
      if (c.layer < 0) continue;
      layer_fwd += c.fwd_flops;
      layer_fwd_mem += c.fwd_mem_bytes;
      CHECK(c.recompute_flops == c.fwd_flops);
      if (c.kind == ModuleKind::kMlp) CHECK(c.activation_bytes == 0);
    }
    CHECK(sum_over(full, &ModuleCost::recompute_flops) == Approx(layer_fwd));
    CHECK(sum_over(full, &ModuleCost::recompute_mem_bytes) == Approx(layer_fwd_mem));

    // Transients: one layer's rebuilt set (everything but its checkpointed input) beats the fp32 logits
    // at s = 4096 without flash; selective rebuilds one layer's probabilities.
    const double layer_none = (none.activation_bytes - 2 * b * s * h * e) / 32;
    CHECK(full.transient_bytes == Approx(layer_none - b * s * h * e));
    CHECK(full.transient_bytes > logits_fp32);
    CHECK(selective.transient_bytes == Approx(std::max(probs, logits_fp32)));
    CHECK(none.transient_bytes == Approx(logits_fp32));
  }

  SECTION("with flash attention") {
    const ModelCost none = model_cost(m, training(1, 4096, Recompute::kNone, true));
    const ModelCost selective = model_cost(m, training(1, 4096, Recompute::kSelective, true));
    CHECK(selective.activation_bytes == none.activation_bytes);
    CHECK(sum_over(selective, &ModuleCost::recompute_flops) == 0);
    CHECK(selective.transient_bytes == Approx(logits_fp32));

    // Flash keeps the logsumexp (fp32 per head per row) instead of the s² probabilities.
    const ModelCost plain = model_cost(m, training(1, 4096, Recompute::kNone, false));
    const ModuleCost& a_flash = module_at(none, ModuleKind::kAttention, 0);
    const ModuleCost& a_plain = module_at(plain, ModuleKind::kAttention, 0);
    CHECK(a_plain.activation_bytes - a_flash.activation_bytes == Approx(probs - b * heads * s * 4));
    // ...and never moves the scores through HBM: softmax forward reads + writes them, backward 3 passes.
    CHECK(a_plain.fwd_mem_bytes - a_flash.fwd_mem_bytes == Approx(2 * probs));
    CHECK(a_plain.bwd_mem_bytes - a_flash.bwd_mem_bytes == Approx(3 * probs));
  }
}

TEST_CASE("without flash attention the core's GEMMs carry their s x s operand's bytes", "[model_math]") {
  // GPT-2 small: 12 heads of d = 64, micro-batch 2 x 1024 tokens, bf16.
  const ModelSpec m = gpt2_small();
  const double b = 2, s = 1024, a = 12, hd = 64, e = 2;
  const double gemm_flops = 2 * b * a * s * s * hd;                    // one of QK^T, P.V, dP, dV, dQ, dK
  const double gemm_bytes = (b * a * s * s + 2 * b * a * s * hd) * e;  // the s x s matrix, Q or dO, K or V
  auto attention = [&](bool flash, Recompute recompute) {
    return module_at(model_cost(m, training(2, 1024, recompute, flash)), ModuleKind::kAttention, 0);
  };
  const ModuleCost unfused = attention(false, Recompute::kNone);
  CHECK(unfused.fwd_core_flops == Approx(2 * gemm_flops));
  CHECK(unfused.fwd_core_bytes == Approx(2 * gemm_bytes));
  CHECK(unfused.bwd_core_flops == Approx(4 * gemm_flops));
  CHECK(unfused.bwd_core_bytes == Approx(4 * gemm_bytes));
  CHECK(unfused.recompute_core_flops == 0);
  // e / (2d) bytes per FLOP and more: above the 0.0077 of an A100 at its table efficiencies.
  CHECK(unfused.fwd_core_bytes / unfused.fwd_core_flops > e / (2 * hd));
  // Recomputation redoes the forward core; flash attention has no such GEMMs.
  for (const Recompute r : {Recompute::kSelective, Recompute::kFull}) {
    const ModuleCost again = attention(false, r);
    CHECK(again.recompute_core_flops == again.fwd_core_flops);
    CHECK(again.recompute_core_bytes == again.fwd_core_bytes);
  }
  const ModuleCost flash = attention(true, Recompute::kFull);
  CHECK(flash.fwd_core_flops + flash.bwd_core_flops + flash.recompute_core_flops == 0);
  CHECK(flash.fwd_core_bytes + flash.bwd_core_bytes + flash.recompute_core_bytes == 0);
}

TEST_CASE("FP8 runs the linear layers' GEMMs in FP8 and casts their operands, nothing else", "[model_math]") {
  // Llama-2-7B shape (MHA, SwiGLU, f = 11008), 1 x 4096 tokens, bf16 (e = 2 bytes).
  const ModelSpec m = llama2_7b();
  const double t = 4096, h = 4096, f = 11008, e = 2, v = 32000;
  auto costs = [&](bool fp8, Recompute recompute) {
    TrainingSpec tr = training(1, 4096, recompute);
    tr.fp8 = fp8;
    return model_cost(m, tr);
  };
  const ModelCost bf16 = costs(false, Recompute::kNone);
  const ModelCost fp8 = costs(true, Recompute::kNone);
  // The same work, in another format: FLOPs and model FLOPs do not change.
  CHECK(fp8.model_flops == bf16.model_flops);
  for (const ModuleCost& c : bf16.modules) {
    CHECK(c.fwd_fp8_flops == 0);
    CHECK(c.bwd_fp8_flops == 0);
  }

  const ModuleCost& attention = module_at(fp8, ModuleKind::kAttention, 0);
  const ModuleCost& mlp = module_at(fp8, ModuleKind::kMlp, 0);
  // Q, K, V and the output projection in FP8; QK^T and P.V (and flash's recompute of QK^T) not.
  CHECK(attention.fwd_fp8_flops == Approx(2 * t * h * 3 * h + 2 * t * h * h));
  CHECK(attention.bwd_fp8_flops == Approx(2 * attention.fwd_fp8_flops));
  CHECK(attention.fwd_flops - attention.fwd_fp8_flops == Approx(2 * t * t * h));  // the causal kernel's half
  // Gate, up and down: the whole MLP.
  CHECK(mlp.fwd_fp8_flops == Approx(2 * t * h * 3 * f));
  CHECK(mlp.fwd_fp8_flops == Approx(mlp.fwd_flops));
  // The LM head stays in 16 bits (torchtitan skips the output layer; Megatron's is not a TE module).
  CHECK(module_at(fp8, ModuleKind::kHead, -1).fwd_fp8_flops == 0);
  CHECK(module_at(fp8, ModuleKind::kHead, -1).fwd_flops == Approx(2 * t * h * v));

  // Cast traffic: forward casts each input (t x k) and weight (k x n), backward each output gradient
  // (t x n), reading e bytes and writing an FP8 copy and its transpose.
  const ModuleCost& mlp16 = module_at(bf16, ModuleKind::kMlp, 0);
  CHECK(mlp.fwd_mem_bytes - mlp16.fwd_mem_bytes == Approx((t * h + h * 2 * f + t * f + f * h) * (e + 2)));
  CHECK(mlp.bwd_mem_bytes - mlp16.bwd_mem_bytes == Approx((t * 2 * f + t * h) * (e + 2)));
  CHECK(mlp.activation_bytes == mlp16.activation_bytes);

  // Full recompute redoes the FP8 GEMMs; selective recompute only the attention core, which is not FP8.
  const ModelCost full = costs(true, Recompute::kFull);
  for (const ModuleCost& c : full.modules) CHECK(c.recompute_fp8_flops == c.fwd_fp8_flops);
  const ModelCost selective = costs(true, Recompute::kSelective);
  for (const ModuleCost& c : selective.modules) CHECK(c.recompute_fp8_flops == 0);
}

// training.kernels "eager" (docs/model_math.md, "Fused or eager kernels"): PyTorch eager's passes over the
// norms, the rotary embedding, SwiGLU and the loss, in bytes per element as model_math.cc counts them from
// torchtitan's code; the same FLOPs, GEMMs and saved activations.
TEST_CASE("eager kernels add the unfused passes of norms, rotary, SwiGLU and loss, nothing else", "[model_math]") {
  const ModelSpec m = llama2_7b();  // MHA: q and k are h wide each
  const double t = 4096, h = 4096, f = 11008, e = 2, v = 32000;
  auto costs = [&](KernelFusion kernels, Recompute recompute) {
    TrainingSpec tr = training(1, 4096, recompute);
    tr.kernels = kernels;
    return model_cost(m, tr);
  };
  const ModelCost fused = costs(KernelFusion::kFused, Recompute::kNone);
  const ModelCost eager = costs(KernelFusion::kEager, Recompute::kNone);
  CHECK(eager.model_flops == fused.model_flops);
  const double norm_fwd = (28 + 4 * e - 2 * e) * t * h, norm_bwd = (76 + 8 * e - 3 * e) * t * h;
  auto delta = [&](ModuleKind kind, int layer) {
    const ModuleCost& a = module_at(eager, kind, layer);
    const ModuleCost& b = module_at(fused, kind, layer);
    CHECK(a.fwd_flops == b.fwd_flops);
    CHECK(a.bwd_flops == b.bwd_flops);
    CHECK(a.fwd_gemm_bytes == b.fwd_gemm_bytes);
    CHECK(a.activation_bytes == b.activation_bytes);
    return std::pair{a.fwd_mem_bytes - b.fwd_mem_bytes, a.bwd_mem_bytes - b.bwd_mem_bytes};
  };
  const auto [attention_fwd, attention_bwd] = delta(ModuleKind::kAttention, 0);
  CHECK(attention_fwd == Approx(norm_fwd + 16 * t * 2 * h));  // rotary: 16 + 2e against 2e per Q, K element
  CHECK(attention_bwd == Approx(norm_bwd + 16 * t * 2 * h));
  const auto [mlp_fwd, mlp_bwd] = delta(ModuleKind::kMlp, 0);
  CHECK(mlp_fwd == Approx(norm_fwd + (5 - 3) * e * t * f));  // SwiGLU: 5e against 3e, 9e against 5e
  CHECK(mlp_bwd == Approx(norm_bwd + (9 - 5) * e * t * f));
  const auto [head_fwd, head_bwd] = delta(ModuleKind::kHead, -1);
  CHECK(head_fwd == Approx(norm_fwd + (20 + e - 8) * t * v));  // the loss in fp32: 20 + e against 8 per logit
  CHECK(head_bwd == Approx(norm_bwd + (24 + e - 8) * t * v));
  // Full recomputation repeats the eager forward's passes.
  for (const ModuleCost& c : costs(KernelFusion::kEager, Recompute::kFull).modules)
    if (c.kind == ModuleKind::kAttention || c.kind == ModuleKind::kMlp) CHECK(c.recompute_mem_bytes == c.fwd_mem_bytes);
}

TEST_CASE("FP8 MoE layers run the experts in FP8, not the router", "[model_math]") {
  const ModelSpec m = mixtral_8x7b();
  TrainingSpec tr = training(1, 4096);
  tr.fp8 = true;
  const ModuleCost moe = module_at(model_cost(m, tr), ModuleKind::kMoe, 0);
  const double t = 4096, h = 4096, experts = 8, f = 14336, routed = 2 * t, e = 2;
  CHECK(moe.fwd_flops - moe.fwd_fp8_flops == Approx(2 * t * h * experts));
  // Each expert's weights are cast once: all 8 on one GPU, 2 of them with expert parallelism 4.
  tr.fp8 = false;
  const ModuleCost bf16 = module_at(model_cost(m, tr), ModuleKind::kMoe, 0);
  tr.fp8 = true;
  const ModuleCost ep4 = module_at(model_cost(m, tr, {}, 4), ModuleKind::kMoe, 0);
  const double activations = routed * h + routed * f, weights = h * 2 * f + f * h;
  CHECK(moe.fwd_mem_bytes - bf16.fwd_mem_bytes == Approx((activations + experts * weights) * (e + 2)));
  CHECK(ep4.fwd_mem_bytes - bf16.fwd_mem_bytes == Approx((activations + 2 * weights) * (e + 2)));
}

TEST_CASE("fp32 activations take twice the bytes of bf16", "[model_math]") {
  const ModelSpec m = gpt2_small();
  TrainingSpec bf16 = training(4, 512, Recompute::kNone, false);
  TrainingSpec fp32 = bf16;
  fp32.precision = Precision::kFp32;
  const ModelCost half = model_cost(m, bf16);
  const ModelCost single = model_cost(m, fp32);
  CHECK(single.activation_bytes == Approx(2 * half.activation_bytes));
  CHECK(single.model_flops == half.model_flops);
}

TEST_CASE("MoE expert FLOPs scale with top_k, the router's do not", "[model_math]") {
  ModelSpec m = llama(2, 256, 4, 4, 512);
  m.has_moe = true;
  m.moe = {8, 1, 384, {0, 1}};
  const double tokens = 4 * 128;
  const double router = 2 * tokens * 256 * 8;
  const ModuleCost top1 = module_at(model_cost(m, training(4, 128)), ModuleKind::kMoe, 0);
  m.moe.top_k = 2;
  const ModuleCost top2 = module_at(model_cost(m, training(4, 128)), ModuleKind::kMoe, 0);

  const double experts_top1 = top1.fwd_flops - router;
  CHECK(experts_top1 == Approx(2 * (tokens * 1) * 256 * 384 * 3));  // SwiGLU: 3 matrices of h x f
  CHECK(top2.fwd_flops - router == Approx(2 * experts_top1));
  CHECK(top2.model_flops == Approx(2 * top1.model_flops));  // router outside the MFU numerator
  CHECK(top1.model_flops == Approx(3 * experts_top1));
  CHECK(top2.activation_bytes > top1.activation_bytes);
  CHECK(top2.params == top1.params);  // all experts are held regardless of routing
}

TEST_CASE("tiny models give finite, positive costs in every setting", "[model_math]") {
  ModelSpec moe_gpt = gpt2_small();
  moe_gpt.layers = 2;
  moe_gpt.hidden = 64;
  moe_gpt.heads = 4;
  moe_gpt.kv_heads = 4;
  moe_gpt.ffn_hidden = 256;
  moe_gpt.vocab = 256;
  moe_gpt.max_positions = 32;
  moe_gpt.has_moe = true;
  moe_gpt.moe = {4, 2, 128, {1}};
  ModelSpec alibi = moe_gpt;
  alibi.position = PositionEmbedding::kAlibi;
  alibi.tied_embeddings = false;
  alibi.has_moe = false;

  for (const ModelSpec& m : {llama(2, 64, 4, 1, 176), moe_gpt, alibi}) {
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      for (bool flash : {true, false}) {
        const ModelCost cost = model_cost(m, training(2, 32, r, flash));
        CHECK(cost.params > 0);
        CHECK(std::isfinite(cost.model_flops));
        CHECK(cost.model_flops > 0);
        CHECK(cost.activation_bytes > 0);
        CHECK(cost.transient_bytes > 0);
        for (const ModuleCost& c : cost.modules) {
          INFO(to_string(c.kind) << " layer " << c.layer);
          CHECK(c.params > 0);
          CHECK(c.fwd_mem_bytes > 0);
          CHECK(c.bwd_mem_bytes > 0);
          CHECK(c.activation_bytes >= 0);
          CHECK(std::isfinite(c.bwd_flops));
          if (c.kind != ModuleKind::kEmbedding) {
            CHECK(c.fwd_flops > 0);
            CHECK(c.bwd_flops > 0);
            CHECK(c.model_flops > 0);
          }
        }
      }
    }
  }
}

}  // namespace
TEST_CASE("PASA adds its key-shifting GEMM to the attention's forward FLOPs, not to model FLOPs", "[model_math]") {
  TrainingSpec standard = training(2, 4096);
  standard.precision = Precision::kFp16;
  TrainingSpec pasa = standard;
  pasa.attention = AttentionAlgorithm::kPasa;
  const ModelSpec m = llama2_70b();  // GQA: the shift runs on the 8 kv heads' keys
  const ModelCost standard_cost = model_cost(m, standard), pasa_cost = model_cost(m, pasa);
  const ModuleCost& a = module_at(standard_cost, ModuleKind::kAttention, 0);
  const ModuleCost& b = module_at(pasa_cost, ModuleKind::kAttention, 0);
  // K' = M K per block of 128 keys: 2 * 128 * head_dim FLOPs per key row and kv head.
  const double keys = 2.0 * 4096 * m.kv_heads;
  CHECK(b.fwd_flops - a.fwd_flops == Approx(2 * keys * 128 * m.head_dim()));
  CHECK(b.bwd_flops == a.bwd_flops);
  CHECK(b.model_flops == a.model_flops);
  CHECK((b.fwd_flops - a.fwd_flops) / a.fwd_flops < 0.01);  // well under 1 % of the layer's attention work
}

}  // namespace hzp

namespace hzp {
namespace {

// A small MLA model with every width distinct, so a misplaced width shows.
ModelSpec small_mla(std::int64_t q_lora_rank) {
  ModelSpec m = llama_model("test-mla", 2, 256, 8, 8, 640, 1000, 4096);
  m.has_mla = true;
  m.mla = {q_lora_rank, 48, 24, 8, 20};
  return m;
}

}  // namespace

TEST_CASE("MLA's parameters and FLOPs against a hand count of its projections", "[model_math]") {
  // h = 256, 8 heads, q latent 96, kv latent 48, per head 24 unrotated + 8 rotary query/key dims, 20 value dims.
  //   q_a 256·96 + q norm 96 + q_b 96·8·32 = 24576 + 96 + 24576 = 49248
  //   kv_a 256·(48 + 8) + kv norm 48 + kv_b 48·8·(24 + 20) = 14336 + 48 + 16896 = 31280
  //   o 8·20·256 = 40960; input norm 256                      total 121744
  const ModelSpec m = small_mla(96);
  const ModelCost cost = model_cost(m, training(1, 64));
  const ModuleCost& attention = module_at(cost, ModuleKind::kAttention, 0);
  CHECK(attention.params == 121744);
  CHECK(attention.tensors == 8);
  // Without a query latent: q 256·8·32 = 65536 replaces 49248.
  const ModelCost direct = model_cost(small_mla(0), training(1, 64));
  CHECK(module_at(direct, ModuleKind::kAttention, 0).params == 121744 - 49248 + 65536);
  // Model FLOPs of one layer's attention, 64 tokens: 6 per weight and token (the norms are not matmuls) plus
  // the core's QK^T (32 dims) and PV (20 dims) over all 64 keys: 6·64·(121744 - 256 - 96 - 48) + 6·64·64·8·(32 + 20).
  CHECK(attention.model_flops == Approx(6.0 * 64 * (121744 - 256 - 96 - 48) + 6.0 * 64 * 64 * 8 * 52).epsilon(1e-12));
  // Tensor parallelism splits the per-head projections, not the down-projections and latent norms.
  ParallelSpec tp;
  tp.tensor = 2;
  const ModelCost split = model_cost(m, training(1, 64), tp);  // kept: module_at returns a reference into it
  const ModuleCost& half = module_at(split, ModuleKind::kAttention, 0);
  CHECK(half.params == 256 + (24576 + 96) + (14336 + 48) + (24576 + 16896 + 40960) / 2);
  // Each rank runs the down-projections on all its tokens, but the MFU numerator counts them once.
  CHECK(2 * half.model_flops == Approx(attention.model_flops).epsilon(1e-12));
  CHECK(half.fwd_flops > attention.fwd_flops / 2);
}

TEST_CASE("shared experts add one dense MLP of their width to every MoE layer", "[model_math]") {
  ModelSpec m = llama(4, 256, 4, 2, 512);
  m.has_moe = true;
  m.moe = {8, 2, 128, {1, 3}};
  ModelSpec shared = m;
  shared.moe.shared_ffn_hidden = 192;
  const TrainingSpec t = training(2, 32);
  const ModelCost without = model_cost(m, t), with = model_cost(shared, t);
  CHECK(parameter_count(shared) - parameter_count(m) == 2 * 3 * 256 * 192);
  const ModuleCost& a = module_at(without, ModuleKind::kMoe, 1);
  const ModuleCost& b = module_at(with, ModuleKind::kMoe, 1);
  CHECK(b.params - a.params == 3 * 256 * 192);
  CHECK(b.expert_params == a.expert_params);  // not split by expert parallelism
  CHECK(b.model_flops - a.model_flops == Approx(6.0 * 64 * 3 * 256 * 192).epsilon(1e-12));
  CHECK(b.activation_bytes - a.activation_bytes == Approx(3.0 * 64 * 192 * 2).epsilon(1e-12));  // gate, up, product
  CHECK(module_at(with, ModuleKind::kMlp, 0).params == module_at(without, ModuleKind::kMlp, 0).params);
}

TEST_CASE("a two-matrix MLP: Nemotron-4 15B as its paper counts it, squared ReLU costed as GELU", "[model_math]") {
  // "3.2 billion embedding parameters and 12.5 billion non-embedding parameters" (arXiv 2402.16819, §2); a
  // SwiGLU MLP of the same width would add 32 x 6144 x 24576 = 4.8 B.
  const ModelSpec m = nemotron4_15b();
  const double embedding = 2.0 * 256000 * 6144;  // untied input and output tables
  const double body = static_cast<double>(parameter_count(m)) - embedding;
  CHECK(embedding == Approx(3.2e9).epsilon(0.02));
  CHECK(body == Approx(12.5e9).epsilon(0.005));
  ModelSpec gated = m;
  gated.mlp = MlpKind::kSwiGlu;
  CHECK(parameter_count(gated) - parameter_count(m) == std::int64_t{32} * 6144 * 24576);

  // Squared ReLU and GELU differ only in the elementwise function: same FLOPs, bytes and saved activations.
  ModelSpec gelu = m;
  gelu.mlp = MlpKind::kGelu;
  const TrainingSpec t = training(2, 512);
  const ModelCost squared_cost = model_cost(m, t), gelu_cost = model_cost(gelu, t), gated_cost = model_cost(gated, t);
  const ModuleCost& a = module_at(squared_cost, ModuleKind::kMlp, 0);
  const ModuleCost& b = module_at(gelu_cost, ModuleKind::kMlp, 0);
  CHECK(a.fwd_flops == b.fwd_flops);
  CHECK(a.fwd_mem_bytes == b.fwd_mem_bytes);
  CHECK(a.bwd_mem_bytes == b.bwd_mem_bytes);
  CHECK(a.activation_bytes == b.activation_bytes);
  // Against SwiGLU: two of the three matrices' FLOPs; the activation reads one tensor and saves two, not three.
  const ModuleCost& c = module_at(gated_cost, ModuleKind::kMlp, 0);
  CHECK(a.fwd_flops == Approx(c.fwd_flops * 2.0 / 3.0).epsilon(1e-12));
  CHECK(c.activation_bytes - a.activation_bytes == Approx(1024.0 * 24576 * 2).epsilon(1e-12));
  CHECK(model_flops_formula(m, 1, 4096) < model_flops_formula(gated, 1, 4096));
}

}  // namespace hzp
