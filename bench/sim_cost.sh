#!/usr/bin/env bash
# What simulations cost to run against what hzp estimates before starting them (sim/cost.h): for each case,
# the estimated and measured wall seconds and resident memory (GNU time's maximum RSS) and their ratios.
# The estimate's constants (sim/cost.cc) come from runs of this script on the 2-core reference machine;
# sim/README.md ("What a simulation costs") has the table. One simulation at a time: run it on a quiet machine.
# Usage: bash bench/sim_cost.sh HZP_BINARY [quick]   (quick: the cases under ~10 s each)
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -uo pipefail
hzp=$(realpath "$1")
quick=${2:-}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
z3='{"model": {"preset": "llama2-7b"}, "cluster": {"preset": "a800", "nodes": 8},
     "training": {"global_batch_sequences": 64, "micro_batch": 1, "seq_len": 4096}, "policy": {"preset": "zero3"}}'
echo "$z3" > "$out/z3.json"
ecmp='{"routing": "ecmp", "rail_optimized": true, "placement": "scattered"}'
printf '%-58s %10s %10s %7s %9s %9s %7s\n' case est_s wall_s ratio est_GiB rss_GiB ratio
run() {  # NAME hzp-args...
  local name=$1
  shift
  /usr/bin/time -f "%e %M" -o "$out/time" "$hzp" "$@" > "$out/log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then echo "$name: exit $rc: $(tail -1 "$out/log")"; return; fi
  python3 - "$name" "$out/log" "$out/time" <<'PY'
import re, sys
name, log, timing = sys.argv[1:]
text = open(log).read()
m = re.search(r"estimated ([0-9.]+) s, ([0-9.]+) GiB", text)
wall, rss_kb = open(timing).read().split()[-2:]
est_s, est_gib = float(m.group(1)), float(m.group(2))
wall, rss = float(wall), float(rss_kb) / 1024 / 1024
print(f"{name:58s} {est_s:10.2f} {wall:10.2f} {est_s / max(wall, 0.01):7.2f} {est_gib:9.2f} {rss:9.2f} "
      f"{est_gib / rss:7.2f}")
PY
}
for nodes in 16 128 512; do
  run "zero3 7B, $((nodes * 8)) GPUs" simulate "$out/z3.json" --out "$out/s" --set cluster.nodes=$nodes \
    --set training.global_batch_sequences=$((nodes * 8))
done
run "asynchzp 7B, 1024 GPUs" simulate "$out/z3.json" --out "$out/s" --set cluster.nodes=128 \
  --set training.global_batch_sequences=1024 --set policy.preset=asynchzp
run "zero3 7B x 2 layers, ECMP scattered, 4096 GPUs" simulate "$out/z3.json" --out "$out/s" \
  --set cluster.nodes=512 --set training.global_batch_sequences=4096 --set model.layers=2 \
  --set "cluster.inter_node=$ecmp"
run "zero3 7B x 4096 layers, 16 GPUs, every GPU on the timeline" simulate "$out/z3.json" --out "$out/s" \
  --set cluster.nodes=2 --set training.global_batch_sequences=16 --set model.layers=4096
run "mixtral 8x7B EP8, 256 GPUs" simulate "$out/z3.json" --out "$out/s" --set cluster.nodes=32 \
  --set training.global_batch_sequences=256 --set model.preset=mixtral-8x7b --set policy.expert_parallel=8
echo "{\"preset\": \"dgx-h100\", \"nodes\": 512, \"inter_node\": $ecmp}" > "$out/ecmp512.json"
echo "{\"preset\": \"dgx-h100\", \"nodes\": 1024, \"inter_node\": $ecmp}" > "$out/ecmp1024.json"
run "all_reduce 1G, ECMP scattered, 512 nodes" collective --cluster "$out/ecmp512.json" --op all_reduce \
  --group all --bytes 1G
run "all_to_all 1G, 128 nodes" collective --cluster dgx-h100 --nodes 128 --op all_to_all --group all --bytes 1G
[ "$quick" = quick ] && exit 0
run "zero3 7B, 16384 GPUs" simulate "$out/z3.json" --out "$out/s" --set cluster.nodes=2048 \
  --set training.global_batch_sequences=16384
run "all_reduce 1G, ECMP scattered, 1024 nodes" collective --cluster "$out/ecmp1024.json" --op all_reduce \
  --group all --bytes 1G
run "all_to_all 1G, 256 nodes" collective --cluster dgx-h100 --nodes 256 --op all_to_all --group all --bytes 1G
