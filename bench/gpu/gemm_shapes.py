#!/usr/bin/env python3
"""GEMM throughput by shape on one GPU, for issue 37's compute model by kernel shape: the linear layers of
the development rows' models (GPT-3 175B, Nemotron-4 15B, LLaMA-3.1 8B / 70B, LLaMA-2 7B) per GPU at tensor
parallelism 1, 2, 4 and 8, at micro-batches of 2 k, 4 k and 8 k tokens, and at the chunk a tensor-parallel
overlap runs (a quarter / an eighth of the tokens: Megatron's tp-comm-overlap and torchtitan's async-TP
split each GEMM so); each forward, input-gradient and weight-gradient product alone, and again while a
device-to-device copy runs on another stream (what userbuffers' copy kernels take from a GEMM: SMs and HBM).

    python3 bench/gpu/gemm_shapes.py [--type bf16|fp8] [--iters N] [--quick] [--copy-sms N]
                                     [--models NAME:TOKENS,...]

One JSON line per (model, tensor, tokens, op): m, k, n, fwd / dgrad / wgrad TFLOP/s (2·m·k·n / time, CUDA
events, median of N calls after a warm-up), the same beside the copy, and the copy's GB/s. --type fp8 times
torch._scaled_mm (tensorwise scales, e4m3 operands) for the forward only. --copy-sms N: the copy beside is a
kernel of N thread blocks (one per SM) looping over the buffer, instead of PyTorch's copy over every SM: what
Transformer Engine's userbuffers does to a GEMM, whose reduce-scatter kernels run on a few SMs (16 by default)
and move an NVLink's worth of bytes, not HBM's (rows carry "copy_sms"; needs Triton, as torch.compile does).
--quick: Nemotron-4 15B at 4 k tokens only. --models NAME:TOKENS,...: those models, each at its own tokens per
micro-batch (the development rows': nemotron4-15b:16384, gpt3-175b:2048), so the chunks are the ones their
overlap runs. Exit 2 on a bad argument or without a GPU. scenarios/validation/h100_kernels.json was measured the same way at 4 k and 16 k tokens.
"""
import json
import statistics
import sys

# name -> (hidden, ffn, heads, kv_heads, gated MLP): the published configurations.
MODELS = {
    "gpt3-175b": (12288, 49152, 96, 96, False),
    "nemotron4-15b": (6144, 24576, 48, 8, False),
    "llama3.1-8b": (4096, 14336, 32, 8, True),
    "llama3.1-70b": (8192, 28672, 64, 8, True),
    "llama2-7b": (4096, 11008, 32, 32, True),
}


