#!/usr/bin/env bash
# Planner cost at 1024 GPUs: `hzp plan --search` on LLaMA-2 7B over 128 x 8 A800 (AMSP's cluster, seq 4096,
# micro-batch 1, 4M-token batch). Prints the planner's own summary lines: the analytic ranking time of the
# whole search space and the wall time of simulating the top K plus the presets in SimGrid.
# Usage: bash bench/planner.sh [HZP_BINARY] [TOP_K]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
hzp="${1:-build/hzp}"
top="${2:-8}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/s.json" <<JSON
{"name": "planner-1024", "model": {"preset": "llama2-7b"}, "cluster": {"preset": "a800", "nodes": 128},
 "training": {"seq_len": 4096, "micro_batch": 1, "global_batch_tokens": 4194304}, "policy": {"preset": "zero3"}}
JSON
"$hzp" plan "$work/s.json" --search --top "$top" --out "$work/plan" 2>/dev/null
