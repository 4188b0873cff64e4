#!/usr/bin/env python3
"""Fidelity report: published training throughputs against hzp's simulation of the same runs.

    python3 tools/validate_rows.py [--hzp build/hzp] [--calibration ROWS.jsonl] [--jobs N] [--out DIR]
                                   [--json FILE] [--only IDS] [--calibrate-on IDS] [--max-error PCT]
                                   [--min-ratio R --max-ratio R] ROWS.jsonl

Each row of ROWS.jsonl (the format of scenarios/validation/README.md: one published run per line, with its
model dimensions, GPUs, interconnect, batch, parallelism, sharding and framework) becomes a scenario. Compute
is calibrated from ONE node only: for each row, the one-node row of --calibration (default: the same file)
that ran the same model, GPU, sequence, micro-batch, framework, tp / pp / cp, precision, recomputation and
other settings -- preferably with the same sharding -- gives its throughput (or MFU) to `hzp calibrate`, and
the fitted efficiencies go into the row's scenario; everything beyond one node comes from the schedule and
the network model. A row with no one-node row of its own configuration (a model too large for one node)
calibrates on the nearest one-node run of the same GPU, framework and precision, else takes the preset's
table efficiencies, and the report says which; --exact-calibration skips it
instead. Each scenario is simulated with `hzp simulate` in its own process, N at a time.

What a row's text becomes (hzp's policy; groups counted in data-parallel ranks):
  InternEvo zero1=-1 / zero1=N          zero1 / optimizer states over N ranks; comm framework internevo
  DeepSpeed ZeRO-1/2/3 over N GPUs      zero1 / zero2 / zero3 (N < dp: that group); framework deepspeed
  MiCS s_p=s_g=s_os=N, HSDP             everything over N ranks (hsdp when N is a node); deepspeed for MiCS
  AMSP s_p=.., s_g=.., s_os=..          explicit groups; hzp's own overlapped schedule
  FSDP2 degree N, Megatron-FSDP         zero3 over data x context ranks (N < dp: HSDP groups); framework fsdp;
                                        gradients reduced in fp32 under bf16 (torchtitan, Megatron-FSDP)
  distributed optimizer (Megatron/NeMo) zero1; framework megatron (gradients in fp32 under bf16), refresh
                                        overlapped if "param-gather" named
  tp / pp / vpp / cp / sequence_parallel policy.parallel (ring context parallelism)
  moe_experts / moe_topk / moe_ffn, ep   model.moe (every layer) and policy.expert_parallel
  FP8 precision                         training.fp8: the linear layers' GEMMs at the GPU's FP8 peak, the rest
                                        (attention core, LM head, memory-bound kernels) and all states and
                                        communication in bf16 (Transformer Engine's and torchtitan's default),
                                        gradients reduced as above
  model GPT-3 (by name)                  model.family gpt: GELU MLP of two matrices with biases, learned
                                        positions, tied head; training dropout 0.1 hidden and attention
                                        (NeMo's GPT config)
  squared-ReLU / relu2, GELU (text)     model.mlp squared_relu / gelu: two matrices (Nemotron-4)
  any other model                       a LLaMA layer: SwiGLU MLP of three matrices, RMSNorm, rotary, untied
grad_accum comes from the global batch when not published; a row with only MFU is calibrated and compared by
MFU (its published tokens/s/GPU shown at the simulated run's FLOPs per token).

Prints per row: published and simulated tokens/s/GPU and the error; then the median and worst absolute
error over the multi-node rows; per series of one configuration at several scales, the error at the smallest
and the largest scale (a level error against a scaling one); and, where one configuration ran one flat and one
hierarchical row at the same scale, their throughput ratio (published vs simulated). Rows it cannot translate, or whose fields have
the wrong type, are listed with the reason.

--only IDS reports just those rows; --calibrate-on IDS calibrates on just those one-node rows (a one-node row is
then a prediction too: e.g. a sequence-length series from its shortest run). A row that names tp_comm_overlap
and runs sequence parallelism gets policy.parallel.tensor_comm_overlap (--no-tensor-comm-overlap: not).

--max-error PCT, --min-ratio / --max-ratio: exit 1 when the worst error of a prediction (a multi-node row, or a
one-node row calibrated on another) exceeds PCT, or a configuration's largest-scale hierarchical/flat ratio
falls outside [min, max] (the fidelity tests use these). Exit 2 on a bad command line or unreadable rows.
"""
import argparse
import concurrent.futures
import functools
import json
import os
import stat
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from json_input import check_executable, create_new_file, number, read_regular_file  # noqa: E402

GPU_PRESETS = [  # (substring of the row's "gpu", cluster preset)
    ("A100", "dgx-a100"),
    ("A800", "a800"),
    ("H100", "dgx-h100"),
    ("H800", "h800"),
    ("H200", "dgx-h200"),
    ("B200", "dgx-b200"),
]

# Presets whose GPU has FP8 tensor cores (its FP8 peak is in hzp's calibration table).
FP8_PRESETS = {"dgx-h100", "h800", "dgx-h200", "dgx-b200"}

# InfiniBand generations by name, Gb/s per port (InfiniBand Trade Association roadmap).
INFINIBAND_GBPS = {"EDR": 100, "HDR": 200, "NDR": 400, "XDR": 800}


class Skip(Exception):
    """A row this tool cannot turn into a scenario (the message says why)."""


def leading_int(value, what):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    m = re.match(r"\s*(\d+)", str(value or ""))
    if not m:
        raise Skip(f"{what} {value!r} is not a number")
    return int(m.group(1))


def degree(row, key):
    """A parallelism degree: 1 when not published."""
    value = row.get(key)
    if value is None:
        return 1
    n = leading_int(value, key)
    if n < 1:
        raise Skip(f"{key} {value!r} must be at least 1")
    return n


