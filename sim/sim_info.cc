// SimGrid version reporting for `hzp --version`.
#include "sim/sim_info.h"

// xbt/base.h first: simgrid/version.h uses SG_BEGIN_DECL / XBT_PUBLIC without including it.
#include <xbt/base.h>

#include <simgrid/version.h>

namespace hzp::sim {

std::string backend_description() {
  return "SimGrid " + std::to_string(SIMGRID_VERSION_MAJOR) + "." + std::to_string(SIMGRID_VERSION_MINOR) + "." +
         std::to_string(SIMGRID_VERSION_PATCH);
}

}  // namespace hzp::sim
