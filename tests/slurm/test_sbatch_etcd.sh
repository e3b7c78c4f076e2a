#!/usr/bin/env bash
# deploy/slurm/paramserver.sbatch's replication set-up (REPLICAS, ETCD)
# without Slurm daemons: the batch script runs under bash with the
# environment Slurm gives it, a real etcd, and a stand-in srun on PATH
# that records what the ranks would get (REPL_ARGS) and asks the etcd
# it names for /health while the step "runs"; squeue and scontrol are
# stand-ins that fail (no time limit, no timer).  Checks: REPLICAS=2
# starts etcd on the batch host, the ranks get --replicas, --etcd and
# --repl-job, etcd answers during the step and is stopped by pid after
# it (also when the step fails), its data removed; ETCD=... starts none;
# REPLICAS=1 changes nothing; bad settings are refused, saying why.
# (The ranks' own handling, a replicated ps rank that dies ending with 0,
# runs only under real Slurm: test_slurm.sh.)
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
test_init sbatch-etcd
here=$(cd "$(dirname "$0")" && pwd)
sbatch_file="$here/../../deploy/slurm/paramserver.sbatch"
mkdir -p "$dir/bin"
cat > "$dir/bin/srun" << 'EOF'
#!/bin/bash
# records the step's settings; asks the etcd of REPL_ARGS for /health
{
  echo "REPL_ARGS=$REPL_ARGS"
  e=$(sed -n 's/.*--etcd \([^ ]*\).*/\1/p' <<< "$REPL_ARGS")
  if [ -n "$e" ]; then
    echo "health=$(curl -s -m 2 "http://${e%%,*}/health")"
  fi
} > "$SRUN_LOG"
exit "${SRUN_RC:-0}"
EOF
printf '#!/bin/sh\nexit 1\n' > "$dir/bin/squeue"
cp "$dir/bin/squeue" "$dir/bin/scontrol"
chmod +x "$dir/bin/"*
alive() {
  local st
  st=$(cut -d' ' -f3 "/proc/$1/stat" 2> /dev/null) || return 1
  [ -n "$st" ] && [ "$st" != Z ] && [ "$st" != X ]
}
test_cleanup_hook() { for p in $(pgrep -f -- "$dir"); do kill -KILL "$p" 2> /dev/null; done; }
# job NAME [VAR=VALUE...]: the batch script as Slurm would run it
job() {
  local name=$1
  shift
  env PATH="$dir/bin:$PATH" TMPDIR="$dir" SLURM_JOB_ID=4242 SLURM_NTASKS=4 \
    SLURMD_NODENAME=localhost SLURM_SUBMIT_DIR="$dir" CKPT_DIR="$dir/ck" \
    SRUN_LOG="$dir/$name.srun" "$@" bash "$sbatch_file" > "$dir/$name.out" 2> "$dir/$name.err"
}
etcd_pid() { sed -n 's/.*started etcd (pid \([0-9]*\)).*/\1/p' "$dir/$1.err"; }
show=""

job r2 REPLICAS=2
rc=$?
show="$dir/r2.err"
check "REPLICAS=2: the job ends with the step's code (0)" test "$rc" = 0
check "REPLICAS=2: etcd started on the batch host" \
  grep -qE '^paramserver.sbatch: started etcd \(pid [0-9]+\) on localhost:[0-9]+ for 2 replicas per shard$' "$dir/r2.err"
ep=$(sed -n 's/.*started etcd (pid [0-9]*) on \([^ ]*\) .*/\1/p' "$dir/r2.err")
pid=$(etcd_pid r2)
check "REPLICAS=2: the ranks get --replicas, --etcd, --repl-job" \
  grep -qx "REPL_ARGS=--replicas 2 --etcd $ep --repl-job paramserver-4242" "$dir/r2.srun"
check "REPLICAS=2: etcd is healthy while the step runs" grep -qx 'health={"health":"true"}' "$dir/r2.srun"
check "REPLICAS=2: etcd stopped by pid after the step" grep -qx "paramserver.sbatch: etcd (pid $pid) stopped" "$dir/r2.err"
check "REPLICAS=2: etcd (pid $pid) is not running" bash -c "! kill -0 $pid 2> /dev/null"
check "REPLICAS=2: its data removed" bash -c "! ls -d '$dir'/ps-etcd-4242-* 2> /dev/null"

job fail REPLICAS=2 SRUN_RC=3
rc=$?
show="$dir/fail.err"
pid=$(etcd_pid fail)
check "a failed step: the job ends with its code (3)" test "$rc" = 3
check "a failed step: etcd stopped all the same" grep -qx "paramserver.sbatch: etcd (pid $pid) stopped" "$dir/fail.err"
check "a failed step: etcd (pid $pid) is not running" bash -c "[ -n '$pid' ] && ! kill -0 $pid 2> /dev/null"

job ext REPLICAS=3 ETCD=e1:2379,e2:2379,e3:2379 REPL_JOB=mnist
rc=$?
show="$dir/ext.err"
check "ETCD=...: the job ends 0" test "$rc" = 0
check "ETCD=...: no etcd started" bash -c "! grep -q 'started etcd' '$dir/ext.err'"
check "ETCD=...: the ranks get it, and REPL_JOB" \
  grep -qx "REPL_ARGS=--replicas 3 --etcd e1:2379,e2:2379,e3:2379 --repl-job mnist" "$dir/ext.srun"

job r1
rc=$?
show="$dir/r1.err"
check "REPLICAS unset: no etcd, no replication flags" \
  bash -c "[ $rc = 0 ] && ! grep -q 'started etcd' '$dir/r1.err' && grep -qx 'REPL_ARGS=' '$dir/r1.srun'"

job bad REPLICAS=5
rc=$?
check "REPLICAS=5 is refused (exit 2)" \
  bash -c "[ $rc = 2 ] && grep -qx 'paramserver.sbatch: REPLICAS=5 must be 1, 2 or 3' '$dir/bad.err' && [ ! -e '$dir/bad.srun' ]"

job nobin REPLICAS=2 ETCD_BIN=/nonexistent/etcd
rc=$?
check "an etcd that cannot run: exit 1, saying so, no step" \
  bash -c "[ $rc = 1 ] && grep -q 'paramserver.sbatch: etcd (/nonexistent/etcd) did not start; its log:' '$dir/nobin.err' && [ ! -e '$dir/nobin.srun' ]"
no_left() { local p out=""; for p in $(pgrep -f -- "$dir"); do alive "$p" && out+=" $p"; done; [ -z "$out" ]; }
check "no process left" no_left
finish
