#!/usr/bin/env bash
# The counted steady state (sim/steady_state.h: a step of M micro-batches simulated as two shorter ones and
# extrapolated) gives the full simulation's step time within 1 % and the same memory, traffic and collectives
# (bench/sim_symmetry.sh, CHECK_ONLY, STEADY: a scenario where it was not counted fails) on one scenario of
# each kind: an interleaved and a 1F1B pipeline with tensor parallelism, a 4-D MoE recipe in miniature,
# ZeRO-3, MoE ZeRO-3 with expert parallelism, AsyncHZP, InternEvo's ZeRO-1, context parallelism, two steps,
# per-GPU speed spread and ECMP (where every rank is simulated: the steady state alone). The full simulation
# is what it is checked against: no tolerance here was fitted to make it pass.
# Usage: bash tests/sim_steady_state.sh HZP_BINARY
case "${1:-}" in -h|--help|"") sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; [ -n "${1:-}" ]; exit $? ;; esac
set -uo pipefail
hzp=$1
root=$(cd "$(dirname "$0")/.." && pwd)
check="$root/bench/sim_symmetry.sh"
data="$root/tests/data/sim"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
cat > "$out/1f1b.json" <<'JSON'
{"name": "tp8-pp4", "model": {"preset": "llama2-13b"}, "cluster": {"preset": "dgx-h100", "nodes": 4},
 "training": {"seq_len": 4096, "micro_batch": 1, "global_batch_sequences": 24, "precision": "bf16"},
 "policy": {"preset": "zero1", "parallel": {"tensor": 8, "pipeline": 4, "sequence_parallel": true}}}
JSON
export CHECK_ONLY=1 STEADY=1
failures=0
run() { bash "$check" "$hzp" "$@" || failures=$((failures + 1)); }
run "$out/1f1b.json" "$root/scenarios/dense/llama2-7b-a800-64-zero3.json" \
  "$root/scenarios/moe/mixtral-8x7b-dgx-h100-64-zero3-ep8.json"
# The symmetry test's interleaved pipeline and 4-D recipe, with enough micro-batches (32) to be counted.
run "$data/tp2-pp2x2.json" "$data/mini-recipe.json" -- --set training.global_batch_sequences=256
run "$root/scenarios/papers/amsp-llama2-7b-asynchzp.json" -- --set cluster.nodes=16 \
  --set training.global_batch_tokens=2621440
run "$root/scenarios/papers/internevo-7b-hybrid-zero1-1024.json" -- --set cluster.nodes=16 \
  --set training.global_batch_sequences=1536
run "$root/scenarios/dense/llama2-7b-64k-dgx-h100-64-context8.json" -- --set training.global_batch_sequences=40
run "$data/tp2-pp2x2.json" -- --set training.global_batch_sequences=256 --steps 2
run "$data/tp2-pp2x2.json" -- --set training.global_batch_sequences=256 --set cluster.compute_spread=0.02
run "$out/1f1b.json" -- --set 'cluster.inter_node={"routing": "ecmp", "placement": "scattered", "leaf_size": 2}'
[ $failures -eq 0 ] && echo "ok: counted steady states match the full simulations"
exit $((failures > 0))
