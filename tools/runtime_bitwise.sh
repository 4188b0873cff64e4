#!/usr/bin/env bash
# Are two hzp builds' fp32 training runs bit-identical? Trains the same tiny dense and MoE scenarios under
# every policy family (ddp, zero3, hsdp, zeropp, asynchzp, amsp; MoE ddp, zero3, expert parallelism 2) with
# both binaries, 12 steps with evaluations, 4 ranks on 2 emulated nodes (ddp: 1 rank), one OpenBLAS thread,
# and compares every metrics.jsonl line except the timings: loss, aux loss, gradient norm, learning rate and
# validation loss must match exactly.
#
#   bash tools/runtime_bitwise.sh OLD_HZP NEW_HZP [PRECISION]
#
# PRECISION (default fp32) sets training.precision for both. Exit 0 when every run matches bit for bit, 1
# otherwise (each scenario's worst relative loss difference is printed), 2 on bad arguments. Build the old
# binary from an earlier commit (git worktree add /tmp/old <commit> && bash tools/setup.sh there).
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $# -lt 2 || ! -x $1 || ! -x $2 ]]; then
  echo "usage: bash tools/runtime_bitwise.sh OLD_HZP NEW_HZP [fp32|bf16|fp16] (both executable)" >&2
  exit 2
fi
old=$1 new=$2 precision=${3:-fp32}
case $precision in fp32|bf16|fp16) ;; *) echo "runtime_bitwise: precision must be fp32, bf16 or fp16" >&2; exit 2 ;; esac
py=/usr/bin/python3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$py" - "$tmp" "$precision" <<'PY'
import copy, json, sys
out, precision = sys.argv[1], sys.argv[2]
dense = {"model": {"preset": "tiny-dense", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 176},
         "cluster": {"preset": "dgx-a100", "gpus_per_node": 4},
         "training": {"seq_len": 32, "micro_batch": 2, "global_batch_sequences": 16, "precision": precision,
                      "grad_clip": 1.0},
         "run": {"steps": 12, "lr": 0.003, "min_lr": 0.0003, "warmup_steps": 3, "eval_interval": 6, "eval_batches": 2}}
moe = copy.deepcopy(dense)
moe["model"] = {"preset": "tiny-moe", "layers": 2, "hidden": 64, "heads": 4, "ffn_hidden": 176,
                "moe": {"experts": 4, "top_k": 2, "expert_ffn_hidden": 96}}
cases = {"dense_ddp": (dense, {"preset": "ddp"}), "dense_zero3": (dense, {"preset": "zero3"}),
         "dense_hsdp": (dense, {"preset": "hsdp"}), "dense_zeropp": (dense, {"preset": "zeropp"}),
         "dense_asynchzp": (dense, {"preset": "asynchzp"}),
         "dense_amsp": (dense, {"preset": "amsp", "sharding": {"params": [2, 1], "grads": [2, 1], "optimizer": [2, 2]}}),
         "moe_ddp": (moe, {"preset": "ddp"}), "moe_zero3": (moe, {"preset": "zero3"}),
         "moe_ep2": (moe, {"preset": "zero2", "expert_parallel": 2})}
for name, (base, policy) in cases.items():
    doc = copy.deepcopy(base)
    doc["policy"] = policy
    json.dump(doc, open(f"{out}/{name}.json", "w"))
PY

status=0
for scen in "$tmp"/*.json; do
  name=$(basename "$scen" .json)
  nproc=4 per_node=2
  [[ $name == *_ddp ]] && nproc=1 per_node=1
  for side in old new; do
    bin=$old
    [[ $side == new ]] && bin=$new
    if ! "$bin" train "$scen" --nproc "$nproc" --gpus-per-node "$per_node" --threads 1 \
        --data tests/data/tinyshakespeare_200k.txt --out "$tmp/$side/$name" > "$tmp/$side.$name.log" 2>&1; then
      echo "runtime_bitwise: $name failed with the $side binary:" >&2
      tail -5 "$tmp/$side.$name.log" >&2
      exit 1
    fi
  done
  "$py" - "$tmp/old/$name/metrics.jsonl" "$tmp/new/$name/metrics.jsonl" "$name" <<'PY' || status=1
import json, sys
def load(path):
    lines = [json.loads(l) for l in open(path)]
    for l in lines:
        l.pop("seconds", None)
    return lines
a, b, name = load(sys.argv[1]), load(sys.argv[2]), sys.argv[3]
worst = 0.0
for x, y in zip(a, b):
    for key in ("loss", "val_loss"):
        if key in x and key in y:
            worst = max(worst, abs(x[key] - y[key]) / abs(x[key]))
same = a == b
print(f"{'bit-identical' if same else 'DIFFERENT    '} {name:16s} {len(a)} lines, worst relative loss difference {worst:.3g}")
sys.exit(0 if same else 1)
PY
done
exit $status
