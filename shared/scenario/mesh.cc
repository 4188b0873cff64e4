// The parallel mesh (mesh.h).
#include "shared/scenario/mesh.h"

#include <algorithm>
#include <string>

namespace hzp {
namespace {

Result<ReplicaAxis> replica_axis(const ClusterSpec& cluster, const ParallelSpec& parallel) {
  const int R = cluster.gpus_per_node, N = cluster.nodes, t = parallel.tensor, p = parallel.pipeline;
  if (t < 1 || R % t != 0)
    return Status::InvalidInput("policy.parallel.tensor: " + std::to_string(t) + " must divide the " +
                                std::to_string(R) + " GPUs of a node (tensor parallelism stays inside a node)");
  if (p >= 1 && N % p == 0) return ReplicaAxis{R / t, N / p};
  // Several stages per node: each takes R / (p / N) GPUs of it.
  if (p >= 1 && p % N == 0 && R % (p / N) == 0 && (R / (p / N)) % t == 0) return ReplicaAxis{R / (p / N) / t, 1};
  return Status::InvalidInput("policy.parallel.pipeline: " + std::to_string(p) + " stages must divide the " +
                              std::to_string(N) + " nodes, or split each node into equal parts of a multiple of " +
                              std::to_string(t) + " GPUs (tensor)");
}

}  // namespace

Result<ParallelMesh> make_mesh(const ClusterSpec& cluster, const ParallelSpec& parallel, int expert_parallel) {
  HZP_ASSIGN_OR_RETURN(const ReplicaAxis axis, replica_axis(cluster, parallel));
  ParallelMesh m;
  m.tensor = parallel.tensor;
  m.pipeline = parallel.pipeline;
  m.context = parallel.context;
  const long long model_parallel = static_cast<long long>(m.tensor) * m.pipeline * m.context;
  m.data = static_cast<int>(cluster.world_size() / std::max(1LL, model_parallel));
  m.expert = expert_parallel;
  m.replica = axis;
  return m;
}

}  // namespace hzp
