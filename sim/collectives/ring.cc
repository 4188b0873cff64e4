// Ring all-gather / reduce-scatter / all-reduce / broadcast, as NCCL runs it: one ring per channel, one
// channel per NIC the group uses on a node. Closed form (collective_cost.h):
//   AG/RS λ + (p-1)/p·S/B,  AR λ + twice that,  BC λ + S/B, with λ = ring_latency (NCCL's base latency and
//   per-step latencies along the slowest piece's path, per protocol).
// A ring step moves a chunk to the successor; the p-1 steps are pipelined, so each member's link carries
// (p-1)/p·S over the whole pass: the simulation uses one flow per hop of that size, not one per step.
#include <algorithm>

#include "sim/collectives/algorithm.h"

namespace hzp::sim::collectives {
namespace {

// The NICs the ring's channels leave a node block through, ascending so that channel c runs on the same
// rail on every node. Rail mapping: the distinct NICs of the block's members; shared: every NIC.
std::vector<int> channel_nics(const Context& ctx, const Block& block) {
  const Platform& p = ctx.platform;
  const int count = p.cluster->nic.per_node;
  std::vector<int> nics;
  if (p.cluster->nic.mapping == NicMapping::kShared) {
    for (int k = 0; k < count; ++k) nics.push_back(k);
    return nics;
  }
  std::vector<char> used(count, 0);
  for (int k = 0; k < block.size(); ++k)
    for (int i = 0; i < p.nics_per_gpu(); ++i) used[p.nic_index(ctx.rank(block, k)) + i] = 1;
  for (int k = 0; k < count; ++k)
    if (used[k]) nics.push_back(k);
  return nics;
}

}  // namespace

CollectiveTraffic run_ring(const Context& ctx) {
  const CollectiveCall& call = ctx.call;
  const int p = ctx.size();
  const bool broadcast = call.kind == CollectiveKind::kBroadcast;
  // Per hop: a pass forwards p-1 chunks of S/p. All-reduce is NCCL's single kernel of 2(p-1) steps
  // (reduce-scatter steps then all-gather steps, no barrier between them): one flow of twice the bytes.
  // Broadcast pushes the whole buffer down the chain root -> ... -> last member, pipelined.
  const double hop_bytes = broadcast ? call.bytes : passes(call.kind) * (p - 1) / static_cast<double>(p) * call.bytes;
  CollectiveTraffic traffic;
  Phase phase(traffic, ctx);

  if (ctx.blocks.size() == 1) {
    // phase 1 (one node): member k -> k+1 through the switch, closing the ring inside the node (a
    // broadcast chain stops at the last member). On a full mesh only broadcast runs as a ring: each
    // member's share goes over all its pair links at once (NCCL builds one ring per channel on distinct
    // links), which a chain over a single pair link would not reach.
    const Block& node = ctx.blocks.front();
    add_ring_hops(phase, ctx, node, hop_bytes, /*wrap=*/!broadcast, ctx.full_mesh ? node.size() - 1 : 1);
    phase.finish(ring_latency(call.kind, ctx.shape, ctx.links, call.bytes));
    return traffic;
  }

  // phase 1 (across nodes): the S/nch of each channel runs through every member of a node, then crosses to
  // the next node from NIC c to NIC c (rail c). Intra-node hops of all channels share the chain
  // k -> k+1; on a full mesh the channels use different pair links, min(s0-1, nch) per GPU.
  std::vector<int> first = channel_nics(ctx, ctx.blocks.front());
  std::vector<int> here = first;
  const int channels = static_cast<int>(first.size());
  const int nblocks = static_cast<int>(ctx.blocks.size());
  for (int b = 0; b < nblocks; ++b) {
    const Block& block = ctx.blocks[b];
    const int spread = ctx.full_mesh ? std::max(1, std::min(block.size() - 1, channels)) : 1;
    add_ring_hops(phase, ctx, block, hop_bytes, /*wrap=*/false, spread);
    // The ring closes from the last node back to the first; a broadcast chain ends at the last node.
    if (broadcast && b + 1 == nblocks) break;
    const Block& next_block = ctx.blocks[(b + 1) % nblocks];
    std::vector<int> next = b + 1 == nblocks ? first : channel_nics(ctx, next_block);
    const auto& src = ctx.platform.nics[block.node];
    const auto& dst = ctx.platform.nics[next_block.node];
    const int all = ctx.platform.cluster->nic.per_node;
    if (static_cast<int>(here.size()) == all && static_cast<int>(next.size()) == all)
      phase.node_flow(ctx.platform, block.node, next_block.node, hop_bytes);  // every rail: one bundle flow
    else
      for (int c = 0; c < channels; ++c)
        phase.nic_flow(src[here[c % here.size()]], dst[next[c % next.size()]], hop_bytes / channels);
    here = std::move(next);
  }
  phase.finish(ring_latency(call.kind, ctx.shape, ctx.links, call.bytes));
  return traffic;
}

}  // namespace hzp::sim::collectives
