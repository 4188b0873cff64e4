#!/usr/bin/env bash
# Every script of the repo (tools/, bench/, bench/gpu/, tests/: *.sh and *.py) answers --help: exit 0, prints a usage
# text, and writes nothing into the repository (a --help that rewrote the shipped scenarios was seen).
# Usage: bash tests/scripts_help.sh
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
marker=$(mktemp)
trap 'rm -f "$marker"' EXIT
sleep 1  # file times have a one-second granularity on some file systems
failed=0 checked=0
for script in tools/*.sh tools/*.py bench/*.sh bench/*.py bench/gpu/*.sh bench/gpu/*.py tests/*.sh; do
  [ -f "$script" ] || continue
  case "$script" in *.py) runner=python3 ;; *) runner=bash ;; esac
  out=$(cd "$repo" && timeout 60 "$runner" "$script" --help 2>&1)
  rc=$?
  checked=$((checked + 1))
  if [ $rc -ne 0 ] || [ -z "$out" ]; then
    echo "FAIL: $script --help exited $rc with ${#out} bytes of output"
    failed=$((failed + 1))
  fi
done
changed=$(find "$repo" \( -path "$repo/.git" -o -path "$repo/build*" -o -path "$repo/out" -o -name __pycache__ \) -prune -o -type f -newer "$marker" -print)
if [ -n "$changed" ]; then
  echo "FAIL: --help wrote into the repository:"
  echo "$changed"
  failed=$((failed + 1))
fi
echo "$((checked - failed)) passed, $failed failed"
[ $failed -eq 0 ]
