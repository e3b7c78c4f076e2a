#!/usr/bin/env bash
# deploy/slurm/paramserver.sbatch on a real local Slurm (slurm_local.sh:
# munged, slurmctld, slurmd for the virtual nodes n9, n10, n11, whose text
# order differs from Slurm's).  Runs as root, as CI does; without root or
# the Slurm packages it fails saying so (deploy/setup.sh installs them).
#  1. a job trains and ends COMPLETED with a checkpoint (the chief shuts the
#     ps down);
#  2. two jobs at once on the same nodes both complete (reserved ports);
#  3. scancel mid-training leaves a final checkpoint with the last step and
#     no process behind;
#  4. the job submitted again resumes from that checkpoint and completes;
#  5. (with 1, at the same time) SECURE_DIR: a job with TLS, client
#     certificates and tokens (deploy/gen-certs.sh --hosts n9,n10,n11)
#     completes with its checkpoint, the chief with the admin identity and
#     the other worker with the worker one; and a job whose server.crt does
#     not name its nodes fails before starting anything, saying so;
#  6. the test's Slurm has its own munged (private socket, AuthInfo=socket=)
#     and stopping it leaves a munged on /run/munge running: a stand-in
#     the test starts there inside a private mount namespace (the machine's
#     /run untouched), or without unshare the machine's own;
#  7. a job with --time=1 gets SIGTERM from its script 15 s before the
#     limit, writes a final checkpoint and ends FAILED with exit code 143
#     (stopped before --steps), where a finished job ends COMPLETED 0; the
#     same when squeue fails inside the job (scontrol show job instead),
#     and a warning when scontrol fails too;
#  8. (with 3) scancel --signal=TERM: a final checkpoint, FAILED 143, and
#     a job chained to it with --dependency=afternotok runs then and
#     resumes from that checkpoint;
#  9. a heterogeneous job (#SBATCH hetjob: the ps on one node, the workers
#     on two) runs one step across its components (srun A : B) to
#     COMPLETED, each rank on the host Slurm gave it (the components'
#     nodes as the job logged them from SLURM_JOB_NODELIST_HET_GROUP_<k>).
# 10. (with 1, at the same time) a non-chief worker killed -9 mid-training
#     does not end the job: its rank logs it and exits 0, the chief trains
#     on alone to --steps, and the job ends COMPLETED 0 with the final
#     checkpoint at --steps; in a --sync job (its replicas would wait for
#     it) the same ends the step, FAILED, saying why.
# 11. slurm_local.sh's hosts-file line: 8 runs marking and unmarking at
#     once (on a copy of /etc/hosts) keep each other's line.
# 12. slurm_local.sh given a taken port for slurmctld (one the test holds)
#     starts the daemons again on fresh ports, saying so.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PS_WORKER=${PS_WORKER:?}
# 6. needs a munged on the default socket, which slurm_local.sh must
# neither use nor stop.  The test runs in a private mount namespace
# (unshare -m) whose /run is an overlay with an empty tmpfs on /run/munge,
# and starts a stand-in there: the machine's /run (and a munged it runs) is
# never touched, yet slurm_local.sh (in the namespace too) sees the
# stand-in where it would see the machine's munged.  Without unshare, the
# machine's own munged is the one to leave alone.
if [ -z "${PS_SLURM_TEST_NS:-}" ] && [ "$(id -u)" = 0 ] && command -v munged > /dev/null \
  && unshare -m --propagation private true 2> /dev/null; then
  PS_SLURM_TEST_NS=1 exec unshare -m --propagation private bash "$0" "$@"
fi
source "$(dirname "$0")/../support/lib.sh"
test_init slurm
here=$(cd "$(dirname "$0")" && pwd)
sbatch_file="$here/../../deploy/slurm/paramserver.sbatch"
if [ "$(id -u)" != 0 ] || ! command -v slurmctld > /dev/null || ! command -v munged > /dev/null; then
  bad "local Slurm" "needs root and slurm-wlm + munge (deploy/setup.sh installs them)"
  finish
