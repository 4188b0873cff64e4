#!/usr/bin/env bash
# Checks that every C++ and CUDA source of the repo is formatted as .clang-format says (clang-format-14,
# the version Debian ships; another version may format differently). Prints the files that differ and
# exits 1; exits 77 (ctest "skipped") where clang-format-14 is missing.
# Usage: bash tools/check_format.sh [--fix]   (--fix rewrites the files in place)
case "${1:-}" in -h|--help) sed -n '2,/^[^#]/p' "$0" | sed -n '/^#/s/^# \{0,1\}//p'; exit 0 ;; esac
set -euo pipefail
cd "$(dirname "$0")/.."

formatter=""
for candidate in clang-format-14 clang-format; do
  if command -v "$candidate" >/dev/null && "$candidate" --version | grep -q "version 14\."; then
    formatter="$candidate"
    break
  fi
done
if [ -z "$formatter" ]; then
  echo "check_format: SKIPPED: clang-format 14 not found (Debian: clang-format-14)"
  exit 77
fi

mapfile -t files < <(git ls-files '*.h' '*.cc' '*.cu' '*.cuh' 2>/dev/null || find shared sim runtime tools tests -name '*.h' -o -name '*.cc' -o -name '*.cu')
if [ "${1:-}" = "--fix" ]; then
  "$formatter" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$formatter" "$f" | cmp -s - "$f"; then
    echo "check_format: $f differs from clang-format (fix: bash tools/check_format.sh --fix)"
    bad=1
  fi
done
[ "$bad" -eq 0 ] && echo "check_format: ${#files[@]} files formatted"
exit "$bad"
