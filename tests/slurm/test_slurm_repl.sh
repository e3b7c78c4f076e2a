#!/usr/bin/env bash
# deploy/slurm/paramserver.sbatch with REPLICAS=2 on a real local Slurm
# (slurm_local.sh: munged, slurmctld, slurmd for n9, n10, n11): 3 ps and
# 2 workers per job.  Root only, as deploy_slurm; without root, the Slurm
# and munge packages or etcd it skips (exit 77).  Four jobs at once:
#  1. "repl": the template starts etcd on the batch host; the job trains
#     to --steps and ends COMPLETED 0 with its checkpoint, every ps ran
#     with --replicas 2 (each logs the view), and after the job the etcd
#     the template started (its pid from its log) is gone and its data
#     directory under TMPDIR removed;
#  2. "kill": the same, and ps/1 (a primary: shard 1's) is killed -9 once
#     the chief trains.  Slurm does not restart one rank (deploy/DEPLOY.md
#     "Replicated ps shards"): its rank says so and ends 0, a backup takes
#     over its shard (failover logged), the shard it backed up runs on one
#     replica (a WARN), the chief's global step never goes back, and the
#     job ends COMPLETED 0 at --steps;
#  3. "ext": ETCD= an etcd the test started: the template starts none,
#     the ps use it (the view under /paramserver/REPL_JOB/ in it), and the
#     job ends COMPLETED 0;
#  4. "fail": a ps rank that fails at its start (exit 2) ends the step,
#     FAILED, saying so, instead of the job waiting for it until its time
#     limit (nobody takes over a task that never joined the view); the
#     template's etcd is stopped all the same.
# Every daemon (munged, slurmctld, slurmd, etcd) is stopped by pid in
# every outcome; the ps and workers are the jobs' (checked gone at the end).
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PS_WORKER=${PS_WORKER:?}
if [ "$(id -u)" != 0 ] || ! command -v slurmctld > /dev/null || ! command -v munged > /dev/null \
  || ! command -v etcd > /dev/null; then
  echo "SKIP: needs root, slurm-wlm + munge and etcd (deploy/setup.sh installs them)"
  exit 77
fi
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
test_init slurm-repl
here=$(cd "$(dirname "$0")" && pwd)
sbatch_file="$here/../../deploy/slurm/paramserver.sbatch"
test_cleanup_hook() {
  local j p
  # the jobs first (their ps and the template's etcd: its data under
  # $dir/tmp-NAME), then the daemons by the pids slurm_local.sh recorded
  if [ -n "${SLURM_CONF:-}" ] && [ -n "${jobs_started:-}" ]; then
    for j in $jobs_started; do scancel "$j" 2> /dev/null; done
    for ((i = 0; i < 100; i++)); do
      [ -z "$(pgrep -f -- "$dir/(ck|tmp)-")" ] && break
      sleep 0.1
    done
  fi
  bash "$here/slurm_local.sh" stop "$dir/slurm" > /dev/null 2>&1
  # (whatever of the jobs Slurm left, by pid: only ours name $dir)
  for p in $(pgrep -f -- "$dir/(ck|tmp)-"); do kill -KILL "$p" 2> /dev/null; done
}
jobs_started=""
chmod 0711 "$dir" # munged: every directory above its socket searchable
bash "$here/slurm_local.sh" start "$dir/slurm" > "$dir/slurm-start.log" 2>&1 \
  || { bad "local Slurm starts" "$(cat "$dir/slurm-start.log") $(tail -5 "$dir"/slurm/*.log)"; finish; }
export SLURM_CONF=$dir/slurm/slurm.conf
export PS_SERVER PS_WORKER
etcd_start ext || { bad "the external etcd starts"; finish; }

job_state() { scontrol show job "$1" 2> /dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p' | head -1; }
exit_code() { scontrol show job "$1" 2> /dev/null | sed -n 's/.* ExitCode=\([0-9:]*\).*/\1/p' | head -1; }
ended() {
  case $(job_state "$1") in
    COMPLETED | FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY) ;;
    *) return 1 ;;
  esac
}
# submit NAME [VAR=VALUE...] -- WORKER_ARGS...: a job of 3 ps and 2 workers
# on 2 nodes, the 3 ps (ranks 0-2) on the first: --resv-ports hands every
# node the same ports, and the test's nodes share one network; prints
# its id
submit() {
  local name=$1 env=()
  shift
  while [ "$1" != -- ]; do env+=("$1"); shift; done
  shift
  mkdir -p "$dir/ck-$name" "$dir/tmp-$name"
  env "${env[@]}" REPLICAS=2 NPS=3 TMPDIR="$dir/tmp-$name" CKPT_DIR="$dir/ck-$name" \
    WORKER_ARGS="$*" sbatch --parsable -N 2 -n 5 --ntasks-per-node=3 -o "$dir/$name.out" "$sbatch_file"
}
W=(--model linreg --log-every 50)
rid=$(submit repl -- "${W[@]}" --steps 400)
kid=$(submit kill -- --model linreg --log-every 200 --steps 10000 --save-every-secs 1000)
xid=$(submit ext ETCD="$ETCD_ENDPOINT" REPL_JOB="ext-$$" -- "${W[@]}" --steps 400)
# 4. a ps rank that fails at its start (exit 2: a stand-in for a bad flag
# or a taken port) ends the step instead of leaving the job waiting for it
mkdir -p "$dir/bin"
printf '#!/bin/sh
[ "$SLURM_PROCID" = 1 ] && { echo "ps-server: (test) a bad flag" >&2; exit 2; }
exec "%s" "$@"
' \
  "$PS_SERVER" > "$dir/bin/ps-server-fail1" && chmod +x "$dir/bin/ps-server-fail1"