fi
# 6. in the private namespace a stand-in munged the test starts on
# /run/munge/munge.socket.2 (else the machine's own) is still alive after
# the test's Slurm stopped: slurm_local.sh runs its own munged on a private
# socket and stops only it
sys_sock=/run/munge/munge.socket.2 sys_pid="" stand_in="" ovl=""
if [ -n "${PS_SLURM_TEST_NS:-}" ]; then
  ovl=$dir/run-overlay
  mkdir -p "$ovl" && mount -t tmpfs -o mode=0700 tmpfs "$ovl" && mkdir "$ovl/u" "$ovl/w" \
    && mount -t overlay overlay -o "lowerdir=/run,upperdir=$ovl/u,workdir=$ovl/w" /run \
    && mkdir -p -m 0755 /run/munge && mount -t tmpfs -o mode=0755 tmpfs /run/munge \
    && mkdir -m 0700 "$dir/sysmunge" && head -c 1024 /dev/urandom > "$dir/sysmunge/key" \
    && chmod 0600 "$dir/sysmunge/key" \
    && munged -S "$sys_sock" --key-file="$dir/sysmunge/key" --pid-file=/run/munge/munged.pid \
      --log-file="$dir/sysmunge/log" --seed-file="$dir/sysmunge/seed" \
    && sys_pid=$(cat /run/munge/munged.pid) && stand_in=$sys_pid \
    || bad "a stand-in munged on $sys_sock in a private mount namespace" "$(cat "$dir/sysmunge/log" 2> /dev/null)"
elif munge -n > /dev/null 2>&1; then
  # the machine's: its pid from the pid file, or from the socket's owner
  sys_pid=$(cat /run/munge/munged.pid 2> /dev/null)
  [ -n "$sys_pid" ] && [ -d "/proc/$sys_pid" ] \
    || sys_pid=$(ss -Hxlp 2> /dev/null | grep -F " $sys_sock " | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1)
else
  bad "a munged on $sys_sock to leave alone" "no private mount namespace (unshare -m) for a stand-in, and the machine runs none"
fi
test_cleanup_hook() {
  bash "$here/slurm_local.sh" stop "$dir/slurm" > /dev/null 2>&1
  if [ -n "$stand_in" ]; then
    kill "$stand_in" 2> /dev/null
    for ((i = 0; i < 50; i++)); do kill -0 "$stand_in" 2> /dev/null || break; sleep 0.1; done
  fi
  # (the namespace's mounts: /run's overlay, then its tmpfs under $dir)
  if [ -n "$ovl" ]; then
    umount /run/munge 2> /dev/null; umount /run 2> /dev/null; umount "$ovl" 2> /dev/null
  fi
}
# 11. slurm_local.sh's /etc/hosts line: runs that mark and unmark at once
# (each under the lock) never lose another's line.  On a copy of the file:
# 8 runs, each marking and unmarking its line 25 times and then marking it
# for good, beside a line marked before that nobody removes
hosts_of() { # N: the hosts-file line marking run N
  grep -c -F -- "# paramserver tests/slurm $dir/hostsrun$1" "$dir/hosts"
}
cp /etc/hosts "$dir/hosts"
hbase0=$(wc -l < "$dir/hosts")
hmark() { PS_TEST_HOSTS_FILE=$dir/hosts PS_TEST_HOSTS_LOCK=$dir/hosts.lock bash "$here/slurm_local.sh" "$1" "$dir/hostsrun$2"; }
hmark mark keep
hpids=()
for r in 1 2 3 4 5 6 7 8; do
  (for ((i = 0; i < 25; i++)); do hmark mark "$r"; hmark unmark "$r"; done; hmark mark "$r") &
  hpids+=($!)
done
for p in "${hpids[@]}"; do wait "$p"; done
hlines=$(for r in keep 1 2 3 4 5 6 7 8; do echo -n "$(hosts_of "$r")"; done)
hbase=$(grep -cvF -- "# paramserver tests/slurm $dir/hostsrun" "$dir/hosts")
check "hosts file: 8 runs marking and unmarking at once keep each other's line and the rest (lines $hlines, want 111111111; $hbase of $hbase0 others)" \
  test "$hlines" = 111111111 -a "$hbase" = "$hbase0"

chmod 0711 "$dir" # munged: every directory above its socket searchable
# 12. (with the start) a port picked for slurmctld that is taken before it
# binds it: slurm_local.sh starts the daemons again on fresh ports
hold_port || bad "a port held for slurmctld's first attempt" "python3 could not bind one"
PS_TEST_CTLD_PORT=$HELD_PORT bash "$here/slurm_local.sh" start "$dir/slurm" > "$dir/slurm-start.log" 2>&1 \
  || { bad "local Slurm starts" "$(cat "$dir/slurm-start.log") $(tail -5 "$dir"/slurm/*.log)"; finish; }