def linear_shapes(hidden, ffn, heads, kv_heads, gated, tensor):
    """(op, k, n) of one layer's linear layers on one GPU of `tensor`: column-parallel split n, row k."""
    head_dim = hidden // heads
    qkv = (heads + 2 * kv_heads) * head_dim
    up = (2 if gated else 1) * ffn
    return [("qkv", hidden, qkv // tensor), ("attn_out", hidden // tensor, hidden),
            ("mlp_up", hidden, up // tensor), ("mlp_down", ffn // tensor, hidden)]


def sm_copy(torch, src, dst, sms):
    """A copy of src into dst by `sms` thread blocks looping over it (one block per SM), or None when Triton is
    missing (said on stderr). Both are uint8 buffers of a multiple of 16 KiB."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        print("gemm_shapes.py: --copy-sms needs Triton (import triton failed)", file=sys.stderr)
        return None

    @triton.jit
    def copy_loop(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
        start = tl.program_id(0) * BLOCK
        step = tl.num_programs(0) * BLOCK
        for offset in range(start, n, step):
            idx = offset + tl.arange(0, BLOCK)
            tl.store(dst_ptr + idx, tl.load(src_ptr + idx))

    words_src, words_dst = src.view(torch.int32), dst.view(torch.int32)  # 4-byte loads and stores
    n = words_src.numel()
    block = 4096  # n is a multiple of it: the loop needs no mask
    return lambda: copy_loop[(sms,)](words_src, words_dst, n, BLOCK=block, num_warps=8)


def main(argv):
    opts = {"--type": "bf16", "--iters": "20", "--copy-sms": "0", "--models": ""}
    quick = False
    i = 0
    while i < len(argv):
        if argv[i] in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if argv[i] == "--quick":
            quick = True
            i += 1
            continue
        if argv[i] not in opts or i + 1 >= len(argv):
            print(f"gemm_shapes.py: bad argument '{argv[i]}' (see --help)", file=sys.stderr)
            return 2
        opts[argv[i]] = argv[i + 1]
        i += 2
    if opts["--type"] not in ("bf16", "fp8"):
        print(f"gemm_shapes.py: --type: expected bf16 or fp8, got '{opts['--type']}'", file=sys.stderr)
        return 2
    try:
        iters = int(opts["--iters"])
    except ValueError:
        iters = 0
    if not 1 <= iters <= 1000:
        print(f"gemm_shapes.py: --iters: expected an integer in [1, 1000], got '{opts['--iters']}'", file=sys.stderr)
        return 2
    copy_sms = int(opts["--copy-sms"]) if opts["--copy-sms"].isdigit() else -1
    if not 0 <= copy_sms <= 1024:
        print(f"gemm_shapes.py: --copy-sms: expected an integer in [0, 1024], got '{opts['--copy-sms']}'",
              file=sys.stderr)
        return 2
    chosen = {}  # name -> [tokens]
    for item in filter(None, opts["--models"].split(",")):
        name, _, tokens = item.partition(":")
        if name not in MODELS or not tokens.isdigit() or not 1 <= int(tokens) <= 1 << 20:
            print(f"gemm_shapes.py: --models: '{item}' is not NAME:TOKENS with NAME one of {', '.join(MODELS)} and "
                  f"TOKENS an integer in [1, 1048576]", file=sys.stderr)
            return 2
        chosen.setdefault(name, []).append(int(tokens))
    try:
        import torch
    except ImportError:
        print("gemm_shapes.py: PyTorch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gemm_shapes.py: no CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    fp8 = opts["--type"] == "fp8"
    if fp8 and not hasattr(torch, "_scaled_mm"):
        print("gemm_shapes.py: this PyTorch has no torch._scaled_mm (FP8 GEMMs)", file=sys.stderr)
        return 2
    side = torch.cuda.Stream()
    copy_src = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    copy_dst = torch.empty_like(copy_src)
    copy = (lambda: copy_dst.copy_(copy_src)) if copy_sms == 0 else sm_copy(torch, copy_src, copy_dst, copy_sms)
    if copy is None:
        return 2

    def timed(fn, beside_copy):
        """Median seconds of fn() over `iters` calls, optionally while copies run on another stream."""
        fn()
        torch.cuda.synchronize()
        times = []
        copies = 0
        copy_start = torch.cuda.Event(enable_timing=True)
        copy_end = torch.cuda.Event(enable_timing=True)
        if beside_copy:
            with torch.cuda.stream(side):
                copy_start.record(side)
                for _ in range(4 * iters):
                    copy()
                    copies += 1
                copy_end.record(side)
        # The stream sleeps first (~10 ms) while this loop enqueues every call behind it, so the events time
        # the GPU alone: without it a product shorter than PyTorch's dispatch (~10-20 us) was timed with the
        # host's launch gap in it (the second H200 run's small chunks, bench/README.md).
        torch.cuda._sleep(20_000_000)
        for _ in range(iters):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            times.append((start, end))
        torch.cuda.synchronize()
        seconds = statistics.median(s.elapsed_time(e) / 1e3 for s, e in times)
        copy_gbps = 2 * copies * copy_src.numel() / (copy_start.elapsed_time(copy_end) / 1e3) / 1e9 if copies else 0
        return seconds, copy_gbps

    def gemm(m, k, n):
        """Callables for the forward, input-gradient and weight-gradient products of y = x·Wᵀ."""
        if fp8:
            x = torch.randn(m, k, device=dev).to(torch.float8_e4m3fn)
            w = torch.randn(n, k, device=dev).to(torch.float8_e4m3fn)
            one = torch.ones((), device=dev)
            return {"fwd": lambda: torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)}
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        return {"fwd": lambda: x @ w.t(), "dgrad": lambda: dy @ w, "wgrad": lambda: dy.t() @ x}

    if not chosen:
        chosen = {"nemotron4-15b": [4096]} if quick else {name: [2048, 4096, 8192] for name in MODELS}
    for name, token_counts in chosen.items():
        hidden, ffn, heads, kv_heads, gated = MODELS[name]
        for tensor in (1, 2, 4, 8):
            for tokens in token_counts:
                # The whole GEMM, and the chunk a tensor-parallel overlap runs (tokens / tensor rows).
                for m, chunked in [(tokens, False)] + ([(tokens // tensor, True)] if tensor > 1 else []):
                    for op, k, n in linear_shapes(hidden, ffn, heads, kv_heads, gated, tensor):
                        row = {"type": opts["--type"], "model": name, "tensor": tensor, "tokens": tokens,
                               "chunk": chunked, "op": op, "m": m, "k": k, "n": n, "copy_sms": copy_sms}
                        for kind, fn in gemm(m, k, n).items():
                            alone, _ = timed(fn, False)
                            beside, gbps = timed(fn, True)
                            row[f"{kind}_tflops"] = 2 * m * k * n / alone / 1e12
                            row[f"{kind}_tflops_beside_copy"] = 2 * m * k * n / beside / 1e12
                            row["copy_GBps"] = gbps
                        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
