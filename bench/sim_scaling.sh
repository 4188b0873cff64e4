#!/usr/bin/env bash
# Simulator cost vs cluster size: llama2-7b, ZeRO-3, seq 4096, one micro-batch per GPU, one step, on
# 64 .. 8192 A800 GPUs (and a 16-layer variant at 1024 GPUs to see the cost per layer). Each simulation runs
# in its own process (one SimGrid engine per process). Prints a markdown table.
# Usage: bash bench/sim_scaling.sh [HZP_BINARY] [GPU counts...]
# INTER_NODE='{"routing": "ecmp", "placement": "scattered"}' sets cluster.inter_node of every scenario (what
# ECMP's per-uplink endpoints and per-channel flows cost).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
hzp="${1:-build/hzp}"
shift || true
counts=("$@")
((${#counts[@]})) || counts=(64 256 1024 4096 8192)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

run() {  # gpus layers
  local gpus=$1 layers=$2 nodes=$(($1 / 8))
  local file="$work/s-$gpus-$layers.json" fabric=""
  [[ -n "${INTER_NODE:-}" ]] && fabric=", \"inter_node\": $INTER_NODE"
  cat >"$file" <<JSON
{"name": "bench-$gpus-$layers", "model": {"preset": "llama2-7b", "layers": $layers},
 "cluster": {"preset": "a800", "nodes": $nodes$fabric},
 "training": {"seq_len": 4096, "micro_batch": 1, "global_batch_sequences": $gpus},
 "policy": {"preset": "zero3"}}
JSON
  "$hzp" simulate "$file" --out "$work/out-$gpus-$layers" >/dev/null 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  python3 - "$work/out-$gpus-$layers/summary.json" "$gpus" "$layers" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"| {sys.argv[2]:>5} | {sys.argv[3]:>6} | {s['ops_executed']:>10,} | {s['collectives']:>8,} | {s['sim_wall_s']:8.2f} | "
      f"{s['events_per_s']:>10,.0f} | {s['step_time_s']:8.3f} | {100*s['mfu']:5.1f} |")
PY
}

echo "| GPUs | layers | ops executed | collectives | wall s | ops/s | step s | MFU % |"
echo "|-----:|-------:|-------------:|------------:|-------:|------:|-------:|------:|"
for n in "${counts[@]}"; do run "$n" 32; done
run 1024 16
