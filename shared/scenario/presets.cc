// Built-in presets: the model, cluster and sharding-policy tables, and AMSP's sharding validity rules (arXiv 2311.00257
// §III).
#include "shared/scenario/presets.h"

#include <algorithm>
#include <numeric>

#include "shared/base/text.h"
#include "shared/policy/policy_registry.h"
#include "shared/scenario/calibration.h"

namespace hzp {
namespace {

std::string show(const ShardGroup& g) {
  return "[" + std::to_string(g.s0) + ", " + std::to_string(g.s1) + "]";
}

// ---------------------------------------------------------------------------------------------------------
// Models (numbers from the papers / Hugging Face configs)
// ---------------------------------------------------------------------------------------------------------

ModelSpec with_moe(ModelSpec m, const char* name, int experts, int top_k, std::int64_t expert_ffn) {
  m.name = name;
  m.has_moe = true;
  m.moe.experts = experts;
  m.moe.top_k = top_k;
  m.moe.expert_ffn_hidden = expert_ffn;
  m.moe.layers.resize(m.layers);
  std::iota(m.moe.layers.begin(), m.moe.layers.end(), 0);
  return m;
}

// DeepSeek-V2/V3 (Hugging Face deepseek-ai/*/config.json): multi-head latent attention in every layer, dense
// MLPs in the first `dense_layers` layers, then routed experts plus shared experts (their widths summed). Left out:
// V3's routing bias (one number per expert) and its multi-token-prediction module (DeepSeek counts 671 B without
// it), and the node-limited routing (each token's experts on at most 4 nodes), which the all-to-all does not model.
ModelSpec deepseek_model(const char* name, int layers, std::int64_t hidden, int heads, std::int64_t ffn,
                         std::int64_t vocab, MlaSpec mla, int experts, int top_k, std::int64_t expert_ffn,
                         std::int64_t shared_ffn, int dense_layers) {
  ModelSpec m =
      with_moe(llama_model(name, layers, hidden, heads, heads, ffn, vocab, 163840), name, experts, top_k, expert_ffn);
  m.moe.shared_ffn_hidden = shared_ffn;
  m.moe.layers.erase(m.moe.layers.begin(), m.moe.layers.begin() + dense_layers);
  m.has_mla = true;
  m.mla = mla;
  return m;
}

std::vector<ModelSpec> build_models() {
  ModelSpec gpt3 = llama_model("gpt3-175b", 96, 12288, 96, 96, 49152, 50257, 2048);  // GPT-3 paper, Table 2.1
  gpt3.family = ModelFamily::kGpt;
  gpt3.tied_embeddings = true;
  gpt3.position = PositionEmbedding::kLearned;
  gpt3.mlp = MlpKind::kGelu;

  ModelSpec tiny = llama_model("tiny-dense", 4, 128, 4, 4, 352, 256, 2048);  // byte-level model for the CPU runtime
  ModelSpec mixtral = llama_model("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000, 32768);
  ModelSpec mixtral22 = llama_model("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32000, 65536);
  // Qwen2.5 (Hugging Face Qwen/Qwen2.5-*/config.json): the LLaMA layout with a bias on q, k and v (h + 2
  // kv_heads x head_dim parameters per layer, left out: under 0.01 % of the model); 7B and 72B untie the head.
  return {
      llama_model("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
      llama_model("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
      llama_model("llama-30b", 60, 6656, 52, 52, 17920, 32000, 2048),
      llama_model("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
      // meta-llama/Meta-Llama-3-*/config.json, Llama-3.1-*/config.json (3.1: the same shapes, 128K positions)
      llama_model("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192),
      llama_model("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192),
      llama_model("llama3.1-8b", 32, 4096, 32, 8, 14336, 128256, 131072),
      llama_model("llama3.1-70b", 80, 8192, 64, 8, 28672, 128256, 131072),
      llama_model("llama3.1-405b", 126, 16384, 128, 8, 53248, 128256, 131072),
      llama_model("qwen2.5-7b", 28, 3584, 28, 4, 18944, 152064, 32768),
      llama_model("qwen2.5-14b", 48, 5120, 40, 8, 13824, 152064, 32768),
      llama_model("qwen2.5-32b", 64, 5120, 40, 8, 27648, 152064, 32768),
      llama_model("qwen2.5-72b", 80, 8192, 64, 8, 29568, 152064, 32768),
      gpt3,
      with_moe(mixtral, "mixtral-8x7b", 8, 2, 14336),
      with_moe(mixtral22, "mixtral-8x22b", 8, 2, 16384),  // mistralai/Mixtral-8x22B-v0.1/config.json
      // 671 B parameters, 37 B activated per token (DeepSeek-V3 technical report, arXiv 2412.19437 §4.2)
      deepseek_model("deepseek-v3", 61, 7168, 128, 18432, 129280, {1536, 512, 128, 64, 128}, 256, 8, 2048, 2048, 3),
      // 236 B and 15.7 B parameters, 21 B and 2.4 B activated (DeepSeek-V2, arXiv 2405.04434 §3.1 and App. B)
      deepseek_model("deepseek-v2", 60, 5120, 128, 12288, 102400, {1536, 512, 128, 64, 128}, 160, 6, 1536, 2 * 1536, 1),
      deepseek_model("deepseek-v2-lite", 27, 2048, 16, 10944, 102400, {0, 512, 128, 64, 128}, 64, 6, 1408, 2 * 1408, 1),
      tiny,
      with_moe(tiny, "tiny-moe", 4, 2, 176),
  };
}

const std::vector<ModelSpec>& models() {
  static const std::vector<ModelSpec> table = build_models();
  return table;
}

// ---------------------------------------------------------------------------------------------------------
// Clusters. Bandwidths are per direction: NVLink "600 GB/s bidirectional" is 300 GB/s here.
// ---------------------------------------------------------------------------------------------------------

struct ClusterRow {
  const char* name;
  const char* gpu_type;
  int gpus_per_node;
  IntraNodeTopology topology;
  double intra_GBps;
  int nics;
  double nic_Gbps;
  // dgx-a100: NVIDIA DGX A100 datasheet (NVLink 600 GB/s bidirectional, 8x 200 Gb/s HDR).
  // a800:     NVIDIA A800 SXM datasheet (NVLink 400 GB/s bidirectional); 4x 200 Gb/s HDR per node is AMSP's
  //           test bed (arXiv 2311.00257 §V).
  // dgx-h100: NVIDIA DGX H100 datasheet (NVLink 900 GB/s bidirectional, 8x 400 Gb/s NDR).
  // h800:     NVIDIA H800 SXM datasheet (NVLink 400 GB/s bidirectional); 8x 400 Gb/s NICs is an
  //           assumption (the DGX H100 NIC complement, which H800 servers copy).
  // dgx-h200: NVIDIA DGX H200 datasheet (8x H200, NVLink 900 GB/s bidirectional, 8x 400 Gb/s ConnectX-7).
  // dgx-b200: NVIDIA DGX B200 datasheet (8x B200, NVLink5 1.8 TB/s bidirectional per GPU (14.4 TB/s
  //           aggregate), 8x 400 Gb/s ConnectX-7 for the compute fabric).
  // npu-16:   AsyncHZP's evaluation (arXiv 2510.20111: 16 accelerators per node, full mesh at 400 GB/s bidirectional,
  // RoCE 200 Gb/s);
  //           8 NICs per node is an assumption (one NIC per two accelerators; AsyncHZP does not state it).
};

constexpr ClusterRow kClusters[] = {
    {"dgx-a100", "a100-80gb", 8, IntraNodeTopology::kSwitch, 300, 8, 200},
    {"a800", "a800-80gb", 8, IntraNodeTopology::kSwitch, 200, 4, 200},
    {"dgx-h100", "h100-sxm", 8, IntraNodeTopology::kSwitch, 450, 8, 400},
    {"h800", "h800-sxm", 8, IntraNodeTopology::kSwitch, 200, 8, 400},
    {"dgx-h200", "h200-sxm", 8, IntraNodeTopology::kSwitch, 450, 8, 400},
    {"dgx-b200", "b200", 8, IntraNodeTopology::kSwitch, 900, 8, 400},
    {"npu-16", "npu-910b", 16, IntraNodeTopology::kFullMesh, 200, 8, 200},
};

// Fabric defaults (default_inter_node()).
constexpr int kDefaultLeafSize = 32;              // assumption: a 64-port leaf switch, half its ports down
constexpr double kDefaultSwitchLatency = 0.5e-6;  // assumption: IB switches are ~0.1-0.2 us port to port,
                                                  // Ethernet (RoCE) ~0.5-1 us; 0.5 us covers both plus cables

ShardGroup group_for(ShardScope scope, int gpus_per_node, int nodes) {
  switch (scope) {
    case ShardScope::kNode:
      return {gpus_per_node, 1};
    case ShardScope::kFull:
      return {gpus_per_node, nodes};
    default:
      return {1, 1};
  }
}

}  // namespace

ModelSpec llama_model(std::string_view name, int layers, std::int64_t hidden, int heads, int kv_heads, std::int64_t ffn,
                      std::int64_t vocab, std::int64_t max_positions) {
  ModelSpec m;
  m.name = std::string(name);
  m.family = ModelFamily::kLlama;
  m.layers = layers;
  m.hidden = hidden;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.ffn_hidden = ffn;
  m.vocab = vocab;
  m.tied_embeddings = false;
  m.position = PositionEmbedding::kRope;
  m.max_positions = max_positions;
  return m;
}

Result<ModelSpec> model_preset(std::string_view name) {
  for (const auto& m : models())
    if (m.name == name) return m;
  return Status::InvalidInput("unknown model preset \"" + std::string(name) +
                              "\"; known: " + join(model_preset_names()));
}

std::vector<std::string> model_preset_names() {
  std::vector<std::string> names;
  for (const auto& m : models()) names.push_back(m.name);
  return names;
}

Result<ClusterSpec> cluster_preset(std::string_view name) {
  for (const auto& row : kClusters) {
    if (name != row.name) continue;
    HZP_ASSIGN_OR_RETURN(CalibrationEntry cal, calibration_for(row.gpu_type));
    ClusterSpec c;
    c.name = row.name;
    c.nodes = 1;
    c.gpus_per_node = row.gpus_per_node;
    c.gpu = cal.gpu;
    c.intra = {row.topology, row.intra_GBps * 1e9, cal.intra_latency_s};
    c.nic = {row.nics, row.nic_Gbps * 1e9 / 8, cal.nic_latency_s, NicMapping::kRail};
    c.inter = default_inter_node();
    c.efficiency = cal.efficiency;
    return c;
  }
  return Status::InvalidInput("unknown cluster preset \"" + std::string(name) +
                              "\"; known: " + join(cluster_preset_names()));
}

InterNodeSpec default_inter_node() {
  return {kDefaultLeafSize, 1.0, kDefaultSwitchLatency};
}

std::vector<std::string> cluster_preset_names() {
  std::vector<std::string> names;
  for (const auto& row : kClusters) names.emplace_back(row.name);
  return names;
}

Result<ShardingSpec> sharding_preset(Policy policy, int gpus_per_node, int nodes) {
  const PolicyEntry* row = &policy_entry(policy);
  if (!row->is_preset)
    return Status::InvalidInput("policy \"" + std::string(to_string(policy)) +
                                "\" is not a preset; known: " + join(policy_preset_names()));
  if (row->params == ShardScope::kExplicit)
    return Status::InvalidInput("policy \"" + std::string(to_string(policy)) +
                                "\" has no default sharding; give params, grads and optimizer groups");
  return ShardingSpec{group_for(row->params, gpus_per_node, nodes), group_for(row->grads, gpus_per_node, nodes),
                      group_for(row->optimizer, gpus_per_node, nodes)};
}

std::vector<std::string> policy_preset_names() {
  std::vector<std::string> names;
  for (const PolicyEntry& row : policy_registry())
    if (row.is_preset) names.emplace_back(to_string(row.id));
  return names;
}

Status check_sharding(const ShardingSpec& sharding, int gpus_per_node, int nodes, std::string_view path) {
  const std::string base(path);
  struct Named {
    const char* name;
    const ShardGroup& group;
  };
  const Named states[] = {{"params", sharding.params}, {"grads", sharding.grads}, {"optimizer", sharding.optimizer}};
  const int r = gpus_per_node;
  const int n = nodes;

  // Each group on its own: inside the data-parallel grid, and nodes filled before spanning more of them.
  for (const auto& [name, g] : states) {
    const std::string where = base + "." + name + ": ";
    if (g.s0 < 1 || g.s1 < 1) return Status::InvalidInput(where + "s0 and s1 must be >= 1, got " + show(g));
    if (r % g.s0 != 0)
      return Status::InvalidInput(where + "s0 of group " + show(g) + " does not divide " + std::to_string(r) +
                                  " GPUs per node");
    if (n % g.s1 != 0)
      return Status::InvalidInput(where + "s1 of group " + show(g) + " does not divide " + std::to_string(n) +
                                  " nodes");
    if (g.s1 > 1 && g.s0 != r)
      return Status::InvalidInput(where + "group " + show(g) + " spans " + std::to_string(g.s1) + " nodes but only " +
                                  std::to_string(g.s0) + " of " + std::to_string(r) +
                                  " GPUs per node; fill the node first (s1 > 1 requires s0 = " + std::to_string(r) +
                                  ")");
  }

  // Between groups: params <= grads <= optimizer in both components (AMSP validity).
  const ShardGroup& p = sharding.params;
  const ShardGroup& g = sharding.grads;
  const ShardGroup& os = sharding.optimizer;
  if (p.s0 > g.s0 || p.s1 > g.s1)
    return Status::InvalidInput(base + ".params: group " + show(p) + " is sharded wider than grads " + show(g) +
                                "; need params <= grads <= optimizer in both s0 and s1");
  if (g.s0 > os.s0 || g.s1 > os.s1)
    return Status::InvalidInput(base + ".grads: group " + show(g) + " is sharded wider than optimizer " + show(os) +
                                "; need params <= grads <= optimizer in both s0 and s1");
  if (g.s0 % p.s0 != 0 || g.s1 % p.s1 != 0)
    return Status::InvalidInput(base + ".params: group " + show(p) + " must divide grads " + show(g) +
                                " in both s0 and s1, so that every grads shard is made of whole params shards");
  if (os.s0 % g.s0 != 0 || os.s1 % g.s1 != 0)
    return Status::InvalidInput(base + ".grads: group " + show(g) + " must divide optimizer " + show(os) +
                                " in both s0 and s1, so that every optimizer shard is made of whole grads shards");
  if (g.size() != p.size() && g.size() != os.size())
    return Status::InvalidInput(base + ".grads: grads must be sharded like params or like optimizer, got " + show(g) +
                                " (params " + show(p) + ", optimizer " + show(os) + ")");
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------------------
// Frameworks' collective choices
// ---------------------------------------------------------------------------------------------------------

namespace {

constexpr std::int64_t kMiBytes = 1024 * 1024;

const std::vector<FrameworkComm>& framework_table() {
  using GR = GradReduce;
  using PR = ParamRefresh;
  using PG = ParamGather;
  static const std::vector<FrameworkComm> table = {
      {"hzp",
       {"hzp", GR::kReduceScatter, PR::kAllGather, true, true, PG::kUnit},
       25 * kMiBytes,
       "hzp's own schedule: per-bucket reduce-scatter overlapped with backward, the refresh all-gather of each "
       "unit overlapped with the next forward (what FSDP and AsyncHZP do), 25 MiB buckets (PyTorch DDP's "
       "bucket_cap_mb default)."},
      {"internevo",
       {"internevo", GR::kAllReduce, PR::kBroadcast, false, false, PG::kUnit},
       512 * 2 * kMiBytes,
       "InternEvo / InternLM hybrid ZeRO-1 optimizer (InternLM/InternEvo, internlm/solver/optimizer/"
       "hybrid_zero_optim.py, 2023): gradients all-reduced in bf16 over the data-parallel group in buckets of "
       "reduce_bucket_size = 512 Mi elements (configs/7B_sft.py), reduced on the last micro-batch's backward "
       "with torch.cuda.synchronize() before each bucket's all-reduce (one in flight: the backward waits for "
       "the previous bucket's); "
       "after the update each rank of the zero1 group broadcasts the parameters it owns (whole tensors, "
       "assigned to ranks by size), one broadcast per owner, waited on before the next step."},
      {"deepspeed",
       {"deepspeed", GR::kReduceScatter, PR::kAllGather, false, true, PG::kTensor},
       1000 * 1000 * 1000,
       "DeepSpeed ZeRO stage 1/2 (deepspeed/runtime/zero/stage_1_and_2.py; config docs "
       "zero_optimization): reduce_scatter true, reduce_bucket_size 5e8 elements (1e9 bytes of bf16), the "
       "updated partitions all-gathered at the end of step() (allgather_bucket_size 5e8) before the next "
       "forward. ZeRO-3 (partitioned_param_coordinator.py, fetch_sub_module): parameters are all-gathered per "
       "leaf module (all_gather_coalesced of its partitioned parameters, i.e. one collective per Linear), "
       "parameters below stage3_param_persistence_threshold (1e5 elements) stay resident."},
      {"fsdp",
       {"fsdp", GR::kReduceScatter, PR::kAllGather, true, true, PG::kUnit},
       25 * kMiBytes,
       "PyTorch FSDP (torch/distributed/fsdp): gradients reduce-scattered per wrapped unit during backward; "
       "parameters all-gathered per unit on demand with forward/backward prefetch (nothing to refresh at "
       "the step's end). MixedPrecision's reduce_dtype defaults to the parameter dtype (bf16); torchtitan "
       "sets float32 (training.mixed_precision_reduce): policy.comm.grad_reduce_in_fp32."},
      {"megatron",
       {"megatron", GR::kReduceScatter, PR::kAllGather, false, true, PG::kUnit},
       80 * 1000 * 1000,
       "Megatron-LM distributed optimizer (megatron/core/distributed, docs/source/api-guide/"
       "dist_optimizer.md): gradients reduce-scattered in buckets of max(40M, 1M x DP) parameters (80 MB of "
       "bf16 at DP <= 40), updated parameters all-gathered after the step; --overlap-param-gather (off by "
       "default) would overlap that all-gather with the next forward. Under bf16 the gradients are accumulated "
       "and reduced in fp32 (megatron/training/arguments.py: bf16 sets accumulate_allreduce_grads_in_fp32, "
       "i.e. DistributedDataParallelConfig.grad_reduce_in_fp32, which NeMo's recipes also set); under fp16 "
       "in fp16.",
       true},
  };
  return table;
}

}  // namespace

Result<FrameworkComm> framework_comm(std::string_view name) {
  for (const FrameworkComm& f : framework_table())
    if (name == f.name) return f;
  return Status::InvalidInput("unknown framework (known: " + join(framework_names()) + ")");
}

std::vector<std::string> framework_names() {
  std::vector<std::string> names;
  for (const FrameworkComm& f : framework_table()) names.emplace_back(f.name);
  return names;
}

}  // namespace hzp
