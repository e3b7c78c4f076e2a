#!/usr/bin/env bash
# Failover and rejoin of replicated shards (issue 23), through the
# correctness checker's driver (tests/chaos/chaos.sh) on a real etcd and
# 3 ps-server with the cluster spec's "replication": {"replicas": 2}:
#
# - failover: KILLS rounds, each a kill -9 of shard 0's primary while 2
#   clients send updates to every shard (1000 a second each); the time
#   from the kill to the first acknowledged update of shard 0 (on its new
#   primary).  Line: bench: failover_ms median=M max=X kills=N
#   target=median<1000,max<2000
# - rejoin: shard 0 holds 256 MiB more (a float32 variable); its backup is
#   killed with -9 and started again, twice; the time from the kill until
#   the view shows it in sync again (the restart, the state copy and the
#   catch-up).  Line: bench: rejoin_256MiB_s median=S max=S rejoins=2
# - the pause: the longest acknowledgement of an update of shard 0 while
#   its killed backup copies the 256 MiB back, against the same while a
#   cluster-wide save of that state runs (the snapshot gate: the pause a
#   save costs today).  Line: bench: rejoin_pause_ms VALUE ms
#   baseline=SAVE ratio=R target=<= 1 (each the largest of 2 rounds)
#
# Each run also checks what chaos.sh checks (nothing acknowledged lost).
#   tests/bench/failover.sh BUILD_DIR [KILLS]
set -euo pipefail
build=${1:?build dir}; kills=${2:-7}
here=$(cd "$(dirname "$0")" && pwd)
export PS_SERVER=${PS_SERVER:-$build/ps/ps-server}
export CHAOS_CLIENT=$build/tests/chaos/chaos_client PSCTL=$build/worker/psctl
med_max() { sort -n | awk '{ v[NR] = $1 } END { if (!NR) { print "median=none max=none"; exit }
  m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "median=%s max=%s\n", m, v[NR] }'; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
status=0
bash "$here/../chaos/chaos.sh" --rounds "$kills" --round-secs 1 --faults kill-primary --shard 0 \
  --clients 2 --rate 1000 --bench > "$out" 2>&1 || status=1
[ $status = 0 ] || { echo "failover.sh: the failover run failed:" >&2; tail -20 "$out" >&2; }
grep '^chaos: round' "$out" >&2 || true
n=$(grep -c '^chaos: failover shard 0: [0-9]* ms' "$out" || true)
echo "bench: failover_ms $(sed -n 's/^chaos: failover shard 0: \([0-9]*\) ms.*/\1/p' "$out" | med_max) kills=$n target=median<1000,max<2000"
bash "$here/../chaos/chaos.sh" --rounds 2 --round-secs 1 --faults kill-backup --shard 0 \
  --big-mib 256 --clients 2 --rate 200 --bench > "$out" 2>&1 || status=1
[ $status = 0 ] || { echo "failover.sh: the rejoin run failed:" >&2; tail -20 "$out" >&2; }
grep '^chaos: round' "$out" >&2 || true
n=$(grep -c '^chaos: round .*kill -9.*in sync after' "$out" || true)
echo "bench: rejoin_256MiB_s $(sed -n 's/^chaos: round .*kill -9.*; in sync after \([0-9.]*\) s.*/\1/p' "$out" | med_max) rejoins=$n"
pmax() { sed -n "s/^chaos: pause shard 0 $1: \\([0-9]*\\) ms.*/\\1/p" "$out" | sort -n | tail -1; }
rejoin_pause=$(pmax rejoin)
bash "$here/../chaos/chaos.sh" --rounds 2 --round-secs 1 --faults save --shard 0 \
  --big-mib 256 --clients 2 --rate 200 --bench > "$out" 2>&1 || status=1
[ $status = 0 ] || { echo "failover.sh: the save run failed:" >&2; tail -20 "$out" >&2; }
grep '^chaos: round' "$out" >&2 || true
save_pause=$(pmax save)
echo "bench: rejoin_pause_ms ${rejoin_pause:-none} ms baseline=${save_pause:-none} ratio=$(awk -v a="$rejoin_pause" -v b="$save_pause" 'BEGIN { if (a == "" || b == "" || b == 0) print "none"; else printf "%.2f", a / b }') target=<= 1"
exit $status
