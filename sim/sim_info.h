// What the SimGrid executor is built against (the executor itself lands with the simulator issue).
#pragma once

#include <string>

namespace hzp::sim {

// e.g. "SimGrid 3.32.0".
std::string backend_description();

}  // namespace hzp::sim
