#!/usr/bin/env python3
"""PyTorch GPU peer of `hzp train --backend cuda` for bench/gpu/check.sh: the same LLaMA-style models as
bench/gpu/*.json (the equations of runtime/model/model.h: RMSNorm, rotate-half rotary positions, causal
attention through SDPA, SwiGLU MLP or top-k MoE of SwiGLU experts, untied head), bf16 autocast, fused AdamW
(the scenario's run.lr, beta1, beta2, eps and weight_decay, the lr held constant), on one GPU, random tokens over
the vocabulary with one batch reused every step (what `hzp train --data random` trains on).

    python3 bench/gpu/torch_gpu.py SCENARIO.json [--compile] [--steps N]

Prints one JSON line: name, compile, params, active params, tokens_per_s over the steps after 5 warm-up
steps, mfu (6 * active params + 12 * layers * hidden * seq FLOPs per token, against the 989 TFLOP/s dense
bf16 peak of an H100 SXM), peak_mem_GiB (torch.cuda.max_memory_allocated), the last loss, and the device.

A scenario asking for what it does not train (another family, MLP, position or precision, tied embeddings,
MLA, a shared expert or MoE on some layers only, more than one GPU or any parallelism, an lr schedule, an
unknown field) is refused with exit 2 naming the field, before torch is imported. A model preset other than
tiny-dense / tiny-moe is refused too: pass the file `hzp validate SCENARIO` prints (null optional sections).
"""
import json
import os
import sys
import time

if __name__ == "__main__" and any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)  # before importing torch, so --help works where torch is not installed
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools"))
from json_input import load_json_input  # noqa: E402  (exit 2 naming a bad input file)

# What this script trains, field by field; a scenario asking for anything else is refused (exit 2 naming the
# field) rather than trained as a different model. A field left out means hzp's default (for a model preset,
# the preset's: only the LLaMA-like tiny-dense and tiny-moe are known here); null is an absent optional section.
MODEL_PRESETS = {"tiny-dense": False, "tiny-moe": True}  # preset -> has an MoE
MODEL_EXACT = {"family": "llama", "mlp": "swiglu", "position": "rope", "tied_embeddings": False, "mla": None}
MODEL_KEYS = {"name", "preset", "layers", "hidden", "heads", "kv_heads", "ffn_hidden", "vocab", "max_positions",
              "moe"} | set(MODEL_EXACT)
TRAINING_EXACT = {"precision": "bf16", "optimizer": "adamw", "recompute": "none", "flash_attention": True,
                  "attention": "standard", "attention_dropout": 0, "hidden_dropout": 0, "fp8": False, "grad_clip": 0}
# training.kernels ("fused" / "eager") is the simulator's cost of a framework's kernels; this script runs eager,
# or compiled with --compile, whichever the scenario says.
TRAINING_KEYS = {"seq_len", "micro_batch", "global_batch_sequences", "global_batch_tokens", "kernels"} | set(
    TRAINING_EXACT)
PARALLEL_ONE = ("tensor", "pipeline", "context")  # one GPU: every parallel degree 1
# run: the optimizer's constants come from the scenario (hzp's defaults); a schedule (warm-up, decay) is refused.
RUN_DEFAULTS = {"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 10, "weight_decay": 0.1, "beta1": 0.9, "beta2": 0.95,
                "eps": 1e-8}
RUN_IGNORED = {"steps", "seed", "eval_interval", "eval_batches", "checkpoint_interval"}  # --steps; random data
TOP_KEYS = {"name", "model", "cluster", "training", "policy", "run"}


def not_implemented(field, value, what):
    return ValueError(f"{field} {json.dumps(value)[:60]}: torch_gpu.py does not implement it ({what}); it would "
                      "train a different model")


def same(value, want):
    """VALUE is WANT as JSON means it: 0 and 0.0 alike, false never 0."""
    if isinstance(want, (int, float)) and not isinstance(want, bool):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and value == want
    return type(value) is type(want) and value == want


