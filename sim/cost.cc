// The cost of a simulation before it runs (cost.h).
#include "sim/cost.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "shared/base/memory_limits.h"
#include "sim/collective.h"
#include "sim/platform.h"

namespace hzp::sim {
namespace {

// Measured on the 2-core reference machine by bench/sim_cost.sh (sim/README.md, "What a simulation costs",
// has the runs and how close the estimate comes): the cost of the simulator itself, not a property of any
// simulated cluster. Seconds: least squares over the ZeRO-3 series (128 to 16,384 GPUs) for the op term;
// the published recipes (4 to 10 M flows) for the flow term; the pairwise all-to-alls over 256 to 1024 nodes
// (65 k to 1 M flows in one phase) for the pair term; the largest ECMP all-reduce (1024 nodes) for the ECMP
// term. Rounded up: a simulation is rather overestimated (up to ~2x) than under.
constexpr double kSecondsPerOp = 2.8e-6;            // an op executed, with its simcalls and wake-ups
constexpr double kSecondsPerFlow = 1e-5;            // a flow: its execution, its actor's wait, its solve
constexpr double kSecondsPerFlowPair = 1.2e-11;     // the max-min solver, per (finished flow x flow it shares with)
constexpr double kSecondsPerEcmpFlowPair = 7.0e-8;  // the same for an ECMP-hashed flow (more links, collisions)
constexpr double kSecondsPerHostZone = 2.5e-7;      // building the platform: SimGrid checks each new host
                                                    // name against every zone (16,384 A800 nodes in 514 zones:
                                                    // ~27 s; an ECMP port host, its route of three links: x3)
constexpr double kSecondsPerPortCubed = 1.3e-15;    // ECMP ports (1024, 2048, 4096 nodes x 8 NICs x 16 uplinks:
                                                    // 3.5, 21, 186 s)
constexpr double kSecondsPerMeshLink = 1e-5;        // a full-mesh pair link and its route (64-GPU mesh nodes,
constexpr double kSecondsPerMeshLinkZone = 2e-7;    // 64 to 512 of them: 1.2, 2.8, 6.3, 21 s), and per zone
constexpr double kSecondsPerRecordedOp = 4e-6;      // a timeline span: its JSON, written (and gzipped)
// Memory: what the process holds when the estimate is made (binary, libraries, the compiled scenario: ~200 MB
// where CUDA's libraries are linked; kBaseBytes where /proc cannot tell), then what the engine adds. Measured
// after issue 35's eighth attack found simulations at 131,072 GPUs taking twice the estimate (a host or link
// was counted 1.2 kB, spans recorded during the run nothing): `hzp simulate scenarios/default.json --set
// cluster.nodes=N` for N = 1024 / 4096 / 16384 (8 GPUs a node, symmetric, so hosts and links dominate) held
// 176 / 503 / 1815 MB over its start with 40 k / 160 k / 640 k hosts and links and 114 k spans recorded; the
// two constants below fit the three within 1 %.
constexpr double kBaseBytes = 45e6;
constexpr double kBytesPerActor = 14.5e3;        // an actor's touched stack pages, context, rank state
constexpr double kBytesPerHost = 2.7e3;          // a SimGrid host or link with its routes
constexpr double kBytesPerRunSpan = 0.6e3;       // a timeline span as recorded while the engine runs
constexpr double kBytesPerFlow = 1.7e3;          // a flow in flight: its Comm, solver variable and elements
constexpr double kBytesPerRecordedOp = 1.2e3;    // a timeline span: recorded, its JSON tree, its text
constexpr double kActorStackBytes = 256 * 1024;  // reserved per actor (configure_engine's contexts/stack-size)

std::string count(double n) {
  char buf[32];
  if (n < 1e4)
    std::snprintf(buf, sizeof buf, "%.0f", n);
  else if (n < 1e6)
    std::snprintf(buf, sizeof buf, "%.1fk", n / 1e3);
  else if (n < 1e9)
    std::snprintf(buf, sizeof buf, "%.1fM", n / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.1fG", n / 1e9);
  return buf;
}

std::string duration(double s) {
  char buf[32];
  if (s < 10)  // a budget below a second ("--max-sim-seconds 1e-7") read "past the budget of 0 s"
    std::snprintf(buf, sizeof buf, "%.2g s", s);
  else if (s < 120)
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%.1f min", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

// The ranks' actors and the pooled ones that start the flows of large phases (collective.h, kFlowsPerActor).
double all_actors(const SimCost& cost) {
  return cost.actors + std::ceil(cost.peak_flows / kFlowsPerActor);
}

}  // namespace

double platform_seconds(const SimCost& cost) {
  return (cost.platform_hosts + 3 * cost.ecmp_ports) * cost.zones * kSecondsPerHostZone +
         cost.ecmp_ports * cost.ecmp_ports * cost.ecmp_ports * kSecondsPerPortCubed +
         cost.mesh_links * (kSecondsPerMeshLink + cost.zones * kSecondsPerMeshLinkZone);
}

void announce_platform_build(const SimCost& cost) {
  const double s = platform_seconds(cost);
  if (s >= kAnnouncedBuildSeconds)
    std::fprintf(stderr,
                 "sim: building the platform (%s hosts in %s zones), about %s; its flows are counted and the "
                 "budget checked again after it\n",
                 count(cost.hosts).c_str(), count(cost.zones).c_str(), duration(s).c_str());
}

void estimate_cost(SimCost& cost) {
  cost.seconds = platform_seconds(cost) + cost.ops * kSecondsPerOp + cost.recorded_ops * kSecondsPerRecordedOp +
                 cost.flows * kSecondsPerFlow + cost.pair_work * kSecondsPerFlowPair +
                 cost.ecmp_pair_work * kSecondsPerEcmpFlowPair;
  if (cost.base_resident_bytes == 0) {
    const double now = resident_bytes();
    cost.base_resident_bytes = now > 0 ? now : kBaseBytes;
    cost.base_mapped_bytes = address_space_mapped();
  }
  // The timeline is written after the engine is gone, into the memory it freed: the peak is the larger of the two.
  const double actors = all_actors(cost);
  const double engine = std::max(actors * kBytesPerActor + (cost.hosts + cost.links) * kBytesPerHost +
                                     cost.peak_flows * kBytesPerFlow + cost.recorded_ops * kBytesPerRunSpan,
                                 cost.recorded_ops * kBytesPerRecordedOp);
  cost.resident_bytes = cost.base_resident_bytes + engine;
  // The address space the process already maps, then what the simulation adds: its thread's stack and every
  // actor's.
  cost.virtual_bytes =
      cost.base_mapped_bytes + engine + actors * kActorStackBytes + static_cast<double>(simulation_stack_bytes());
}

void add_platform_estimate(SimCost& cost, const ClusterSpec& cluster) {
  const double nodes = cluster.nodes, nics = cluster.nic.per_node;
  cost.platform_hosts = static_cast<double>(cluster.world_size()) + nodes * (nics + 1);
  const bool ecmp = cluster.inter.routing == Routing::kEcmp && cluster.nodes > cluster.inter.leaf_size;
  cost.ecmp_ports = ecmp ? nodes * nics * ecmp_uplinks_per_nic(cluster) : 0;  // as build_platform makes them
  cost.hosts = cost.platform_hosts + cost.ecmp_ports;
  const bool mesh = cluster.intra.topology == IntraNodeTopology::kFullMesh;
  const double R = cluster.gpus_per_node;
  // As build_platform makes them: the root, one zone per leaf, one zone of GPUs (or of kMeshZoneGpus mesh GPUs).
  cost.zones = 1 + cluster.leaves() + (mesh ? std::ceil(nodes / std::max(1.0, std::floor(kMeshZoneGpus / R))) : 1);
  cost.links = 2 * cost.platform_hosts;  // about: each GPU's port and each NIC's link, both ways
  if (mesh) {
    cost.mesh_links = nodes * R * (R - 1) / 2;
    cost.links += 2 * cost.mesh_links;
  }
}

std::string describe(const SimCost& cost) {
  const std::string head = "about " + duration(cost.seconds) + " and " + gib(cost.resident_bytes) + " (";
  if (cost.collectives == 0)  // the first check, before the platform is built and the flows counted
    return head + count(cost.ops) + " ops and a platform of " + count(cost.hosts) +
           " hosts, before its flows are counted)";
  return head + count(cost.ops) + " ops, " + count(cost.collectives) + " collectives, " +
         (cost.flows_at_least ? "at least " : "") + count(cost.flows) + " flows" +
         (cost.peak_flows > 0 ? ", up to " + count(cost.peak_flows) + " at once" : "") +
         (cost.flows_at_least ? ", counted before the platform is built)" : ")");
}

Status check_budget(const SimCost& cost, const SimBudget& budget) {
  const double max_bytes = budget.max_bytes > 0 ? budget.max_bytes : memory_allowance();
  const std::string what = "this simulation would take " + describe(cost) + " on the reference machine";
  if (budget.max_seconds > 0 && cost.seconds > budget.max_seconds)
    return Status::InvalidInput(what + ", past the budget of " + duration(budget.max_seconds) +
                                "; --max-sim-seconds raises it (0: no limit), or simulate fewer GPUs, layers or "
                                "steps (sim/README.md, \"What a simulation costs\")");
  if (cost.resident_bytes > max_bytes)
    return Status::InvalidInput(
        what + ", past the " + gib(max_bytes) +
        (budget.max_bytes > 0 ? " of --max-sim-GiB" : " this machine allows (3/4 of its memory or its limits)") +
        "; --max-sim-GiB raises it, or simulate fewer GPUs (sim/README.md, \"What a simulation costs\")");
  if (cost.virtual_bytes > address_space_limit())
    return Status::InvalidInput(
        what + ", and its " + count(all_actors(cost)) + " actors reserve " + gib(cost.virtual_bytes) +
        " of address space, past this process's limit (ulimit -v) of " + gib(address_space_limit()));
  if (cost.seconds > budget.warn_seconds) std::fprintf(stderr, "hzp: note: %s.\n", what.c_str());
  return Status::Ok();
}

}  // namespace hzp::sim
