#!/usr/bin/env python3
"""Checks and tables of bench/gpu/check.sh, over the outputs of `hzp train` (metrics.jsonl, memory_rank<r>.json)
and bench/gpu/torch_gpu.py. Each check prints one line starting with PASS or FAIL and exits 0 / 1.

    compare.py falls OUT_DIR [MIN_DROP]            the training loss falls by MIN_DROP nats (default 1.0)
    compare.py close OUT_A OUT_B TOL [STEPS]       the first STEPS losses (default all) agree within TOL (relative)
    compare.py memory OUT_DIR RANKS                each state category and pool within 5 % of the core's model
    compare.py bench HZP_DIR TORCH_JSONL SCENARIO  one row of the speed table (JSON line) from both sides
    compare.py table ROWS_JSONL                     the markdown table of bench rows
"""
import json
import os
import sys


def losses(out):
    rows = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    return [r for r in rows if "loss" in r]


def falls(out, min_drop=1.0):
    ls = [r["loss"] for r in losses(out)]
    drop = ls[0] - min(ls[-5:])
    ok = drop >= min_drop
    print(f"{'PASS' if ok else 'FAIL'} loss falls: {ls[0]:.4f} -> {ls[-1]:.4f} over {len(ls)} steps (drop {drop:.3f}, "
          f"needs {min_drop})")
    return ok


def close(a, b, tol, steps=None):
    la, lb = losses(a), losses(b)
    n = min(len(la), len(lb)) if steps is None else int(steps)
    worst = max(abs(la[i]["loss"] - lb[i]["loss"]) / abs(la[i]["loss"]) for i in range(n))
    ok = worst <= tol and len(la) >= n and len(lb) >= n
    print(f"{'PASS' if ok else 'FAIL'} {os.path.basename(a)} vs {os.path.basename(b)}: worst relative loss difference "
          f"{worst:.3g} over {n} steps (tolerance {tol})")
    return ok


def memory(out, ranks):
    ok = True
    worst = 0.0
    for r in range(int(ranks)):
        m = json.load(open(os.path.join(out, f"memory_rank{r}.json")))
        got, model = m["measured"], m["model"]
        pairs = [(c, got.get(c, 0.0), model[c]) for c in ("params", "grads", "optimizer")]
        pairs += [("pool:" + p, got.get("pool:" + p, 0.0), v) for p, v in model["pools"].items()]
        for name, g, want in pairs:
            err = abs(g - want) / want if want else abs(g)
            worst = max(worst, err)
            if err > 0.05:
                ok = False
                print(f"  rank {r} {name}: measured {g:.0f} bytes, model {want:.0f}")
    print(f"{'PASS' if ok else 'FAIL'} memory of {out}: every category within {100 * worst:.2f} % of the core's model")
    return ok


def bench(hzp_dir, torch_jsonl, scenario):
    sc = json.load(open(scenario))
    m, tr = sc["model"], sc["training"]
    tokens_per_step = tr["seq_len"] * tr["micro_batch"]
    steps = losses(hzp_dir)[5:]
    tok = tokens_per_step * len(steps) / sum(r["seconds"] for r in steps)
    mem = json.load(open(os.path.join(hzp_dir, "memory_rank0.json")))["measured"]
    active = None
    torch_rows = [json.loads(l) for l in open(torch_jsonl) if l.startswith("{")]
    for t in torch_rows:
        active = t["active"]
    flops = 6 * active + 12 * m["layers"] * m["hidden"] * tr["seq_len"]
    row = {"model": sc["name"], "hzp_tokens_per_s": tok, "hzp_mfu": tok * flops / 989e12,
           "hzp_pool_GiB": sum(mem.values()) / 2**30}
    for t in torch_rows:
        key = "torch_compiled" if t["compile"] else "torch_eager"
        row[key + "_tokens_per_s"] = t["tokens_per_s"]
        row[key + "_mfu"] = t["mfu"]
        row[key + "_peak_GiB"] = t["peak_mem_GiB"]
        row["device"] = t["device"]
    print(json.dumps(row))
    return True


def table(rows_jsonl):
    rows = [json.loads(l) for l in open(rows_jsonl)]
    print("| model | hzp tok/s | MFU | memory GiB (pool) | torch eager tok/s | MFU | peak GiB | hzp / eager | "
          "torch.compile tok/s | hzp / compiled |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        e = r.get("torch_eager_tokens_per_s")
        c = r.get("torch_compiled_tokens_per_s")
        print(f"| {r['model']} | {r['hzp_tokens_per_s']:.0f} | {100 * r['hzp_mfu']:.1f} % | {r['hzp_pool_GiB']:.1f} | "
              f"{e or 0:.0f} | {100 * r.get('torch_eager_mfu', 0):.1f} % | {r.get('torch_eager_peak_GiB', 0):.1f} | "
              f"{r['hzp_tokens_per_s'] / e if e else 0:.2f} | {c or 0:.0f} | "
              f"{r['hzp_tokens_per_s'] / c if c else 0:.2f} |")
    if rows:
        print(f"\n{rows[0].get('device', '?')}")
    return True


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    command, rest = sys.argv[1], sys.argv[2:]
    functions = {"falls": falls, "close": close, "memory": memory, "bench": bench, "table": table}
    if command not in functions:
        print(__doc__)
        sys.exit(2)
    args = [float(a) if command in ("falls", "close") and i >= (1 if command == "falls" else 2) else a
            for i, a in enumerate(rest)]
    sys.exit(0 if functions[command](*args) else 1)
