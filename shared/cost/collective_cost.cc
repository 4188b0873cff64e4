// Closed-form collective costs per algorithm, NCCL-like selection, and the roofline compute cost
// (formulas in collective_cost.h).
#include "shared/cost/collective_cost.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "shared/scenario/calibration.h"

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

namespace {

// NCCL's protocol constants (src/graph/tuning.cc of NCCL 2.26.2, commit f44ac759: baseLat and hwLat, Ring;
// the LL/LL128 bandwidth refinements and llMaxBws for an x86 Intel host; getNetOverhead). Latencies in µs,
// bandwidths in GB/s.
struct ProtocolRow {
  NcclProtocol protocol;
  const char* name;
  double base_us;      // baseLat[Ring][p]
  double nvlink_us;    // hwLat[NVLINK][Ring][p]
  double net_us;       // hwLat[NET][Ring][p]
  double net_ppn1_us;  // hwLat[NET][Tree][p]: a ring's network steps with one GPU per node ("fully exposed")
};
constexpr ProtocolRow kProtocols[] = {
    {NcclProtocol::kLL, "ll", 6.6, 0.6, 2.7, 5.0},
    {NcclProtocol::kLL128, "ll128", 14.0, 1.9, 4.0, 8.5},
    {NcclProtocol::kSimple, "simple", 8.4, 3.4, 14.0, 14.0},
};
constexpr const ProtocolRow& kSimpleRow = kProtocols[2];
constexpr double kNetOverheadUs = 1.0;        // getNetOverhead: x86 Intel (AMD: 2.0)
constexpr double kLLFraction = 0.5;           // busBw * .5 (NCCL 2.21 on; 2.20 took 1/4, 1/3 for AG/RS/BC in a node)
constexpr double kLLTwoNodesCapGBps = 39.0;   // llMaxBws, Intel host, 2 nodes
constexpr double kLLManyNodesCapGBps = 20.4;  // llMaxBws, Intel host, more than 2 nodes
constexpr double kLL128Fraction = 0.92;       // 120/128 less kernel overhead
constexpr double kLL128OneGpuPerNode = 0.7;   // ppn < 2
constexpr double kRingPlateau = 1.4;          // Simple all-reduce across nodes, compute capability >= 8.0

const ProtocolRow& row_of(NcclProtocol protocol) {
  for (const ProtocolRow& r : kProtocols)
    if (r.protocol == protocol) return r;
  return kSimpleRow;
}

// llMaxBws on one node, by architecture (Volta 39.0, Ampere 87.7, Hopper 141, Blackwell 2 x 141).
double ll_one_node_cap_GBps(GpuArch arch) {
  switch (arch) {
    case GpuArch::kVolta:
      return 39.0;
    case GpuArch::kHopper:
      return 141.0;
    case GpuArch::kBlackwell:
      return 282.0;
    case GpuArch::kAmpere:
    case GpuArch::kUnknown:  // not from a scenario: the parser asks for cluster.gpu.arch where LL may run
      break;
  }
  return 87.7;
}

}  // namespace

const char* to_string(NcclProtocol protocol) {
  return row_of(protocol).name;
}

