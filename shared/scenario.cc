// Names of the scenario enums, as they are spelled in scenario JSON (the parser matches against these).
#include "shared/scenario.h"

#include <algorithm>
#include <string>

namespace hzp {

ParallelMesh Scenario::mesh() const {
  ParallelMesh m;
  m.tensor = policy.parallel.tensor;
  m.pipeline = policy.parallel.pipeline;
  m.context = policy.parallel.context;
  const long long model_parallel = static_cast<long long>(m.tensor) * m.pipeline * m.context;
  m.data = static_cast<int>(cluster.world_size() / std::max(1LL, model_parallel));
  m.expert = policy.expert_parallel;
  return m;
}

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
