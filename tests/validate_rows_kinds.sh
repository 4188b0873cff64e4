#!/usr/bin/env bash
# tools/validate_rows.py on every kind of published row it translates: the one-node rows of
# scenarios/validation/one_node_rows.jsonl (InternEvo with tensor parallelism, AMSP's DeepSpeed / MiCS / AMSP
# runs by MFU, torchtitan FSDP2 with context parallelism and FP8, NeMo / Megatron distributed optimizer,
# Megatron-FSDP) each calibrated on itself must simulate back to their published throughput within 2 %
# (the estimator that calibrates and the simulator agree), and only the two rows that publish no micro-batch
# may be skipped. tests/data/validate_rows_kinds.jsonl moves eleven of them to 64 GPUs (synthetic rows: the
# throughput is the one-node one) and names the policy each must become (expect_policy): every one is
# translated to it and simulated, calibrated on its own one-node row; two 70B rows with no one-node row of
# their own calibrate on the nearest one-node run of their GPU and framework (FP8 NeMo: R297) or, with a
# framework no row ran, on the preset's table efficiencies (one of them with 78 layers, split over its 4 x 5
# chunks with the embedding and loss counted as layers); a Mixtral 8x7B row (pp 4, ep 8) becomes a MoE
# model with expert parallelism; NVIDIA's Nemotron-4 15B and GPT-3 175B configurations become a squared-ReLU
# and a GPT (GELU, biases, learned positions, tied head, NeMo's dropout 0.1) model. The torchtitan and Megatron-FSDP rows reduce their gradients in fp32.
# Usage: bash tests/validate_rows_kinds.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
work="$(mktemp -d "${TMPDIR:-/tmp}/hzp-validate-kinds.XXXXXX")"
trap 'rm -rf "$work"' EXIT
fail() { echo "validate_rows_kinds: FAILED: $*"; exit 1; }

python3 tools/validate_rows.py --hzp "$hzp" --jobs 2 --json "$work/one.json" \
  scenarios/validation/one_node_rows.jsonl >"$work/one.txt" 2>&1 || fail "one-node rows: $(cat "$work/one.txt")"
python3 tools/validate_rows.py --hzp "$hzp" --jobs 2 --json "$work/kinds.json" \
  --calibration scenarios/validation/one_node_rows.jsonl tests/data/validate_rows_kinds.jsonl \
  >"$work/kinds.txt" 2>&1 || fail "scaled rows: $(cat "$work/kinds.txt")"
python3 - "$work/one.json" "$work/kinds.json" tests/data/validate_rows_kinds.jsonl <<'PY' || fail "see above"
import json, sys
one, kinds = (json.load(open(p)) for p in sys.argv[1:3])
data = {r["id"]: r for r in map(json.loads, open(sys.argv[3]))}
expect = {i: r["expect_policy"] for i, r in data.items()}
bad = []
skipped = {s["id"]: s["why"] for s in one["skipped"]}
if set(skipped) != {"R340", "R341"} or any("micro_batch not published" not in w for w in skipped.values()):
    bad.append(f"one-node rows skipped: {skipped} (only R340 and R341, which publish no micro-batch)")
if len(one["rows"]) != 22:
    bad.append(f"{len(one['rows'])} one-node rows simulated, not 22")
for r in one["rows"]:
    if abs(r["error_pct"]) > 2:
        bad.append(f"{r['id']} calibrated on itself simulates {r['error_pct']:+.1f} % off its published value")
if kinds["skipped"]:
    bad.append(f"scaled rows skipped: {kinds['skipped']}")
for r in kinds["rows"]:
    if r["policy"] != expect[r["id"]]:
        bad.append(f"{r['id']} became {r['policy']}, not {expect[r['id']]}")
    for key, field in (("expect_mlp", "mlp"), ("expect_family", "model_family"),
                       ("expect_hidden_dropout", "hidden_dropout"), ("expect_attention_dropout", "attention_dropout")):
        if key in data[r["id"]] and r[field] != data[r["id"]][key]:
            bad.append(f"{r['id']} became model {field} {r[field]}, not {data[r['id']][key]}")
    want = data[r["id"]].get("expect_calibrated_on", "R" + r["id"][1:].split("-")[0])
    if not r["multi_node"] or r["calibrated_on"] != want:
        bad.append(f"{r['id']} calibrated on {r['calibrated_on']}, not {want}")
missing = set(expect) - {r["id"] for r in kinds["rows"]}
if missing:
    bad.append(f"not simulated: {sorted(missing)}")
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
PY
echo "validate_rows_kinds: ok"