double ecmp_slowdown(const ClusterSpec& c, const GroupShape& shape) {
  const int leaves = c.leaves();
  if (c.inter.routing != Routing::kEcmp || leaves < 2 || shape.nodes < 2) return 1;
  const bool scattered = c.inter.placement == Placement::kScattered;
  if (!scattered && shape.nodes <= c.inter.leaf_size) return 1;
  const int spanned = scattered ? std::min(leaves, shape.nodes)
                                : std::min(leaves, (shape.nodes + c.inter.leaf_size - 1) / c.inter.leaf_size);
  const double crossings = scattered ? shape.nodes / static_cast<double>(spanned) * (1 - 1.0 / spanned) : 1.0;
  const int per_nic = 2 * c.inter.qps_per_connection;
  const int nics = std::max(1, shape.nics);
  const int pools = spanned * (c.inter.rail_optimized ? nics : 1);
  const double flows = crossings * per_nic * (c.inter.rail_optimized ? 1 : nics);
  const double uplinks = ecmp_uplinks_per_nic(c);
  if (uplinks == 1) return std::max<double>(per_nic, flows) / per_nic;  // one uplink: it carries every flow
  const double lambda = flows / uplinks;
  // In order, the flows up out of a leaf are the flows down into the next (the same index at both ends): one
  // draw per uplink. Scattered, a leaf's downlinks gather other leaves' crossings: two.
  const double draws = (scattered ? 2.0 : 1.0) * pools * uplinks;
  // Far above the NICs' share (thousands of flows per uplink): the Gaussian maximum, λ + sqrt(2λ ln draws).
  if (lambda > 200) return std::max<double>(per_nic, lambda + std::sqrt(2 * lambda * std::log(draws))) / per_nic;
  // E[max(2q, M)] = 2q + sum over k >= 2q of P(M > k), with P(M <= k) = F(k; λ)^draws.
  double expected = per_nic, cdf = 0, pmf = std::exp(-lambda);
  for (int k = 0; k < 100000; ++k) {
    cdf += pmf;
    if (k >= per_nic) {
      const double tail = 1 - std::pow(std::min(1.0, cdf), draws);
      expected += tail;
      if (tail < 1e-9 && k > lambda) break;
    }
    pmf *= lambda / (k + 1);
  }
  return expected / per_nic;
}

