#!/usr/bin/env python3
"""Fidelity report: published training throughputs against hzp's simulation of the same runs.

    python3 tools/validate_rows.py [--hzp build/hzp] [--calibration ROWS.jsonl] [--jobs N] [--out DIR]
                                   [--json FILE] [--max-error PCT] [--min-ratio R --max-ratio R] ROWS.jsonl

Each row of ROWS.jsonl (the format of scenarios/validation/README.md: one published run per line, with its
model dimensions, GPUs, interconnect, batch, sharding and framework) becomes a scenario. Compute is
calibrated from ONE node only: for each row, the row of --calibration (default: the same file) that ran the
same model, GPU, sequence and micro-batch on a single node gives its throughput to `hzp calibrate`, and the
fitted efficiencies go into the row's scenario; everything beyond one node comes from the schedule and the
network model. Each scenario is simulated with `hzp simulate` in its own process, N at a time.

Prints per row: published and simulated tokens/s/GPU and the error; then the median and worst absolute
error over the multi-node rows, and, at each scale, the ratio of the hierarchical policy's throughput to the
flat one's (published vs simulated). Rows it cannot translate are listed with the reason.

--max-error PCT, --min-ratio / --max-ratio: exit 1 when the worst multi-node error exceeds PCT, or the
largest-scale hierarchical/flat ratio falls outside [min, max] (the fidelity test uses these). Exit 2 on a
bad command line or unreadable rows.
"""
import argparse
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

GPU_PRESETS = [  # (substring of the row's "gpu", cluster preset)
    ("A100", "dgx-a100"),
    ("A800", "a800"),
    ("H100", "dgx-h100"),
    ("H800", "h800"),
]


class Skip(Exception):
    """A row this tool cannot turn into a scenario (the message says why)."""


def leading_int(value, what):
    if isinstance(value, int):
        return value
    m = re.match(r"\s*(\d+)", str(value or ""))
    if not m:
        raise Skip(f"{what} {value!r} is not a number")
    return int(m.group(1))


def policy_of(row):
    """(policy JSON, family): family 'flat' or 'hierarchical' pairs rows for the ratio."""
    text = (row.get("zero_or_sharding") or "").lower()
    framework = (row.get("framework") or "").lower()
    comm = {"framework": "internevo"} if "internevo" in framework or "internlm" in framework else {}
    policy = {}
    if "hybrid zero-1" in text:
        m = re.search(r"within (\d+) ranks", text)
        if not m:
            raise Skip(f"hybrid ZeRO-1 without a group size: {row.get('zero_or_sharding')!r}")
        size = int(m.group(1))
        gpn = row["gpus_per_node"]
        if size % gpn and gpn % size:
            raise Skip(f"hybrid group of {size} does not tile nodes of {gpn}")
        group = [min(size, gpn), max(1, size // gpn)]
        policy = {"preset": "amsp", "sharding": {"params": [1, 1], "grads": [1, 1], "optimizer": group}}
        family = "hierarchical"
    elif "zero-1 over all" in text:
        policy = {"preset": "zero1"}
        family = "flat"
    else:
        raise Skip(f"sharding {row.get('zero_or_sharding')!r} is not translated yet")
    if comm:
        policy["comm"] = comm
    return policy, family


def nic_of(row):
    m = re.search(r"(\d+)\s*x\s*(\d+)\s*Gb", row.get("inter_node") or "")
    if not m:
        raise Skip(f"inter_node {row.get('inter_node')!r}: NIC count and rate not found")
    nic = {"per_node": int(m.group(1)), "bandwidth_Gbps": float(m.group(2))}
    return nic


def scenario_of(row, cluster_extra):
    """The scenario of a row on its own GPUs, without calibration; `cluster_extra`: more cluster fields
    (compute_spread, overlap_slowdown)."""
    for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "gpu_count", "gpus_per_node"):
        if row.get(key) is None:
            raise Skip(f"{key} not published")
    if row.get("tp", 1) not in (1, None) or row.get("pp", 1) not in (1, None):
        raise Skip("tensor / pipeline parallelism is not modelled yet")
    preset = next((p for sub, p in GPU_PRESETS if sub in (row.get("gpu") or "")), None)
    if preset is None:
        raise Skip(f"GPU {row.get('gpu')!r} has no cluster preset")
    gpus = row["gpu_count"]
    gpn = row["gpus_per_node"]
    if gpus % gpn:
        raise Skip(f"{gpus} GPUs are not whole nodes of {gpn}")
    micro = leading_int(row.get("micro_batch"), "micro_batch")
    accum = leading_int(row.get("grad_accum"), "grad_accum")
    policy, family = policy_of(row)
    recompute = (row.get("act_recompute") or "none").lower()
    doc = {
        "name": f"{row['id']}-{gpus}",
        "model": {
            "name": row.get("model", "model"), "family": "llama", "layers": row["layers"], "hidden": row["hidden"],
            "heads": row["heads"], "kv_heads": row.get("kv_heads") or row["heads"], "ffn_hidden": row["ffn"],
            "vocab": row["vocab"], "tied_embeddings": False,
        },
        "cluster": {"preset": preset, "nodes": gpus // gpn, "gpus_per_node": gpn, "nic": nic_of(row),
                    **cluster_extra},
        "training": {
            "seq_len": row["seq_len"], "micro_batch": micro, "global_batch_sequences": gpus * micro * accum,
            "precision": "bf16", "recompute": "none" if recompute.startswith("none") else "full",
            "flash_attention": bool(row.get("flash_attention", True)),
        },
        "policy": policy,
    }
    return doc, family


def config_key(row):
    """What a one-node calibration row must share with the row it calibrates."""
    return tuple(str(row.get(k)) for k in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "gpu",
                                           "gpus_per_node", "micro_batch", "framework"))


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


