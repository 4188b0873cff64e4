// Built-in presets: models, clusters and sharding policies, each in one explicit table.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp {

// Models: llama2-7b, llama2-13b, llama-30b, llama2-70b, gpt3-175b, mixtral-8x7b, tiny-dense, tiny-moe.
Result<ModelSpec> model_preset(std::string_view name);
std::vector<std::string> model_preset_names();

// A LLaMA-family model (RoPE, SwiGLU, untied embeddings): the shape every LLaMA preset is built from.
ModelSpec llama_model(std::string_view name, int layers, std::int64_t hidden, int heads, int kv_heads, std::int64_t ffn,
                      std::int64_t vocab, std::int64_t max_positions);

// Clusters: dgx-a100, a800, dgx-h100, h800, npu-16 (16 accelerators per node, full mesh, RoCE).
// `nodes` is left at the preset's default (1); scenarios override it. Efficiencies come from
// calibration.h for the preset's GPU type.
Result<ClusterSpec> cluster_preset(std::string_view name);
std::vector<std::string> cluster_preset_names();

// Fabric used by every cluster preset and by explicit clusters that omit `inter_node`: a non-blocking fat
// tree with 32 nodes per leaf switch and 0.5 us per switch traversed (assumptions, see presets.cc).
InterNodeSpec default_inter_node();

// Sharding policies in AMSP notation (arXiv 2311.00257 §III) for a cluster of `gpus_per_node` x `nodes`:
//   ddp: P,G,OS replicated           zero1: OS full          zero2: G,OS full     zero3/fsdp: all full
//   hsdp, mics: all in one node      zeropp: all full (its secondary intra-node copy is a schedule feature)
//   asynchzp: P,G in the node, OS full
// "amsp" has no fixed sharding (explicit groups, or the planner's pick) and returns kInvalidInput here.
Result<ShardingSpec> sharding_preset(Policy policy, int gpus_per_node, int nodes);

std::vector<std::string> policy_preset_names();

// AMSP's validity rules (arXiv 2311.00257 §III) for explicit sharding on a gpus_per_node x nodes data-parallel group.
// `path` is the JSON path prefix used in messages (e.g. "policy.sharding").
Status check_sharding(const ShardingSpec& sharding, int gpus_per_node, int nodes, std::string_view path);

// Frameworks' collective choices for data parallelism (policy.comm.framework): hzp (the default), internevo,
// deepspeed, fsdp, megatron. Each row: the CommSpec, its gradient bucket, and where each choice is documented.
struct FrameworkComm {
  const char* name;
  CommSpec comm;
  std::int64_t bucket_bytes;  // gradient bucket in bytes of bf16 gradients
  const char* source;
  // Gradients reduced in fp32 when the working precision is bf16 (not fp16): Megatron-LM's rule.
  bool grad_reduce_in_fp32_with_bf16 = false;
};
Result<FrameworkComm> framework_comm(std::string_view name);
std::vector<std::string> framework_names();

}  // namespace hzp
