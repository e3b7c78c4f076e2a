#!/usr/bin/env bash
# The click-through model on embedding tables at full size: ps-worker
# --model ctr on 2 ps + 2 workers started by ps-launch, on a generated
# click log of --examples 1000000 (ten times the default) for 20000 steps,
# against the best achievable AUC and log loss (the log's own click
# probabilities, which ps-worker prints).  Target: AUC within 2% of the
# best.  Prints `bench:` lines; exit 1 when a run fails.
#
#   tests/bench/bench_ctr.sh BUILD_DIR [EXAMPLES] [STEPS]
set -euo pipefail
build=${1:?build dir}; examples=${2:-1000000}; steps=${3:-20000}
out=$(mktemp); err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT
val() { sed -n "s/^\(worker\/0: \)\{0,1\}$2 //p" "$1" | tail -1; }
t0=$(date +%s.%N)
if ! "$build/deploy/ps-launch" --ps 2 --workers 2 -- "$build/worker/ps-worker" --model ctr \
  --examples "$examples" --steps "$steps" --log-every 5000 > "$out" 2> "$err"; then
  echo "bench_ctr.sh: the job failed:" >&2
  tail -20 "$err" >&2
  exit 1
fi
t1=$(date +%s.%N)
auc=$(val "$out" "test auc"); best=$(val "$out" "best auc")
ll=$(val "$out" "test logloss"); bll=$(val "$out" "best logloss")
awk -v a="$auc" -v b="$best" -v l="$ll" -v bl="$bll" -v n="$examples" -v s="$steps" \
  -v t="$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')" 'BEGIN {
  printf "bench: ctr_auc %.4f best=%.4f ratio=%.4f target=>= 0.98 (%d examples, %d steps, 2 ps + 2 workers, %.0f s)\n", a, b, a / b, n, s, t
  printf "bench: ctr_logloss %.4f best=%.4f\n", l, bl }'
