// The SimGrid platform of a cluster: GPU hosts, intra-node switch or full mesh, NIC hosts on rails, and a
// two-level fat-tree between nodes. See sim/README.md for the model and why it is built this way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <unordered_map>
#include <vector>

#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>

#include "shared/base/status.h"
#include "shared/ir/schedule.h"
#include "shared/scenario/scenario.h"

namespace hzp::sim {

// SimGrid's solver recurses over the flows and links a flow shares (update_modified_cnst_set_rec), as deep
// as the set of coupled constraints: an all-reduce over 1024 ECMP-routed nodes needs 1-2 MiB of stack, 8192
// nodes overflow the usual 8 MiB main-thread stack (issue 35, item 11). Every simulation therefore runs on a
// thread of its own with simulation_stack_bytes() of stack (reserved address space; only the pages the
// recursion touches are committed). Runs `body` there and waits; an exception `body` throws is rethrown
// here. kInternal when the thread cannot be created.
// 256 MiB (32x what 2048 ECMP nodes need), or an eighth of an address-space limit (ulimit -v) when that is less.
std::size_t simulation_stack_bytes();
Status run_on_simulation_stack(const std::function<void()>& body);

// Full-mesh nodes are packed into SimGrid full zones of at most this many GPUs (a full zone's routing table
// is quadratic in its hosts; fewer zones because SimGrid checks every new name against every zone).
constexpr int kMeshZoneGpus = 512;

// Sets SimGrid's configuration for NCCL-like timing (network model, sharing, contexts). Call once per
// process, before build_platform and before any other SimGrid call that creates resources.
void configure_engine(simgrid::s4u::Engine& engine);

struct Platform {
  const ClusterSpec* cluster = nullptr;
  std::vector<simgrid::s4u::Host*> gpus;               // by global rank
  std::vector<std::vector<simgrid::s4u::Host*>> nics;  // [node][nic]
  // Per node, an endpoint behind all of the node's NICs at once (see build_platform): traffic that a
  // collective spreads evenly over every rail of a node travels as one flow between two such endpoints.
  std::vector<simgrid::s4u::Host*> node_nics;
  std::vector<int> leaf_of_node;  // cluster.inter_node.placement

  // ECMP routing (cluster.inter_node.routing, on more than one leaf), else empty: NIC k of node n sends to
  // another leaf through uplink u of its pool from ports[(n·NICs + k)·uplinks_per_nic + u]; nic_ids maps
  // each NIC host to n·NICs + k.
  int uplinks_per_nic = 0;
  std::vector<simgrid::s4u::Host*> ports;
  std::unordered_map<const simgrid::s4u::Host*, int> nic_ids;
  bool ecmp() const { return !ports.empty(); }
  simgrid::s4u::Host* port(int nic_id, int uplink) const {
    return ports[static_cast<size_t>(nic_id) * uplinks_per_nic + uplink];
  }
  // Flows per NIC-to-NIC transfer under ECMP, each hashed on its own: NCCL's two channels per NIC (two
  // rings per NIC: its maintainers, NVIDIA/nccl#518) times the queue pairs of each channel's connection
  // (cluster.inter_node.qps_per_connection, NCCL_IB_QPS_PER_CONNECTION).
  int ecmp_channels() const;
  // The uplink (index in the NIC's pool) that ECMP gives one flow: a hash of the communicator, the two NICs
  // and the flow's index, seeded by cluster.inter_node.seed. RoCE v2 switches hash a queue pair's UDP
  // source port, fixed for the communicator's life, so a flow keeps its uplink from step to step; the spine
  // reaches the destination leaf through its own link there, the same index at the other end.
  int ecmp_uplink(std::uint64_t group_key, int src_nic, int dst_nic, int flow) const;

  int node_of(int rank) const { return rank / cluster->gpus_per_node; }
  // The NIC a GPU's inter-node traffic leaves through. Rail mapping: local g -> NIC g*nics/R; shared
  // mapping: NIC g mod nics (round-robin, so each NIC serves R/nics GPUs as on a rail-mapped node).
  simgrid::s4u::Host* nic_of(int rank) const;
  // Index of nic_of(rank) in nics[node_of(rank)]. With more NICs than GPUs each GPU drives
  // nics_per_gpu() consecutive NICs starting there (e.g. 2 x 200 Gb/s per GPU); otherwise 1.
  int nic_index(int rank) const;
  int nics_per_gpu() const;
};

// What identifies a communicator to the ECMP hash: its role, first rank and size.
std::uint64_t ecmp_group_key(const ProcessGroup& group);

// Builds the platform into `engine` (which must have been configured). `cluster` must outlive the result.
Result<Platform> build_platform(simgrid::s4u::Engine& engine, const ClusterSpec& cluster);

}  // namespace hzp::sim
