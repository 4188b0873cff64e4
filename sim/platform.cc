// The SimGrid platform of a cluster (platform.h): engine configuration and the zone tree.
//
//   cluster (star zone = the non-blocking spine; routes only between leaf zones)
//   ├── gpus-<n>   GPU hosts: one star zone of per-GPU NVSwitch ports, or full zones of per-pair mesh links
//   └── leaf-<l>   one star zone per leaf switch holding the NIC hosts of its nodes; its gateway router
//                  reaches the spine through the leaf's own uplink (balanced routing), or under ECMP each
//                  NIC has one endpoint per uplink it may hash onto, whose route ends with that uplink
//
// GPU hosts and NIC hosts never talk to each other: an inter-node flow is modelled NIC -> NIC (GPUDirect
// RDMA takes the data from the GPU to its rail NIC over PCIe, not over NVLink), an intra-node flow GPU -> GPU.
#include "sim/platform.h"

#include <pthread.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>

#include <simgrid/s4u/Link.hpp>
#include <simgrid/s4u/NetZone.hpp>

#include "shared/base/hash.h"

namespace hzp::sim {
namespace sg4 = simgrid::s4u;

std::size_t simulation_stack_bytes() {
  std::size_t stack = std::size_t{256} << 20;
  struct rlimit limit {};
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
    stack = std::max<std::size_t>(std::size_t{16} << 20, std::min<std::size_t>(stack, limit.rlim_cur / 8));
  return stack;
}

Status run_on_simulation_stack(const std::function<void()>& body) {
  struct Call {
    const std::function<void()>* body;
    std::exception_ptr error;
  } call{&body, nullptr};
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  const std::size_t stack = simulation_stack_bytes();
  int rc = pthread_attr_setstacksize(&attr, stack);
  pthread_t thread;
  if (rc == 0)
    rc = pthread_create(
        &thread, &attr,
        [](void* arg) -> void* {
          auto* c = static_cast<Call*>(arg);
          try {
            (*c->body)();
          } catch (...) {
            c->error = std::current_exception();
          }
          return nullptr;
        },
        &call);
  pthread_attr_destroy(&attr);
  if (rc != 0)
    return Status::Internal("cannot start the simulation thread with a " + std::to_string(stack >> 20) +
                            " MiB stack: " + std::strerror(rc));
  pthread_join(thread, nullptr);
  if (call.error) std::rethrow_exception(call.error);
  return Status::Ok();
}

void configure_engine(sg4::Engine& engine) {
  // CM02 (Casanova & Marchal 2002): plain max-min sharing of link bandwidth, no TCP-derived corrections.
  // The default LV08 model multiplies latencies by 13 and bandwidths by 0.97 (fitted to TCP on Ethernet);
  // NCCL over NVLink / InfiniBand is calibrated by the efficiency factors instead.
  engine.set_config("network/model:CM02");
  // Make the factors explicit, so that a future default cannot silently rescale every flow.
  engine.set_config("network/latency-factor:1");
  engine.set_config("network/bandwidth-factor:1");
  // Cross-traffic would charge every flow's acknowledgements (5 % of its rate) on the reverse route; RDMA
  // and NVLink acknowledgements are negligible, and it would make the two directions of a link interfere.
  engine.set_config("network/crosstraffic:0");
  // Sharing independent of route length. CM02 gives a flow the LMM sharing penalty "route latency +
  // weight-S · Σ 1/bandwidth" — RTT-proportional, so a flow crossing the spine would get less of a shared
  // NIC than one staying in its leaf — except that a flow whose route has zero latency gets weight 1. Every
  // link here has zero latency (algorithms sleep their α terms instead), so all flows on a link get equal
  // shares whatever their route (measured: with 1 µs per link, a 2-link and a 4-link flow split a NIC 2:1
  // even with weight-S 0). weight-S is CM02's default 0; set explicitly because it only matters once a
  // latency is added, and then it should add no bandwidth term either.
  engine.set_config("network/weight-S:0");
  // TCP-gamma caps each flow at gamma / (2·route latency), a TCP window limit RDMA does not have. Routes
  // have zero latency here (no cap at all); set it huge so that a latency added later cannot quietly cap flows.
  engine.set_config("network/TCP-gamma:1e18");
  // One simulation thread: parallel contexts crash beyond ~64 hosts with SimGrid 3.32 (measured here).
  engine.set_config("contexts/nthreads:1");
  // One actor per (rank, stream): 16,384 GPUs make 33k+ actors. A guard page per actor stack costs a memory
  // mapping of its own, and Linux allows 65,530 per process (vm.max_map_count), so SimGrid aborted past
  // ~16k actors ("Failed to protect stack"). Actors here recurse a few frames deep: no guard page, and
  // 256 KiB stacks instead of 8 MiB (33k x 8 MiB of address space is 264 GiB).
  engine.set_config("contexts/guard-size:0");
  engine.set_config("contexts/stack-size:256");
}

int Platform::nics_per_gpu() const {
  return std::max(1, cluster->nic.per_node / cluster->gpus_per_node);
}

int Platform::nic_index(int rank) const {
  const int R = cluster->gpus_per_node;
  const int count = cluster->nic.per_node;
  const int g = rank % R;
  // rail: GPU g sits on the PCIe switch of NIC g·nics/R (NCCL's rail-aligned rings rely on it);
  // shared: every GPU reaches every NIC, spread round-robin so that each NIC serves R/nics GPUs.
  return cluster->nic.mapping == NicMapping::kRail ? g * count / R : g * nics_per_gpu() % count;
}

sg4::Host* Platform::nic_of(int rank) const {
  return nics[node_of(rank)][nic_index(rank)];
}

int Platform::ecmp_channels() const {
  constexpr int kChannelsPerNic = 2;
  return kChannelsPerNic * cluster->inter.qps_per_connection;
}

int Platform::ecmp_uplink(std::uint64_t group_key, int src_nic, int dst_nic, int flow) const {
  std::uint64_t key = splitmix64(static_cast<std::uint64_t>(cluster->inter.seed) ^ 0x65636d70ULL);
  for (std::uint64_t part : {group_key, static_cast<std::uint64_t>(src_nic), static_cast<std::uint64_t>(dst_nic),
                             static_cast<std::uint64_t>(flow)})
    key = splitmix64(key ^ part);
  return static_cast<int>(key % static_cast<std::uint64_t>(uplinks_per_nic));
}

std::uint64_t ecmp_group_key(const ProcessGroup& group) {
  std::uint64_t key = splitmix64(static_cast<std::uint64_t>(group.role));
  key = splitmix64(key ^ static_cast<std::uint64_t>(group.ranks.empty() ? -1 : group.ranks.front()));
  return splitmix64(key ^ group.ranks.size());
}

Result<Platform> build_platform(sg4::Engine& engine, const ClusterSpec& c) {
  if (c.nodes < 1 || c.gpus_per_node < 1 || c.nic.per_node < 1 || c.inter.leaf_size < 1)
    return Status::InvalidInput("build_platform: cluster needs at least one node, GPU, NIC and node per leaf");
  if (engine.get_netzone_root() != nullptr)
    return Status::Internal("build_platform: the engine already has a platform (one simulation per process)");
  const int R = c.gpus_per_node;
  const double gpu_speed = c.gpu.peak_flops * c.efficiency.gemm;
  const double gpu_link = c.intra.bytes_per_s * c.efficiency.intra_node;
  const double nic_link = c.nic.bytes_per_s * c.efficiency.inter_node;
  const int leaves = (c.nodes + c.inter.leaf_size - 1) / c.inter.leaf_size;

  Platform p;
  p.cluster = &c;
  p.gpus.reserve(static_cast<size_t>(c.world_size()));
  p.nics.resize(c.nodes);
  sg4::NetZone* root = sg4::create_star_zone("cluster");

  // GPU zones. SimGrid 3.32 checks every new host and link name against every zone of the platform, so
  // the zone count is kept small: one star zone holds all GPUs of a switched cluster (its routes are
  // exactly the per-node switch ports; cross-node GPU routes exist but no flow uses them), and full-mesh
  // nodes are packed into full zones of up to kMeshZoneGpus GPUs (a full zone's table is quadratic).
  const bool mesh = c.intra.topology == IntraNodeTopology::kFullMesh;
  const int nodes_per_zone = mesh ? std::max(1, kMeshZoneGpus / R) : c.nodes;
  for (int first_node = 0; first_node < c.nodes; first_node += nodes_per_zone) {
    const int last_node = std::min(c.nodes, first_node + nodes_per_zone);
    const std::string name = "gpus-" + std::to_string(first_node);
    sg4::NetZone* zone = mesh ? sg4::create_full_zone(name) : sg4::create_star_zone(name);
    zone->set_parent(root);
    for (int rank = first_node * R; rank < last_node * R; ++rank)
      p.gpus.push_back(zone->create_host("gpu-" + std::to_string(rank), gpu_speed)->seal());
    for (int n = first_node; n < last_node; ++n) {
      sg4::Host* const* gpu = &p.gpus[static_cast<size_t>(n) * R];
      if (!mesh) {
        // NVSwitch: each GPU's NVLinks are one full-duplex port of the non-blocking switch.
        for (int g = 0; g < R; ++g) {
          sg4::SplitDuplexLink* port = zone->create_split_duplex_link("nvl-" + std::to_string(n * R + g), gpu_link);
          port->seal();
          zone->add_route(gpu[g]->get_netpoint(), nullptr, nullptr, nullptr, {{port, sg4::LinkInRoute::Direction::UP}},
                          true);
        }
        continue;
      }
      // Full mesh: the GPU's bandwidth is split evenly over R-1 point-to-point links, one per peer.
      for (int a = 0; a < R; ++a)
        for (int b = a + 1; b < R; ++b) {
          sg4::SplitDuplexLink* pair = zone->create_split_duplex_link(
              "mesh-" + std::to_string(n) + "-" + std::to_string(a) + "-" + std::to_string(b), gpu_link / (R - 1));
          pair->seal();
          zone->add_route(gpu[a]->get_netpoint(), gpu[b]->get_netpoint(), nullptr, nullptr,
                          {{pair, sg4::LinkInRoute::Direction::UP}}, true);
        }
    }
    zone->seal();
  }

  // Where each node sits (cluster.inter_node.placement), and the nodes under each leaf.
  p.leaf_of_node = node_leaves(c);
  std::vector<std::vector<int>> leaf_nodes(leaves);
  for (int n = 0; n < c.nodes; ++n) leaf_nodes[p.leaf_of_node[n]].push_back(n);
  p.node_nics.resize(c.nodes);
  // ECMP: every NIC gets one endpoint per uplink it may hash onto, whose route ends with that uplink, so a
  // flow that picks uplink u runs between the two NICs' endpoints u (SimGrid routes per host, not per flow).
  const bool ecmp = c.inter.routing == Routing::kEcmp && leaves > 1;
  if (ecmp) {
    p.uplinks_per_nic = ecmp_uplinks_per_nic(c);
    p.ports.resize(static_cast<size_t>(c.nodes) * c.nic.per_node * p.uplinks_per_nic);
  }
  const int pools = c.inter.rail_optimized ? c.nic.per_node : 1;  // uplink pools per leaf
  const double leaf_up_bw = c.inter.leaf_size * c.nic.per_node * nic_link / c.inter.oversubscription;

  for (int l = 0; l < leaves; ++l) {
    const std::string leaf = "leaf-" + std::to_string(l);
    sg4::NetZone* zone = sg4::create_star_zone(leaf);
    zone->set_parent(root);
    // The leaf switch itself is the zone's centre; the router is where its uplink starts.
    simgrid::kernel::routing::NetPoint* gateway = zone->create_router(leaf + "-switch");
    // ECMP's uplinks: ports at the rate that makes them add up to the balanced model's aggregated uplink.
    std::vector<sg4::SplitDuplexLink*> ups;
    for (int u = 0; ecmp && u < pools * p.uplinks_per_nic; ++u) {
      ups.push_back(
          zone->create_split_duplex_link(leaf + "-up-" + std::to_string(u), leaf_up_bw / (pools * p.uplinks_per_nic)));
      ups.back()->seal();
    }
    for (int n : leaf_nodes[l]) {
      // The node's NICs together: every rail's traffic also crosses this bundle, whose capacity is the sum of
      // the rails, so it never limits rail traffic alone. A collective that spreads its bytes evenly over
      // all rails sends one flow through the bundle instead of one per rail: same link loads, far fewer
      // flows (each flow costs the simulator time and memory, sim/README.md).
      const std::string node = "nic-" + std::to_string(n);
      sg4::SplitDuplexLink* bundle = zone->create_split_duplex_link(node + "-bundle", c.nic.per_node * nic_link);
      bundle->seal();
      sg4::Host* all = zone->create_host(node + "-all", 1.0)->seal();
      zone->add_route(all->get_netpoint(), nullptr, nullptr, nullptr, {{bundle, sg4::LinkInRoute::Direction::UP}},
                      true);
      p.node_nics[n] = all;
      for (int k = 0; k < c.nic.per_node; ++k) {
        const std::string name = node + "-" + std::to_string(k);
        sg4::Host* nic = zone->create_host(name, 1.0)->seal();
        sg4::SplitDuplexLink* cable = zone->create_split_duplex_link(name + "-link", nic_link);
        cable->seal();
        zone->add_route(nic->get_netpoint(), nullptr, nullptr, nullptr,
                        {{cable, sg4::LinkInRoute::Direction::UP}, {bundle, sg4::LinkInRoute::Direction::UP}}, true);
        p.nics[n].push_back(nic);
        if (!ecmp) continue;
        p.nic_ids.emplace(nic, n * c.nic.per_node + k);
        const int pool = c.inter.rail_optimized ? k : 0;
        for (int u = 0; u < p.uplinks_per_nic; ++u) {
          sg4::Host* port = zone->create_host(name + "-up-" + std::to_string(u), 1.0)->seal();
          zone->add_route(port->get_netpoint(), nullptr, nullptr, nullptr,
                          {{cable, sg4::LinkInRoute::Direction::UP},
                           {bundle, sg4::LinkInRoute::Direction::UP},
                           {ups[pool * p.uplinks_per_nic + u], sg4::LinkInRoute::Direction::UP}},
                          true);
          p.ports[(static_cast<size_t>(n) * c.nic.per_node + k) * p.uplinks_per_nic + u] = port;
        }
      }
    }
    zone->seal();
    // Each leaf reaches the spine through its own uplink: the leaf's downlink capacity (a full leaf, even
    // when the last one is partly populated) over the oversubscription. Per-leaf uplinks, not one shared
    // backbone: a single cluster-wide link would put every inter-leaf flow in one sharing system and make
    // each re-solve cost O(all flows) (measured: 4096 hosts took 162 s instead of 8 s). Under ECMP the
    // uplinks are in the ports' routes instead, and leaf-to-leaf routes add nothing.
    std::vector<sg4::LinkInRoute> up_route;
    if (!ecmp) {
      sg4::SplitDuplexLink* uplink = root->create_split_duplex_link(leaf + "-uplink", leaf_up_bw);
      uplink->seal();
      up_route.emplace_back(uplink, sg4::LinkInRoute::Direction::UP);
    }
    root->add_route(zone->get_netpoint(), nullptr, gateway, nullptr, up_route, true);
  }
  root->seal();
  return p;
}

}  // namespace hzp::sim
