// Collective algorithms, their closed-form (α–β) costs and NCCL-like selection, plus the roofline compute
// cost. Shared by the analytic estimator and the simulator: sim/ implements each algorithm as flows and is
// tested against these formulas where nothing else competes for the links.
//
// Notation: a group has s0 members on each of s1 nodes (p = s0·s1), moving a buffer of S bytes (nccl-tests'
// size convention: all-gather output, reduce-scatter input, all-reduce buffer, all-to-all send buffer).
// Per-GPU, per-direction bandwidths:
//   B_i    intra-node: intra.bytes_per_s · efficiency.intra_node (switch). On a full mesh each pair of GPUs
//          has its own link of B_i/(R-1).
//   B_rail a member's share of the node's NICs when every GPU of the node drives the NICs at once (the
//          symmetric load of data parallelism): nic.per_node · nic_bw · efficiency.inter_node / R, divided
//          by the oversubscription when the group spans leaf switches (under ECMP routing, by
//          ecmp_slowdown instead: the uplinks a collision leaves it).
//   α_i, α_n   per-step latency inside a node / across nodes (NIC latency + 2 or 4 switch hops).
//
// Algorithms (t_pass = one reduce-scatter or all-gather pass; all-reduce = RS + AG):
//   ring          NCCL ring with one channel per NIC. AG/RS: λ + (p-1)/p·S/B; AR: 2x; BC: λ + S/B, where λ =
//                 ring_latency (below: (p-1)α_i in a node; across nodes the steps crossing nodes cost α_n,
//                 the others α_i); B = B_i inside a node, min(B_i, s0·B_rail) across nodes.
//   direct        full mesh, one node: every member sends its 1/p to each peer over the pair links at once.
//                 AG/RS: (p-1)α_i + (R-1)/p·S/B_i; AR: 2x.
//   hierarchical  s0 > 1 and s1 > 1 (NCCL/MiCS 2-level): intra-node RS (ring or direct) -> s0 concurrent
//                 inter-node rings over rails on S/s0 -> intra-node AG. AG: inter AG then intra AG; RS: intra
//                 RS then inter RS; AR: intra RS + inter AR + intra AG. Inter rings use B_rail and α_n.
//   pairwise      all-to-all: each member sends S/p to every peer at once.
//                 (p-1)α + max(intra part, inter part): intra (s0-1)/p·S/B_i on a switch, (R-1)/p·S/B_i on a
//                 mesh (one pair link per peer); inter (p-s0)/p·S/B_rail.
//   On a full mesh spanning nodes, the ring's intra-node hops use min(s0-1, channels) pair links.
// Selection (NCCL's tuner does the same with its own model): the cheapest applicable algorithm among those
// NCCL would consider — all-gather / reduce-scatter are rings (direct on one full-mesh node), all-reduce may
// also be 2-level (standing in for NCCL's tree) — unless the scenario forces one (cluster.collective_algorithm)
// and it applies to the group; forcing "hierarchical" gives MiCS-style 2-level gathers too.
#pragma once

#include <vector>

#include "shared/ir/schedule.h"
#include "shared/scenario/scenario.h"

