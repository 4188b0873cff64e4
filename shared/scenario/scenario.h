// The typed form of a scenario: model + cluster + training + policy.
//
// scenario_parser.h turns JSON into these structs (strictly: unknown keys are errors, units live in key
// names); everything downstream reads only these structs. Units here are SI base units (bytes, seconds,
// FLOP/s, bytes/s) whatever the JSON key said (`_GBps`, `_Gbps`, `_us`, `_GiB`, `_tflops`).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shared/policy/policy_registry.h"

namespace hzp {

// ---------------------------------------------------------------------------------------------------------
// Model
// ---------------------------------------------------------------------------------------------------------

// LLaMA: RMSNorm, SwiGLU MLP (3 matrices), rotary positions, untied head.
// GPT:   LayerNorm (weight + bias), GELU MLP (2 matrices), learned positions, usually tied embeddings.
enum class ModelFamily { kLlama, kGpt };
// The MLP's activation, which decides its matrices. swiglu: down(silu(x Wg) * (x Wu)), 3 matrices (LLaMA);
// gelu: fc2(gelu(x W1)), 2 matrices (GPT); squared_relu: fc2(relu(x W1)^2), 2 matrices (Nemotron-4, So et al.
// 2021 "Primer"). The family gives the default; the family alone decides norms and biases.
enum class MlpKind { kSwiGlu, kGelu, kSquaredRelu };
enum class PositionEmbedding { kRope, kLearned, kAlibi };

struct MoeSpec {
  int experts = 0;                     // E experts per MoE layer
  int top_k = 0;                       // experts each token is routed to
  std::int64_t expert_ffn_hidden = 0;  // SwiGLU / GELU width of one expert
  std::vector<int> layers;             // indices of MoE layers (sorted, unique); the parser expands "all"
  // Shared experts (DeepSeekMoE, Dai et al. 2024): every token also goes through them, beside its top_k routed
  // experts. n shared experts of width f are one MLP of width n·f (their outputs are summed); 0 = none.
  std::int64_t shared_ffn_hidden = 0;
};

// Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1): queries and keys/values are projected
// down to low-rank latents, normed, and projected back up per head; each query/key head has a part without
// positions (qk_nope_head_dim) and a rotary part (qk_rope_head_dim; the key's is one head shared by all),
// and values have their own width (v_head_dim). The names are Hugging Face's DeepSeek config keys.
struct MlaSpec {
  std::int64_t q_lora_rank = 0;  // query latent width; 0: queries are projected directly (DeepSeek-V2-Lite)
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;
  std::int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
};

struct ModelSpec {
  std::string name;  // preset name or "custom"
  ModelFamily family = ModelFamily::kLlama;
  int layers = 0;
  std::int64_t hidden = 0;
  int heads = 0;
  int kv_heads = 0;             // == heads for multi-head attention; fewer for GQA/MQA
  std::int64_t ffn_hidden = 0;  // dense MLP width
  MlpKind mlp = MlpKind::kSwiGlu;
  std::int64_t vocab = 0;
  bool tied_embeddings = false;  // head shares the embedding matrix
  PositionEmbedding position = PositionEmbedding::kRope;
  std::int64_t max_positions = 0;  // rows of the learned position table (kLearned only)
  bool has_moe = false;
  MoeSpec moe;
  bool has_mla = false;  // multi-head latent attention instead of (grouped-query) multi-head attention
  MlaSpec mla;
  std::string hf_config_path;  // model.from_hf_config, as read (a file the scenario reads; outputs avoid it)

