#!/usr/bin/env bash
# hzp simulate's shortcuts — the symmetric simulation (sim/symmetry.h: one rank per program, the flows of the
# groups that share a link with one of its groups) and the counted steady state (sim/steady_state.h: two
# shorter runs, extrapolated) — against the full simulation (--exact) on the same scenarios, in the same run:
# step time, peak memory, traffic per GPU, wall seconds of each and the speed-up. Exit 1 when a step time
# differs by more than 1 %, memory or traffic by more than 1e-9 relative, or collectives at all
# (CHECK_ONLY=1: no table, only failures; what tests/CMakeLists.txt runs in CI; STEADY=1: also a failure
# when the steady state was not counted).
# Usage: bash bench/sim_symmetry.sh HZP_BINARY SCENARIO.json [SCENARIO.json ...] [-- --set PATH=VALUE ...]
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -uo pipefail
hzp=$(realpath "$1")
shift
scenarios=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do scenarios+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
extra=("$@")
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failures=0
[ -z "${CHECK_ONLY:-}" ] && printf '| %-44s | %10s | %10s | %8s | %8s | %7s | %s\n' scenario "step s" "exact s" "wall s" "exact s" "speed-up" "check"
for s in "${scenarios[@]}"; do
  name=$(basename "$s" .json)
  for mode in sym exact; do
    flag=()
    [ "$mode" = exact ] && flag=(--exact)
    if ! "$hzp" simulate "$s" --out "$out/$mode" --timeline-ranks 1 "${flag[@]}" "${extra[@]}" > "$out/$mode.log" 2>&1; then
      echo "FAIL: $name ($mode): $(tail -1 "$out/$mode.log")"
      failures=$((failures + 1))
      continue 2
    fi
  done
  python3 - "$name" "$out/sym/summary.json" "$out/exact/summary.json" <<'PY' || failures=$((failures + 1))
import json, os, sys
name, a, b = sys.argv[1], json.load(open(sys.argv[2])), json.load(open(sys.argv[3]))
problems = []
step = abs(a["step_time_s"] - b["step_time_s"]) / b["step_time_s"]
if step > 0.01:
    problems.append(f"step {a['step_time_s']:.6g} s vs {b['step_time_s']:.6g} s ({100 * step:.2f} %)")
for key, x, y in [("peak memory", a["peak_memory_bytes"], b["peak_memory_bytes"]),
                  ("intra-node bytes", a["comm_bytes"]["intra_node_per_gpu"], b["comm_bytes"]["intra_node_per_gpu"]),
                  ("inter-node bytes", a["comm_bytes"]["inter_node_per_gpu"], b["comm_bytes"]["inter_node_per_gpu"]),
                  ("collectives", a["collectives"], b["collectives"])]:
    if abs(x - y) > 1e-9 * max(abs(y), 1):
        problems.append(f"{key} {x} vs {y}")
if os.environ.get("STEADY") and a.get("steady_state") is None:
    problems.append("the steady state was not counted")
check = "ok" if not problems else "FAIL: " + "; ".join(problems)
if not os.environ.get("CHECK_ONLY") or problems:
    mark = ("" if a["symmetric"] else " (not symmetric)") + (" (steady)" if a.get("steady_state") else "")
    print(f"| {name + mark:44s} | {a['step_time_s']:10.4f} | {b['step_time_s']:10.4f} | {a['sim_wall_s']:8.2f} | "
          f"{b['sim_wall_s']:8.2f} | {b['sim_wall_s'] / max(a['sim_wall_s'], 1e-3):7.1f}x | {check}")
sys.exit(1 if problems else 0)
PY
done
exit $((failures > 0))
