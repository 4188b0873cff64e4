// Pairwise all-to-all: every member sends S/p to every other member at once — GPU to GPU inside a node,
// NIC to NIC across nodes. Closed form (collective_cost.h): (p-1)α + max(intra part, inter part).
#include <vector>

#include "sim/collectives/algorithm.h"

namespace hzp::sim::collectives {

CollectiveTraffic run_pairwise(const Context& ctx) {
  const Platform& platform = ctx.platform;
  const double per_peer = ctx.call.bytes / ctx.size();
  CollectiveTraffic traffic;
  Phase phase(traffic, ctx);
  // phase 1a: inside each node, every member to every other member over the switch / its pair links.
  for (const Block& node : ctx.blocks) add_direct_pairs(phase, ctx, node, per_peer);
  // phase 1b: across nodes, NIC to NIC. load[b][x] = members of node b sending through NIC x (a member
  // driving w NICs counts 1/w on each). What node a's NIC x sends to node b — load_a[x]·s0_b·S/p — travels
  // as one flow to NIC x of node b, rail-aligned as NCCL's PXN routes it. When every node holds the same
  // members (the groups a schedule builds), each NIC link carries exactly the bytes of the p² member pairs,
  // with s1²·NICs flows instead of p²: SimGrid 3.32 pays O(flows) per finished flow (sim/README.md).
  const int nics = platform.cluster->nic.per_node;
  const int width = platform.nics_per_gpu();
  std::vector<std::vector<double>> load(ctx.blocks.size(), std::vector<double>(nics, 0.0));
  for (size_t b = 0; b < ctx.blocks.size(); ++b)
    for (int k = 0; k < ctx.blocks[b].size(); ++k)
      for (int i = 0; i < width; ++i) load[b][platform.nic_index(ctx.rank(ctx.blocks[b], k)) + i] += 1.0 / width;
  std::vector<char> spans(ctx.blocks.size());  // once per node, not per pair: p² pairs over 8192 nodes
  for (size_t b = 0; b < ctx.blocks.size(); ++b) spans[b] = spans_every_nic(ctx, ctx.blocks[b]) ? 1 : 0;
  for (size_t a = 0; a < ctx.blocks.size(); ++a)
    for (size_t b = 0; b < ctx.blocks.size(); ++b) {
      if (a == b) continue;
      const auto& src = platform.nics[ctx.blocks[a].node];
      const auto& dst = platform.nics[ctx.blocks[b].node];
      if (spans[a] && spans[b]) {
        // Evenly over every rail: one flow through the node bundles.
        phase.node_flow(platform, ctx.blocks[a].node, ctx.blocks[b].node,
                        ctx.blocks[a].size() * ctx.blocks[b].size() * per_peer);
        continue;
      }
      for (int x = 0; x < nics; ++x) phase.nic_flow(src[x], dst[x], load[a][x] * ctx.blocks[b].size() * per_peer);
    }
  // Every member handles its p-1 peers in p-1 protocol rounds.
  const double alpha = ctx.blocks.size() > 1 ? ctx.links.alpha_inter : ctx.links.alpha_intra;
  phase.finish((ctx.size() - 1) * alpha);
  return traffic;
}

}  // namespace hzp::sim::collectives
