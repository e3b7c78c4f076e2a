#!/usr/bin/env bash
# A local Slurm for the tests (root): its own munged, slurmctld and one
# slurmd per virtual node, all on this host.  The nodes are n9, n10, n11,
# so that their text order (n10, n11, n9) differs from Slurm's; /etc/hosts
# gets them as 127.0.0.1 on a line marked with DIR, which stop removes
# (only its own: another run's line stays).  Ports are picked at start:
# slurmctld's and the slurmds' by the kernel (bind to port 0; started
# again on fresh ones when one was taken before its daemon bound it), and the
# range MpiParams=ports= hands out to srun --resv-ports (steps' ps) as a
# random block below the kernel's ephemeral range with nothing listening
# in it, so that two runs at once do not collide.
# munged is the test's own: a private socket, key, pid file, log and seed
# under DIR/munge (slurm.conf's AuthInfo=socket= points Slurm at it), so a
# munged the machine runs on /run/munge is neither used nor stopped.  stop
# ends only the pids start recorded in DIR/pids (checked by their command
# line, so a pid reused since is left alone).
#   slurm_local.sh start DIR | stop DIR
set -uo pipefail
D=${2:?usage: slurm_local.sh start|stop DIR}
export SLURM_CONF=$D/slurm.conf
NODES=(n9 n10 n11)
MARK="# paramserver tests/slurm $D"
# The hosts file (PS_TEST_HOSTS_FILE: another file, for the test of mark
# and unmark themselves).  Every run changes it under an exclusive flock on
# one lock file, so that two runs at once never lose each other's line.
HOSTS=${PS_TEST_HOSTS_FILE:-/etc/hosts}
LOCK=${PS_TEST_HOSTS_LOCK:-/tmp/paramserver-tests-hosts.lock}
# mark: this run's line appended, once
mark() {
  (
    flock -x 9 || exit 1
    grep -qF -- "$MARK" "$HOSTS" || echo "127.0.0.1 ${NODES[*]} $MARK" >> "$HOSTS"
  ) 9>> "$LOCK"
}
# unmark: the hosts file without this run's line (rewritten in place: it
# may be a bind mount)
unmark() {
  (
    flock -x 9 || exit 1
    grep -qF -- "$MARK" "$HOSTS" || exit 0
    t=$(grep -vF -- "$MARK" "$HOSTS") && printf '%s\n' "$t" > "$HOSTS"
  ) 9>> "$LOCK"
}
M=$D/munge
# record NAME PIDFILE: DIR/pids gets "pid name" once the daemon wrote it
record() {
  local i
  for ((i = 0; i < 100; i++)); do
    [ -s "$2" ] && { echo "$(cat "$2") $1" >> "$D/pids"; return 0; }
    sleep 0.05
  done
  echo "$1 wrote no pid file $2" >&2
  return 1
}
# taken: a Slurm daemon of this attempt could not bind its port
taken() { grep -qs "Address already in use" "$D"/slurmctld.log "$D"/slurmd-*.log; }
# ours PID: a recorded pid whose command line still names this DIR's files
ours() { tr '\0' ' ' 2> /dev/null < "/proc/$1/cmdline" | grep -F -- "$D/" > /dev/null; }
# stop_daemons [munged]: the Slurm daemons DIR/pids names (scontrol
# shutdown), and munged; without "munged" (an attempt that failed, whose
# slurmctld may not be on its port) SIGTERM to the Slurm daemons instead
stop_daemons() {
  local all=${1:-} name pid what names=slurm
  [ -n "$all" ] && names="slurm munged" && scontrol shutdown > /dev/null 2>&1
  # the Slurm daemons first (they need munged to shut down), munged last
  for name in $names; do
    while read -r pid what; do
      case $what in $name*) ;; *) continue ;; esac
      { [ "$name" = munged ] || [ -z "$all" ]; } && ours "$pid" && kill "$pid"
      for _ in $(seq 1 80); do ours "$pid" || break; sleep 0.1; done
      ours "$pid" && kill -KILL "$pid"
    done < "$D/pids"
  done
  [ -n "$all" ] && return 0
  # (the next attempt records its own)
  grep -v " slurm" "$D/pids" > "$D/pids.new"; mv "$D/pids.new" "$D/pids"
}
# start_daemons ATTEMPT: slurm.conf on fresh ports, slurmctld and the
# slurmds, until every node is idle.  2: a port was taken
start_daemons() {
  read -r ctld_port node_port0 node_port1 node_port2 resv_lo < <(python3 -c '
import random, socket, subprocess
ss = [socket.socket() for _ in range(4)]
for s in ss: s.bind(("127.0.0.1", 0))
ports = [s.getsockname()[1] for s in ss]
lo_eph = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
busy = set()
for line in subprocess.run(["ss", "-Htlnu"], capture_output=True, text=True).stdout.splitlines():
    try: busy.add(int(line.split()[4].rsplit(":", 1)[1]))
    except (IndexError, ValueError): pass
for _ in range(1000):
    lo = random.randrange(20000, lo_eph - 1000, 100)
    if not any(lo <= p < lo + 1000 for p in busy | set(ports)): break
print(*ports, lo)') || { echo "could not pick ports" >&2; return 1; }
  [ "$1" = 1 ] && [ -n "${PS_TEST_CTLD_PORT:-}" ] && ctld_port=$PS_TEST_CTLD_PORT
  node_ports=("$node_port0" "$node_port1" "$node_port2")
  cat > "$SLURM_CONF" <<CONF
ClusterName=pstest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$M/munge.socket
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool-%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd-%n.log
SlurmctldPort=$ctld_port
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MpiParams=ports=$resv_lo-$((resv_lo + 999))
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
MinJobAge=600
CONF
  for i in "${!NODES[@]}"; do
    echo "NodeName=${NODES[$i]} NodeHostname=localhost NodeAddr=127.0.0.1 Port=${node_ports[$i]} CPUs=4 RealMemory=1000" >> "$SLURM_CONF"
  done
  echo "PartitionName=debug Nodes=n[9-11] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4" >> "$SLURM_CONF"
  slurmctld -f "$SLURM_CONF" || return 1
  record slurmctld "$D/slurmctld.pid" || { taken && return 2; return 1; }
  for n in "${NODES[@]}"; do
    taken && return 2
    slurmd -f "$SLURM_CONF" -N "$n" || return 1
    record slurmd "$D/slurmd-$n.pid" || { taken && return 2; return 1; }
  done
  for _ in $(seq 1 120); do
    [ "$(sinfo -h -o %T 2>/dev/null | sort -u)" = idle ] && return 0
    taken && return 2
    sleep 0.25
  done
  taken && return 2
  echo "slurm did not come up; logs in $D" >&2
  return 1
}
case "${1:-}" in
start)
  mkdir -p "$D/state" || exit 1
  # munged wants its socket's directory and every parent searchable by all
  chmod 0711 "$D" && mkdir -m 0755 "$M" || exit 1
  for p in $(dirname "$D") "$D"; do
    [ "$(($(stat -c 0%a "$p") & 0111))" = $((0111)) ] \
      || { echo "munged needs $p searchable by all (chmod a+x)" >&2; exit 1; }
  done
  head -c 1024 /dev/urandom > "$M/munge.key" && chmod 0600 "$M/munge.key" || exit 1
  munged -S "$M/munge.socket" --key-file="$M/munge.key" --pid-file="$M/munged.pid" \
    --log-file="$M/munged.log" --seed-file="$M/munged.seed" || { cat "$M/munged.log" >&2; exit 1; }
  record munged "$M/munged.pid" || exit 1
  munge -S "$M/munge.socket" -n | unmunge -S "$M/munge.socket" > /dev/null \
    || { echo "munged on $M/munge.socket does not answer" >&2; exit 1; }
  mark || { echo "could not add the nodes to $HOSTS" >&2; exit 1; }
  # slurmctld's and the slurmds' ports must be in slurm.conf before they
  # start, so they are picked free and may be taken before a daemon binds
  # its own ("Address already in use" in its log): then the daemons are
  # stopped and started again on fresh ports, saying so.
  # PS_TEST_CTLD_PORT: the first attempt's slurmctld port (the test gives
  # one it holds, to see that)
  for attempt in 1 2 3; do
    start_daemons "$attempt"
    case $? in
      0) exit 0 ;;
      2) ;;
      *) exit 1 ;;
    esac
    stop_daemons
    mkdir -p "$D/attempt-$attempt" && mv "$D"/*.log "$D/attempt-$attempt/" 2> /dev/null
    [ "$attempt" = 3 ] && { echo "slurm_local.sh: ports taken 3 times in a row; logs in $D" >&2; exit 1; }
    echo "slurm_local.sh: a port picked for slurmctld or a slurmd was taken before it bound it (Address already in use): starting again on fresh ports (attempt $((attempt + 1)) of 3; the logs of this one in $D/attempt-$attempt)" >&2
  done
  exit 1 ;;
stop)
  [ -f "$D/pids" ] || { unmark; exit 0; }
  stop_daemons munged
  unmark
  exit 0 ;;
# (for the test: only the hosts file's line)
mark) mark ;;
unmark) unmark ;;
*) echo "usage: slurm_local.sh start|stop DIR" >&2; exit 2 ;;
esac