namespace hzp {

enum class CollectiveAlgorithm { kRing, kDirect, kHierarchical, kPairwise };
const char* to_string(CollectiveAlgorithm algorithm);

// How a group sits on the cluster.
struct GroupShape {
  int ranks_per_node = 1;  // s0
  int nodes = 1;           // s1
  int nics = 1;            // distinct NICs serving one node's members (rail mapping)
  int size() const { return ranks_per_node * nodes; }
};
GroupShape group_shape(const ClusterSpec& cluster, const ProcessGroup& group);

// NCCL's protocols (src/graph/tuning.cc of NCCL 2.26.2): Simple moves whole buffers and pays the most per
// step; LL (a 4-byte flag beside every 4 bytes of data) and LL128 (one flag word per 128-byte line) forward
// each line as it lands, for a much smaller per-step latency and a fraction of the bandwidth:
//   protocol  base latency  per-step NVLink / NET (one GPU per node)  bandwidth fraction
//   LL        6.6 us        0.6 / 2.7 (5.0) us                        1/2, capped at the bus bandwidth
//                                                                     87.7 GB/s in an Ampere node (Volta 39,
//                                                                     Hopper 141, Blackwell 282:
//                                                                     cluster.gpu.arch), 39.0 on 2 nodes,
//                                                                     20.4 beyond
//   LL128     14.0 us       1.9 / 4.0 (8.5) us                        0.92 (0.7 with one GPU per node)
//   Simple    8.4 us        3.4 / 14.0 (14.0) us                      1
// With one GPU per node NCCL charges a ring's network steps its tree's NET latency ("latencies are fully
// exposed"). The cluster's latencies (calibration table, or the scenario) are Simple's; the other protocols
// scale them by the ratios above. Across nodes a ring step inside a node costs at least NCCL's network post overhead
// (1 us on x86; x3 for Simple). Simple all-reduce rings across nodes pay NCCL's "plateau" factor 1.4
// (Ampere and later) on their latency. cluster.protocol picks the protocol of ring and 2-level collectives
// (direct and pairwise exchanges use Simple): "simple" by default, "ll" / "ll128" forced as NCCL_PROTO, or
// "auto" = NCCL's own choice, the fastest by these formulas. Simple is the default because the evidence says
// so: on the published 16 MiB nccl-tests results (scenarios/validation/nccl_tests_rows.jsonl) "auto" picks
// LL128 and over-predicts bus bandwidth by 11-79 % where Simple is within -12..+20 %, and on the InternEvo
// dev rows it makes ZeRO-1's 1024-GPU broadcast chains 1.8x cheaper and the row 37 % too fast (Simple: 19 %)
// — the tuner's LL128 per-hop latencies are selection heuristics, not what a chain of 1000 GPUs achieves.
// Left out: LL128's per-channel cap (20 GB/s Ampere, 36.7 Hopper, per channel: above the NIC-bound rates
// here), NCCL's tree and NVLS algorithms.
enum class NcclProtocol { kLL, kLL128, kSimple };
const char* to_string(NcclProtocol protocol);

// The per-GPU bandwidths and latencies of the formulas above, for one protocol.
struct LinkParams {
  double intra = 0;  // B_i      (x the protocol's bandwidth fraction)
  double rail = 0;   // B_rail   (x the protocol's bandwidth fraction)
  double alpha_intra = 0;
  double alpha_inter = 0;
  NcclProtocol protocol = NcclProtocol::kSimple;
  double base_latency = 0;      // once per collective (NCCL's baseLat)
  double bandwidth_factor = 1;  // the protocol's fraction of the links' bandwidth (its wire overhead)
};
LinkParams link_params(const ClusterSpec& cluster, const GroupShape& shape,
                       NcclProtocol protocol = NcclProtocol::kSimple);

bool algorithm_applies(const ClusterSpec& cluster, CollectiveAlgorithm algorithm, CollectiveKind kind,
                       const GroupShape& shape);

// ECMP (cluster.inter_node.routing "ecmp"): the expected slowdown of a ring's inter-node hops whose flows are
// hashed onto uplinks, ≥ 1; 1 under balanced routing or inside one leaf. Each NIC's transfer to another
// leaf is 2·q flows (NCCL's two channels per NIC, q = qps_per_connection), each at most nic/(2q) by its
// cable; an uplink (a NIC's rate) carrying M of them gives each nic/M, so the ring runs max(2q, M)/(2q)
// times slower, M the most loaded uplink. Leaves crossed out of: one per leaf the group spans (nodes in
// order), or (s1/L')(1 - 1/L') per leaf over L' = min(leaves, s1) leaves (scattered). The flows of the
// crossings land uniformly on the pool's U uplinks (each rail's own pool when rail-optimized), so an
// uplink's load is about Poisson(λ = flows / U), and the largest of the uplink loads has P(M <= k) =
// F(k; λ)^draws, draws = pools · U (in order: the flows up out of a leaf are those down into the next) or
// 2 · pools · U (scattered). The simulator draws one hash; this is its expectation (Poisson's tail is a
// little heavier than the multinomial's: estimator_test holds it within 10 % of a direct throw of the flows
// onto 8 uplinks).
double ecmp_slowdown(const ClusterSpec& cluster, const GroupShape& shape);

// Seconds for one collective with the given algorithm (must apply) and protocol.
double algorithm_time(const ClusterSpec& cluster, CollectiveAlgorithm algorithm, CollectiveKind kind, double bytes,
                      const GroupShape& shape, NcclProtocol protocol);

// The protocol NCCL would run the algorithm with: the scenario's forced one, else the fastest (ring and
// 2-level); Simple for direct and pairwise exchanges.
NcclProtocol choose_protocol(const ClusterSpec& cluster, CollectiveAlgorithm algorithm, CollectiveKind kind,
                             double bytes, const GroupShape& shape);

// algorithm_time with choose_protocol's protocol.
double algorithm_time(const ClusterSpec& cluster, CollectiveAlgorithm algorithm, CollectiveKind kind, double bytes,
                      const GroupShape& shape);

// The algorithm NCCL-like selection picks (cheapest applicable, or the scenario's forced choice).
CollectiveAlgorithm choose_algorithm(const ClusterSpec& cluster, CollectiveKind kind, double bytes,
                                     const GroupShape& shape);

// algorithm_time of choose_algorithm; 0 for a group of one or an empty buffer.
double collective_time(const ClusterSpec& cluster, CollectiveKind kind, double bytes, const GroupShape& shape);

// Bytes one GPU sends for a collective of p ranks (ring volume): AG/RS/BC/A2A (p-1)/p·S, AR 2(p-1)/p·S.
double collective_bytes_sent(CollectiveKind kind, double bytes, int ranks);

// The ring steps that cross nodes on the collective's critical path. A ring visits each node's ranks in a
// row, so it has one network link per node (s1 of them). The collective ends when its last piece arrives,
// and a piece moves along consecutive links, one step each: p-1 of them for AG / RS / BC (every link but
// the one into where it starts), 2(p-1) for AR (once around, then all but two consecutive links again). A
// piece starting inside a node therefore crosses every network link: s1 steps (AG/RS/BC), 2·s1 (AR; 2·s1-1
// with two ranks per node, where one of any two consecutive links crosses nodes). With one rank per node
// every link crosses nodes: s1-1, AR 2(s1-1). NCCL's tuner counts nInterSteps = s1-1 (AR 2(s1-1)) whatever
// the ranks per node: the path of a piece that starts at a node's first rank, one network hop short of the
// slowest piece's. (Every channel's ring orders a node's GPUs its own way, so for a broadcast's root too
// some channel's chain crosses all s1 links.)
int ring_critical_inter_steps(CollectiveKind kind, const GroupShape& shape);

// The latency part of a ring collective, NCCL's tuner's ring latency (src/graph/tuning.cc) on the critical
// path: the protocol's base latency plus, of the ring's steps (AG/RS p-1, AR 2(p-1); a broadcast chain p-1
// hops), the ring_critical_inter_steps that cross nodes at α_n and the others at α_i; times 1.4 for a Simple
// all-reduce across nodes of at least 64 bytes per rank and channel (NCCL's "plateau"). (For broadcast the
// tuner counts one hop with sameChannels and nRanks tree hops otherwise, "waiting for proper chunk
// modeling"; the chain a chunk actually traverses is used instead.)
double ring_latency(CollectiveKind kind, const GroupShape& shape, const LinkParams& links, double bytes);

// Roofline-sum compute time: flops at the GEMM efficiency plus memory-bound bytes at the HBM efficiency.
double compute_time(const ClusterSpec& cluster, double flops, double mem_bytes);
// ... of a compute op: of its flops, `fp8_flops` run at the GPU's FP8 peak (the same efficiency) and the
// unfused attention core's `core_flops` take max(their time, `core_bytes` at the HBM efficiency); the rest
// at the bf16 peak, or as long as their GEMMs' `gemm_bytes` take at the HBM efficiency if that is longer;
// plus the GPU's fixed cost per GEMM kernel (`gemms` x GpuSpec::gemm_overhead_s); the causal flash kernel's
// `flash_flops` at the GEMM rate times flash_vs_gemm (flash_at_gemm_rate).
double compute_time(const ClusterSpec& cluster, const ComputeOp& op);
// The op's flash-attention FLOPs as the GEMM FLOPs that take as long: flash_flops / flash_vs_gemm of `gpu`.
double flash_at_gemm_rate(const GpuSpec& gpu, const ComputeOp& op);

}  // namespace hzp
