#!/usr/bin/env bash
# The chief's end of a job, through real ps-server and ps-worker processes
# on 127.0.0.1 with ports the kernel picks (no ps-launch: it would stop the
# ps itself when the chief exits, hiding what the chief leaves running):
#  - a final save that fails still shuts the ps down (unless --keep-ps),
#    and the chief exits 1 naming the save;
#  - SIGTERM to the chief does not log that global_step stood still;
#  - a restarted chief does not wait for a worker that joined and died,
#    yet waits for one that has not joined;
#  - a job resubmitted with its checkpoint at --steps ends at once, every
#    worker with 0 (worker/1 waited for ever for ps the chief had shut
#    down); a worker waiting for readiness whose ps all go away ends with
#    an error naming them (or 0 when the checkpoint holds --steps).
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

# ---- a chief that fails before its end: a --restore path that does not ----
# exist fails every restart the same way, so the ps are shut down (the
# allocation ends); one that cannot reach the ps in time leaves them be
# (a restarted chief finds them live).
cluster nope 1
worker nope 0 "$dir/nope.w0" --model linreg --steps 200 --restore "$dir/nope/none.ckpt"
wait "$WPID"; rc=$?
show="$dir/nope.w0 $dir/nope.ps.log"
check "nope: the chief exits 1" rc_is "$rc" 1
check "nope: the error names the checkpoint" has "$dir/nope.w0" "ERROR worker/0: .*$dir/nope/none\.ckpt"
check "nope: the chief shuts the ps down" has "$dir/nope.w0" 'WARN worker/0: job failed \(the set-up failed \([A-Z_]+\), a restart would fail again\): 1 of 1 ps task\(s\) shutting down all the same'
check "nope: the ps got the Shutdown" has "$dir/nope.ps.log" "Shutdown asked by a client: the chief's job failed"
check "nope: the ps ends by itself" wait_gone "$PS_PID" 20
reap "$PS_PID"
check "nope: the ps exits 0" rc_is "$rc" 0

# --keep-ps: the ps stays.
cluster nopek 1
worker nopek 0 "$dir/nopek.w0" --model linreg --steps 200 --restore "$dir/nope/none.ckpt" --keep-ps
wait "$WPID"; rc=$?
show="$dir/nopek.w0 $dir/nopek.ps.log"
check "nopek: the chief exits 1" rc_is "$rc" 1
check "nopek: no Shutdown" bash -c "! grep -q Shutdown '$dir/nopek.ps.log'"
check "nopek: the ps still runs" kill -0 "$PS_PID"
kill -TERM "$PS_PID"; reap "$PS_PID"

# A ps that does not answer within --ps-timeout (stopped): a transient
# failure, the chief says it leaves the ps running and sends no Shutdown.
cluster slow 1
kill -STOP "$PS_PID"
t=$SECONDS
worker slow 0 "$dir/slow.w0" --model linreg --steps 200 --ps-timeout 2
wait "$WPID"; rc=$?
took=$((SECONDS - t))
kill -CONT "$PS_PID"
show="$dir/slow.w0 $dir/slow.ps.log"
check "slow: the chief exits 1" rc_is "$rc" 1
# (a probe of the stopped ps may not outlast --ps-timeout: it took
# --rpc-timeout's 60 s and exit 69 before)
check "slow: --ps-timeout 2 holds ($took s)" test "$took" -lt 15
check "slow: the error names the ps and the timeout" has "$dir/slow.w0" \
  'ps/0 \(127\.0\.0\.1:[0-9]+\) and 0 other ps task\(s\) did not answer within 2 s: it accepts connections but does not answer \(stopped or hung\)'
check "slow: it leaves the ps running" has "$dir/slow.w0" 'WARN worker/0: the ps are left running: a restarted chief may get past this set-up failure \((DEADLINE_EXCEEDED|UNAVAILABLE)\)'
check "slow: no Shutdown" bash -c "! grep -q Shutdown '$dir/slow.ps.log'"
check "slow: the ps still runs" kill -0 "$PS_PID"
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

