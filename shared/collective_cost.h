// Closed-form (α–β) cost of collectives and compute, shared by the analytic estimator and the tests that
// check the simulator against it.
//
// Ring algorithms over p ranks moving a buffer of S bytes (nccl-tests' size convention):
//   all-gather, reduce-scatter, broadcast (pipelined):  (p-1)·α + (p-1)/p · S / B
//   all-reduce (reduce-scatter + all-gather):           2·[(p-1)·α + (p-1)/p · S / B]
//   all-to-all (pairwise):                               (p-1)·α + (p-1)/p · S / B
// B is the ring's bottleneck per-GPU bandwidth:
//   intra-node   intra.bytes_per_s · efficiency.intra_node; on a full mesh only the s0-1 links to group
//                members carry traffic, so B is scaled by (s0-1)/(R-1);
//   inter-node   the NIC bandwidth a group member can count on when every GPU of the node runs a collective
//                of the same shape at once (symmetric data-parallel load): s0 · nics·nic_bw / R, at
//                efficiency.inter_node, divided by the oversubscription when the group spans leaf switches.
//                NCCL reaches this by running one ring channel per NIC (rails).
//   B = min(intra, inter) for groups that span nodes.
// α is the per-step latency of the slowest hop: intra-node latency, or NIC latency plus 2 switch hops
// (4 when the group spans leaf switches).
#pragma once

#include <cstdint>

#include "scenario.h"
#include "schedule.h"

namespace hzp {

struct LinkModel {
  double bandwidth = 0;  // bytes/s, per GPU, per direction
  double latency = 0;    // seconds per ring step
};

// The ring bottleneck for a group with `ranks_per_node` members on each of `nodes` nodes.
LinkModel ring_link(const ClusterSpec& cluster, int ranks_per_node, int nodes);

// Seconds for one collective over a group of the given shape.
double collective_time(const ClusterSpec& cluster, CollectiveKind kind, double bytes, int ranks_per_node, int nodes);

// Bytes one GPU sends for a collective of p ranks (ring): AG/RS/BC/A2A (p-1)/p·S, AR 2(p-1)/p·S.
double collective_bytes_sent(CollectiveKind kind, double bytes, int ranks);

// Roofline-sum compute time: flops at the GEMM efficiency plus memory-bound bytes at the HBM efficiency.
double compute_time(const ClusterSpec& cluster, double flops, double mem_bytes);

}  // namespace hzp
