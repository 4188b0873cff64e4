#!/usr/bin/env python3
"""Writes the shipped dense-model scenarios under scenarios/dense/ (run from the repo root).

Dense LLaMA-2 models on A100, H100 and A800 clusters from 8 to 1024 GPUs under ddp/zero1/zero2/zero3, with a
4M-token global batch (AMSP's setup: seq 4096, micro-batch 1) where it divides, else the smallest batch of
one micro-batch per GPU. Scenarios that do not fit in memory are shipped on purpose: the simulator reports
them as out of memory. Re-run after changing the list; the files are checked in.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_input import write_output_file  # noqa: E402

SETUPS = [
    # model, cluster preset, GPU counts, recompute
    ("llama2-7b", "a800", [8, 64, 256, 1024], "none"),
    ("llama2-13b", "dgx-a100", [8, 128, 1024], "selective"),
    ("llama2-70b", "dgx-h100", [64, 256, 1024], "full"),
]
POLICIES = ["ddp", "zero1", "zero2", "zero3"]
SEQ = 4096
TOKENS = 4 * 1024 * 1024


def scenario(model, cluster, gpus, recompute, policy):
    nodes = max(1, gpus // 8)
    sequences = TOKENS // SEQ
    if sequences % gpus:
        sequences = gpus
    return {
        "name": f"{model}-{cluster}-{gpus}-{policy}",
        "model": {"preset": model},
        "cluster": {"preset": cluster, "nodes": nodes},
        "training": {"seq_len": SEQ, "micro_batch": 1, "global_batch_sequences": sequences, "recompute": recompute},
        "policy": {"preset": policy, "overlap": {"prefetch_depth": 1}},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=os.path.join("scenarios", "dense"),
                        help="folder to (re)write the scenarios into (default: scenarios/dense)")
    out = parser.parse_args().out
    if not out:
        parser.error("--out: an empty path")
    try:
        os.makedirs(out, exist_ok=True)
        for model, cluster, counts, recompute in SETUPS:
            for gpus in counts:
                for policy in POLICIES:
                    s = scenario(model, cluster, gpus, recompute, policy)
                    write_output_file(os.path.join(out, s["name"] + ".json"), json.dumps(s, indent=2) + "\n")
    except OSError as e:  # --out names a file, or a folder that takes no file (/proc)
        print(f"gen_scenarios: --out {out}: {e.strerror}: {e.filename}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
