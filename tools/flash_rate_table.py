#!/usr/bin/env python3
"""A GPU's flash-attention speed as a multiple of its GEMM rate, from one run that timed both:

    python3 tools/flash_rate_table.py [--peak-tflops 989] [--gemm-overhead-us 6.75] [--min-us 50]
                                      [--check-h100 TABLE] [--check-scenario RESOLVED.json] ATTENTION GEMMS

hzp times a causal flash-attention kernel's executed FLOPs (the unmasked half) at the GEMM rate times a
factor by head dimension and sequence length (cluster.gpu.flash_attention_vs_gemm), so that a framework's
calibrated GEMM rate carries over to its attention. This computes that factor, forward and backward, from
one run of `bench/gpu/check.sh attention gemm` on a GPU:
- ATTENTION: the attention stage's attention.jsonl; its PyTorch SDPA rows (`kernel` torch-sdpa, bf16), whose
  TFLOP/s count the causal half (forward 2·B·H·T²·d, backward 2.5 times that). Rows run with dropout
  (`"dropout"` above 0) are left out of the table; their speed over the same shape's without is printed.
- GEMMS: the gemm stage's gemm_shapes.jsonl; its whole (not chunked) bf16 products of --min-us or more give
  the GEMM rate e, the fraction of peak that best explains them with the calibration table's fixed cost per
  kernel (--gemm-overhead-us, tools/gemm_overhead_fit.py's least squares).
The factor is SDPA's TFLOP/s / (e x peak). It prints the table as rows of calibration.cc.

--check-h100 TABLE: an independent check, scenarios/validation/h100_kernels.json (SDPA and GEMMs timed on one
H100 in one run): its attention rows' factors against this table's at their shapes (interpolated as hzp does).
--check-scenario FILE: exit 1 unless FILE (`hzp validate`'s resolved scenario) holds this table in its
cluster.gpu.flash_attention_vs_gemm, each factor within 0.0005 (tests/flash_rate_table.sh). Exit 2 on bad input.
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemm_overhead_fit as gf  # noqa: E402
from json_input import jsonl_rows, load_json_input, number, read_regular_file  # noqa: E402


def fail(message):
    print(f"flash_rate_table: {message}", file=sys.stderr)
    sys.exit(2)


def sdpa_rows(path):
    """({(head_dim, seq): (fwd TFLOP/s, bwd TFLOP/s)} of the bf16 SDPA rows without dropout, the same of those
    with dropout (their probability is not part of the key))."""
    try:
        text = read_regular_file(path).decode()
    except (OSError, ValueError, UnicodeDecodeError) as e:
        fail(f"cannot read {path}: {e}")
    out, dropped = {}, {}
    try:
        rows = list(jsonl_rows(path, text))
    except ValueError as e:
        fail(str(e))
    for line_number, row in rows:
        if not isinstance(row, dict) or row.get("kernel") != "torch-sdpa" or row.get("type") != "bf16":
            continue
        dropout = row.get("dropout", 0)
        if not isinstance(dropout, (int, float)) or not 0 <= dropout < 1:
            fail(f"{path}:{line_number}: an SDPA row whose dropout {dropout!r} is not a probability")
        try:
            key = (int(row["head_dim"]), float(row["seq"]))
            fwd, bwd = float(row["forward_tflops"]), float(row["backward_tflops"])
        except (KeyError, TypeError, ValueError):
            fail(f"{path}:{line_number}: an SDPA row without numeric head_dim, seq, forward_tflops, backward_tflops")
        if min(key[0], key[1], fwd, bwd) <= 0:
            fail(f"{path}:{line_number}: an SDPA row with a size or speed of 0 or less")
        (dropped if dropout > 0 else out)[key] = (fwd, bwd)
    if not out:
        fail(f"{path}: no bf16 torch-sdpa rows (an attention stage's attention.jsonl)")
    return out, dropped


def interpolate(table, head_dim, seq):
    """hzp's flash_vs_gemm (calibration.cc): linear in log2(seq) within a head dimension, then in log2(head_dim)
    between the two nearest, clamped at the ends. `table`: {(head_dim, seq): (fwd, bwd)}."""
    def along_seq(hd):
        pts = sorted((s, v) for (h, s), v in table.items() if h == hd)
        if seq <= pts[0][0]:
            return pts[0][1]
        if seq >= pts[-1][0]:
            return pts[-1][1]
        for (s0, v0), (s1, v1) in zip(pts, pts[1:]):
            if s0 <= seq <= s1:
                w = (math.log2(seq) - math.log2(s0)) / (math.log2(s1) - math.log2(s0))
                return tuple(a + w * (b - a) for a, b in zip(v0, v1))
    dims = sorted({h for h, _ in table})
    if head_dim <= dims[0]:
        return along_seq(dims[0])
    if head_dim >= dims[-1]:
        return along_seq(dims[-1])
    for h0, h1 in zip(dims, dims[1:]):
        if h0 <= head_dim <= h1:
            w = (math.log2(head_dim) - math.log2(h0)) / (math.log2(h1) - math.log2(h0))
            return tuple(a + w * (b - a) for a, b in zip(along_seq(h0), along_seq(h1)))


def check_scenario(path, table):
    doc = load_json_input(path, "--check-scenario")
    got = doc.get("cluster", {}).get("gpu", {}).get("flash_attention_vs_gemm") if isinstance(doc, dict) else None
    if not isinstance(got, list):
        fail(f"{path}: no cluster.gpu.flash_attention_vs_gemm list (hzp validate's resolved scenario)")
    have = {}
    for p in got:
        try:
            have[(int(p["head_dim"]), float(p["seq"]))] = (float(p["fwd"]), float(p["bwd"]))
        except (KeyError, TypeError, ValueError):
            fail(f"{path}: a flash_attention_vs_gemm point without numeric head_dim, seq, fwd, bwd")
    problems = [f"head_dim {h} seq {s:g}: the scenario has {have.get((h, s))}, the run gives ({v[0]:.3f}, {v[1]:.3f})"
                for (h, s), v in sorted(table.items())
                if (h, s) not in have or max(abs(a - b) for a, b in zip(have[(h, s)], v)) > 0.0005]
    problems += [f"head_dim {h} seq {s:g}: in the scenario, not in the run" for h, s in sorted(set(have) - set(table))]
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("attention")
    ap.add_argument("gemms")
    ap.add_argument("--peak-tflops", type=number(0.001, 1e6), default=989.0, help="dense bf16 peak (H100, H200: 989)")
    ap.add_argument("--gemm-overhead-us", type=number(0, 1e3), default=6.75,
                    help="the calibration table's fixed cost per GEMM kernel (Hopper: 6.75)")
    ap.add_argument("--min-us", type=number(0, 1e6), default=50.0, help="drop products faster than this")
    ap.add_argument("--check-h100", metavar="TABLE", help="compare with h100_kernels.json's attention rows")
    ap.add_argument("--check-scenario", metavar="FILE", help="exit 1 unless FILE holds this table")
    args = ap.parse_args()
    peak = args.peak_tflops * 1e12
    attention, dropped = sdpa_rows(args.attention)
    products = [p for p in gf.products_of(args.gemms, whole_only=True) if p[2] >= args.min_us * 1e-6]
    if len(products) < 3:
        fail(f"{args.gemms}: {len(products)} whole bf16 products of {args.min_us:g} us or more; at least 3 needed")
    e = gf.rate_for(products, args.gemm_overhead_us * 1e-6, peak)
    if e is None:
        fail(f"a fixed cost of {args.gemm_overhead_us:g} us leaves the products no compute time")
    rate = e * args.peak_tflops
    table = {k: (f / rate, b / rate) for k, (f, b) in attention.items()}
    print(f"GEMM rate: e {e:.3f} of {args.peak_tflops:g} TFLOP/s ({len(products)} whole bf16 products of "
          f"{args.min_us:g} us or more, {args.gemm_overhead_us:g} us per kernel)")
    print("head_dim  seq     SDPA fwd / bwd TFLOP/s   fwd / bwd x GEMM rate")
    for (h, s), (f, b) in sorted(table.items()):
        print(f"{h:8d} {s:6.0f}   {attention[(h, s)][0]:8.1f} / {attention[(h, s)][1]:6.1f}          {f:.3f} / {b:.3f}")
    for (h, s), (f, b) in sorted(dropped.items()):
        if (h, s) in attention:
            print(f"with attention dropout, head_dim {h} seq {s:.0f}: fwd / bwd x {f / attention[(h, s)][0]:.3f} / "
                  f"{b / attention[(h, s)][1]:.3f} of the same shape without")
    print("calibration.cc rows:")
    print(",\n".join(f"    {{{h}, {s:.0f}, {f:.3f}, {b:.3f}}}" for (h, s), (f, b) in sorted(table.items())))
    if args.check_h100:
        doc = load_json_input(args.check_h100, "--check-h100")
        rows = doc.get("attention") if isinstance(doc, dict) else None
        if not isinstance(rows, list) or not rows:
            fail(f"{args.check_h100}: no \"attention\" list (h100_kernels.json's format)")
        h100 = gf.products_of(args.check_h100)
        e100 = gf.rate_for(h100, args.gemm_overhead_us * 1e-6, peak)
        print(f"check against {args.check_h100} (GEMM rate e {e100:.3f} with the same fixed cost):")
        for r in rows:
            try:
                hd, seq, fwd, bwd = int(r["head_dim"]), float(r["T"]), float(r["fwd_tflops"]), float(r["bwd_tflops"])
            except (KeyError, TypeError, ValueError):
                fail(f"{args.check_h100}: an attention row without numeric head_dim, T, fwd_tflops, bwd_tflops")
            mf, mb = fwd / (e100 * args.peak_tflops), bwd / (e100 * args.peak_tflops)
            tf, tb = interpolate(table, hd, seq)
            print(f"  head_dim {hd:3d} seq {seq:6.0f} B {r.get('B')}: measured {mf:.3f} / {mb:.3f}, "
                  f"table {tf:.3f} / {tb:.3f} ({100 * (tf / mf - 1):+.1f} % / {100 * (tb / mb - 1):+.1f} %)")
    if args.check_scenario:
        problems = check_scenario(args.check_scenario, table)
        if problems:
            print("flash_rate_table: the scenario's table is not this run's:\n  " + "\n  ".join(problems),
                  file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
