#!/usr/bin/env bash
# A ps that stops answering (SIGSTOP: stopped, hung, its host frozen):
# calls have a deadline, --rpc-timeout (deploy/DEPLOY.md).
#  a. a stop shorter than --rpc-timeout only delays training: it finishes;
#  b. a stop past it ends ps-worker with exit status 69 and a message that
#     names ps/1, its address and the call, within the timeout and a
#     margin; while it lasts, the worker's metrics page shows the stall;
#  c. psctl against the stopped ps fails with the message, and status
#     shows it "not answering" (--rpc-timeout, PS_RPC_TIMEOUT);
#  d. a ps that holds calls on purpose (synchronous updates waiting for a
#     stopped worker) still answers, so those calls are not cut off;
#  e. bad --rpc-timeout and PS_RPC_TIMEOUT values are refused;
#  f. a worker that starts while a ps is stopped ends the same way;
#  g. under ps-launch (when PS_LAUNCH is set) the job exits 69.
# Ports are picked at run time; every process is stopped (and a stopped
# one continued) however the script ends.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}; PS_WORKER=${PS_WORKER:?}
PS_LAUNCH=${PS_LAUNCH:-}
source "$(dirname "$0")/../support/lib.sh"
test_init stall
BAD_TAIL=40
STOPPED=()
test_cleanup_hook() {
  local p
  for p in "${STOPPED[@]}"; do kill -CONT "$p" 2> /dev/null; kill -KILL "$p" 2> /dev/null; done
}
# stopped PID: every thread of PID is stopped (a group stop reaches the
# threads one by one; until then one may still serve a call)
stopped() {
  local f s
  for f in /proc/"$1"/task/*/stat; do
    s=$(sed 's/^.*) \(.\).*/\1/' "$f" 2> /dev/null) || continue
    [ -z "$s" ] || [ "$s" = T ] || return 1
  done
}
# stop PID: SIGSTOP, then waits until it took
stop() {
  local i
  STOPPED+=("$1")
  kill -STOP "$1"
  for ((i = 0; i < 200; i++)); do stopped "$1" && return 0; sleep 0.05; done
  bad "pid $1 stopped"
}

# start_pair: ps/0 and ps/1 on ports the kernel picks; P0 P1 their pids,
# $dir/spec.json the cluster with one worker (or $1 workers)
start_pair() {
  echo '{"ps": ["127.0.0.1:0", "127.0.0.1:0"]}' > "$dir/boot.json"
  start_ps "$dir/boot.json" 0 "$dir/ps0.log"; P0=$PID; A0=$ADDR
  start_ps "$dir/boot.json" 1 "$dir/ps1.log"; P1=$PID; A1=$ADDR
  if [ -z "$A0" ] || [ -z "$A1" ]; then
    bad "ps tasks started" "$(cat "$dir"/ps*.log)"
    finish
  fi
  local w='"127.0.0.1:1"' i
  for ((i = 1; i < ${1:-1}; i++)); do w="$w, \"127.0.0.1:$((i + 1))\""; done
  echo "{\"ps\": [\"$A0\", \"$A1\"], \"worker\": [$w]}" > "$dir/spec.json"
}
stop_pair() {
  kill -CONT "$P0" "$P1" 2> /dev/null
  kill -TERM "$P0" "$P1" 2> /dev/null
  wait "$P0" "$P1" 2> /dev/null
}
# wait_pid PID SECS: its exit status, or 124 when it still ran after SECS
# (then it is killed): a hang fails the test instead of stalling it
wait_pid() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do
    kill -0 "$1" 2> /dev/null || break
    sleep 0.05
  done
  if kill -0 "$1" 2> /dev/null; then
    kill -CONT "$1" 2> /dev/null; kill -KILL "$1" 2> /dev/null; wait "$1" 2> /dev/null
    return 124
  fi
  wait "$1"
}
# metric FILE NAME: the value of a sample line
metric() { sed -n "s/^$2 //p" "$1" | head -1; }

W=(--model mlp --hidden 32 --batch 50 --log-every 50 --keep-ps)

# ---- a. ps/1 stopped for 3 s, --rpc-timeout 6: training goes on
start_pair
"$PS_WORKER" --cluster "$dir/spec.json" --job worker --task 0 "${W[@]}" --steps 3000 \
  --rpc-timeout 6 > "$dir/a.out" 2> "$dir/a.err" &
