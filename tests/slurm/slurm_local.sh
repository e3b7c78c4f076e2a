#!/usr/bin/env bash
# A local Slurm for the tests (root): munged, slurmctld and one slurmd per
# virtual node, all on this host.  The nodes are n9, n10, n11, so that
# their text order (n10, n11, n9) differs from Slurm's; /etc/hosts gets
# them as 127.0.0.1 between marker lines, removed again by stop.
# MpiParams=ports= lets srun --resv-ports reserve ports per step.
#   slurm_local.sh start DIR | stop DIR
set -uo pipefail
D=${2:?usage: slurm_local.sh start|stop DIR}
export SLURM_CONF=$D/slurm.conf
NODES=(n9 n10 n11)
MARK="# paramserver tests/slurm"
case "${1:-}" in
start)
  mkdir -p "$D/state" || exit 1
  [ -s /etc/munge/munge.key ] || mungekey --create --force > /dev/null 2>&1
  mkdir -p /run/munge && chown munge:munge /run/munge
  munge -n > /dev/null 2>&1 || runuser -u munge -- /usr/sbin/munged || exit 1
  grep -q "$MARK" /etc/hosts || echo "127.0.0.1 ${NODES[*]} $MARK" >> /etc/hosts
  cat > "$SLURM_CONF" <<CONF
ClusterName=pstest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool-%n
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd-%n.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd-%n.log
SlurmctldPort=$((27000 + RANDOM % 2000))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MpiParams=ports=23000-23999
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SlurmdParameters=config_overrides
ReturnToService=2
KillWait=30
MinJobAge=600
CONF
  port=$((29000 + RANDOM % 900))
  for n in "${NODES[@]}"; do
    echo "NodeName=$n NodeHostname=localhost NodeAddr=127.0.0.1 Port=$port CPUs=4 RealMemory=1000" >> "$SLURM_CONF"
    port=$((port + 1))
  done
  echo "PartitionName=debug Nodes=n[9-11] Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4" >> "$SLURM_CONF"
  slurmctld -f "$SLURM_CONF" || exit 1
  for n in "${NODES[@]}"; do slurmd -f "$SLURM_CONF" -N "$n" || exit 1; done
  for _ in $(seq 1 120); do
    [ "$(sinfo -h -o %T 2>/dev/null | sort -u)" = idle ] && exit 0
    sleep 0.25
  done
  echo "slurm did not come up; logs in $D" >&2
  exit 1 ;;
stop)
  scontrol shutdown > /dev/null 2>&1
  for _ in $(seq 1 80); do ls "$D"/*.pid > /dev/null 2>&1 || break; sleep 0.25; done
  pkill -f "slurmd -f $SLURM_CONF" 2>/dev/null
  pkill -f "slurmctld -f $SLURM_CONF" 2>/dev/null
  [ -f /run/munge/munged.pid ] && kill "$(cat /run/munge/munged.pid)" 2>/dev/null
  sed -i "\|$MARK|d" /etc/hosts
  exit 0 ;;
*) echo "usage: slurm_local.sh start|stop DIR" >&2; exit 2 ;;
esac
