#!/usr/bin/env bash
# Smoke test of tools/sweep.py: sweeps two tiny golden scenarios into a temporary folder and checks that
# results.csv has one row per scenario, without errors, and that the plots and index.html exist; then a grid
# whose point names would pass 128 bytes runs every point under a valid, unique name.
# Usage: bash tests/sweep_smoke.sh [HZP]   (HZP defaults to build/hzp; paths are relative to the repo root)
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
  echo "sweep_smoke: SKIPPED: matplotlib is not importable (install python3-matplotlib)"
  exit 77
fi

out="$(mktemp -d "${TMPDIR:-/tmp}/hzp-sweep-smoke.XXXXXX")"
trap 'rm -rf "$out"' EXIT

fail() { echo "sweep_smoke: FAILED: $*"; exit 1; }

# Progress goes to a file here, as under Slurm or CI: plain lines, each with the elapsed time; an ETA once a
# scenario finished; and while none finishes, a line every --progress-s (each simulation takes far longer
# than 10 ms: two hzp processes).
"$python" tools/sweep.py --hzp "$hzp" --jobs 1 --progress-s 0.01 --out "$out" tests/data/golden/ddp.json \
  tests/data/golden/zero3.json 2> "$out/progress.txt"
grep -q '^sweep: \[2/2\] .*; 2/2 done, elapsed 0:00:[0-9][0-9], ETA 0:00:00$' "$out/progress.txt" ||
  fail "no final progress line: $(cat "$out/progress.txt")"
grep -q '^sweep: 0/2 done, elapsed .*, 1 running$' "$out/progress.txt" ||
  fail "no progress line while the first scenario runs: $(cat "$out/progress.txt")"
[ "$(grep -c $'\r' "$out/progress.txt")" -eq 0 ] || fail "carriage returns in a log file"

rows=$(($(wc -l < "$out/results.csv") - 1))
[ "$rows" -eq 2 ] || fail "results.csv has $rows data rows, expected 2"
# The last column is the error: empty on every row.
errors=$("$python" -c 'import csv, sys; print(sum(1 for r in csv.DictReader(open(sys.argv[1])) if r["error"]))' \
  "$out/results.csv")
[ "$errors" -eq 0 ] || fail "$errors scenarios failed: $(cat "$out/results.csv")"
for f in mfu_vs_gpus.png memory_by_policy.png exposed_comm_by_policy.png index.html; do
  [ -s "$out/$f" ] || fail "$f missing or empty"
done
grep -q "tools/sweep.py" "$out/index.html" || fail "index.html does not show the command line"
# A grid over several keys: the points' names (base stem and edits) passed the 128 bytes of a scenario name,
# and every point failed on a `name` the user never set. Long names are cut and end in a hash: valid, unique.
grid=(--grid cluster.gpus_per_node=8 --grid policy.parallel.tensor=2 --grid policy.parallel.sequence_parallel=true
  --grid "policy.parallel.tensor_comm_overlap=true,false")
"$python" tools/sweep.py --hzp "$hzp" --jobs 1 --out "$out/grid" scenarios/default.json "${grid[@]}" 2> "$out/grid.txt" ||
  fail "the long-named grid failed: $(tail -3 "$out/grid.txt")"
"$python" -c 'import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
names = [r["scenario"] for r in rows]
assert len(rows) == 2 and not any(r["error"] for r in rows), rows
assert len(set(names)) == 2 and all(len(n.encode()) <= 128 for n in names), names' "$out/grid/results.csv" ||
  fail "grid points not simulated under valid unique names: $(cat "$out/grid/results.csv")"
echo "sweep_smoke: ok"
