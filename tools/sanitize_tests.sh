#!/usr/bin/env bash
# Builds hzp with AddressSanitizer + UndefinedBehaviorSanitizer (-DHZP_SANITIZE=ON, into build-asan/) and runs
# the fast tests under them: any report fails the test that triggered it. Left out: the slow end-to-end runs
# (learning curves, equivalence, the planner's 64-GPU sweep, fuzzing, the fidelity rows, PyTorch comparisons), and the one test
# that parses hzp collective's combined output, which ASan's warning about SimGrid's actor stacks disturbs.
# Leaks inside third-party libraries are suppressed by tools/lsan.supp, each with its reason.
# Usage: bash tools/sanitize_tests.sh   (after tools/setup.sh has installed the packages; ~12 min on 2 cores)
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DHZP_SANITIZE=ON -DHZP_CUDA=OFF >/dev/null
cmake --build build-asan -j2
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
export LSAN_OPTIONS="suppressions=$PWD/tools/lsan.supp"  # third-party leaks only, each with its reason
ctest --test-dir build-asan --output-on-failure -j2 \
  -E 'learns|equivalence|fuzz|fidelity|torch_compare|sweep_smoke|torchrun|planner pick|8192|hzp collective prints'
