#!/usr/bin/env python3
"""Collective fidelity report: published nccl-tests bus bandwidths against `hzp collective` on the same hardware.

    python3 tools/validate_collectives.py [--hzp build/hzp] [--jobs N] [--max-error PCT] [--json FILE] [ROWS.jsonl]

Each row of ROWS.jsonl (default scenarios/validation/nccl_tests_rows.jsonl: one published nccl-tests result per line,
with its source, hardware, operation, size and bus bandwidth) names in "hzp" the cluster that stands for its
hardware (a preset with overrides) and the algorithm / protocol the run forced, if any; rows whose algorithm
hzp does not model carry "hzp": {"not_modelled": "why"} and are listed, not simulated; rows whose hardware is
not fully known carry "reference_only": "why" beside their cluster and are simulated and shown, not scored.
Each simulated row runs `hzp collective --group all` at its size, in its own process, N at a time, and the
report prints published vs simulated bus bandwidth and the error, then the median and worst absolute error
over the scored rows of at least --min-bytes (default 1G: the bandwidth-bound sizes of training's
collectives) and, separately, over the smaller ones.

--max-error PCT: exit 1 when the worst error over the scored rows of at least --min-bytes exceeds PCT (the
fidelity test uses it). Exit 2 on a bad command line or unreadable rows.
"""
import argparse
import concurrent.futures
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_input import check_executable, check_output_file, number, read_regular_file, write_output_file  # noqa: E402


class BadRow(Exception):
    pass


# (field, low, high) of each number of a row; busbw_gbps must also be above 0 (it divides the error).
NUMBER_RANGES = (("gpus", 1, 2**20), ("gpus_per_node", 1, 2**10), ("message_bytes", 1, 2**50),
                 ("busbw_gbps", 0, 1e6))


def load_rows(path):
    try:
        text = read_regular_file(path, 64 << 20).decode("utf-8", errors="replace")
    except OSError as e:
        raise BadRow(f"{path}: {e.strerror}")
    except ValueError as e:
        raise BadRow(f"{path}: {e}")
    rows, seen = [], {}
    for n, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise BadRow(f"{path}:{n}: not JSON ({e.msg})")
        except RecursionError:
            raise BadRow(f"{path}:{n}: nested too deep to be a row")
        if not isinstance(row, dict):
            raise BadRow(f"{path}:{n}: a row must be a JSON object")
        for key, kind in (("id", str), ("op", str), ("gpus", int), ("gpus_per_node", int),
                          ("message_bytes", int), ("busbw_gbps", (int, float)), ("hzp", dict)):
            if not isinstance(row.get(key), kind) or isinstance(row.get(key), bool):
                raise BadRow(f"{path}:{n}: \"{key}\" missing or of the wrong type ({row.get(key)!r})")
        if not re.fullmatch(r"[A-Za-z0-9_.+-]{1,100}", row["id"]):
            raise BadRow(f"{path}:{n}: id must be 1 to 100 letters, digits or _.+- (it names files)")
        if row["id"] in seen:  # its files, and its line of the report, would be the other row's
            raise BadRow(f"{path}:{n}: row {row['id']}: id used already on line {seen[row['id']]}")
        seen[row["id"]] = n
        for key, low, high in NUMBER_RANGES:  # every number of a row: finite, in its range (nan fails all of them)
            value = row[key]
            if not (math.isfinite(value) and low <= value <= high) or (key == "busbw_gbps" and value <= 0):
                raise BadRow(f"{path}:{n}: row {row['id']}: {key} {value!r} is not in "
                             f"{'(' if key == 'busbw_gbps' else '['}{low:g}, {high:g}]")
        if row["gpus"] % row["gpus_per_node"]:
            raise BadRow(f"{path}:{n}: row {row['id']}: gpus {row['gpus']} must be a positive multiple of "
                         f"gpus_per_node {row['gpus_per_node']}")
        hzp = row["hzp"]
        for key in ("algorithm", "protocol", "not_modelled", "reference_only"):
            if key in hzp and not isinstance(hzp[key], str):  # algorithm and protocol go on hzp's command line
                raise BadRow(f"{path}:{n}: row {row['id']}: hzp.{key} {str(hzp[key])[:40]!r} is not a string")
        if "not_modelled" not in hzp and not isinstance(hzp.get("cluster"), dict):
            raise BadRow(f"{path}:{n}: \"hzp\" needs a \"cluster\" object or a \"not_modelled\" reason")
        rows.append(row)
    if not rows:  # an empty table checks nothing: bad input, not a pass
        raise BadRow(f"{path}: holds no rows")
    return rows


