// The SimGrid platform of a cluster: GPU hosts, intra-node switch or full mesh, NIC hosts on rails, and a
// two-level fat-tree between nodes. See sim/README.md for the model and why it is built this way.
#pragma once

#include <vector>

#include <simgrid/s4u/Engine.hpp>
#include <simgrid/s4u/Host.hpp>

#include "shared/scenario.h"
#include "shared/status.h"

namespace hzp::sim {

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

  int node_of(int rank) const { return rank / cluster->gpus_per_node; }
  // The NIC a GPU's inter-node traffic leaves through. Rail mapping: local g -> NIC g*nics/R; shared
  // mapping: NIC g mod nics (round-robin, so each NIC serves R/nics GPUs as on a rail-mapped node).
  simgrid::s4u::Host* nic_of(int rank) const;
  // Index of nic_of(rank) in nics[node_of(rank)]. With more NICs than GPUs each GPU drives
  // nics_per_gpu() consecutive NICs starting there (e.g. 2 x 200 Gb/s per GPU); otherwise 1.
  int nic_index(int rank) const;
  int nics_per_gpu() const;
};

// Builds the platform into `engine` (which must have been configured). `cluster` must outlive the result.
Result<Platform> build_platform(simgrid::s4u::Engine& engine, const ClusterSpec& cluster);

}  // namespace hzp::sim