fid=$(submit fail PS_SERVER="$dir/bin/ps-server-fail1" -- "${W[@]}" --steps 400)
jobs_started="$rid $kid $xid $fid"

# 2. ps/1 of "kill" (rank 1: its ps-server, found by the job's checkpoint
# directory on its command line and its rank in its environment) killed -9
# once the chief trains
source "$here/slurm_jobs.sh" # rank_pid
killed=""
if wait_for "$dir/kill.out" "worker/0: .*step [0-9]+ loss" 120 && killed=$(rank_pid ps-server "$dir/ck-kill" 1); then
  kill -KILL "$killed"
  kill_step=$(sed -n 's/.*worker\/0: .*step \([0-9]*\) loss.*/\1/p' "$dir/kill.out" | tail -1)
  ok "kill: ps/1's ps-server (pid $killed) killed -9 while the chief trains (at step $kill_step)"
else
  bad "kill: ps/1's ps-server found and killed -9 while the chief trains" "$(tail -20 "$dir/kill.out")"
fi

# (150 s at most from here: they take 15-60 s on 2 busy cores)
end=$((SECONDS + 150))
while [ "$SECONDS" -lt "$end" ]; do
  ended "$rid" && ended "$kid" && ended "$xid" && ended "$fid" && break
  sleep 0.2
done
# first_node JOBID: the job's first node, where its batch script and its
# ps (ranks 0-2) ran (Slurm's BatchHost)
first_node() { scontrol show job "$1" 2> /dev/null | tr ' ' '\n' | sed -n 's/^BatchHost=//p' | head -1; }
last_step() { sed -n 's/.*global step \([0-9]*\)$/\1/p' "$1" | tail -1; }

# 1. the template's own etcd
show=$dir/repl.out
s=$(job_state "$rid"); e=$(exit_code "$rid"); step=$(last_step "$dir/repl.out")
check "repl: COMPLETED 0 ($s, ExitCode=${e:-none})" test "$s" = COMPLETED -a "$e" = 0:0
check "repl: trained to --steps, a checkpoint at $step" \
  test "${step:-0}" -ge 400 -a -f "$dir/ck-repl/model.ckpt-$step.index"
first=$(first_node "$rid")
check "repl: the template started etcd on the batch host (${first:-none}, the first node)" \
  grep -qE "^paramserver.sbatch: started etcd \(pid [0-9]+\) on $first:[0-9]+ for 2 replicas per shard$" "$dir/repl.out"
epid=$(sed -n 's/^paramserver.sbatch: started etcd (pid \([0-9]*\)).*/\1/p' "$dir/repl.out")
check "repl: the 3 ps on the first node (${first:-none})" \
  test -n "$first" -a "$(grep -cE "ps/[012]: .*serving on $first:" "$dir/repl.out")" = 3
check "repl: every ps ran with --replicas 2 (its view logged)" \
  test "$(grep -oE "ps/[012]: .*view epoch" "$dir/repl.out" | grep -oE "^ps/[012]" | sort -u | wc -l)" = 3
check "repl: the template stopped its etcd (pid $epid) after the step" \
  grep -qx "paramserver.sbatch: etcd (pid $epid) stopped" "$dir/repl.out"
check "repl: etcd (pid $epid) is gone" test -n "$epid" -a ! -d "/proc/${epid:-x}"
check "repl: etcd's data removed" test -z "$(ls -A "$dir/tmp-repl")"

# 2. ps/1 killed
show=$dir/kill.out
s=$(job_state "$kid"); e=$(exit_code "$kid"); step=$(last_step "$dir/kill.out")
check "kill: the job goes on and ends COMPLETED 0 ($s, ExitCode=${e:-none})" \
  test "$s" = COMPLETED -a "$e" = 0:0
check "kill: trained to --steps, a checkpoint at $step" \
  test "${step:-0}" -ge 10000 -a -f "$dir/ck-kill/model.ckpt-$step.index"
check "kill: ps/1's rank says it died and ends 0 (Slurm does not restart it)" \
  grep -qx "paramserver.sbatch: rank 1 (ps/1) on $(first_node "$kid"): ps-server killed by signal 9 (KILL); its shards go on on their other replicas (Slurm does not restart one rank)" "$dir/kill.out"
check "kill: a backup took over ps/1's shard (failover logged)" \
  grep -qE "ps/[02]: .*view epoch [0-9]+: .*1=\[2\*\].*\(failover [0-9]+ ms after the failure was detected\)" "$dir/kill.out"
