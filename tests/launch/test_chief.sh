#!/usr/bin/env bash
# The chief's end of a job, through real ps-server and ps-worker processes
# on 127.0.0.1 with ports the kernel picks (no ps-launch: it would stop the
# ps itself when the chief exits, hiding what the chief leaves running):
#  - a final save that fails still shuts the ps down (unless --keep-ps),
#    and the chief exits 1 naming the save;
#  - SIGTERM to the chief does not log that global_step stood still;
#  - a restarted chief does not wait for a worker that joined and died,
#    yet waits for one that has not joined.
# Waits poll with deadlines; every process is stopped by pid at the end.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PS_WORKER=${PS_WORKER:?}
source "$(dirname "$0")/../support/lib.sh"
test_init chief-test

has() { grep -qE -- "$2" "$1"; }
rc_is() { [ "$1" = "$2" ]; }
gone() { ! kill -0 "$1" 2>/dev/null; }
# wait_gone PID SECONDS: until the process has ended
wait_gone() {
  local i
  for ((i = 0; i < $2 * 20; i++)); do gone "$1" && return 0; sleep 0.05; done
  return 1
}

# reap PID: its exit status in rc; one still running is killed first
# (a check before has failed then)
reap() {
  gone "$1" || kill -KILL "$1" 2>/dev/null
  wait "$1"; rc=$?
}

# cluster NAME NWORKERS [PS_FLAG...]: ps/0 running with a checkpoint
# directory $dir/NAME.ck; $dir/NAME.json names it and NWORKERS workers.
cluster() {
  local name=$1 n=$2 w="" i; shift 2
  mkdir -p "$dir/$name.ck"
  echo '{"ps": ["127.0.0.1:0"]}' > "$dir/$name.boot.json"
  start_ps "$dir/$name.boot.json" 0 "$dir/$name.ps.log" --checkpoint-dir "$dir/$name.ck" "$@"
  PS_PID=$PID
  for ((i = 0; i < n; i++)); do w+="${i:+, }\"127.0.0.1:0\""; done
  w=${w#, }
  echo "{\"ps\": [\"$ADDR\"], \"worker\": [$w]}" > "$dir/$name.json"
}
# worker NAME TASK LOG ARGS...: ps-worker in the background, pid in WPID
worker() {
  local name=$1 task=$2 log=$3; shift 3
  "$PS_WORKER" --cluster "$dir/$name.json" --job worker --task "$task" \
    --checkpoint-dir "$dir/$name.ck" "$@" > "$log.out" 2> "$log" &
  WPID=$!
}

# ---- a final save that fails: the ps are shut down all the same ------------
cluster full 1 --max-checkpoint-bytes 16
worker full 0 "$dir/full.w0" --model linreg --steps 200
wait "$WPID"; rc=$?
show="$dir/full.w0 $dir/full.ps.log"
check "full: the chief exits 1" rc_is "$rc" 1
check "full: the error names the failed save" has "$dir/full.w0" "ERROR worker/0: final save of model\.ckpt at global step 200: Save of $dir/full\.ck/model\.ckpt-200: .* more than --max-checkpoint-bytes 16"
check "full: the chief says it shuts the ps down all the same" has "$dir/full.w0" 'WARN worker/0: job failed \(the final save failed\): 1 of 1 ps task\(s\) shutting down all the same'
check "full: the ps got the Shutdown" has "$dir/full.ps.log" "Shutdown asked by a client: the chief's job failed"
check "full: the ps ends by itself" wait_gone "$PS_PID" 20
reap "$PS_PID"
check "full: the ps exits 0" rc_is "$rc" 0

# --keep-ps: the ps stays (a cluster shared by several jobs).
cluster keep 1 --max-checkpoint-bytes 16
worker keep 0 "$dir/keep.w0" --model linreg --steps 200 --keep-ps
wait "$WPID"; rc=$?
show="$dir/keep.w0 $dir/keep.ps.log"
check "keep: the chief exits 1" rc_is "$rc" 1
check "keep: the error names the failed save" has "$dir/keep.w0" 'final save of model\.ckpt at global step 200'
check "keep: no Shutdown" bash -c "! grep -q Shutdown '$dir/keep.ps.log'"
check "keep: the ps still runs" kill -0 "$PS_PID"
kill -TERM "$PS_PID"; reap "$PS_PID"

# ---- SIGTERM to the chief: no word of global_step standing still -----------
cluster sig 2
worker sig 0 "$dir/sig.w0" --model linreg --steps 1000000 --log-every 200
C=$WPID
worker sig 1 "$dir/sig.w1" --model linreg --steps 1000000 --log-every 200
W1=$WPID
show="$dir/sig.w0 $dir/sig.w1"
check "sig: worker/1 joined" wait_for "$dir/sig.w1" 'cluster ready \(joined\)'
check "sig: the chief trains" wait_for "$dir/sig.w0" 'INFO worker/0: step [0-9]+ loss'
kill -TERM "$C"
check "sig: the chief ends" wait_gone "$C" 60
reap "$C"
check "sig: the chief says why it does not wait" has "$dir/sig.w0" 'WARN worker/0: stopped by a signal while 1 of 1 other worker\(s\) had not reported done: going on without them'
check "sig: no 'global_step has not moved' after SIGTERM" bash -c "! grep -q 'has not moved' '$dir/sig.w0'"
check "sig: the final checkpoint is written" has "$dir/sig.w0.out" "^checkpoint $dir/sig\.ck/model\.ckpt-[0-9]+$"
kill -TERM "$W1" "$PS_PID"
for p in "$W1" "$PS_PID"; do wait_gone "$p" 30; reap "$p"; done

finish
