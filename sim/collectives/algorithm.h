// Internal interface of the flow-level collective algorithms: one run function per algorithm file
// (ring.cc, direct.cc, hierarchical.cc, pairwise.cc), the flow builders they share, and the Phase helper
// (start flows, wait for all, sleep the α terms). registry.cc maps CollectiveAlgorithm to run functions.
//
// Conventions: intra-node flows go GPU host -> GPU host; inter-node flows go NIC host -> NIC host (the
// data reaches the NIC over PCIe by GPUDirect RDMA, not over NVLink). Flows of one phase start together;
// links carry no latency, so a phase's α terms are one sleep after its flows.
#pragma once

#include <cstdint>
#include <vector>

#include <simgrid/s4u/Host.hpp>

#include "sim/collective.h"

namespace hzp::sim::collectives {

// Consecutive members of the group (in ring order) that sit on one node: ranks[begin, end).
struct Block {
  int node = 0;
  int begin = 0;
  int end = 0;
  int size() const { return end - begin; }
};

// Everything an algorithm needs about one call, computed once in O(p).
struct Context {
  const Platform& platform;
  const CollectiveCall& call;
  std::vector<int> ranks;     // the group's members in physical order: node by node (see make_context)
  std::vector<Block> blocks;  // one per node visited (members of a node are consecutive in ring order)
  GroupShape shape;           // s0 = members of the first node, s1 = nodes
  LinkParams links;           // α terms (and bandwidths) of the closed forms
  bool full_mesh = false;     // intra-node topology

  int size() const { return static_cast<int>(ranks.size()); }
  int rank(const Block& b, int k) const { return ranks[b.begin + k]; }
};

// Requires a non-empty group (run_collective handles p <= 1).
Context make_context(const Platform& platform, const CollectiveCall& call);

// One point-to-point transfer of a phase.
struct Flow {
  simgrid::s4u::Host* src;
  simgrid::s4u::Host* dst;
  std::uint64_t bytes;
};

// Starts every flow at the current simulated instant and returns once all have landed.
void run_flows(const std::vector<Flow>& flows);

// The flows of one phase, collected as they are added; finish() starts them all at once, waits for all of
// them and then sleeps the phase's latency. Counts bytes per link class into `traffic`.
class Phase {
 public:
  // Flows carry their bytes / the protocol's bandwidth fraction (its wire overhead); traffic counts payload.
  Phase(CollectiveTraffic& traffic, const Context& ctx)
      : ctx_(ctx), traffic_(traffic), wire_scale_(1 / ctx.links.bandwidth_factor) {}
  void gpu_flow(simgrid::s4u::Host* src, simgrid::s4u::Host* dst, double bytes);  // intra-node link
  // Through NICs (hosts of platform.nics). Under ECMP a flow between leaves becomes one flow per NCCL
  // channel of the NIC, each hashed onto an uplink (see ecmp_flows in flows.cc).
  void nic_flow(simgrid::s4u::Host* src, simgrid::s4u::Host* dst, double bytes);
  // A GPU-to-GPU transfer between nodes, NIC to NIC, split evenly over the GPUs' NICs when each GPU
  // drives several (Platform::nics_per_gpu).
  void rank_nic_flow(const Platform& platform, int src_rank, int dst_rank, double bytes);
  // Traffic spread evenly over every NIC of two nodes, as one flow between their NIC bundles (under ECMP,
  // between leaves: one NIC flow per rail, since each is hashed on its own).
  void node_flow(const Platform& platform, int src_node, int dst_node, double bytes);
  // Intra-node bytes of hops represented by another flow (see add_ring_hops): counted, not simulated.
  void count_intra(double bytes);
  void finish(double latency_s);

 private:
  void start(simgrid::s4u::Host* src, simgrid::s4u::Host* dst, double bytes);
  void ecmp_flows(int src_nic, int dst_nic, double bytes);
  const Context& ctx_;
  std::vector<Flow> flows_;
  double tallied_ = 0;       // flows of this phase counted by a dry run (CollectiveCall::tally)
  double tallied_ecmp_ = 0;  // of which ECMP-hashed
  bool in_ecmp_ = false;
  CollectiveTraffic& traffic_;
  double wire_scale_ = 1;
};

// Ring hops inside one node block: member k sends `hop_bytes` to member k+1 (mod the block), spread
// evenly over `spread` successors k+1..k+spread (different pair links of a full mesh; 1 on a switch).
// `wrap`: the last member sends too (a ring closed inside the node); otherwise the chain ends there
// (the ring leaves the node through a NIC, or a broadcast chain ends).
// Simulated as one representative hop (member 0's): every hop loads its own links identically, and
// every flow costs the simulator time and memory (sim/README.md). All hops' bytes are counted in the
// traffic.
void add_ring_hops(Phase& phase, const Context& ctx, const Block& block, double hop_bytes, bool wrap, int spread);

// Direct exchange inside one node block: every member sends `pair_bytes` to every other member
// (simulated as one representative member pair, all bytes counted).
void add_direct_pairs(Phase& phase, const Context& ctx, const Block& block, double pair_bytes);

// Whether the block's members use every NIC of their node equally (their traffic can go as a node flow).
bool spans_every_nic(const Context& ctx, const Block& block);

// One run function per algorithm; each returns the bytes it put on each link class.
CollectiveTraffic run_ring(const Context& ctx);
CollectiveTraffic run_direct(const Context& ctx);
CollectiveTraffic run_hierarchical(const Context& ctx);
CollectiveTraffic run_pairwise(const Context& ctx);

// Passes over the data: 2 for all-reduce (reduce-scatter + all-gather), else 1.
inline int passes(CollectiveKind kind) {
  return kind == CollectiveKind::kAllReduce ? 2 : 1;
}

}  // namespace hzp::sim::collectives
