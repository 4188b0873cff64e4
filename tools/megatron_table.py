#!/usr/bin/env python3
"""Megatron-LM's weak-scaling table (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", Table 1) against hzp.

Simulates each scenarios/papers/megatron-gpt-*.json with `hzp simulate` and prints, per row, the paper's
TFLOP/s per GPU next to hzp's, both counted the paper's way (its Eq. 3: 96·B·s·l·h²·(1 + s/(6h) +
V/(16·l·h)) FLOPs per step, which includes the recomputed forward), the error, and the median and worst
|error|. The paper's rows are data for checking: nothing in hzp is fitted to them.

usage: python3 tools/megatron_table.py [--hzp build/hzp] [--jobs 2] [--estimate] [--markdown FILE]
                                      [--max-error PCT]

Exit status: 1 when a scenario fails to simulate or (with --max-error) a row's |error| exceeds PCT.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_input import check_executable, check_output_file, number, write_output_file  # noqa: E402

# Table 1: parameters (billions) -> (GPUs, global batch, TFLOP/s per GPU, % of peak).
PUBLISHED = {
    "1.7b": (32, 512, 137, 44),
    "3.6b": (64, 512, 138, 44),
    "7.5b": (128, 512, 142, 46),
    "18.4b": (256, 1024, 135, 43),
    "39.1b": (512, 1536, 138, 44),
    "76.1b": (1024, 1792, 140, 45),
    "145.6b": (1536, 2304, 148, 47),
    "310.1b": (1920, 2160, 155, 50),
    "529.6b": (2520, 2520, 163, 52),
    "1008b": (3072, 3072, 163, 52),
}


def paper_flops(model, batch, seq):
    """Narayanan et al. 2021, Eq. 3 (with activation recomputation)."""
    h, l, v = model["hidden"], model["layers"], model["vocab"]
    return 96 * batch * seq * l * h * h * (1 + seq / (6 * h) + v / (16 * l * h))


def run(hzp, path, estimate):
    with tempfile.TemporaryDirectory() as out:
        if estimate:
            cmd = [hzp, "plan", path, "--out", out]
        else:
            cmd = [hzp, "simulate", path, "--out", out, "--timeline-ranks", "1"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            return path, None, done.stderr.strip().splitlines()[-1:] or ["exit %d" % done.returncode]
        if estimate:
            with open(path) as f:
                preset = json.load(f)["policy"]["preset"]
            with open(os.path.join(out, "plan.json")) as f:
                plan = json.load(f)
            row = next(c for c in plan["candidates"] if c["policy"] == preset)
            return path, row["estimated_step_time_s"], []
        with open(os.path.join(out, "summary.json")) as f:
            return path, json.load(f)["step_time_s"], []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hzp", default="build/hzp")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--estimate", action="store_true", help="use the analytic estimator (hzp plan), not SimGrid")
    ap.add_argument("--markdown", help="also write the table to FILE")
    ap.add_argument("--max-error", type=number(0, 1e6), metavar="PCT",
                    help="exit 1 when any row's |error| is above PCT percent (a fidelity check)")
    args = ap.parse_args()
    if not 1 <= args.jobs <= 64:
        ap.error("--jobs must be 1 to 64")
    paths = sorted(glob.glob("scenarios/papers/megatron-gpt-*.json"), key=lambda p: float(p.split("-")[-1][:-6]))
    if not paths:
        sys.exit("megatron_table: no scenarios/papers/megatron-gpt-*.json (run from the repository root)")
    try:  # before any run: a table that cannot be written, or that would replace an input, is refused now
        check_executable(args.hzp, "--hzp")
        if args.markdown is not None:
            check_output_file(args.markdown, "--markdown", paths + [args.hzp])
    except ValueError as e:
        print(f"megatron_table: {e}", file=sys.stderr)
        return 2
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda p: run(args.hzp, p, args.estimate), paths))
    lines = ["| model | t | p | GPUs | batch | published TFLOP/s/GPU | hzp step (s) | hzp TFLOP/s/GPU | error |",
             "|---|---|---|---|---|---|---|---|---|"]
    errors = []
    for path, step, problem in results:
        with open(path) as f:
            doc = json.load(f)
        key = doc["model"]["name"].split("-")[-1]
        gpus, batch, published, _ = PUBLISHED[key]
        par = doc["policy"]["parallel"]
        if step is None:
            lines.append(f"| {key} | {par['tensor']} | {par['pipeline']} | {gpus} | {batch} | {published} | "
                         f"failed: {' '.join(problem)} | | |")
            continue
        tflops = paper_flops(doc["model"], batch, doc["training"]["seq_len"]) / step / gpus / 1e12
        err = 100 * (tflops - published) / published
        errors.append(abs(err))
        lines.append(f"| {key} | {par['tensor']} | {par['pipeline']} | {gpus} | {batch} | {published} | "
                     f"{step:.3f} | {tflops:.1f} | {err:+.1f} % |")
    summary = (f"rows: {len(errors)}, median |error| {statistics.median(errors):.1f} %, "
               f"worst {max(errors):.1f} %" if errors else "no row simulated")
    text = "\n".join(lines) + "\n\n" + summary + "\n"
    print(text, end="")
    if args.markdown is not None:
        write_output_file(args.markdown, text)
    if len(errors) != len(results):
        return 1
    if args.max_error is not None and max(errors) > args.max_error:
        print(f"megatron_table: worst |error| {max(errors):.1f} % is above --max-error {args.max_error:g} %",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
