#!/usr/bin/env bash
# Every GPU check of the CUDA + NCCL backend and its benchmark, in one call on a GPU machine, results under
# $OUT. Prepare the binaries here first (bash bench/gpu/prepare.sh), then on the GPU machine, from the repo root:
#
#   source .gpu/env.sh && bash bench/gpu/check.sh [STAGE[:SECONDS]...]
#
# A stage given as NAME:SECONDS runs under that wall-clock limit (killed with everything it started), so a
# call fits the device's time: `kernels:45 train:55 attention:100 bench:240 equivalence:60 fault:20 trace:50` is
# under ten minutes on an H200. Every log and the recorded traces go into $OUT/logs.tgz (the device tool returns
# at most 8 files); $OUT keeps summary.txt, kernels.txt, bench.md, bench_rows.jsonl, attention.jsonl, attention.md
# and gemm_shapes.jsonl.
#
# Stages (default: all, in this order; each bounded in time, a failure does not stop the next):
#   info         the device and hzp --version
#   kernels      every kernel against fp64 references and finite differences (hzp_kernel_tests, cuda backend):
#                $OUT/kernels.txt holds each kernel's max error per type
#   train        dense and MoE learn on the repo's text and on random tokens at vocab 32000 (--backend cuda), and
#                the first steps agree with the CPU reference backend on the same weights
#   equivalence  4 ranks sharing the GPU (host-staged collectives) give the losses of 1 rank under zero3, hsdp,
#                asynchzp, zeropp, amsp and MoE expert parallelism (bf16 tolerance); memory per category matches
#                the core's model
#   fault        a rank killed at step 3 makes the others fail fast, naming it
#   trace        a --trace of the 134 M model replays (hzp replay) to its recorded step within 3 %; traces of the
#                MoE and 941 M bench models (their steps by module)
#   attention    causal attention's TFLOP/s, forward and backward, seq 1 k .. 32 k, head_dim 64 / 128: fp16
#                standard, PASA and PyTorch's SDPA; then hzp's kernels (attention_bench) and SDPA in bf16, and
#                hzp's WMMA kernels at 1 k / 4 k and simple ones at 1 k; SDPA with dropout 0.1 at 2 k .. 8 k:
#                $OUT/attention.md
#   gemm         bf16 GEMM TFLOP/s by shape (the development rows' linear layers per tensor-parallel degree, whole
#                and as the chunks a tensor-parallel overlap runs, alone and beside a copy) and FP8 forwards, for
#                issue 37's compute model by shape: $OUT/gemm_shapes.jsonl (not in the default list: ~3 min)
#   overlap      Nemotron-4's and GPT-3's products at their development rows' micro-batches, whole and
#                chunked, beside a copy kernel on 16 SMs, as userbuffers' reduce-scatter and bulk kernels take
#                them from a GEMM (issue 37): $OUT/gemm_shapes.jsonl rows with "copy_sms" 16 (not in the
#                default list: ~1 min)
#   bench        tokens/s, MFU and memory of hzp against PyTorch eager (and torch.compile on the 134 M model;
#                HZP_BENCH_COMPILE=all for every model) on the same models, MoE first (HZP_BENCH_MODELS: which,
#                in order): $OUT/bench.md
# $OUT/summary.txt lists every check with PASS or FAIL; the exit status is 1 if any failed.
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/hzp-gpu-out}
mkdir -p "$out"
summary=$out/summary.txt
: > "$summary"
py=${PYTHON:-python3}
hzp=${HZP:-hzp}
kernel_tests=${HZP_KERNEL_TESTS:-hzp_kernel_tests}
text=tests/data/tinyshakespeare_200k.txt
work=$(mktemp -d)
stages=("$@")
[[ ${#stages[@]} -eq 0 ]] && stages=(info kernels train equivalence fault trace attention bench)
attention_bench=${HZP_ATTENTION_BENCH:-attention_bench}

note() { echo "$*" | tee -a "$summary"; }
# check NAME COMMAND...: runs a check, records PASS/FAIL with its last output line.
check() {
  local name=$1; shift
  local log="$out/$name.log"
  if "$@" > "$log" 2>&1; then note "PASS $name: $(tail -1 "$log")"; else note "FAIL $name: $(tail -3 "$log" | tr '\n' ' ')"; fi
}
train() {  # SCENARIO OUTDIR NPROC [extra args]: hzp train, one emulated node
  local scen=$1 dir=$2 nproc=$3; shift 3
  timeout 300 "$hzp" train "$scen" --nproc "$nproc" --gpus-per-node "$nproc" --out "$dir" --timeout-s 60 "$@"
}
with() {  # SCENARIO NAME JSON-PATCH: a copy of the scenario with fields set (training/policy/run/model keys)
  "$py" - "$1" "$work/$2.json" "$3" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
for path, value in json.loads(sys.argv[3]).items():
    node = doc
    keys = path.split(".")
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
json.dump(doc, open(sys.argv[2], "w"))
PY
  echo "$work/$2.json"
}

for stage in "${stages[@]}"; do
  if [[ $stage == *:* ]]; then  # NAME:SECONDS: the stage in a process of its own, under the limit
    limit=${stage#*:} stage=${stage%%:*}
    [[ $limit =~ ^[0-9]+$ && $limit -gt 0 ]] || { note "FAIL stage '$stage': limit '$limit' is not a positive number of seconds"; continue; }
    OUT=$out/$stage.d HZP_CHECK_NO_PACK=1 timeout -k 3 "$limit" bash "$0" "$stage" > "$out/$stage.stdout" 2>&1
    rc=$?
    cat "$out/$stage.d/summary.txt" >> "$summary" 2> /dev/null
    [[ $rc -eq 124 || $rc -eq 137 ]] && note "FAIL $stage: stopped at its limit of $limit s"
    for keep in kernels.txt bench.md bench_rows.jsonl trace_134m.json trace_moe8x.json trace_941m.json attention.jsonl \
      attention.md gemm_shapes.jsonl; do
      [[ -f $out/$stage.d/$keep ]] && mv "$out/$stage.d/$keep" "$out/"
    done
    pkill -9 -x hzp 2> /dev/null; pkill -9 -x hzp_kernel_test 2> /dev/null; pkill -9 -f 'bench/gpu/torch_gp[u]' 2> /dev/null
    continue
  fi
  case $stage in
  info)
    { nvidia-smi -L; "$hzp" --version; nproc; } > "$out/info.txt" 2>&1
    note "info: $(head -1 "$out/info.txt")"
    ;;
  kernels)
    HZP_KERNEL_BACKEND=cuda timeout 300 "$kernel_tests" > "$out/kernels.log" 2>&1
    rc=$?
    grep '^kernel ' "$out/kernels.log" > "$out/kernels.txt"
    if [[ $rc -eq 0 ]]; then note "PASS kernels: $(tail -1 "$out/kernels.log")"; else
      note "FAIL kernels (exit $rc): $(grep -c FAILED "$out/kernels.log") failed assertions, see kernels.log"; fi
    ;;
  train)
    dense=$(with scenarios/runtime/tiny_dense.json dense '{"training.precision": "bf16", "run.steps": 80, "run.eval_interval": 0}')
    moe=$(with scenarios/runtime/tiny_moe.json moe '{"training.precision": "bf16", "run.steps": 80, "run.eval_interval": 0, "policy": {"preset": "ddp"}}')
    check train_dense_cuda train "$dense" "$work/dense_cuda" 1 --backend cuda --data "$text"
    check train_dense_falls "$py" bench/gpu/compare.py falls "$work/dense_cuda" 1.0
    check train_moe_cuda train "$moe" "$work/moe_cuda" 1 --backend cuda --data "$text"
    check train_moe_falls "$py" bench/gpu/compare.py falls "$work/moe_cuda" 1.0
    # The same weights and batches on the CPU reference backend: the first steps agree (bf16 rounding apart).
    check train_dense_cpu train "$dense" "$work/dense_cpu" 1 --backend cpu --data "$text" --steps 5
    check dense_cuda_vs_cpu "$py" bench/gpu/compare.py close "$work/dense_cuda" "$work/dense_cpu" 0.01 5
    check train_moe_cpu train "$moe" "$work/moe_cpu" 1 --backend cpu --data "$text" --steps 5
    check moe_cuda_vs_cpu "$py" bench/gpu/compare.py close "$work/moe_cuda" "$work/moe_cpu" 0.01 5
    vocab=$(with scenarios/runtime/tiny_dense.json vocab32k '{"training.precision": "bf16", "run.steps": 60, "run.eval_interval": 0, "model.vocab": 32000, "policy": {"preset": "ddp"}}')
    check train_vocab32k train "$vocab" "$work/vocab32k" 1 --backend cuda --data random
    check train_vocab32k_falls "$py" bench/gpu/compare.py falls "$work/vocab32k" 1.0
    ;;
  equivalence)
    for entry in 'zero3:{"preset": "zero3"}:dense' 'hsdp:{"preset": "hsdp"}:dense' \
                 'asynchzp:{"preset": "asynchzp"}:dense' 'zeropp:{"preset": "zeropp"}:dense' \
                 'amsp:{"preset": "amsp", "sharding": {"params": [2, 1], "grads": [2, 1], "optimizer": [2, 2]}}:dense' \
                 'moe_ep2:{"preset": "zero2", "expert_parallel": 2}:moe'; do
      name=${entry%%:*}; rest=${entry#*:}; policy=${rest%:*}; model=${rest##*:}
      base=scenarios/runtime/tiny_dense.json
      [[ $model == moe ]] && base=scenarios/runtime/tiny_moe.json
      ref=$(with "$base" "eq_ref_$name" '{"training.precision": "bf16", "run.steps": 10, "run.eval_interval": 0, "policy": {"preset": "ddp"}}')
      test=$(with "$base" "eq_$name" "{\"training.precision\": \"bf16\", \"run.steps\": 10, \"run.eval_interval\": 0, \"policy\": $policy}")
      check "eq_${name}_1rank" train "$ref" "$work/eq_ref_$name" 1 --backend cuda --data "$text"
      # 2 emulated nodes of 2 ranks, all on the one GPU: the host-staged collectives.
      check "eq_${name}_4ranks" timeout 300 "$hzp" train "$test" --nproc 4 --gpus-per-node 2 --out "$work/eq_$name" \
        --timeout-s 60 --backend cuda --data "$text"
      check "eq_${name}" "$py" bench/gpu/compare.py close "$work/eq_ref_$name" "$work/eq_$name" 0.002
      check "memory_${name}" "$py" bench/gpu/compare.py memory "$work/eq_$name" 4
    done
    ;;
  fault)
    scen=$(with scenarios/runtime/tiny_dense.json fault '{"training.precision": "bf16", "run.steps": 20, "run.eval_interval": 0}')
    start=$(date +%s)
    HZP_FAULT_KILL_RANK=2 HZP_FAULT_KILL_STEP=3 timeout 120 "$hzp" train "$scen" --nproc 4 --gpus-per-node 2 \
      --out "$work/fault" --timeout-s 20 --backend cuda --data "$text" > "$out/fault.log" 2>&1
    rc=$? took=$(( $(date +%s) - start ))
    if [[ $rc -eq 1 ]] && grep -q "lost rank 2" "$out/fault.log"; then note "PASS fault: exit 1 after ${took} s, the others name rank 2"
    else note "FAIL fault: exit $rc after ${took} s: $(tail -2 "$out/fault.log" | tr '\n' ' ')"; fi
    ;;
  trace)
    scen=$(with bench/gpu/llama134m.json trace '{"run.steps": 6}')
    check trace_record train "$scen" "$work/trace" 1 --backend cuda --data random --trace "$out/trace_134m.json"
    check trace_replay timeout 300 "$hzp" replay "$out/trace_134m.json" --out "$work/replay"
    # The MoE bench model's step by module (router, permutation, experts), for where its time goes.
    moe=$(with bench/gpu/moe8x.json trace_moe '{"run.steps": 4}')
    check trace_moe8x train "$moe" "$work/trace_moe" 1 --backend cuda --data random --trace "$out/trace_moe8x.json"
    # The 941 M model's step by module: where it stands from torch.compile's 56 % MFU (issue 31).
    big=$(with bench/gpu/llama941m.json trace_941m '{"run.steps": 4}')
    check trace_941m train "$big" "$work/trace_941m" 1 --backend cuda --data random --trace "$out/trace_941m.json"
    ;;
  attention)
    rows=$out/attention.jsonl
    : > "$rows"
    rows_of() {  # NAME COMMAND...: its JSON lines into attention.jsonl, its errors into NAME.log
      local name=$1; shift
      if "$@" >> "$rows" 2> "$out/$name.log"; then note "PASS $name: $(tail -1 "$rows" | cut -c1-200)"
      else note "FAIL $name: $(tail -2 "$out/$name.log" | tr '\n' ' ')"; fi
    }
    # Issue 32 first (its fp16 rows ran out of time twice behind the bf16 ones): PASA beside standard attention,
    # both fp16, and PyTorch's fp16 SDPA; then bf16, then the older kernels (already measured: 2026-11-27c).
    rows_of attention_fp16 timeout 120 "$attention_bench" --type fp16
    rows_of attention_pasa timeout 120 "$attention_bench" --type fp16 --pasa
    rows_of attention_torch_fp16 timeout 120 "$py" bench/gpu/torch_attention.py --type fp16
    rows_of attention_hzp timeout 120 "$attention_bench" --type bf16
    rows_of attention_torch timeout 120 "$py" bench/gpu/torch_attention.py --type bf16
    # Attention dropout in the flash kernel (GPT-3's recipes run 0.1; hzp prices it as free, issue 37).
    rows_of attention_dropout timeout 60 "$py" bench/gpu/torch_attention.py --type bf16 --dropout 0.1 \
      --dims 64,128 --seqs 2048,4096,8192
    HZP_CUDA_ATTENTION=wmma rows_of attention_wmma timeout 120 "$attention_bench" --type bf16 --seqs 1024,4096
    HZP_CUDA_ATTENTION=simple rows_of attention_simple timeout 120 "$attention_bench" --type bf16 --seqs 1024 --dims 64
    "$py" bench/gpu/compare.py attention "$rows" > "$out/attention.md" 2>> "$out/attention.log"
    note "attention: $(grep -c . "$rows") rows in attention.md"
    ;;
  gemm)
    for type in bf16 fp8; do
      if timeout 400 "$py" bench/gpu/gemm_shapes.py --type "$type" >> "$out/gemm_shapes.jsonl" 2> "$out/gemm_$type.log"; then
        note "PASS gemm_$type: $(grep -c "\"$type\"" "$out/gemm_shapes.jsonl") shapes in gemm_shapes.jsonl"
      else note "FAIL gemm_$type: $(tail -2 "$out/gemm_$type.log" | tr '\n' ' ')"; fi
    done
    ;;
  overlap)
    # What a tensor-parallel overlap costs its GEMMs: the development rows' products at their own micro-batches
    # (Nemotron-4 4 x 4096 tokens, GPT-3 1 x 2048), whole and chunked, alone and beside a copy on 16 SMs, as
    # userbuffers' reduce-scatter and bulk kernels run by default (issue 37; sim/README.md "Tensor overlap").
    if timeout 300 "$py" bench/gpu/gemm_shapes.py --models nemotron4-15b:16384,gpt3-175b:2048 --copy-sms 16 \
      >> "$out/gemm_shapes.jsonl" 2> "$out/overlap.log"; then
      note "PASS overlap: $(grep -c '"copy_sms": 16' "$out/gemm_shapes.jsonl") shapes beside a 16-SM copy"
    else note "FAIL overlap: $(tail -2 "$out/overlap.log" | tr '\n' ' ')"; fi
    ;;
  bench)
    : > "$out/bench_rows.jsonl"
    # MoE first: its same-call row against PyTorch is the one still missing (the dense rows: 2026-11-27c).
    for model in ${HZP_BENCH_MODELS:-moe8x llama134m llama941m}; do
      check "bench_hzp_$model" train "bench/gpu/$model.json" "$work/bench_$model" 1 --backend cuda --data random
      : > "$work/torch_$model.jsonl"
      timeout 300 "$py" bench/gpu/torch_gpu.py "bench/gpu/$model.json" >> "$work/torch_$model.jsonl" 2> "$out/torch_$model.log"
      if [[ ${HZP_BENCH_COMPILE:-llama134m} == all || ${HZP_BENCH_COMPILE:-llama134m} == "$model" ]]; then
        timeout 400 "$py" bench/gpu/torch_gpu.py "bench/gpu/$model.json" --compile >> "$work/torch_$model.jsonl" \
          2>> "$out/torch_$model.log"
      fi
      cp "$work/torch_$model.jsonl" "$out/"
      "$py" bench/gpu/compare.py bench "$work/bench_$model" "$work/torch_$model.jsonl" "bench/gpu/$model.json" \
        >> "$out/bench_rows.jsonl" 2>> "$out/bench.log"
    done
    "$py" bench/gpu/compare.py table "$out/bench_rows.jsonl" > "$out/bench.md" 2>> "$out/bench.log"
    note "bench: $(wc -l < "$out/bench_rows.jsonl") rows in bench.md"
    ;;
  *) note "FAIL unknown stage '$stage'" ;;
  esac
done
rm -rf "$work"
if [[ -z ${HZP_CHECK_NO_PACK:-} ]]; then  # the results stay beside one archive of the rest, logs and traces
  keep=(summary.txt kernels.txt bench.md bench_rows.jsonl attention.jsonl attention.md gemm_shapes.jsonl)
  (cd "$out" && rest=() && for f in * .[!.]*; do
     [[ -e $f && $f != logs.tgz && " ${keep[*]} " != *" $f "* ]] && rest+=("$f")
   done
   if [[ ${#rest[@]} -gt 0 ]]; then tar -czf logs.tgz "${rest[@]}" && rm -rf "${rest[@]}"; fi)
fi
! grep -q '^FAIL' "$summary"
