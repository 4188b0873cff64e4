#!/usr/bin/env bash
# Every command's output paths are checked before its work (shared/base/files.h, check_output_files): an
# output that is a FIFO, a link to a device, a directory, "" or DIR/, that is one of the command's inputs (by
# inode: a link or ./name counts), whose PATH.tmp is an input, or that is another output of the same run, is
# refused with exit 2 and a message naming the option — and the input, FIFO or device is left as it was.
# Inputs include a model's Hugging Face config and a compared folder's summary.json; train's outputs include
# every rank's memory file and may not be a checkpoint's file; a scenario on stdin is read to its limit only.
# Each command runs under `timeout 20`: a hang (a FIFO opened for writing) fails the test instead of the suite.
# Usage: bash tests/output_paths.sh HZP_BINARY
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -uo pipefail
hzp=$1
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cd "$out" || exit 1
cp "$root/scenarios/default.json" s.json
cp "$root/traces/tiny_dense_4ranks.json" timeline.json
cp "$root/scenarios/kineto/llama134m-h100.json" k.json
cp "$root/traces/tiny_dense_4ranks.json" trace.json
cp "$root/traces/kineto/kineto_llama134m_b16_t1024.json.gz" k.json.gz
cp "$root/tests/data/tinyshakespeare_200k.txt" data.txt
cp s.json plan.json
mkfifo fifo
ln -s /dev/null devnull  # a link to a device: replacing the link would be harmless, writing through it not
ln -s s.json link.json
mkdir -p sim dir
cp s.json sim/summary.json
echo '{"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
  "num_key_value_heads": 4, "intermediate_size": 176, "vocab_size": 256, "max_position_embeddings": 2048}' > hf.json
python3 -c 'import json, sys
s = json.load(open(sys.argv[1])); del s["model"]["preset"]; s["model"]["from_hf_config"] = "hf.json"
json.dump(s, open("hfs.json", "w"))' "$root/scenarios/runtime/tiny_dense.json"
mkdir -p hfsim
cp hf.json hfsim/summary.json
snapshot() { sha256sum s.json plan.json trace.json k.json.gz data.txt sim/summary.json timeline.json k.json hf.json hfsim/summary.json; }
before=$(snapshot)
failures=0
refused() {  # EXPECTED_TEXT COMMAND...: exit 2 with EXPECTED_TEXT in the message
  local expected=$1
  shift
  timeout 20 "$hzp" "$@" > log 2>&1
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -qF -- "$expected" log; then
    echo "FAIL: hzp $*: exit $rc, expected 2 and \"$expected\": $(tail -2 log)"
    failures=$((failures + 1))
  fi
}
one_node=(s.json --set cluster.nodes=1 --mfu 0.4)
refused "--out s.json: is the same file as SCENARIO" calibrate "${one_node[@]}" --out s.json
refused "--out ./s.json: is the same file as SCENARIO" calibrate "${one_node[@]}" --out ./s.json
refused "--out link.json: is the same file as SCENARIO" calibrate "${one_node[@]}" --out link.json
cp s.json s.json.tmp
refused "its temporary file s.json.tmp is SCENARIO" calibrate s.json.tmp --set cluster.nodes=1 --mfu 0.4 --out s.json
rm s.json.tmp
refused "--out fifo: not a regular file (a FIFO)" calibrate "${one_node[@]}" --out fifo
refused "--out devnull: not a regular file (a device)" calibrate "${one_node[@]}" --out devnull
refused "--out dir: not a regular file (a directory)" calibrate "${one_node[@]}" --out dir
refused "--out new/: names a directory" calibrate "${one_node[@]}" --out new/
refused "option --out: empty value" calibrate "${one_node[@]}" --out ""
refused "option --out: empty value" plan s.json --search --out ""
refused "option --trace: empty value" train s.json --steps 1 --trace ""
refused "--out trace.json: is the same file as --trace" calibrate --trace trace.json --out trace.json
refused "--out ./plan.json: is the same file as SCENARIO" plan plan.json --out .
refused "--out sim/summary.json: is the same file as SCENARIO" simulate sim/summary.json --out sim --steps 1
ln -s ../fifo sim/timeline.json
refused "--out sim/timeline.json: not a regular file (a FIFO)" simulate s.json --out sim --steps 1
refused "--out ./timeline.json: is the same file as TRACE" replay timeline.json --out .
refused "--out sim/summary.json: is the same file as --scenario" replay trace.json --scenario sim/summary.json --out sim
refused "--out k.json.gz: is the same file as profile" import k.json.gz \
  --scenario "$root/scenarios/kineto/llama134m-h100.json" --out k.json.gz
