#!/usr/bin/env python3
"""The GEMM model's two constants for a GPU, fitted to one GPU's table of bf16 products by shape:

    python3 tools/gemm_overhead_fit.py [--peak-tflops 989] [--hbm-GBps 3350] [--memory-bound 0.80]
                                       [--min-us 0] [--check-us US] TABLE

hzp times a compute op's GEMMs as max(FLOPs / (peak x gemm), operand bytes / (HBM x memory_bound)) plus a
fixed cost per GEMM kernel (cluster.gpu.gemm_overhead_us): a product's efficiency then falls with its size
as measured tables show it (small hidden sizes, few rows per expert, a tensor-parallel chunk). This fits the
two per-GPU constants of that model, the GEMM rate's fraction of peak `e` and the fixed cost `t0`, by least
squares on the relative error of every product's time (forward, input gradient and weight gradient each one
point), t0 on a 0.05 us grid, and prints the fit and how well each model (with t0, and with t0 = 0) explains
the table. Only `t0` enters the calibration table: the GEMM efficiency of a training run is a framework's, fitted from
one node (`hzp calibrate`).

TABLE: scenarios/validation/h100_kernels.json (its "gemm" rows: m, k, n and fwd/dgrad/wgrad TFLOP/s) or a
bench/gpu/check.sh gemm stage's gemm_shapes.jsonl (its bf16 rows). --min-us drops products faster than that
(timed with the host's launch gap, when the benchmark did not queue them). --check-us: exit 1 unless the fitted
t0 is within 0.05 us of US (the calibration table's value: tests/gemm_overhead_fit.sh). Exit 2 on bad input.
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_input import number, read_regular_file  # noqa: E402

PRODUCTS = ("fwd_tflops", "dgrad_tflops", "wgrad_tflops")


def fail(message):
    print(f"gemm_overhead_fit: {message}", file=sys.stderr)
    sys.exit(2)


def products_of(path):
    """(flops, bytes, seconds) of every timed product in the table."""
    try:
        text = read_regular_file(path).decode()
    except (OSError, ValueError, UnicodeDecodeError) as e:
        fail(f"cannot read {path}: {e}")
    rows = []
    try:
        doc = json.loads(text)
        if not isinstance(doc, dict) or not isinstance(doc.get("gemm"), list):
            fail(f"{path}: a JSON document without a \"gemm\" list (h100_kernels.json's format)")
        rows = doc["gemm"]
    except json.JSONDecodeError:
        for number_, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                fail(f"{path}:{number_}: not JSON ({e.msg})")
            if isinstance(row, dict) and row.get("type", "bf16") == "bf16":
                rows.append(row)
    points = []
    for i, row in enumerate(rows):
        try:
            m, k, n = (float(row[key]) for key in ("m", "k", "n"))
        except (KeyError, TypeError, ValueError):
            fail(f"{path}: gemm row {i} has no numeric m, k and n")
        if min(m, k, n) <= 0:
            fail(f"{path}: gemm row {i} has a size of 0 or less")
        flops, operands = 2 * m * k * n, 2 * (m * k + k * n + m * n)  # bf16 operands
        for key in PRODUCTS:
            tflops = row.get(key)
            if isinstance(tflops, (int, float)) and tflops > 0:
                points.append((flops, operands, flops / (tflops * 1e12)))
    if len(points) < 3:
        fail(f"{path}: {len(points)} timed products; the fit needs at least 3")
    return points


def model_s(point, e, t0, peak, hbm):
    flops, operands, _ = point
    return max(flops / (peak * e), operands / hbm) + t0


def errors(points, e, t0, peak, hbm):
    return [model_s(p, e, t0, peak, hbm) / p[2] - 1 for p in points]


def fit(points, peak, hbm, with_t0=True):
    """(e, t0): t0 on a 0.05 us grid; for each, 1/e by weighted least squares on the compute-bound points."""
    best = None
    for step in range(0, 401 if with_t0 else 1):  # 0 .. 20 us
        t0 = step * 0.05e-6
        sxx = sxt = 0.0
        for flops, _, t in points:
            x = flops / peak
            sxx += x * x / (t * t)
            sxt += x * (t - t0) / (t * t)
        if sxt <= 0:
            continue
        e = sxx / sxt
        score = sum(r * r for r in errors(points, e, t0, peak, hbm))
        if best is None or score < best[0]:
            best = (score, e, t0)
    if best is None:
        fail("no fixed cost up to 20 us leaves the products any compute time")
    return best[1], best[2]


def summary(points, e, t0, peak, hbm):
    r = sorted(abs(x) for x in errors(points, e, t0, peak, hbm))
    p90 = r[min(len(r) - 1, int(0.9 * len(r)))]
    bound = sum(1 for p in points if p[1] / hbm > p[0] / (peak * e))
    return (f"e {e:.3f}, t0 {t0 * 1e6:.2f} us: |error| median {100 * statistics.median(r):.1f} %, "
            f"p90 {100 * p90:.1f} %, worst {100 * r[-1]:.1f} % ({bound} of {len(points)} products bytes-bound)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("table")
    ap.add_argument("--peak-tflops", type=number(0.001, 1e6), default=989.0, help="dense bf16 peak (H100: 989)")
    ap.add_argument("--hbm-GBps", type=number(0.1, 1e6), default=3350.0, help="HBM bandwidth (H100 SXM: 3350)")
    ap.add_argument("--memory-bound", type=number(0.01, 1), default=0.80,
                    help="fraction of HBM bandwidth (calibration.cc's kMemoryBoundEff)")
    ap.add_argument("--min-us", type=number(0, 1e6), default=0.0, help="drop products faster than this")
    ap.add_argument("--check-us", type=number(0, 1e3), help="exit 1 unless the fitted t0 is this (within 0.05)")
    args = ap.parse_args()
    peak, hbm = args.peak_tflops * 1e12, args.hbm_GBps * 1e9 * args.memory_bound
    points = [p for p in products_of(args.table) if p[2] >= args.min_us * 1e-6]
    if len(points) < 3:
        fail(f"{len(points)} products of {args.min_us} us or more; the fit needs at least 3")
    e, t0 = fit(points, peak, hbm)
    e_flat, _ = fit(points, peak, hbm, with_t0=False)
    print(f"{args.table}: {len(points)} products")
    print(f"  fitted:          {summary(points, e, t0, peak, hbm)}")
    print(f"  no fixed cost:   {summary(points, e_flat, 0.0, peak, hbm)}")
    print(f"gemm_overhead_us {t0 * 1e6:.2f}")
    if args.check_us is not None and abs(t0 * 1e6 - args.check_us) > 0.05 + 1e-9:
        print(f"gemm_overhead_fit: the fit gives {t0 * 1e6:.2f} us, the calibration table {args.check_us} us",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
