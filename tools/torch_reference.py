#!/usr/bin/python3
"""PyTorch reference for the runtime's models (runtime/model/model.h), used by tests/torch_compare_main.cc.

    /usr/bin/python3 tools/torch_reference.py IN.json OUT.json

IN.json (written by torch_compare):
    config:  vocab, hidden, heads, kv_heads (optional, default heads), ffn, layers, moe_layer [bool per
             layer], experts, top_k, expert_ffn, aux_loss_coef, batch, seq
    ids, targets: batch * seq token ids, sequence-major (token t of sequence b at b * seq + t)
    params:  name -> {"shape": [rows, cols] or [size] for norm weights, "data": [...]} with the names
             embedding.wte [V x h]
             layers.L.attention.{norm [h], wq [h x h], wk, wv [h x kv_heads*d], wo [h x h]} (d = h / heads)
             layers.L.mlp.{norm [h], w_gate, w_up [h x f], w_down [f x h]}            (dense layers)
             layers.L.moe.{norm [h], router [h x E]}                                   (MoE layers)
             layers.L.experts.E.{w_gate, w_up [h x fe], w_down [fe x h]}               (MoE layers)
             head.{norm [h], w_out [h x V]}
OUT.json:
    loss = mean token cross-entropy + aux_loss_coef * (sum over MoE layers of aux), ce, aux [per MoE layer],
    min_router_gap (smallest gap between the k-th and (k+1)-th router logit: routing is decided by it),
    grads: name -> flat dL/dparam.

The model is written from the equations in model.h, in float64: pre-norm residual blocks with RMSNorm
(eps 1e-5), rotate-half rotary embeddings (theta 10000) on q and k, causal softmax attention with
grouped-query heads (kv_heads dividing heads: query head i reads kv head i // (heads // kv_heads), so each kv
head serves a consecutive group of query heads; kv_heads == heads is multi-head attention), SwiGLU MLPs,
a softmax router with top-k selection (ties to the lower index), gate weights renormalised over the selected
experts, the Switch load-balancing loss E * sum_e f_e * P_e, and an untied output head.
"""
import json
import math
import os
import sys

if __name__ == "__main__" and any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(__doc__)  # before importing torch, so --help works where torch is not installed
    sys.exit(0)

try:
    import torch
except ImportError:
    print("torch_reference.py: needs PyTorch (Debian's /usr/bin/python3 has it: run the script with it)", file=sys.stderr)
    sys.exit(2)

torch.set_default_dtype(torch.float64)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + 1e-5) * w