check "kill: shard 0 runs on one replica, a WARN" \
  grep -qE "WARN .*shard 0 runs on one replica \(ps/0\): one more failure loses it" "$dir/kill.out"
steps_ok() { # the chief's global step, as logged, never goes back
  sed -n 's/.*worker\/0: .*step \([0-9]*\) loss.*/\1/p' "$dir/kill.out" \
    | awk -v k="${kill_step:-0}" 'NR > 1 && $1 < p { bad = 1 } { p = $1 } $1 > k { after++ }
      END { exit (bad || after < 2) }'
}
check "kill: the chief's global step trained on after the kill and never went back" steps_ok
check "kill: the killed ps stayed down" test -n "$killed" -a ! -d "/proc/${killed:-x}"

# 3. an external etcd
show=$dir/ext.out
s=$(job_state "$xid"); e=$(exit_code "$xid"); step=$(last_step "$dir/ext.out")
check "ext: COMPLETED 0 ($s, ExitCode=${e:-none})" test "$s" = COMPLETED -a "$e" = 0:0
check "ext: trained to --steps, a checkpoint at $step" \
  test "${step:-0}" -ge 400 -a -f "$dir/ck-ext/model.ckpt-$step.index"
check "ext: the template started no etcd" bash -c "! grep -q 'started etcd' '$dir/ext.out'"
check "ext: every ps ran with --replicas 2 (its view logged)" \
  test "$(grep -oE "ps/[012]: .*view epoch" "$dir/ext.out" | grep -oE "^ps/[012]" | sort -u | wc -l)" = 3
# (etcdctl tried up to 5 times: on 2 busy cores one call can miss its
# deadline; its errors are shown when none finds the key)
ext_view() {
  local i keys
  for ((i = 0; i < 5; i++)); do
    keys=$(ETCDCTL_API=3 etcdctl --endpoints "$ETCD_ENDPOINT" --command-timeout 10s \
      get --prefix --keys-only "/paramserver/ext-$$/" 2>&1)
    grep -qx "/paramserver/ext-$$/view" <<< "$keys" && return 0
    sleep 0.5
  done
  echo "etcdctl: $keys"
  return 1
}
check "ext: the view is in the test's etcd under /paramserver/ext-$$/" ext_view

# 4. a ps that fails at its start
show=$dir/fail.out
s=$(job_state "$fid"); e=$(exit_code "$fid")
check "fail: ps/1 failing at its start ends the step, FAILED ($s, ExitCode=${e:-none})" \
  test "$s" = FAILED -a "$e" != 0:0
check "fail: its rank says why" \
  grep -qx "paramserver.sbatch: rank 1 (ps/1) on $(first_node "$fid"): ps-server exited with status 2; ending the step (a replicated ps that fails otherwise than killed or fenced is not taken over)" "$dir/fail.out"
epid=$(sed -n 's/^paramserver.sbatch: started etcd (pid \([0-9]*\)).*/\1/p' "$dir/fail.out")
check "fail: the template's etcd (pid $epid) stopped all the same, its data removed" \
  test -n "$epid" -a ! -d "/proc/${epid:-x}" -a -z "$(ls -A "$dir/tmp-fail")"
show=""

# every ps but the killed one ended 0, and no sanitizer report (build-asan)
clean() { # NAME N: N ranks ended otherwise (their lines shown if not)
  local f=$dir/$1.out
  [ "$(grep -c "^paramserver.sbatch: rank [0-9]* (" "$f")" = "$2" ] \
    && ! grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$f" && return 0
  grep -E "^paramserver.sbatch: rank [0-9]* \(|ERROR: (Address|Leak)Sanitizer|runtime error:" "$f" | sed 's/^/    /'
  # and what each such task said last (its warnings and errors)
  local t
  for t in $(sed -n 's/^paramserver.sbatch: rank [0-9]* (\([a-z]*\/[0-9]*\)).*/\1/p' "$f" | sort -u); do
    echo "    $t, its last warnings and errors:"
    grep -E "(WARN|ERROR) $t: |^ps-(worker|server): " "$f" | tail -15 | sed 's/^/      /'
    echo "    $t, its last lines:"
    grep -E " $t: " "$f" | tail -8 | sed 's/^/      /'
  done
  # and ps/0's (the coordinator's variables: a worker's last calls go there)
  echo "    ps/0, its last lines:"
  grep -E " ps/0: " "$f" | tail -12 | sed 's/^/      /'
  return 1
}
check "repl: no rank ended otherwise than with 0; no sanitizer report" clean repl 0
check "ext: no rank ended otherwise than with 0; no sanitizer report" clean ext 0
check "kill: only ps/1's rank ended otherwise; no sanitizer report" clean kill 1

left() {
  local p out=""
  for p in $(pgrep -f -- "$dir/(ck|tmp)-"); do out+=" $p"; done
  [ -z "$out" ] || { echo "left:$out"; return 1; }
}
check "no ps or worker of the jobs left" left
etcd_stop
finish
