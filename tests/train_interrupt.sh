#!/usr/bin/env bash
# Ctrl-C on `hzp train`: the launcher asks every rank to stop after its current step; they stop together,
# write a checkpoint there (with --checkpoint-dir) and the outputs so far, and the job exits 130 saying
# "interrupted" (not "failed"). --resume then continues the very loss curve of an uninterrupted run. A
# second Ctrl-C stops the ranks at once (still 130, still not "failed"). SIGINT is sent to the launcher
# alone, as a terminal does (the ranks have their own process group).
# Usage: bash tests/train_interrupt.sh HZP_BINARY
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -uo pipefail
hzp=$1
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail() { echo "train_interrupt: FAILED: $*"; exit 1; }
python3 - "$root/scenarios/runtime/tiny_dense.json" "$out/s.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
s["run"].update(steps=120, eval_interval=0, checkpoint_interval=0)
json.dump(s, open(sys.argv[2], "w"))
PY
flags=(--nproc 2 --threads 1 --timeout-s 30 --data "$root/tests/data/tinyshakespeare_200k.txt")
train() {  # OUT_NAME EXTRA...
  local name=$1
  shift
  "$hzp" train "$out/s.json" "${flags[@]}" --out "$out/$name" "$@"
}
steps_in() { if [ -f "$1/metrics.jsonl" ]; then grep -c '"loss"' "$1/metrics.jsonl"; else echo 0; fi; }
# Interrupt once the run is a few steps in; wait for it.
interrupt() {  # OUT_NAME SIGNALS EXTRA...
  local name=$1 signals=$2
  shift 2
  "$hzp" train "$out/s.json" "${flags[@]}" --out "$out/$name" "$@" > "$out/$name.log" 2>&1 &  # $!: hzp itself
  local pid=$! waited=0
  while [ "$(steps_in "$out/$name")" -lt 3 ] && [ $waited -lt 600 ]; do sleep 0.1; waited=$((waited + 1)); done
  for ((i = 0; i < signals; i++)); do kill -INT $pid; sleep 0.05; done
  wait $pid
  echo $? > "$out/$name.rc"
}

train whole > "$out/whole.log" 2>&1 || fail "the uninterrupted run: $(tail -3 "$out/whole.log")"
interrupt part 1 --checkpoint-dir "$out/ckpt"
[ "$(cat "$out/part.rc")" = 130 ] || fail "exit $(cat "$out/part.rc"), not 130: $(tail -5 "$out/part.log")"
grep -q "^hzp train: interrupted$" "$out/part.log" || fail "no 'interrupted': $(tail -5 "$out/part.log")"
grep -q "failed" "$out/part.log" && fail "an interrupt reported as a failure: $(cat "$out/part.log")"
stopped=$(steps_in "$out/part")
[ "$stopped" -lt 120 ] || fail "the run was not interrupted (it ended)"
[ "$(cat "$out/ckpt/latest")" = "$stopped" ] || fail "checkpoint at $(cat "$out/ckpt/latest"), metrics at $stopped"
grep -q "interrupted after step $stopped of 120; checkpoint .*step_$stopped; continue with --resume" "$out/part.log" ||
  fail "no resume hint: $(tail -5 "$out/part.log")"
[ -s "$out/part/summary.json" ] || fail "no summary.json after the interrupt"
train part --checkpoint-dir "$out/ckpt" --resume > "$out/resume.log" 2>&1 || fail "resume: $(tail -3 "$out/resume.log")"
python3 - "$out/whole/metrics.jsonl" "$out/part/metrics.jsonl" <<'PY' || fail "the resumed curve is not the uninterrupted one"
import json, sys
def losses(path):
    return {l["step"]: l["loss"] for l in map(json.loads, open(path)) if "loss" in l}
whole, part = losses(sys.argv[1]), losses(sys.argv[2])
assert max(part) == 120 and all(part[s] == whole[s] for s in part), [(s, part[s], whole[s]) for s in part if part[s] != whole[s]][:3]
PY
# Twice: at once, without a checkpoint to wait for; still an interrupt.
interrupt twice 2
[ "$(cat "$out/twice.rc")" = 130 ] || fail "twice: exit $(cat "$out/twice.rc"): $(tail -5 "$out/twice.log")"
grep -q "interrupted again" "$out/twice.log" || fail "twice: $(tail -5 "$out/twice.log")"
echo "train_interrupt: ok (stopped after step $stopped of 120, resumed to the same curve)"
