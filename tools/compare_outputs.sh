#!/usr/bin/env bash
# Checks that a refactoring changed no output: runs two hzp binaries on every scenario under scenarios/ and
# compares what they print. Per scenario: `hzp validate` (the resolved form), `hzp schedule --rank all` (the
# whole IR: groups, pools, every program), `hzp plan` (every preset's analytic estimate); for the scenarios of
# at most 64 GPUs also `hzp simulate`'s summary.json (its wall-clock fields removed). Prints each difference
# and exits 1 if there is one.
# Usage: bash tools/compare_outputs.sh OLD_HZP NEW_HZP [SCENARIO...]   (default: every scenarios/**/*.json)
# e.g. build the commit before the change into build-old/, then
#      bash tools/compare_outputs.sh build-old/hzp build/hzp
case "${1:-}" in -h|--help | "") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
old=$(realpath "$1") new=$(realpath "$2")
shift 2
cd "$(dirname "$0")/.."
if [ $# -gt 0 ]; then scenarios=("$@"); else mapfile -t scenarios < <(find scenarios -name '*.json' | sort); fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
differ=0 compared=0
# One command's output from both binaries; stderr kept (errors must match too), wall-clock lines dropped.
compare() {
  local label=$1
  shift
  for side in old new; do
    local bin=$old
    [ "$side" = new ] && bin=$new
    (cd "$work" && "$bin" "$@" 2>&1 | grep -v -E 'wall|ops/s|estimated in') >"$work/$side.txt"
  done
  compared=$((compared + 1))
  if ! cmp -s "$work/old.txt" "$work/new.txt"; then
    echo "DIFFERS: $label"
    diff "$work/old.txt" "$work/new.txt" | head -20
    differ=$((differ + 1))
  fi
}
for s in "${scenarios[@]}"; do
  path=$(realpath "$s")
  grep -q '"scenario_config"\|"traceEvents"' "$path" && continue  # traces, not scenarios
  compare "validate $s" validate "$path"
  compare "schedule $s" schedule --rank all "$path"
  compare "plan $s" plan "$path"
  gpus=$(python3 -c 'import json,sys
d=json.load(open(sys.argv[1])); c=d.get("cluster",{})
print(int(c.get("nodes",1))*int(c.get("gpus_per_node",8)))' "$path" 2>/dev/null || echo 0)
  if [ "$gpus" -gt 0 ] && [ "$gpus" -le 64 ]; then
    for side in old new; do
      bin=$old
      [ "$side" = new ] && bin=$new
      (cd "$work" && "$bin" simulate "$path" --out "$work/sim-$side" >/dev/null 2>&1)
      python3 -c 'import json,sys
d=json.load(open(sys.argv[1]))
for k in list(d):
    if "wall" in k or k == "events_per_s" or k.startswith("sim_estimated"): del d[k]
print(json.dumps(d, indent=1, sort_keys=True))' "$work/sim-$side/summary.json" >"$work/sim-$side.txt" 2>&1
    done
    compared=$((compared + 1))
    if ! cmp -s "$work/sim-old.txt" "$work/sim-new.txt"; then
      echo "DIFFERS: simulate $s"
      diff "$work/sim-old.txt" "$work/sim-new.txt" | head -20
      differ=$((differ + 1))
    fi
  fi
done
echo "$compared outputs compared, $differ differ"
[ "$differ" -eq 0 ]
