#!/usr/bin/env bash
# The calibration table's fixed cost per GEMM kernel for Hopper (cluster.gpu.gemm_overhead_us, as `hzp validate`
# resolves dgx-h100, dgx-h200 and an h800-sxm cluster) is what tools/gemm_overhead_fit.py fits to the H100 table in
# scenarios/validation/h100_kernels.json; its FP8 GEMMs' efficiency against bf16 (cluster.gpu.fp8_gemm_vs_bf16) is
# what the tool measures on the H200 run that timed the dev-row models' products both ways
# (bench/gpu/results/2026-11-27b-h200/gemm_shapes.jsonl); and the fit tool refuses bad input (exit 2, the file named).
# Usage: bash tests/gemm_overhead_fit.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
work="$(mktemp -d "${TMPDIR:-/tmp}/hzp-gemm-fit.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "gemm_overhead_fit: FAILED: $*"; exit 1; }
table=scenarios/validation/h100_kernels.json
for cluster in '{"preset": "dgx-h100"}' '{"preset": "dgx-h200"}' '{"preset": "dgx-h100", "gpu": {"type": "h800-sxm"}}'; do
  printf '{"model": {"preset": "llama2-7b"}, "cluster": %s, "training": {"seq_len": 4096, "micro_batch": 1}, "policy": {"preset": "ddp"}}\n' \
    "$cluster" > "$work/s.json"
  us=$("$hzp" validate "$work/s.json" 2>"$work/err" | python3 -c 'import json, sys; print(json.load(sys.stdin)["cluster"]["gpu"]["gemm_overhead_us"])') ||
    fail "no cluster.gpu.gemm_overhead_us in hzp validate's output for $cluster: $(cat "$work/err")"
  out=$(python3 tools/gemm_overhead_fit.py --check-us "$us" "$table" 2>&1) || fail "$cluster: $out"
  fp8=$("$hzp" validate "$work/s.json" 2>"$work/err" | python3 -c 'import json, sys; print(json.load(sys.stdin)["cluster"]["gpu"]["fp8_gemm_vs_bf16"])') ||
    fail "no cluster.gpu.fp8_gemm_vs_bf16 in hzp validate's output for $cluster: $(cat "$work/err")"
  out_fp8=$(python3 tools/gemm_overhead_fit.py --min-us 50 --fp8-vs-bf16 "$us" --check-fp8 "$fp8" \
            bench/gpu/results/2026-11-27b-h200/gemm_shapes.jsonl 2>&1) || fail "$cluster: $out_fp8"
done
echo "$out"
echo "$out_fp8" | tail -3
# Bad input: a missing table, one that is not a table, rows without sizes.
expect2() {  # pattern file
  local out code
  out=$(python3 tools/gemm_overhead_fit.py "$2" 2>&1); code=$?
  [ "$code" -eq 2 ] || fail "exit $code (wanted 2) for $2: $out"
  grep -q -- "$1" <<<"$out" || fail "no '$1' in the output for $2: $out"
}
expect2 "cannot read" "$work/missing.json"
echo '{"gemm": 3}' > "$work/no_rows.json"
expect2 'without a "gemm" list' "$work/no_rows.json"
echo '{"gemm": [{"m": 1, "k": "x", "n": 2, "fwd_tflops": 3}]}' > "$work/bad_row.json"
expect2 "gemm row 0 has no numeric m, k and n" "$work/bad_row.json"
printf '{"type": "bf16", "m": 1}\nnot json\n' > "$work/bad.jsonl"
expect2 "bad.jsonl:2: not JSON" "$work/bad.jsonl"
echo "gemm_overhead_fit: ok"
