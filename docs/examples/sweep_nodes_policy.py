#!/usr/bin/env python3
"""hzp from Python, as in a notebook: sweep nodes x policy for LLaMA-2 13B on A800 nodes (the default
scenario with a larger model), plot MFU and memory per GPU, and pick a plan.

    bash tools/setup.sh                                   # builds build/python/hzp too
    PYTHONPATH=build/python /usr/bin/python3 docs/examples/sweep_nodes_policy.py [--out docs/images]

Writes OUT/sweep_mfu.png and OUT/sweep_memory.png (what docs/python.md shows) and prints the table and the
pick. 16 simulations, two at a time: about 1 s on a 2-core machine.
"""
import argparse
import os
import sys

import hzp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NODES = [4, 8, 16, 32]
POLICIES = ["zero1", "zero3", "hsdp", "asynchzp"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(ROOT, "docs", "images"), help="where the plots go")
    parser.add_argument("--jobs", type=int, default=2, help="simulations at once (default 2)")
    args = parser.parse_args()

    base = hzp.load(os.path.join(ROOT, "scenarios", "default.json"))
    # The same work per GPU at every scale: 4 sequences of 4 k tokens per GPU per step.
    grid = [(n, p, base.with_overrides({"model.preset": "llama2-13b", "cluster.nodes": n, "policy.preset": p,
                                        "training.global_batch_tokens": n * 8 * 4 * 4096}))
            for n in NODES for p in POLICIES]
    results = hzp.simulate_many([s for _, _, s in grid], jobs=args.jobs)

    print(f"{'nodes':>5} {'policy':>9} {'step s':>8} {'MFU %':>6} {'GiB/GPU':>8} fits")
    rows = []
    for (nodes, policy, _), r in zip(grid, results):
        rows.append((nodes, policy, r))
        print(f"{nodes:5d} {policy:>9} {r['step_time_s']:8.3f} {100 * r['mfu']:6.1f} "
              f"{r['peak_memory_bytes'] / 2**30:8.2f} {r['fits_memory']}")

    # The pick: at the largest scale, the fastest policy that fits; then what the analytic plan says of it.
    largest = [(r["mfu"], policy, r) for nodes, policy, r in rows if nodes == NODES[-1] and r["fits_memory"]]
    if not largest:
        print("nothing fits at the largest scale", file=sys.stderr)
        return 1
    mfu, policy, r = max(largest)
    print(f"pick at {NODES[-1]} nodes: {policy}, MFU {100 * mfu:.1f} %, step {r['step_time_s']:.3f} s")
    plan = hzp.plan(grid[-1][2].set("policy.preset", policy))
    print(f"hzp.plan of the same setting ranks {plan['best']} first among "
          f"{', '.join(c['policy'] for c in plan['candidates'])} (analytic)")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots (apt install python3-matplotlib)", file=sys.stderr)
        return 0
    os.makedirs(args.out, exist_ok=True)
    for key, label, name, scale in [("mfu", "MFU (%)", "sweep_mfu.png", 100),
                                    ("peak_memory_bytes", "peak memory per GPU (GiB)", "sweep_memory.png", 2**-30)]:
        fig, ax = plt.subplots(figsize=(6, 3.6))
        for policy in POLICIES:
            pts = [(nodes * 8, r[key] * scale) for nodes, p, r in rows if p == policy]
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=policy)
        if key == "peak_memory_bytes":
            ax.axhline(base.resolved["cluster"]["gpu"]["memory_GiB"], color="grey", linestyle="--", linewidth=1,
                       label="GPU memory")
        ax.set_xscale("log", base=2)
        ax.set_xticks([n * 8 for n in NODES], [str(n * 8) for n in NODES])
        ax.set_xlabel("GPUs (A800, 8 per node)")
        ax.set_ylabel(label)
        ax.set_title(f"LLaMA-2 13B, 4 sequences of 4 k per GPU: {label.split(' (')[0]}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, name), dpi=100)
        print(f"wrote {os.path.join(args.out, name)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
