#!/usr/bin/env python3
"""Checks and tables of bench/gpu/check.sh, over the outputs of `hzp train` (metrics.jsonl, memory_rank<r>.json)
and bench/gpu/torch_gpu.py. Each check prints one line starting with PASS or FAIL and exits 0 / 1.

    compare.py falls OUT_DIR [MIN_DROP]            the training loss falls by MIN_DROP nats (default 1.0)
    compare.py close OUT_A OUT_B TOL [STEPS]       the first STEPS losses (default all) agree within TOL (relative)
    compare.py memory OUT_DIR RANKS                each state category and pool within 5 % of the core's model
    compare.py bench HZP_DIR TORCH_JSONL SCENARIO  one row of the speed table (JSON line) from both sides
    compare.py table ROWS_JSONL                     the markdown table of bench rows
    compare.py attention ROWS_JSONL                 the attention table (attention_bench, torch_attention.py rows)
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from json_input import read_regular_file  # noqa: E402  (a FIFO or /dev/zero refused, not waited on)


class InputError(Exception):
    """An input that is not what the command reads: exit 2 with its one line."""


def read_json(path):
    try:
        return json.loads(read_regular_file(path, 64 << 20))
    except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
        raise InputError(f"{path}: {getattr(e, 'strerror', None) or e}") from None


def read_jsonl(path):
    try:
        text = read_regular_file(path, 64 << 20).decode("utf-8", errors="replace")
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: {getattr(e, 'strerror', None) or e}") from None
    rows = []
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except ValueError as e:
                raise InputError(f"{path}:{n}: not JSON ({e})") from None
    return rows


def is_number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def finite(value):
    """True for a finite number; False for NaN, inf and null (hzp writes a NaN loss as null)."""
    return is_number(value) and math.isfinite(value)


def losses(out):
    """The metrics rows with a loss. A loss that is not a number (text) is bad input; null, NaN or inf are kept
    for the checks, which FAIL on them (a run that diverged)."""
    path = os.path.join(out, "metrics.jsonl")
    rows = [r for r in read_jsonl(path) if isinstance(r, dict) and "loss" in r]
    if not rows:
        raise InputError(f"{path}: no step with a loss")
    for n, r in enumerate(rows, 1):
        if r["loss"] is not None and not is_number(r["loss"]):
            raise InputError(f"{path}: step {r.get('step', n)}: loss {str(r['loss'])[:40]!r} is not a number")
    return rows


def first_not_finite(rows):
    """(step, loss) of the first row whose loss is NaN, inf or null; None when every loss is finite."""
    for n, r in enumerate(rows, 1):
        if not finite(r["loss"]):
            return r.get("step", n), "null" if r["loss"] is None else r["loss"]
    return None


def falls(out, min_drop=1.0):
    rows = losses(out)
    bad = first_not_finite(rows)
    if bad:
        print(f"FAIL loss falls: {out} step {bad[0]} has loss {bad[1]} (not a finite number)")
        return False
    ls = [r["loss"] for r in rows]
    drop = ls[0] - min(ls[-5:])
    ok = drop >= min_drop
    print(f"{'PASS' if ok else 'FAIL'} loss falls: {ls[0]:.4f} -> {ls[-1]:.4f} over {len(ls)} steps (drop {drop:.3f}, "
          f"needs {min_drop})")
    return ok


def close(a, b, tol, steps=None):
    la, lb = losses(a), losses(b)
    n = min(len(la), len(lb)) if steps is None else steps
    if len(la) < n or len(lb) < n:
        print(f"FAIL {os.path.basename(a)} vs {os.path.basename(b)}: {n} steps asked, {len(la)} and {len(lb)} "
              "have a loss")
        return False
    for out, rows in ((a, la), (b, lb)):
        bad = first_not_finite(rows[:n])
        if bad:
            print(f"FAIL {os.path.basename(a)} vs {os.path.basename(b)}: {out} step {bad[0]} has loss {bad[1]} "
                  "(not a finite number)")
            return False
    worst = 0.0
    for i in range(n):
        x, y = la[i]["loss"], lb[i]["loss"]
        worst = max(worst, abs(x - y) / abs(x) if x else (0.0 if y == 0 else math.inf))
    ok = worst <= tol
    print(f"{'PASS' if ok else 'FAIL'} {os.path.basename(a)} vs {os.path.basename(b)}: worst relative loss difference "
          f"{worst:.3g} over {n} steps (tolerance {tol})")
    return ok


def memory(out, ranks):
    ok, worst, not_finite = True, 0.0, None
    for r in range(ranks):
        path = os.path.join(out, f"memory_rank{r}.json")
        m = read_json(path)
        got, model = m["measured"], m["model"]
        pairs = [(c, got.get(c, 0.0), model[c]) for c in ("params", "grads", "optimizer")]
        pairs += [("pool:" + p, got.get("pool:" + p, 0.0), v) for p, v in model["pools"].items()]
        for name, g, want in pairs:
            for side, value in (("measured", g), ("model", want)):
                if value is not None and not is_number(value):
                    raise InputError(f"{path}: {side} {name} {str(value)[:40]!r} is not a number")
                if not finite(value) or value < 0:
                    line = f"rank {r} {name}: {side} {'null' if value is None else value} is not a finite byte count"
                    ok, worst, not_finite = False, math.inf, not_finite or line
                    print("  " + line)
            if not (finite(g) and finite(want)) or g < 0 or want < 0:
                continue
            err = abs(g - want) / want if want else abs(g)
            worst = max(worst, err)
            if err > 0.05:
                ok = False
                print(f"  rank {r} {name}: measured {g:.0f} bytes, model {want:.0f}")
    if not_finite:
        print(f"FAIL memory of {out}: {not_finite}")
    else:
        print(f"{'PASS' if ok else 'FAIL'} memory of {out}: every category within {100 * worst:.2f} % of the core's "
              "model")
    return ok


def bench(hzp_dir, torch_jsonl, scenario):
    sc = read_json(scenario)
    m, tr = sc["model"], sc["training"]
    tokens_per_step = tr["seq_len"] * tr["micro_batch"]
    steps = losses(hzp_dir)[5:]
    if not steps:
        raise InputError(f"{os.path.join(hzp_dir, 'metrics.jsonl')}: no step after the 5 of warm-up")
    for r in steps:
        if not finite(r.get("seconds")) or r["seconds"] <= 0:
            raise InputError(f"{os.path.join(hzp_dir, 'metrics.jsonl')}: step {r.get('step')}: seconds "
                             f"{str(r.get('seconds'))[:40]!r} is not a positive finite number")
    tok = tokens_per_step * len(steps) / sum(r["seconds"] for r in steps)
    mem = read_json(os.path.join(hzp_dir, "memory_rank0.json"))["measured"]
    active = None
    torch_rows = [r for r in read_jsonl(torch_jsonl) if isinstance(r, dict)]
    if not torch_rows:
        raise InputError(f"{torch_jsonl}: no rows")
    for n, t in enumerate(torch_rows, 1):
        for key in ("active", "tokens_per_s", "mfu", "peak_mem_GiB"):
            if not finite(t.get(key)) or t[key] < 0:
                raise InputError(f"{torch_jsonl}: row {n}: {key} {str(t.get(key))[:40]!r} is not a finite number >= 0")
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
    bad = [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]
    if bad:
        raise InputError(f"{scenario}: {bad[0]} comes out {row[bad[0]]} (the scenario's sizes are not finite numbers)")
    print(json.dumps(row))
    return True


def table_rows(rows_jsonl, numbers, optional=()):
    """The rows of ROWS_JSONL; InputError when there are none (an empty table is no result), a row is not an
    object, or one of its NUMBERS (or OPTIONAL ones, when present) is not a finite number."""
    rows = read_jsonl(rows_jsonl)
    if not rows:
        raise InputError(f"{rows_jsonl}: no rows (an empty file makes no table)")
    for n, r in enumerate(rows, 1):
        if not isinstance(r, dict):
            raise InputError(f"{rows_jsonl}:{n}: not a JSON object")
        for key in list(numbers) + [k for k in optional if r.get(k) is not None]:
            if key not in r:
                raise InputError(f"{rows_jsonl}:{n}: no field {key!r}")
            if not finite(r[key]):
                raise InputError(f"{rows_jsonl}:{n}: {key} {str(r[key])[:40]!r} is not a finite number")
    return rows


def table(rows_jsonl):
    rows = table_rows(rows_jsonl, ("hzp_tokens_per_s", "hzp_mfu", "hzp_pool_GiB"),
                      [f"torch_{k}_{f}" for k in ("eager", "compiled") for f in ("tokens_per_s", "mfu", "peak_GiB")])
    print("| model | hzp tok/s | MFU | memory GiB (pool) | torch eager tok/s | MFU | peak GiB | hzp / eager | "
          "torch.compile tok/s | hzp / compiled |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    def cell(value, form):  # a run that did not happen (no compile run, a stage cut short) is "-", not 0
        return "-" if value is None else format(value, form)

    for r in rows:
        hzp = r["hzp_tokens_per_s"]
        e, c = r.get("torch_eager_tokens_per_s"), r.get("torch_compiled_tokens_per_s")
        e_mfu, e_peak = r.get("torch_eager_mfu"), r.get("torch_eager_peak_GiB")
        print(f"| {r['model']} | {hzp:.0f} | {100 * r['hzp_mfu']:.1f} % | {r['hzp_pool_GiB']:.1f} | "
              f"{cell(e, '.0f')} | {cell(None if e_mfu is None else 100 * e_mfu, '.1f')} % | {cell(e_peak, '.1f')} | "
              f"{cell(hzp / e if e else None, '.2f')} | {cell(c, '.0f')} | {cell(hzp / c if c else None, '.2f')} |")
    if rows:
        print(f"\n{rows[0].get('device', '?')}")
    return True


def attention(rows_jsonl):
    """One line per shape: forward / backward TFLOP/s of each kernel, and hzp's default over PyTorch's SDPA."""
    rows = table_rows(rows_jsonl, ("forward_tflops", "backward_tflops"))
    shapes, kernels = {}, []
    for r in rows:
        key = (r["type"], r["seq"], r["head_dim"], r["batch"], r["heads"])
        label = r["kernel"] if r.get("algorithm", "standard") == "standard" else f"{r['kernel']} {r['algorithm']}"
        if finite(r.get("dropout")) and r["dropout"] > 0:  # its own column: hzp's ratio stays against plain SDPA
            label += f" dropout {r['dropout']:g}"
        shapes.setdefault(key, {})[label] = r
        if label not in kernels:
            kernels.append(label)
    print("| type | seq | head dim | batch x heads | " +
          " | ".join(f"{k} fwd / bwd TFLOP/s" for k in kernels) + " | hzp / torch fwd | bwd |")
    print("|---|---:|---:|---:|" + "---:|" * len(kernels) + "---:|---:|")
    for (t, seq, d, batch, heads), by_kernel in sorted(shapes.items()):
        cells = []
        for k in kernels:
            r = by_kernel.get(k)
            cells.append(f"{r['forward_tflops']:.1f} / {r['backward_tflops']:.1f}" if r else "-")
        hzp, torch = by_kernel.get("default"), by_kernel.get("torch-sdpa")
        ratio = ["-", "-"]
        if hzp and torch and torch["forward_tflops"] > 0 and torch["backward_tflops"] > 0:
            ratio = [f"{hzp['forward_tflops'] / torch['forward_tflops']:.2f}",
                     f"{hzp['backward_tflops'] / torch['backward_tflops']:.2f}"]
        print(f"| {t} | {seq} | {d} | {batch} x {heads} | " + " | ".join(cells) + f" | {ratio[0]} | {ratio[1]} |")
    if rows:
        print(f"\n{rows[0].get('device', '?')}")
    return True


# Each command's arguments: how many, and which are numbers (index -> (low, high, integer)): a count (STEPS,
# RANKS) of 1.5 is refused, never rounded.
COMMANDS = {"falls": (falls, 1, 2, {1: (0, 1e6, False)}),
            "close": (close, 3, 4, {2: (0, 1e6, False), 3: (1, 1e9, True)}),
            "memory": (memory, 2, 2, {1: (1, 1 << 20, True)}), "bench": (bench, 3, 3, {}),
            "table": (table, 1, 1, {}), "attention": (attention, 1, 1, {})}


def parse(command, rest):
    """The command's arguments, numbers converted; InputError naming the first that is wrong."""
    _, least, most, numbers = COMMANDS[command]
    if not least <= len(rest) <= most:
        raise InputError(f"{command} takes {least}{'' if least == most else f' to {most}'} arguments, got {len(rest)} "
                         "(see --help)")
    args = list(rest)
    for i, (low, high, integer) in numbers.items():
        if i < len(args):
            try:
                value = float(args[i])
            except ValueError:
                raise InputError(f"{command}: argument {i + 1} {args[i]!r} is not a number") from None
            if not math.isfinite(value) or not low <= value <= high:
                raise InputError(f"{command}: argument {i + 1} {args[i]!r} is not in [{low:g}, {high:g}]")
            if integer:
                if value != int(value):
                    raise InputError(f"{command}: argument {i + 1} {args[i]!r} is not a whole number (a count)")
                value = int(value)
            args[i] = value
    return args


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    command, rest = sys.argv[1], sys.argv[2:]
    if command not in COMMANDS:
        print(f"compare.py: unknown command {command[:40]!r} (falls, close, memory, bench, table, attention; see --help)",
              file=sys.stderr)
        sys.exit(2)
    try:
        ok = COMMANDS[command][0](*parse(command, rest))
    except InputError as e:
        print(f"compare.py: {e}", file=sys.stderr)
        sys.exit(2)
    except (KeyError, TypeError, ValueError, IndexError, ZeroDivisionError, AttributeError) as e:
        # Readable files whose content is not what the command reads (a metrics row without its seconds).
        print(f"compare.py {command}: the inputs are not what it reads ({type(e).__name__}: {str(e)[:120]})",
              file=sys.stderr)
        sys.exit(2)
    sys.exit(0 if ok else 1)
