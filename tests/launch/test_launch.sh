#!/usr/bin/env bash
# ps-launch tests: real ps-server, psctl and worker processes on 127.0.0.1
# with ports the kernel picks.  Each case checks the exit status, the
# prefixed output, the launcher's messages, and that no process of the run
# is left behind.  Waits poll for a file or a line with a deadline; there
# are no bare sleeps.  Prints "N passed, N failed".
set -uo pipefail
PS_LAUNCH=${PS_LAUNCH:?}; PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}
PS_WORKER=${PS_WORKER:?}
export PSCTL
source "$(dirname "$0")/../support/lib.sh"
test_init launch-test
# ps-launch puts its temporary spec under TMPDIR, so every process of a run
# (ps-server, the worker script) names $dir on its command line.
export TMPDIR=$dir
export PS_TEST_DIR=$dir
bg=()

# Processes of this run still alive: anything naming $dir, and the sleeps
# the worker script recorded.  A zombie is dead (orphans wait for pid 1 to
# reap them).
alive() {
  local st
  st=$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
leftovers() {
  local p out=""
  for p in $(pgrep -f -- "$dir"); do alive "$p" && out+=" $p"; done
  if [ -f "$dir/kids" ]; then
    for p in $(cat "$dir/kids"); do
      if alive "$p" && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = sleep ]; then
        out+=" $p"
      fi
    done
  fi
  echo "$out"
}
# ps-launch's children are not ours: the cleanup kills what is left of them
test_cleanup_hook() {
  for p in $(leftovers); do kill -KILL "$p" 2>/dev/null; done
}
has() { grep -qE -- "$2" "$1"; }
contains() { [[ "$(cat "$1"; echo .)" == *"$2"* ]]; }
rc_is() { [ "$1" = "$2" ]; }
no_leftovers() { local l; l=$(leftovers); [ -z "$l" ] || { echo "left running:$l"; return 1; }; }
launched_pid() { grep -oE "started $2 \(pid [0-9]+\)" "$1" | tail -1 | grep -oE '[0-9]+\)' | tr -d ')'; }
# Foreground runs have a deadline; background ones are signalled directly
# (their pid must be ps-launch's own) and killed by cleanup if need be.
L() { timeout -k 10 180 "$PS_LAUNCH" "$@"; }

# The worker command: worker.sh MODE TAG, then ps-launch appends
# --cluster FILE --job JOB --task I.
cat > "$dir/worker.sh" <<'EOF'
mode=$1 tag=$2; shift 2
while [ $# -gt 0 ]; do
  case $1 in
    --cluster) cluster=$2; shift 2 ;;
    --job) job=$2; shift 2 ;;
    --task) task=$2; shift 2 ;;
    --sync) shift ;;  # a synchronous job's flag (ps-launch does not look at it)
    *) echo "unexpected argument $1" >&2; exit 64 ;;
  esac
