#!/usr/bin/env bash
# tools/validate_collectives.py on bad input: an unreadable rows file, a line that is not JSON, a row that is
# not an object, a row missing a field, and a bad flag each exit 2 with a message naming the file and line;
# a not-modelled row is listed, and asking for an error bound with nothing scored fails (exit 1). A nan bound,
# a bad --hzp and an output that is an input, a FIFO, a folder or "" are refused (exit 2), never a traceback;
# so are a row's number out of its range (busbw 0, -1, nan), a duplicate id and a non-text algorithm.
# Usage: bash tests/validate_collectives_bad_input.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
work="$(mktemp -d "${TMPDIR:-/tmp}/hzp-collectives-bad.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "validate_collectives_bad_input: FAILED: $*"; exit 1; }
expect() {  # code pattern args...
  local code=$1 pattern=$2
  shift 2
  out="$(python3 tools/validate_collectives.py --hzp "$hzp" "$@" 2>&1)"
  local got=$?
  [ "$got" -eq "$code" ] || fail "exit $got (wanted $code) for $*: $out"
  grep -q -- "$pattern" <<<"$out" || fail "no '$pattern' in the output for $*: $out"
}
row='"op": "all_gather", "gpus": 16, "gpus_per_node": 8, "message_bytes": 1073741824, "busbw_gbps": 300'
printf '{"id": "A", %s, "hzp": {"not_modelled": "tree"}}\nnot json\n' "$row" >"$work/broken.jsonl"
printf '[1, 2]\n' >"$work/array.jsonl"
printf '{"id": "A", "op": "all_gather"}\n' >"$work/missing.jsonl"
printf '{"id": "A", %s, "hzp": {}}\n' "$row" >"$work/nocluster.jsonl"
printf '{"id": "T1", %s, "hzp": {"not_modelled": "NVLS tree"}}\n' "$row" >"$work/unmodelled.jsonl"
expect 2 "No such file" "$work/nothing.jsonl"
expect 2 "broken.jsonl:2: not JSON" "$work/broken.jsonl"
expect 2 "array.jsonl:1: a row must be a JSON object" "$work/array.jsonl"
expect 2 "missing.jsonl:1: \"gpus\" missing" "$work/missing.jsonl"
expect 2 "needs a \"cluster\" object" "$work/nocluster.jsonl"
expect 2 "jobs must be 1 to 64" --jobs 0 "$work/unmodelled.jsonl"
expect 0 "T1 .*not compared: NVLS tree" "$work/unmodelled.jsonl"
expect 1 "no row of at least --min-bytes was scored" --max-error 15 "$work/unmodelled.jsonl"
# Every number of a row in its range (a busbw of 0 divided the error: a ZeroDivisionError traceback; -1 and nan
# gave a nonsense error), ids unique, and what goes on hzp's command line text: exit 2 naming the row and field.
cluster='"hzp": {"cluster": {"preset": "dgx-h100"}}'
for bad in '"busbw_gbps": 0' '"busbw_gbps": -1' '"busbw_gbps": NaN' '"busbw_gbps": 1e400'; do
  printf '{"id": "R7", "op": "all_gather", "gpus": 16, "gpus_per_node": 8, "message_bytes": 1024, %s, %s}\n' \
    "$bad" "$cluster" >"$work/range.jsonl"
  expect 2 "range.jsonl:1: row R7: busbw_gbps .* is not in (0," "$work/range.jsonl"
done
for field in message_bytes gpus gpus_per_node; do
  printf '{"id": "R8", "op": "all_gather", "gpus": 16, "gpus_per_node": 8, "message_bytes": 1024, "busbw_gbps": 1, %s, "%s": 0}\n' \
    "$cluster" "$field" >"$work/range.jsonl"
  expect 2 "range.jsonl:1: row R8: $field 0 is not in \[1," "$work/range.jsonl"
done
printf '{"id": "D1", %s, "hzp": {"not_modelled": "x"}}\n{"id": "D1", %s, "hzp": {"not_modelled": "y"}}\n' "$row" "$row" \
  >"$work/dup.jsonl"
expect 2 "dup.jsonl:2: row D1: id used already on line 1" "$work/dup.jsonl"
printf '{"id": "P1", %s, "hzp": {"cluster": {}, "algorithm": 5}}\n' "$row" >"$work/alg.jsonl"
expect 2 "alg.jsonl:1: row P1: hzp.algorithm .5. is not a string" "$work/alg.jsonl"
# Flags that would make the gate pass whatever the error (nan), and outputs that are an input (also through a
# link), a FIFO, a folder or "": exit 2 with one line, before anything is simulated; the input is untouched.
expect 2 "argument --max-error: 'nan' is not a number" --max-error nan "$work/unmodelled.jsonl"
expect 2 "min-bytes must be 1 to" --min-bytes -5 "$work/unmodelled.jsonl"
cp "$work/unmodelled.jsonl" "$work/keep.jsonl"
ln -s keep.jsonl "$work/link.jsonl"
expect 2 "is an input" --json "$work/keep.jsonl" "$work/keep.jsonl"
expect 2 "is an input" --json "$work/link.jsonl" "$work/keep.jsonl"
cmp -s "$work/unmodelled.jsonl" "$work/keep.jsonl" || fail "--json equal to the input changed the input"
mkfifo "$work/fifo.json"
out="$(timeout 20 python3 tools/validate_collectives.py --hzp "$hzp" --json "$work/fifo.json" "$work/keep.jsonl" 2>&1)"
[ $? -eq 2 ] && grep -q "not a regular file" <<<"$out" || fail "--json FIFO: $out"
expect 2 "a folder, not a file" --json "$work" "$work/keep.jsonl"
expect 2 "--json: an empty path" --json "" "$work/keep.jsonl"
out="$(python3 tools/validate_collectives.py --hzp "$work" "$work/keep.jsonl" 2>&1)"
[ $? -eq 2 ] && grep -q -- "--hzp .*not an executable" <<<"$out" || fail "--hzp a folder: $out"
echo "validate_collectives_bad_input: ok"