WP=$!
if wait_for "$dir/a.err" 'step [0-9]+ loss' 120; then
  stop "$P1"
  t0=$(date +%s.%N)
  sleep 3 # the stop itself: shorter than --rpc-timeout
  kill -CONT "$P1"
  check "a: the worker was still training when ps/1 came back" kill -0 "$WP"
  wait_pid "$WP" 180; rc=$?
  check "a: a stop shorter than --rpc-timeout: the job finishes (exit $rc)" test "$rc" = 0
  check "a: to the last step" grep -q '^global step 3000$' "$dir/a.out"
  check "a: no rpc-timeout error" bash -c "! grep -q 'rpc-timeout)' '$dir/a.err'"
else
  bad "a: the worker trained" "$(cat "$dir/a.err")"
fi
stop_pair

# ---- b. ps/1 stopped for good, --rpc-timeout 8: exit 69 naming ps/1 and the call
start_pair
"$PS_WORKER" --cluster "$dir/spec.json" --job worker --task 0 "${W[@]}" --steps 1000000 \
  --rpc-timeout 8 --metrics-port 0 > "$dir/b.out" 2> "$dir/b.err" &
WP=$!
if wait_for "$dir/b.err" 'step [0-9]+ loss' 120 && wait_for "$dir/b.err" 'metrics on port' 10; then
  MP=$(sed -n 's/.*metrics on port \([0-9]*\) .*/\1/p' "$dir/b.err" | head -1)
  t0=$(date +%s.%N) # before the stop: stop() then waits until every thread is stopped
  stop "$P1"
  # while it lasts, the page shows how long ps/1 has not answered
  seen=""
  for ((i = 0; i < 200; i++)); do
    curl -sf "http://127.0.0.1:$MP/metrics" > "$dir/m.txt" 2> /dev/null
    v=$(metric "$dir/m.txt" 'ps_worker_ps_unanswered_seconds{ps="ps\/1"}')
    if [ -n "$v" ] && awk -v v="$v" 'BEGIN { exit !(v >= 2) }'; then seen=$v; break; fi
    sleep 0.05
  done
  [ -n "$seen" ] && ok "b: metrics show ps/1 unanswered for $seen s during the stall" \
    || bad "b: metrics show the stall" "$(cat "$dir/m.txt")"
  v0=$(metric "$dir/m.txt" 'ps_worker_ps_unanswered_seconds{ps="ps\/0"}')
  check "b: ... and not ps/0 ($v0)" test "$v0" = "0.000"
  check "b: ... and the timeout" grep -q '^ps_worker_rpc_timeout_seconds 8.000$' "$dir/m.txt"
  wait_pid "$WP" 60; rc=$?
  secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  check "b: ps-worker exits 69 (got $rc)" test "$rc" = 69
  show="$dir/b.err"
  check "b: the message names ps/1, its address, the call and the flag" grep -Eq \
    "ps-worker: ps/1 at $A1: (Update|Read): no answer for 8 s \(--rpc-timeout\)" "$dir/b.err"
  check "b: DEADLINE_EXCEEDED is not waited out as a recoverable error" \
    bash -c "! grep -q 'waiting for the cluster to recover' '$dir/b.err'"
  check "b: WARN while waiting, with how long ps/1 has not answered" grep -Eq \
    "WARN worker/0: still waiting after 5 s for /paramserver.Ps/(Update|Read) on $A1 .*no answer for [45] s, --rpc-timeout 8 s" \
    "$dir/b.err"
  show=""
  check "b: within the timeout and a margin (${secs} s after the stop)" \
    awk -v s="$secs" 'BEGIN { exit !(s >= 7.5 && s < 14) }'
  # ---- c. psctl against the stopped ps
  t1=$(date +%s.%N)
  out=$("$PSCTL" --cluster "$dir/spec.json" --rpc-timeout 2 status 2>&1); rc=$?
  secs=$(awk -v a="$t1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  check "c: psctl status: exit 1 (got $rc)" test "$rc" = 1
  [[ "$out" == *"ps/0 $A0 up"* ]] && ok "c: status: ps/0 up" || bad "c: status: ps/0 up" "$out"
  want="ps/1 $A1 not answering (DEADLINE_EXCEEDED: ps/1 at $A1: Status: no answer for 2 s (--rpc-timeout))"
  [[ "$out" == *"$want"* ]] && ok "c: status: ps/1 not answering" || bad "c: status: '$want'" "$out"
  check "c: in about 2 s (${secs} s)" awk -v s="$secs" 'BEGIN { exit !(s >= 1.8 && s < 6) }'
  out=$(PS_RPC_TIMEOUT=1.5 "$PSCTL" --cluster "$dir/spec.json" vars 2>&1); rc=$?
  want="ps/1 at $A1: List: no answer for 1.5 s (--rpc-timeout)"
  [[ "$rc" = 1 && "$out" == *"$want"* ]] && ok "c: PS_RPC_TIMEOUT=1.5 psctl vars" \
    || bad "c: PS_RPC_TIMEOUT=1.5 psctl vars: exit 1 with '$want' (exit $rc)" "$out"
else
  bad "b: the worker trained" "$(cat "$dir/b.err")"
fi
stop_pair

# ---- d. synchronous updates held by the ps while worker/1 is stopped for
# longer than --rpc-timeout: the ps still answers, nothing is cut off
start_pair 2
for t in 0 1; do
  "$PS_WORKER" --cluster "$dir/spec.json" --job worker --task $t "${W[@]}" --sync \
    --steps 2000 --rpc-timeout 3 > "$dir/d$t.out" 2> "$dir/d$t.err" &
  eval "D$t=\$!"
done
if wait_for "$dir/d1.err" 'step [0-9]+ loss' 120; then
  # worker/1 stopped twice, each time longer than --rpc-timeout; most of
  # its time it waits in a call, so its own calls' clocks see the stop
  # too: a stop of the caller is not the ps's silence
  for k in 1 2; do
    stop "$D1"
    sleep 4 # the stop itself
    kill -CONT "$D1"
    sleep 0.5
  done
  wait_pid "$D0" 180; rc0=$?
  wait_pid "$D1" 60; rc1=$?
  check "d: worker/0 (its updates held by the ps) finishes (exit $rc0)" test "$rc0" = 0
  check "d: worker/1 finishes (exit $rc1)" test "$rc1" = 0
  check "d: no rpc-timeout error" bash -c "! grep -q 'rpc-timeout)' '$dir/d0.err' '$dir/d1.err'"
else
  bad "d: worker/1 trained" "$(cat "$dir/d1.err")"
fi
stop_pair

# ---- f. a worker that starts while ps/1 is stopped (its connection is
# accepted by the kernel, never answered) ends too, in the wait for the ps
start_pair
stop "$P1"
t0=$(date +%s.%N)
"$PS_WORKER" --cluster "$dir/spec.json" --job worker --task 0 "${W[@]}" --steps 100 \
  --rpc-timeout 3 > "$dir/f.out" 2> "$dir/f.err" &
WP=$!
wait_pid "$WP" 60; rc=$?
secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
check "f: a worker starting with ps/1 stopped exits 69 (got $rc)" test "$rc" = 69
show="$dir/f.err"
check "f: ... naming ps/1 and the call" grep -q \
  "ps-worker: ps/1 at $A1: Status: no answer for 3 s (--rpc-timeout)" "$dir/f.err"
show=""
check "f: ... within the timeout and a margin (${secs} s)" \
  awk -v s="$secs" 'BEGIN { exit !(s >= 2.9 && s < 10) }'
stop_pair

# ---- g. the same under ps-launch: the job ends with the chief's 69
if [ -n "${PS_LAUNCH:-}" ]; then
  "$PS_LAUNCH" --ps 2 --workers 1 --grace-secs 2 -- "$PS_WORKER" "${W[@]}" --steps 1000000 \
    --rpc-timeout 4 > "$dir/g.out" 2> "$dir/g.err" &
  LP=$!
  if wait_for "$dir/g.err" 'worker/0: .*step [0-9]+ loss' 120; then
    G1=$(sed -n 's/.*started ps\/1 (pid \([0-9]*\)).*/\1/p' "$dir/g.err" | head -1)
    stop "$G1"
    wait_pid "$LP" 60; rc=$?
    kill -CONT "$G1" 2> /dev/null
    check "g: ps-launch exits with the chief's 69 (got $rc)" test "$rc" = 69
    show="$dir/g.err"
    check "g: the chief named ps/1 and the call" grep -Eq \
      "worker/0: .*ps/1 at [0-9.:]+: (Update|Read): no answer for 4 s \(--rpc-timeout\)" "$dir/g.err"
    show=""
  else
    bad "g: the job trained" "$(cat "$dir/g.err")"
  fi
fi

# ---- e. bad values
expect "e: --rpc-timeout 0" 2 "--rpc-timeout must be a number >= 0.001, got '0'" \
  "$PS_WORKER" --local --rpc-timeout 0
expect "e: --rpc-timeout too large" 2 "--rpc-timeout must be at most 31536000 s" \
  "$PS_WORKER" --local --rpc-timeout 1e12
expect "e: psctl --rpc-timeout x" 2 \
  "psctl: --rpc-timeout must be a number of seconds from 0.001 to 31536000, got 'x'" \
  "$PSCTL" --cluster "$dir/spec.json" --rpc-timeout x status
expect "e: PS_RPC_TIMEOUT=abc" 2 \
  "PS_RPC_TIMEOUT must be a number of seconds from 0.001 to 31536000, got 'abc'" \
  env PS_RPC_TIMEOUT=abc "$PSCTL" --cluster "$dir/spec.json" status
finish
