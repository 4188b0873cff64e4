// Symmetric simulation (issue 36): ranks that run the same program are simulated once.
//
// A schedule's ranks with one program (Schedule::rank_program) execute the same ops with the same compute
// times; what can set them apart is only when their collectives finish. The symmetric executor runs one
// actor set per program — its representative, the program's first rank — and lets every other rank follow
// its representative's timeline. Collectives keep the network exact: the groups of one role whose members
// run the same programs (a *group class*: role and multiset of programs) do their n-th collective together
// in a symmetric schedule, so when the representatives of the class's programs have all arrived at their
// n-th collective of the role, the flows of the class's groups start, and the representatives leave when
// the last of those groups finishes (the slowest group gates everyone, as a synchronous job's next
// collective would). Only the groups that may share a link with a representative's run flows
// (choose_simulated_groups); the others' traffic is counted. The ops executed by actors drop from
// ranks x ops to programs x ops, the flows to those of the groups around the representatives.
//
// It applies when nothing is per rank: no compute spread, no recorded durations or collective times (a
// replay), no ECMP routing (each group's flows hash onto their own paths: an interleaved pipeline on ECMP
// came out 3.8 % slower symmetric), and every role's groups that hold a program's ranks are of one class (else a
// representative could wait for a collective its class never starts). `hzp simulate --exact` runs every rank.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "shared/ir/schedule.h"
#include "sim/platform.h"

namespace hzp::sim {

struct SymmetryPlan {
  bool enabled = false;
  std::string why_not;                         // when not enabled: what is per rank
  std::vector<int> rep_of;                     // rank -> its representative (the program's first rank)
  std::vector<int> ranks_of_program;           // program -> ranks that run it
  std::vector<int> group_class;                // group -> its class (-1: a group of one rank)
  std::vector<std::vector<int>> class_groups;  // class -> its groups
  std::vector<int> class_arrivals;             // class -> representatives that take part (its programs)
  // class -> the groups whose flows run, each with how many of the class's groups it stands for (itself
  // included); choose_simulated_groups fills it
  std::vector<std::vector<std::pair<int, int>>> simulated;
};

// The classes of `schedule`; `enabled` false (with why_not) when a role's groups holding one program's
// ranks are of more than one class.
SymmetryPlan plan_symmetry(const Schedule& schedule);

// Which groups of each class run their flows (SymmetryPlan::simulated). A group runs when it holds a
// representative, or when it may share a link with one that does: one of the ports its members own (an
// NVLink port, a NIC) is also a representative group's. Any other group's flows cross only links that no
// representative's flow crosses, so they cannot change when a representative's collective ends; in a
// symmetric schedule they carry what a running group of their class and layout carries, and their traffic
// is counted as that group's. A leaf uplink of an oversubscribed fabric is shared by every group crossing
// it: there every group that leaves its node runs. Intra-node groups on nodes without a representative, and
// on a rail-optimized fabric the rails no representative group uses, are what is left out.
void choose_simulated_groups(const Schedule& schedule, const Platform& platform, SymmetryPlan& plan);

}  // namespace hzp::sim
