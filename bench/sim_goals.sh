#!/usr/bin/env bash
# The simulator's speed goals (issue 36), one case per row: wall time and peak memory of `hzp simulate` (and of
# `hzp plan --search`) against each case's goal, on this machine. Cases: ZeRO-3 LLaMA-2 7B (one micro-batch
# per GPU, one step) at 1024, 16,384 and 100,000 GPUs (goals 0.5 s, 15 s, 120 s and 8 GiB); the published
# recipes of scenarios/papers/ (Grok-1-like at 1024 H100s, LLaMA-3 405B at 16,384, DeepSeek-V3-like at 2048;
# 60 s each); `hzp plan --search` at 1024 GPUs (10 s). With EXACT=1 each simulation runs again with --exact
# (every rank simulated: what hzp did before symmetric simulation) and the table gives the ratio; with
# SHIPPED=1 every scenario under scenarios/ is a case too (60 s each).
# A case is stopped at LIMIT_S seconds (default 900) and reported as "> LIMIT_S".
# Usage: bash bench/sim_goals.sh [HZP_BINARY]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
hzp="${1:-build/hzp}"
root=$(cd "$(dirname "$0")/.." && pwd)
limit=${LIMIT_S:-900}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

zero3() {  # GPUS -> a scenario file
  local file="$work/zero3-$1.json"
  cat >"$file" <<JSON
{"name": "zero3-7b-$1", "model": {"preset": "llama2-7b"}, "cluster": {"preset": "a800", "nodes": $(($1 / 8))},
 "training": {"seq_len": 4096, "micro_batch": 1, "global_batch_sequences": $1}, "policy": {"preset": "zero3"}}
JSON
  echo "$file"
}

# measure NAME ARGS...: "wall_s peak_GiB rc" of `hzp ARGS` under the time limit.
measure() {
  local name=$1
  shift
  /usr/bin/time -f "%e %M" -o "$work/time-$name" timeout "$limit" "$hzp" "$@" >"$work/log-$name" 2>&1
  local rc=$?
  read -r wall kb < <(tail -n 1 "$work/time-$name" 2>/dev/null) || { wall=0; kb=0; }
  [[ "$kb" =~ ^[0-9]+$ ]] || kb=0
  [ $rc -eq 124 ] && wall=">$limit"
  echo "$wall $(python3 -c "print(f'{$kb / 2**20:.2f}')") $rc"
}

step_of() {  # OUT_DIR -> the simulated step time
  python3 -c 'import json,sys; print("%.4f" % json.load(open(sys.argv[1]))["step_time_s"])' "$1/summary.json" 2>/dev/null ||
    echo "-"
}

verdict() {  # WALL GOAL_S GIB GOAL_GIB RC
  [ "$5" -ne 0 ] && { echo "failed (exit $5)"; return; }
  python3 -c "
import sys
wall, goal, gib, goal_gib = sys.argv[1:5]
ok = not wall.startswith('>') and float(wall) <= float(goal) and float(gib) <= float(goal_gib)
print('met' if ok else 'NOT met')" "$1" "$2" "$3" "$4"
}

row() {  # NAME GPUS GOAL_S GOAL_GIB SCENARIO [extra simulate flags]
  local name=$1 gpus=$2 goal=$3 goal_gib=$4 scenario=$5
  shift 5
  read -r wall gib rc < <(measure "$name" simulate "$scenario" --out "$work/out-$name" --max-sim-seconds 0 "$@")
  local step exact_col=""
  step=$(step_of "$work/out-$name")
  if [ "${EXACT:-0}" = 1 ]; then
    read -r ewall egib erc < <(measure "$name-exact" simulate "$scenario" --out "$work/out-$name-exact" \
      --max-sim-seconds 0 --exact "$@")
    local estep ratio
    estep=$(step_of "$work/out-$name-exact")
    ratio=$(python3 -c "
import sys
a, b = sys.argv[1:3]
print('-' if a.startswith('>') or b.startswith('>') or float(a) == 0 else f'{float(b) / float(a):.1f}x')" "$wall" "$ewall")
    exact_col=" $ewall | $egib | $estep | $ratio |"
  fi
  echo "| $name | $gpus | ≤ $goal s, ≤ $goal_gib GiB | $wall | $gib | $step |$exact_col $(verdict "$wall" "$goal" "$gib" "$goal_gib" "$rc") |"
}

header="| case | GPUs | goal | wall s | peak GiB | step s |"
rule="|------|-----:|------|-------:|---------:|-------:|"
if [ "${EXACT:-0}" = 1 ]; then
  header+=" --exact wall s | --exact GiB | --exact step s | speed-up |"
  rule+="------:|-----:|------:|------:|"
fi
echo "$header verdict |"
echo "$rule---------|"
row zero3-7b-1024 1024 0.5 8 "$(zero3 1024)"
row zero3-7b-16384 16384 15 8 "$(zero3 16384)"
row zero3-7b-100000 100000 120 8 "$(zero3 100000)"
row grok1-like-1024 1024 60 8 "$root/scenarios/papers/grok1-like-1024.json"
row llama3-405b-16k 16384 60 8 "$root/scenarios/papers/llama3-405b-16k.json"
row deepseek-v3-like-2048 2048 60 8 "$root/scenarios/papers/deepseek-v3-like-2048.json"
read -r wall gib rc < <(measure plan-search plan "$(zero3 1024)" --search --out "$work/plan")
pad=""
[ "${EXACT:-0}" = 1 ] && pad=" - | - | - | - |"
echo "| plan --search, zero3-7b-1024 | 1024 | ≤ 10 s | $wall | $gib | - |$pad $(verdict "$wall" 10 "$gib" 8 "$rc") |"
if [ "${SHIPPED:-0}" = 1 ]; then
  while IFS= read -r file; do
    gpus=$("$hzp" validate "$file" 2>&1 >/dev/null | sed -n 's/.* = \([0-9]*\) GPUs.*/\1/p')
    row "$(basename "$file" .json)" "${gpus:--}" 60 8 "$file"
  done < <(find "$root/scenarios" -name '*.json' -path '*papers*' -o -name '*.json' -path '*dense*' \
    -o -name '*.json' -path '*moe*' | sort)
fi
