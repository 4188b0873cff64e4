// Flow-level collectives: one interface, one algorithm per file (sim/collectives/*.cc), one registry.
//
// A collective is simulated as a few phases; each phase is one SimGrid flow per participant (per channel),
// never one comm per ring step: a ring all-gather over p ranks is p concurrent flows of (p-1)/p·S plus
// (p-1) latency terms. Links carry no latency; each algorithm adds its α terms explicitly (as NCCL's cost
// model does), so that with nothing else on the links the simulated time equals the closed form of
// shared/cost/collective_cost.h. Concurrent collectives share links through SimGrid's max-min sharing.
#pragma once

#include "shared/cost/collective_cost.h"
#include "shared/ir/schedule.h"
#include "sim/platform.h"

namespace hzp::sim {

// An actor starts at most this many flows of a phase; pooled actors start the rest at the same simulated
// instant (sim/collectives/flows.cc, run_flows). SimGrid 3.32 scans an actor's own flows in flight each time
// one of them finishes.
constexpr int kFlowsPerActor = 64;

// Flows a dry run of a collective (CollectiveCall::tally) would have started.
struct FlowTally {
  double flows = 0;  // in all phases
  double peak = 0;   // in its largest phase (all of a phase's flows are in flight at once)
  // Sum over phases of (flows of the kind) x (flows of the phase), for the phases whose flows share links
  // (a pairwise exchange's): SimGrid's solver re-solves the flows linked to each finished one. ECMP-hashed
  // flows (between leaves under ECMP routing) cross more links each and collide, and cost the solver far
  // more per pair than the others (sim/README.md, "What a simulation costs").
  double pair_work = 0;
  double ecmp_pair_work = 0;
};

struct CollectiveCall {
  CollectiveKind kind = CollectiveKind::kAllReduce;
  double bytes = 0;                     // nccl-tests size convention (collective_cost.h)
  const ProcessGroup* group = nullptr;  // members in ring order
  CollectiveAlgorithm algorithm = CollectiveAlgorithm::kRing;
  NcclProtocol protocol = NcclProtocol::kSimple;  // choose_protocol's pick for the algorithm
  int root = -1;  // broadcast: the sending member's index in group->ranks (-1: the first in physical order)
  // When set, a dry run: each phase's flows are counted here instead of started, no simulated time passes,
  // and no SimGrid call is made (sim/cost.h estimates a simulation's cost from these counts).
  FlowTally* tally = nullptr;
};

// Bytes put on the wire, by link class.
struct CollectiveTraffic {
  double intra_node_bytes = 0;
  double inter_node_bytes = 0;
};

// Runs the collective from the calling SimGrid actor: starts the flows of each phase, waits for them,
// sleeps the latency terms, and returns when the collective is complete (simulated time has advanced).
// `call.algorithm` must apply to the group (algorithm_applies). The protocol sets the α terms and the
// bandwidth fraction: its flows carry bytes / bandwidth_factor (LL's flags, LL128's flag words).
CollectiveTraffic run_collective(const Platform& platform, const CollectiveCall& call);

}  // namespace hzp::sim
