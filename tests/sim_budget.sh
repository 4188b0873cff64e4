#!/usr/bin/env bash
# Every simulation estimates what it will cost to run before it starts (sim/cost.h) and is refused past its
# budget, with the estimate and the flag that raises it (issue 35, item 12): the runaways of the attack — an
# all-to-all over 8192 nodes (67 M flows), 262,144 GPUs, a timeline of 4096 layers — end at once with exit 2, not after minutes or an
# out-of-memory kill; a small simulation under a tiny budget is refused, and runs with the budget lifted.
# Usage: bash tests/sim_budget.sh HZP_BINARY
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -uo pipefail
hzp=$1
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat > "$out/z3.json" <<'JSON'
{"model": {"preset": "llama2-7b"}, "cluster": {"preset": "a800", "nodes": 2},
 "training": {"global_batch_sequences": 16, "micro_batch": 1, "seq_len": 4096}, "policy": {"preset": "zero3"}}
JSON
failures=0
expect() {  # WANT_RC PATTERN SECONDS DESCRIPTION COMMAND...
  local want=$1 pattern=$2 seconds=$3 what=$4
  shift 4
  timeout "$seconds" "$@" > "$out/log" 2>&1
  local rc=$?
  if [ $rc -ne "$want" ] || ! grep -q -- "$pattern" "$out/log"; then
    echo "FAIL: $what: exit $rc (want $want, output with \"$pattern\"): $(tail -2 "$out/log")"
    failures=$((failures + 1))
  fi
}
# (From its 67 M node pairs, counted before its platform is built: the build and a flow dry run took 16 s and
# 420 MB.)
expect 2 "at least 67.1M flows, up to 67.1M at once, counted before the platform is built" 120 \
  "all_to_all over 8192 nodes" "$hzp" collective --cluster dgx-h100 --nodes 8192 --op all_to_all --group all --bytes 1G
echo '{"preset": "dgx-h100", "nodes": 8192, "inter_node": {"leaf_size": 16, "routing": "ecmp",
      "rail_optimized": true, "placement": "scattered"}}' > "$out/ecmp8192.json"
expect 2 "--max-sim-seconds raises it" 30 "all_reduce over 8192 ECMP nodes, refused before its platform (25 min)" \
  "$hzp" collective --cluster "$out/ecmp8192.json" --op all_reduce --group all --bytes 1G
# Platforms whose build is the cost, refused before it starts (each took 30 s to minutes to refuse, or ran):
# 64-GPU full-mesh nodes (2 M pair links), and 1024 ECMP leaves of one node (a zone each, SimGrid checking
# every new host and link against every zone).
echo '{"preset": "dgx-a100", "gpus_per_node": 64, "intra_node": {"topology": "full_mesh"}}' > "$out/mesh64.json"
expect 2 "before its flows are counted" 10 "1024 nodes of 64-GPU full mesh, refused before its platform" \
  "$hzp" collective --cluster "$out/mesh64.json" --nodes 1024 --op broadcast --group all --bytes 1G --max-sim-seconds 30
echo '{"preset": "dgx-h100", "inter_node": {"routing": "ecmp", "leaf_size": 1, "qps_per_connection": 64}}' \
  > "$out/ecmp_leaf1.json"
expect 2 "before its flows are counted" 10 "1024 one-node ECMP leaves, refused before its platform" \
  "$hzp" collective --cluster "$out/ecmp_leaf1.json" --nodes 1024 --op all_reduce --group all --bytes 1G \
  --max-sim-seconds 30
# A platform built, then refused on its flows: the build (seconds) is announced first, not silent.
echo '{"preset": "dgx-h100", "inter_node": {"routing": "ecmp", "leaf_size": 2, "oversubscription": 4,
      "qps_per_connection": 16}}' > "$out/ecmp_os.json"
expect 2 "^sim: building the platform (50.2k hosts in 514 zones), about" 180 \
  "1024 oversubscribed ECMP nodes: the platform build announced" \
  "$hzp" collective --cluster "$out/ecmp_os.json" --nodes 1024 --op broadcast --group all --bytes 1G --algorithm ring \
  --max-sim-seconds 30
grep -q "past the budget of 30 s" "$out/log" || { echo "FAIL: ecmp_os: no refusal: $(tail -2 "$out/log")"; failures=$((failures + 1)); }
expect 2 "--max-sim-seconds raises it" 30 "262,144 GPUs, refused before the platform is built" \
  "$hzp" simulate "$out/z3.json" --out "$out/s" --set cluster.nodes=32768 \
  --set training.global_batch_sequences=262144 --set model.layers=2 --max-sim-seconds 60
