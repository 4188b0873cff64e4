#!/usr/bin/env bash
# Builds what bench/gpu/check.sh runs and packs it for a GPU machine that has no build tools: hzp,
# hzp_kernel_tests and attention_bench with every shared library they need except glibc, the C++ runtime, CUDA and NCCL, into .gpu/
# (git-ignored), by the team's device-bundle script. Then carry .gpu to the GPU machine and run there, from the
# repository root: source .gpu/env.sh && bash bench/gpu/check.sh
#
#   bash bench/gpu/prepare.sh [DEVICE_BUNDLE_SCRIPT]   (default: ../shared/tools/device-bundle.sh)
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/../.."
bundle=${1:-../shared/tools/device-bundle.sh}
[[ -f $bundle ]] || { echo "prepare: no bundle script at $bundle" >&2; exit 2; }
cmake -S . -B build -DHZP_CUDA=ON > /dev/null
cmake --build build -j2 --target hzp hzp_kernel_tests attention_bench
bash "$bundle" .gpu build/hzp build/tests/hzp_kernel_tests build/attention_bench