done
d=$PS_TEST_DIR
# waitfile FILE: up to 60 s
waitfile() { i=0; while [ ! -e "$1" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done; [ -e "$1" ]; }
case $mode in
  status)  # chief: waits until worker/1 is gone, asks psctl, exits 3
    if [ "$task" = 0 ]; then
      waitfile "$d/$tag.w1" || exit 70
      w1=$(cat "$d/$tag.w1"); i=0
      while kill -0 "$w1" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
      "$PSCTL" --cluster "$cluster" status
      echo "chief stderr line" >&2
      exit 3
    fi
    echo "hello from $job/$task"; echo; echo "after an empty line"
    printf 'partial tail'
    echo $$ > "$d/$tag.w$task.tmp" && mv "$d/$tag.w$task.tmp" "$d/$tag.w$task"
    exit 0 ;;
  ident)  # every task says who it is; the chief checks the spec and waits
    echo "I am $job/$task"
    touch "$d/$tag.$job.$task"
    if [ "$job" = chief ]; then
      waitfile "$d/$tag.worker.0" && waitfile "$d/$tag.worker.1" || exit 70
      "$PSCTL" --cluster "$cluster" status || exit 71
    fi
    exit 0 ;;
  fail)  # worker/2 fails once the others run; the chief exits 4 once it
         # is gone (asynchronous: the job goes on); worker/1 sleeps
    if [ "$task" = 2 ]; then
      waitfile "$d/$tag.started.0" && waitfile "$d/$tag.started.1"
      echo $$ > "$d/$tag.w2.tmp" && mv "$d/$tag.w2.tmp" "$d/$tag.w2"
      echo "worker 2 giving up" >&2
      exit 5
    fi
    touch "$d/$tag.started.$task"
    if [ "$task" = 0 ]; then
      waitfile "$d/$tag.w2" || exit 70
      w2=$(cat "$d/$tag.w2"); i=0
      while kill -0 "$w2" 2>/dev/null && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
      # until ps-launch has dealt with worker/2 (or stopped this one)
      i=0
      while ! grep -q 'launch: worker/2 failed' "$d/$tag.err" && [ $i -lt 600 ]; do
        sleep 0.1; i=$((i + 1))
      done
      echo "chief done"
      exit 4
    fi
    sleep 300 & echo $! >> "$d/kids"
    wait ;;
  flaky)  # worker/1 fails on its first run only; the chief waits for its
          # second run to end, then exits 0
    if [ "$task" = 1 ]; then
      if [ ! -e "$d/$tag.w1.first" ]; then
        touch "$d/$tag.w1.first"
        echo "worker 1 run 1 failing" >&2
        exit 6
      fi
      echo "worker 1 run 2"
      touch "$d/$tag.w1.second"
      exit 0
    fi
    waitfile "$d/$tag.w1.second" || exit 70
    i=0
    while ! grep -q 'launch: worker/1 exited with status 0' "$d/$tag.err" && [ $i -lt 600 ]; do
      sleep 0.1; i=$((i + 1))
    done
    exit 0 ;;
  sleep)  # runs until stopped; records its spec
    sleep 300 & echo $! >> "$d/kids"
    echo "$cluster" > "$d/$tag.cluster.$task"
    wait ;;
esac
EOF

# ---- usage, bad specs ------------------------------------------------------
expect "--help" 0 "usage: ps-launch --cluster FILE" "$PS_LAUNCH" --help
expect "--help documents --restart" 0 "--max-restarts K" "$PS_LAUNCH" --help
expect "--version" 0 "ps-launch 0." "$PS_LAUNCH" --version
expect "unknown flag" 2 "usage:" "$PS_LAUNCH" --frobnicate
expect "neither --cluster nor --ps" 2 "give either --cluster FILE or --ps N" "$PS_LAUNCH"
expect "both --cluster and --ps" 2 "give either --cluster FILE or --ps N" \
  "$PS_LAUNCH" --cluster x.json --ps 1
expect "bad --ps" 2 "--ps must be an integer" "$PS_LAUNCH" --ps two
expect "--workers 0 with a command" 2 "--workers 0 leaves no task to run true" \
  "$PS_LAUNCH" --ps 1 --workers 0 -- true
expect "missing spec file" 2 "cluster spec $dir/none.json: cannot open" \
  "$PS_LAUNCH" --cluster "$dir/none.json"
echo '{"ps": ["127.0.0.1:0",]' > "$dir/badjson.json"
expect "invalid JSON spec" 2 "$dir/badjson.json: invalid JSON" \
  "$PS_LAUNCH" --cluster "$dir/badjson.json" -- true
echo '{"worker": ["127.0.0.1:0"]}' > "$dir/nops.json"
expect "spec without ps job" 2 "cluster spec $dir/nops.json: no \"ps\" job" \
  "$PS_LAUNCH" --cluster "$dir/nops.json" -- true
echo '{"ps": ["127.0.0.1:0"]}' > "$dir/psonly.json"
expect "command but no worker job" 2 "$dir/psonly.json: no \"worker\" or \"chief\" job" \
  "$PS_LAUNCH" --cluster "$dir/psonly.json" -- true
expect "--ps-server not executable" 2 "--ps-server $dir/nope: not an executable file" \
  "$PS_LAUNCH" --ps 1 --ps-server "$dir/nope"

