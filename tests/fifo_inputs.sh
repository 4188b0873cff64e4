#!/usr/bin/env bash
# A FIFO without a writer given where hzp reads a file — a scenario, a trace, a profiler trace, a cluster file,
# a checkpoint's `latest` — is refused at once (exit 2, "not a regular file (a FIFO)"), never waited on; so is
# a "regular" file whose reads wait for the kernel (/proc/kmsg, where it is readable: as root).
# Each command runs under `timeout 20`: a hang fails the test instead of the suite.
# Usage: bash tests/fifo_inputs.sh HZP_BINARY
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -uo pipefail
hzp=$1
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
mkfifo "$out/f.json" "$out/t.json.gz"
mkdir -p "$out/ckpt"
mkfifo "$out/ckpt/latest"
failures=0
expect_refused() {  # DESCRIPTION COMMAND... (the message says KIND, "FIFO" unless set; EXPECT, when set, too)
  local what=$1
  shift
  timeout 20 "$@" > "$out/log" 2>&1
  local rc=$?
  if [ $rc -ne 2 ] || ! grep -q -- "${KIND:-FIFO}" "$out/log" || ! grep -q -- "${EXPECT:-FIFO}" "$out/log"; then
    echo "FAIL: $what: exit $rc: $(tail -2 "$out/log")"
    failures=$((failures + 1))
  fi
}
expect_refused validate "$hzp" validate "$out/f.json"
expect_refused plan "$hzp" plan "$out/f.json"
expect_refused replay "$hzp" replay "$out/f.json"
expect_refused "replay --scenario" "$hzp" replay "$root/traces/tiny_dense_4ranks.json" --scenario "$out/f.json"
expect_refused "calibrate --trace" "$hzp" calibrate --trace "$out/f.json"
expect_refused import "$hzp" import "$out/t.json.gz" --scenario "$root/scenarios/kineto/llama134m-h100.json" \
  --out "$out/i.json"
EXPECT="--scenario: " expect_refused "import --scenario" "$hzp" import "$root/traces/kineto/kineto_llama134m_b16_t1024.json.gz" \
  --scenario "$out/f.json" --out "$out/i.json"
expect_refused "collective --cluster" "$hzp" collective --cluster "$out/f.json" --op all_reduce --group node --bytes 1K
expect_refused "train --resume (latest)" "$hzp" train "$root/scenarios/runtime/tiny_dense.json" --nproc 1 \
  --checkpoint-dir "$out/ckpt" --resume --steps 1
# An output that is a FIFO: train's metrics.jsonl is opened without waiting for a reader, and refused.
mkdir -p "$out/o"
mkfifo "$out/o/metrics.jsonl"
expect_refused "train --out with a FIFO metrics.jsonl" "$hzp" train "$root/scenarios/runtime/tiny_dense.json" \
  --nproc 1 --threads 1 --steps 1 --data "$root/tests/data/tinyshakespeare_200k.txt" --out "$out/o"
if [ -r /proc/kmsg ]; then
  KIND="would wait for data" EXPECT="/proc/kmsg: read failed" expect_refused "validate /proc/kmsg" "$hzp" validate /proc/kmsg
  KIND="would wait for data" EXPECT="--data: /proc/kmsg" expect_refused "train --data /proc/kmsg" "$hzp" train \
    "$root/scenarios/runtime/tiny_dense.json" --nproc 1 --threads 1 --steps 1 --data /proc/kmsg --out "$out/k"
fi
[ $failures -eq 0 ] || exit 1
echo "fifo_inputs: ok"
