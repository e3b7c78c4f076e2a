#!/usr/bin/env bash
# A replication link that is offered but out of reach (DESIGN.md "The
# replication link"): in a network namespace of its own (unshare -n, so
# its firewall rule touches nothing else), ps/1's link port is rejected by
# iptables.  A real etcd, 2 real ps-server --replicas 2, failover_client
# updating shard 0 (primary ps/0, backup ps/1) and shard 1 (primary ps/1,
# backup ps/0):
#  - ps/0 WARNs that it cannot connect to ps/1's link, naming the task,
#    address and port, and that its batches go as Replicate calls; it
#    never replicates over ps/1's link;
#  - ps/1 replicates over ps/0's link, which is not blocked;
#  - no acknowledged update is lost on either shard (repl_updates), psctl verify says
#    the replicas are identical, no ERROR, no sanitizer report.
set -u
if [ -z "${PS_LINK_NETNS:-}" ]; then
  if [ "$(id -u)" = 0 ] && command -v iptables > /dev/null &&
    unshare -n true 2> /dev/null; then
    PS_LINK_NETNS=1 exec unshare -n bash "$0" "$@"
  fi
  echo "SKIP: needs root, iptables and unshare -n (a network namespace of its own)"
  exit 77
fi
ip link set lo up || { echo "FAIL: lo up in the namespace"; exit 1; }
# (an iptables that cannot work here, e.g. without its kernel tables)
iptables -w -L INPUT -n > /dev/null 2>&1 ||
  { echo "SKIP: iptables does not work in a network namespace here"; exit 77; }
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
source "$(dirname "$0")/../support/repl.sh"
test_init repl_link_blocked
export PS_RPC_TIMEOUT=20
etcd_start link_blocked || { bad "etcd starts"; finish; exit 1; }

declare -a P
JOB=blocked
declare -a LPORT
# (a link port picked anew at each start: repl_start starts again on
# fresh ports when one was taken meanwhile)
start_one() {
  LPORT[$1]=$(pick_ports 1)
  # ps/1's link port refused (the namespace's own firewall)
  [ "$1" != 1 ] || iptables -w -A INPUT -p tcp --dport "${LPORT[1]}" -j REJECT --reject-with tcp-reset
  : > "$dir/$JOB$1.out"
  "$PS_SERVER" --cluster "$dir/$JOB.json" --job ps --task "$1" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job "$JOB" --lease-ttl 2 --grace-secs 2 \
    --repl-link-port "${LPORT[$1]}" > "$dir/$JOB$1.out" 2>> "$dir/$JOB$1.log" &
  P[$1]=$!
}
repl_start_one() { start_one "$1"; }
st_() { "$PSCTL" --cluster "$dir/$JOB.json" --etcd "$ETCD_ENDPOINTS" --repl-job "$JOB" \
  --replicas 2 --timeout-ms 5000 "$@"; }
stop_all() { for t in 0 1; do kill -TERM "${P[$t]}" 2> /dev/null; wait "${P[$t]}" 2> /dev/null; done; }
test_cleanup_hook() { stop_all; }

repl_start 2 "$dir/$JOB.json" "$JOB" || { bad "2 ps-server --replicas 2 start" "$(tail -n 5 "$dir/$JOB"*.log)"; finish; exit 1; }
check "iptables rejects port ${LPORT[1]} (ps/1's link) in the test's namespace" \
  bash -c "iptables -w -S INPUT | grep -q -- '--dport ${LPORT[1]} .*REJECT'"
repl_wait_status '^shard 0: ps/0 primary.*ps/1 backup' '^shard 1: ps/1 primary.*ps/0 backup' ||
  bad "each shard has its primary and in-sync backup" "$out"
repl_updates v 100
show="$dir/${JOB}0.log"
check "ps/0 WARNs it cannot reach ps/1's link, and goes on with Replicate calls" \
  wait_for "$dir/${JOB}0.log" "WARN ps/0: replication link: cannot connect to ps/1 at 127\.0\.0\.1:${LPORT[1]}: its batches go as Replicate calls \(the port may be blocked between the ps hosts; --no-repl-link on every ps turns the link off\)" 5
check "ps/0 never replicates over ps/1's link" \
  bash -c "! grep -q 'replication to ps/1 over its replication link' '$dir/${JOB}0.log'"
show="$dir/${JOB}1.log"
check "ps/1 replicates over ps/0's link (not blocked)" \
  wait_for "$dir/${JOB}1.log" "INFO ps/1: replication to ps/0 over its replication link \(127\.0\.0\.1:${LPORT[0]}\)" 5
out=$(st_ verify 2>&1)
show=""
check "psctl verify: both shards' replicas identical" \
  bash -c "grep -q '^shard 0: ps/0 ps/1 identical (1 variables)' <<< \"\$1\" && grep -q '^shard 1: ps/1 ps/0 identical (1 variables)' <<< \"\$1\"" _ "$out"
stop_all
for t in 0 1; do
  check "ps/$t's log holds no ERROR and no sanitizer report" \
    bash -c "! grep -qE ' ERROR |runtime error|Sanitizer|==[0-9]+==' '$dir/$JOB$t.log'"
done
finish