# --keep-ps: no wait for a worker that has not joined (the ps stay for it).
cluster kj 2
worker kj 0 "$dir/kj.w0" --model linreg --steps 200 --keep-ps
reap_wait() { wait_gone "$1" "$2" && reap "$1"; }
show="$dir/kj.w0"
check "kj: the chief ends at once" reap_wait "$WPID" 60
check "kj: exit 0" rc_is "$rc" 0
check "kj: it names the worker that did not join" has "$dir/kj.w0" 'WARN worker/0: 1 worker\(s\) did not join within 0 s: going on without them \(worker/1\)$'
check "kj: the ps still runs" kill -0 "$PS_PID"
kill -TERM "$PS_PID"; wait_gone "$PS_PID" 30; reap "$PS_PID"

# ---- a restarted chief, a worker that joined and died ------------------------
# The chief is killed with -9 and restarted (a live cluster), then worker/1
# is killed with -9 while it trains: the chief ends within seconds of its
# last step (no heartbeat for 10 s: gone), not after a 60 s wait for a
# worker "that has not joined yet".
cluster rs 2
worker rs 0 "$dir/rs.w0a" --model linreg --steps 12000 --log-every 500
C=$WPID
worker rs 1 "$dir/rs.w1" --model linreg --steps 12000 --log-every 500
W1=$WPID
show="$dir/rs.w0a $dir/rs.w0b $dir/rs.w1"
check "rs: worker/1 joined" wait_for "$dir/rs.w1" 'cluster ready \(joined\)'
# worker/1 is stopped (SIGSTOP) before the chief dies, so it cannot reach
# --steps alone and report done while the chief restarts; its heartbeat
# stands still from then on, as a dead worker's does
kill -STOP "$W1"
kill -KILL "$C"; reap "$C"
worker rs 0 "$dir/rs.w0b" --model linreg --steps 12000 --log-every 500
C=$WPID
check "rs: the restarted chief found the live cluster" wait_for "$dir/rs.w0b" 'cluster ready \(live\)'
check "rs: worker/1 is alive and not done" bash -c "kill -0 $W1 && ! grep -q 'local steps in' '$dir/rs.w1'"
kill -KILL "$W1"; reap "$W1"
check "rs: the chief ends its training" wait_for "$dir/rs.w0b" 'INFO worker/0: trained [0-9]+ local steps' 120
t=$SECONDS
check "rs: the chief ends promptly" wait_gone "$C" 30
check "rs: within 25 s of its last step (10 s without a heartbeat; was 63 s)" test $((SECONDS - t)) -lt 25
reap "$C"
check "rs: the chief exits 0" rc_is "$rc" 0
check "rs: worker/1 is named as gone by its heartbeat" has "$dir/rs.w0b" 'WARN worker/0: 1 worker\(s\) joined and then stopped \(no heartbeat for 10 s\): going on without them \(worker/1\)$'
check "rs: not by global_step standing still" bash -c "! grep -q 'has not moved' '$dir/rs.w0b'"
check "rs: no wait for a worker that has not joined" bash -c "! grep -q 'have not joined yet' '$dir/rs.w0b'"
check "rs: final checkpoint" has "$dir/rs.w0b.out" "^checkpoint $dir/rs\.ck/model\.ckpt-[0-9]+$"
check "rs: the ps shut down" wait_gone "$PS_PID" 20
reap "$PS_PID"

# The same with a worker/2 that has not joined: the restarted chief waits
# for it (but not for the dead worker/1) and ends soon after it joins.
cluster nj 3
worker nj 0 "$dir/nj.w0a" --model linreg --steps 12000 --log-every 500
C=$WPID
worker nj 1 "$dir/nj.w1" --model linreg --steps 12000 --log-every 500
W1=$WPID
show="$dir/nj.w0a $dir/nj.w0b $dir/nj.w1 $dir/nj.w2"
check "nj: worker/1 joined" wait_for "$dir/nj.w1" 'cluster ready \(joined\)'
kill -STOP "$W1" # (as in rs)
kill -KILL "$C"; reap "$C"
worker nj 0 "$dir/nj.w0b" --model linreg --steps 12000 --log-every 500
C=$WPID
check "nj: the restarted chief found the live cluster" wait_for "$dir/nj.w0b" 'cluster ready \(live\)'
kill -KILL "$W1"; reap "$W1"
check "nj: the chief waits for worker/2 only" wait_for "$dir/nj.w0b" 'INFO worker/0: waiting up to 60 s for 1 worker\(s\) that have not joined yet: worker/2$' 120
check "nj: still waiting" kill -0 "$C"
worker nj 2 "$dir/nj.w2" --model linreg --steps 12000 --log-every 500
W2=$WPID
check "nj: worker/2 joins" wait_for "$dir/nj.w2" 'cluster ready \(joined\)'
t=$SECONDS
check "nj: the chief ends once worker/2 is done" wait_gone "$C" 20
check "nj: within 15 s of worker/2's joining" test $((SECONDS - t)) -lt 15
reap "$C"
check "nj: the chief exits 0" rc_is "$rc" 0
check "nj: worker/1 is named as gone" has "$dir/nj.w0b" 'WARN worker/0: 1 worker\(s\) joined and then stopped \(no heartbeat for 10 s\): going on without them \(worker/1\)$'
check "nj: worker/2 exits 0" bash -c "wait_gone() { for i in \$(seq 400); do kill -0 $W2 2>/dev/null || return 0; sleep 0.05; done; return 1; }; wait_gone"
reap "$W2"
check "nj: worker/2's status" rc_is "$rc" 0
check "nj: the ps shut down" wait_gone "$PS_PID" 20
reap "$PS_PID"

