#!/usr/bin/env bash
# Training throughput of ONE hzp CPU rank vs PyTorch CPU eager on the same model, threads and batch.
#
#   bash bench/runtime_vs_torch.sh [build/hzp] [repeats]
#
# For each model size and thread count both sides run `repeats` times (default 3), interleaved so that the
# machine's drift hits both; tokens/s is measured over steps 3..29 (hzp: metrics.jsonl "seconds" per step,
# the whole step on the host; torch: bench/torch_train.py, the same span). Prints the medians and their ratio.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."
hzp=${1:-build/hzp}
repeats=${2:-3}
data=tests/data/tinyshakespeare_200k.txt
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
  echo "runtime_vs_torch: $py cannot import torch (apt-get install python3-torch)" >&2
  exit 1
fi
[[ -x $hzp ]] || { echo "runtime_vs_torch: no hzp binary at $hzp (build first)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

hzp_tokens_per_s() {  # scenario threads
  "$hzp" train "$1" --nproc 1 --threads "$2" --steps 30 --data "$data" --out "$tmp/out" > /dev/null
  "$py" - "$tmp/out/metrics.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
steps = [l for l in lines if "loss" in l][3:]
print(sum(1 for _ in steps), sum(l["seconds"] for l in steps))
PY
}

median() { "$py" -c 'import sys, statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

# Another job on this 2-core machine ruins the 2-thread numbers (torch's OpenMP barriers stall when a
# thread is descheduled: measured 891 tok/s instead of ~15k while a ctest ran beside it), so say the load.
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), load $(cut -d' ' -f1-3 /proc/loadavg)"
printf "%-34s %7s %12s %12s %7s\n" "model (layers x hidden, ffn, seq x batch)" threads "hzp tok/s" "torch tok/s" ratio
for size in "2 64 4 176 64 16" "4 128 4 352 128 8"; do
  read -r layers hidden heads ffn seq batch <<< "$size"
  scen=$tmp/s_${layers}_${hidden}.json
  "$py" - "$scen" "$layers" "$hidden" "$heads" "$ffn" "$seq" "$batch" <<'PY'
import json, sys
path, layers, hidden, heads, ffn, seq, batch = sys.argv[1], *map(int, sys.argv[2:])
json.dump({"model": {"preset": "tiny-dense", "layers": layers, "hidden": hidden, "heads": heads, "ffn_hidden": ffn},
           "cluster": {"preset": "dgx-a100", "gpus_per_node": 1},
           "training": {"seq_len": seq, "micro_batch": batch, "global_batch_sequences": batch, "precision": "fp32",
                        "grad_clip": 1.0},
           "policy": {"preset": "ddp"},
           "run": {"steps": 30, "lr": 0.003, "warmup_steps": 0}}, open(path, "w"))
PY
  tokens=$((seq * batch))
  for threads in 1 2; do
    h=() t=()
    for ((r = 0; r < repeats; r++)); do
      read -r n secs < <(hzp_tokens_per_s "$scen" "$threads")
      h+=("$("$py" -c "print($tokens * $n / $secs)")")
      # torch parallelises ops with OpenMP; nested OpenBLAS threads only oversubscribe the cores (measured
      # here: 2 threads with OPENBLAS_NUM_THREADS unset ran at 6.1k tok/s, with 1 at 14.8k), so give it its best.
      t+=("$(OMP_NUM_THREADS=$threads OPENBLAS_NUM_THREADS=1 "$py" bench/torch_train.py --layers "$layers" --hidden "$hidden" --heads "$heads" --ffn "$ffn" \
              --seq "$seq" --batch "$batch" --threads "$threads" --steps 30 --data "$data" |
            "$py" -c 'import json, sys; print(json.load(sys.stdin)["tokens_per_s"])')")
    done
    hm=$(median "${h[@]}")
    tm=$(median "${t[@]}")
    printf "%-34s %7d %12.0f %12.0f %7.2f\n" "${layers} x ${hidden}, ${ffn}, ${seq} x ${batch}" "$threads" "$hm" "$tm" \
      "$("$py" -c "print($hm / $tm)")"
  done
done
echo "load at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
