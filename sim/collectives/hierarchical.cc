// Two-level (NCCL/MiCS-style) all-gather / reduce-scatter / all-reduce for s0 > 1 members on s1 > 1 nodes:
// an intra-node pass on every node at once (the node's own algorithm) and s0 concurrent inter-node rings,
// ring j joining the members with local index j — on their rail, NIC to NIC. Closed form
// (collective_cost.h): AG = inter AG of S/s0 + intra AG of S; RS = intra RS of S + inter RS of S/s0;
// AR = intra RS + inter AR of S/s0 + intra AG.
#include "sim/collectives/algorithm.h"

namespace hzp::sim::collectives {
namespace {

// One intra-node reduce-scatter or all-gather pass of S among each node's s0 members, every node at once:
// direct exchange on a full mesh (S/s0 to each peer), ring through the switch ((s0-1)/s0·S per hop).
void intra_pass(const Context& ctx, Phase& phase) {
  const double bytes = ctx.call.bytes;
  for (const Block& node : ctx.blocks) {
    const int s0 = node.size();
    if (ctx.full_mesh)
      add_direct_pairs(phase, ctx, node, bytes / s0);
    else
      add_ring_hops(phase, ctx, node, (s0 - 1) / static_cast<double>(s0) * bytes, /*wrap=*/true, 1);
  }
  // The nodes run in parallel: one node's s0-1 protocol steps.
  phase.finish((ctx.shape.ranks_per_node - 1) * ctx.links.alpha_intra);
}

// The s0 inter-node rings, each over the S/s0 shard its members own after (or before) the intra pass.
// `npasses` = 2 runs an all-reduce as one pipelined ring of twice the bytes (as ring.cc does).
void inter_rings(const Context& ctx, Phase& phase, int npasses) {
  const int s1 = static_cast<int>(ctx.blocks.size());
  const double shard = ctx.call.bytes / ctx.shape.ranks_per_node;
  const double hop_bytes = npasses * (s1 - 1) / static_cast<double>(s1) * shard;
  for (int b = 0; b < s1; ++b) {
    const Block& here = ctx.blocks[b];
    const Block& next = ctx.blocks[(b + 1) % s1];
    // Ring j: local member j of this node -> local member j of the next node, NIC to NIC on its rail.
    // When the members cover every rail evenly, the s0 rings cross the node boundary as one bundle flow.
    if (here.size() == next.size() && spans_every_nic(ctx, here) && spans_every_nic(ctx, next)) {
      phase.node_flow(ctx.platform, here.node, next.node, here.size() * hop_bytes);
      continue;
    }
    for (int j = 0; j < here.size() && j < next.size(); ++j)
      phase.rank_nic_flow(ctx.platform, ctx.rank(here, j), ctx.rank(next, j), hop_bytes);
  }
  phase.finish(npasses * (s1 - 1) * ctx.links.alpha_inter);
}

}  // namespace

CollectiveTraffic run_hierarchical(const Context& ctx) {
  CollectiveTraffic traffic;
  Phase phase(traffic, ctx);
  switch (ctx.call.kind) {
    case CollectiveKind::kAllGather:
      inter_rings(ctx, phase, 1);  // phase 1: each member gathers its shard column across nodes (S/s0)
      intra_pass(ctx, phase);      // phase 2: the node gathers the s0 columns into S
      break;
    case CollectiveKind::kReduceScatter:
      intra_pass(ctx, phase);      // phase 1: reduce-scatter S inside the node: member j holds column j
      inter_rings(ctx, phase, 1);  // phase 2: reduce-scatter column j across nodes (S/s0)
      break;
    case CollectiveKind::kAllReduce:
      intra_pass(ctx, phase);      // phase 1: intra-node reduce-scatter: member j holds column j (S/s0)
      inter_rings(ctx, phase, 2);  // phase 2: all-reduce column j across nodes, s0 rings at once
      intra_pass(ctx, phase);      // phase 3: intra-node all-gather of the reduced columns
      break;
    default:
      break;  // broadcast / all-to-all: not a two-level algorithm (algorithm_applies refuses them)
  }
  return traffic;
}

}  // namespace hzp::sim::collectives