# ---- a job resubmitted once it is done (its checkpoint at --steps) ----------
# Two workers, as on Slurm: the chief restores step 200 and trains no step;
# worker/1, waiting for readiness, must not be left waiting for ps the
# chief has shut down (it waited for ever).  Both exit 0 within seconds,
# whether worker/1 starts with the chief or after the chief is ready.
cluster fin 1
worker fin 0 "$dir/fin.first" --model linreg --steps 200
show="$dir/fin.first $dir/fin.ps.log"
check "fin: the first job ends" reap_wait "$WPID" 60
check "fin: the first job exits 0 with its checkpoint at 200" \
  test "$rc" = 0 -a -f "$dir/fin.ck/model.ckpt-200.index"
wait_gone "$PS_PID" 20; reap "$PS_PID"
for late in no yes; do
  cluster fin 2 # a new ps, the same checkpoint directory
  worker fin 0 "$dir/fin.w0.$late" --model linreg --steps 200
  C=$WPID
  [ "$late" = no ] || wait_for "$dir/fin.w0.$late" 'cluster ready \(restored\)'
  worker fin 1 "$dir/fin.w1.$late" --model linreg --steps 200
  W1=$WPID
  show="$dir/fin.w0.$late $dir/fin.w1.$late $dir/fin.ps.log"
  t=$SECONDS
  check "fin (worker/1 late: $late): the chief ends" reap_wait "$C" 30
  crc=$rc
  check "fin (worker/1 late: $late): worker/1 ends (it waited for ever)" reap_wait "$W1" 30
  check "fin (worker/1 late: $late): both within 15 s" test $((SECONDS - t)) -lt 15
  check "fin (worker/1 late: $late): the chief exits 0 ($crc)" rc_is "$crc" 0
  check "fin (worker/1 late: $late): worker/1 exits 0 ($rc)" rc_is "$rc" 0
  check "fin (worker/1 late: $late): the chief restored step 200" \
    has "$dir/fin.w0.$late" 'INFO worker/0: cluster ready \(restored\) at global step 200;'
  check "fin (worker/1 late: $late): worker/1 found the job done" \
    has "$dir/fin.w1.$late" 'INFO worker/1: cluster ready \(joined\) at global step 200; training to step 200$'
  check "fin (worker/1 late: $late): the ps shut down" wait_gone "$PS_PID" 20
  reap "$PS_PID"
done

# A worker waiting for readiness whose ps go away without a chief's word
# (no done mark; the checkpoint short of --steps: the job failed) ends
# with an error naming them, instead of waiting for ever; with the
# checkpoint at --steps the job is done and it exits 0.
for want in 250 200; do
  cluster gone 2 # (no chief ever comes)
  cp "$dir"/fin.ck/model.ckpt-200.* "$dir"/fin.ck/checkpoint "$dir/gone.ck/" 2> /dev/null
  worker gone 1 "$dir/gone.w1.$want" --model linreg --steps "$want"
  W1=$WPID
  show="$dir/gone.w1.$want"
  check "gone (--steps $want): worker/1 waits for the chief" \
    wait_for "$dir/gone.w1.$want" 'waiting for the chief: the chief has not marked'
  kill -TERM "$PS_PID"; wait_gone "$PS_PID" 20; reap "$PS_PID"
  t=$SECONDS
  check "gone (--steps $want): worker/1 ends" reap_wait "$W1" 40
  check "gone (--steps $want): within 30 s of the ps' end ($((SECONDS - t)) s)" \
    test $((SECONDS - t)) -lt 30
  if [ "$want" = 250 ]; then
    check "gone (--steps 250): exit 1 ($rc)" rc_is "$rc" 1
    check "gone (--steps 250): the error names the ps and the wait" has "$dir/gone.w1.$want" \
      "ERROR worker/1: every ps task stopped answering while this worker waited for the chief to mark the cluster ready \(ps/0 \(127\.0\.0\.1:[0-9]+\) for 10 s: .*\): the chief shut the cluster down before this worker joined, or the job failed$"
  else
    check "gone (--steps 200): exit 0 ($rc)" rc_is "$rc" 0
    check "gone (--steps 200): it says the checkpoint holds --steps" has "$dir/gone.w1.$want" \
      "INFO worker/1: the ps went away \(every ps task stopped answering .*\), and the latest checkpoint $dir/gone\.ck/model\.ckpt-200 holds global step 200 of --steps 200: the job is done$"
  fi
