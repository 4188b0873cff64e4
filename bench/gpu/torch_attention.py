#!/usr/bin/env python3
"""PyTorch's causal attention (scaled_dot_product_attention: flash / cuDNN / memory-efficient, whichever it
picks) at the shapes of build/attention_bench, for the same-call comparison of bench/gpu/check.sh's
`attention` stage.

    python3 bench/gpu/torch_attention.py [--type bf16|fp16] [--seqs 1024,...] [--dims 64,128] [--heads H]
                                         [--tokens T] [--iters N] [--dropout P]

One JSON line per shape, the fields of attention_bench's (kernel "torch-sdpa"); forward and backward timed
with CUDA events over N calls after one warm-up. --dropout P runs SDPA with dropout_p P (the flash kernel
draws its mask in-kernel: what attention dropout costs GPT-3's runs, NeMo's 0.1); rows carry "dropout".
Exit 2 on a bad argument or without a GPU.
"""
import json
import sys


def parse_list(flag, text, lo, hi):
    out = []
    for item in text.split(","):
        try:
            v = int(item)
        except ValueError:
            v = None
        if v is None or not lo <= v <= hi:
            print(f"torch_attention.py: {flag}: '{item}' is not an integer in [{lo}, {hi}]", file=sys.stderr)
            sys.exit(2)
        out.append(v)
    return out


def main(argv):
    opts = {"--type": "bf16", "--seqs": "1024,2048,4096,8192,16384,32768", "--dims": "64,128", "--heads": "16",
            "--tokens": "16384", "--iters": "5", "--dropout": "0"}
    i = 0
    while i < len(argv):
        if argv[i] in ("-h", "--help"):
            print(__doc__.strip())
            return 0
        if argv[i] not in opts or i + 1 >= len(argv):
            print(f"torch_attention.py: bad argument '{argv[i]}' (see --help)", file=sys.stderr)
            return 2
        opts[argv[i]] = argv[i + 1]
        i += 2
    if opts["--type"] not in ("bf16", "fp16"):
        print(f"torch_attention.py: --type: '{opts['--type']}' is not bf16 or fp16", file=sys.stderr)
        return 2
    seqs = parse_list("--seqs", opts["--seqs"], 1, 1 << 20)
    dims = parse_list("--dims", opts["--dims"], 1, 1024)
    heads = parse_list("--heads", opts["--heads"], 1, 1024)[0]
    tokens = parse_list("--tokens", opts["--tokens"], 1, 1 << 24)[0]
    iters = parse_list("--iters", opts["--iters"], 1, 1000)[0]
    try:
        dropout = float(opts["--dropout"])
    except ValueError:
        dropout = -1.0
    if not 0 <= dropout < 1:
        print(f"torch_attention.py: --dropout: '{opts['--dropout']}' is not a probability in [0, 1)", file=sys.stderr)
        return 2
    try:
        import torch
        import torch.nn.functional as F
    except ImportError as e:
        print(f"torch_attention.py: PyTorch is not importable: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_attention.py: no GPU", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if opts["--type"] == "bf16" else torch.float16
    name = torch.cuda.get_device_name()
    for seq in seqs:
        for d in dims:
            batch = max(1, tokens // seq)
            q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=dtype, requires_grad=True)
                       for _ in range(3))
            def sdpa():
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout)

            out = sdpa()
            grad = torch.randn_like(out)

            def timed(call):
                call()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                for _ in range(iters):
                    call()
                end.record()
                torch.cuda.synchronize()
                return start.elapsed_time(end) / iters / 1e3

            fwd = timed(sdpa)
            out = sdpa()
            bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True))
            flops = 4.0 * batch * heads * seq * seq * d / 2
            print(json.dumps({"backend": "torch", "device": name, "kernel": "torch-sdpa", "algorithm": "standard",
                              "type": opts["--type"], "batch": batch, "seq": seq, "heads": heads, "head_dim": d,
                              "dropout": dropout, "forward_ms": round(fwd * 1e3, 4),
                              "forward_tflops": round(flops / fwd / 1e12, 2),
                              "backward_ms": round(bwd * 1e3, 4),
                              "backward_tflops": round(2.5 * flops / bwd / 1e12, 2)}), flush=True)
            del q, k, v, out, grad
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
