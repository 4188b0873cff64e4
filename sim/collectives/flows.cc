// Flow builders and the phase helper shared by every collective algorithm (algorithm.h).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Exec.hpp>

#include "sim/collectives/actor_pool.h"
#include "sim/collectives/algorithm.h"

namespace hzp::sim::collectives {
namespace sg4 = simgrid::s4u;

Context make_context(const Platform& platform, const CollectiveCall& call) {
  // NCCL builds its rings from the topology, whatever the communicator's rank order (which only decides
  // which chunk each rank ends up with): walk the members node by node. Ranks are numbered node-major.
  Context ctx{platform, call, call.group->ranks, {}, {}, {}, false};
  std::sort(ctx.ranks.begin(), ctx.ranks.end());
  // A broadcast's chain starts at its root (a pipeline transfer's direction is its root's): nodes in order
  // from the root's, each node's members together, the root's own from the root on.
  if (call.kind == CollectiveKind::kBroadcast && call.root >= 0 &&
      call.root < static_cast<int>(call.group->ranks.size())) {
    const long long root = call.group->ranks[call.root], nodes = platform.cluster->nodes;
    const long long world = nodes * platform.cluster->gpus_per_node;
    auto key = [&](int r) {
      return std::pair{(platform.node_of(r) - platform.node_of(static_cast<int>(root)) + nodes) % nodes,
                       (r - root + world) % world};
    };
    std::sort(ctx.ranks.begin(), ctx.ranks.end(), [&](int a, int b) { return key(a) < key(b); });
  }
  const ClusterSpec& c = *platform.cluster;
  for (int i = 0; i < ctx.size(); ++i) {
    const int node = platform.node_of(ctx.ranks[i]);
    if (ctx.blocks.empty() || ctx.blocks.back().node != node) ctx.blocks.push_back({node, i, i});
    ++ctx.blocks.back().end;
  }
  // The shape as group_shape() would give it, without its O(p log p) sets: this runs on every call.
  ctx.shape.ranks_per_node = ctx.blocks.front().size();
  ctx.shape.nodes = static_cast<int>(ctx.blocks.size());
  ctx.shape.nics = c.nic.per_node;
  if (c.nic.mapping == NicMapping::kRail) {
    std::vector<char> used(c.nic.per_node, 0);
    for (int k = 0; k < ctx.blocks.front().size(); ++k) used[platform.nic_index(ctx.rank(ctx.blocks.front(), k))] = 1;
    ctx.shape.nics = static_cast<int>(std::count(used.begin(), used.end(), 1));
  }
  ctx.links = link_params(c, ctx.shape, call.protocol);
  ctx.full_mesh = c.intra.topology == IntraNodeTopology::kFullMesh;
  return ctx;
}

namespace {

// A flow is a two-host execution that computes nothing and moves `bytes` from the first host to the second:
// SimGrid's default host model makes it the very network action a host-to-host Comm makes (CM02, the same
// route, rate and sharing). Not Comm::sendto_async: SimGrid 3.32 detaches every host-to-host Comm and removes
// each finished one from a single list of all the detached Comms in flight (std::list::remove, a linear
// scan), which was half of a large simulation's time and grew with its concurrent flows. An execution is
// listed on the actor that started it only, so that scan covers one actor's flows.
void start_and_wait(const Flow* flows, std::size_t count) {
  std::vector<sg4::ExecPtr> execs;
  execs.reserve(count);
  for (std::size_t i = 0; i < count; ++i)
    execs.push_back(sg4::this_actor::exec_init({flows[i].src, flows[i].dst}, {0, 0},
                                               {0, static_cast<double>(flows[i].bytes), 0, 0}));
  for (const sg4::ExecPtr& e : execs) e->start();
  for (const sg4::ExecPtr& e : execs) e->wait();
}

// The pool of the current simulation (one per process: build_platform refuses a second platform). Never
// destroyed: its actors' mutexes must not outlive the engine in a static destructor.
ActorPool& flow_actors() {
  static const sg4::Engine* engine = nullptr;
  static ActorPool* pool = nullptr;
  if (pool == nullptr || engine != sg4::Engine::get_instance()) {
    engine = sg4::Engine::get_instance();
    pool = new ActorPool("flows");
  }
  return *pool;
}

}  // namespace

void run_flows(const std::vector<Flow>& flows) {
  const std::size_t n = flows.size();
  const std::size_t share = kFlowsPerActor;
  const std::size_t shares = (n + share - 1) / share;
  if (shares <= 1) return start_and_wait(flows.data(), n);
  Countdown others(static_cast<int>(shares - 1));
  for (std::size_t s = 1; s < shares; ++s) {
    const std::size_t first = s * share;
    flow_actors().run(flows[first].src, [&flows, &others, first, n, share] {
      start_and_wait(&flows[first], std::min(share, n - first));
      others.done();
    });
  }
  start_and_wait(flows.data(), share);
  others.wait();
}

void Phase::start(sg4::Host* src, sg4::Host* dst, double bytes) {
  // SimGrid moves whole bytes; a sub-byte share (a tiny buffer over many ranks) takes no time anyway.
  const auto whole = static_cast<std::uint64_t>(std::llround(bytes * wire_scale_));
  if (whole == 0) return;
  if (ctx_.call.tally != nullptr) {
    ++tallied_;  // a dry run counts, and keeps no flow: an all-to-all over 8192 nodes has 67 M of them
    if (in_ecmp_) ++tallied_ecmp_;
    return;
  }
  flows_.push_back({src, dst, whole});
}

void Phase::gpu_flow(sg4::Host* src, sg4::Host* dst, double bytes) {
  if (bytes <= 0 || src == dst) return;
  traffic_.intra_node_bytes += bytes;
  start(src, dst, bytes);
}

void Phase::nic_flow(sg4::Host* src, sg4::Host* dst, double bytes) {
  if (bytes <= 0 || src == dst) return;
  traffic_.inter_node_bytes += bytes;
  const Platform& p = ctx_.platform;
  if (p.ecmp()) {
    // Node bundles (node_flow) reach here only between nodes of one leaf, where no uplink is crossed.
    const auto a = p.nic_ids.find(src), b = p.nic_ids.find(dst);
    const int nics = p.cluster->nic.per_node;
    if (a != p.nic_ids.end() && b != p.nic_ids.end() &&
        p.leaf_of_node[a->second / nics] != p.leaf_of_node[b->second / nics])
      return ecmp_flows(a->second, b->second, bytes);
  }
  start(src, dst, bytes);
}

void Phase::ecmp_flows(int src_nic, int dst_nic, double bytes) {
  const Platform& p = ctx_.platform;
  const std::uint64_t group = ecmp_group_key(*ctx_.call.group);
  const int channels = p.ecmp_channels();
  if (ctx_.call.tally != nullptr) {  // a dry run counts the channels' flows; which uplinks they hash to is moot
    // (hashing each took half of a 16 s refusal of an all-to-all over 640 ECMP nodes)
    if (std::llround(bytes / channels * wire_scale_) == 0) return;
    tallied_ += channels;
    tallied_ecmp_ += channels;
    return;
  }
  in_ecmp_ = true;
  for (int channel = 0; channel < channels; ++channel) {
    const int u = p.ecmp_uplink(group, src_nic, dst_nic, channel);
    start(p.port(src_nic, u), p.port(dst_nic, u), bytes / channels);
  }
  in_ecmp_ = false;
}

void Phase::count_intra(double bytes) {
  traffic_.intra_node_bytes += bytes;
}

void Phase::rank_nic_flow(const Platform& platform, int src_rank, int dst_rank, double bytes) {
  const int width = platform.nics_per_gpu();
  const auto& src_nics = platform.nics[platform.node_of(src_rank)];
  const auto& dst_nics = platform.nics[platform.node_of(dst_rank)];
  for (int i = 0; i < width; ++i)
    nic_flow(src_nics[platform.nic_index(src_rank) + i], dst_nics[platform.nic_index(dst_rank) + i], bytes / width);
}

void Phase::finish(double latency_s) {
  if (FlowTally* tally = ctx_.call.tally) {
    tally->flows += tallied_;
    tally->peak = std::max(tally->peak, tallied_);
    // A finished flow makes SimGrid re-solve the sharing of the flows linked to it through shared links: a
    // pairwise exchange's flows all share their nodes' NICs (pairs), a ring's hops each run on links of
    // their own (the per-flow term), and ECMP-hashed flows collide on uplinks (pairs, costlier).
    if (ctx_.call.algorithm == CollectiveAlgorithm::kPairwise)
      tally->pair_work += (tallied_ - tallied_ecmp_) * tallied_;
    tally->ecmp_pair_work += tallied_ecmp_ * tallied_;
    tallied_ = 0;
    tallied_ecmp_ = 0;
    return;
  }
  // All flows of the phase start at the same simulated instant; every one must land before the next phase
  // reads its data.
  run_flows(flows_);
  flows_.clear();
  if (latency_s > 0) sg4::this_actor::sleep_for(latency_s);
}

void add_ring_hops(Phase& phase, const Context& ctx, const Block& block, double hop_bytes, bool wrap, int spread) {
  const int n = block.size();
  if (n <= 1) return;
  // Every hop of the chain carries hop_bytes over its own GPU links, so member 0's hop stands for all of
  // them under the symmetric load of a schedule; the bytes of every hop are counted.
  const auto& gpus = ctx.platform.gpus;
  for (int j = 1; j <= spread; ++j)
    phase.gpu_flow(gpus[ctx.rank(block, 0)], gpus[ctx.rank(block, j % n)], hop_bytes / spread);
  phase.count_intra(((wrap ? n : n - 1) - 1) * hop_bytes);
}

void add_direct_pairs(Phase& phase, const Context& ctx, const Block& block, double pair_bytes) {
  const int n = block.size();
  if (n <= 1) return;
  // Representative member pair, as for ring hops: a switch port carries a member's n-1 transfers, a
  // full-mesh pair link exactly one.
  const auto& gpus = ctx.platform.gpus;
  const double carried = ctx.full_mesh ? pair_bytes : (n - 1) * pair_bytes;
  phase.gpu_flow(gpus[ctx.rank(block, 0)], gpus[ctx.rank(block, 1)], carried);
  phase.count_intra(n * (n - 1) * pair_bytes - carried);
}

bool spans_every_nic(const Context& ctx, const Block& block) {
  const Platform& p = ctx.platform;
  const int count = p.cluster->nic.per_node;
  if (p.cluster->nic.mapping == NicMapping::kShared) return true;
  std::vector<int> members(count, 0);
  for (int k = 0; k < block.size(); ++k)
    for (int i = 0; i < p.nics_per_gpu(); ++i) ++members[p.nic_index(ctx.rank(block, k)) + i];
  return std::all_of(members.begin(), members.end(), [&](int m) { return m == members.front() && m > 0; });
}

void Phase::node_flow(const Platform& platform, int src_node, int dst_node, double bytes) {
  if (platform.ecmp() && platform.leaf_of_node[src_node] != platform.leaf_of_node[dst_node]) {
    const int nics = platform.cluster->nic.per_node;
    for (int k = 0; k < nics; ++k) nic_flow(platform.nics[src_node][k], platform.nics[dst_node][k], bytes / nics);
    return;
  }
  nic_flow(platform.node_nics[src_node], platform.node_nics[dst_node], bytes);
}

}  // namespace hzp::sim::collectives
