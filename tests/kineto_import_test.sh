#!/usr/bin/env bash
# hzp import on the real PyTorch profiler traces recorded on an H100 (traces/kineto/, or $HZP_KINETO_TRACES;
# skipped, exit 77, where they are missing): each imported trace, replayed, must come
# back within 3 % of the GPU kernel time per step the recording script measured (61.0 ms dense, 110 ms
# MoE; traces/kineto/README.md); the two DDP/gloo rank files merge into one 2-rank trace whose replay
# is within 3 % of its own recorded step; the one-GPU dense trace's what-ifs at 8 and 1024 GPUs run; each
# trace given the other model's scenario is refused; so is a profile whose trace would pass what replay reads.
# Usage: bash tests/kineto_import_test.sh HZP_BINARY
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -euo pipefail
hzp=$1
root=$(cd "$(dirname "$0")/.." && pwd)
traces=${HZP_KINETO_TRACES:-$root/traces/kineto}
if [ ! -f "$traces/kineto_llama134m_b16_t1024.json.gz" ]; then
  echo "skipped: no PyTorch profiler traces at $traces"
  exit 77
fi
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# import + replay; then the replayed step of every rank against EXPECTED_S within 3 %.
check() {  # NAME EXPECTED_S FILE...
  local name=$1 expected=$2
  shift 2
  local files=()
  for f in "$@"; do files+=("$traces/$f"); done
  "$hzp" import "${files[@]}" --scenario "$root/scenarios/kineto/$name.json" --out "$out/$name.json"
  "$hzp" replay "$out/$name.json" --out "$out/replay-$name"
  python3 - "$out/replay-$name/summary.json" "$expected" "$name" <<'PY'
import json, sys
summary, expected, name = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
rep = summary["replay"]
assert rep["ops_not_in_trace"] == 0, rep
for r in rep["ranks"]:
    want = float(expected) if expected != "recorded" else r["recorded_step_s"]
    err = (r["replayed_step_s"] - want) / want
    print(f"{name} rank {r['rank']}: replayed {r['replayed_step_s']*1e3:.2f} ms, expected {want*1e3:.2f} ms ({100*err:+.2f} %)")
    assert abs(err) <= 0.03, f"{name}: {100*err:+.2f} % is outside 3 %"
PY
}
check llama134m-h100 0.0610 kineto_llama134m_b16_t1024.json.gz
check moe-e8top2-h100 0.110 kineto_moe_e8top2_b16_t1024.json.gz
# Given in the wrong order on purpose: distributedInfo.rank orders them.
check ddp-gloo-2ranks recorded kineto_ddp_gloo_2ranks_rank1.json.gz kineto_ddp_gloo_2ranks_rank0.json.gz

for what in h100-8-zero3 h100-1024-hsdp; do
  "$hzp" replay "$out/llama134m-h100.json" --scenario "$root/scenarios/what-if/$what.json" --out "$out/$what" >"$out/log"
  grep "step time" "$out/log"
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['what_if']['ops_not_in_trace']==0 and s['step_time_s']>0, s" \
    "$out/$what/summary.json"
done
# A trace with the other model's scenario is refused, saying what disagrees (dense <-> MoE token routing).
mismatch() {  # TRACE SCENARIO EXPECTED_TEXT
  if "$hzp" import "$traces/$1" --scenario "$root/scenarios/kineto/$2.json" --out "$out/mismatch.json" >"$out/log" 2>&1; then
    echo "FAIL: $1 with $2 was imported"; exit 1
  fi
  grep -q "$3" "$out/log" || { echo "FAIL: $1 with $2:"; cat "$out/log"; exit 1; }
}
mismatch kineto_llama134m_b16_t1024.json.gz moe-e8top2-h100 "shows no token routing"
mismatch kineto_moe_e8top2_b16_t1024.json.gz llama134m-h100 "routes tokens as a MoE does"
# A profile of 7,000 tiny steps of a 48-layer model makes a trace past the 256 MiB hzp replay reads: import
# stops there, naming the event, and writes nothing (it wrote 1.8 GB of JSON tree before). --no-check: its
# 5 us kernels are far too fast for such a model, which import refuses first.
python3 - "$out/many.json" <<'PY'
import json, sys
events, t, cid = [], 1000.0, 1
for step in range(7000):
    for phase in ("forward", "backward", "optimizer"):
        events.append({"ph": "X", "cat": "user_annotation", "name": phase, "pid": 1, "tid": 1, "ts": t, "dur": 10.0})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 1,
                       "dur": 1.0, "args": {"correlation": cid}})
        events.append({"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": t + 2, "dur": 5.0,
                       "args": {"correlation": cid, "device": 0}})
        cid, t = cid + 1, t + 12
json.dump({"traceEvents": events, "deviceProperties": [{"name": "NVIDIA H100 80GB HBM3"}]}, open(sys.argv[1], "w"))
PY
if "$hzp" import "$out/many.json" --scenario "$root/scenarios/kineto/llama134m-h100.json" --set model.layers=48 --no-check \
  --out "$out/many-trace.json" >"$out/log" 2>&1; then
  echo "FAIL: a trace past 256 MiB was written"; exit 1
fi
grep -q "the trace passes 256 MiB, what hzp replay reads, at event" "$out/log" || { cat "$out/log"; exit 1; }
[ ! -e "$out/many-trace.json" ] && [ ! -e "$out/many-trace.json.tmp" ] || { echo "FAIL: a file was left"; exit 1; }
echo "kineto import: all checks passed"
