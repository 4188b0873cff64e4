// run_collective (collective.h): the one table from CollectiveAlgorithm to its flow-level implementation.
// A new algorithm adds its file (sim/collectives/<name>.cc), its run function in algorithm.h, and a row here.
#include <cassert>

#include <simgrid/s4u/Actor.hpp>

#include "sim/collectives/algorithm.h"

namespace hzp::sim {
namespace {

struct AlgorithmEntry {
  CollectiveAlgorithm algorithm;
  CollectiveTraffic (*run)(const collectives::Context& ctx);
};

constexpr AlgorithmEntry kAlgorithms[] = {
    {CollectiveAlgorithm::kRing, collectives::run_ring},
    {CollectiveAlgorithm::kDirect, collectives::run_direct},
    {CollectiveAlgorithm::kHierarchical, collectives::run_hierarchical},
    {CollectiveAlgorithm::kPairwise, collectives::run_pairwise},
};

}  // namespace

CollectiveTraffic run_collective(const Platform& platform, const CollectiveCall& call) {
  // Nothing to move: the closed form is 0 too (collective_cost.h).
  if (call.group == nullptr || call.group->ranks.size() <= 1 || call.bytes <= 0) return {};
  const collectives::Context ctx = collectives::make_context(platform, call);
  assert(algorithm_applies(*platform.cluster, call.algorithm, call.kind, ctx.shape) &&
         "caller picks an applicable algorithm");
  for (const AlgorithmEntry& entry : kAlgorithms) {
    if (entry.algorithm != call.algorithm) continue;
    const CollectiveTraffic traffic = entry.run(ctx);
    // The kernel's base latency (the ring counts it in its ring_latency).
    if (call.algorithm != CollectiveAlgorithm::kRing && call.tally == nullptr)
      simgrid::s4u::this_actor::sleep_for(ctx.links.base_latency);
    return traffic;
  }
  return {};
}

}  // namespace hzp::sim
