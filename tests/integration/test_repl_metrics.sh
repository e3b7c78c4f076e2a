#!/usr/bin/env bash
# The replication metrics of ps-server --metrics-port (DESIGN.md
# "Replication", "Metrics"), read over real HTTP with curl from 3 real
# ps-server --replicas 2 and a real etcd, across a kill -9 and a rejoin:
#  1. every ps serves ps_view_epoch (the same on all), ps_failovers_total 0,
#     ps_replicas_missing 0, ps_replication_lag_entries/_bytes >= 0;
#  2. kill -9 of ps/0 while failover_client updates shard 0: on ps/1 (the
#     new primary of shard 0) ps_failovers_total goes up, ps_replicas_missing
#     > 0 on ps/1 and ps/2 while ps/0 is gone, ps_view_epoch grows;
#  3. ps/0 restarted rejoins in sync (psctl status): ps_replicas_missing
#     is 0 again, the counter did not go back, the lag drains to 0 once the
#     client stops, and no acknowledged update was lost.
set -u
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
source "$(dirname "$0")/../support/repl.sh"
test_init repl_metrics
TTL=2
export PS_RPC_TIMEOUT=20
etcd_start repl_metrics || { bad "etcd starts"; finish; exit 1; }

declare -a P MP
start_one() {
  : > "$dir/ps$1.out"
  : > "$dir/ps$1.log"
  "$PS_SERVER" --cluster "$dir/c.json" --job ps --task "$1" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job rm --lease-ttl "$TTL" --grace-secs 2 \
    --metrics-port 0 > "$dir/ps$1.out" 2>> "$dir/ps$1.log" &
  P[$1]=$!
}
repl_start_one() { start_one "$1"; }
repl_start 3 "$dir/c.json" ps && started=1 || started=0
[ "$started" = 1 ] || { bad "3 ps-server --replicas 2 --metrics-port 0 start" "$(tail -n 5 "$dir"/ps*.log)"; finish; exit 1; }
ok "3 ps-server --replicas 2 --metrics-port 0 start"
metrics_port() { MP[$1]=$(sed -n 's/.*metrics on port \([0-9]*\) .*/\1/p' "$dir/ps$1.log" | tail -n 1); }
for t in 0 1 2; do metrics_port "$t"; done

# m T NAME: the value of metric NAME on ps/T (empty: no such line)
m() { curl -sf "http://127.0.0.1:${MP[$1]}/metrics" | awk -v n="$2" '$1 == n { print $2 }'; }
# wait_m T NAME AWKCOND: until NAME on ps/T satisfies v AWKCOND (20 s); $v its value
wait_m() {
  local i
  for ((i = 0; i < 200; i++)); do
    v=$(m "$1" "$2")
    [ -n "$v" ] && awk -v v="$v" "BEGIN { exit !(v $3) }" && return 0
    sleep 0.1
  done
  return 1
}
st_() { "$PSCTL" --cluster "$dir/c.json" --etcd "$ETCD_ENDPOINTS" --repl-job rm \
  --replicas 2 --timeout-ms 5000 "$@"; }
wait_status() { repl_wait_status "$@"; }
IN_SYNC=('^shard 0: ps/[0-9] primary.*ps/[0-9] backup' \
  '^shard 1: ps/[0-9] primary.*ps/[0-9] backup' \
  '^shard 2: ps/[0-9] primary.*ps/[0-9] backup')
wait_status "${IN_SYNC[@]}" || bad "every shard has an in-sync backup" "$out"
epoch=$(sed -n 's/^replication: .*view epoch \([0-9]*\).*/\1/p' <<< "$out" | head -n 1)
[ -n "$epoch" ] || { bad "psctl status names the view epoch" "$out"; epoch=0; }

# ---- 1. the metrics are there, with sane values ----
for t in 0 1 2; do
  if wait_m "$t" ps_view_epoch "== $epoch"; then
    ok "ps/$t: ps_view_epoch is the view's epoch ($epoch)"
  else
    bad "ps/$t: ps_view_epoch is the view's epoch ($epoch), got '$v'" \
      "$(curl -s "http://127.0.0.1:${MP[$t]}/metrics" | grep -E '^ps_(view|repl|fail)')"
  fi
  f=$(m "$t" ps_failovers_total); r=$(m "$t" ps_replicas_missing)
  le=$(m "$t" ps_replication_lag_entries); lb=$(m "$t" ps_replication_lag_bytes)
  if [ "$f" = 0 ] && [ "$r" = 0 ] && [ -n "$le" ] && [ "$le" -ge 0 ] && [ -n "$lb" ] && [ "$lb" -ge 0 ]; then
    ok "ps/$t: no failover, no replica missing, lag $le entries $lb bytes"
  else
    bad "ps/$t: no failover, no replica missing, a lag >= 0 (failovers '$f' missing '$r' lag '$le' '$lb')"
  fi
