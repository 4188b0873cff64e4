#!/usr/bin/env python3
"""What a tensor-parallel overlap costs its GEMMs, from `bench/gpu/check.sh overlap`'s rows:

    python3 tools/overlap_table.py [--sms 132] GEMM_SHAPES

GEMM_SHAPES: gemm_shapes.jsonl rows timed beside a copy kernel (`gemm_shapes.py --copy-sms N`: "copy_sms" above
0), whole products and the chunks a tensor-parallel overlap runs (`"chunk": true`, tokens / tensor rows). Per
(type, model, tokens, copy SMs, tensor degree), summed over a layer's products and their forward, input-gradient
and weight-gradient passes (each GEMM weighted by its time, so the ratios are of a layer's GEMM time):
- whole beside / alone: the whole products' time alone over their time beside the copy (the SMs a
  communication kernel holds);
- the same predicted by those SMs' share alone, 1 - copy_sms / --sms (H100 and H200: 132 SMs);
- chunks alone / whole: the whole products' time over `parts` x their chunk's time, each alone (what
  splitting a product costs);
- chunks beside / whole: the same with the chunks beside the copy (both at once: a reduce-scatter kernel
  beside a chunked product for its whole duration).
sim/README.md's table ("Tensor overlap") is this tool on bench/gpu/results/2026-11-28-h200/overlap_gemm_shapes.jsonl.
Exit 2 on unreadable input or a row without the fields it needs.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_input import jsonl_rows, number, read_regular_file  # noqa: E402

KINDS = ("fwd", "dgrad", "wgrad")


def fail(message):
    print(f"overlap_table: {message}", file=sys.stderr)
    sys.exit(2)


def seconds(row, kind, beside, where):
    """Seconds of one pass (`kind`) of the row's product, alone or beside the copy; None if it was not timed
    (FP8 rows time the forward only)."""
    key = f"{kind}_tflops" + ("_beside_copy" if beside else "")
    if key not in row:
        return None
    rate = row[key]
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0:
        fail(f"{where}: {key} {rate!r} is not a positive number")
    return 2.0 * row["m"] * row["n"] * row["k"] / (rate * 1e12)


def read_rows(path):
    """{(type, model, tokens, copy_sms, tensor): {"whole": {op: row}, "chunk": {op: (row, where)}}}."""
    try:
        text = read_regular_file(path).decode()
        rows = list(jsonl_rows(path, text))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        fail(f"cannot read {path}: {e}")
    groups = {}
    for line, row in rows:
        where = f"{path}:{line}"
        if not isinstance(row, dict) or not row.get("copy_sms"):
            continue  # a row timed beside PyTorch's full copy, or none: not this table's
        try:
            key = (str(row["type"]), str(row["model"]), int(row["tokens"]), int(row["copy_sms"]), int(row["tensor"]))
            for dim in ("m", "n", "k"):
                if isinstance(row[dim], bool) or not isinstance(row[dim], int) or row[dim] <= 0:
                    raise ValueError(f"{dim} {row[dim]!r}")
            op, chunk = str(row["op"]), row["chunk"]
            if not isinstance(chunk, bool):
                raise ValueError(f"chunk {chunk!r}")
        except (KeyError, TypeError, ValueError) as e:
            fail(f"{where}: a row without integer type/model/tokens/copy_sms/tensor/m/n/k, op and a boolean chunk ({e})")
        groups.setdefault(key, {"whole": {}, "chunk": {}})["chunk" if chunk else "whole"][op] = (row, where)
    if not groups:
        fail(f"{path}: no rows timed beside a copy kernel (copy_sms above 0: `check.sh overlap`)")
    return groups


def ratios(group):
    """(whole beside / alone, chunks alone / whole, chunks beside / whole); the chunk ratios None at tensor 1."""
    whole_alone = whole_beside = chunk_alone = chunk_beside = 0.0
    chunked_whole = 0.0  # the whole products' time, of the ops that have a chunk row
    for op, (whole, where) in group["whole"].items():
        chunk = group["chunk"].get(op)
        for kind in KINDS:
            alone = seconds(whole, kind, False, where)
            if alone is None:
                continue
            beside = seconds(whole, kind, True, where)
            if beside is None:
                fail(f"{where}: {kind}_tflops without {kind}_tflops_beside_copy")
            whole_alone += alone
            whole_beside += beside
            if chunk is None:
                continue
            row, chunk_where = chunk
            parts = whole["m"] / row["m"]
            pair = seconds(row, kind, False, chunk_where), seconds(row, kind, True, chunk_where)
            if None in pair:
                fail(f"{chunk_where}: the chunk has no {kind} pass alone and beside the copy, as its whole product has")
            chunk_alone += parts * pair[0]
            chunk_beside += parts * pair[1]
            chunked_whole += alone
    if whole_alone <= 0:
        return None
    chunks = (chunked_whole / chunk_alone, chunked_whole / chunk_beside) if chunk_alone > 0 else (None, None)
    return whole_alone / whole_beside, chunks[0], chunks[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("gemm_shapes")
    ap.add_argument("--sms", type=number(1, 1e4), default=132.0, help="the GPU's SMs (H100, H200: 132)")
    args = ap.parse_args()
    groups = read_rows(args.gemm_shapes)

    def cell(x):
        return "-" if x is None else f"{x:.3f}"

    print("| type | model | tokens | copy SMs | tensor | whole beside / alone | SM share | chunks alone / whole "
          "| chunks beside / whole |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for key in sorted(groups):
        r = ratios(groups[key])
        if r is None:
            continue
        kind, model, tokens, sms, tensor = key
        share = 1 - sms / args.sms
        print(f"| {kind} | {model} | {tokens} | {sms} | {tensor} | {cell(r[0])} | {share:.3f} | {cell(r[1])} "
              f"| {cell(r[2])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