check "local Slurm: slurmctld's port taken: started again on fresh ports" \
  grep -q "^slurm_local.sh: a port picked for slurmctld or a slurmd was taken before it bound it (Address already in use): starting again on fresh ports (attempt 2 of 3;" "$dir/slurm-start.log"
export SLURM_CONF=$dir/slurm/slurm.conf
export PS_SERVER PS_WORKER
# (a heterogeneous job has a record per component: the leader's, the first)
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -1; }
secure="" # SECURE_DIR of the jobs submit makes
sbopt="" # more sbatch options of the jobs submit makes (words)
submit() { # NAME CKPT WORKER_ARGS...: prints the job id
  local name=$1 ck=$2
  shift 2
  mkdir -p "$ck"
  # shellcheck disable=SC2086
  SECURE_DIR="$secure" CKPT_DIR="$ck" WORKER_ARGS="$*" sbatch --parsable -N 2 --ntasks-per-node=2 \
    $sbopt -o "$dir/$name.out" "$sbatch_file"
}
exit_code() { scontrol show job "$1" 2>/dev/null | sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' | head -1; }
ended() { # JOBID: it has ended (COMPLETED, FAILED, CANCELLED, ...)
  case $(job_state "$1") in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) ;;
    *) return 1 ;;
  esac
}
W=(--model linreg --log-every 50)
# the secure jobs' certificates: server.crt for every node; bad/ for n9 only
certs=$dir/certs
"$here/../../deploy/gen-certs.sh" --tokens --hosts n9,n10,n11 "$certs" 2> "$dir/certs.log" \
  && "$here/../../deploy/gen-certs.sh" --tokens --hosts n9 "$dir/bad" 2>> "$dir/certs.log" \
  || bad "gen-certs.sh" "$(cat "$dir/certs.log")"

# 7. (started first, checked last) a job with a 1-minute limit
tid=$(sbopt=--time=1 submit timelimit "$dir/ck7" "${W[@]}" --steps 100000000 --save-every-secs 1000)
# 7b. the same where squeue fails inside the job (a squeue on its PATH that
# exits 1): the script says so and takes the limit from scontrol show job
mkdir -p "$dir/nosqueue" && printf '#!/bin/sh\necho "squeue: error: (test) no answer" >&2\nexit 1\n' \
  > "$dir/nosqueue/squeue" && chmod +x "$dir/nosqueue/squeue"
qid=$(PATH="$dir/nosqueue:$PATH" sbopt=--time=1 submit nosqueue "$dir/ck7b" "${W[@]}" --steps 100000000 --save-every-secs 1000)
# 7c. neither squeue nor scontrol answering: the script warns that no stop
# will come before the limit (a short job, which completes)
mkdir -p "$dir/noslurm" && cp "$dir/nosqueue/squeue" "$dir/noslurm/squeue" \
  && cp "$dir/nosqueue/squeue" "$dir/noslurm/scontrol"
nid=$(PATH="$dir/noslurm:$PATH" sbopt=--time=1 submit noslurm "$dir/ck7c" "${W[@]}" --steps 300)
# 9. (started now, checked later) a heterogeneous job: component 0 the 2 ps
# on one node, component 1 the 2 workers on two, one step across both
# (srun A : B); Slurm gives it SLURM_DISTRIBUTION=cyclic and tasks per
# node 2,1(x2), which is not how it lays the ranks out. --sync, so every
# global step waits for both workers: asynchronous, the chief can reach
# step 300 before worker/1 has connected, and worker/1 trains nothing.
cat > "$dir/het.sbatch" <<HET
#!/bin/bash
#SBATCH -N1 -n2 -o $dir/het.out
#SBATCH hetjob
#SBATCH -N2 -n2
export PS_SLURM_JOBS=ps:2,worker:2
echo "het group 0: \$(scontrol show hostnames "\$SLURM_JOB_NODELIST_HET_GROUP_0" | paste -sd,)" >&2
echo "het group 1: \$(scontrol show hostnames "\$SLURM_JOB_NODELIST_HET_GROUP_1" | paste -sd,)" >&2
srun --kill-on-bad-exit=1 bash -c 'echo "rank \$SLURM_PROCID on \$SLURMD_NODENAME" >&2
    exec "\$PS_SERVER" --checkpoint-dir "$dir/ck9" --grace-secs 5' \\
  : bash -c 'echo "rank \$SLURM_PROCID on \$SLURMD_NODENAME" >&2
    exec "\$PS_WORKER" ${W[*]} --sync --steps 300 --checkpoint-dir "$dir/ck9"'