# 131,072 GPUs: refused on the flows its groups' nodes need at least, before a 40 s platform build.
expect 2 "at least 1.7M flows, counted before the platform is built" 120 "131,072 GPUs, refused before the platform" \
  "$hzp" simulate "$out/z3.json" --out "$out/s" --set cluster.nodes=16384 \
  --set training.global_batch_sequences=131072 --max-sim-seconds 30
expect 2 "past the budget of" 60 "a small simulation under a tiny time budget" \
  "$hzp" simulate "$out/z3.json" --out "$out/s" --max-sim-seconds 0.0001
expect 2 "of --max-sim-GiB" 60 "a small simulation under a tiny memory budget" \
  "$hzp" simulate "$out/z3.json" --out "$out/s" --max-sim-GiB 0.01
# The timeline counts: 4096 layers on all 16 GPUs record ~650 k spans (~0.8 GB with their JSON), fewer GPUs
# recorded fit the same budget (4096 layers once took 3.8 GB and died of bad_alloc writing the timeline).
expect 2 "of --max-sim-GiB" 60 "a timeline of 650 k spans under 0.5 GiB" \
  "$hzp" simulate "$out/z3.json" --out "$out/s" --set model.layers=4096 --max-sim-GiB 0.5
expect 0 "estimated" 120 "the same with one GPU recorded" \
  "$hzp" simulate "$out/z3.json" --out "$out/s" --set model.layers=4096 --max-sim-GiB 0.5 --timeline-ranks 1
expect 0 "estimated" 120 "the same simulation with no time limit" \
  "$hzp" simulate "$out/z3.json" --out "$out/s" --max-sim-seconds 0
expect 2 "max-sim-seconds" 10 "a negative budget" "$hzp" simulate "$out/z3.json" --max-sim-seconds -1
expect 2 "past the budget of" 60 "collective under a tiny time budget" \
  "$hzp" collective --cluster dgx-h100 --nodes 4 --op all_reduce --group all --bytes 1G --max-sim-seconds 0.0000001
expect 2 "past the budget of" 60 "replay under a tiny time budget" \
  "$hzp" replay "$root/traces/tiny_dense_4ranks.json" --max-sim-seconds 0.0000001 --out "$out/r"
# Under an address-space limit, the actors' reserved stacks (256 KiB each) count: refused, not killed. (Not
# under AddressSanitizer, whose shadow memory alone is terabytes of address space.)
# (grep reads all of ldd's output: with -q it exits at the first match, ldd dies of SIGPIPE, and under
# pipefail the pipeline failed, so the cases ran under ASan now and then.)
asan=$(ldd "$hzp" 2>/dev/null | grep -c libasan)
if [ "${asan:-0}" -eq 0 ]; then
  expect 2 "ulimit -v" 60 "16,384 GPUs under ulimit -v 4 GiB, every rank simulated" \
    bash -c "ulimit -v 4194304 && exec \"\$0\" \"\$@\"" "$hzp" simulate "$out/z3.json" --out "$out/s" \
    --set cluster.nodes=2048 --set training.global_batch_sequences=16384 --exact
  # JSON documents too: a trace of 6 M tiny members decodes into ~580 MB, refused before parsing under a
  # tight address space (it died of std::bad_alloc at 256 MiB under ulimit -v 2000000).
  python3 - "$root/traces/tiny_dense_4ranks.json" "$out/members.json" <<'PY'
import json, sys
text = json.dumps(json.load(open(sys.argv[1])))
with open(sys.argv[2], "w") as f:
    f.write(text[:-1] + ', "x": {' + "".join('"%x":0,' % i for i in range(6_000_000)) + '"end":0}}')
PY
  # The limit is the address space hzp maps before reading anything (a CUDA build maps cuBLAS and NCCL,
  # hundreds of MB) plus 700 MB: half of what is left is less than the tree.
  (sleep 2; echo '{}') | "$hzp" validate - > /dev/null 2>&1 &
  sleep 1
  base_kb=$(awk '/^VmSize/ {print $2}' "/proc/$(pgrep -n -f "$hzp validate -")/status" 2>/dev/null || echo 1000000)
  wait
  limit_kb=$((base_kb + 700000))
  expect 2 "can spare under its memory limits" 60 "a trace of 6 M members under ulimit -v of hzp's own + 700 MB" \
    bash -c "ulimit -v $limit_kb && exec \"\$0\" \"\$@\"" "$hzp" replay "$out/members.json" --out "$out/r"
fi
[ $failures -eq 0 ] && echo "ok: runaway simulations refused with their estimate; budgets lift"
exit $((failures > 0))
