// α–β collective costs and the roofline compute cost (formulas in collective_cost.h).
#include "collective_cost.h"

#include <algorithm>

namespace hzp {

LinkModel ring_link(const ClusterSpec& c, int ranks_per_node, int nodes) {
  const int R = c.gpus_per_node;
  double intra = c.intra.bytes_per_s * c.efficiency.intra_node;
  if (c.intra.topology == IntraNodeTopology::kFullMesh && R > 1)
    intra *= static_cast<double>(std::max(ranks_per_node - 1, 1)) / (R - 1);
  if (nodes <= 1) return {intra, c.intra.latency_s};

  const bool spans_leaves = nodes > c.inter.leaf_size;
  double inter = ranks_per_node * c.nic.per_node * c.nic.bytes_per_s / R * c.efficiency.inter_node;
  if (spans_leaves) inter /= c.inter.oversubscription;
  const double hops = spans_leaves ? 4 : 2;
  const double latency = std::max(c.intra.latency_s, c.nic.latency_s + hops * c.inter.switch_latency_s);
  return {ranks_per_node > 1 ? std::min(intra, inter) : inter, latency};
}

double collective_time(const ClusterSpec& c, CollectiveKind kind, double bytes, int ranks_per_node, int nodes) {
  const int p = ranks_per_node * nodes;
  if (p <= 1 || bytes <= 0) return 0;
  const LinkModel link = ring_link(c, ranks_per_node, nodes);
  const double one_pass = (p - 1) * link.latency + (p - 1) / static_cast<double>(p) * bytes / link.bandwidth;
  return kind == CollectiveKind::kAllReduce ? 2 * one_pass : one_pass;
}

double collective_bytes_sent(CollectiveKind kind, double bytes, int ranks) {
  if (ranks <= 1) return 0;
  const double pass = (ranks - 1) / static_cast<double>(ranks) * bytes;
  return kind == CollectiveKind::kAllReduce ? 2 * pass : pass;
}

double compute_time(const ClusterSpec& c, double flops, double mem_bytes) {
  return flops / (c.gpu.peak_flops * c.efficiency.gemm) + mem_bytes / (c.gpu.hbm_bytes_per_s * c.efficiency.memory_bound);
}

}  // namespace hzp
