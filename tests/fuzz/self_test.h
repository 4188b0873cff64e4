// The harness's test of itself: the sandbox's verdict on bodies that pass, fail, crash, hang, exit and
// exhaust memory on purpose. Returns the exit code (0: every outcome as expected).
#pragma once

#include <string>

namespace hzp::fuzz {

int run_self_test(const std::string& work_dir);

}  // namespace hzp::fuzz