def check_exact(section, obj, exact):
    for key, want in exact.items():
        if key in obj and not same(obj[key], want):
            raise not_implemented(f"{section}.{key}", obj[key], f"only {json.dumps(want)}")


def check_keys(section, obj, keys):
    for key in obj:
        if key not in keys:
            raise ValueError(f"{section}.{key}: not a field torch_gpu.py reads (nor hzp: see docs/)")


def check_moe(m, preset):
    """The model's MoE (experts, top_k, expert_ffn_hidden), or None for a dense model."""
    moe = m.get("moe")
    if moe is None:
        if "moe" not in m and MODEL_PRESETS.get(preset):
            raise ValueError(f"model.moe: not written out (preset {preset} has one): give the file `hzp validate` "
                             "prints")
        return None
    if not isinstance(moe, dict) or any(not isinstance(moe.get(k), int) or isinstance(moe.get(k), bool) or
                                        moe.get(k) < 1 for k in ("experts", "top_k", "expert_ffn_hidden")):
        raise ValueError("model.moe: an object of experts, top_k and expert_ffn_hidden, positive whole numbers "
                         "(leave it out, or null, for a dense model)")
    check_keys("model.moe", moe, {"experts", "top_k", "expert_ffn_hidden", "shared_ffn_hidden", "layers"})
    if moe.get("shared_ffn_hidden", 0) != 0:
        raise not_implemented("model.moe.shared_ffn_hidden", moe["shared_ffn_hidden"], "no shared expert: only 0")
    layers = moe.get("layers", "all")
    if layers != "all" and layers != list(range(m["layers"])):
        raise not_implemented("model.moe.layers", layers, "every layer is MoE: only \"all\"")
    if moe["top_k"] > moe["experts"]:
        raise ValueError(f"model.moe.top_k {moe['top_k']}: more than its {moe['experts']} experts")
    return moe["experts"], moe["top_k"], moe["expert_ffn_hidden"]


def check_rest(scenario, m, tr):
    """Refuses the fields of training, cluster, policy and run that ask for what the script does not do; the
    optimizer's constants (lr, beta1, beta2, eps, weight_decay)."""
    check_exact("training", tr, TRAINING_EXACT)
    check_keys("training", tr, TRAINING_KEYS)
    for field, whole in (("global_batch_sequences", tr["micro_batch"]),
                         ("global_batch_tokens", tr["micro_batch"] * tr["seq_len"])):
        if field in tr and tr[field] != whole:
            raise not_implemented(f"training.{field}", tr[field], f"one micro-batch per step: only {whole}")
    cluster = scenario.get("cluster")
    if not isinstance(cluster, dict):
        raise ValueError("cluster: missing or not an object")
    if cluster.get("gpus_per_node") != 1:
        raise not_implemented("cluster.gpus_per_node", cluster.get("gpus_per_node"), "one GPU: write 1")
    if cluster.get("nodes", 1) != 1:
        raise not_implemented("cluster.nodes", cluster["nodes"], "one GPU: only 1")
    policy = scenario.get("policy", {})
    if not isinstance(policy, dict) or not isinstance(policy.get("parallel", {}), dict):
        raise ValueError("policy: not an object (or its parallel not an object)")
    for key in PARALLEL_ONE:
        if policy.get("parallel", {}).get(key, 1) != 1:
            raise not_implemented(f"policy.parallel.{key}", policy["parallel"][key], "no parallelism: only 1")
    if policy.get("expert_parallel", 1) != 1:
        raise not_implemented("policy.expert_parallel", policy["expert_parallel"], "no parallelism: only 1")
    run = scenario.get("run") or {}
    if not isinstance(run, dict):
        raise ValueError("run: not an object")
    check_keys("run", run, set(RUN_DEFAULTS) | RUN_IGNORED)
    opt = {}
    for key, default in RUN_DEFAULTS.items():
        v = run.get(key, default)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 <= v < 1e6 or v != v:
            raise ValueError(f"run.{key}: {json.dumps(v)[:40]} is not a number >= 0")
        opt[key] = v
    if opt["warmup_steps"] != 0:
        raise not_implemented("run.warmup_steps", opt["warmup_steps"], "a constant lr: write 0")
    if opt["min_lr"] != opt["lr"]:
        raise not_implemented("run.min_lr", opt["min_lr"], f"a constant lr: write lr ({opt['lr']})")
    if not 0 <= opt["beta1"] < 1 or not 0 <= opt["beta2"] < 1:
        raise ValueError(f"run.beta1 / beta2 {opt['beta1']} / {opt['beta2']}: not in [0, 1)")
    return opt