done
curl -sf "http://127.0.0.1:${MP[1]}/metrics" | grep -q '^# TYPE ps_failovers_total counter' &&
  ok "ps_failovers_total is typed counter" || bad "ps_failovers_total is typed counter"

"$FAILOVER_CLIENT" "$dir/c.json" "$ETCD_ENDPOINTS" rm 0 counter "$dir/stop" \
  > "$dir/client.out" 2> "$dir/client.log" &
CPID=$!
wait_for "$dir/client.out" "^ack 100 " 60 || bad "the client updates shard 0" "$(tail -n 3 "$dir/client.out" "$dir/client.log")"

# ---- 2. kill -9 of ps/0, shard 0's primary ----
kill -KILL "${P[0]}"; wait "${P[0]}" 2> /dev/null
wait_status '^shard 0: ps/1 primary' || bad "ps/1 becomes shard 0's primary" "$out"
if wait_m 1 ps_failovers_total ">= 1"; then
  ok "ps/1, the new primary: ps_failovers_total went up ($v)"
else
  bad "ps/1, the new primary: ps_failovers_total went up (got '$v')"
fi
for t in 1 2; do
  if wait_m "$t" ps_replicas_missing "> 0"; then
    ok "ps/$t: ps_replicas_missing > 0 while ps/0 is gone ($v)"
  else
    bad "ps/$t: ps_replicas_missing > 0 while ps/0 is gone (got '$v')"
  fi
done
if wait_m 1 ps_view_epoch "> $epoch"; then
  ok "ps_view_epoch increased ($epoch -> $v)"
else
  bad "ps_view_epoch increased (from $epoch, got '$v')"
fi
[ "$(m 2 ps_failovers_total)" = 0 ] && ok "ps/2 (no shard moved to it): ps_failovers_total stays 0" ||
  bad "ps/2 (no shard moved to it): ps_failovers_total stays 0 (got '$(m 2 ps_failovers_total)')"
fo=$(m 1 ps_failovers_total)

# ---- 3. ps/0 rejoins ----
start_one 0
wait_for "$dir/ps0.out" "ready on" 30 || bad "ps/0 restarts" "$(tail "$dir/ps0.log")"
metrics_port 0
if wait_status '^shard 0: ps/1 primary.*ps/0 backup' '^shard 2: ps/2 primary.*ps/0 backup' \
  "${IN_SYNC[@]}"; then
  ok "the restarted ps/0 rejoins in sync"
else
  bad "the restarted ps/0 rejoins in sync" "$out"
fi
for t in 0 1 2; do
  if wait_m "$t" ps_replicas_missing "== 0"; then
    ok "ps/$t: ps_replicas_missing is back to 0"
  else
    bad "ps/$t: ps_replicas_missing is back to 0 (got '$v')"
  fi
done
[ "$(m 1 ps_failovers_total)" -ge "$fo" ] && ok "ps_failovers_total did not go back" ||
  bad "ps_failovers_total did not go back ($fo -> $(m 1 ps_failovers_total))"
touch "$dir/stop"
wait "$CPID"; crc=$?
acks=$(grep -c '^ack ' "$dir/client.out")
value=$(awk '$1 == "value" { print $2 }' "$dir/client.out")
[ "$crc" = 0 ] && [ "$value" = "$acks" ] && ok "no acknowledged update lost ($acks)" ||
  bad "no acknowledged update lost (exit $crc, $acks acknowledged, value $value)" "$(tail -n 3 "$dir/client.log")"
if wait_m 1 ps_replication_lag_entries "== 0" && wait_m 1 ps_replication_lag_bytes "== 0"; then
  ok "with no traffic the replication lag drains to 0"
else
  bad "with no traffic the replication lag drains to 0 (got '$v')"
fi
for t in 0 1 2; do kill -TERM "${P[$t]}"; wait "${P[$t]}" 2> /dev/null; done
etcd_stop
finish
