#!/usr/bin/env bash
# SyncReplicas across a failover (DESIGN.md "Replication": accumulators
# are not replicated; a failover drops the partial step and the retried
# gradients accumulate again): 3 real ps-server --replicas 2, a real etcd,
# 2 ps-worker --sync (linreg).  A run with no failure gives the loss to
# match; then shard 0's primary (global_step's shard) is killed with -9
# mid-training: both workers finish exit 0 with no recovery wait, the
# step never goes back in any worker's log, global_step ends at --steps,
# the final loss is as low as the run with no failure, and the ps stop
# with exit 0.
set -u
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
source "$(dirname "$0")/../support/repl.sh"
test_init repl_sync
TTL=2
STEPS=200
etcd_start repl_sync || { bad "etcd starts"; finish; exit 1; }

declare -a P
# start_ps JOB: 3 ps --replicas 2 of $dir/JOB.json (with 2 workers)
start_one() {
  : > "$dir/$1$2.out"
  "$PS_SERVER" --cluster "$dir/$1.json" --job ps --task "$2" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job "$1" --lease-ttl "$TTL" --grace-secs 2 \
    > "$dir/$1$2.out" 2>> "$dir/$1$2.log" &
  P[$2]=$!
}
start_ps() {
  repl_start_one() { start_one "$job" "$1"; }
  local job=$1
  repl_start 3 "$dir/$1.json" "$1" ', "worker": ["127.0.0.1:0", "127.0.0.1:0"]'
}
declare -a W
workers() {
  for t in 0 1; do
    timeout 300 "$PS_WORKER" --cluster "$dir/$1.json" --job worker --task "$t" --model linreg \
      --sync --steps "$STEPS" --log-every 5 --replicas 2 --etcd "$ETCD_ENDPOINTS" --repl-job "$1" \
      --keep-ps --rpc-timeout 20 > "$dir/$1-w$t.out" 2> "$dir/$1-w$t.log" &
    W[$t]=$!
  done
}
# last_loss FILE: the loss of the last progress line
last_loss() { grep -oE "step [0-9]+ loss [0-9.e+-]+" "$1" | tail -n 1 | awk '{ print $4 }'; }
stop_ps() {
  local t r all=0
  for t in 0 1 2; do
    [ -n "${P[$t]:-}" ] || continue
    kill -TERM "${P[$t]}" 2> /dev/null; wait "${P[$t]}"; r=$?
    [ "$r" = 0 ] || all=$r
  done
  return "$all"
}

# ---- the run with no failure ----
start_ps base || { bad "3 ps --replicas 2 start" "$(tail -n 5 "$dir"/base*.log)"; finish; exit 1; }
workers base
wait "${W[0]}"; r0=$?; wait "${W[1]}"; r1=$?
base=$(last_loss "$dir/base-w0.log")
if [ "$r0$r1" = 00 ] && [ -n "$base" ]; then
  ok "2 ps-worker --sync without a failure: exit 0, final loss $base"
else
  bad "2 ps-worker --sync without a failure (exit $r0 $r1)" "$(tail -n 5 "$dir"/base-w*.log)"
fi
stop_ps || bad "the ps stop with exit 0 (no failure)"

# ---- kill -9 of global_step's primary mid-training ----
start_ps fo || { bad "3 ps --replicas 2 start" "$(tail -n 5 "$dir"/fo*.log)"; finish; exit 1; }
workers fo
wait_for "$dir/fo-w0.log" "step [0-9]*[05]0 loss" 120 || bad "ps-worker --sync trains" "$(tail -n 5 "$dir/fo-w0.log")"
kill -KILL "${P[0]}"; wait "${P[0]}" 2> /dev/null; P[0]=""
if wait_for "$dir/fo1.log" "ps/1 is now the primary of shard 0" 20; then
  ok "ps/1 takes over shard 0 (global_step's) mid-training"
else
  bad "ps/1 takes over shard 0 (global_step's) mid-training" "$(tail -n 5 "$dir/fo1.log")"
fi
killed_at=$(grep -oE "step [0-9]+ loss" "$dir/fo-w0.log" | tail -n 1 | grep -oE "[0-9]+")
wait "${W[0]}"; r0=$?; wait "${W[1]}"; r1=$?
if [ "$r0$r1" = 00 ]; then
  ok "both workers finish across the kill -9 (killed at step $killed_at)"
else
  bad "both workers finish across the kill -9 (exit $r0 $r1)" "$(tail -n 10 "$dir"/fo-w*.log)"
fi
for t in 0 1; do
  steps=$(grep -oE "\bstep [0-9]+ loss" "$dir/fo-w$t.log" | grep -oE "[0-9]+")
  back=$(awk 'NR > 1 && $1 < prev { print prev " -> " $1 } { prev = $1 }' <<< "$steps")
  last=$(tail -n 1 <<< "$steps")
  if [ -z "$back" ] && [ -n "$last" ] && [ -n "$killed_at" ] && [ "$last" -gt "$killed_at" ]; then
    ok "worker/$t: the global step never goes back (last $last)"
  else
    bad "worker/$t: the global step never goes back (back: $back, last $last)" "$(tail -n 10 "$dir/fo-w$t.log")"
  fi
  if grep -qiE "waiting for the cluster to recover|restart" "$dir/fo-w$t.log"; then
    bad "worker/$t: no recovery wait, no restart" "$(grep -iE "recover|restart" "$dir/fo-w$t.log")"
  else
    ok "worker/$t: no recovery wait, no restart"
  fi
done
out=$("$PSCTL" --cluster "$dir/fo.json" --etcd "$ETCD_ENDPOINTS" --repl-job fo --replicas 2 \
  --timeout-ms 5000 read global_step 2>&1)
if [[ "$out" == *$'\n'"$STEPS"* ]]; then ok "global_step is $STEPS after the failover"; else bad "global_step is $STEPS after the failover" "$out"; fi
loss=$(last_loss "$dir/fo-w0.log")
if [ -n "$loss" ] && [ -n "$base" ] && awk -v a="$loss" -v b="$base" 'BEGIN { exit !(a <= 2 * b + 0.01) }'; then
  ok "the final loss across the failover ($loss) is as low as without one ($base)"
else
  bad "the final loss across the failover ($loss) is as low as without one ($base)"
fi
stop_ps && ok "the job ends cleanly: the ps left stop with exit 0" || bad "the ps left stop with exit 0"
etcd_stop
finish