refused "--out k.json: is the same file as --scenario" import k.json.gz --scenario k.json --out k.json
refused "--csv s.json: is the same file as --cluster" collective --cluster s.json --group node --op all_reduce \
  --bytes 1M --csv s.json
refused "--json ./x: is the same file as --csv x" collective --cluster dgx-h100 --group node --op all_reduce \
  --bytes 1M --csv x --json ./x
refused "--json fifo: not a regular file (a FIFO)" collective --cluster dgx-h100 --group node --op all_reduce \
  --bytes 1M --json fifo
refused "--json s.json: is the same file as A" compare s.json --set training.micro_batch=2 --json s.json
tiny=("$root/scenarios/runtime/tiny_dense.json" --nproc 1 --threads 1 --steps 1 --data data.txt)
refused "--perfetto t.json: is the same file as --trace t.json" train "${tiny[@]}" --trace t.json --perfetto t.json
refused "--trace data.txt: is the same file as --data" train "${tiny[@]}" --trace data.txt
refused "--trace devnull: not a regular file (a device)" train "${tiny[@]}" --trace devnull
cp data.txt metrics.jsonl
refused "--out ./metrics.jsonl: is the same file as --data" train "$root/scenarios/runtime/tiny_dense.json" \
  --nproc 1 --steps 1 --data metrics.jsonl --out .
# Rank 1's memory file too (it was found only after training, and rank 0 then waited a minute for rank 1).
mkdir -p two
mkfifo two/memory_rank1.json
refused "--out two/memory_rank1.json: not a regular file (a FIFO)" train "$root/scenarios/runtime/tiny_dense.json" \
  --nproc 2 --threads 1 --steps 1 --data data.txt --out two
# A checkpoint's own files: `latest`, `.lock`, a step folder's rank file.
for file in latest .lock step_2/rank_0.bin; do
  refused "--trace ck/$file: is a checkpoint file of --checkpoint-dir ck" train "${tiny[@]}" --checkpoint-dir ck \
    --trace "ck/$file"
done
# The Hugging Face config a model starts from is an input like the scenario.
refused "--trace hf.json: is the same file as model.from_hf_config" train hfs.json --nproc 1 --steps 1 \
  --data data.txt --trace hf.json
refused "--out hfsim/summary.json: is the same file as model.from_hf_config" simulate hfs.json --out hfsim \
  --set model.from_hf_config=hfsim/summary.json
# compare: a folder A is its summary.json, which neither --json nor B's simulation may replace.
"$hzp" simulate s.json --out cmp/b-default --set cluster.nodes=1 > /dev/null 2>&1
cmp_before=$(sha256sum cmp/b-default/summary.json)
refused "--out cmp/b-default/summary.json: is the same file as A" compare cmp/b-default s.json --simulate --out cmp
refused "--json cmp/b-default/summary.json: is the same file as A" compare cmp/b-default s.json \
  --json cmp/b-default/summary.json
[ "$cmp_before" = "$(sha256sum cmp/b-default/summary.json)" ] || { echo "FAIL: compare replaced A"; failures=$((failures + 1)); }
# A scenario on stdin is read to one byte past its limit, not to the end: /dev/zero is refused at once.
for command in validate train; do
  timeout 20 "$hzp" $command - < /dev/zero > log 2>&1
  rc=$?
  [ $rc -eq 2 ] && grep -q "stdin: over" log ||
    { echo "FAIL: $command - < /dev/zero: exit $rc: $(tail -1 log)"; failures=$((failures + 1)); }
done
after=$(snapshot)
if [ "$before" != "$after" ]; then
  echo "FAIL: an input changed:"
  diff <(echo "$before") <(echo "$after")
  failures=$((failures + 1))
fi
[ -p fifo ] && [ -L devnull ] || { echo "FAIL: the FIFO or the device link was replaced"; failures=$((failures + 1)); }
ls -- *.tmp sim/*.tmp 2> /dev/null && { echo "FAIL: temporary files left"; failures=$((failures + 1)); }
[ $failures -eq 0 ] || exit 1
echo "output_paths: ok"
