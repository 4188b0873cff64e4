#!/usr/bin/env bash
# tools/validate_rows.py on bad input: an unreadable rows file, a line that is not JSON, a row that is not an
# object, and a bad flag each exit 2 with a message naming the file and line; a row it cannot translate, or whose
# fields have the wrong type or value, is listed as skipped with the field named (exit 1 when no row is left to
# validate); asking for a fidelity bound with nothing simulated fails (exit 1). tools/fp8_transfer.py: a missing
# file, rows with no bf16 / FP8 pair and a pair on a GPU without an FP8 peak exit 2 with the reason, never a
# traceback. Outputs that are an input, a FIFO or an empty path are refused before any work; rows without an id,
# with a repeated id or a number Python cannot convert are refused naming the line; files of the --out folder are
# never written through a link or a FIFO, and never replace an input. --only and --calibrate-on with an id that is
# not in their file exit 2 naming it.
# Usage: bash tests/validate_rows_bad_input.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
work="$(mktemp -d "${TMPDIR:-/tmp}/hzp-validate-bad.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "validate_rows_bad_input: FAILED: $*"; exit 1; }
expect() {  # code pattern args...
  local code=$1 pattern=$2
  shift 2
  out="$(python3 tools/validate_rows.py --hzp "$hzp" "$@" 2>&1)"
  local got=$?
  [ "$got" -eq "$code" ] || fail "exit $got (wanted $code) for $*: $out"
  grep -q -- "$pattern" <<<"$out" || fail "no '$pattern' in the output for $*: $out"
}
printf '{"id": "A"}\nnot json\n' >"$work/broken.jsonl"
printf '[1, 2]\n' >"$work/array.jsonl"
printf '{"id": "R1", "model": "m"}\n' >"$work/untranslatable.jsonl"
# Fields of the wrong type or value: listed as skipped with the field named, never a traceback.
cat >"$work/malformed.jsonl" <<'ROWS'
{"id": "M1", "layers": 32, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000, "seq_len": 4096, "gpu_count": 8, "gpus_per_node": 0}
{"id": "M2", "layers": "32", "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000, "seq_len": 4096, "gpu_count": 8, "gpus_per_node": 8}
{"id": "M3", "layers": 32, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000, "seq_len": 4096, "gpu_count": 16, "gpus_per_node": 8, "gpu": "A100", "micro_batch": 1, "grad_accum": 1, "tp": {"a": 1}}
{"id": "M4", "layers": 32, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000, "seq_len": 4096, "gpu_count": 16, "gpus_per_node": 8, "gpu": "A100", "micro_batch": 1, "grad_accum": 1, "zero_or_sharding": "zero1=-1", "inter_node": "4x 100 Gb", "tokens_per_s_per_gpu": "fast"}
{"id": "M5", "layers": 32, "hidden": 4096, "heads": 32, "ffn": 11008, "vocab": 32000, "seq_len": 4096, "gpu_count": 16, "gpus_per_node": 8, "gpu": "A100", "micro_batch": 1, "grad_accum": 1, "tp": 3, "zero_or_sharding": "zero1=-1"}
{"id": "M6", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 0, "ffn": 11008, "vocab": 32000, "seq_len": 4096, "gpu_count": 16, "gpus_per_node": 8, "gpu": "A100", "micro_batch": 1, "grad_accum": 1, "zero_or_sharding": "zero1=-1"}
{"id": "M7", "layers": 32, "hidden": 4096, "heads": 32, "kv_heads": [], "ffn": 11008, "vocab": 32000, "seq_len": 4096, "gpu_count": 16, "gpus_per_node": 8, "gpu": "A100", "micro_batch": 1, "grad_accum": 1, "zero_or_sharding": "zero1=-1"}
ROWS
expect 2 "No such file" "$work/missing.jsonl"
# --only and --calibrate-on name rows that are there.
expect 2 "\-\-only: no row R999 in" scenarios/validation/one_node_rows.jsonl --only R133,R999
expect 2 "\-\-calibrate-on: no row id given" scenarios/validation/one_node_rows.jsonl --calibrate-on ", "
expect 2 "\-\-calibrate-on: no row R201 in" scenarios/validation/one_node_rows.jsonl --calibrate-on R201
expect 2 "broken.jsonl:2: not JSON" "$work/broken.jsonl"
expect 2 "array.jsonl:1: a row must be a JSON object" "$work/array.jsonl"
expect 2 "jobs must be in" --jobs 0 "$work/untranslatable.jsonl"
expect 2 "argument --compute-spread: '1' is not a number in \[0, 0.2\]" --compute-spread 1 "$work/untranslatable.jsonl"
expect 2 "argument --overlap-slowdown: '1.5' is not a number in" --overlap-slowdown 1.5 "$work/untranslatable.jsonl"
expect 2 "argument --max-error: 'nan' is not a number" --max-error nan "$work/untranslatable.jsonl"
expect 2 "argument --protocol: invalid choice" --protocol ll256 "$work/untranslatable.jsonl"
expect 2 "seed must be in" --routing ecmp --seed -1 "$work/untranslatable.jsonl"
expect 2 "rail-optimized needs --routing ecmp" --rail-optimized "$work/untranslatable.jsonl"
expect 2 "argument --placement: invalid choice" --placement random "$work/untranslatable.jsonl"
expect 1 "skipped R1: layers not published" "$work/untranslatable.jsonl"
expect 1 "no multi-node row was simulated" --max-error 15 "$work/untranslatable.jsonl"
expect 1 "no multi-node row was simulated" --max-ratio 2 "$work/untranslatable.jsonl"
expect 1 "skipped M1: gpus_per_node 0 is not a positive whole number" "$work/malformed.jsonl"
expect 1 "skipped M2: layers '32' is not a positive whole number" "$work/malformed.jsonl"
expect 1 "skipped M3: tp {'a': 1} is not a number" "$work/malformed.jsonl"
expect 1 "skipped M4: tokens_per_s_per_gpu 'fast' is not a positive number" "$work/malformed.jsonl"
expect 1 "skipped M5: 16 GPUs are not a multiple of tp x pp x cp = 3" "$work/malformed.jsonl"
expect 1 "skipped M6: kv_heads 0 is not a head count in \[1, heads = 32\]" "$work/malformed.jsonl"
expect 1 "skipped M7: kv_heads \[\] is not a head count" "$work/malformed.jsonl"
expect 1 "skipped M1" --calibration "$work/malformed.jsonl" "$work/malformed.jsonl"
# Outputs: the report never overwrites an input, never waits on a FIFO, and an empty path is refused.
cp "$work/malformed.jsonl" "$work/keep.jsonl"
expect 2 "is an input" --json "$work/keep.jsonl" "$work/keep.jsonl"
cmp -s "$work/malformed.jsonl" "$work/keep.jsonl" || fail "--json equal to the input changed the input"
mkfifo "$work/fifo.json"
out="$(timeout 20 python3 tools/validate_rows.py --hzp "$hzp" --json "$work/fifo.json" "$work/keep.jsonl" 2>&1)"
[ $? -eq 2 ] && grep -q "not a regular file" <<<"$out" || fail "--json FIFO: $out"
expect 2 "--out: an empty path" --out "" "$work/keep.jsonl"
# Rows: one without an id, a repeated id, a 5000-digit integer: exit 2 naming the file and line.
printf '{"model": "m"}\n' >"$work/no_id.jsonl"
expect 2 "no_id.jsonl:1: a row needs an id" "$work/no_id.jsonl"
printf '{"id": "A"}\n{"id": "A"}\n' >"$work/twice.jsonl"
expect 2 "twice.jsonl:2: id A is also line 1's" "$work/twice.jsonl"
python3 -c 'print("{\"id\": \"A\", \"layers\": " + "9" * 5000 + "}")' >"$work/digits.jsonl"
expect 2 "digits.jsonl:1: Exceeds the limit" "$work/digits.jsonl"
# The work folder (--out): what is at a file's name there — a FIFO, a link out of the folder — is replaced,
# never waited on or written through, and an input there is never replaced.
head -1 scenarios/validation/one_node_rows.jsonl >"$work/one.jsonl"
id=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["id"])' "$work/one.jsonl")
mkdir -p "$work/out"
mkfifo "$work/out/cal-$id.json"
echo "outside" >"$work/outside.txt"
ln -s ../outside.txt "$work/out/$id-8.json"
out="$(timeout 60 python3 tools/validate_rows.py --hzp "$hzp" --out "$work/out" "$work/one.jsonl" 2>&1)"
[ $? -eq 0 ] || fail "--out with a FIFO and a link in it: $out"
[ "$(cat "$work/outside.txt")" = "outside" ] || fail "a link in --out was written through"
[ -f "$work/out/cal-$id.json" ] && [ ! -L "$work/out/$id-8.json" ] || fail "the FIFO or the link is still there"
cp "$work/one.jsonl" "$work/out/cal-$id.json"
expect 2 "is an input" --out "$work/out" "$work/out/cal-$id.json"
cmp -s "$work/one.jsonl" "$work/out/cal-$id.json" || fail "an input in --out was replaced"
expect 2 "--json: an empty path" --json "" "$work/keep.jsonl"
fp8_expect() {  # code pattern rows
  out="$(python3 tools/fp8_transfer.py --hzp "$hzp" "$3" 2>&1)"
  local got=$?
  [ "$got" -eq "$1" ] || fail "fp8_transfer: exit $got (wanted $1) for $3: $out"
  grep -q -- "$2" <<<"$out" || fail "fp8_transfer: no '$2' in the output for $3: $out"
  grep -q Traceback <<<"$out" && fail "fp8_transfer: a traceback for $3: $out"
  return 0
}
fp8_expect 2 "No such file" "$work/missing.jsonl"
fp8_expect 2 "no bf16 / FP8 pair" "$work/malformed.jsonl"
# R173 and R178 moved to A100s: a pair, but no FP8 peak to run the FP8 row at.
grep -E '"id": "R17[38]"' scenarios/validation/one_node_rows.jsonl | sed 's/"gpu": "H100-SXM5-80GB HBM3 (700W)"/"gpu": "A100-SXM4-80GB"/' \
  >"$work/fp8_on_a100.jsonl"
fp8_expect 2 "R173 -> R178: FP8 on 'A100-SXM4-80GB'" "$work/fp8_on_a100.jsonl"
echo "validate_rows_bad_input: ok"