def rotary(x, seq):
    """x: [batch, seq, heads, d]; rotate-half rotary embedding at positions 0..seq-1."""
    d = x.shape[-1]
    half = d // 2
    inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float64) * 2.0 / d)
    angles = torch.arange(seq, dtype=torch.float64)[:, None] * inv_freq[None, :]  # [seq, half]
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[None, :, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[None, :, None, :]
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attention(x, p, cfg):
    b, s, h, heads = cfg["batch"], cfg["seq"], cfg["hidden"], cfg["heads"]
    kv_heads = cfg.get("kv_heads", heads)
    if kv_heads < 1 or heads % kv_heads != 0:
        sys.exit(f"torch_reference.py: kv_heads {kv_heads} does not divide heads {heads}")
    group = heads // kv_heads
    d = h // heads
    xn = rms_norm(x, p["norm"])
    q = rotary((xn @ p["wq"]).view(b, s, heads, d), s).transpose(1, 2)  # [b, heads, s, d]
    k = rotary((xn @ p["wk"]).view(b, s, kv_heads, d), s).transpose(1, 2)  # [b, kv_heads, s, d]
    v = (xn @ p["wv"]).view(b, s, kv_heads, d).transpose(1, 2)
    # Each kv head serves `group` consecutive query heads: query head i reads kv head i // group.
    k = k.repeat_interleave(group, dim=1)  # [b, heads, s, d]
    v = v.repeat_interleave(group, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(b, s, h)
    return x + out @ p["wo"]


def swiglu(x, w_gate, w_up, w_down):
    return (torch.nn.functional.silu(x @ w_gate) * (x @ w_up)) @ w_down


def mlp(x, p):
    return x + swiglu(rms_norm(x, p["norm"]), p["w_gate"], p["w_up"], p["w_down"])


def moe(x, p, experts, cfg):
    """Returns (x + sum_k w_k expert_k(norm(x)), aux, smallest logit gap at the top-k boundary)."""
    n_experts, top_k = cfg["experts"], cfg["top_k"]
    shape = x.shape
    xn = rms_norm(x, p["norm"]).reshape(-1, shape[-1])  # [T, h]
    tokens = xn.shape[0]
    logits = xn @ p["router"]
    probs = logits.softmax(dim=-1)
    # Top-k by probability, ties to the lower expert index: a stable descending sort.
    order = torch.sort(probs.detach(), dim=-1, descending=True, stable=True).indices
    chosen = order[:, :top_k]  # [T, k]
    picked = probs.gather(1, chosen)
    gates = picked / picked.sum(dim=-1, keepdim=True)
    # Dense [T, E] gate matrix: zero for experts a token did not pick.
    gate_matrix = torch.zeros(tokens, n_experts).scatter(1, chosen, gates)
    out = torch.zeros_like(xn)
    for e in range(n_experts):
        w = experts[e]
        out = out + gate_matrix[:, e:e + 1] * swiglu(xn, w["w_gate"], w["w_up"], w["w_down"])
    # Switch load balancing: f_e = share of the T*k assignments (a count, no gradient), P_e = mean p_e.
    counts = torch.zeros(n_experts).scatter_add(0, chosen.reshape(-1), torch.ones(tokens * top_k))
    f = counts / (tokens * top_k)
    aux = n_experts * (f * probs.mean(dim=0)).sum()
    if top_k < n_experts:
        sorted_logits = logits.detach().gather(1, order)
        gap = (sorted_logits[:, top_k - 1] - sorted_logits[:, top_k]).min().item()
    else:
        gap = float("inf")
    return x + out.reshape(shape), aux, gap



sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_input import check_output_file, load_json_input, write_output_file  # noqa: E402  (exit 2 naming it)

CONFIG_COUNTS = ("vocab", "hidden", "heads", "ffn", "layers", "batch", "seq")


def check_input(doc):
    """The shape of torch_compare's document, before any of it is used; ValueError naming the first field that
    is not what the module docstring says (a KeyError or TypeError deep in the model said nothing)."""
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    for key, kind in (("config", dict), ("params", dict), ("ids", list), ("targets", list)):
        if not isinstance(doc.get(key), kind):
            raise ValueError(f"{key}: missing or not a JSON {'object' if kind is dict else 'array'}")
    cfg = doc["config"]
    for key in CONFIG_COUNTS:
        v = cfg.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or not 1 <= v <= 1 << 20:
            raise ValueError(f"config.{key}: {v!r} is not a whole number in [1, 1048576]")
    if not isinstance(cfg.get("moe_layer"), list) or len(cfg["moe_layer"]) != cfg["layers"]:
        raise ValueError(f"config.moe_layer: not a list of {cfg['layers']} booleans (one per layer)")
    for key in ("ids", "targets"):
        if len(doc[key]) != cfg["batch"] * cfg["seq"]:
            raise ValueError(f"{key}: {len(doc[key])} token ids, not batch x seq = {cfg['batch'] * cfg['seq']}")
    for name, t in doc["params"].items():
        if not isinstance(t, dict) or not isinstance(t.get("shape"), list) or not isinstance(t.get("data"), list):
            raise ValueError(f"params.{name}: not an object with a shape and a data array")


def main():
    if len(sys.argv) != 3 or any(a.startswith("-") for a in sys.argv[1:]):
        print("usage: torch_reference.py IN.json OUT.json", file=sys.stderr)
        sys.exit(2)
    try:
        check_output_file(sys.argv[2], "OUT.json", inputs=(sys.argv[1],))
    except ValueError as e:
        print(f"torch_reference.py: {e}", file=sys.stderr)
        sys.exit(2)
    doc = load_json_input(sys.argv[1], "IN.json")
    try:
        check_input(doc)
        out = reference(doc)
    except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as e:
        # What check_input does not reach (a parameter of the wrong size, a missing tensor) fails inside torch:
        # still the input's fault, said in one line.
        what = f"missing {e}" if isinstance(e, KeyError) else str(e).split("\n")[0]
        print(f"torch_reference.py: IN.json {sys.argv[1]}: {what}", file=sys.stderr)
        sys.exit(2)
    write_output_file(sys.argv[2], json.dumps(out))


def reference(doc):
    """OUT.json's document for a checked IN.json."""
    cfg = doc["config"]
    params = {}
    for name, t in doc["params"].items():
        params[name] = torch.tensor(t["data"]).reshape(t["shape"]).requires_grad_(True)

    def module(prefix):
        return {name[len(prefix):]: t for name, t in params.items() if name.startswith(prefix)}

    b, s = cfg["batch"], cfg["seq"]
    ids = torch.tensor(doc["ids"], dtype=torch.long).view(b, s)
    targets = torch.tensor(doc["targets"], dtype=torch.long).view(-1)

    x = params["embedding.wte"][ids]  # [b, s, h]
    aux_losses = []
    min_gap = float("inf")
    for layer in range(cfg["layers"]):
        x = attention(x, module(f"layers.{layer}.attention."), cfg)
        if cfg["moe_layer"][layer]:
            experts = [module(f"layers.{layer}.experts.{e}.") for e in range(cfg["experts"])]
            x, aux, gap = moe(x, module(f"layers.{layer}.moe."), experts, cfg)
            aux_losses.append(aux)
            min_gap = min(min_gap, gap)
        else:
            x = mlp(x, module(f"layers.{layer}.mlp."))
    head = module("head.")
    logits = rms_norm(x, head["norm"]).reshape(b * s, -1) @ head["w_out"]
    ce = torch.nn.functional.cross_entropy(logits, targets)  # mean over the b * s tokens
    loss = ce + cfg["aux_loss_coef"] * sum(aux_losses, torch.zeros(()))
    loss.backward()

    out = {
        "loss": loss.item(),
        "ce": ce.item(),
        "aux": [a.item() for a in aux_losses],
        "min_router_gap": min_gap if math.isfinite(min_gap) else None,
        "grads": {name: t.grad.reshape(-1).tolist() for name, t in params.items()},
    }
    return out


if __name__ == "__main__":
    main()
