// Names of the scenario enums, as they are spelled in scenario JSON (the parser matches against these), and
// the small derived quantities of a scenario (mesh, leaf uplinks, node placement).
#include "shared/scenario/scenario.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "shared/base/hash.h"

namespace hzp {

std::string ParallelMesh::describe() const {
  std::string s = "data " + std::to_string(data) + " x tensor " + std::to_string(tensor) + " x pipeline " +
                  std::to_string(pipeline) + " x context " + std::to_string(context) + " = " + std::to_string(world()) +
                  " GPUs";
  if (expert > 1)
    s += ", expert " + std::to_string(expert) + (context > 1 ? " (inside data x context)" : " (inside data)");
  return s;
}

const char* to_string(ModelFamily v) {
  switch (v) {
    case ModelFamily::kLlama:
      return "llama";
    case ModelFamily::kGpt:
      return "gpt";
  }
  return "?";
}

const char* to_string(PositionEmbedding v) {
  switch (v) {
    case PositionEmbedding::kRope:
      return "rope";
    case PositionEmbedding::kLearned:
      return "learned";
    case PositionEmbedding::kAlibi:
      return "alibi";
  }
  return "?";
}

const char* to_string(MlpKind v) {
  switch (v) {
    case MlpKind::kSwiGlu:
      return "swiglu";
    case MlpKind::kGelu:
      return "gelu";
    case MlpKind::kSquaredRelu:
      return "squared_relu";
  }
  return "?";
}

const char* to_string(IntraNodeTopology v) {
  switch (v) {
    case IntraNodeTopology::kSwitch:
      return "switch";
    case IntraNodeTopology::kFullMesh:
      return "full_mesh";
  }
  return "?";
}

const char* to_string(ContextComm v) {
  switch (v) {
    case ContextComm::kRing:
      return "ring";
    case ContextComm::kAllToAll:
      return "all_to_all";
  }
  return "?";
}

const char* tensor_unsplit_field(const ModelSpec& model, int tensor, std::int64_t* value) {
  const std::pair<const char*, std::int64_t> split[] = {{"model.heads", model.heads},
                                                        {"model.kv_heads", model.kv_heads},
                                                        {"model.ffn_hidden", model.ffn_hidden},
                                                        {"model.moe.expert_ffn_hidden", model.moe.expert_ffn_hidden},
                                                        {"model.moe.shared_ffn_hidden", model.moe.shared_ffn_hidden}};
  for (const auto& [what, n] : split)
    if (n % tensor != 0) {
      if (value != nullptr) *value = n;
      return what;
    }
  return nullptr;
}

const char* ulysses_unsplit_heads(const ModelSpec& model, int tensor, int context) {
  if ((model.heads / tensor) % context != 0) return "model.heads";
  if ((model.kv_heads / tensor) % context != 0) return "model.kv_heads";
  return nullptr;
}

const char* to_string(NicMapping v) {
  switch (v) {
    case NicMapping::kRail:
      return "rail";
    case NicMapping::kShared:
      return "shared";
  }
  return "?";
}

int leaf_uplinks(const ClusterSpec& c) {
  const double ports = c.inter.leaf_size * static_cast<double>(c.nic.per_node) / c.inter.oversubscription;
  return std::max(1, static_cast<int>(std::floor(ports + 1e-9)));
}

int ecmp_uplinks_per_nic(const ClusterSpec& c) {
  if (!c.inter.rail_optimized) return leaf_uplinks(c);
  return std::max(1, static_cast<int>(std::floor(c.inter.leaf_size / c.inter.oversubscription + 1e-9)));
}

std::vector<int> node_leaves(const ClusterSpec& c) {
  std::vector<int> slot(static_cast<size_t>(std::max(0, c.nodes)));
  for (int n = 0; n < c.nodes; ++n) slot[n] = n;
  if (c.inter.placement == Placement::kScattered) {
    // Fisher-Yates with a portable draw (std::shuffle's sequence differs between standard libraries).
    const std::uint64_t seed = splitmix64(0x706c6163656d656eULL ^ static_cast<std::uint64_t>(c.inter.seed));
    for (int n = c.nodes - 1; n > 0; --n) {
      const auto j = static_cast<int>(splitmix64(seed + static_cast<std::uint64_t>(n)) % (n + 1));
      std::swap(slot[n], slot[j]);
    }
  }
  for (int& s : slot) s /= c.inter.leaf_size;
  return slot;
}

const char* to_string(Routing v) {
  switch (v) {
    case Routing::kBalanced:
      return "balanced";
    case Routing::kEcmp:
      return "ecmp";
  }
  return "?";
}

const char* to_string(Placement v) {
  switch (v) {
    case Placement::kContiguous:
      return "contiguous";
    case Placement::kScattered:
      return "scattered";
  }
  return "?";
}

const char* to_string(CollectiveAlgorithmChoice v) {
  switch (v) {
    case CollectiveAlgorithmChoice::kAuto:
      return "auto";
    case CollectiveAlgorithmChoice::kRing:
      return "ring";
    case CollectiveAlgorithmChoice::kHierarchical:
      return "hierarchical";
  }
  return "?";
}

const char* to_string(GpuArch v) {
  switch (v) {
    case GpuArch::kUnknown:
      return "unknown";
    case GpuArch::kVolta:
      return "volta";
    case GpuArch::kAmpere:
      return "ampere";
    case GpuArch::kHopper:
      return "hopper";
    case GpuArch::kBlackwell:
      return "blackwell";
  }
  return "?";
}

const char* to_string(ProtocolChoice v) {
  switch (v) {
    case ProtocolChoice::kAuto:
      return "auto";
    case ProtocolChoice::kLL:
      return "ll";
    case ProtocolChoice::kLL128:
      return "ll128";
    case ProtocolChoice::kSimple:
      return "simple";
  }
  return "?";
}

const char* to_string(Precision v) {
  switch (v) {
    case Precision::kBf16:
      return "bf16";
    case Precision::kFp16:
      return "fp16";
    case Precision::kFp32:
      return "fp32";
  }
  return "?";
}

const char* to_string(KernelFusion v) {
  switch (v) {
    case KernelFusion::kFused:
      return "fused";
    case KernelFusion::kEager:
      return "eager";
  }
  return "?";
}

const char* to_string(AttentionAlgorithm v) {
  switch (v) {
    case AttentionAlgorithm::kStandard:
      return "standard";
    case AttentionAlgorithm::kPasa:
      return "pasa";
  }
  return "?";
}

const char* to_string(Recompute v) {
  switch (v) {
    case Recompute::kNone:
      return "none";
    case Recompute::kSelective:
      return "selective";
    case Recompute::kFull:
      return "full";
  }
  return "?";
}

const char* to_string(GradReduce v) {
  switch (v) {
    case GradReduce::kReduceScatter:
      return "reduce_scatter";
    case GradReduce::kAllReduce:
      return "all_reduce";
  }
  return "?";
}

const char* to_string(ParamRefresh v) {
  switch (v) {
    case ParamRefresh::kAllGather:
      return "all_gather";
    case ParamRefresh::kBroadcast:
      return "broadcast";
  }
  return "?";
}

const char* to_string(ParamGather v) {
  switch (v) {
    case ParamGather::kUnit:
      return "unit";
    case ParamGather::kTensor:
      return "tensor";
  }
  return "?";
}

}  // namespace hzp