HET
mkdir -p "$dir/ck9"
hid=$(sbatch --parsable "$dir/het.sbatch")
hid=${hid%%+*}
# 1. one job, start to end; 5. at the same time, the secure jobs
id=$(submit one "$dir/ck1" "${W[@]}" --steps 300)
sid=$(secure=$certs submit secure "$dir/ck5" "${W[@]}" --steps 300)
bid=$(secure=$dir/bad submit badcert "$dir/ck5b" "${W[@]}" --steps 300)
# 10. a job whose worker/1 (rank 3) is killed -9 once it trains, and a
# --sync one
kid=$(submit killw "$dir/ck10" "${W[@]}" --steps 10000 --save-every-secs 1000)
yid=$(submit killsync "$dir/ck10s" "${W[@]}" --sync --steps 100000000 --save-every-secs 1000)
source "$here/slurm_jobs.sh" # rank_pid
# kill_worker1 NAME CKPT [hold]: kills -9 the ps-worker of rank 3 once it
# trains. With "hold", the chief (rank 2) is stopped from its "cluster
# ready" until then: asynchronous, it could otherwise reach --steps before
# the kill (a --sync job cannot, and cannot train without its chief)
kill_worker1() {
  local c="" w rc=1
  if [ "${3:-}" = hold ]; then
    wait_for "$dir/$1.out" "worker/0: .*cluster ready" 120 || return 1
    c=$(rank_pid ps-worker "$2" 2) || return 1
    kill -STOP "$c"
  fi
  wait_for "$dir/$1.out" "worker/1: .*step [0-9]+ loss" 120 && w=$(rank_pid ps-worker "$2" 3) \
    && kill -KILL "$w" && rc=0
  [ -z "$c" ] || kill -CONT "$c"
  return $rc
}
check "killed worker: worker/1's ps-worker found and killed -9 while training" \
  kill_worker1 killw "$dir/ck10" hold
check "killed worker, --sync: worker/1's ps-worker found and killed -9 while training" \
  kill_worker1 killsync "$dir/ck10s"
# (a worker that never trained may stay up to 60 s after the chief: srun --wait)
for ((i = 0; i < 3000; i++)); do
  ended "$id" && ended "$sid" && ended "$bid" && ended "$kid" && ended "$yid" && break
  sleep 0.1
done
s=$(job_state "$id")
check "one job ends COMPLETED (${s:-none})" test "$s" = COMPLETED
e=$(exit_code "$id")
check "one job: exit code 0 (ExitCode=${e:-none})" test "$e" = 0:0
last_step() { sed -n 's/.*global step \([0-9]*\)$/\1/p' "$1" | tail -1; }
step=$(last_step "$dir/one.out")
check "one job: a checkpoint at the last step ($step)" test -n "$step" -a -f "$dir/ck1/model.ckpt-$step.index"
check "one job: the chief shut the ps down" grep -q "job done: 2 of 2 ps task(s) shutting down" "$dir/one.out"
check "one job: ranks on their hosts (ps/0 on n9)" grep -q "ps/0: .*serving on n9:" "$dir/one.out"

# 10. the job with worker/1 killed
s=$(job_state "$kid"); e=$(exit_code "$kid"); step=$(last_step "$dir/killw.out")
show=$dir/killw.out
check "killed worker: the job goes on and ends COMPLETED 0 ($s, ExitCode=${e:-none})" \
  test "$s" = COMPLETED -a "$e" = 0:0
check "killed worker: its rank says so and the step goes on" \
  grep -q "^paramserver.sbatch: rank 3 (worker/1) on n1[01]: ps-worker killed by signal 9 (KILL); asynchronous training goes on without it" "$dir/killw.out"
check "killed worker: the chief trained on alone to a final checkpoint at --steps ($step)" \
  test "$step" = 10000 -a -f "$dir/ck10/model.ckpt-10000.index"
check "killed worker: the chief's end-of-job wait went on without it" \
  grep -q "worker/0: .*: going on without them (worker/1)" "$dir/killw.out"
