# deploy/demo.sh --replicated, step 1 (sourced by demo.sh, which sets
# launch, worker, steps, dir and build): the main job with --replicas 2.
#
# ps-launch trains in the background.  When the chief has done a third of
# the steps it is held (SIGSTOP) for a moment: its last logged global
# step is then an acknowledged one.  ps/1 is killed with -9 and the chief
# goes on at once; worker/1 never stops.  Then, while the job trains:
# - failover: the time from the kill until the view in etcd has ps/0 as
#   shard 1's primary (psctl status, polled every 20 ms);
# - acknowledged updates lost: the chief's acknowledged global step
#   before the kill minus the value read back from the new view (0 when
#   the value is at least the acknowledged one);
# - rejoin: ps-launch restarts ps/1 on its address; the time until the
#   view has it back in sync for both shards;
# - psctl verify: both workers held, every shard's replicas identical.
# Sets killed_step, failover_s, lost; $dir/train.out holds the job's
# stdout.  Exits 1 (the job stopped) when a step fails.

demo_fail() {
  echo "demo: FAILED: $*" >&2
  [ -n "${lpid:-}" ] && kill -TERM "$lpid" 2> /dev/null && wait "$lpid" 2> /dev/null
  exit 1
}

demo_now() { date +%s.%N; }
demo_since() { awk -v a="$1" -v b="$(demo_now)" 'BEGIN { printf "%.3f", b - a }'; }
demo_pid() { grep -oE "started $1 \(pid [0-9]+\)" "$dir/train.err" | tail -1 | grep -oE '[0-9]+\)' | tr -d ')'; }
demo_psctl() { "$build/worker/psctl" --cluster "$dir/cluster.json" --timeout-ms 3000 "$@"; }
# demo_wait SECONDS COMMAND...: until COMMAND succeeds (every 20 ms)
demo_wait() {
  local end=$(($(date +%s) + $1))
  shift
  until "$@"; do
    [ "$(date +%s)" -le "$end" ] || return 1
    sleep 0.02
  done
}
demo_chief_at() {
  local s
  s=$(grep -oE '^worker/0: .*\bstep [0-9]+ loss' "$dir/train.err" | tail -1 | grep -oE 'step [0-9]+' | grep -oE '[0-9]+')
  [ -n "$s" ] && [ "$s" -ge "$1" ]
}
demo_launch_exited() { ! kill -0 "$lpid" 2> /dev/null; }
# shard S's line of psctl status matches the extended regex
demo_view_has() {
  local out
  out=$(demo_psctl status 2> /dev/null) || true
  grep -qE "$1" <<< "$out"
}
demo_rejoined() {
  local out
  out=$(demo_psctl status 2> /dev/null) || true
  [ "$(grep -cE '^shard [01]: .*ps/1 (primary|backup) \(' <<< "$out")" = 2 ] &&
    ! grep -qE 'syncing|down' <<< "$out"
}

demo_replicated_train() {
  "${launch[@]}" --workers 2 --write-cluster "$dir/cluster.json" -- "${worker[@]}" \
    --steps "$steps" --log-every 100 --save-every-secs 10 --rpc-timeout 30 \
    > >(tee "$dir/train.out") 2> >(tee "$dir/train.err" >&2) &
  lpid=$!
  demo_wait 120 grep -q 'launch: started etcd' "$dir/train.err" 2> /dev/null ||
    demo_fail "ps-launch started no etcd"
  demo_wait 300 demo_chief_at $((steps / 3)) || demo_fail "the chief did not reach step $((steps / 3))"
  local chief ps1 addr1 t_kill vals
  chief=$(demo_pid worker/0)
  ps1=$(demo_pid ps/1)
  addr1=$(sed -n 's/^ps\/1: ps\/1 ready on //p' "$dir/train.out" | head -1)
  kill -STOP "$chief"
  killed_step=$(grep -oE '^worker/0: .*\bstep [0-9]+ loss' "$dir/train.err" | tail -1 |
    grep -oE 'step [0-9]+' | grep -oE '[0-9]+')
  t_kill=$(demo_now)
  kill -KILL "$ps1"
  kill -CONT "$chief"
  echo "== ps/1 (pid $ps1, $addr1) killed with -9; the chief's acknowledged global step: $killed_step"
  demo_wait 30 demo_view_has '^shard 1: ps/0 primary' ||
    demo_fail "no failover: shard 1 has no new primary 30 s after the kill"
  failover_s=$(demo_since "$t_kill")
  echo "== failover: ps/0 is shard 1's primary in the view $failover_s s after the kill" \
    "(measured by polling psctl status)"
  # the membership's own figure: "view epoch E: ... (failover X ms after
  # the failure was detected)" in the log of the ps that committed it
  local line
  line=$(grep -oE 'view epoch [0-9]+: .*\(failover [0-9]+ ms after the failure was detected\)' \
    "$dir/train.err" | tail -1 | grep -oE 'view epoch [0-9]+|failover [0-9]+ ms after the failure was detected' |
    paste -sd' ') || true
  [ -n "$line" ] && echo "== failover in the ps log: $line"
  vals=$(demo_psctl read global_step 2>&1) || demo_fail "psctl read global_step: $vals"
  local back
  back=$(tail -1 <<< "$vals" | grep -oE '[0-9]+' | head -1)
  [ -n "$back" ] || demo_fail "psctl read global_step: $vals"
  lost=$((killed_step > back ? killed_step - back : 0))
  echo "== acknowledged updates lost: $lost (global step acknowledged before the kill" \
    "$killed_step, read back after the failover $back)"
  [ "$lost" = 0 ] || demo_fail "$lost acknowledged updates of global_step were lost"
  demo_wait 60 grep -qE "launch: ps/1 restarted \(restart 1\)" "$dir/train.err" ||
    demo_fail "ps-launch did not restart ps/1"
  demo_wait 120 demo_rejoined || demo_fail "ps/1 did not rejoin: $(demo_psctl status 2>&1)"
  echo "== rejoin: ps/1 is back in sync for both shards $(demo_since "$t_kill") s after the kill"
  if demo_launch_exited; then
    echo "== the job ended before psctl verify could run"
  else
    local w1 out=""
    w1=$(demo_pid worker/1)
    chief=$(demo_pid worker/0)
    kill -STOP "$chief" "$w1"
    for _ in 1 2 3 4 5; do
      out=$(demo_psctl verify 2>&1) && break
      sleep 0.2
    done
    kill -CONT "$chief" "$w1"
    grep -q . <<< "$out" && sed 's/^/   verify: /' <<< "$out"
    grep -qE 'differ' <<< "$out" && demo_fail "psctl verify: the replicas differ"
  fi
  wait "$lpid" || demo_fail "the replicated job failed (ps-launch exit $?)"
  lpid=""
  if grep -qE 'waiting for the cluster to recover' "$dir/train.err"; then
    demo_fail "the chief restored a ps from a checkpoint: the failover lost its state"
  fi
}