def simulate(hzp, workdir, row):
    """Bus bandwidth (GB/s) hzp gives for the row, and the algorithm/protocol it ran."""
    cluster = dict(row["hzp"]["cluster"])
    cluster["nodes"] = row["gpus"] // row["gpus_per_node"]
    cluster_file = os.path.join(workdir, row["id"] + ".json")
    with open(cluster_file, "w", encoding="utf-8") as f:
        json.dump(cluster, f)
    cmd = [hzp, "collective", "--cluster", cluster_file, "--op", row["op"], "--group", "all",
           "--bytes", str(row["message_bytes"])]
    if row["hzp"].get("algorithm"):
        cmd += ["--algorithm", row["hzp"]["algorithm"]]
    if row["hzp"].get("protocol"):
        cmd += ["--protocol", row["hzp"]["protocol"]]
    result_file = os.path.join(workdir, row["id"] + ".result.json")
    cmd += ["--json", result_file]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        return None, run.stderr.strip().splitlines()[-1] if run.stderr.strip() else f"exit {run.returncode}"
    with open(result_file, encoding="utf-8") as f:
        result = json.load(f)["rows"][-1]
    return result["busbw_GBps"], f"{result['algorithm']}/{result['protocol']}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    repo = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    ap.add_argument("rows", nargs="?", default=os.path.join(repo, "scenarios", "validation", "nccl_tests_rows.jsonl"),
                    help="published nccl-tests rows (default: the repo's scenarios/validation/nccl_tests_rows.jsonl)")
    ap.add_argument("--hzp", default=os.path.join(repo, "build", "hzp"))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--max-error", type=number(0, 1e6), help="fail when the worst scored |error| passes this %%")
    ap.add_argument("--min-bytes", type=int, default=2**30, help="smallest size scored against --max-error")
    ap.add_argument("--json", help="write the per-row results to FILE")
    args = ap.parse_args()
    if args.jobs < 1 or args.jobs > 64:
        ap.error("--jobs must be 1 to 64")
    if not 1 <= args.min_bytes <= 2**50:
        ap.error("--min-bytes must be 1 to 2^50")
    try:
        check_executable(args.hzp, "--hzp")
        rows = load_rows(args.rows)
        if args.json is not None:
            check_output_file(args.json, "--json", (args.rows, args.hzp))
    except (BadRow, ValueError) as e:
        print(f"validate_collectives: {e}", file=sys.stderr)
        return 2

    modelled = [r for r in rows if "not_modelled" not in r["hzp"]]
    with tempfile.TemporaryDirectory() as workdir, concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda r: simulate(args.hzp, workdir, r), modelled))

    print(f"{'row':24} {'op':14} {'GPUs':>5} {'size':>8} {'published':>9} {'hzp':>7} {'error':>7}  hzp ran")
    errors, small_errors, report, failed = [], [], [], 0
    for row, (busbw, how) in zip(modelled, results):
        size = f"{row['message_bytes'] / 2**20:.0f}M" if row["message_bytes"] < 2**30 else \
            f"{row['message_bytes'] / 2**30:.0f}G"
        if busbw is None:
            failed += 1
            print(f"{row['id']:24} {row['op']:14} {row['gpus']:5} {size:>8} {row['busbw_gbps']:9.1f}  FAILED: {how}")
            continue
        err = 100 * (busbw - row["busbw_gbps"]) / row["busbw_gbps"]
        reference = row["hzp"].get("reference_only")
        if not reference:
            (errors if row["message_bytes"] >= args.min_bytes else small_errors).append(abs(err))
        report.append({"id": row["id"], "published_busbw_gbps": row["busbw_gbps"], "hzp_busbw_gbps": busbw,
                       "error_pct": err, "hzp_ran": how})
        print(f"{row['id']:24} {row['op']:14} {row['gpus']:5} {size:>8} {row['busbw_gbps']:9.1f} {busbw:7.1f} "
              f"{err:+6.1f}%  {how}" + (f"  (reference only: {reference})" if reference else ""))
    for row in rows:
        if "not_modelled" in row["hzp"]:
            print(f"{row['id']:24} not compared: {row['hzp']['not_modelled']}")
    worst = max(errors) if errors else 0
    for name, errs in ((f">= {args.min_bytes} bytes", errors), (f"< {args.min_bytes} bytes", small_errors)):
        if errs:
            print(f"scored rows {name}: {len(errs)}, median |error| {statistics.median(errs):.1f} %, "
                  f"worst {max(errs):.1f} %")
    if args.json is not None:
        try:
            write_output_file(args.json, json.dumps(report, indent=1))
        except OSError as e:
            print(f"validate_collectives: --json {args.json}: {e.strerror}", file=sys.stderr)
            return 2
    if failed:
        print(f"validate_collectives: {failed} row(s) failed to simulate", file=sys.stderr)
        return 1
    if args.max_error is not None and not errors:
        print("validate_collectives: --max-error given but no row of at least --min-bytes was scored", file=sys.stderr)
        return 1
    if args.max_error is not None and worst > args.max_error:
        print(f"validate_collectives: worst error {worst:.1f} % exceeds --max-error {args.max_error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
