// Closed-form collective costs per algorithm, NCCL-like selection, and the roofline compute cost
// (formulas in collective_cost.h).
#include "shared/collective_cost.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <vector>

namespace hzp {

const char* to_string(CollectiveAlgorithm algorithm) {
  switch (algorithm) {
    case CollectiveAlgorithm::kRing:
      return "ring";
    case CollectiveAlgorithm::kDirect:
      return "direct";
    case CollectiveAlgorithm::kHierarchical:
      return "hierarchical";
    case CollectiveAlgorithm::kPairwise:
      return "pairwise";
  }
  return "?";
}

GroupShape group_shape(const ClusterSpec& c, const ProcessGroup& group) {
  GroupShape shape;
  const int R = c.gpus_per_node;
  const int first_node = group.ranks.front() / R;
  std::vector<char> node_seen(c.nodes, 0), nic_seen(c.nic.per_node, 0);
  int nodes = 0, on_first = 0, nics = 0;
  for (int r : group.ranks) {
    if (!node_seen[r / R]) ++nodes;
    node_seen[r / R] = 1;
    if (r / R != first_node) continue;
    ++on_first;
    const int nic = (r % R) * c.nic.per_node / R;
    if (!nic_seen[nic]) ++nics;
    nic_seen[nic] = 1;
  }
  shape.ranks_per_node = on_first;
  shape.nodes = nodes;
  shape.nics = c.nic.mapping == NicMapping::kRail ? nics : c.nic.per_node;
  return shape;
}

LinkParams link_params(const ClusterSpec& c, const GroupShape& shape) {
  LinkParams p;
  p.intra = c.intra.bytes_per_s * c.efficiency.intra_node;
  const bool spans_leaves = shape.nodes > c.inter.leaf_size;
  p.rail = c.nic.per_node * c.nic.bytes_per_s * c.efficiency.inter_node / c.gpus_per_node;
  if (spans_leaves) p.rail /= c.inter.oversubscription;
  p.alpha_intra = c.intra.latency_s;
  p.alpha_inter = std::max(c.intra.latency_s, c.nic.latency_s + (spans_leaves ? 4 : 2) * c.inter.switch_latency_s);
  return p;
}

namespace {

bool full_mesh(const ClusterSpec& c) {
  return c.intra.topology == IntraNodeTopology::kFullMesh;
}

// One reduce-scatter or all-gather pass; the building block of every formula.
double ring_pass(int p, double alpha, double bytes, double bandwidth) {
  return p <= 1 ? 0 : (p - 1) * alpha + (p - 1) / static_cast<double>(p) * bytes / bandwidth;
}

// A collective over the s0 members of one node, by the node's intra-node algorithm.
double intra_time(const ClusterSpec& c, CollectiveKind kind, double bytes, int s0, const LinkParams& l) {
  if (s0 <= 1) return 0;
  if (full_mesh(c)) {
    const double pass = (s0 - 1) * l.alpha_intra + (c.gpus_per_node - 1) / static_cast<double>(s0) * bytes / l.intra;
    return kind == CollectiveKind::kAllReduce ? 2 * pass : pass;
  }
  const double pass = ring_pass(s0, l.alpha_intra, bytes, l.intra);
  if (kind == CollectiveKind::kBroadcast) return (s0 - 1) * l.alpha_intra + bytes / l.intra;
  return kind == CollectiveKind::kAllReduce ? 2 * pass : pass;
}

double ring_time(const ClusterSpec& c, CollectiveKind kind, double bytes, const GroupShape& s, const LinkParams& l) {
  const int p = s.size();
  if (s.nodes == 1) return intra_time(c, kind, bytes, p, l);
  const double latency = ring_latency(kind, s, l);
  double bandwidth = s.ranks_per_node * l.rail;
  // Intra-node hops: a switch port carries every channel; on a full mesh channel k uses its own pair link,
  // so min(s0-1, channels) of the R-1 pair links carry the ring.
  if (s.ranks_per_node > 1)
    bandwidth = std::min(
        bandwidth, full_mesh(c) ? l.intra * std::min(s.ranks_per_node - 1, s.nics) / (c.gpus_per_node - 1) : l.intra);
  if (kind == CollectiveKind::kBroadcast) return latency + bytes / bandwidth;
  const double transfer = (p - 1) / static_cast<double>(p) * bytes / bandwidth;
  return latency + (kind == CollectiveKind::kAllReduce ? 2 * transfer : transfer);
}

double hierarchical_time(const ClusterSpec& c, CollectiveKind kind, double bytes, const GroupShape& s,
                         const LinkParams& l) {
  const double shard = bytes / s.ranks_per_node;  // what each inter-node ring carries
  const double inter_pass = ring_pass(s.nodes, l.alpha_inter, shard, l.rail);
  switch (kind) {
    case CollectiveKind::kAllGather:
    case CollectiveKind::kReduceScatter:
      return inter_pass + intra_time(c, kind, bytes, s.ranks_per_node, l);
    case CollectiveKind::kAllReduce:
      return intra_time(c, CollectiveKind::kReduceScatter, bytes, s.ranks_per_node, l) + 2 * inter_pass +
             intra_time(c, CollectiveKind::kAllGather, bytes, s.ranks_per_node, l);
    default:
      return std::numeric_limits<double>::infinity();
  }
}

double pairwise_time(const ClusterSpec& c, double bytes, const GroupShape& s, const LinkParams& l) {
  const int p = s.size();
  const double per_peer = bytes / p;
  double intra = 0;
  if (s.ranks_per_node > 1)
    intra = full_mesh(c) ? per_peer * (c.gpus_per_node - 1) / l.intra : (s.ranks_per_node - 1) * per_peer / l.intra;
  const double inter = (p - s.ranks_per_node) * per_peer / l.rail;
  return (p - 1) * (s.nodes > 1 ? l.alpha_inter : l.alpha_intra) + std::max(intra, inter);
}

}  // namespace

double ring_latency(CollectiveKind kind, const GroupShape& s, const LinkParams& l) {
  const int p = s.size();
  if (p <= 1) return 0;
  const int passes = kind == CollectiveKind::kAllReduce ? 2 : 1;
  const int steps = kind == CollectiveKind::kBroadcast ? p - 1 : passes * (p - 1);
  if (s.nodes <= 1) return steps * l.alpha_intra;
  const int inter_steps = kind == CollectiveKind::kBroadcast ? s.nodes - 1 : passes * (s.nodes - 1);
  return (steps - inter_steps) * l.alpha_intra + inter_steps * l.alpha_inter;
}

bool algorithm_applies(const ClusterSpec& c, CollectiveAlgorithm algorithm, CollectiveKind kind, const GroupShape& s) {
  const bool a2a = kind == CollectiveKind::kAllToAll;
  switch (algorithm) {
    case CollectiveAlgorithm::kPairwise:
      return a2a;
    case CollectiveAlgorithm::kDirect:
      return !a2a && kind != CollectiveKind::kBroadcast && full_mesh(c) && s.nodes == 1;
    case CollectiveAlgorithm::kHierarchical:
      return !a2a && kind != CollectiveKind::kBroadcast && s.ranks_per_node > 1 && s.nodes > 1;
    case CollectiveAlgorithm::kRing:
      // Inside one full-mesh node the direct algorithm replaces the ring (which would use one pair link).
      return !a2a && (!full_mesh(c) || s.nodes > 1 || s.ranks_per_node == 1 || kind == CollectiveKind::kBroadcast);
  }
  return false;
}

double algorithm_time(const ClusterSpec& c, CollectiveAlgorithm algorithm, CollectiveKind kind, double bytes,
                      const GroupShape& s) {
  if (s.size() <= 1 || bytes <= 0) return 0;
  const LinkParams l = link_params(c, s);
  switch (algorithm) {
    case CollectiveAlgorithm::kRing:
      return ring_time(c, kind, bytes, s, l);
    case CollectiveAlgorithm::kDirect:
      return intra_time(c, kind, bytes, s.size(), l);
    case CollectiveAlgorithm::kHierarchical:
      return hierarchical_time(c, kind, bytes, s, l);
    case CollectiveAlgorithm::kPairwise:
      return pairwise_time(c, bytes, s, l);
  }
  return 0;
}

CollectiveAlgorithm choose_algorithm(const ClusterSpec& c, CollectiveKind kind, double bytes, const GroupShape& s) {
  auto forced = [&]() -> std::optional<CollectiveAlgorithm> {
    switch (c.collective_algorithm) {
      case CollectiveAlgorithmChoice::kRing:
        return CollectiveAlgorithm::kRing;
      case CollectiveAlgorithmChoice::kHierarchical:
        return CollectiveAlgorithm::kHierarchical;
      case CollectiveAlgorithmChoice::kAuto:
        return std::nullopt;
    }
    return std::nullopt;
  }();
  if (forced && algorithm_applies(c, *forced, kind, s)) return *forced;
  CollectiveAlgorithm best = CollectiveAlgorithm::kRing;
  double best_time = std::numeric_limits<double>::infinity();
  for (CollectiveAlgorithm a : {CollectiveAlgorithm::kRing, CollectiveAlgorithm::kDirect,
                                CollectiveAlgorithm::kHierarchical, CollectiveAlgorithm::kPairwise}) {
    if (!algorithm_applies(c, a, kind, s)) continue;
    // NCCL runs all-gather and reduce-scatter as rings only; its tree (here: the 2-level algorithm) serves
    // all-reduce. MiCS-style 2-level gathers are used only when the scenario forces them.
    if (a == CollectiveAlgorithm::kHierarchical && kind != CollectiveKind::kAllReduce) continue;
    const double t = algorithm_time(c, a, kind, bytes, s);
    if (t < best_time) {
      best = a;
      best_time = t;
    }
  }
  return best;
}

double collective_time(const ClusterSpec& c, CollectiveKind kind, double bytes, const GroupShape& s) {
  if (s.size() <= 1 || bytes <= 0) return 0;
  return algorithm_time(c, choose_algorithm(c, kind, bytes, s), kind, bytes, s);
}

double collective_bytes_sent(CollectiveKind kind, double bytes, int ranks) {
  if (ranks <= 1) return 0;
  const double pass = (ranks - 1) / static_cast<double>(ranks) * bytes;
  return kind == CollectiveKind::kAllReduce ? 2 * pass : pass;
}

double compute_time(const ClusterSpec& c, double flops, double mem_bytes) {
  return flops / (c.gpu.peak_flops * c.efficiency.gemm) +
         mem_bytes / (c.gpu.hbm_bytes_per_s * c.efficiency.memory_bound);
}

}  // namespace hzp