def framework_of(row):
    """hzp's policy.comm.framework for the row's training framework, or None for hzp's own schedule."""
    name = (row.get("framework") or "").lower()
    if "internevo" in name or "internlm" in name:
        # AMSP is built on InternEvo but its rows name DeepSpeed for the baselines; the sharding text decides.
        return None if "amsp" in name else "internevo"
    if "deepspeed" in name:
        return "deepspeed"
    if "torchtitan" in name or "fsdp" in name:
        return "fsdp"
    if "megatron" in name or "nemo" in name:
        return "megatron"
    return None


class Layout:
    """How a row's GPUs split (tp x pp x cp x dp) and its policy.parallel; sharding groups are counted in
    data-parallel ranks, gpus_per_node / tp of them per node."""

    def __init__(self, row):
        self.gpus = row["gpu_count"]
        self.gpn = row["gpus_per_node"]
        self.tp, self.pp, self.cp, self.vpp = (degree(row, k) for k in ("tp", "pp", "cp", "vpp"))
        self.ep = degree(row, "ep")
        model_parallel = self.tp * self.pp * self.cp
        if self.gpus % model_parallel:
            raise Skip(f"{self.gpus} GPUs are not a multiple of tp x pp x cp = {model_parallel}")
        self.dp = self.gpus // model_parallel
        self.rpn = self.gpn // self.tp  # data-parallel ranks per node (when tp divides the node, checked below)
        if row.get("dp") is not None and leading_int(row["dp"], "dp") != self.dp:
            raise Skip(f"dp {row['dp']!r} is not gpus / (tp x pp x cp) = {self.dp}")
        if self.gpn % self.tp:
            raise Skip(f"tp {self.tp} does not divide the {self.gpn} GPUs of a node")
        if self.ep > 1 and (self.dp * self.cp) % self.ep:
            raise Skip(f"ep {self.ep} does not divide the {self.dp * self.cp} data x context ranks it is carved from")
        self.parallel = {}
        if self.tp > 1:
            self.parallel["tensor"] = self.tp
            if row.get("sequence_parallel") is True:
                self.parallel["sequence_parallel"] = True
        if self.pp > 1:
            self.parallel["pipeline"] = self.pp
            if self.vpp > 1:
                self.parallel["virtual_stages"] = self.vpp
            chunks = self.pp * self.vpp
            layers = leading_int(row.get("layers"), "layers")
            if layers % chunks:
                # Megatron's uneven split: the embedding and/or loss counted as layers (the Llama 3 recipe for
                # 126 layers); a row that publishes its first/last stage layers is not translated yet.
                for extra, fields in ((2, ("account_for_embedding_in_split", "account_for_loss_in_split")),
                                      (1, ("account_for_embedding_in_split",))):
                    if (layers + extra) % chunks == 0:
                        self.parallel.update({field: True for field in fields})
                        break
                else:
                    raise Skip(f"{layers} layers do not split over pp x vpp = {chunks} chunks, even with the "
                               "embedding and loss counted (the first/last stage layers are not published)")
        if self.cp > 1:
            self.parallel["context"] = self.cp

    def group(self, n, what):
        """The [s0, s1] sharding group of 1 < n < dp data-parallel ranks."""
        rpn = self.rpn
        if self.pp > 1 or self.cp > 1:
            raise Skip(f"{what} over {n} of {self.dp} data-parallel ranks with pipeline or context parallelism "
                       "is not translated yet")
        if n <= rpn and rpn % n == 0:
            return [n, 1]
        if n > rpn and n % rpn == 0 and self.dp % n == 0:
            return [rpn, n // rpn]
        raise Skip(f"{what} over {n} ranks does not tile nodes of {rpn} data-parallel ranks")


PRESET_OF_SHARDED = {  # which states span all data-parallel ranks -> the preset that shards exactly those
    (False, False, False): "ddp", (False, False, True): "zero1", (False, True, True): "zero2",
    (True, True, True): "zero3",
}


def sharding_policy(layout, what, p=1, g=1, os=1):
    """(policy, family) sharding parameters, gradients and optimizer states each over p, g, os data-parallel
    ranks: 1 replicated, None (or dp and more) all of them — with context parallelism the data x context ranks,
    as Megatron's distributed optimizer and torchtitan's FSDP do. All-or-nothing shardings become hzp's
    presets, the rest explicit AMSP groups."""
    sizes = {"params": p, "grads": g, "optimizer": os}
    sizes = {state: None if n is None or n >= layout.dp else n for state, n in sizes.items()}
    partial = {state: n for state, n in sizes.items() if n is not None and n > 1}
    if not partial:
        key = tuple(n is None and layout.dp * layout.cp > 1 for n in sizes.values())
        if key not in PRESET_OF_SHARDED:
            raise Skip(f"sharding {what!r}: parameters sharded wider than their gradients is not translated")
        return {"preset": PRESET_OF_SHARDED[key]}, "flat"
    rpn = layout.rpn
    everything = [rpn, layout.dp // rpn] if layout.dp >= rpn else [layout.dp, 1]
    groups = {}
    for state, n in sizes.items():
        groups[state] = [1, 1] if n == 1 else everything if n is None else layout.group(n, what)
    if all(g == [rpn, 1] for g in groups.values()):
        return {"preset": "hsdp"}, "hierarchical"  # MiCS / HSDP: everything sharded inside the node
    return {"preset": "amsp", "sharding": groups}, "hierarchical"


def policy_of(row, layout):
    """(policy JSON, family): family is 'flat' when every sharded state spans all data-parallel ranks,
    'hierarchical' when some state is sharded over a part of them, or the row names a group by its size
    (InternEvo's zero1=N, MiCS, HSDP) even where that group is all of its GPUs (the pair the ratio compares)."""
    text = (row.get("zero_or_sharding") or "").lower()
    framework = framework_of(row)
    what = row.get("zero_or_sharding")

    def over(default=None):
        m = re.search(r"(?:over|within|degree)\s+(\d+)\s*(?:dp\s+)?(?:gpus|ranks|accelerators)?", text)
        return int(m.group(1)) if m else default

    states = functools.partial(sharding_policy, layout, what)
    family = "flat"
    zero1 = re.search(r"zero1\s*=\s*(-?\d+)", text)
    if zero1 or "zero-1 over all" in text or "hybrid zero-1" in text:  # InternEvo's zero1 knob
        n = int(zero1.group(1)) if zero1 else (-1 if "over all" in text else over())
        if n is None:
            raise Skip(f"hybrid ZeRO-1 without a group size: {what!r}")
        policy, family = states(os=None if n == -1 else n)
        family = "flat" if n == -1 else "hierarchical"  # zero1=N names a group, whatever the scale
    elif "mics" in text or "hsdp" in text or "hybrid_shard" in text or "hybrid shard" in text:
        m = re.search(r"s_p\s*=\s*(?:s_g\s*=\s*)?(?:s_os\s*=\s*)?(\d+)", text)
        n = int(m.group(1)) if m else over(layout.rpn)
        policy, family = states(p=n, g=n, os=n)
        family = "hierarchical"  # a group named by its size, whatever the scale
    elif text.startswith("amsp") or "s_os" in text:  # AMSP: s_p=..., s_g=..., s_os=...
        sizes = {}
        for chain, value in re.findall(r"((?:s_(?:p|g|os)\s*=\s*)+)(\d+)", text):
            for state in re.findall(r"s_(p|g|os)", chain):
                sizes[state] = int(value)
        if set(sizes) != {"p", "g", "os"}:
            raise Skip(f"AMSP sharding without s_p, s_g and s_os: {what!r}")
        policy, family = states(**sizes)
    elif "zero++" in text or "zeropp" in text or "hpz" in text:
        policy = {"preset": "zeropp"}
    elif re.search(r"zero-?3|zero stage 3|fsdp|fully_shard|full sharding", text):
        n = over(None)  # FSDP's degree counts data ranks; all of them means data x context (sharding_policy)
        policy, family = states(p=n, g=n, os=n)
    elif re.search(r"zero-?2", text):
        n = over(None)
        policy, family = states(g=n, os=n)
    elif re.search(r"zero-?1|distributed optimizer", text):
        n = over(None)
        policy, family = states(os=n)
    elif re.search(r"\bddp\b|data parallel|no sharding|none", text):
        policy, family = states()
    else:
        raise Skip(f"sharding {what!r} is not translated yet")
    comm = {}
    if "deepspeed" in text or "mics" in text or "zero++" in text:
        framework = "deepspeed"
    elif "fsdp" in text or "fully_shard" in text:
        framework = "fsdp"
    if framework:
        comm["framework"] = framework
    if framework == "megatron" and "param-gather" in text.replace("param gather", "param-gather"):
        comm["refresh_overlap"] = True  # --overlap-param-gather
    if comm:
        policy["comm"] = comm
    if layout.parallel:
        policy["parallel"] = dict(layout.parallel)
    if layout.ep > 1:
        policy["expert_parallel"] = layout.ep
    return policy, family


def nic_of(row, nodes):
    """cluster.nic from the row's inter-node text; None on one node when the text names no NIC (unused)."""
    text = row.get("inter_node") or ""
    m = re.search(r"(\d+)\s*x\s*(\d+)\s*Gb", text)
    if m:
        return {"per_node": int(m.group(1)), "bandwidth_Gbps": float(m.group(2))}
    m = re.search(r"(\d+)\s*x\s*(?:[\w-]+\s+)*?(EDR|HDR|NDR|XDR)\b", text)
    if m:
        return {"per_node": int(m.group(1)), "bandwidth_Gbps": float(INFINIBAND_GBPS[m.group(2)])}
    m = re.search(r"(\d+)\s*Gb(?:/s|ps)?\s+per\s+GPU", text)
    if m:
        return {"per_node": row["gpus_per_node"], "bandwidth_Gbps": float(m.group(1))}
    if nodes == 1:
        return None
    raise Skip(f"inter_node {row.get('inter_node')!r}: NIC count and rate not found")


def is_gpt3(row):
    return bool(re.search(r"\bgpt-?3\b", str(row.get("model") or "").lower()))


def dropout_of(row):
    """training's dropout fields: GPT-3 runs NeMo's GPT config (hidden_dropout 0.1, attention_dropout 0.1, as in
    dgxc-benchmarking's gpt3_175b_hydra.yaml, and Megatron-LM's defaults); the LLaMA-family recipes run none."""
    return {"hidden_dropout": 0.1, "attention_dropout": 0.1} if is_gpt3(row) else {}


def architecture_of(row, seq_len):
    """(model fields, note) for the row's layer type. GPT-3 (NeMo's GPT config: GELU MLP with biases, learned
    positions, tied head) by its name; a squared-ReLU or GELU MLP (two matrices) where the row says so;
    otherwise LLaMA's (SwiGLU, three matrices; RMSNorm, rotary, untied head)."""
    name = str(row.get("model") or "")
    said = f"{name} {row.get('other') or ''}".lower()
    if is_gpt3(row):
        return ({"family": "gpt", "mlp": "gelu", "tied_embeddings": True, "position": "learned",
                 "max_positions": seq_len}, "GPT-3: GELU MLP with biases, learned positions, tied head, dropout 0.1")
    if re.search(r"squared[- ]?relu|relu2|relu\^2|relu²", said):
        return {"family": "llama", "mlp": "squared_relu", "tied_embeddings": False}, None
    if re.search(r"\bgelu\b", said):
        return {"family": "llama", "mlp": "gelu", "tied_embeddings": False}, None
    return {"family": "llama", "mlp": "swiglu", "tied_embeddings": False}, None


def precision_of(row):
    """(training.precision, fp8, assumption or None): FP8 runs keep bf16 weights, gradients and
    communication (Transformer Engine's default; the gradients are reduced as the framework reduces them
    under bf16); only the linear layers' GEMMs run in FP8."""
    text = row.get("precision") or "bf16"
    if not isinstance(text, str):
        raise Skip(f"precision {text!r} is not a name (bf16, fp16, fp32, FP8)")
    text = text.lower()
    if "fp8" in text or "float8" in text:
        return "bf16", True, ("FP8: linear-layer GEMMs in FP8, everything else (and all states and communication, "
                              "but gradients a framework reduces in fp32) in bf16")
    for name in ("bf16", "fp16", "fp32"):
        if name in text:
            return name, False, None
    raise Skip(f"precision {row.get('precision')!r} is not translated")


def kernels_of(row):
    """(training.kernels, assumption or None): torchtitan without torch.compile runs the model code in PyTorch
    eager, one kernel per operation (its norms, rotary embedding, SwiGLU and loss unfused); every other
    framework here runs fused kernels (Transformer Engine, Megatron's, InternEvo's, DeepSpeed's, or
    torch.compile's)."""
    framework = (row.get("framework") or "").lower()
    said = f"{row.get('other') or ''} {row.get('zero_or_sharding') or ''}".lower()
    if "torchtitan" in framework and "compile" not in said:
        return "eager", "PyTorch eager: norms, rotary embedding, SwiGLU and loss unfused (training.kernels)"
    return "fused", None


def recompute_of(row):
    text = row.get("act_recompute") or "none"
    if not isinstance(text, str):
        raise Skip(f"act_recompute {text!r} is not a name (none, selective, full)")
    text = text.lower()
    if text.startswith("none") or text in ("false", "no"):
        return "none", None
    if text.startswith("selective"):
        return "selective", None
    if text.startswith("full") or text.startswith("true"):
        return "full", None
    if "not stated" in text:
        return "none", "activation recomputation not stated: none assumed"
    raise Skip(f"act_recompute {row.get('act_recompute')!r} is not translated")


def global_tokens(row):
    """Tokens per optimizer step, from global_batch_tokens (a number, or text with "= N tokens") or
    global_batch_seqs x seq_len; None when neither is published."""
    value = row.get("global_batch_tokens")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value)
    m = re.search(r"=\s*(\d+)\s*tokens", str(value or ""))
    if m:
        return int(m.group(1))
    if row.get("global_batch_seqs") is not None:
        return leading_int(row["global_batch_seqs"], "global_batch_seqs") * row["seq_len"]
    return None


def grad_accum_of(row, layout, micro):
    if row.get("grad_accum") is not None:
        return leading_int(row["grad_accum"], "grad_accum")
    tokens = global_tokens(row)
    per_step = layout.dp * micro * row["seq_len"]
    if tokens is None or tokens % per_step:
        raise Skip(f"grad_accum not published and the global batch ({tokens} tokens) is not a whole number of "
                   f"dp x micro_batch x seq_len = {per_step}")
    return tokens // per_step


def positive(row, key):
    """The row's number at key, None when not published; Skip when it is not a positive number."""
    value = row.get(key)
    if value is None:
        return None
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or value == float("inf"):
        raise Skip(f"{key} {value!r} is not a positive number")
    return float(value)


def published_of(row):
    """(metric, value): 'tgs' (tokens/s/GPU: as published, or from the step time) or 'mfu' (a fraction)."""
    tgs, step, mfu = (positive(row, k) for k in ("tokens_per_s_per_gpu", "step_time_s", "mfu_pct"))
    if tgs:
        return "tgs", tgs
    tokens = global_tokens(row)
    if step and tokens:
        return "tgs", tokens / step / row["gpu_count"]
    if mfu:
        if mfu > 100:
            raise Skip(f"mfu_pct {mfu} is above 100")
        return "mfu", mfu / 100
    raise Skip("no throughput published (tokens/s/GPU, step time or MFU)")


def scenario_of(row, cluster_extra):
    """(scenario, family, assumptions) of a row on its own GPUs, without calibration; `cluster_extra`: more
    cluster fields (compute_spread, overlap_slowdown, protocol)."""
    for key in ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "gpu_count", "gpus_per_node"):
        if row.get(key) is None:
            raise Skip(f"{key} not published")
        if not isinstance(row[key], int) or isinstance(row[key], bool) or row[key] < 1:
            raise Skip(f"{key} {row[key]!r} is not a positive whole number")
    preset = next((p for sub, p in GPU_PRESETS if sub in (row.get("gpu") or "")), None)
    if preset is None:
        raise Skip(f"GPU {row.get('gpu')!r} has no cluster preset")
    gpus = row["gpu_count"]
    gpn = row["gpus_per_node"]
    if gpus < gpn:
        gpn = gpus  # part of one node: a node of that many GPUs
    if gpus % gpn:
        raise Skip(f"{gpus} GPUs are not whole nodes of {gpn}")
    if row.get("micro_batch") is None:
        raise Skip("micro_batch not published")
    layout = Layout({**row, "gpus_per_node": gpn})
    micro = leading_int(row.get("micro_batch"), "micro_batch")
    accum = grad_accum_of(row, layout, micro)
    policy, family = policy_of(row, layout)
    precision, fp8, precision_note = precision_of(row)
    recompute, recompute_note = recompute_of(row)
    kernels, kernels_note = kernels_of(row)
    # kv_heads: not published means multi-head attention, said so; published, it must be a head count (a 0 or
    # [] silently became multi-head attention).
    kv_heads, kv_note = row.get("kv_heads"), None
    if kv_heads is None:
        kv_heads, kv_note = row["heads"], "kv_heads not published: multi-head attention assumed"
    elif not isinstance(kv_heads, int) or isinstance(kv_heads, bool) or not 1 <= kv_heads <= row["heads"]:
        raise Skip(f"kv_heads {kv_heads!r} is not a head count in [1, heads = {row['heads']}]")
    architecture, architecture_note = architecture_of(row, row["seq_len"])
    model = {
        "name": row.get("model", "model"), "layers": row["layers"], "hidden": row["hidden"],
        "heads": row["heads"], "kv_heads": kv_heads, "ffn_hidden": row["ffn"], "vocab": row["vocab"],
        **architecture,
    }
    if row.get("moe_experts") is not None:
        experts, top_k = positive(row, "moe_experts"), positive(row, "moe_topk")
        expert_ffn = positive(row, "moe_ffn") or row["ffn"]
        if not top_k:
            raise Skip("a MoE row without moe_topk")
        model["moe"] = {"experts": int(experts), "top_k": int(top_k), "expert_ffn_hidden": int(expert_ffn)}
    elif layout.ep > 1:
        raise Skip(f"ep {layout.ep} on a model without experts (moe_experts not published)")
    cluster = {"preset": preset, "nodes": gpus // gpn, "gpus_per_node": gpn, **cluster_extra}
    if fp8 and preset not in FP8_PRESETS:
        raise Skip(f"FP8 on {row.get('gpu')!r}: preset {preset} has no FP8 peak")
    nic = nic_of(row, gpus // gpn)
    if nic:
        cluster["nic"] = nic
    # Gradients reduced in fp32 under bf16: torchtitan (training.mixed_precision_reduce = "float32") and
    # Megatron-FSDP (NeMo's recipes: DistributedDataParallelConfig(grad_reduce_in_fp32=True)); Megatron's own
    # distributed optimizer gets it from policy.comm.framework "megatron".
    name = (row.get("framework") or "").lower()
    megatron_fsdp = ("megatron" in name or "nemo" in name) and policy.get("comm", {}).get("framework") == "fsdp"
    if precision == "bf16" and ("torchtitan" in name or megatron_fsdp):
        policy.setdefault("comm", {})["grad_reduce_in_fp32"] = True
    doc = {
        "name": f"{row['id']}-{gpus}",
        "model": model,
        "cluster": cluster,
        "training": {
            "seq_len": row["seq_len"], "micro_batch": micro, "global_batch_sequences": layout.dp * micro * accum,
            "precision": precision, "recompute": recompute,
            "flash_attention": bool(row.get("flash_attention", True)), "fp8": fp8, "kernels": kernels,
            **dropout_of(row),
        },
        "policy": policy,
    }
    return doc, family, [n for n in (precision_note, recompute_note, kernels_note, kv_note, architecture_note) if n]


CONFIG_FIELDS = ("layers", "hidden", "heads", "ffn", "vocab", "seq_len", "gpu", "gpus_per_node", "micro_batch",
                 "framework", "tp", "pp", "vpp", "cp", "sequence_parallel", "precision", "act_recompute", "other")
# What a one-node row must share, at the least, to stand in for another configuration's calibration.
NEAREST_FIELDS = ("gpu", "framework", "precision")


def config_key(row):
    """What a one-node calibration row must share with the row it calibrates: the model, GPU, sequence,
    micro-batch, framework, parallel layout, precision, recomputation and the row's other settings (compilation,
    packing): not the sharding, nor the scale."""
    return tuple(str(row.get(k)) for k in CONFIG_FIELDS)


def calibration_candidates(row, one_node_rows, exact_only):
    """(kind, one-node rows to try in order): 'same' configuration (the same sharding first), else 'nearest' —
    the same GPU, framework and precision, most other configuration fields in common first (the efficiencies
    are fractions of the GPU's peak, so another model's run on the same GPU and software is the next best
    measurement); else none."""
    same = [c for c in one_node_rows if config_key(c) == config_key(row)]
    if same:
        return "same", sorted(same, key=lambda c: c.get("zero_or_sharding") != row.get("zero_or_sharding"))
    if exact_only:
        return "same", []
    near = [c for c in one_node_rows if all(str(c.get(k)) == str(row.get(k)) for k in NEAREST_FIELDS)]
    return "nearest", sorted(near, key=lambda c: (-sum(str(c.get(k)) == str(row.get(k)) for k in CONFIG_FIELDS),
                                                 c.get("zero_or_sharding") != row.get("zero_or_sharding")))


def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True)


INPUTS = []  # the files main() read: never replaced by a file of the work folder


class OutputError(Exception):
    """A file of the work folder or the report that cannot be written: the run stops (exit 2)."""


def write_new(path, text):
    """`text` as a new regular file at `path`: what was there (a leftover, a link, a FIFO that would block the
    open) is removed first and the file created exclusively, never through a link; an input is refused."""
    for given in INPUTS:
        if os.path.lexists(path) and os.path.exists(given) and os.path.samefile(path, given):
            raise OutputError(f"{path}: is an input ({given}); use another --out folder")
    try:
        create_new_file(path, text)
    except OSError as e:
        raise OutputError(f"{path}: cannot be written ({e.strerror})") from None


def calibrate(hzp, row, workdir, cluster_extra):
    doc, _, _ = scenario_of(row, cluster_extra)
    path = os.path.join(workdir, f"cal-{row['id']}.json")
    write_new(path, json.dumps(doc))
    out = path + ".fitted.json"
    metric, value = published_of(row)
    flag = "--tokens-per-gpu-s" if metric == "tgs" else "--mfu"
    r = run([hzp, "calibrate", path, flag, repr(value), "--out", out])
    if r.returncode != 0:
        raise Skip(f"calibration on {row['id']} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    with open(out) as f:
        return json.load(f)["cluster"]["efficiency"]


def simulate(hzp, doc, workdir):
    path = os.path.join(workdir, doc["name"] + ".json")
    write_new(path, json.dumps(doc))
    outdir = os.path.join(workdir, doc["name"])
    r = run([hzp, "simulate", path, "--timeline-ranks", "1", "--out", outdir])
    if r.returncode != 0:
        return None, (r.stderr or r.stdout).strip().splitlines()[-1:]
    with open(os.path.join(outdir, "summary.json")) as f:
        s = json.load(f)
    return s, None


MAX_ROWS_BYTES = 64 << 20  # far above any published table
ROW_ID = re.compile(r"[A-Za-z0-9_.+-]{1,100}")


def load_rows(path):
    """Rows of a JSONL file; ValueError naming the file (and line) for anything else: not a regular file (a FIFO,
    /dev/zero), over MAX_ROWS_BYTES, not JSON, nested too deep, not an object, an id that is not a short name."""
    try:
        text = read_regular_file(path, MAX_ROWS_BYTES).decode("utf-8", errors="replace")
    except OSError as e:
        raise ValueError(f"{path}: {e.strerror}") from None
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None
    rows, seen = [], {}
    for n, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not JSON: {e}") from None
            except RecursionError:
                raise ValueError(f"{path}:{n}: nested too deep to be a row") from None
            except ValueError as e:  # an integer of more digits than Python converts
                raise ValueError(f"{path}:{n}: {str(e)[:200]}") from None
            if not isinstance(row, dict):
                raise ValueError(f"{path}:{n}: a row must be a JSON object")
            if "id" not in row:
                raise ValueError(f"{path}:{n}: a row needs an id (it names the row and its files)")
            if not (isinstance(row["id"], str) and ROW_ID.fullmatch(row["id"])):
                raise ValueError(f"{path}:{n}: id must be 1 to 100 letters, digits or _.+- (it names files), "
                                 f"got {str(row['id'])[:40]!r}")
            if row["id"] in seen:
                raise ValueError(f"{path}:{n}: id {row['id']} is also line {seen[row['id']]}'s")
            seen[row["id"]] = n
            rows.append(row)
    if not rows:  # nothing to validate is bad input (exit 2), as the ninth attack of issue 35 had it
        raise ValueError(f"{path}: holds no rows")
    return rows


def writable_file(path, flag, inputs=()):
    """An output file's folder exists and can be written, what is there is a regular file (a FIFO would block
    the write) and it is none of the inputs (checked before any work)."""
    if not path:
        raise ValueError(f"{flag}: an empty path")
    folder = os.path.dirname(os.path.abspath(path)) or "."
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        raise ValueError(f"{flag} {path}: cannot be written")
    if os.path.lexists(path):
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ValueError(f"{flag} {path}: exists and is not a regular file")
        for given in inputs:
            if given and os.path.exists(given) and os.path.samefile(path, given):
                raise ValueError(f"{flag} {path}: is an input ({given}); it would be overwritten")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("rows")
    ap.add_argument("--hzp", default="build/hzp")
    ap.add_argument("--calibration", help="one-node rows to calibrate from (default: ROWS itself)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--out", help="keep scenarios and summaries here (default: a temporary folder)")
    ap.add_argument("--json", help="write the report as JSON")
    ap.add_argument("--compute-spread", type=number(0, 0.2), default=0.0,
                    help="cluster.compute_spread of every scenario (per-GPU speed variability; 0: identical GPUs)")
    ap.add_argument("--overlap-slowdown", type=number(0, 1),
                    help="cluster.overlap_slowdown of every scenario (compute slowed while a collective of the "
                         "same GPU transfers; 0: no interference; default: hzp's, the measured 0.189)")
    ap.add_argument("--protocol", choices=["simple", "ll", "ll128", "auto"], default="simple",
                    help="cluster.protocol of every scenario (NCCL's protocol; auto: NCCL's own choice)")
    ap.add_argument("--routing", choices=["balanced", "ecmp"],
                    help="cluster.inter_node.routing of every scenario (default: hzp's, balanced)")
    ap.add_argument("--placement", choices=["contiguous", "scattered"],
                    help="cluster.inter_node.placement of every scenario (default: hzp's, contiguous)")
    ap.add_argument("--rail-optimized", action="store_true",
                    help="cluster.inter_node.rail_optimized (with --routing ecmp)")
    ap.add_argument("--seed", type=int, help="cluster.inter_node.seed (ECMP hash and scattered placement)")
    ap.add_argument("--no-tensor-comm-overlap", action="store_true",
                    help="leave policy.parallel.tensor_comm_overlap off for the rows that name tp_comm_overlap "
                         "(Transformer Engine's userbuffers) and run sequence parallelism (default: on, as they "
                         "ran; see sim/README.md)")
    ap.add_argument("--exact-calibration", action="store_true",
                    help="skip a row without a one-node row of its own configuration (default: calibrate on the "
                         "nearest one-node run of the same GPU, framework and precision, else use the preset's "
                         "table efficiencies, and say so)")
    ap.add_argument("--only", metavar="IDS", help="report only these rows (comma-separated ids of ROWS)")
    ap.add_argument("--calibrate-on", metavar="IDS",
                    help="calibrate only on these one-node rows (comma-separated ids of the calibration rows): "
                         "to carry one configuration's calibration to others, e.g. along a sequence-length series")
    ap.add_argument("--max-error", type=number(0, 1e6))
    ap.add_argument("--min-ratio", type=number(0, 1e6))
    ap.add_argument("--max-ratio", type=number(0, 1e6))
    args = ap.parse_args()
    if args.jobs < 1 or args.jobs > 64:
        ap.error("--jobs must be in [1, 64]")
    if args.seed is not None and not 0 <= args.seed <= 2**31 - 1:
        ap.error("--seed must be in [0, 2147483647]")
    if args.rail_optimized and args.routing != "ecmp":
        ap.error("--rail-optimized needs --routing ecmp")
    try:
        check_executable(args.hzp, "--hzp")
    except ValueError as e:
        ap.error(str(e))
    try:
        rows = load_rows(args.rows)
        cal_rows = load_rows(args.calibration) if args.calibration else rows
        rows = select_ids(rows, args.only, "--only", args.rows)
        cal_rows = select_ids(cal_rows, args.calibrate_on, "--calibrate-on", args.calibration or args.rows)
        if args.json is not None:
            writable_file(args.json, "--json", (args.rows, args.calibration))
        if args.out == "":
            raise ValueError("--out: an empty path")
        if args.out:
            if os.path.exists(args.out) and not os.path.isdir(args.out):
                raise ValueError(f"--out {args.out}: exists and is not a folder")
            try:
                os.makedirs(args.out, exist_ok=True)
            except OSError as e:
                raise ValueError(f"--out {args.out}: cannot be created ({e.strerror})") from None
            if not os.access(args.out, os.W_OK):
                raise ValueError(f"--out {args.out}: cannot be written")
    except (OSError, ValueError) as e:
        print(f"validate_rows: {e}", file=sys.stderr)
        return 2
    INPUTS.extend(p for p in (args.rows, args.calibration, args.hzp) if p)
    try:
        if args.out:
            return report_rows(args, rows, cal_rows, args.out)
        with tempfile.TemporaryDirectory(prefix="hzp-validate-") as workdir:
            return report_rows(args, rows, cal_rows, workdir)
    except OutputError as e:
        print(f"validate_rows: {e}", file=sys.stderr)
        return 2


def select_ids(rows, ids, flag, path):
    """The rows named by a comma-separated list of ids (all rows for None); ValueError for an unknown id."""
    if ids is None:
        return rows
    wanted = [i.strip() for i in ids.split(",") if i.strip()]
    if not wanted:
        raise ValueError(f"{flag}: no row id given")
    known = {str(r.get("id")) for r in rows}
    missing = [i for i in wanted if i not in known]
    if missing:
        raise ValueError(f"{flag}: no row {', '.join(missing)} in {path}")
    return [r for r in rows if str(r.get("id")) in wanted]


def report_rows(args, rows, cal_rows, workdir):
    # One-node rows that publish a throughput, in file order.
    one_node = []
    for r in cal_rows:
        try:
            if not positive(r, "gpu_count") or r["gpu_count"] > (positive(r, "gpus_per_node") or 0):
                continue
            published_of(r)
        except Skip:
            continue  # not a usable one-node row (says why when it is simulated as a row of its own)
        one_node.append(r)

    efficiencies = {}  # calibration row id -> fitted efficiencies, or the Skip that its calibration raised
    jobs, skipped = [], []
    for row in rows:
        try:
            extra = {"compute_spread": args.compute_spread, "protocol": args.protocol}
            if args.overlap_slowdown is not None:
                extra["overlap_slowdown"] = args.overlap_slowdown
            fabric = {"routing": args.routing, "placement": args.placement, "seed": args.seed,
                      "rail_optimized": True if args.rail_optimized else None}
            if any(v is not None for v in fabric.values()):
                extra["inter_node"] = {k: v for k, v in fabric.items() if v is not None}
            doc, family, assumptions = scenario_of(row, extra)
            metric, published = published_of(row)
            kind, candidates = calibration_candidates(row, one_node, args.exact_calibration)
            cal = None
            for c in candidates:
                if c["id"] not in efficiencies:
                    try:
                        efficiencies[c["id"]] = calibrate(args.hzp, c, workdir, extra)
                    except Skip as e:
                        efficiencies[c["id"]] = e
                if not isinstance(efficiencies[c["id"]], Skip):
                    cal = c
                    break
            if cal is not None:
                doc["cluster"]["efficiency"] = efficiencies[cal["id"]]
                if kind == "nearest":
                    differs = [k for k in CONFIG_FIELDS if str(cal.get(k)) != str(row.get(k))]
                    assumptions.append(f"calibrated on {cal['id']}, a one-node run differing in {', '.join(differs)}")
                cal_id = cal["id"]
            elif candidates and kind == "same":
                raise efficiencies[candidates[0]["id"]]
            elif args.exact_calibration:
                raise Skip("no one-node row of the same model, GPU, sequence, micro-batch, framework, parallel "
                           "layout, precision, recomputation and other settings to calibrate from")
            else:
                kind, cal_id = "table", "table"
                assumptions.append("no one-node row of this GPU and framework: the preset's table efficiencies")
            parallel = doc["policy"].get("parallel", {})
            if not args.no_tensor_comm_overlap and "tp_comm_overlap" in str(row.get("other") or "") and \
                    parallel.get("sequence_parallel"):
                parallel["tensor_comm_overlap"] = True
            jobs.append((row, doc, family, cal_id, kind, metric, published, assumptions))
        except Skip as e:
            skipped.append((row.get("id"), str(e)))
        except (TypeError, ValueError, ZeroDivisionError) as e:  # a field of an unexpected type or value
            skipped.append((row.get("id"), f"malformed row: {type(e).__name__}: {e}"))

    results = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(simulate, args.hzp, job[1], workdir) for job in jobs]
        for (row, doc, family, cal_id, kind, metric, published, assumptions), fut in zip(jobs, futures):
            summary, err = fut.result()
            if summary is None:
                skipped.append((row["id"], f"simulation failed: {err}"))
                continue
            simulated_value = summary["tokens_per_gpu_per_s"] if metric == "tgs" else summary["mfu"]
            error = 100 * (simulated_value - published) / published
            # Tokens/s/GPU in both columns: an MFU row's published value is carried over at the simulated
            # run's FLOPs per token (the error is the same either way).
            published_tgs = published if metric == "tgs" else summary["tokens_per_gpu_per_s"] * published / \
                summary["mfu"]
            results.append({
                "id": row["id"], "gpus": row["gpu_count"], "family": family, "calibrated_on": cal_id,
                "calibration": kind, "model": str(row.get("model") or "model"),
                "model_family": doc["model"]["family"], "mlp": doc["model"]["mlp"],
                "hidden_dropout": doc["training"].get("hidden_dropout", 0),
                "attention_dropout": doc["training"].get("attention_dropout", 0),
                "series": "/".join(config_key(row)), "policy": doc["policy"],
                "multi_node": row["gpu_count"] > row["gpus_per_node"], "metric": metric,
                "published": published, "simulated": simulated_value, "published_tgs": published_tgs,
                "simulated_tgs": summary["tokens_per_gpu_per_s"], "error_pct": error,
                "exposed_comm_s": summary.get("exposed_comm_s"), "step_time_s": summary.get("step_time_s"),
                "sim_wall_s": summary.get("sim_wall_s"), "assumptions": assumptions,
            })

    def label(r):
        p = r["policy"]
        text = p["preset"] if p["preset"] != "amsp" else "P{} G{} OS{}".format(
            *(str(p["sharding"][s]).replace(" ", "") for s in ("params", "grads", "optimizer")))
        par = p.get("parallel", {})
        extra = "".join(f" {k[0]}{v}" for k, v in (("tensor", par.get("tensor")), ("pipeline", par.get("pipeline")),
                                                    ("context", par.get("context"))) if v)
        extra += f" e{p['expert_parallel']}" if p.get("expert_parallel") else ""
        return text + extra + ("/" + p["comm"]["framework"] if "framework" in p.get("comm", {}) else "")

    series_ids = {}
    for r in results:
        series_ids.setdefault(r["series"], len(series_ids) + 1)
    print(f"{'row':8} {'GPUs':>5} {'policy':30} {'published':>9} {'hzp':>7} {'error':>7}  exposed comm")
    for r in sorted(results, key=lambda r: (series_ids[r["series"]], r["family"], r["gpus"], r["id"])):
        note = "  (calibration row)" if not r["multi_node"] and r["calibrated_on"] == r["id"] else ""
        if r["metric"] == "mfu":
            note += f"  (MFU {100 * r['published']:.1f} % published, {100 * r['simulated']:.1f} % simulated)"
        if r["assumptions"]:
            note += "  [" + "; ".join(r["assumptions"]) + "]"
        print(f"{r['id']:8} {r['gpus']:5d} {label(r):30} {r['published_tgs']:9.0f} {r['simulated_tgs']:7.0f} "
              f"{r['error_pct']:+6.1f}%  {r['exposed_comm_s']:.3f} s{note}")
    multi = [abs(r["error_pct"]) for r in results if r["multi_node"]]
    report = {"rows": results, "skipped": [{"id": i, "why": w} for i, w in skipped], "ratios": []}
    if multi:
        report["median_abs_error_pct"] = statistics.median(multi)
        report["worst_abs_error_pct"] = max(multi)
        kinds = [r["calibration"] for r in results if r["multi_node"]]
        print(f"multi-node rows: {len(multi)}, median |error| {statistics.median(multi):.1f} %, "
              f"worst {max(multi):.1f} % (calibrated on their own configuration: {kinds.count('same')}, on the "
              f"nearest one-node run: {kinds.count('nearest')}, table efficiencies: {kinds.count('table')})")
    # Per series (one configuration, one policy, several scales): the error at its smallest and largest scale,
    # so that a level error (the same at every scale: compute) is told from a scaling error (communication).
    report["series"] = []
    by_series = {}
    for r in results:
        if r["multi_node"]:
            by_series.setdefault((series_ids[r["series"]], label(r)), []).append(r)
    for (series, policy), rows in sorted(by_series.items()):
        if len(rows) < 2:
            continue
        rows.sort(key=lambda r: (r["gpus"], r["id"]))
        small, large = rows[0], rows[-1]
        errors = [r["error_pct"] for r in rows]
        report["series"].append({"series": series, "policy": policy, "model": small["model"], "rows": len(rows),
                                 "smallest": {"id": small["id"], "gpus": small["gpus"], "error_pct": small["error_pct"]},
                                 "largest": {"id": large["id"], "gpus": large["gpus"], "error_pct": large["error_pct"]},
                                 "min_error_pct": min(errors), "max_error_pct": max(errors)})
        print(f"series {series} {small['model']} ({policy}, {len(rows)} rows): {small['gpus']} GPUs "
              f"{small['error_pct']:+.1f} %, {large['gpus']} GPUs {large['error_pct']:+.1f} % (scaling "
              f"{large['error_pct'] - small['error_pct']:+.1f} points; range {min(errors):+.1f} … {max(errors):+.1f} %)")
    # The hierarchical / flat ratio, where one configuration ran one of each at the same scale.
    pairs = {}
    for r in results:
        pairs.setdefault((series_ids[r["series"]], r["gpus"]), {}).setdefault(r["family"], []).append(r)
    for (series, gpus), pair in sorted(pairs.items()):
        if len(pair.get("flat", [])) == 1 and len(pair.get("hierarchical", [])) == 1:
            flat, hier = pair["flat"][0], pair["hierarchical"][0]
            pub = hier["published_tgs"] / flat["published_tgs"]
            sim = hier["simulated_tgs"] / flat["simulated_tgs"]
            report["ratios"].append({"series": series, "gpus": gpus, "flat": flat["id"], "hierarchical": hier["id"],
                                     "published": pub, "simulated": sim})
            print(f"hierarchical / flat at {gpus:5d} GPUs ({hier['id']} / {flat['id']}): published {pub:.2f}x, "
                  f"hzp {sim:.2f}x ({100 * (sim - pub) / pub:+.1f} %)")
    for i, why in skipped:
        print(f"skipped {i}: {why}")
    if args.json:  # whole or not at all: a temporary file renamed over the old one (a link is replaced)
        tmp = args.json + ".tmp"
        write_new(tmp, json.dumps(report, indent=1))
        try:
            os.replace(tmp, args.json)
        except OSError as e:
            raise OutputError(f"--json {args.json}: cannot be written ({e.strerror})") from None

    failed = []
    # --max-error holds every prediction: the multi-node rows, and one-node rows calibrated on another row.
    predicted = [abs(r["error_pct"]) for r in results if r["multi_node"] or r["calibrated_on"] != r["id"]]
    if args.max_error is not None and predicted and max(predicted) > args.max_error:
        failed.append(f"worst predicted error {max(predicted):.1f} % > {args.max_error} %")
    if report["ratios"] and (args.min_ratio is not None or args.max_ratio is not None):
        largest = {}  # each configuration's largest scale
        for ratio in report["ratios"]:
            if ratio["gpus"] >= largest.get(ratio["series"], {"gpus": 0})["gpus"]:
                largest[ratio["series"]] = ratio
        for ratio in largest.values():
            top = ratio["simulated"]
            if (args.min_ratio is not None and top < args.min_ratio) or \
                    (args.max_ratio is not None and top > args.max_ratio):
                failed.append(f"hierarchical/flat ratio {top:.2f} at {ratio['gpus']} GPUs outside "
                              f"[{args.min_ratio}, {args.max_ratio}]")
    if not results:  # an empty file, a broken --hzp, or every row malformed: nothing was checked
        failed.append(f"no row was validated ({len(skipped)} skipped)")
    if (args.max_error is not None or args.min_ratio is not None or args.max_ratio is not None) and not predicted:
        failed.append("no multi-node row was simulated, nor a one-node row calibrated on another")
    for f in failed:
        print(f"validate_rows: FAILED: {f}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
