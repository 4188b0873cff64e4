#!/usr/bin/env python3
"""PyTorch GPU peer of `hzp train --backend cuda` for bench/gpu/check.sh: the same LLaMA-style models as
bench/gpu/*.json (the equations of runtime/model/model.h: RMSNorm, rotate-half rotary positions, causal
attention through SDPA, SwiGLU MLP or top-k MoE of SwiGLU experts, untied head), bf16 autocast, fused AdamW
(lr 3e-4, weight decay 0.01), random tokens over the vocabulary with one batch reused every step (what
`hzp train --data random` trains on).

    python3 bench/gpu/torch_gpu.py SCENARIO.json [--compile] [--steps N]

Prints one JSON line: name, compile, params, active params, tokens_per_s over the steps after 5 warm-up
steps, mfu (6 * active params + 12 * layers * hidden * seq FLOPs per token, against the 989 TFLOP/s dense
bf16 peak of an H100 SXM), peak_mem_GiB (torch.cuda.max_memory_allocated), the last loss, and the device.
"""
import json
import os
import sys
import time

if __name__ == "__main__" and any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)  # before importing torch, so --help works where torch is not installed
    sys.exit(0)

try:
    import torch
except ImportError:
    print("torch_gpu.py: needs PyTorch (Debian's /usr/bin/python3 has it: run the script with it)", file=sys.stderr)
    sys.exit(2)
import torch.nn as nn
import torch.nn.functional as F

PEAK_FLOPS = 989e12  # H100 SXM dense bf16 (NVIDIA datasheet)


class RMSNorm(nn.Module):
    def __init__(self, h):
        super().__init__()
        self.w = nn.Parameter(torch.ones(h))

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.w, eps=1e-5)


def rotary(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


class SwiGLU(nn.Module):
    def __init__(self, h, f):
        super().__init__()
        self.gate = nn.Linear(h, f, bias=False)
        self.up = nn.Linear(h, f, bias=False)
        self.down = nn.Linear(f, h, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


class MoE(nn.Module):
    def __init__(self, h, f, experts, k):
        super().__init__()
        self.router = nn.Linear(h, experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(h, f) for _ in range(experts))
        self.k = k

    def forward(self, x):
        b, t, h = x.shape
        x = x.reshape(-1, h)
        p = self.router(x).float().softmax(-1)
        w, idx = p.topk(self.k, -1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel():
                out.index_add_(0, tok, expert(x[tok]) * w[tok, slot, None].to(x.dtype))
        return out.view(b, t, h)


class Block(nn.Module):
    def __init__(self, h, heads, kv_heads, f, moe):
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, h // heads
        self.norm1, self.norm2 = RMSNorm(h), RMSNorm(h)
        self.wq = nn.Linear(h, h, bias=False)
        self.wk = nn.Linear(h, kv_heads * self.d, bias=False)
        self.wv = nn.Linear(h, kv_heads * self.d, bias=False)
        self.wo = nn.Linear(h, h, bias=False)
        self.mlp = MoE(h, f, *moe) if moe else SwiGLU(h, f)

    def forward(self, x, cos, sin):
        b, t, h = x.shape
        n = self.norm1(x)
        q = rotary(self.wq(n).view(b, t, self.heads, self.d), cos, sin).transpose(1, 2)
        k = rotary(self.wk(n).view(b, t, self.kv_heads, self.d), cos, sin).transpose(1, 2)
        v = self.wv(n).view(b, t, self.kv_heads, self.d).transpose(1, 2)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.wo(a.transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, m, seq):
        super().__init__()
        h, heads = m["hidden"], m["heads"]
        moe = (m["moe"]["experts"], m["moe"]["top_k"]) if "moe" in m else None
        f = m["moe"]["expert_ffn_hidden"] if moe else m["ffn_hidden"]
        self.emb = nn.Embedding(m["vocab"], h)
        self.blocks = nn.ModuleList(
            Block(h, heads, m.get("kv_heads", heads), f, moe) for _ in range(m["layers"]))
        self.norm = RMSNorm(h)
        self.head = nn.Linear(h, m["vocab"], bias=False)
        d = h // heads
        inv = 10000.0 ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2.0 / d)
        ang = torch.arange(seq, dtype=torch.float64)[:, None] * inv[None, :]
        self.register_buffer("cos", torch.cat([ang.cos(), ang.cos()], -1)[None, :, None, :].float())
        self.register_buffer("sin", torch.cat([ang.sin(), ang.sin()], -1)[None, :, None, :].float())

    def forward(self, ids, targets):
        x = self.emb(ids)
        for blk in self.blocks:
            x = blk(x, self.cos, self.sin)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1))



sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from json_input import load_json_input  # noqa: E402  (exit 2 naming a bad input file)


def explicit_model(scenario):
    """(model, training) of a scenario that writes its model out (bench/gpu/*.json do); ValueError naming the
    first field that is missing or not a positive whole number (a preset's fields are hzp's, not read here)."""
    if not isinstance(scenario, dict):
        raise ValueError("not a JSON object")
    sections = {}
    for section, keys in (("model", ("layers", "hidden", "heads", "ffn_hidden", "vocab")),
                          ("training", ("seq_len", "micro_batch"))):
        obj = scenario.get(section)
        if not isinstance(obj, dict):
            raise ValueError(f"{section}: missing or not an object")
        for key in keys + (("kv_heads",) if section == "model" and "kv_heads" in obj else ()):
            v = obj.get(key)
            if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1 << 24:
                raise ValueError(f"{section}.{key}: {v!r} is not a whole number in [1, 16777216] (torch_gpu.py reads "
                                 "the model written out, not a preset: give the file `hzp validate` prints)")
        sections[section] = obj
    m = sections["model"]
    if m["hidden"] % m["heads"] or m["heads"] % m.get("kv_heads", m["heads"]):
        raise ValueError(f"model.heads {m['heads']}: must divide hidden {m['hidden']} and be divided by kv_heads")
    if "moe" in m:
        moe = m["moe"]
        if not isinstance(moe, dict) or any(not isinstance(moe.get(k), int) or isinstance(moe.get(k), bool) or
                                            moe.get(k) < 1 for k in ("experts", "top_k", "expert_ffn_hidden")):
            raise ValueError("model.moe: an object of experts, top_k and expert_ffn_hidden, positive whole numbers "
                             "(leave it out for a dense model)")
        if moe["top_k"] > moe["experts"]:
            raise ValueError(f"model.moe.top_k {moe['top_k']}: more than its {moe['experts']} experts")
    return m, sections["training"]


def main():
    args = sys.argv[1:]
    compile_ = "--compile" in args
    try:
        steps = int(args[args.index("--steps") + 1]) if "--steps" in args else 20
    except (IndexError, ValueError):
        print("torch_gpu.py: --steps needs an integer", file=sys.stderr)
        sys.exit(2)
    if not 6 <= steps <= 1_000_000:  # 5 warm-up steps, then at least one timed
        print(f"torch_gpu.py: --steps {steps} is not in [6, 1000000] (5 warm-up steps come first)", file=sys.stderr)
        sys.exit(2)
    positional = [a for i, a in enumerate(args) if not a.startswith("--") and (i == 0 or args[i - 1] != "--steps")]
    if len(positional) != 1 or any(a.startswith("--") and a not in ("--compile", "--steps") for a in args):
        print("usage: torch_gpu.py SCENARIO.json [--steps N] [--compile]", file=sys.stderr)
        sys.exit(2)
    scenario = load_json_input(positional[0], "SCENARIO")
    try:
        m, tr = explicit_model(scenario)
    except ValueError as e:
        print(f"torch_gpu.py: SCENARIO {positional[0]}: {e}", file=sys.stderr)
        sys.exit(2)
    if not torch.cuda.is_available():
        print("torch_gpu.py: no CUDA device here (it is the GPU peer: run it on the GPU machine)", file=sys.stderr)
        sys.exit(2)
    seq, batch = tr["seq_len"], tr["micro_batch"]
    torch.manual_seed(0)
    model = Model(m, seq).cuda()
    params = sum(p.numel() for p in model.parameters())
    active = params
    if "moe" in m:
        e, k, f = m["moe"]["experts"], m["moe"]["top_k"], m["moe"]["expert_ffn_hidden"]
        active -= m["layers"] * (e - k) * 3 * m["hidden"] * f
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01, fused=True)
    fwd = torch.compile(model) if compile_ else model
    ids = torch.randint(0, m["vocab"], (batch, seq), device="cuda")
    targets = torch.randint(0, m["vocab"], (batch, seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(ids, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    dt = (time.perf_counter() - t0) / steps
    tokens = batch * seq / dt
    flops_per_token = 6 * active + 12 * m["layers"] * m["hidden"] * seq
    print(json.dumps({"name": scenario.get("name", args[0]), "compile": compile_, "params": params, "active": active,
                      "tokens_per_s": tokens, "mfu": tokens * flops_per_token / PEAK_FLOPS,
                      "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30, "loss": float(loss),
                      "device": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