s=$(job_state "$yid")
show=$dir/killsync.out
check "killed worker, --sync: the step ends, FAILED ($s)" test "$s" = FAILED
check "killed worker, --sync: its rank says why" \
  grep -q "^paramserver.sbatch: rank 3 (worker/1) on n1[01]: ps-worker killed by signal 9 (KILL); a --sync job cannot go on without it (its replicas wait for every worker): ending the step$" "$dir/killsync.out"
show=""

# 5. SECURE_DIR
out=$dir/secure.out
s=$(job_state "$sid"); step=$(last_step "$out")
show=$out
check "secure job ends COMPLETED (${s:-none})" test "$s" = COMPLETED
check "secure job: a checkpoint at the last step ($step)" test -n "$step" -a -f "$dir/ck5/model.ckpt-$step.index"
check "secure job: both ps served TLS with client certificates and the tokens (2, 1 admin)" \
  test "$(grep -c "ps/[01]: serving on n[0-9]*:[0-9]* .*; TLS with client certificates, 2 token(s), 1 admin)" "$out")" = 2
check "secure job: the chief (rank 2) with the admin identity" \
  grep -q "^rank 2 (worker/0): client-admin.crt, admin.token$" "$out"
check "secure job: the other worker (rank 3) with the worker one" \
  grep -q "^rank 3 (worker/1): client-worker.crt, worker.token$" "$out"
check "secure job: the chief (admin token) shut the ps down" grep -q "job done: 2 of 2 ps task(s) shutting down" "$out"
check "secure job: no call refused" \
  test -z "$(grep -E "UNAUTHENTICATED|PERMISSION_DENIED|refused [0-9]+ call|needs an admin token|bearer token" "$out")"
s=$(job_state "$bid")
show=$dir/badcert.out
check "secure job, server.crt for n9 only: FAILED (${s:-none})" test "$s" = FAILED
check "secure job, server.crt for n9 only: says so, before starting a task" \
  test "$(grep -c "server.crt does not name node n1[01]," "$dir/badcert.out")" = 1 \
  -a -z "$(grep -E "ready on|serving on|^rank " "$dir/badcert.out")"
show=""

# 9. the heterogeneous job
for ((i = 0; i < 1200; i++)); do ended "$hid" && break; sleep 0.1; done
s=$(job_state "$hid"); e=$(exit_code "$hid"); step=$(last_step "$dir/het.out")
show=$dir/het.out
check "hetjob, srun A : B: COMPLETED 0 ($s, ExitCode=${e:-none})" test "$s" = COMPLETED -a "$e" = 0:0
# where Slurm put the components (logged by the job): the 2 ps on group
# 0's node, the workers on group 1's two nodes in Slurm's order
g0=$(sed -n 's/^het group 0: //p' "$dir/het.out"); g1=$(sed -n 's/^het group 1: //p' "$dir/het.out")
want="rank 0 on $g0 rank 1 on $g0 rank 2 on ${g1%%,*} rank 3 on ${g1#*,} "
check "hetjob: the job logged its components' nodes (group 0: $g0; group 1: $g1)" \
  test -n "$g0" -a "${g0/,/}" = "$g0" -a "${g1//[!,]/}" = ,
check "hetjob: the ranks ran where Slurm put them ($want)" \
  test "$(grep -o "^rank [0-9] on n[0-9]*" "$dir/het.out" | sort | tr '\n' ' ')" = "$want"
check "hetjob: both ps served on $g0" \
  test "$(grep -c "ps/[01]: .*serving on $g0:" "$dir/het.out")" = 2
check "hetjob: both workers trained, the chief to a checkpoint at the last step ($step)" \
  test -n "$step" -a -f "$dir/ck9/model.ckpt-$step.index" \
  -a -n "$(grep "worker/1: .*step [0-9]* loss" "$dir/het.out")"
show=""

# 2. two jobs at once on the same nodes
a=$(submit two-a "$dir/ck2a" "${W[@]}" --steps 2000)
b=$(submit two-b "$dir/ck2b" "${W[@]}" --steps 2000)
together=no
for ((i = 0; i < 3000; i++)); do
  sa=$(job_state "$a"); sb=$(job_state "$b")
  [ "$sa$sb" = RUNNINGRUNNING ] && together=yes
  case "$sa$sb" in *PENDING* | *RUNNING* | *CONFIGURING* | *COMPLETING*) sleep 0.1 ;; *) break ;; esac
