#!/usr/bin/env bash
# Installs the Debian packages hzp needs (only when some are missing: quick when all are present), then
# configures and builds into build/. Usage: bash tools/setup.sh   (env BUILD_DIR, CMAKE_ARGS to override)
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  cmake g++ make pkg-config          # toolchain
  nlohmann-json3-dev catch2          # scenario JSON, tests
  zlib1g-dev                         # gzipped PyTorch profiler traces (hzp import)
  libsimgrid-dev                     # sim/ executor
  libgloo-dev libboost-dev           # runtime/: Gloo collectives, Boost.Asio store
  libopenblas-dev                    # runtime/: host matmuls
  python3-matplotlib                 # tools/sweep.py plots (run with /usr/bin/python3)
  pybind11-dev python3-dev           # python/: the hzp Python module (HZP_BUILD_PYTHON)
  python3-pytest                     # its tests (tests/python)
  python3-torch                      # runtime reference: tests/torch_compare, bench/runtime_vs_torch.sh
  clang-format-14                    # tools/check_format.sh (a test)
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

build_dir="${BUILD_DIR:-build}"
# shellcheck disable=SC2086
cmake -S . -B "$build_dir" ${CMAKE_ARGS:-}
cmake --build "$build_dir" -j2
