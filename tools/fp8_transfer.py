#!/usr/bin/env python3
"""FP8 from a bf16 calibration: does hzp's FP8 model predict what FP8 buys?

    python3 tools/fp8_transfer.py [--hzp build/hzp] [--max-error PCT] ROWS.jsonl

ROWS.jsonl holds one-node rows in the format of tools/validate_rows.py. Every pair of rows that ran the
same configuration once in bf16 and once in FP8 (the same model, GPU, sequence, micro-batch, framework,
parallel layout and recomputation as validate_rows reads it; their `other` settings equal once "Float8" is
taken out) is one check:
compute is calibrated on the bf16 row alone (`hzp calibrate`), the FP8 row's scenario gets those
efficiencies and `training.fp8`, and its simulated throughput is compared with the published one. For
reference the same scenario is also run with everything at the FP8 peak (what calibrating against the FP8
peak assumes) and without FP8.

Nothing here is fitted: the FP8 model (training.fp8, docs/model_math.md) has no constant of its own beyond
the GPU's datasheet FP8 peak. Exit 1 when a pair's error exceeds --max-error, 2 on bad input or no pair.
"""
import argparse
import copy
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import validate_rows as vr  # noqa: E402
from json_input import check_executable  # noqa: E402

PAIR_FIELDS = tuple(k for k in vr.CONFIG_FIELDS if k not in ("precision", "other", "act_recompute"))


def without_float8(text):
    return re.sub(r"\s*\+?\s*float8(\s+linears)?", "", str(text or ""), flags=re.IGNORECASE).strip()


def same_recompute(a, b):
    try:
        return vr.recompute_of(a)[0] == vr.recompute_of(b)[0]
    except vr.Skip:
        return False


def pairs_of(rows):
    """(bf16 row, FP8 row) for every FP8 row with a bf16 row of the same configuration."""
    def is_fp8(row):
        try:
            return vr.precision_of(row)[1]
        except vr.Skip:
            return None  # untranslated precision: in no pair
    found = []
    for fp8_row in (r for r in rows if is_fp8(r)):
        for bf16_row in (r for r in rows if is_fp8(r) is False):
            if (all(str(bf16_row.get(k)) == str(fp8_row.get(k)) for k in PAIR_FIELDS)
                    and same_recompute(bf16_row, fp8_row)
                    and without_float8(bf16_row.get("other")) == without_float8(fp8_row.get("other"))):
                found.append((bf16_row, fp8_row))
                break
    return found


def fp8_peak_tflops(hzp, doc, work):
    """The FP8 peak hzp's calibration table gives the scenario's GPU (the resolved scenario of hzp validate)."""
    path = os.path.join(work, doc["name"] + ".peak.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    r = vr.run([hzp, "validate", path])
    if r.returncode != 0:
        raise vr.Skip(f"hzp validate {path}: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return json.loads(r.stdout)["cluster"]["gpu"]["fp8_peak_tflops"]


def predict(hzp, bf16_row, fp8_row, work):
    """Tokens/s/GPU of the FP8 row calibrated on the bf16 one: {'fp8': training.fp8, 'all': every FLOP at the
    FP8 peak, 'none': no FP8}. Raises vr.Skip with the reason when a step fails."""
    doc, _, _ = vr.scenario_of(fp8_row, {})
    doc["cluster"]["efficiency"] = vr.calibrate(hzp, bf16_row, work, {})
    doc["training"]["fp8"] = True
    all_at_peak = copy.deepcopy(doc)
    all_at_peak["training"]["fp8"] = False
    all_at_peak["cluster"]["gpu"] = {"peak_tflops": fp8_peak_tflops(hzp, doc, work)}
    no_fp8 = copy.deepcopy(doc)
    no_fp8["training"]["fp8"] = False
    tgs = {}
    for name, d in (("fp8", doc), ("all", all_at_peak), ("none", no_fp8)):
        d["name"] = f"{fp8_row['id']}-{name}"
        summary, err = vr.simulate(hzp, d, work)
        if summary is None:
            raise vr.Skip(f"hzp simulate {d['name']}: {err}")
        tgs[name] = summary["tokens_per_gpu_per_s"]
    return tgs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rows")
    ap.add_argument("--hzp", default=os.path.join("build", "hzp"))
    ap.add_argument("--max-error", type=vr.number(0, 1e6), default=None)
    args = ap.parse_args()
    try:
        check_executable(args.hzp, "--hzp")
        rows = vr.load_rows(args.rows)
    except (OSError, ValueError) as e:
        print(f"fp8_transfer: {e}", file=sys.stderr)
        return 2
    pairs = pairs_of(rows)
    if not pairs:
        print(f"fp8_transfer: {args.rows}: no bf16 / FP8 pair of one configuration", file=sys.stderr)
        return 2
    worst = 0.0
    print(f"{'bf16 -> FP8':14s} {'published':>16s} {'hzp training.fp8':>17s} {'all at FP8 peak':>16s} "
          f"{'no FP8':>14s}")
    with tempfile.TemporaryDirectory() as work:
        for bf16_row, fp8_row in pairs:
            try:
                base, published = (vr.positive(r, "tokens_per_s_per_gpu") for r in (bf16_row, fp8_row))
                if base is None or published is None:
                    raise vr.Skip("both rows of a pair need tokens_per_s_per_gpu")
                tgs = predict(args.hzp, bf16_row, fp8_row, work)
            except vr.Skip as e:
                print(f"fp8_transfer: {bf16_row['id']} -> {fp8_row['id']}: {e}", file=sys.stderr)
                return 2

            def cell(x):
                return f"{x:7.0f} {100 * (x / published - 1):+6.1f}%"
            print(f"{bf16_row['id'] + ' -> ' + fp8_row['id']:14s} {base:7.0f} -> {published:6.0f} "
                  f"{cell(tgs['fp8']):>17s} {cell(tgs['all']):>16s} {cell(tgs['none']):>14s}")
            worst = max(worst, abs(100 * (tgs["fp8"] / published - 1)))
    print(f"pairs: {len(pairs)}, worst |error| with training.fp8: {worst:.1f} %")
    if args.max_error is not None and worst > args.max_error:
        print(f"fp8_transfer: worst error {worst:.1f} % exceeds --max-error {args.max_error:g} %", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
