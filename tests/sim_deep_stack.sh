#!/usr/bin/env bash
# SimGrid's solver recurses as deep as the set of links and flows a collective couples, which grows with the
# cluster: under ECMP routing an all-reduce over 8192 nodes overflowed the 8 MiB main-thread stack (issue 35,
# item 11). Every simulation runs on a thread with a stack of its own (sim/platform.h), so the shell's stack
# limit does not matter: with `ulimit -s 256` (which crashed 512 nodes before) a 512-node ECMP all-reduce and
# a 512-node ECMP training step must finish and print their results.
# Usage: bash tests/sim_deep_stack.sh HZP_BINARY
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -uo pipefail
hzp=$1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cluster='{"preset": "dgx-h100", "nodes": 512,
          "inter_node": {"routing": "ecmp", "rail_optimized": true, "placement": "scattered"}}'
echo "$cluster" > "$out/cluster.json"
cat > "$out/scenario.json" <<JSON
{"model": {"preset": "llama2-7b", "layers": 2}, "cluster": $cluster,
 "training": {"global_batch_sequences": 4096, "micro_batch": 1, "seq_len": 4096}, "policy": {"preset": "ddp"}}
JSON
failures=0
(ulimit -s 256 && "$hzp" collective --cluster "$out/cluster.json" --op all_reduce --group all --bytes 1G) \
  > "$out/collective.log" 2>&1
rc=$?
if [ $rc -ne 0 ] || ! grep -q "Avg bus bandwidth" "$out/collective.log"; then
  echo "FAIL: collective under a 256 KiB stack limit: exit $rc: $(tail -2 "$out/collective.log")"
  failures=$((failures + 1))
fi
(ulimit -s 256 && "$hzp" simulate "$out/scenario.json" --out "$out/sim") > "$out/simulate.log" 2>&1
rc=$?
if [ $rc -ne 0 ] || [ ! -s "$out/sim/summary.json" ]; then
  echo "FAIL: simulate under a 256 KiB stack limit: exit $rc: $(tail -2 "$out/simulate.log")"
  failures=$((failures + 1))
fi
[ $failures -eq 0 ] && echo "ok: 512-node ECMP collective and simulation under a 256 KiB stack limit"
exit $((failures > 0))
