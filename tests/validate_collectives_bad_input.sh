#!/usr/bin/env bash
# tools/validate_collectives.py on bad input: an unreadable rows file, a line that is not JSON, a row that is
# not an object, a row missing a field, and a bad flag each exit 2 with a message naming the file and line;
# a not-modelled row is listed, and asking for an error bound with nothing scored fails (exit 1).
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
echo "validate_collectives_bad_input: ok"
