#!/usr/bin/env bash
# The whole suite N times in a row (default 3) while two busy loops keep both cores of a 2-core machine
# busy: what a loaded CI machine looks like. Prints each run's exit code and wall time; exits non-zero if
# any run failed. Usage: tests/bench/suite_under_load.sh [N] [pytest args...]
set -uo pipefail
cd "$(dirname "$0")/../.."
n="${1:-3}"
shift || true
python3 -c 'while True: pass' & l1=$!
python3 -c 'while True: pass' & l2=$!
trap 'kill $l1 $l2 2>/dev/null' EXIT
failed=0
for i in $(seq 1 "$n"); do
  start=$(date +%s)
  ./.ci/test "$@" > "/tmp/hsched-suite-under-load.$i.log" 2>&1
  rc=$?
  echo "run $i: rc=$rc wall=$(( $(date +%s) - start )) s ($(grep -E '(passed|failed)' "/tmp/hsched-suite-under-load.$i.log" | tail -n 1))"
  [ "$rc" -eq 0 ] || failed=1
done
exit "$failed"
