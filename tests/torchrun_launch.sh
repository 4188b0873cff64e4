#!/usr/bin/env bash
# The torchrun launch that runtime/README.md documents, run for real: Debian's torchrun (torch 1.13) starts
# two `hzp train` ranks; MASTER_ADDR is torchrun's "localhost" (a host name). Exit 77 (skipped) where
# torchrun is not installed.
# Usage: bash tests/torchrun_launch.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
if ! command -v torchrun >/dev/null; then
  echo "skipped: torchrun not installed (Debian: python3-torch)"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
port=$((20000 + $$ % 20000))
# Debian's torch 1.13 under Python 3.11 needs --redirects/--tee of 1 (its default 0 crashes), and takes
# underscores (--nproc_per_node), not the hyphens of newer releases.
HZP_STORE_TOKEN=$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n') HZP_STORE_PORT=$port \
  timeout 300 torchrun --standalone --nproc_per_node 2 --redirects 1 --tee 1 --no_python \
  "$hzp" train scenarios/runtime/tiny_dense.json --steps 3 --threads 1 --timeout-s 30 \
  --data tests/data/tinyshakespeare_200k.txt --out "$out/o" > "$out/log" 2>&1 || { cat "$out/log"; exit 1; }
grep -q "hzp train: done: 3 steps" "$out/log" || { cat "$out/log"; echo "FAIL: no summary line"; exit 1; }
[ "$(grep -c '"loss"' "$out/o/metrics.jsonl")" = 3 ] || { echo "FAIL: metrics.jsonl lacks 3 steps"; exit 1; }
echo "1 passed, 0 failed"