done

# ---- a worker that finished before ps/0 restarted empty --------------------
# The chief saw worker/1 done while it trained; ps/0 then restarts empty
# (its heartbeats are lost) and the chief restores from its checkpoint:
# at its end worker/1 is still done, not a worker "that has not joined yet"
# waited for 60 s.  The chief is held with SIGSTOP while ps/0 restarts.
cluster pr 2
worker pr 0 "$dir/pr.w0" --model linreg --steps 20000 --log-every 1000 --save-every-steps 100
C=$WPID
worker pr 1 "$dir/pr.w1" --model linreg --steps 300 --log-every 100
W1=$WPID
show="$dir/pr.w0 $dir/pr.w1 $dir/pr.ps.log $dir/pr.ps2.log"
check "pr: worker/1 ends" wait_gone "$W1" 60
reap "$W1"
check "pr: worker/1 exits 0" rc_is "$rc" 0
check "pr: the chief saw worker/1 done" wait_for "$dir/pr.w0" 'INFO worker/0: worker/1 reported done$'
kill -STOP "$C"
kill -KILL "$PS_PID"; reap "$PS_PID"
start_ps "$dir/pr.json" 0 "$dir/pr.ps2.log" --checkpoint-dir "$dir/pr.ck"
PS_PID=$PID
kill -CONT "$C"
check "pr: the chief restores ps/0" wait_for "$dir/pr.w0" 'recovered \(restored\)' 60
check "pr: the chief ends" wait_gone "$C" 50
reap "$C"
check "pr: the chief exits 0" rc_is "$rc" 0
check "pr: no wait for worker/1 as not joined" bash -c "! grep -q 'have not joined yet' '$dir/pr.w0'"
check "pr: the ps shut down" wait_gone "$PS_PID" 20
reap "$PS_PID"


# ---- ps/0 in trouble during the chief's wait: no worker judged gone -------
# worker/1 trains on (its --steps is far off) while the chief, done, waits
# for it; ps/0 is then killed, so every heartbeat read fails.  The chief
# says so and keeps counting worker/1 as live past the 10 s timeout (it
# logs "waiting for 1 more worker(s)" every 5 s), instead of judging it
# gone and shutting the ps down under a training worker.
cluster p0 2
worker p0 0 "$dir/p0.w0" --model linreg --steps 200
C=$WPID
worker p0 1 "$dir/p0.w1" --model linreg --steps 100000000 --log-every 100000
W1=$WPID
show="$dir/p0.w0 $dir/p0.w1"
busy='INFO worker/0: waiting for 1 more worker\(s\) to finish their last step: worker/1$'
check "p0: the chief waits for the live worker/1" wait_for "$dir/p0.w0" "$busy" 60
kill -KILL "$PS_PID"; reap "$PS_PID"
n0=$(grep -cE "$busy" "$dir/p0.w0")
check "p0: the failing reads are named" wait_for "$dir/p0.w0" 'WARN worker/0: reading the heartbeats on ps/0 failed \(.*\): no worker is judged gone while they cannot be read$' 30
check "p0: worker/1 still counted live 15 s on" wait_count "$dir/p0.w0" "$busy" $((n0 + 3)) 60
check "p0: worker/1 not judged gone" bash -c "! grep -q 'joined and then stopped' '$dir/p0.w0'"
kill -TERM "$C" "$W1"
for p in "$C" "$W1"; do wait_gone "$p" 60; reap "$p"; done

finish
