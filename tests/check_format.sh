#!/usr/bin/env bash
# Every C source and header of the tree follows .clang-format (run by the
# test command as test `check_format`).  Prints the files that differ and
# how to fix them; exits 1 if there is any.  The output of clang-format
# changes between its major versions, so the check uses the one Debian 12
# ships (14; deploy/setup.sh installs it); with another major version it
# says so and checks nothing (exit 77, "skipped").
#   tests/check_format.sh [ROOT]        check
#   tests/check_format.sh --fix [ROOT]  format the tree in place
set -uo pipefail
fix=0
if [ "${1:-}" = --fix ]; then fix=1; shift; fi
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
cf=""
for c in clang-format-14 clang-format; do
  if command -v "$c" >/dev/null && "$c" --version | grep 'version 14\.' > /dev/null; then cf=$c; break; fi
done
if [ -z "$cf" ]; then
  echo "check_format: clang-format 14 not found (apt-get install clang-format on Debian 12); skipped"
  exit 77
fi
# the generated and vendored code is not ours to format
mapfile -t files < <(find common ps worker deploy tests -name '*.[ch]' -not -path '*/build*' | sort)
if [ $fix -eq 1 ]; then
  "$cf" -i --style=file "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! "$cf" --style=file "$f" | cmp -s - "$f"; then
    echo "$f: not formatted"; bad=1
  fi
done
if [ $bad -ne 0 ]; then
  echo "check_format: FAILED (tests/check_format.sh --fix formats the tree)"
  exit 1
fi
echo "check_format: ok (${#files[@]} files)"
