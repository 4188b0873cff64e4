// Direct all-gather / reduce-scatter / all-reduce inside one full-mesh node: every member exchanges its
// 1/p share with every peer at once, each over its own pair link. Closed form (collective_cost.h):
//   AG/RS (p-1)α_i + (R-1)/p·S/B_i (a pair link has B_i/(R-1)),  AR twice that.
#include "sim/collectives/algorithm.h"

namespace hzp::sim::collectives {

CollectiveTraffic run_direct(const Context& ctx) {
  const CollectiveCall& call = ctx.call;
  const int p = ctx.size();
  CollectiveTraffic traffic;
  Phase phase(traffic, ctx);
  // phase 1: member a sends S/p to every member b (all-reduce: its reduce-scatter share and then its
  // all-gather share over the same link, one flow of 2·S/p — the pair links are dedicated, so a barrier
  // between the halves would change nothing but the simulation cost).
  add_direct_pairs(phase, ctx, ctx.blocks.front(), passes(call.kind) * call.bytes / p);
  // The p-1 peers are served in p-1 rounds of the protocol: one α each (per pass).
  phase.finish(passes(call.kind) * (p - 1) * ctx.links.alpha_intra);
  return traffic;
}

}  // namespace hzp::sim::collectives
