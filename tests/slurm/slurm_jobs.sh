# Helpers of the tests that run jobs on slurm_local.sh's Slurm (sourced).
# rank_pid PROG CKPT PROCID: the pid of PROG (ps-server, ps-worker) of the
# job whose command line names CKPT (the test's own directory), of that
# rank: only a process the test's job started
rank_pid() {
  local p
  for p in $(pgrep -x "$1"); do
    { tr '\0' '\n' < "/proc/$p/cmdline"; } 2> /dev/null | grep -x "$2" > /dev/null || continue
    { tr '\0' '\n' < "/proc/$p/environ"; } 2> /dev/null | grep -x "SLURM_PROCID=$3" > /dev/null || continue
    echo "$p"
    return 0
  done
  return 1
}
