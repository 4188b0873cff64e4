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
from json_input import jsonl_rows, number, read_regular_file  # noqa: E402

PRODUCTS = ("fwd_tflops", "dgrad_tflops", "wgrad_tflops")


def fail(message):
    print(f"gemm_overhead_fit: {message}", file=sys.stderr)
    sys.exit(2)


def products_of(path, whole_only=False, dtype="bf16"):
    """(flops, bytes, seconds) of every timed product of `dtype` in the table; `whole_only`: not a tensor-overlap
    chunk's."""
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
    except RecursionError:
        fail(f"{path}: nested too deep to be a table")
    except json.JSONDecodeError:
        try:
            rows = [row for _, row in jsonl_rows(path, text)
                    if isinstance(row, dict) and row.get("type", "bf16") == dtype and not (whole_only and row.get("chunk"))]
        except ValueError as e:
            fail(str(e))
    points = []
    for i, row in enumerate(rows):
        try:
            m, k, n = (float(row[key]) for key in ("m", "k", "n"))
        except (KeyError, TypeError, ValueError):
            fail(f"{path}: gemm row {i} has no numeric m, k and n")
        if min(m, k, n) <= 0:
            fail(f"{path}: gemm row {i} has a size of 0 or less")
        flops, operands = 2 * m * k * n, (1 if dtype == "fp8" else 2) * (m * k + k * n + m * n)
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


def rate_for(points, t0, peak):
    """The GEMM rate e (fraction of peak) that best explains the products with the fixed cost t0: 1/e by
    least squares on the relative error; None when t0 leaves them no compute time."""
    sxx = sxt = 0.0
    for flops, _, t in points:
        x = flops / peak
        sxx += x * x / (t * t)
        sxt += x * (t - t0) / (t * t)
    return sxx / sxt if sxt > 0 else None


def fit(points, peak, hbm, with_t0=True):
    """(e, t0): t0 on a 0.05 us grid; for each, 1/e by weighted least squares on the compute-bound points."""
    best = None
    for step in range(0, 401 if with_t0 else 1):  # 0 .. 20 us
        t0 = step * 0.05e-6
        e = rate_for(points, t0, peak)
        if e is None:
            continue
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
    ap.add_argument("--fp8-vs-bf16", type=number(0, 1e3), metavar="T0_US",
                    help="also: the table's whole fp8 products (a gemm stage's gemm_shapes.jsonl) against its whole "
                         "bf16 ones, each one GEMM rate with the fixed cost T0_US: FP8's fraction of --fp8-peak-tflops "
                         "over bf16's fraction of --peak-tflops (cluster.gpu.fp8_gemm_vs_bf16)")
    ap.add_argument("--fp8-peak-tflops", type=number(0.001, 1e6), default=1979.0, help="dense FP8 peak (H100: 1979)")
    ap.add_argument("--check-fp8", type=number(0, 10), help="with --fp8-vs-bf16: exit 1 unless it is this (within 0.005)")
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
    if args.fp8_vs_bf16 is not None:
        t0_fixed = args.fp8_vs_bf16 * 1e-6
        rates = []
        for dtype, dtype_peak in (("bf16", peak), ("fp8", args.fp8_peak_tflops * 1e12)):
            pts = [p for p in products_of(args.table, whole_only=True, dtype=dtype) if p[2] >= args.min_us * 1e-6]
            e_dtype = rate_for(pts, t0_fixed, dtype_peak) if len(pts) >= 3 else None
            if e_dtype is None:
                fail(f"{len(pts)} whole {dtype} products of {args.min_us} us or more with compute time left; "
                     "at least 3 needed")
            rates.append(e_dtype)
            print(f"  {dtype}: e {e_dtype:.3f} of its peak ({len(pts)} whole products, {args.fp8_vs_bf16:g} us each)")
        ratio = rates[1] / rates[0]
        print(f"fp8_gemm_vs_bf16 {ratio:.3f}")
        if args.check_fp8 is not None and abs(ratio - args.check_fp8) > 0.005 + 1e-9:
            print(f"gemm_overhead_fit: the table gives fp8_gemm_vs_bf16 {ratio:.3f}, the calibration table "
                  f"{args.check_fp8}", file=sys.stderr)
            return 1
    if args.check_us is not None and abs(t0 * 1e6 - args.check_us) > 0.05 + 1e-9:
        print(f"gemm_overhead_fit: the fit gives {t0 * 1e6:.2f} us, the calibration table {args.check_us} us",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
