#!/usr/bin/env bash
# tools/overlap_table.py reproduces sim/README.md's tensor-overlap table from the H200 run that timed Nemotron-4's
# products beside a 16-SM copy (bench/gpu/results/2026-11-28-h200/overlap_gemm_shapes.jsonl), and refuses bad
# input (exit 2, the file and line named).
# Usage: bash tests/overlap_table.sh
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d "${TMPDIR:-/tmp}/hzp-overlap-table.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "overlap_table: FAILED: $*"; exit 1; }
run=bench/gpu/results/2026-11-28-h200/overlap_gemm_shapes.jsonl
out=$(python3 tools/overlap_table.py "$run" 2>&1) || fail "$out"
echo "$out"
for want in "| 16 | 2 | 0.887 | 0.879 | 0.987 | 0.844 |" "| 16 | 4 | 0.880 | 0.879 | 0.902 | 0.735 |" \
            "| 16 | 8 | 0.772 | 0.879 | 0.698 | 0.416 |"; do
  grep -qF -- "$want" <<<"$out" || fail "no row '$want'"
done
# sim/README.md's table holds the same numbers.
for row in "| 2 | 0.887 | 0.987 | 0.844 |" "| 4 | 0.880 | 0.902 | 0.735 |" "| 8 | 0.772 | 0.698 | 0.416 |"; do
  grep -qF -- "$row" sim/README.md || fail "sim/README.md has no row '$row'"
done
expect2() {  # pattern file
  local msg code
  msg=$(python3 tools/overlap_table.py "$2" 2>&1); code=$?
  [ "$code" -eq 2 ] || fail "exit $code (wanted 2) for $2: $msg"
  grep -qF -- "$1" <<<"$msg" || fail "no '$1' for $2: $msg"
}
expect2 "cannot read" "$work/missing.jsonl"
echo '{"type": "bf16", "model": "m", "tokens": 4096, "tensor": 1, "op": "qkv", "chunk": false}' > "$work/none.jsonl"
expect2 "no rows timed beside a copy kernel" "$work/none.jsonl"
head -1 "$run" > "$work/bad.jsonl"
echo 'not json' >> "$work/bad.jsonl"
expect2 "bad.jsonl:2: not JSON" "$work/bad.jsonl"
head -1 "$run" | sed 's/"m": [0-9]*/"m": "4096"/' > "$work/m.jsonl"
expect2 "m.jsonl:1: a row without integer" "$work/m.jsonl"
head -1 "$run" | sed 's/"fwd_tflops": [0-9.]*/"fwd_tflops": -1/' > "$work/rate.jsonl"
expect2 "rate.jsonl:1: fwd_tflops -1 is not a positive number" "$work/rate.jsonl"
head -1 "$run" | sed 's/, "fwd_tflops_beside_copy": [0-9.]*//' > "$work/beside.jsonl"
expect2 "beside.jsonl:1: fwd_tflops without fwd_tflops_beside_copy" "$work/beside.jsonl"
echo "overlap_table: ok"