done
check "two jobs: they ran at the same time" test "$together" = yes
check "two jobs at once both end COMPLETED ($sa $sb)" test "$sa$sb" = COMPLETEDCOMPLETED
sa=$(last_step "$dir/two-a.out"); sb=$(last_step "$dir/two-b.out")
check "two jobs: each wrote its checkpoint ($sa $sb)" test -f "$dir/ck2a/model.ckpt-$sa.index" -a -f "$dir/ck2b/model.ckpt-$sb.index"

# 3. scancel mid-training; 8. at the same time, scancel --signal=TERM
id=$(submit cancel "$dir/ck3" "${W[@]}" --steps 100000000 --save-every-secs 1000)
gid=$(submit sigterm "$dir/ck8" "${W[@]}" --steps 100000000 --save-every-secs 1000)
if wait_for "$dir/sigterm.out" "step [0-9]+ loss" 120; then
  scancel --signal=TERM "$gid"
else
  bad "scancel --signal=TERM: the job never trained" "$(tail -5 "$dir/sigterm.out")"
fi
if wait_for "$dir/cancel.out" "step [0-9]+ loss" 120; then
  scancel "$id"
  for ((i = 0; i < 1200; i++)); do
    s=$(job_state "$id"); [ -n "$s" ] && [ "$s" != RUNNING ] && [ "$s" != COMPLETING ] && break
    sleep 0.1
  done
  step=$(last_step "$dir/cancel.out")
  check "scancel: the job ends (${s:-none})" test "$s" = CANCELLED
  check "scancel: a final checkpoint at the last step ($step)" test -n "$step" -a -f "$dir/ck3/model.ckpt-$step.index"
  sleep 0.5
  left=$(pgrep -f -- "$dir/ck3" | tr '\n' ' ')
  check "scancel: no process left behind ($left)" test -z "$left"
  # 4. resubmitted, it resumes where the cancelled one stopped
  if [ -n "$step" ]; then
    id=$(submit again "$dir/ck3" "${W[@]}" --steps $((step + 200)))
    for ((i = 0; i < 3000; i++)); do
      s=$(job_state "$id"); [ "$s" = COMPLETED ] || [ "$s" = FAILED ] || [ "$s" = CANCELLED ] && break
      sleep 0.1
    done
    check "resubmitted: ends COMPLETED (${s:-none})" test "$s" = COMPLETED
    check "resubmitted: resumed at step $step" grep -q "cluster ready (restored) at global step $step;" "$dir/again.out"
    s2=$(last_step "$dir/again.out")
    check "resubmitted: trained on to $s2 and saved it" test -n "$s2" -a "${s2:-0}" -ge $((step + 200)) -a -f "$dir/ck3/model.ckpt-${s2:-x}.index"
  fi
else
  bad "scancel: the job never trained" "$(tail -5 "$dir/cancel.out")"
fi

# 7. the time limit: SIGTERM 15 s before it, a final checkpoint, FAILED 143
for ((i = 0; i < 1200; i++)); do ended "$tid" && break; sleep 0.1; done
s=$(job_state "$tid"); e=$(exit_code "$tid"); step=$(last_step "$dir/timelimit.out")
show=$dir/timelimit.out
check "time limit 1 min: the script stopped the tasks before it" \
  grep -q "s before the time limit: SIGTERM to the tasks (STOP_SECS=15)" "$dir/timelimit.out"
check "time limit 1 min: FAILED with exit code 143, not COMPLETED ($s, ExitCode=${e:-none})" \
  test "$s" = FAILED -a "$e" = 143:0
check "time limit 1 min: the chief says why it exits 143" \
  grep -q "worker/0: .*exit 143: stopped by signal 15 at global step [0-9]* of 100000000" "$dir/timelimit.out"
check "time limit 1 min: a final checkpoint at the last step ($step)" \
  test -n "$step" -a -f "$dir/ck7/model.ckpt-$step.index"
show=""

# 7b. squeue failing inside the job: the same, from scontrol show job
for ((i = 0; i < 1200; i++)); do ended "$qid" && break; sleep 0.1; done
s=$(job_state "$qid"); e=$(exit_code "$qid"); step=$(last_step "$dir/nosqueue.out")
show=$dir/nosqueue.out
check "time limit, squeue failing: the script says so" \
  grep -q "^paramserver.sbatch: warning: squeue did not answer; the time limit (60) and the time left come from scontrol show job$" "$dir/nosqueue.out"
