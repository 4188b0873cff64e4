// What memory this process may take, from the machine and its limits: what budgets (a simulation's, a
// JSON document's decoded tree) are checked against before the allocation that would fail.
#pragma once

namespace hzp {

// 3/4 of physical memory, or less where a cgroup v2 memory.max, RLIMIT_DATA or RLIMIT_RSS says so (bytes).
double memory_allowance();

// RLIMIT_AS (ulimit -v), or infinity without one (bytes).
double address_space_limit();

// Address space this process already maps (/proc/self/statm; 0 when unreadable), in bytes.
double address_space_mapped();

// Memory this process already holds resident (/proc/self/statm's second field; 0 when unreadable), in bytes.
double resident_bytes();

}  // namespace hzp
