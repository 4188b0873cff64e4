// Which runtime backends this build has (the executors land with the runtime issue).
#pragma once

#include <string>

namespace hzp::runtime {

// e.g. "cpu (Gloo), cuda (not built)" or "cpu (Gloo), cuda (NCCL 2.28.3; no usable GPU: ...)".
std::string backend_description();

}  // namespace hzp::runtime
