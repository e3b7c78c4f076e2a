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
#  4. the job submitted again resumes from that checkpoint and completes.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PS_WORKER=${PS_WORKER:?}
source "$(dirname "$0")/../support/lib.sh"
test_init slurm
here=$(cd "$(dirname "$0")" && pwd)
sbatch_file="$here/../../deploy/slurm/paramserver.sbatch"
if [ "$(id -u)" != 0 ] || ! command -v slurmctld > /dev/null || ! command -v munged > /dev/null; then
  bad "local Slurm" "needs root and slurm-wlm + munge (deploy/setup.sh installs them)"
  finish
fi
test_cleanup_hook() { bash "$here/slurm_local.sh" stop "$dir/slurm" > /dev/null 2>&1; }
bash "$here/slurm_local.sh" start "$dir/slurm" > "$dir/slurm-start.log" 2>&1 \
  || { bad "local Slurm starts" "$(cat "$dir/slurm-start.log") $(tail -5 "$dir"/slurm/*.log)"; finish; }
export SLURM_CONF=$dir/slurm/slurm.conf
export PS_SERVER PS_WORKER
job_state() { scontrol show job "$1" 2>/dev/null | sed -n 's/.*JobState=\([A-Z_]*\).*/\1/p'; }
submit() { # NAME CKPT WORKER_ARGS...: prints the job id
  local name=$1 ck=$2; shift 2
  mkdir -p "$ck"
  CKPT_DIR="$ck" WORKER_ARGS="$*" sbatch --parsable -N 2 --ntasks-per-node=2 \
    -o "$dir/$name.out" "$sbatch_file"
}
W=(--model linreg --log-every 50)

# 1. one job, start to end
id=$(submit one "$dir/ck1" "${W[@]}" --steps 300)
# (a worker that never trained may stay up to 60 s after the chief: srun --wait)
for ((i = 0; i < 3000; i++)); do
  s=$(job_state "$id"); [ "$s" = COMPLETED ] || [ "$s" = FAILED ] || [ "$s" = CANCELLED ] && break
  sleep 0.1
done
check "one job ends COMPLETED (${s:-none})" test "$s" = COMPLETED
last_step() { sed -n 's/.*global step \([0-9]*\)$/\1/p' "$1" | tail -1; }
step=$(last_step "$dir/one.out")
check "one job: a checkpoint at the last step ($step)" test -n "$step" -a -f "$dir/ck1/model.ckpt-$step.index"
check "one job: the chief shut the ps down" grep -q "job done: 2 of 2 ps task(s) shutting down" "$dir/one.out"
check "one job: ranks on their hosts (ps/0 on n9)" grep -q "ps/0: .*serving on n9:" "$dir/one.out"

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

# 3. scancel mid-training
id=$(submit cancel "$dir/ck3" "${W[@]}" --steps 100000000 --save-every-secs 1000)
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
finish