# ---- (a) --ps 2 --workers 2: prefixes, the chief's status, nothing left --------
L --ps 2 --workers 2 -- sh "$dir/worker.sh" status a > "$dir/a.out" 2> "$dir/a.err"
rc=$?
show="$dir/a.out $dir/a.err"
check "a: exit status is the chief's (3)" rc_is "$rc" 3
check "a: ps readiness lines prefixed ps/1" has "$dir/a.out" '^ps/1: ps/1 ready on 127\.0\.0\.1:[1-9][0-9]*$'
check "a: chief's psctl output prefixed worker/0" has "$dir/a.out" '^worker/0: ps/1 127\.0\.0\.1:[1-9][0-9]* up vars=0'
check "a: worker/1 stdout prefixed" has "$dir/a.out" '^worker/1: hello from worker/1$'
check "a: empty lines kept" contains "$dir/a.out" $'worker/1: hello from worker/1\nworker/1: \nworker/1: after an empty line\n'
check "a: partial last line flushed at EOF" has "$dir/a.out" '^worker/1: partial tail$'
check "a: chief stderr goes to stderr, prefixed" has "$dir/a.err" '^worker/0: chief stderr line$'
check "a: ps logs prefixed on stderr" has "$dir/a.err" '^ps/0: .* INFO ps/0: serving on'
check "a: launcher logs as launch" has "$dir/a.err" '^[0-9-]+ [0-9:.]+ INFO launch: cluster ready: 2 ps tasks'
check "a: worker/1 exiting 0 is fine" has "$dir/a.err" 'INFO launch: worker/1 (stopped \()?exited with status 0\)?$'
check "a: chief exit reported" has "$dir/a.err" 'chief worker/0 exited with status 3: stopping the other tasks'
check "a: ps tasks stopped cleanly" has "$dir/a.err" 'launch: ps/1 stopped \(exited with status 0\)'
check "a: temporary spec removed" bash -c "! ls -d '$dir'/ps-launch-* 2>/dev/null"
check "a: no process left" no_leftovers

# ---- --cluster FILE with a chief job; default ps-server lookup vs --ps-server --
cat > "$dir/f.json" <<'EOF'
{"ps": ["127.0.0.1:0"], "chief": ["127.0.0.1:0"], "worker": ["127.0.0.1:0", "127.0.0.1:0"]}
EOF
L --cluster "$dir/f.json" --ps-server "$PS_SERVER" --write-cluster "$dir/f-eff.json" \
  -- sh "$dir/worker.sh" ident f > "$dir/f.out" 2> "$dir/f.err"
rc=$?
show="$dir/f.out $dir/f.err"
check "cluster: chief/0 exits 0 -> 0" rc_is "$rc" 0
check "cluster: chief job task runs" has "$dir/f.out" '^chief/0: I am chief/0$'
check "cluster: worker tasks run" has "$dir/f.out" '^worker/1: I am worker/1$'
check "cluster: chief is chief/0" has "$dir/f.err" 'chief chief/0 exited with status 0'
check "cluster: chief saw the real ps port" has "$dir/f.out" '^chief/0: ps/0 127\.0\.0\.1:[1-9][0-9]* up'
check "cluster: --write-cluster has the real port" has "$dir/f-eff.json" '"127\.0\.0\.1:[1-9][0-9]*"'
check "cluster: --ps-server used" has "$dir/f.err" "started ps/0 \(pid [0-9]+\): $PS_SERVER --cluster $dir/f.json --job ps --task 0$"
check "cluster: no process left" no_leftovers

# ---- chief killed by a signal; worker command that does not exist ------------
L --ps 1 --workers 1 -- sh -c 'kill -KILL $$' > "$dir/k.out" 2> "$dir/k.err"
rc=$?
show="$dir/k.err"
check "chief killed by SIGKILL -> 137" rc_is "$rc" 137
check "chief signal reported" has "$dir/k.err" 'chief worker/0 killed by signal 9'
L --ps 1 --workers 1 -- "$dir/no-such-cmd" > "$dir/n.out" 2> "$dir/n.err"
rc=$?
show="$dir/n.err"
check "missing worker command -> 1" rc_is "$rc" 1
check "missing worker command named" has "$dir/n.err" "cannot start worker/0: $dir/no-such-cmd: no such file or directory"
check "missing worker command: no process left" no_leftovers