def calibrate(hzp, row, workdir, cluster_extra):
    doc, _ = scenario_of(row, cluster_extra)
    path = os.path.join(workdir, f"cal-{row['id']}.json")
    with open(path, "w") as f:
        json.dump(doc, f)
    out = path + ".fitted.json"
    r = run([hzp, "calibrate", path, "--tokens-per-gpu-s", str(row["tokens_per_s_per_gpu"]), "--out", out])
    if r.returncode != 0:
        raise Skip(f"calibration on {row['id']} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    with open(out) as f:
        return json.load(f)["cluster"]["efficiency"]


def simulate(hzp, doc, workdir):
    path = os.path.join(workdir, doc["name"] + ".json")
    with open(path, "w") as f:
        json.dump(doc, f)
    outdir = os.path.join(workdir, doc["name"])
    r = run([hzp, "simulate", path, "--timeline-ranks", "1", "--out", outdir])
    if r.returncode != 0:
        return None, (r.stderr or r.stdout).strip().splitlines()[-1:]
    with open(os.path.join(outdir, "summary.json")) as f:
        s = json.load(f)
    return s, None


def load_rows(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not JSON: {e}") from None
                if not isinstance(row, dict):
                    raise ValueError(f"{path}:{n}: a row must be a JSON object")
                rows.append(row)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("rows")
    ap.add_argument("--hzp", default="build/hzp")
    ap.add_argument("--calibration", help="one-node rows to calibrate from (default: ROWS itself)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", help="keep scenarios and summaries here (default: a temporary folder)")
    ap.add_argument("--json", help="write the report as JSON")
    ap.add_argument("--compute-spread", type=float, default=0.0,
                    help="cluster.compute_spread of every scenario (per-GPU speed variability; 0: identical GPUs)")
    ap.add_argument("--overlap-slowdown", type=float, default=0.0,
                    help="cluster.overlap_slowdown of every scenario (compute slowed while a collective of the "
                         "same GPU runs; 0: no interference)")
    ap.add_argument("--max-error", type=float)
    ap.add_argument("--min-ratio", type=float)
    ap.add_argument("--max-ratio", type=float)
    args = ap.parse_args()
    if args.jobs < 1 or args.jobs > 64:
        ap.error("--jobs must be in [1, 64]")
    if not 0 <= args.compute_spread <= 0.2:
        ap.error("--compute-spread must be in [0, 0.2]")
    if not 0 <= args.overlap_slowdown <= 1:
        ap.error("--overlap-slowdown must be in [0, 1]")
    try:
        rows = load_rows(args.rows)
        cal_rows = load_rows(args.calibration) if args.calibration else rows
    except (OSError, ValueError) as e:
        print(f"validate_rows: {e}", file=sys.stderr)
        return 2
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        return report_rows(args, rows, cal_rows, args.out)
    with tempfile.TemporaryDirectory(prefix="hzp-validate-") as workdir:
        return report_rows(args, rows, cal_rows, workdir)


def report_rows(args, rows, cal_rows, workdir):

    one_node = {}
    for r in cal_rows:
        if r.get("gpu_count") == r.get("gpus_per_node") and r.get("tokens_per_s_per_gpu"):
            one_node.setdefault(config_key(r), r)

    efficiencies = {}
    jobs, skipped = [], []
    for row in rows:
        try:
            extra = {"compute_spread": args.compute_spread, "overlap_slowdown": args.overlap_slowdown}
            doc, family = scenario_of(row, extra)
            cal = one_node.get(config_key(row))
            if cal is None:
                raise Skip("no one-node row of the same model, GPU, sequence and micro-batch to calibrate from")
            if cal["id"] not in efficiencies:
                efficiencies[cal["id"]] = calibrate(args.hzp, cal, workdir, extra)
            doc["cluster"]["efficiency"] = efficiencies[cal["id"]]
            jobs.append((row, doc, family, cal["id"]))
        except Skip as e:
            skipped.append((row.get("id"), str(e)))

    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(simulate, args.hzp, doc, workdir) for _, doc, _, _ in jobs]
        for (row, doc, family, cal_id), fut in zip(jobs, futures):
            summary, err = fut.result()
            if summary is None:
                skipped.append((row["id"], f"simulation failed: {err}"))
                continue
            published = float(row["tokens_per_s_per_gpu"])
            simulated = summary["tokens_per_gpu_per_s"]
            results.append({
                "id": row["id"], "gpus": row["gpu_count"], "family": family, "calibrated_on": cal_id,
                "multi_node": row["gpu_count"] > row["gpus_per_node"], "published_tgs": published,
                "simulated_tgs": simulated, "error_pct": 100 * (simulated - published) / published,
                "exposed_comm_s": summary.get("exposed_comm_s"), "step_time_s": summary.get("step_time_s"),
                "sim_wall_s": summary.get("sim_wall_s"),
            })

    print(f"{'row':6} {'GPUs':>5} {'policy':13} {'published':>9} {'hzp':>7} {'error':>7}  exposed comm")
    for r in sorted(results, key=lambda r: (r["family"], r["gpus"])):
        note = "  (calibration row)" if not r["multi_node"] else ""
        print(f"{r['id']:6} {r['gpus']:5d} {r['family']:13} {r['published_tgs']:9.0f} {r['simulated_tgs']:7.0f} "
              f"{r['error_pct']:+6.1f}%  {r['exposed_comm_s']:.3f} s{note}")
    multi = [abs(r["error_pct"]) for r in results if r["multi_node"]]
    report = {"rows": results, "skipped": [{"id": i, "why": w} for i, w in skipped], "ratios": []}
    if multi:
        report["median_abs_error_pct"] = statistics.median(multi)
        report["worst_abs_error_pct"] = max(multi)
        print(f"multi-node rows: {len(multi)}, median |error| {statistics.median(multi):.1f} %, "
              f"worst {max(multi):.1f} %")
    by_scale = {}
    for r in results:
        by_scale.setdefault(r["gpus"], {})[r["family"]] = r
    for gpus in sorted(by_scale):
        pair = by_scale[gpus]
        if "flat" in pair and "hierarchical" in pair:
            pub = pair["hierarchical"]["published_tgs"] / pair["flat"]["published_tgs"]
            sim = pair["hierarchical"]["simulated_tgs"] / pair["flat"]["simulated_tgs"]
            report["ratios"].append({"gpus": gpus, "published": pub, "simulated": sim})
            print(f"hierarchical / flat at {gpus:5d} GPUs: published {pub:.2f}x, hzp {sim:.2f}x "
                  f"({100 * (sim - pub) / pub:+.1f} %)")
    for i, why in skipped:
        print(f"skipped {i}: {why}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)

    failed = []
    if args.max_error is not None and multi and max(multi) > args.max_error:
        failed.append(f"worst multi-node error {max(multi):.1f} % > {args.max_error} %")
    if report["ratios"] and (args.min_ratio is not None or args.max_ratio is not None):
        top = report["ratios"][-1]["simulated"]
        if (args.min_ratio is not None and top < args.min_ratio) or (args.max_ratio is not None and top > args.max_ratio):
            failed.append(f"hierarchical/flat ratio {top:.2f} outside [{args.min_ratio}, {args.max_ratio}]")
    if (args.max_error is not None or args.min_ratio is not None) and not multi:
        failed.append("no multi-node row was simulated")
    for f in failed:
        print(f"validate_rows: FAILED: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