  std::int64_t head_dim() const { return hidden / heads; }
  // Per-head widths of queries and keys, and of values (== head_dim() but under MLA).
  std::int64_t qk_head_dim() const { return has_mla ? mla.qk_head_dim() : head_dim(); }
  std::int64_t v_head_dim() const { return has_mla ? mla.v_head_dim : head_dim(); }
  bool is_moe_layer(int layer) const;                         // defined in model_math.cc
  bool gated_mlp() const { return mlp == MlpKind::kSwiGlu; }  // 3 matrices per MLP, else 2
  int mlp_matrices() const { return gated_mlp() ? 3 : 2; }
};

// ---------------------------------------------------------------------------------------------------------
// Cluster
// ---------------------------------------------------------------------------------------------------------

enum class IntraNodeTopology { kSwitch, kFullMesh };
enum class NicMapping { kRail, kShared };  // rail: local GPU g uses NIC g*nics/gpus_per_node
// How a flow between leaves picks its spine uplink. balanced: every flow spreads over all of its leaf's
// uplinks (one aggregated link per leaf: what static routes balanced per destination, or adaptive routing,
// give); ecmp: each flow (one per NCCL channel) is hashed onto one uplink and keeps it, so flows collide.
enum class Routing { kBalanced, kEcmp };
// Where a job's nodes sit under the leaves. contiguous: node n under leaf n / leaf_size (rank order follows
// the switches); scattered: a seeded random permutation of the nodes over the same leaves.
enum class Placement { kContiguous, kScattered };
// NCCL_ALGO-like override of the collective algorithm selection (collective_cost.h); auto = cheapest.
enum class CollectiveAlgorithmChoice { kAuto, kRing, kHierarchical };
// NCCL_PROTO-like override of the protocol (collective_cost.h); auto = NCCL's cheapest of LL, LL128, Simple.
enum class ProtocolChoice { kAuto, kLL, kLL128, kSimple };

// Achievable fractions of peak, calibrated per GPU type from single-node facts (calibration.h).
struct Efficiency {
  double gemm = 0;          // GEMM-heavy compute: fraction of peak bf16 FLOP/s
  double memory_bound = 0;  // elementwise / norm / optimizer: fraction of HBM bandwidth
  double intra_node = 0;    // NVLink / full-mesh links: fraction of nominal per-GPU bandwidth
  double inter_node = 0;    // NIC links: fraction of nominal line rate
};

// The GPU generation as NCCL's tuner tells them apart (compute capability 7, 8, 9, 10): it sets the LL
// protocol's bandwidth cap on one node (collective_cost.h). kUnknown: a GPU type without a calibration entry
// whose scenario gave no cluster.gpu.arch (refused where the LL protocol may run).
enum class GpuArch { kUnknown, kVolta, kAmpere, kHopper, kBlackwell };

// One measured point of a GPU's flash-attention speed (GpuSpec::flash_rates): at `head_dim` and `seq` keys per
// kernel call (the sequence), forward and backward run at `fwd` / `bwd` times the GEMM rate on their executed FLOPs.
struct FlashRate {
  int head_dim = 0;
  double seq = 0;
  double fwd = 0;
  double bwd = 0;
};

struct GpuSpec {
  std::string type;         // key into the calibration table, e.g. "a100-80gb"
  double peak_flops = 0;    // dense bf16 FLOP/s
  double memory_bytes = 0;  // HBM capacity
  double hbm_bytes_per_s = 0;
  double fp8_peak_flops = 0;  // dense FP8 FLOP/s; 0: the GPU has no FP8 tensor cores (training.fp8 refused)
  GpuArch arch = GpuArch::kUnknown;
  // Fixed seconds of every GEMM kernel besides its FLOPs at the GEMM rate: what makes a small product run
  // below the large ones' fraction of peak (its first and last waves, the tile pipeline filling and draining).
  // Fitted with its GEMM rate to a single-GPU table of products by shape (calibration.cc); 0: none known.
  double gemm_overhead_s = 0;
  // How fast a causal flash-attention kernel runs, on the FLOPs it executes (the unmasked half), as a multiple
  // of the GEMM rate, by head dimension and sequence length (flash_vs_gemm in calibration.h interpolates).
  // Measured on one GPU with its GEMMs in the same run (calibration.cc); empty: none known, and the kernel
  // runs at half the GEMM rate (kNoFlashTable), which is timing the full, unhalved count at the GEMM rate.
  std::vector<FlashRate> flash_rates = {};
  // FP8 GEMMs' fraction of the FP8 peak over bf16 GEMMs' fraction of the bf16 peak, measured on one GPU
  // (calibration.cc); 1: none known, FP8 GEMMs as efficient as bf16 ones.
  double fp8_gemm_vs_bf16 = 1;
  // The FP8 peak as the GEMM model times FP8 products: fp8_peak_flops x fp8_gemm_vs_bf16, at the GEMM efficiency.
  double fp8_gemm_peak() const { return fp8_peak_flops * fp8_gemm_vs_bf16; }
};

struct IntraNodeSpec {
  IntraNodeTopology topology = IntraNodeTopology::kSwitch;
  double bytes_per_s = 0;  // per GPU, per direction (NVLink "600 GB/s bidirectional" = 300e9)
  double latency_s = 0;
};

struct NicSpec {
  int per_node = 0;
  double bytes_per_s = 0;  // per NIC, per direction (200 Gb/s HDR = 25e9)
  double latency_s = 0;    // one hop GPU -> NIC -> switch -> NIC -> GPU, excluding switch hops
  NicMapping mapping = NicMapping::kRail;
};

struct InterNodeSpec {
  int leaf_size = 0;            // nodes under one leaf switch
  double oversubscription = 1;  // leaf downlink : uplink bandwidth ratio (1 = non-blocking)
  double switch_latency_s = 0;  // per switch traversed
  Routing routing = Routing::kBalanced;
  // ecmp only: each rail's NICs hang off a leaf of their own (rail-optimized fabric), so a flow of rail k
  // hashes over that rail's share of the leaf group's uplinks instead of all of them.
  bool rail_optimized = false;
  // ecmp only: queue pairs per NCCL channel connection (NCCL_IB_QPS_PER_CONNECTION, default 1), each hashed
  // on its own: more of them spread a channel's bytes over more uplinks (Meta's "QP scaling").
  int qps_per_connection = 1;
  Placement placement = Placement::kContiguous;
  int seed = 1;  // the ECMP hash and the scattered placement
};

struct ClusterSpec {
  std::string name;  // preset name or "custom"
  int nodes = 0;
  int gpus_per_node = 0;
  GpuSpec gpu;
  IntraNodeSpec intra;
  NicSpec nic;
  InterNodeSpec inter;
  Efficiency efficiency;
  CollectiveAlgorithmChoice collective_algorithm = CollectiveAlgorithmChoice::kAuto;
  ProtocolChoice protocol = ProtocolChoice::kSimple;  // see collective_cost.h for why not kAuto
  // Per-GPU speed variability: each GPU's compute takes (1 + spread·z) times the model's, z a fixed
  // standard normal draw per rank (seeded by the rank), so a synchronous step waits for the slowest GPU.
  // 0 = identical GPUs. The simulator applies it; the analytic estimator does not.
  double compute_spread = 0;
  // Compute slowed while a collective of the same GPU transfers (its kernels hold SMs, memory and link
  // bandwidth): compute progresses at 1 / (1 + overlap_slowdown) of its speed meanwhile. 0 = no
  // interference. A scenario's cluster gets kOverlapSlowdown (calibration.h: Lee et al., arXiv 2507.03114,
  // 18.9 % on average on 4-GPU A100, H100, MI250 and MI210 nodes) unless it says otherwise.
  double overlap_slowdown = 0;

