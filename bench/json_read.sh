#!/usr/bin/env bash
# How hzp's strict JSON reader scales: a trace whose events are N empty objects (refused after parsing, at its
# first event), read by `hzp replay` at N = 250k, 500k, 1M, 2M (the documented event limit). Prints seconds
# and peak memory per N and the time ratio of each doubling (linear: ~2). Before the reader stopped using
# nlohmann's callback parser, which rescans a container at every object end, 200k took 12.6 s and 50k 0.67 s.
# Usage: bash bench/json_read.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf "%10s %10s %10s %8s\n" events seconds "peak MB" ratio
prev=""
for n in 250000 500000 1000000 2000000; do
  python3 - "$n" "$tmp/t.json" <<'PY'
import json, sys
t = json.load(open("traces/tiny_dense_4ranks.json"))
t["events"] = [{}] * int(sys.argv[1])
open(sys.argv[2], "w").write(json.dumps(t))
PY
  /usr/bin/time -f "%e %M" -o "$tmp/time" "$hzp" replay "$tmp/t.json" --out "$tmp/o" > /dev/null 2>&1 || true
  read -r secs kb < <(tail -1 "$tmp/time")  # after "Command exited with non-zero status 2"
  ratio=$([ -n "$prev" ] && python3 -c "print(f'{$secs / max($prev, 0.01):.2f}')" || echo -)
  printf "%10d %10s %10d %8s\n" "$n" "$secs" $((kb / 1024)) "$ratio"
  prev=$secs
done
