#!/usr/bin/env bash
# The calibration table's flash-attention rates for Hopper (cluster.gpu.flash_attention_vs_gemm, as `hzp validate`
# resolves dgx-h100, dgx-h200 and an h800-sxm cluster) are what tools/flash_rate_table.py computes from the H200 run
# that timed PyTorch's SDPA beside the GEMMs (bench/gpu/results/2026-11-27b-h200); a user's own table replaces
# it; and the tool refuses bad input (exit 2, the file named).
# Usage: bash tests/flash_rate_table.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
work="$(mktemp -d "${TMPDIR:-/tmp}/hzp-flash-rates.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "flash_rate_table: FAILED: $*"; exit 1; }
run=bench/gpu/results/2026-11-27b-h200
scenario() {  # cluster JSON -> $work/s.json
  printf '{"model": {"preset": "llama2-7b"}, "cluster": %s, "training": {"seq_len": 4096, "micro_batch": 1}, "policy": {"preset": "ddp"}}\n' \
    "$1" > "$work/s.json"
}
for cluster in '{"preset": "dgx-h100"}' '{"preset": "dgx-h200"}' '{"preset": "dgx-h100", "gpu": {"type": "h800-sxm"}}'; do
  scenario "$cluster"
  "$hzp" validate "$work/s.json" > "$work/resolved.json" 2>"$work/err" || fail "hzp validate $cluster: $(cat "$work/err")"
  out=$(python3 tools/flash_rate_table.py --check-h100 scenarios/validation/h100_kernels.json \
        --check-scenario "$work/resolved.json" "$run/attention.jsonl" "$run/gemm_shapes.jsonl" 2>&1) || fail "$cluster: $out"
done
echo "$out"
# A user's table replaces the type's, and survives the resolved scenario; a GPU without one resolves to [].
scenario '{"preset": "dgx-h100", "gpu": {"flash_attention_vs_gemm": [{"head_dim": 128, "seq": 4096, "fwd": 0.9, "bwd": 0.7}]}}'
"$hzp" validate "$work/s.json" > "$work/resolved.json" 2>"$work/err" || fail "hzp validate, own table: $(cat "$work/err")"
"$hzp" validate "$work/resolved.json" > "$work/again.json" 2>"$work/err" || fail "the resolved scenario: $(cat "$work/err")"
python3 - "$work/resolved.json" "$work/again.json" <<'PY' || fail "a user's table did not resolve to itself"
import json, sys
a, b = (json.load(open(p))["cluster"]["gpu"]["flash_attention_vs_gemm"] for p in sys.argv[1:])
assert a == b == [{"head_dim": 128, "seq": 4096.0, "fwd": 0.9, "bwd": 0.7}], (a, b)
PY
scenario '{"preset": "dgx-a100"}'
"$hzp" validate "$work/s.json" > "$work/resolved.json" 2>"$work/err" || fail "hzp validate dgx-a100: $(cat "$work/err")"
python3 -c 'import json, sys; assert json.load(open(sys.argv[1]))["cluster"]["gpu"]["flash_attention_vs_gemm"] == []' \
  "$work/resolved.json" || fail "dgx-a100 resolves to a flash table"
# A row run with dropout stays out of the table and is shown against the same shape without (its own rate).
cp "$run/attention.jsonl" "$work/dropout.jsonl"
printf '{"kernel": "torch-sdpa", "type": "bf16", "head_dim": 128, "seq": 4096, "dropout": 0.1, "forward_tflops": 1, "backward_tflops": 1}\n' \
  >> "$work/dropout.jsonl"
with=$(python3 tools/flash_rate_table.py "$work/dropout.jsonl" "$run/gemm_shapes.jsonl" 2>&1) || fail "a dropout row: $with"
without=$(python3 tools/flash_rate_table.py "$run/attention.jsonl" "$run/gemm_shapes.jsonl" 2>&1)
[ "$(grep -v dropout <<<"$with")" == "$without" ] || fail "a dropout row changed the table: $with"
grep -q "with attention dropout, head_dim 128 seq 4096: fwd / bwd x 0.00" <<<"$with" || fail "no dropout ratio: $with"
# Bad input: a missing file, an attention file without SDPA rows, a line that is not JSON, a dropout that is not
# a probability.
expect2() {  # pattern attention gemms
  local out code
  out=$(python3 tools/flash_rate_table.py "$2" "$3" 2>&1); code=$?
  [ "$code" -eq 2 ] || fail "exit $code (wanted 2) for $2 $3: $out"
  grep -q -- "$1" <<<"$out" || fail "no '$1' in the output for $2 $3: $out"
}
expect2 "cannot read" "$work/missing.jsonl" "$run/gemm_shapes.jsonl"
echo '{"kernel": "default", "type": "bf16"}' > "$work/no_sdpa.jsonl"
expect2 "no bf16 torch-sdpa rows" "$work/no_sdpa.jsonl" "$run/gemm_shapes.jsonl"
printf '{"kernel": "torch-sdpa", "type": "bf16", "head_dim": 128, "seq": 1024, "forward_tflops": 1, "backward_tflops": 1}\nnot json\n' \
  > "$work/bad.jsonl"
expect2 "bad.jsonl:2: not JSON" "$work/bad.jsonl" "$run/gemm_shapes.jsonl"
expect2 "cannot read" "$run/attention.jsonl" "$work/missing.jsonl"
printf '{"kernel": "torch-sdpa", "type": "bf16", "head_dim": 128, "seq": 1024, "dropout": 1.5, "forward_tflops": 1, "backward_tflops": 1}\n' \
  > "$work/bad_dropout.jsonl"
expect2 "bad_dropout.jsonl:1: an SDPA row whose dropout 1.5 is not a probability" "$work/bad_dropout.jsonl" \
  "$run/gemm_shapes.jsonl"
echo "flash_rate_table: ok"