  int world_size() const { return nodes * gpus_per_node; }
  int leaves() const { return (nodes + inter.leaf_size - 1) / inter.leaf_size; }
};

// The spine uplinks of one leaf: leaf_size · NICs / oversubscription ports at a NIC's rate (at least one),
// so that together they carry what the balanced model's one aggregated uplink carries.
int leaf_uplinks(const ClusterSpec& c);
// The uplinks one NIC's flows hash over under ECMP: all of its leaf's, or on a rail-optimized fabric its
// rail's share (each rail's leaf has leaf_size / oversubscription of them).
int ecmp_uplinks_per_nic(const ClusterSpec& c);
// The leaf each node sits under (cluster.inter_node.placement): node n under n / leaf_size, or a seeded
// permutation of the same slots. O(nodes).
std::vector<int> node_leaves(const ClusterSpec& c);

// ---------------------------------------------------------------------------------------------------------
// Training
// ---------------------------------------------------------------------------------------------------------

enum class Precision { kBf16, kFp16, kFp32 };
enum class Recompute { kNone, kSelective, kFull };
// The softmax algorithm of flash attention: the standard online softmax, or PASA (Cheng et al., arXiv
// 2503.01873: every key block shifted by its pseudo-average, the shift recovered in the online softmax), which
// keeps fp16 scores from overflowing (docs/pasa.md).
enum class AttentionAlgorithm { kStandard, kPasa };
// How the framework runs the memory-bound operations of a layer (norms, rotary embedding, the gated MLP's
// activation, the loss): "fused" as one kernel each (Transformer Engine, Megatron's and InternEvo's fused
// kernels, torch.compile), or "eager" as PyTorch eager runs the model code, one kernel per operation with its
// fp32 upcasts (torchtitan without torch.compile); docs/model_math.md counts each pass.
enum class KernelFusion { kFused, kEager };

struct TrainingSpec {
  std::int64_t seq_len = 0;
  std::int64_t micro_batch = 0;   // sequences per GPU per micro-batch
  std::int64_t global_batch = 0;  // sequences per optimizer step (the parser converts tokens)
  Precision precision = Precision::kBf16;
  std::string optimizer = "adamw";  // only AdamW is modelled
  Recompute recompute = Recompute::kNone;
  bool flash_attention = true;
  AttentionAlgorithm attention = AttentionAlgorithm::kStandard;  // "pasa": fp16 with flash attention only
  KernelFusion kernels = KernelFusion::kFused;  // the simulator's cost only; the runtime runs its own kernels
  // Dropout probabilities as Megatron-LM names them (its defaults are 0.1 and 0.1; LLaMA-style recipes use 0).
  // Only whether they are non-zero matters to the cost: attention dropout on the softmax output (without
  // flash attention an extra pass over the scores, and its output and 1-byte mask kept for backward; flash
  // attention fuses it), hidden dropout after the attention and MLP blocks (fused into the residual add; a
  // 1-byte mask per element kept). The simulator only; the CPU runtime trains without dropout.
  double attention_dropout = 0;
  double hidden_dropout = 0;
  // FP8 training as Transformer Engine (fp8_autocast) and torchtitan (Float8Linear) do it: the GEMMs of the
  // linear layers (QKV, attention output, MLP, experts) run at the GPU's FP8 peak; the attention core, the
  // LM head, the MoE router, every memory-bound kernel, the weights, gradients, optimizer states and all
  // communication stay in `precision`. The simulator only; the CPU runtime refuses it.
  bool fp8 = false;
  // Clip gradients to this global L2 norm (0 = no clipping). The norm spans every shard, so the schedule
  // gains a world all-reduce of the partial squared norms before the optimizer (schedule_builder.h).
  double grad_clip = 0;
};

// Settings only the runtime reads (runtime/): the optimizer's hyper-parameters, the step count, seeding,
// evaluation and checkpoints. The simulator ignores them. Defaults suit the tiny models in scenarios/runtime.
struct RunSpec {
  std::int64_t steps = 100;        // optimizer steps to train
  double lr = 3e-3;                // peak learning rate
  double min_lr = 3e-4;            // cosine decays to this at `steps`
  std::int64_t warmup_steps = 10;  // linear warm-up from 0
  double weight_decay = 0.1;       // AdamW, matrices only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  std::int64_t seed = 1234;              // weights and data order
  std::int64_t eval_interval = 0;        // validation loss every N steps (0 = only at the end)
  std::int64_t eval_batches = 4;         // validation micro-batches per rank per evaluation
  std::int64_t checkpoint_interval = 0;  // write a checkpoint every N steps (0 = only at the end, if asked)
};

// ---------------------------------------------------------------------------------------------------------
// Policy
// ---------------------------------------------------------------------------------------------------------

// A sharding group for one state, in the notation of the AMSP paper (Chen et al. 2023, arXiv 2311.00257, §III): s0 GPUs
// inside a node x s1 nodes. (1,1) = replicated; (gpus_per_node, nodes) = fully sharded over the data-parallel group.
struct ShardGroup {
  int s0 = 1;
  int s1 = 1;
  int size() const { return s0 * s1; }
  bool operator==(const ShardGroup&) const = default;
};

struct ShardingSpec {
  ShardGroup params;
  ShardGroup grads;
  ShardGroup optimizer;
  bool operator==(const ShardingSpec&) const = default;
};

struct OverlapSpec {
  int prefetch_depth = 1;         // layers of parameter all-gather issued ahead of compute (0 = none)
  std::int64_t bucket_bytes = 0;  // gradient bucket for DDP-style all-reduce / reduce-scatter
  bool separate_streams = true;   // false: every collective runs on the compute stream (no overlap)
};

// How the data-parallel collectives are issued: the choices real frameworks make differently, each a
// documented default of a named framework (framework_comm(), sources in presets.cc).
enum class GradReduce {
  kReduceScatter,  // each rank receives the reduced slice it updates (FSDP, DeepSpeed ZeRO-2/3, hzp)
  kAllReduce,      // every rank receives every reduced gradient, keeps its slice (InternEvo ZeRO-1, DDP)
};
enum class ParamRefresh {
  kAllGather,  // one all-gather per bucket of the updated slices (DeepSpeed, FSDP, hzp)
  kBroadcast,  // one broadcast per owner rank of the parameters it updated (InternEvo, AMSP: "AG/RS+AR+BC")
};
enum class ParamGather {
  kUnit,    // one all-gather of a unit's (or one module's) flat parameters (FSDP, hzp)
  kTensor,  // one all-gather per large parameter tensor (DeepSpeed ZeRO-3: all_gather_coalesced per leaf
            // module fetch; tensors below 1e5 elements stay resident)
};
struct CommSpec {
  std::string framework = "hzp";  // whose defaults the fields below started from
  GradReduce grad_reduce = GradReduce::kReduceScatter;
  ParamRefresh param_refresh = ParamRefresh::kAllGather;
  // true: the refresh of the updated parameters overlaps the next step's forward (each unit waits only for
  // its own parameters); false: the next step starts when every refresh is done (DeepSpeed ZeRO-1/2,
  // InternEvo: the optimizer step ends with the all-gather / broadcasts and their wait).
  bool refresh_overlap = true;
  // true: the once-a-step gradient reductions (the last micro-batch's) overlap the rest of the backward;
  // false: one reduction in flight — before issuing a bucket's reduction the host waits for the device
  // (InternEvo's torch.cuda.synchronize() in _reduce_and_copy), so the backward after it waits for the
  // previous bucket's reduction.
  bool grad_reduce_overlap = true;
  ParamGather param_gather = ParamGather::kUnit;  // granularity of ZeRO-3 style parameter gathers
  // true: gradients are kept and reduced in fp32 although the working precision is 16-bit (Megatron-LM's
  // main_grad buffer, FSDP's reduce_dtype = float32): every data-parallel gradient collective moves, and
  // every gradient buffer holds, 4 bytes per parameter. No effect under training.precision "fp32".
  bool grad_reduce_in_fp32 = false;
  bool operator==(const CommSpec&) const = default;
};

// ND parallelism beside the data axis (Megatron-LM's layout). Tensor parallelism splits every layer's
// matrices over `tensor` GPUs of a node (Shoeybi et al. 2019); sequence parallelism also splits the norms,
// residuals and their activations along the sequence, turning each tensor all-reduce into an all-gather and
// a reduce-scatter (Korthikanti et al. 2022); pipeline parallelism splits the layers into `pipeline` stages
// run as 1F1B, interleaved over `virtual_stages` model chunks per stage when > 1 (Narayanan et al. 2021).
// Context parallelism splits every sequence over `context` GPUs, each keeping s / context tokens; its ranks
// hold the same parameters, so gradients are reduced, and states sharded, over data x context. Attention
// sees the whole sequence by one of Megatron-LM's two exchanges (cp_comm_type): kRing ("p2p": ring
// attention, the keys and values of the others passed around the group beside the attention compute) or
// kAllToAll ("a2a": DeepSpeed-Ulysses, queries, keys and values re-split from sequence to heads before the
// attention core and the output back after it, on the compute path).
// D = GPUs / (tensor * context * pipeline) replicas see different samples; every ZeRO-family sharding
// applies to the D x context ranks of the replica axis (ParallelMesh::replica).
enum class ContextComm { kRing, kAllToAll };

struct ParallelSpec {
  int tensor = 1;
  int pipeline = 1;
  int virtual_stages = 1;
  bool sequence_parallel = false;
  int context = 1;
  ContextComm context_comm = ContextComm::kRing;
  // Uneven pipeline stages (pipeline_split.h): 0 = the even split.
  int layers_in_first_stage = 0;
  int layers_in_last_stage = 0;
  bool account_for_embedding_in_split = false;
  bool account_for_loss_in_split = false;
  // Tensor-parallel communication pipelined with the GEMMs around it (Megatron-LM / Transformer Engine's
  // tp_comm_overlap, torchtitan's async-TP; both need sequence parallelism): each all-gather before a layer
  // block runs beside the block's compute (its first chunk is local), each reduce-scatter after it beside
  // the compute too, but for its last chunk's. schedule/module_ops.cc has the model.
  bool tensor_comm_overlap = false;
  bool operator==(const ParallelSpec&) const = default;
};

// The replica axis seen as a cluster: the ranks of one (tensor, stage) coordinate, which hold the same
// parameters (data x context ranks). With tensor parallelism t inside a node, each node holds
// gpus_per_node / t of them; a pipeline stage spans nodes / pipeline nodes (or a part of one node when it is
// smaller). Sharding groups (AMSP's s0 x s1) are counted in these units; a context group is `context`
// consecutive ones.
struct ReplicaAxis {
  int ranks_per_node = 1;  // data-parallel ranks of one (tensor, pipeline) coordinate per node
  int nodes = 1;           // nodes one such coordinate's data-parallel ranks span
  int size() const { return ranks_per_node * nodes; }
};

struct PolicySpec {
  Policy preset = Policy::kCustom;  // policy.preset (kCustom: explicit sharding, no preset)
  ShardingSpec sharding;            // always resolved (presets are expanded by the parser)
  OverlapSpec overlap;
  CommSpec comm;
  // Expert parallelism for MoE layers: each expert lives on one of `expert_parallel` consecutive ranks
  // (1 = every rank holds every expert). Expert states are then sharded like the dense ones but only over
  // the ranks that hold the same experts (the expert-data-parallel group, D / expert_parallel ranks).
  int expert_parallel = 1;
  ParallelSpec parallel;
  // "sharding": "auto" (amsp): the groups are the planner's analytic pick, filled in by compile()
  // (compile/compile.h) before anything uses them; until then `sharding` is a placeholder.
  bool auto_sharding = false;
};

// The parallel mesh: named axes whose degrees multiply to the world. The data x context ranks hold the ZeRO
// family's sharding and expert parallelism; tensor, context and pipeline come from policy.parallel. Rank
// order, innermost first: tensor, context, data, pipeline (Megatron's), so global rank
// g = tensor + T·(context + C·(data + D·stage)). Computed once, by the parser (make_mesh, mesh.h), and stored
// in Scenario::mesh: a scenario with other cluster or parallel fields is a new scenario (parse it).
struct ParallelMesh {
  int data = 1;
  int tensor = 1;
  int pipeline = 1;
  int context = 1;
  int expert = 1;       // divides data x context: experts spread over this many consecutive replica-axis ranks
  ReplicaAxis replica;  // the data x context ranks of one (tensor, stage) coordinate, seen as a cluster
  long long world() const { return static_cast<long long>(data) * tensor * pipeline * context; }
  // Coordinates of a global rank, and back.
  int tensor_rank(int rank) const { return rank % tensor; }
  int context_rank(int rank) const { return rank / tensor % context; }
  int data_rank(int rank) const { return rank / (tensor * context) % data; }
  int stage(int rank) const { return rank / (tensor * context * data); }
  // The position on the replica axis: context + C·data.
  int replica_rank(int rank) const { return rank / tensor % (context * data); }
  int global_rank(int tensor_index, int replica_index, int stage_index) const {
    return tensor_index + tensor * (replica_index + context * data * stage_index);
  }
  // "data 64 x tensor 1 x pipeline 1 x context 1 = 64 GPUs, expert 8 (inside data x context)"
  std::string describe() const;
};

struct Scenario {
  std::string name;  // optional "name" key, else the file stem
  ModelSpec model;
  ClusterSpec cluster;
  TrainingSpec training;
  PolicySpec policy;
  RunSpec run;

