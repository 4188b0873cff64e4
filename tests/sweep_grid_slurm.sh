#!/usr/bin/env bash
# tools/sweep.py beyond one machine: a --grid over a base scenario, and a Slurm job array (--slurm) whose
# tasks are run here one by one, as Slurm would, then --collect: the same rows as a local sweep of the same
# scenarios (but the simulator's wall time; files by absolute path), and the page sortable with the main columns first.
# Usage: bash tests/sweep_grid_slurm.sh [HZP]   (HZP defaults to build/hzp; paths are relative to the repo root)
# Skips (exit 77, ctest "skipped") when no python3 with matplotlib is found.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
python=""
for candidate in python3 /usr/bin/python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import matplotlib" 2>/dev/null; then
    python="$candidate"
    break
  fi
done
if [ -z "$python" ]; then
  echo "sweep_grid_slurm: SKIPPED: matplotlib is not importable (install python3-matplotlib)"
  exit 77
fi
out="$(mktemp -d "${TMPDIR:-/tmp}/hzp-sweep-grid.XXXXXX")"
trap 'rm -rf "$out"' EXIT
fail() { echo "sweep_grid_slurm: FAILED: $*"; exit 1; }

# A 2 x 2 grid: every point resolved by hzp, named after its edits.
"$python" tools/sweep.py --hzp "$hzp" --jobs 2 --no-svg --out "$out/grid" tests/data/golden/zero3.json \
  --grid policy.preset=zero1,zero3 --grid training.micro_batch=1,2 2> "$out/grid.log" || fail "grid: $(cat "$out/grid.log")"
"$python" - "$out/grid/results.csv" <<'PY' || fail "grid rows"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
points = sorted((r["policy"], r["scenario"].split()[-1]) for r in rows)
assert points == [("zero1", "training.micro_batch=1"), ("zero1", "training.micro_batch=2"),
                  ("zero3", "training.micro_batch=1"), ("zero3", "training.micro_batch=2")], points
assert all(not r["error"] for r in rows), rows
PY
"$python" tools/sweep.py --hzp "$hzp" --out "$out/bad" tests/data/golden/zero3.json --grid policy.preset \
  2> "$out/bad.log" && fail "a grid without values was accepted"
grep -q "expected KEY=V1,V2" "$out/bad.log" || fail "bad grid message: $(cat "$out/bad.log")"

# The job array: written, its tasks run as Slurm would run them, collected.
files=(tests/data/golden/ddp.json tests/data/golden/zero3.json)
"$python" tools/sweep.py --hzp "$hzp" --jobs 1 --no-svg --out "$out/slurm" --slurm --sbatch=--partition=cpu "${files[@]}" \
  2> "$out/slurm.log" || fail "--slurm: $(cat "$out/slurm.log")"
script="$out/slurm/slurm/sweep.sbatch"
grep -q '^#SBATCH --array=0-1%1$' "$script" || fail "no array line: $(cat "$script")"
grep -q '^#SBATCH --partition=cpu$' "$script" || fail "no --sbatch line: $(cat "$script")"
[ ! -e "$out/slurm/results.csv" ] || fail "--slurm ran the scenarios"
# An --sbatch option is one line: one holding a newline would put a shell command into the script.
if "$python" tools/sweep.py --hzp "$hzp" --out "$out/injected" --slurm --sbatch="$(printf -- '--time=1\necho INJECTED')" \
  "${files[@]}" > "$out/injected.log" 2>&1; then fail "--sbatch with a newline was accepted"; fi
grep -q "one option on one line" "$out/injected.log" || fail "--sbatch newline: $(cat "$out/injected.log")"
[ ! -e "$out/injected/slurm/sweep.sbatch" ] || fail "--sbatch newline wrote a script"
for task in 0 1; do SLURM_ARRAY_TASK_ID=$task bash "$script" 2>> "$out/tasks.log" || fail "task $task: $(cat "$out/tasks.log")"; done
"$python" tools/sweep.py --hzp "$hzp" --no-svg --collect --out "$out/slurm" 2> "$out/collect.log" ||
  fail "--collect: $(cat "$out/collect.log")"
"$python" tools/sweep.py --hzp "$hzp" --jobs 2 --no-svg --out "$out/local" "${files[@]}" 2> /dev/null || fail "local sweep"
"$python" - "$out/slurm/results.csv" "$out/local/results.csv" <<'PY' || fail "collected rows differ from the local sweep's"
import csv, sys
import os
def rows(path):  # the job array names its files by absolute path, for tasks that run elsewhere
    return [{k: os.path.abspath(v) if k == "file" else v for k, v in r.items() if k != "sim_wall_s"}
            for r in csv.DictReader(open(path))]
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert a == b, (a, b)
PY
grep -q 'onclick="sortBy(this)"' "$out/slurm/index.html" || fail "the page's table does not sort"
grep -q 'class="extra"' "$out/slurm/index.html" || fail "the page shows every column by default"
# A task that left no row is a failed row, and the report says so (exit 1).
rm "$out/slurm/rows/1.json"
"$python" tools/sweep.py --hzp "$hzp" --no-svg --collect --out "$out/slurm" 2> "$out/collect2.log" &&
  fail "--collect with a missing task exited 0"
grep -q "task 1 left no readable" "$out/slurm/results.csv" || fail "the missing task is not in results.csv"
# A bad --out is one line and exit 2, never a traceback (issue 35, item 16).
touch "$out/a_file.json"
for bad in "$out/a_file.json" "" /proc/hzp-sweep-x; do
  rc=0
  "$python" tools/sweep.py --hzp "$hzp" --out "$bad" tests/data/golden/ddp.json > "$out/bad_out.log" 2>&1 || rc=$?
  [ $rc -eq 2 ] || fail "--out '$bad': exit $rc: $(cat "$out/bad_out.log")"
  ! grep -q Traceback "$out/bad_out.log" || fail "--out '$bad': a traceback: $(cat "$out/bad_out.log")"
  [ "$(wc -l < "$out/bad_out.log")" -eq 1 ] || fail "--out '$bad': more than one line: $(cat "$out/bad_out.log")"
done
# A reused --out holds this sweep's grid points and runs only, not an earlier sweep's beside them (issue 35's
# ninth attack); a folder of the user's in runs/ stays.
"$python" tools/sweep.py --hzp "$hzp" --no-svg --keep-runs --grid policy.preset=zero1,zero2,zero3 \
  --out "$out/reused" tests/data/golden/zero3.json > /dev/null 2>&1 || fail "the 3-point sweep failed"
mkdir -p "$out/reused/runs/009-mine" && echo notes > "$out/reused/runs/009-mine/notes.txt"
"$python" tools/sweep.py --hzp "$hzp" --no-svg --grid policy.preset=ddp --out "$out/reused" \
  tests/data/golden/zero3.json > /dev/null 2>&1 || fail "the 1-point sweep failed"
[ "$(ls "$out/reused/grid")" = "000.json" ] || fail "grid/ holds an earlier sweep's points: $(ls "$out/reused/grid")"
[ "$(ls "$out/reused/runs")" = "009-mine" ] || fail "runs/ holds an earlier sweep's runs: $(ls "$out/reused/runs")"
echo "sweep_grid_slurm: ok"
