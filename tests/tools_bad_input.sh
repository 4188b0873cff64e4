#!/usr/bin/env bash
# Every Python tool of tools/ and bench/ on bad input — an unknown flag, a missing file, /dev/zero, a FIFO
# without a writer, a rows file nested 100,000 deep, an id holding '/' or 10,000 characters — exits 2 with a
# message naming what is wrong, never a traceback and never a hang (each run under `timeout 30`); so do a nan
# gate (--max-error nan would always pass), a flooding --progress-s, and a sweep input that is its own output.
# Usage: bash tests/tools_bad_input.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkfifo "$out/fifo.jsonl"
python3 -c "print('{\"id\": ' + '[' * 100000 + ']' * 100000 + '}')" > "$out/deep.jsonl"
echo '{"id": "a/b", "gpu_count": 8}' > "$out/slash.jsonl"
python3 -c "print('{\"id\": \"' + 'x' * 10000 + '\"}')" > "$out/long.jsonl"
failures=0
expect_2() {  # TOOL ARGS...
  timeout 30 python3 "$@" > "$out/log" 2>&1 < /dev/null
  local rc=$?
  if [ $rc -ne 2 ] || grep -q Traceback "$out/log"; then
    echo "FAIL: $* -> exit $rc: $(tail -2 "$out/log" | cut -c1-200)"
    failures=$((failures + 1))
  fi
}
for tool in tools/*.py bench/*.py bench/gpu/*.py; do
  for bad in --no-such-flag /nonexistent/file.jsonl /dev/zero "$out/fifo.jsonl"; do expect_2 "$tool" "$bad"; done
done
for rows in "$out/deep.jsonl" "$out/slash.jsonl" "$out/long.jsonl" "$out/fifo.jsonl" /dev/zero; do
  expect_2 tools/validate_rows.py "$rows" --hzp "$hzp"
  expect_2 tools/validate_collectives.py "$rows" --hzp "$hzp"
done
rows=scenarios/validation/one_node_rows.jsonl
expect_2 tools/validate_rows.py "$rows" --hzp /nonexistent/hzp
expect_2 tools/validate_rows.py "$rows" --hzp "$hzp" --json /proc/nope/report.json
expect_2 tools/validate_rows.py "$rows" --hzp "$hzp" --out /proc/nope
expect_2 tools/validate_rows.py "$rows" --hzp "$hzp" --out "$rows"
# Gates that a nan would always pass, and a progress interval that floods the output.
expect_2 tools/fp8_transfer.py "$rows" --hzp "$hzp" --max-error nan
expect_2 tools/validate_rows.py "$rows" --hzp "$hzp" --max-error nan
expect_2 tools/sweep.py scenarios/default.json --hzp "$hzp" --out "$out/sweep" --progress-s 1e-300
expect_2 tools/sweep.py scenarios/default.json --hzp "$hzp" --out "$out/sweep" --progress-s nan
# A scenario the sweep would overwrite with its own output (its report, or a grid file) is refused.
mkdir -p "$out/sweep/grid"
cp scenarios/default.json "$out/sweep/index.html"
cp scenarios/default.json "$out/sweep/grid/000.json"
expect_2 tools/sweep.py "$out/sweep/index.html" --hzp "$hzp" --out "$out/sweep"
expect_2 tools/sweep.py "$out/sweep/grid/000.json" --hzp "$hzp" --out "$out/sweep" --grid cluster.nodes=1,2
cmp -s scenarios/default.json "$out/sweep/index.html" || { echo "FAIL: the sweep replaced its input"; failures=$((failures + 1)); }
# ... and so are the Hugging Face config a scenario's model starts from, and the hzp binary, at such a path.
echo '{"name": "hf", "model": {"from_hf_config": "sweep/results.csv"}}' > "$out/hf.json"
echo '{}' > "$out/sweep/results.csv"
expect_2 tools/sweep.py "$out/hf.json" --hzp "$hzp" --out "$out/sweep"
cp "$hzp" "$out/sweep/index.html"
expect_2 tools/sweep.py scenarios/default.json --hzp "$out/sweep/index.html" --out "$out/sweep"
cmp -s "$hzp" "$out/sweep/index.html" || { echo "FAIL: the sweep replaced its hzp"; failures=$((failures + 1)); }
[ $failures -eq 0 ] || exit 1
echo "tools_bad_input: ok"
