// Model math per module: parameter counts, forward/backward FLOPs, memory-bound bytes and activation bytes.
//
// Granularity is the module, the unit the schedule IR computes on: the embedding, each layer's attention
// block (pre-norm + QKV + attention core + output projection), each layer's MLP block (pre-norm + dense MLP,
// or router + routed and shared experts for MoE layers; attention is grouped-query or multi-head latent), and the head
// (final norm + output projection + loss). All numbers are for ONE micro-batch on ONE GPU (training.micro_batch
// sequences of training.seq_len).
//
// Conventions (documented in docs/model_math.md):
// - A matmul of (m x k) by (k x n) costs 2mkn FLOPs. Backward of a matmul = 2x its forward.
// - "FLOPs" below are hardware FLOPs actually executed (they include recomputation); `model_flops` is the
//   MFU numerator (Megatron/LLaMA count, docs/model_math.md: causal attention not halved, no recomputation).
// - "mem_bytes" is the HBM traffic of the memory-bound kernels only (norms, activations, softmax,
//   residual adds, rotary, elementwise); GEMM operand traffic is folded into the GEMM efficiency, except for
//   the unfused attention core ("core" below), whose s x s operand can make its GEMMs memory-bound.
// - Activation bytes are those saved for backward, in the training precision (2 bytes for bf16/fp16).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/scenario/scenario.h"

namespace hzp {

enum class ModuleKind { kEmbedding, kAttention, kMlp, kMoe, kHead };
const char* to_string(ModuleKind kind);

// DeepSpeed ZeRO-3 keeps parameters below stage3_param_persistence_threshold (default 1e5 elements)
// unpartitioned on every rank and all-gathers the others per leaf module (docs: zero config).
inline constexpr std::int64_t kLargeTensorElements = 100000;

struct ModuleCost {
  ModuleKind kind = ModuleKind::kEmbedding;
  int layer = -1;                  // -1 for embedding and head
  std::int64_t params = 0;         // parameters owned by this module (a tied head owns only the final norm)
  std::int64_t expert_params = 0;  // of which expert weights (MoE: experts x one expert MLP), split by EP
  int tensors = 0;                 // parameter tensors (a weight and its bias are two)
  int large_tensors = 0;           // of which >= kLargeTensorElements (DeepSpeed ZeRO-3 gathers these one by one)
  double fwd_flops = 0;            // forward matmul FLOPs (incl. the MoE router; norms are costed in mem_bytes)
  double fwd_mem_bytes = 0;        // forward memory-bound HBM bytes
  double bwd_flops = 0;            // backward FLOPs, incl. flash-attention's recompute of scores
  double bwd_mem_bytes = 0;
  double recompute_flops = 0;  // extra forward FLOPs redone before backward (selective/full recompute)
  double recompute_mem_bytes = 0;
  // Of the FLOPs above, those run in FP8 (TrainingSpec::fp8: the linear layers' GEMMs; 0 without FP8).
  double fwd_fp8_flops = 0;
  double bwd_fp8_flops = 0;
  double recompute_fp8_flops = 0;
  // Of the FLOPs above, those of the attention core's GEMMs without flash attention (QKᵀ, P·V and their
  // gradients: each reads or writes an s x s matrix), and the HBM bytes of their operands. They are timed as a
  // roofline, max(FLOPs at the GEMM rate, bytes at the HBM rate): small head dimensions make them memory-bound.
  double fwd_core_flops = 0;
  double fwd_core_bytes = 0;
  double bwd_core_flops = 0;
  double bwd_core_bytes = 0;
  double recompute_core_flops = 0;
  double recompute_core_bytes = 0;
  // Of the FLOPs above, the causal flash-attention kernel's as it executes them: the unmasked half of QKᵀ and
  // P·V forward, backward their gradients and QKᵀ again (2.5 times forward). They run at their own rate, a
  // multiple of the GEMM rate by head dimension and the keys one kernel call sees (flash_vs_gemm).
  double fwd_flash_flops = 0;
  double bwd_flash_flops = 0;
  double recompute_flash_flops = 0;
  int flash_head_dim = 0;
  double flash_seq = 0;
  // The GEMM kernels of the linear layers, the router and the LM head (the core's are above), and their
  // operands' bytes: each GEMM reads its two inputs and writes its output once. One kernel per weight a
  // GPU holds (an expert's rows are one product, as a loop over experts or a grouped GEMM's problem runs).
  int fwd_gemms = 0, bwd_gemms = 0, recompute_gemms = 0;
  double fwd_gemm_bytes = 0, bwd_gemm_bytes = 0, recompute_gemm_bytes = 0;
  double activation_bytes = 0;  // saved for backward under the scenario's recompute setting
  double model_flops = 0;       // MFU numerator contribution: fwd + bwd model FLOPs
};

struct ModelCost {
  std::vector<ModuleCost> modules;  // embedding, then (attention, mlp|moe) per layer, then head
  std::int64_t params = 0;          // total parameters (sum over modules)
  double model_flops = 0;           // per micro-batch per GPU, sum of modules' model_flops
  double activation_bytes = 0;      // sum of modules' activation_bytes
  double transient_bytes = 0;       // peak scratch beyond saved activations (e.g. fp32 logits for the loss,
                                    // one layer's full activations while it is recomputed)
};

// Per-module costs for one micro-batch of `training` on one GPU. With tensor parallelism (parallel.tensor >
// 1) each module's parameters, FLOPs, bytes and activations are one tensor rank's share (docs/model_math.md).
// `expert_parallel` (policy.expert_parallel) only sets how many experts' weights a GPU casts to FP8.
ModelCost model_cost(const ModelSpec& model, const TrainingSpec& training, const ParallelSpec& parallel = {},
                     int expert_parallel = 1);
// ... of a scenario (its model, training and policy.parallel): what every executor and report uses.
ModelCost scenario_cost(const Scenario& scenario);

// Parameter count of the whole model (== model_cost(...).params).
std::int64_t parameter_count(const ModelSpec& model);

// The closed form of docs/model_math.md (Megatron-LM, Narayanan et al. 2021, with GQA and SwiGLU terms) for model FLOPs
// of `sequences` sequences of `seq_len` tokens (fwd + bwd): F = 12·B·s·L·h²·[(1 + n_kv/n_h + s/h)·(n_h·d_head/h) +
// (f/h)·topk·(3/2) + V/(2·L·h)]. For MoE models with MoE in every layer, f is the expert width and topk the routing
// fan-out (plus the shared experts' width at topk 1); with a mix of dense and MoE layers the MLP term is averaged over
// layers. Under multi-head latent attention the attention term is its projections' and core's FLOPs in the same units.
double model_flops_formula(const ModelSpec& model, std::int64_t sequences, std::int64_t seq_len);

}  // namespace hzp
