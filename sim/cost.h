// What a simulation will cost to run — wall time and memory on the machine running it — estimated before it
// starts from what the schedule and the platform make exact (ops, actors, hosts, links) and from a dry run
// of every collective's flows (CollectiveCall::tally), and checked against a budget: a simulation past it is
// refused with the estimate and the flag that raises it, instead of running for hours or until the machine
// runs out of memory (issue 35, item 12). The constants, how they were measured and how close the estimate
// comes are in sim/README.md, "What a simulation costs"; bench/sim_cost.sh measures them again.
#pragma once

#include <string>

#include "shared/base/memory_limits.h"
#include "shared/base/status.h"
#include "shared/scenario/scenario.h"

namespace hzp::sim {

struct SimCost {
  double ops = 0;           // ops executed, every rank, every step
  double recorded_ops = 0;  // of which the timeline records (spans, then timeline.json)
  double actors = 0;        // SimGrid actors: one per (rank, stream with ops)
  double hosts = 0;         // platform hosts and links (SimGrid's own objects)
  double links = 0;
  double collectives = 0;       // collective instances simulated with flows
  double flows = 0;             // flows started
  double peak_flows = 0;        // flows in flight at once, at most (every group of a role at once)
  double platform_hosts = 0;    // GPUs, NICs and node bundles, each checked against every zone (zones)
  double zones = 0;             // SimGrid zones of the platform: its leaves and GPU zones
  double ecmp_ports = 0;        // and ECMP's ports (cubic)
  double mesh_links = 0;        // full-mesh nodes' pair links, each checked against every zone too
  double pair_work = 0;         // the max-min solver's work (collective.h FlowTally), plain flows
  double ecmp_pair_work = 0;    // and ECMP-hashed ones
  bool flows_at_least = false;  // the flows are a lower bound, counted before the platform is built
  // What the process held before the engine (read by the first estimate_cost, kept for the later ones, which
  // come after the platform is built and must not count it twice): resident bytes and address space.
  double base_resident_bytes = 0;
  double base_mapped_bytes = 0;
  // The estimates (estimate_cost): wall seconds, resident bytes, and address space reserved (actor stacks).
  double seconds = 0;
  double resident_bytes = 0;
  double virtual_bytes = 0;
};

// Fills the estimates from the counts.
void estimate_cost(SimCost& cost);

// What is known of a simulation's cost before its platform is built (SimGrid's platform build is itself
// quadratic in the hosts: 8192 nodes of 8 GPUs take ~12 s): ops and actors `schedule_cost` gives, the
// platform's hosts and links from the cluster's shape (ECMP's ports too: a leaf zone's hosts are built in time
// cubic in their number, 4096 nodes of 8 NICs x 16 uplinks take ~3 min), no flows yet.
void add_platform_estimate(SimCost& cost, const ClusterSpec& cluster);

// Seconds of the estimate that build the platform (SimGrid's hosts, zones, links and routes).
double platform_seconds(const SimCost& cost);

// A line on stderr before a platform whose build is estimated past kAnnouncedBuildSeconds: a simulation of
// 131,072 GPUs spent ~35 s there before its first line (or before a refusal on its flows) otherwise.
inline constexpr double kAnnouncedBuildSeconds = 5;
void announce_platform_build(const SimCost& cost);

struct SimBudget {
  double max_seconds = 600;  // --max-sim-seconds; 0: no limit
  double max_bytes = 0;      // --max-sim-GiB; 0: what this machine allows (memory_allowance())
  double warn_seconds = 60;  // a line on stderr past this
};

// The memory a simulation may take by default is memory_allowance() (shared/base/memory_limits.h).

// One line: "about 2.1 min and 3.4 GiB (1,933,312 ops, 102 collectives, 4,096 flows at most in flight)".
std::string describe(const SimCost& cost);

// kInvalidInput when the estimate is past the budget (or the address space RLIMIT_AS leaves): what it
// would cost, the budget, and the flag that raises it. Prints a warning line on stderr when the estimate
// is past budget.warn_seconds but within budget.
Status check_budget(const SimCost& cost, const SimBudget& budget);

}  // namespace hzp::sim