LinkParams link_params(const ClusterSpec& c, const GroupShape& shape, NcclProtocol protocol) {
  LinkParams p;
  p.intra = c.intra.bytes_per_s * c.efficiency.intra_node;
  // Nodes placed in order fill a leaf before the next; scattered ones put nearly every pair under two leaves.
  const bool spans_leaves =
      c.inter.placement == Placement::kScattered ? shape.nodes > 1 && c.leaves() > 1 : shape.nodes > c.inter.leaf_size;
  p.rail = c.nic.per_node * c.nic.bytes_per_s * c.efficiency.inter_node / c.gpus_per_node;
  if (spans_leaves) p.rail /= c.inter.routing == Routing::kEcmp ? ecmp_slowdown(c, shape) : c.inter.oversubscription;
  const ProtocolRow& row = row_of(protocol);
  const bool multi_node = shape.nodes > 1;
  p.protocol = protocol;
  p.base_latency = row.base_us * 1e-6;
  p.alpha_intra = c.intra.latency_s * row.nvlink_us / kSimpleRow.nvlink_us;
  if (multi_node)
    p.alpha_intra = std::max(p.alpha_intra, kNetOverheadUs * 1e-6 * (protocol == NcclProtocol::kSimple ? 3 : 1));
  const double switches = (spans_leaves ? 4 : 2) * c.inter.switch_latency_s;
  const double net_us = shape.ranks_per_node == 1 ? row.net_ppn1_us : row.net_us;
  p.alpha_inter = std::max(p.alpha_intra, c.nic.latency_s * net_us / kSimpleRow.net_us + switches);
  switch (protocol) {
    case NcclProtocol::kSimple:
      break;
    case NcclProtocol::kLL128:
      p.bandwidth_factor = shape.ranks_per_node < 2 ? kLL128OneGpuPerNode : kLL128Fraction;
      break;
    case NcclProtocol::kLL: {
      const double ring_bw = multi_node ? std::min(p.intra, shape.ranks_per_node * p.rail) : p.intra;
      const double cap_GBps = shape.nodes == 1   ? ll_one_node_cap_GBps(c.gpu.arch)
                              : shape.nodes == 2 ? kLLTwoNodesCapGBps
                                                 : kLLManyNodesCapGBps;
      p.bandwidth_factor = std::min(kLLFraction, cap_GBps * 1e9 / ring_bw);
      break;
    }
  }
  p.intra *= p.bandwidth_factor;
  p.rail *= p.bandwidth_factor;
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
  if (s.nodes == 1) return l.base_latency + intra_time(c, kind, bytes, p, l);
  const double latency = ring_latency(kind, s, l, bytes);
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

int ring_critical_inter_steps(CollectiveKind kind, const GroupShape& s) {
  if (s.nodes <= 1) return 0;
  const int m = s.nodes;
  if (s.ranks_per_node == 1) return kind == CollectiveKind::kAllReduce ? 2 * (m - 1) : m - 1;
  if (kind != CollectiveKind::kAllReduce) return m;
  return s.ranks_per_node == 2 ? 2 * m - 1 : 2 * m;
}

double ring_latency(CollectiveKind kind, const GroupShape& s, const LinkParams& l, double bytes) {
  const int p = s.size();
  if (p <= 1) return 0;
  const int passes = kind == CollectiveKind::kAllReduce ? 2 : 1;
  const int steps = kind == CollectiveKind::kBroadcast ? p - 1 : passes * (p - 1);
  if (s.nodes <= 1) return l.base_latency + steps * l.alpha_intra;
  const int inter_steps = ring_critical_inter_steps(kind, s);
  const double latency = l.base_latency + (steps - inter_steps) * l.alpha_intra + inter_steps * l.alpha_inter;
  const bool plateau = l.protocol == NcclProtocol::kSimple && kind == CollectiveKind::kAllReduce &&
                       bytes / (std::max(1, s.nics) * static_cast<double>(p)) >= 64;
  return plateau ? kRingPlateau * latency : latency;
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
                      const GroupShape& s, NcclProtocol protocol) {
  if (s.size() <= 1 || bytes <= 0) return 0;
  const LinkParams l = link_params(c, s, protocol);
  switch (algorithm) {
    case CollectiveAlgorithm::kRing:
      return ring_time(c, kind, bytes, s, l);  // ring_latency holds the base latency
    case CollectiveAlgorithm::kDirect:
      return l.base_latency + intra_time(c, kind, bytes, s.size(), l);
    case CollectiveAlgorithm::kHierarchical:
      return l.base_latency + hierarchical_time(c, kind, bytes, s, l);
    case CollectiveAlgorithm::kPairwise:
      return l.base_latency + pairwise_time(c, bytes, s, l);
  }
  return 0;
}

NcclProtocol choose_protocol(const ClusterSpec& c, CollectiveAlgorithm algorithm, CollectiveKind kind, double bytes,
                             const GroupShape& s) {
  if (algorithm == CollectiveAlgorithm::kDirect || algorithm == CollectiveAlgorithm::kPairwise)
    return NcclProtocol::kSimple;
  switch (c.protocol) {
    case ProtocolChoice::kLL:
      return NcclProtocol::kLL;
    case ProtocolChoice::kLL128:
      return NcclProtocol::kLL128;
    case ProtocolChoice::kSimple:
      return NcclProtocol::kSimple;
    case ProtocolChoice::kAuto:
      break;
  }
  NcclProtocol best = NcclProtocol::kSimple;
  double best_time = algorithm_time(c, algorithm, kind, bytes, s, best);
  for (NcclProtocol p : {NcclProtocol::kLL128, NcclProtocol::kLL}) {
    const double t = algorithm_time(c, algorithm, kind, bytes, s, p);
    if (t < best_time) {
      best = p;
      best_time = t;
    }
  }
  return best;
}

double algorithm_time(const ClusterSpec& c, CollectiveAlgorithm algorithm, CollectiveKind kind, double bytes,
                      const GroupShape& s) {
  return algorithm_time(c, algorithm, kind, bytes, s, choose_protocol(c, algorithm, kind, bytes, s));
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

double compute_time(const ClusterSpec& c, const ComputeOp& op) {
  const double gemm = c.gpu.peak_flops * c.efficiency.gemm;
  const double hbm = c.gpu.hbm_bytes_per_s * c.efficiency.memory_bound;
  const double fp8_s = op.fp8_flops > 0 ? op.fp8_flops / (c.gpu.fp8_gemm_peak() * c.efficiency.gemm) : 0;
  const double core_s = std::max(op.core_flops / gemm, op.core_bytes / hbm);
  const double linear_s =
      std::max((op.flops - op.fp8_flops - op.core_flops - op.flash_flops) / gemm + fp8_s, op.gemm_bytes / hbm);
  return linear_s + op.gemms * c.gpu.gemm_overhead_s + core_s + flash_at_gemm_rate(c.gpu, op) / gemm +
         op.mem_bytes / hbm;
}

double flash_at_gemm_rate(const GpuSpec& gpu, const ComputeOp& op) {
  if (op.flash_flops <= 0) return 0;
  return op.flash_flops / flash_vs_gemm(gpu, op.phase == Phase::kBackward, op.flash_head_dim, op.flash_seq);
}

}  // namespace hzp
