#!/usr/bin/env bash
# Every Python tool of tools/ and bench/ on bad input — an unknown flag, a missing file, /dev/zero, a FIFO
# without a writer, a file nested 100,000 deep, an id holding '/' or 10,000 characters — exits 2 with a
# message naming what is wrong, never a traceback and never a hang (each run under `timeout 30`); so do a nan
# gate (--max-error nan would always pass), a flooding --progress-s, a sweep input that is its own output, an
# --hzp that is not hzp, an output folder that takes no file (/proc), and /proc/kmsg (its reads wait); the
# PyTorch reference and benchmark scripts on inputs and flags of the wrong shape; compare.py's checks on NaN
# losses and memory (a FAIL, exit 1), torch_gpu.py on scenario fields it does not implement, and the sweep on a
# FIFO in a scenario folder, links and folders where it writes, and a newline in a --slurm path.
# Usage: bash tests/tools_bad_input.sh [HZP]
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
hzp="${1:-build/hzp}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkfifo "$out/fifo.jsonl"
python3 -c "print('{\"id\": ' + '[' * 100000 + ']' * 100000 + '}')" > "$out/deep.jsonl"
echo '{"id": "a/b", "gpu_count": 8}' > "$out/slash.jsonl"
python3 -c "print('{\"id\": \"' + 'x' * 10000 + '\"}')" > "$out/long.jsonl"
failures=0
expect_2() {  # TOOL ARGS...
  expect_2_with python3 "$@"
}
expect_2_with() {  # PYTHON TOOL ARGS...
  timeout 30 "$@" > "$out/log" 2>&1 < /dev/null
  local rc=$?
  if [ $rc -ne 2 ] || grep -q Traceback "$out/log"; then
    echo "FAIL: $* -> exit $rc: $(tail -2 "$out/log" | cut -c1-200)"
    failures=$((failures + 1))
  fi
}
for tool in tools/*.py bench/*.py bench/gpu/*.py; do
  for bad in --no-such-flag /nonexistent/file.jsonl /dev/zero "$out/fifo.jsonl"; do expect_2 "$tool" "$bad"; done
  # A line nested too deep for Python's parser (sweep.py takes it as a scenario, which hzp refuses: a failed run).
  [ "$tool" = tools/sweep.py ] || expect_2 "$tool" "$out/deep.jsonl"
done
for rows in "$out/deep.jsonl" "$out/slash.jsonl" "$out/long.jsonl" "$out/fifo.jsonl" /dev/zero; do
  expect_2 tools/validate_rows.py "$rows" --hzp "$hzp"
  expect_2 tools/validate_collectives.py "$rows" --hzp "$hzp"
done
rows=scenarios/validation/one_node_rows.jsonl
expect_2 tools/validate_rows.py "$rows" --hzp /nonexistent/hzp
expect_2 tools/validate_rows.py "$rows" --hzp "$hzp" --json /proc/nope/report.json
expect_2 tools/validate_rows.py "$rows" --hzp "$hzp" --out /proc/nope
expect_2 tools/validate_rows.py "$rows" --hzp "$hzp" --out "$rows"
# Gates that a nan would always pass, and a progress interval that floods the output.
expect_2 tools/fp8_transfer.py "$rows" --hzp "$hzp" --max-error nan
expect_2 tools/validate_rows.py "$rows" --hzp "$hzp" --max-error nan
expect_2 tools/sweep.py scenarios/default.json --hzp "$hzp" --out "$out/sweep" --progress-s 1e-300
expect_2 tools/sweep.py scenarios/default.json --hzp "$hzp" --out "$out/sweep" --progress-s nan
# megatron_table.py: bad --jobs, no hzp, a gate nan passes, and a table written over one of its scenarios.
cp scenarios/papers/megatron-gpt-1.7b.json "$out/megatron.json"
for bad in "--jobs 0" "--hzp /nonexistent/hzp" "--max-error nan" "--markdown $out" "--markdown /proc/nope/t.md" \
  "--markdown scenarios/papers/megatron-gpt-1.7b.json"; do
  # shellcheck disable=SC2086 # the flags split on purpose
  expect_2 tools/megatron_table.py --hzp "$hzp" --estimate $bad
done
cmp -s scenarios/papers/megatron-gpt-1.7b.json "$out/megatron.json" ||
  { echo "FAIL: megatron_table replaced its scenario"; failures=$((failures + 1)); }
# fp8_transfer.py: no hzp; a pair whose rows carry a precision that is a number, or a throughput of 0 or text.
expect_2 tools/fp8_transfer.py "$rows" --hzp /nonexistent/hzp
fp8_pair() {  # PRECISION TGS -> a bf16 / FP8 pair of one configuration
  local base='"model": "m", "gpu": "H100 SXM", "gpu_count": 8, "gpus_per_node": 8, "layers": 2, "hidden": 64,
    "heads": 4, "ffn": 256, "vocab": 256, "seq_len": 64, "micro_batch": 1, "global_batch": 8'
  echo "{\"id\": \"a\", $base, \"precision\": \"bf16\", \"tokens_per_s_per_gpu\": 1000}" | tr -d '\n'
  echo
  echo "{\"id\": \"b\", $base, \"precision\": $1, \"tokens_per_s_per_gpu\": $2}" | tr -d '\n'
  echo
}
fp8_pair '"fp8"' 0 > "$out/fp8_zero.jsonl"
fp8_pair '"fp8"' '"fast"' > "$out/fp8_text.jsonl"
fp8_pair 5 1000 > "$out/fp8_number.jsonl"
for rows_file in "$out/fp8_zero.jsonl" "$out/fp8_text.jsonl" "$out/fp8_number.jsonl"; do
  expect_2 tools/fp8_transfer.py "$rows_file" --hzp "$hzp"
done
# A scenario the sweep would overwrite with its own output (its report, or a grid file) is refused.
mkdir -p "$out/sweep/grid"
cp scenarios/default.json "$out/sweep/index.html"
cp scenarios/default.json "$out/sweep/grid/000.json"
expect_2 tools/sweep.py "$out/sweep/index.html" --hzp "$hzp" --out "$out/sweep"
expect_2 tools/sweep.py "$out/sweep/grid/000.json" --hzp "$hzp" --out "$out/sweep" --grid cluster.nodes=1,2
cmp -s scenarios/default.json "$out/sweep/index.html" || { echo "FAIL: the sweep replaced its input"; failures=$((failures + 1)); }
# ... and so are the Hugging Face config a scenario's model starts from, and the hzp binary, at such a path.
echo '{"name": "hf", "model": {"from_hf_config": "sweep/results.csv"}}' > "$out/hf.json"
echo '{}' > "$out/sweep/results.csv"
expect_2 tools/sweep.py "$out/hf.json" --hzp "$hzp" --out "$out/sweep"
cp "$hzp" "$out/sweep/index.html"
expect_2 tools/sweep.py scenarios/default.json --hzp "$out/sweep/index.html" --out "$out/sweep"
cmp -s "$hzp" "$out/sweep/index.html" || { echo "FAIL: the sweep replaced its hzp"; failures=$((failures + 1)); }
# An --hzp that is an executable but not hzp (it would fail or pass every row), or a folder.
for not_hzp in /bin/true "$out"; do
  expect_2 tools/validate_rows.py "$rows" --hzp "$not_hzp"
  expect_2 tools/validate_collectives.py --hzp "$not_hzp"
  expect_2 tools/fp8_transfer.py "$rows" --hzp "$not_hzp"
  expect_2 tools/doc_tables.py --check --hzp "$not_hzp"
done
# Outputs where no file can be made: a file for a folder, a folder of the kernel's, nothing.
touch "$out/a_file"
for bad in "$out/a_file" /proc/nope ""; do expect_2 tools/gen_scenarios.py --out "$bad"; done
expect_2 tools/megatron_table.py --hzp "$hzp" --estimate --markdown /proc/nope.md
# A "regular" file whose reads wait for the kernel (readable as root only).
if [ -r /proc/kmsg ]; then
  expect_2 tools/validate_rows.py /proc/kmsg --hzp "$hzp"
  expect_2 tools/fp8_transfer.py /proc/kmsg --hzp "$hzp"
fi
# The PyTorch scripts under the interpreter that has torch (Debian's): a reference input of the wrong shape, an
# output that cannot be written; a benchmark flag out of range, heads that do not split the width, data that is
# not a file of enough bytes (issue 35's eighth attack: tracebacks, a hang on a FIFO, exit 0 on --layers -1).
if /usr/bin/python3 -c 'import torch' 2> /dev/null; then
  for doc in '{}' '[]' '{"config": {}}' '{"config": {"vocab": 4, "hidden": 4, "heads": 1, "ffn": 4, "layers": 1,
      "batch": 1, "seq": 2, "moe_layer": [false]}, "params": {}, "ids": [0, 1], "targets": [1, 2]}'; do
    echo "$doc" > "$out/reference.json"
    expect_2_with /usr/bin/python3 tools/torch_reference.py "$out/reference.json" "$out/reference_out.json"
  done
  expect_2_with /usr/bin/python3 tools/torch_reference.py "$out/reference.json" /proc/nope/out.json
  ok_flags="--layers 1 --hidden 8 --heads 1 --ffn 8 --seq 8 --batch 1 --threads 1 --steps 4"
  data=tests/data/tinyshakespeare_200k.txt
  for bad in "--heads 3" "--batch 0" "--threads 0" "--steps 0" "--layers -1" "--hidden 0" "--seq 0" "--seq x"; do
    # shellcheck disable=SC2086 # the flags split on purpose; a later flag overrides the good one
    expect_2_with /usr/bin/python3 bench/torch_train.py $ok_flags $bad --data "$data"
  done
  echo -n "abc" > "$out/short.txt"
  for bad in /dev/zero "$out/fifo.jsonl" "$out/short.txt" /nonexistent; do
    # shellcheck disable=SC2086
    expect_2_with /usr/bin/python3 bench/torch_train.py $ok_flags --data "$bad"
  done
fi
# bench/gpu/compare.py: a FIFO, /dev/zero, a missing output folder, the wrong number of arguments, a nan
# tolerance, an unknown command (the ninth attack: a hang, tracebacks); and torch_gpu.py's flags and scenarios.
for bad in "table $out/fifo.jsonl" "table /dev/zero" "falls /nonexistent" "close x" "falls a b x 5" \
  "close a b nan" "memory a 0" "bogus"; do
  # shellcheck disable=SC2086 # the arguments split on purpose
  expect_2 bench/gpu/compare.py $bad
done
# A NaN (or a null: hzp writes a NaN loss so) must fail a check, never pass it (max() skipped a NaN): exit 1 with
# a FAIL line naming it; a count that is not whole (STEPS 1.5 ran 1 step) and a table of no rows are bad input.
expect_1_naming() {  # PATTERN ARGS... of compare.py
  local pattern=$1
  shift
  timeout 30 python3 bench/gpu/compare.py "$@" > "$out/log" 2>&1 < /dev/null
  local rc=$?
  if [ $rc -ne 1 ] || ! grep -q "^FAIL.*$pattern" "$out/log" || grep -q Traceback "$out/log"; then
    echo "FAIL: compare.py $* -> exit $rc (wanted 1, a FAIL line with '$pattern'): $(tail -2 "$out/log" | cut -c1-200)"
    failures=$((failures + 1))
  fi
}
mkdir -p "$out/run_ok" "$out/run_nan" "$out/run_null" "$out/mem_nan" "$out/mem_model_nan"
for i in 1 2 3 4 5 6; do echo "{\"step\": $i, \"loss\": $((10 - i)).0, \"seconds\": 1}"; done > "$out/run_ok/metrics.jsonl"
head -5 "$out/run_ok/metrics.jsonl" > "$out/run_nan/metrics.jsonl"
cp "$out/run_nan/metrics.jsonl" "$out/run_null/metrics.jsonl"
echo '{"step": 6, "loss": NaN, "seconds": 1}' >> "$out/run_nan/metrics.jsonl"
echo '{"step": 6, "loss": null, "seconds": 1}' >> "$out/run_null/metrics.jsonl"
echo '{"measured": {"params": NaN, "grads": 8, "optimizer": 8}, "model": {"params": 8, "grads": 8, "optimizer": 8,
  "pools": {}}}' > "$out/mem_nan/memory_rank0.json"
echo '{"measured": {"params": 8, "grads": 8, "optimizer": 8}, "model": {"params": 8, "grads": Infinity,
  "optimizer": 8, "pools": {"act": NaN}}}' > "$out/mem_model_nan/memory_rank0.json"
expect_1_naming "run_nan step 6 has loss nan" close "$out/run_ok" "$out/run_nan" 0.01
expect_1_naming "run_nan step 6 has loss nan" close "$out/run_nan" "$out/run_ok" 0.01
expect_1_naming "run_null step 6 has loss null" close "$out/run_ok" "$out/run_null" 0.01
expect_1_naming "run_nan step 6 has loss nan" falls "$out/run_nan"
expect_1_naming "run_null step 6 has loss null" falls "$out/run_null" 0.5
expect_1_naming "rank 0 params: measured nan" memory "$out/mem_nan" 1
expect_1_naming "rank 0 grads: model inf" memory "$out/mem_model_nan" 1
expect_1_naming "7 steps asked" close "$out/run_ok" "$out/run_ok" 0.01 7
: > "$out/empty_rows.jsonl"
echo '{"model": "m", "hzp_tokens_per_s": NaN, "hzp_mfu": 0.5, "hzp_pool_GiB": 1}' > "$out/nan_rows.jsonl"
for bad in "close $out/run_ok $out/run_ok 0.01 1.5" "memory $out/mem_nan 1.5" "table $out/empty_rows.jsonl" \
  "attention $out/empty_rows.jsonl" "table $out/nan_rows.jsonl"; do
  # shellcheck disable=SC2086 # the arguments split on purpose
  expect_2 bench/gpu/compare.py $bad
done
# torch_gpu.py refuses, before torch is imported (so under any python3), every scenario field it would not
# train as asked (it trained a SwiGLU llama whatever the scenario said), naming the field; and it takes the
# resolved file `hzp validate` prints ("moe": null), as its own message says to.
expect_field() {  # PATTERN SCENARIO
  timeout 30 python3 bench/gpu/torch_gpu.py "$2" > "$out/log" 2>&1 < /dev/null
  local rc=$?
  if [ $rc -ne 2 ] || [ "$(wc -l < "$out/log")" -ne 1 ] || ! grep -q -- "$1" "$out/log"; then
    echo "FAIL: torch_gpu.py $2 -> exit $rc (wanted 2 naming '$1'): $(tail -2 "$out/log" | cut -c1-200)"
    failures=$((failures + 1))
  fi
}
for base in llama134m moe8x; do
  "$hzp" validate "bench/gpu/$base.json" > "$out/resolved_$base.json" 2> /dev/null
  expect_field "no CUDA device here\|needs PyTorch" "$out/resolved_$base.json"
  expect_field "no CUDA device here\|needs PyTorch" "bench/gpu/$base.json"
done
torch_edit() {  # FILE KEY VALUE: bench/gpu/moe8x.json with KEY (dotted) set to the JSON VALUE
  python3 -c 'import json, sys
doc = json.load(open(sys.argv[1]))
*path, last = sys.argv[2].split(".")
node = doc
for key in path:
    node = node.setdefault(key, {})
node[last] = json.loads(sys.argv[3])
print(json.dumps(doc))' "$@" > "$out/edited.json"
}
while read -r key value; do  # each field set to what torch_gpu.py does not train, in a file and resolved
  for file in bench/gpu/moe8x.json "$out/resolved_moe8x.json"; do
    torch_edit "$file" "$key" "$value"
    expect_field "$key" "$out/edited.json"
  done
done << 'EOF'
model.mlp "gelu"
model.mlp "squared_relu"
model.mlp "bogus"
model.family "gpt"
model.tied_embeddings true
model.position "learned"
model.mla {"kv_lora_rank": 64}
model.moe.shared_ffn_hidden 512
model.moe.layers [0, 2]
model.preset "llama2-7b"
policy.parallel.tensor 2
policy.parallel.pipeline 2
policy.expert_parallel 2
cluster.gpus_per_node 8
training.precision "fp16"
training.fp8 true
training.grad_clip 1.0
training.global_batch_sequences 64
run.warmup_steps 10
model.bogus 1
EOF
# The GPU benchmarks' shape flags are checked before they look for PyTorch or a GPU.
for bad in "--models foo:4096" "--models nemotron4-15b:0" "--models nemotron4-15b"; do
  # shellcheck disable=SC2086 # the flag and its value split on purpose
  expect_2 bench/gpu/gemm_shapes.py $bad
done
for bad in 1 -0.1 nan x; do expect_2 bench/gpu/torch_attention.py --dropout "$bad"; done
if /usr/bin/python3 -c 'import torch' 2> /dev/null; then
  expect_2_with /usr/bin/python3 bench/gpu/torch_gpu.py bench/gpu/llama134m.json --steps -1
  expect_2_with /usr/bin/python3 bench/gpu/torch_gpu.py scenarios/runtime/tiny_dense.json  # a preset's fields
  expect_2_with /usr/bin/python3 bench/gpu/torch_gpu.py scenarios/default.json
fi
# The sweep reads every scenario of a folder as one given by name (a FIFO x.json in it hung), never writes
# through a link where it writes (OUT/grid, OUT/runs, a run's folder, OUT/slurm: files landed outside OUT), checks
# its report files up front (a folder named index.html failed after every simulation), and refuses, for --slurm,
# a path that would split OUT/slurm/files.txt (a newline ran the wrong path).
mkdir -p "$out/scen" "$out/elsewhere"
cp scenarios/default.json "$out/scen/a.json"
mkfifo "$out/scen/x.json"
expect_2 tools/sweep.py "$out/scen" --hzp "$hzp" --out "$out/sweep_fifo"
rm "$out/scen/x.json"
for link_mode in "grid --grid cluster.nodes=1,2" "runs --keep-runs" "runs/000-a --keep-runs" \
  "runs/001-001 --keep-runs --grid cluster.nodes=1,2" "slurm --slurm" "slurm/logs --slurm"; do
  link=${link_mode%% *}
  rm -rf "$out/sweep_link"
  mkdir -p "$out/sweep_link/$(dirname "$link")"
  ln -s "$out/elsewhere" "$out/sweep_link/$link"
  # shellcheck disable=SC2086 # the flags split on purpose
  expect_2 tools/sweep.py "$out/scen/a.json" --hzp "$hzp" --out "$out/sweep_link" ${link_mode#* }
done
[ -z "$(ls -A "$out/elsewhere")" ] || { echo "FAIL: the sweep wrote through a link"; failures=$((failures + 1)); }
for name in index.html results.csv mfu_vs_gpus.png exposed_comm_by_policy.svg grid/000.json; do
  rm -rf "$out/sweep_dir"
  mkdir -p "$out/sweep_dir/$name"
  expect_2 tools/sweep.py "$out/scen/a.json" --hzp "$hzp" --out "$out/sweep_dir" --grid cluster.nodes=1,2
done
mkdir -p "$out/new
line"
cp scenarios/default.json "$out/new
line/a.json"
expect_2 tools/sweep.py "$out/new
line/a.json" --hzp "$hzp" --out "$out/sweep_slurm" --slurm
[ ! -e "$out/sweep_slurm" ] || { echo "FAIL: a refused --slurm wrote $out/sweep_slurm"; failures=$((failures + 1)); }
# A refused sweep leaves no folders behind (the eighth attack: --collect into a new chain created it).
expect_2 tools/sweep.py --collect --out "$out/new/chain/of/folders"
[ ! -e "$out/new" ] || { echo "FAIL: a refused sweep created $out/new"; failures=$((failures + 1)); }
# An empty rows file validates nothing: bad input (exit 2), never a pass; rows that all skip are a failure (1).
: > "$out/empty.jsonl"
expect_2 tools/validate_rows.py "$out/empty.jsonl" --hzp "$hzp"
expect_2 tools/validate_collectives.py "$out/empty.jsonl" --hzp "$hzp"
echo '{"id": "x", "gpu_count": "eight"}' > "$out/skipped.jsonl"
timeout 30 python3 tools/validate_rows.py "$out/skipped.jsonl" --hzp "$hzp" > "$out/log" 2>&1
rc=$?
if [ $rc -ne 1 ] || ! grep -q "no row was validated" "$out/log"; then
  echo "FAIL: validate_rows on rows that all skip -> exit $rc: $(tail -1 "$out/log")"
  failures=$((failures + 1))
fi
# The attention benchmarks: bad values exit 2 naming the flag (bench/attention_bench.cc, torch_attention.py).
for bad in "--seqs 1,x" "--dims 0" "--type fp8" "--iters" "--heads -1"; do
  # shellcheck disable=SC2086  # each case is several words
  expect_2 bench/gpu/torch_attention.py $bad
done
# The GEMM-shape benchmark (issue 37's gemm stage): the same.
for bad in "--type fp16" "--iters 0" "--iters x" "--iters" "--bogus"; do
  # shellcheck disable=SC2086  # each case is several words
  expect_2 bench/gpu/gemm_shapes.py $bad
done
bench_bin="$(dirname "$hzp")/attention_bench"
if [ -x "$bench_bin" ]; then
  for bad in "--seqs 1,x" "--dims 0" "--type fp8" "--iters" "--backend nosuch" "--bogus"; do
    # shellcheck disable=SC2086
    expect_2_with "$bench_bin" $bad
  done
  HZP_CUDA_ATTENTION=bogus expect_2_with "$bench_bin" --seqs 16 --dims 16  # the kernel choice, not a silent default
fi
[ $failures -eq 0 ] || exit 1
echo "tools_bad_input: ok"