# ---- --ps-arg reaches ps-server; a ps failing before ready --------------------
L --ps 1 --ps-arg "--checkpoint-dir=$dir/nodir" -- true > "$dir/g.out" 2> "$dir/g.err"
rc=$?
show="$dir/g.err"
check "ps failing at start -> 1" rc_is "$rc" 1
check "--ps-arg passed to ps-server" has "$dir/g.err" "^ps/0: .*--checkpoint-dir $dir/nodir"
check "failed ps named with its status" has "$dir/g.err" 'launch: ps/0 failed: exited with status 2: stopping every task'
check "ps failing at start: no process left" no_leftovers

# --restart before the cluster is ready: bounded, then a failure.
L --ps 1 --restart --max-restarts 2 --ps-arg "--checkpoint-dir=$dir/nodir" -- true \
  > "$dir/g2.out" 2> "$dir/g2.err"
rc=$?
show="$dir/g2.err"
check "restarts exhausted -> 1" rc_is "$rc" 1
check "second restart logged" has "$dir/g2.err" 'launch: ps/0 exited with status 2: restarting it in 1\.0 s \(restart 2 of 2\)'
check "then no restarts left" has "$dir/g2.err" 'launch: ps/0 failed: exited with status 2 \(no restarts left\)'
check "restarts exhausted: no process left" no_leftovers

# A ps that never says it is ready (a stand-in given with --ps-server).
printf '#!/bin/sh\necho "not ready yet"\necho $$ >> "$PS_TEST_DIR/kids"\nexec sleep 300\n' > "$dir/mute-ps"
chmod +x "$dir/mute-ps"
L --ps 1 --ps-server "$dir/mute-ps" --ready-timeout 1 -- true > "$dir/t.out" 2> "$dir/t.err"
rc=$?
show="$dir/t.out $dir/t.err"
check "ready timeout -> 1" rc_is "$rc" 1
check "ready timeout names the task" has "$dir/t.err" 'launch: ps/0 is not ready after 1 s'
check "--ps-server stand-in ran" has "$dir/t.out" '^ps/0: not ready yet$'
check "ready timeout: no process left" no_leftovers

# ---- (b) a non-chief worker fails: asynchronous training goes on ------------
L --ps 1 --workers 3 --grace-secs 30 -- sh "$dir/worker.sh" fail b > "$dir/b.out" 2> "$dir/b.err"
rc=$?
show="$dir/b.out $dir/b.err"
check "b: exit status is the chief's (4), not 1" rc_is "$rc" 4
check "b: failing task named with its status, job goes on" has "$dir/b.err" 'WARN launch: worker/2 failed: exited with status 5 \(--restart-workers restarts it\): training goes on without it \(--sync-workers stops the job instead\)$'
check "b: its stderr came through" has "$dir/b.err" '^worker/2: worker 2 giving up$'
check "b: nothing stopped for it" bash -c "! grep -q 'stopping every task' '$dir/b.err'"
check "b: the chief finished its work" has "$dir/b.out" '^worker/0: chief done$'
check "b: the chief's exit ends the job" has "$dir/b.err" 'chief worker/0 exited with status 4: stopping the other tasks'
check "b: worker/1 ran until the chief ended" has "$dir/b.err" 'launch: worker/1 stopped \(killed by signal 15'
check "b: no process left (sleeps included)" no_leftovers

# The same with --sync-workers (every step waits for every worker): the
# job stops (exit 1, naming why).
start=$SECONDS
L --ps 1 --workers 3 --grace-secs 30 --sync-workers -- sh "$dir/worker.sh" fail bs --sync > "$dir/bs.out" 2> "$dir/bs.err"
rc=$?
show="$dir/bs.out $dir/bs.err"
check "bs: a failing worker under --sync-workers -> 1" rc_is "$rc" 1
check "bs: failing task named, and why the job stops" has "$dir/bs.err" 'ERROR launch: worker/2 failed: exited with status 5 \(--restart-workers restarts it\): a --sync-workers job cannot go on without it \(every step waits for every worker\): stopping every task$'
check "bs: chief terminated" has "$dir/bs.err" 'launch: worker/0 stopped \(killed by signal 15'
check "bs: stopped without waiting for SIGKILL" test $((SECONDS - start)) -lt 30
check "bs: no process left (sleeps included)" no_leftovers

