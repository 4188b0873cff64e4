#!/usr/bin/python3
"""PyTorch CPU eager peer of `hzp train` for bench/runtime_vs_torch.sh: the same tiny LLaMA-style byte-level
model (the equations of runtime/model/model.h), fp32, AdamW, grad clipping, same batch and threads.

    /usr/bin/python3 bench/torch_train.py --layers L --hidden H --heads N --ffn F --seq S --batch B
                                          --threads T --steps K --data FILE

Prints one JSON line: {"tokens_per_s": ..., "step_s": [...]} over the steps after the first 3 (so --steps is
at least 4). A bad flag exits 2 naming it.
"""
import argparse
import json
import math
import os
import time

import sys

if __name__ == "__main__" and any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)  # before importing torch, so --help works where torch is not installed
    sys.exit(0)

try:
    import torch
except ImportError:
    print("torch_train.py: needs PyTorch (Debian's /usr/bin/python3 has it: run the script with it)", file=sys.stderr)
    sys.exit(2)
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.w = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.w


def rotary(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class Block(nn.Module):
    def __init__(self, h, heads, ffn):
        super().__init__()
        self.heads = heads
        self.n1, self.n2 = RMSNorm(h), RMSNorm(h)
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(h, h, bias=False) for _ in range(4))
        self.wg, self.wu = nn.Linear(h, ffn, bias=False), nn.Linear(h, ffn, bias=False)
        self.wd = nn.Linear(ffn, h, bias=False)

    def forward(self, x, cos, sin, mask):
        b, s, h = x.shape
        d = h // self.heads
        xn = self.n1(x)
        q = rotary(self.wq(xn).view(b, s, self.heads, d), cos, sin).transpose(1, 2)
        k = rotary(self.wk(xn).view(b, s, self.heads, d), cos, sin).transpose(1, 2)
        v = self.wv(xn).view(b, s, self.heads, d).transpose(1, 2)
        att = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + self.wo((att @ v).transpose(1, 2).reshape(b, s, h))
        xn = self.n2(x)
        return x + self.wd(F.silu(self.wg(xn)) * self.wu(xn))


class Model(nn.Module):
    def __init__(self, layers, h, heads, ffn, seq):
        super().__init__()
        self.wte = nn.Embedding(256, h)
        self.blocks = nn.ModuleList(Block(h, heads, ffn) for _ in range(layers))
        self.norm = RMSNorm(h)
        self.out = nn.Linear(h, 256, bias=False)
        d = h // heads
        inv = 10000.0 ** (-torch.arange(d // 2, dtype=torch.float32) * 2.0 / d)
        ang = torch.arange(seq, dtype=torch.float32)[:, None] * inv[None, :]
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :])
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :])
        self.register_buffer("mask", ~torch.ones(seq, seq, dtype=torch.bool).tril())
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, ids, targets):
        x = self.wte(ids)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin, self.mask)
        logits = self.out(self.norm(x))
        return F.cross_entropy(logits.view(-1, 256), targets.view(-1))


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools"))
from json_input import read_regular_file  # noqa: E402  (a FIFO or /dev/zero refused, not waited on)

# Each flag's range: the smallest model and run that mean something, the largest a CPU benchmark can take.
RANGES = {"layers": (1, 1024), "hidden": (1, 1 << 16), "heads": (1, 1024), "ffn": (1, 1 << 18),
          "seq": (1, 1 << 16), "batch": (1, 1 << 16), "threads": (1, 1024), "steps": (4, 1 << 20)}


def whole_number(flag):
    low, high = RANGES[flag]

    def parse(text):
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is not in [{low}, {high}]")
        return value
    return parse


def main():
    ap = argparse.ArgumentParser()
    for k in RANGES:
        ap.add_argument("--" + k, type=whole_number(k), required=True)
    ap.add_argument("--data", required=True)
    a = ap.parse_args()
    if a.hidden % a.heads or (a.hidden // a.heads) % 2:
        ap.error(f"argument --heads: {a.heads} heads of --hidden {a.hidden} do not give an even head width "
                 "(rotary pairs)")
    try:
        data = read_regular_file(a.data)
    except (OSError, ValueError) as e:
        ap.error(f"argument --data: {a.data}: {getattr(e, 'strerror', None) or e}")
    if len(data) < a.seq + 2:
        ap.error(f"argument --data: {a.data}: {len(data)} bytes, fewer than --seq + 2 = {a.seq + 2}")
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    text = torch.tensor(list(data), dtype=torch.long)
    model = Model(a.layers, a.hidden, a.heads, a.ffn, a.seq)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    times = []
    for step in range(a.steps):
        t0 = time.perf_counter()
        starts = torch.randint(0, len(text) - a.seq - 1, (a.batch,))
        ids = torch.stack([text[s:s + a.seq] for s in starts])
        targets = torch.stack([text[s + 1:s + a.seq + 1] for s in starts])
        loss = model(ids, targets)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append(time.perf_counter() - t0)
    timed = times[3:]
    print(json.dumps({"tokens_per_s": a.batch * a.seq * len(timed) / sum(timed), "step_s": timed, "loss": loss.item()}))


if __name__ == "__main__":
    main()