check "time limit, squeue failing: the script still stopped the tasks before it" \
  grep -q "s before the time limit: SIGTERM to the tasks (STOP_SECS=15)" "$dir/nosqueue.out"
check "time limit, squeue failing: FAILED 143, not TIMEOUT ($s, ExitCode=${e:-none})" \
  test "$s" = FAILED -a "$e" = 143:0
check "time limit, squeue failing: a final checkpoint at the last step ($step)" \
  test -n "$step" -a -f "$dir/ck7b/model.ckpt-$step.index"
show=""

# 7c. neither squeue nor scontrol answering: a warning
for ((i = 0; i < 1200; i++)); do ended "$nid" && break; sleep 0.1; done
show=$dir/noslurm.out
check "time limit, neither squeue nor scontrol answering: the script warns" \
  grep -q "^paramserver.sbatch: warning: neither squeue nor scontrol show job gave job $nid's time limit: no SIGTERM STOP_SECS before it, so at the limit Slurm stops the tasks (SIGKILL KillWait seconds after its SIGTERM) and the final checkpoint may be cut short$" "$dir/noslurm.out"
check "time limit, neither squeue nor scontrol answering: the job still runs (COMPLETED)" \
  test "$(job_state "$nid")" = COMPLETED
show=""

# 8. scancel --signal=TERM: the same final checkpoint, FAILED 143
for ((i = 0; i < 1200; i++)); do ended "$gid" && break; sleep 0.1; done
s=$(job_state "$gid"); e=$(exit_code "$gid"); step=$(last_step "$dir/sigterm.out")
show=$dir/sigterm.out
check "scancel --signal=TERM: FAILED with exit code 143 ($s, ExitCode=${e:-none})" \
  test "$s" = FAILED -a "$e" = 143:0
check "scancel --signal=TERM: a final checkpoint at the last step ($step)" \
  test -n "$step" -a -f "$dir/ck8/model.ckpt-$step.index"
# ... and the next part, chained to run only if it did not complete. It is
# submitted once that job has ended, so that its --steps lies past the last
# step (asynchronous training goes on while the TERM travels); Slurm keeps
# the record (MinJobAge) and judges afternotok on it at once.
cid=$(sbopt=--dependency=afternotok:$gid submit chained "$dir/ck8" "${W[@]}" --steps $((${step:-0} + 2000)))
for ((i = 0; i < 1200; i++)); do ended "$cid" && break; sleep 0.1; done
s=$(job_state "$cid"); s2=$(last_step "$dir/chained.out")
show=$dir/chained.out
check "sbatch --dependency=afternotok: the next part ran after it, COMPLETED (${s:-none})" \
  test "$s" = COMPLETED
resumed() { grep -q "cluster ready (restored) at global step $step;" "$dir/chained.out" \
  && [ -n "$s2" ] && [ "$s2" -gt "${step:-0}" ]; }
check "sbatch --dependency=afternotok: it resumed at step $step and trained on to $s2" resumed
show=""

# 6. stopping the test's Slurm leaves the machine's munged alone
ours=$(awk '{print $1}' "$dir/slurm/pids" 2> /dev/null | tr '\n' ' ')
bash "$here/slurm_local.sh" stop "$dir/slurm" > "$dir/slurm-stop.log" 2>&1
left=""
for p in $ours; do [ -d "/proc/$p" ] && [ -s "/proc/$p/cmdline" ] && left="$left $p"; done
check "stop: the test's munged, slurmctld and slurmd are gone ($ours;$left)" \
  test -n "$ours" -a -z "$left"
check "stop: the test's munged had its own socket (slurm.conf AuthInfo)" \
  grep -q "^AuthInfo=socket=$dir/slurm/munge/munge.socket$" "$dir/slurm/slurm.conf"
# (the machine's munged may have no pid file: then its socket answering)
sys_alive() { { [ -z "$sys_pid" ] || [ -d "/proc/$sys_pid" ]; } && munge -n -S "$sys_sock" > /dev/null; }
check "stop: the munged on $sys_sock (pid ${sys_pid:-unknown}${stand_in:+, a stand-in}) is still alive" sys_alive
finish