# ps-launch does not guess from the worker command: --sync there (a
# wrapper could hide it, and --replicas-to-aggregate below the worker
# count does not wait for every worker) leaves the job going.
L --ps 1 --workers 3 --grace-secs 30 -- sh "$dir/worker.sh" fail bn --sync > "$dir/bn.out" 2> "$dir/bn.err"
rc=$?
show="$dir/bn.out $dir/bn.err"
check "bn: --sync in the command alone: the chief's status (4)" rc_is "$rc" 4
check "bn: the job goes on" has "$dir/bn.err" 'WARN launch: worker/2 failed: exited with status 5 \(--restart-workers restarts it\): training goes on without it \(--sync-workers stops the job instead\)$'
check "bn: no process left" no_leftovers

# --restart-workers: worker/1 fails once, is restarted and ends well; the
# --sync-workers job is not stopped for it either.
L --ps 1 --workers 2 --restart-workers --sync-workers -- sh "$dir/worker.sh" flaky r --sync > "$dir/r.out" 2> "$dir/r.err"
rc=$?
show="$dir/r.out $dir/r.err"
check "r: the chief's status (0)" rc_is "$rc" 0
check "r: worker/1's failure logged with its restart" has "$dir/r.err" 'WARN launch: worker/1 exited with status 6: restarting it in 0\.5 s \(restart 1 of 3\)$'
check "r: worker/1 started again" test "$(grep -c 'started worker/1 (pid' "$dir/r.err")" = 2
check "r: its second run ran" has "$dir/r.out" '^worker/1: worker 1 run 2$'
check "r: nothing stopped for it" bash -c "! grep -q 'stopping every task' '$dir/r.err'"
check "r: no process left" no_leftovers
# A worker whose restart cannot start (its command is gone): the job goes on.
cat > "$dir/selfdel.sh" <<'EOF2'
for a; do case $a in --task) next=1 ;; *) [ -n "${next:-}" ] && task=$a; next= ;; esac; done
# worker/1 deletes the script only once the chief runs it (the chief
# touches sd.chief first): a chief not started yet would find it gone
if [ "$task" = 1 ]; then
  i=0
  while [ ! -e "$PS_TEST_DIR/sd.chief" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
  rm -f "$0"; exit 3
fi
touch "$PS_TEST_DIR/sd.chief"
i=0
while ! grep -q 'launch: worker/1 could not be restarted' "$PS_TEST_DIR/sd.err" && [ $i -lt 600 ]; do
  sleep 0.1; i=$((i + 1))
done
exit 0
EOF2
chmod +x "$dir/selfdel.sh"
L --ps 1 --workers 2 --restart-workers -- "$dir/selfdel.sh" > "$dir/sd.out" 2> "$dir/sd.err"
rc=$?
show="$dir/sd.out $dir/sd.err"
check "sd: the chief's status (0)" rc_is "$rc" 0
check "sd: worker/1 deleted the script after the chief started" test -e "$dir/sd.chief"
check "sd: the restart's failure named" has "$dir/sd.err" "cannot start worker/1: $dir/selfdel.sh: no such file or directory"
check "sd: the job goes on" has "$dir/sd.err" 'WARN launch: worker/1 could not be restarted: training goes on without it$'
check "sd: no process left" no_leftovers
expect "--help documents --restart-workers" 0 "--restart-workers     restart a non-chief worker" "$PS_LAUNCH" --help
expect "--help documents --sync-workers" 0 "--sync-workers        every step waits for every worker" "$PS_LAUNCH" --help
check "--help: no line of 'tasks run until' alone" bash -c '! "$0" --help | grep -qx "tasks run until"' "$PS_LAUNCH"


# ---- (j) with ps-worker: worker/1 killed with -9 while it trains ------------
# The job ends as if it had not been there: the chief finishes, sees
# worker/1's heartbeat stand still, saves, shuts the ps down and exits 0.
# With --restart-workers the killed worker comes back and joins the
# running job, a synchronous one (--sync, --sync-workers) too.  The chief
# is held with SIGSTOP from its first step until worker/1 has been killed
# (and, when restarted, has joined again), so that it cannot finish its
# steps first however the machine schedules them.
for mode in plain restart sync; do
  ck="$dir/j-$mode.ck"; mkdir -p "$ck"
  extra=(); wextra=()
  [ $mode != plain ] && extra=(--restart-workers)
  [ $mode = sync ] && wextra=(--sync) && extra+=(--sync-workers)
  "$PS_LAUNCH" --ps 2 --workers 2 --restart "${extra[@]}" --ps-arg "--checkpoint-dir=$ck" \
    -- "$PS_WORKER" --model linreg --steps 6000 --log-every 500 --checkpoint-dir "$ck" "${wextra[@]}" \
    > "$dir/j-$mode.out" 2> "$dir/j-$mode.err" &
  lp=$!; bg+=("$lp")
  show="$dir/j-$mode.out $dir/j-$mode.err"
  check "j-$mode: the chief is ready" wait_for "$dir/j-$mode.err" '^worker/0: .* cluster ready \((initialized|restored)\)'
  cp=$(launched_pid "$dir/j-$mode.err" worker/0)
  kill -STOP "$cp"
  check "j-$mode: worker/1 joined" wait_for "$dir/j-$mode.err" '^worker/1: .* cluster ready \(joined\)'
  kill -KILL "$(launched_pid "$dir/j-$mode.err" worker/1)"
  [ $mode != plain ] && check "j-$mode: worker/1 back" wait_count "$dir/j-$mode.err" '^worker/1: .* cluster ready \(joined\)' 2 60
  [ $mode = plain ] && check "j-$mode: worker/1's death seen" wait_for "$dir/j-$mode.err" 'launch: worker/1 failed'
  kill -CONT "$cp"
  wait "$lp"; rc=$?
  check "j-$mode: exit status is the chief's (0)" rc_is "$rc" 0
  if [ $mode = plain ]; then
    check "j-$mode: worker/1's death logged, training goes on" has "$dir/j-$mode.err" 'WARN launch: worker/1 failed: killed by signal 9 \(Killed\) \(--restart-workers restarts it\): training goes on without it \(--sync-workers stops the job instead\)$'
    check "j-$mode: the chief went on without it" has "$dir/j-$mode.err" '^worker/0: .* 1 worker\(s\) joined and then stopped \(no heartbeat for 10 s\): going on without them \(worker/1\)$'
  else
    check "j-$mode: worker/1 restarted" has "$dir/j-$mode.err" 'WARN launch: worker/1 killed by signal 9 \(Killed\): restarting it in 0\.5 s \(restart 1 of 3\)$'
    check "j-$mode: the restarted worker/1 joined the running job" test "$(grep -cE '^worker/1: .* cluster ready \(joined\)' "$dir/j-$mode.err")" = 2
  fi
  check "j-$mode: it died before the chief ended" bash -c "grep -nE 'launch: worker/1 (failed|killed)' '$dir/j-$mode.err' | head -1 | cut -d: -f1 | { read a; b=\$(grep -n 'chief worker/0 exited' '$dir/j-$mode.err' | cut -d: -f1); [ \"\$a\" -lt \"\$b\" ]; }"
  check "j-$mode: nothing stopped for it" bash -c "! grep -q 'stopping every task' '$dir/j-$mode.err'"
  check "j-$mode: final checkpoint" has "$dir/j-$mode.out" "^worker/0: checkpoint $ck/model\.ckpt-[0-9]+$"
  check "j-$mode: the chief shut the ps down" has "$dir/j-$mode.err" '^worker/0: .* job done: 2 of 2 ps task\(s\) shutting down'
  check "j-$mode: no process left" no_leftovers
done

# ---- (c) SIGINT to ps-launch -------------------------------------------------
"$PS_LAUNCH" --ps 2 --workers 2 -- sh "$dir/worker.sh" sleep c > "$dir/c.out" 2> "$dir/c.err" &
lp=$!; bg+=("$lp")
show="$dir/c.out $dir/c.err"
check "c: workers running" wait_for "$dir/c.err" 'started worker/1'
check "c: worker/1 has the spec" bash -c "for i in \$(seq 600); do [ -s '$dir/c.cluster.1' ] && exit 0; sleep 0.1; done; exit 1"
kill -INT "$lp"
wait "$lp"; rc=$?
check "c: SIGINT -> 130" rc_is "$rc" 130
check "c: SIGINT logged" has "$dir/c.err" 'launch: received SIGINT: stopping every task'
check "c: workers terminated" has "$dir/c.err" 'launch: worker/1 stopped \(killed by signal 15'
check "c: ps tasks exited 0" has "$dir/c.err" 'launch: ps/1 stopped \(exited with status 0\)'
check "c: no process left" no_leftovers

# ---- (d) --restart: a ps killed with SIGKILL comes back on its port ----------
"$PS_LAUNCH" --ps 2 --workers 1 --restart --write-cluster "$dir/d.json" \
  -- sh "$dir/worker.sh" sleep d > "$dir/d.out" 2> "$dir/d.err" &
lp=$!; bg+=("$lp")
show="$dir/d.out $dir/d.err"
check "d: cluster ready" wait_for "$dir/d.err" 'launch: cluster ready: 2 ps tasks, spec '"$dir/d.json"
check "d: worker started" wait_for "$dir/d.err" 'started worker/0'
a1=$(grep -oE '^ps/1: ps/1 ready on [0-9.:]+' "$dir/d.out" | head -1 | awk '{print $NF}')
"$PSCTL" --cluster "$dir/d.json" status > "$dir/d.st1" 2>&1
check "d: status before" has "$dir/d.st1" "^ps/1 $a1 up"
p1=$(launched_pid "$dir/d.err" ps/1)
kill -KILL "$p1"
check "d: restart logged" wait_for "$dir/d.err" "launch: ps/1 killed by signal 9 \(Killed\): restarting it on $a1 in 0\.5 s \(restart 1 of 3\)"
check "d: back on the same port" wait_for "$dir/d.err" "launch: ps/1 restarted \(restart 1\): ready again on $a1$"
up=0
for ((i = 0; i < 100; i++)); do
  if "$PSCTL" --cluster "$dir/d.json" --timeout-ms 2000 status > "$dir/d.st2" 2>&1; then up=1; break; fi
  sleep 0.1
done
check "d: psctl status succeeds again" rc_is "$up" 1
p1b=$(launched_pid "$dir/d.err" ps/1)
check "d: ps/1 is a new process on $a1" has "$dir/d.st2" "^ps/1 $a1 up .* pid=$p1b\$"
check "d: new pid differs" test "$p1" != "$p1b"
kill -TERM "$lp"
wait "$lp"; rc=$?
check "d: SIGTERM -> 143" rc_is "$rc" 143
check "d: no process left" no_leftovers

# --max-restarts: the second death is final.
"$PS_LAUNCH" --ps 1 --restart --max-restarts 1 > "$dir/m.out" 2> "$dir/m.err" &
lp=$!; bg+=("$lp")
show="$dir/m.out $dir/m.err"
check "m: cluster ready" wait_for "$dir/m.err" 'launch: cluster ready: 1 ps task'
kill -KILL "$(launched_pid "$dir/m.err" ps/0)"
check "m: restarted once" wait_for "$dir/m.err" 'launch: ps/0 restarted \(restart 1\)'
kill -KILL "$(launched_pid "$dir/m.err" ps/0)"
wait "$lp"; rc=$?
check "m: no restarts left -> 1" rc_is "$rc" 1
check "m: failure names the task" has "$dir/m.err" 'launch: ps/0 failed: killed by signal 9 \(Killed\) \(no restarts left\): stopping every task'
check "m: no process left" no_leftovers

# No worker command: the ps tasks run until a signal (here a hang-up).
"$PS_LAUNCH" --ps 1 > "$dir/h.out" 2> "$dir/h.err" &
lp=$!; bg+=("$lp")
show="$dir/h.out $dir/h.err"
check "h: ps runs without a worker command" wait_for "$dir/h.err" 'launch: no worker command: the ps tasks run until'
spec=$(grep -oE 'cluster ready: 1 ps task, spec .*' "$dir/h.err" | awk '{print $NF}')
"$PSCTL" --cluster "$spec" status > "$dir/h.st" 2>&1
check "h: the logged spec reaches the ps" has "$dir/h.st" '^ps/0 127\.0\.0\.1:[1-9][0-9]* up'
kill -HUP "$lp"
wait "$lp"; rc=$?
check "h: SIGHUP -> 129" rc_is "$rc" 129
check "h: ps stopped" has "$dir/h.err" 'launch: ps/0 stopped \(exited with status 0\)'
check "h: no process left" no_leftovers

finish
