// Symmetric simulation (issue 36): ranks that run the same program are simulated once.
//
// A schedule's ranks with one program (Schedule::rank_program) execute the same ops with the same compute
// times; what can set them apart is only when their collectives finish. The symmetric executor runs one
// actor set per program — its representative, the program's first rank — and lets every other rank follow
// its representative's timeline. Collectives keep the network exact: the groups of one role whose members
// run the same programs (a *group class*: role and multiset of programs) do their n-th collective together
// in a symmetric schedule, so when the representatives of the class's programs have all arrived at their
// n-th collective of the role, the flows of every group of the class start, and the representatives leave
// when the last of those groups finishes (the slowest group gates everyone, as a synchronous job's next
// collective would). Flows, links and contention are what the full simulation has; the ops executed by
// actors drop from ranks x ops to programs x ops.
//
// It applies when nothing is per rank: no compute spread, no recorded durations or collective times (a
// replay), no ECMP routing (each group's flows hash onto their own paths: an interleaved pipeline on ECMP
// came out 3.8 % slower symmetric), and every role's groups that hold a program's ranks are of one class (else a
// representative could wait for a collective its class never starts). `hzp simulate --exact` runs every rank.
#pragma once

#include <string>
#include <vector>

#include "shared/ir/schedule.h"

namespace hzp::sim {

struct SymmetryPlan {
  bool enabled = false;
  std::string why_not;                         // when not enabled: what is per rank
  std::vector<int> rep_of;                     // rank -> its representative (the program's first rank)
  std::vector<int> ranks_of_program;           // program -> ranks that run it
  std::vector<int> group_class;                // group -> its class (-1: a group of one rank)
  std::vector<std::vector<int>> class_groups;  // class -> its groups
  std::vector<int> class_arrivals;             // class -> representatives that take part (its programs)
};

// The classes of `schedule`; `enabled` false (with why_not) when a role's groups holding one program's
// ranks are of more than one class.
SymmetryPlan plan_symmetry(const Schedule& schedule);

}  // namespace hzp::sim