def explicit_model(scenario):
    """(model, moe, training, optimizer) of a scenario that writes its model out (bench/gpu/*.json do); ValueError
    naming the first field that is missing, not a positive whole number, or asks for what is not implemented
    here (a preset's fields are hzp's, not read here)."""
    if not isinstance(scenario, dict):
        raise ValueError("not a JSON object")
    check_keys("scenario", scenario, TOP_KEYS)
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
    if "from_hf_config" in m:
        raise ValueError("model.from_hf_config: not read here (give the file `hzp validate` prints)")
    preset = m.get("preset")
    if preset is not None and preset not in MODEL_PRESETS:
        raise ValueError(f"model.preset {json.dumps(preset)[:60]}: its fields are not known here (only "
                         f"{', '.join(MODEL_PRESETS)}): give the file `hzp validate` prints")
    check_keys("model", m, MODEL_KEYS)
    check_exact("model", m, MODEL_EXACT)
    if m["hidden"] % m["heads"] or m["heads"] % m.get("kv_heads", m["heads"]):
        raise ValueError(f"model.heads {m['heads']}: must divide hidden {m['hidden']} and be divided by kv_heads")
    moe = check_moe(m, preset)
    return m, moe, sections["training"], check_rest(scenario, m, sections["training"])


def check_args(args):
    """(path, scenario, model, moe, training, optimizer, steps, compile) from the command line, or exit 2 with
    one line: before torch is imported, so a bad input is refused where torch or CUDA is missing."""
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
        m, moe, tr, opt = explicit_model(scenario)
    except ValueError as e:
        print(f"torch_gpu.py: SCENARIO {positional[0]}: {e}", file=sys.stderr)
        sys.exit(2)
    return positional[0], scenario, m, moe, tr, opt, steps, compile_


if __name__ == "__main__":
    CHECKED = check_args(sys.argv[1:])

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
    def __init__(self, m, moe, seq):
        super().__init__()
        h, heads = m["hidden"], m["heads"]
        f = moe[2] if moe else m["ffn_hidden"]
        moe = moe[:2] if moe else None
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


def main(checked):
    path, scenario, m, moe, tr, opt, steps, compile_ = checked
    if not torch.cuda.is_available():
        print("torch_gpu.py: no CUDA device here (it is the GPU peer: run it on the GPU machine)", file=sys.stderr)
        sys.exit(2)
    seq, batch = tr["seq_len"], tr["micro_batch"]
    torch.manual_seed(0)
    model = Model(m, moe, seq).cuda()
    params = sum(p.numel() for p in model.parameters())
    active = params
    if moe:
        e, k, f = moe
        active -= m["layers"] * (e - k) * 3 * m["hidden"] * f
    opt = torch.optim.AdamW(model.parameters(), lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"],
                            weight_decay=opt["weight_decay"], fused=True)
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
    print(json.dumps({"name": scenario.get("name", path), "compile": compile_, "params": params, "active": active,
                      "tokens_per_s": tokens, "mfu": tokens * flops_per_token / PEAK_FLOPS,
                      "peak_mem_GiB": torch.cuda.max_memory_allocated() / 2**30, "loss": float(loss),
                      "device": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main(CHECKED)
