// The memory this process may take (memory_limits.h).
#include "shared/base/memory_limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>

namespace hzp {
namespace {

// cgroup v2's memory.max for this process's group, when there is one and it is a number.
double cgroup_limit() {
  std::ifstream in("/sys/fs/cgroup/memory.max");
  double v = 0;
  if (in >> v && v > 0) return v;
  return std::numeric_limits<double>::infinity();
}

double rlimit(int resource) {
  struct rlimit l {};
  if (getrlimit(resource, &l) != 0 || l.rlim_cur == RLIM_INFINITY) return std::numeric_limits<double>::infinity();
  return static_cast<double>(l.rlim_cur);
}

}  // namespace

double memory_allowance() {
  const double physical = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
  return std::min({0.75 * physical, cgroup_limit(), rlimit(RLIMIT_DATA), rlimit(RLIMIT_RSS)});
}

double address_space_limit() {
  return rlimit(RLIMIT_AS);
}

double address_space_mapped() {
  double pages = 0;
  if (std::ifstream statm("/proc/self/statm"); statm >> pages)
    return pages * static_cast<double>(sysconf(_SC_PAGESIZE));
  return 0;
}

double resident_bytes() {
  double pages = 0, resident = 0;
  if (std::ifstream statm("/proc/self/statm"); statm >> pages >> resident)
    return resident * static_cast<double>(sysconf(_SC_PAGESIZE));
  return 0;
}

}  // namespace hzp