  ParallelMesh mesh;  // set by the parser from cluster and policy (see ParallelMesh)

  int data_parallel() const { return mesh.data; }
  // Micro-batches per optimizer step on each GPU: global_batch / (micro_batch * D).
  std::int64_t grad_accum_steps() const { return training.global_batch / (training.micro_batch * data_parallel()); }
};

const char* to_string(ModelFamily v);
const char* to_string(PositionEmbedding v);
const char* to_string(MlpKind v);
const char* to_string(IntraNodeTopology v);
const char* to_string(NicMapping v);
const char* to_string(Routing v);
const char* to_string(Placement v);
const char* to_string(CollectiveAlgorithmChoice v);
const char* to_string(ProtocolChoice v);
const char* to_string(GpuArch v);
const char* to_string(Precision v);
const char* to_string(Recompute v);
const char* to_string(AttentionAlgorithm v);
const char* to_string(KernelFusion v);
const char* to_string(GradReduce v);
const char* to_string(ParamRefresh v);
const char* to_string(ParamGather v);
const char* to_string(ContextComm v);

// Tensor parallelism splits heads, MLP widths and expert widths by `tensor`: the first model field (its JSON
// path) that `tensor` does not divide, and its value; nullptr when it divides them all.
const char* tensor_unsplit_field(const ModelSpec& model, int tensor, std::int64_t* value = nullptr);

// Ulysses (context_comm all_to_all) splits each tensor rank's query and key/value heads over the context
// group: the model field whose heads / tensor `context` does not divide ("model.heads", "model.kv_heads"),
// or nullptr when both split.
const char* ulysses_unsplit_heads(const ModelSpec& model, int tensor, int context);

}  // namespace hzp
