#!/usr/bin/env bash
# Membership of replicated ps shards (issue 23, ps/member.c), end to end:
# a real etcd (tests/support/etcd.sh), real ps-server --replicas 2, and
# failover_client updating shard 0 without a pause.
#  1. --replicas 2 without etcd: exit 2 and the message; --replicas 1
#     runs with no etcd anywhere.
#  2. 3 ps join one view; kill -9 of shard 0's primary: its backup is
#     primary in a new epoch; the time from the kill to the first
#     acknowledged update (< 2 s, printed); no acknowledged update lost.
#  3. the killed ps restarted on its address rejoins SYNCING and becomes
#     in sync; psctl verify: the replicas are identical.
#  4. SIGSTOP of a primary past its lease TTL: failover; after SIGCONT it
#     is fenced (log line) and exits 75.
#  5. the last replica of a shard killed: the ERROR naming the lost shard.
#  6. tokens: a token file without a replica token is refused; with one,
#     the ps replicate to each other under it.
set -u
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
source "$(dirname "$0")/../support/repl.sh"
test_init failover

TTL=2

# ---- 1. the flags ----
echo '{"ps": ["127.0.0.1:0", "127.0.0.1:0"]}' > "$dir/two.json"
expect "--replicas 2 without --etcd: exit 2" 2 "--replicas 2 needs the etcd endpoints" \
  "$PS_SERVER" --cluster "$dir/two.json" --task 0 --replicas 2
expect "--replicas 4 refused" 2 "--replicas must be 1, 2 or 3, got '4'" \
  "$PS_SERVER" --cluster "$dir/two.json" --task 0 --replicas 4
echo '{"ps": ["127.0.0.1:0", "127.0.0.1:0"]}' > "$dir/port0.json"
expect "--replicas with a port-0 address in the spec refused" 2 \
  "the cluster spec gives ps/0 the address 127.0.0.1:0; replicated ps tasks call each other" \
  "$PS_SERVER" --cluster "$dir/port0.json" --task 1 --replicas 2 --etcd 127.0.0.1:1
expect "--lease-ttl 0 refused" 2 "--lease-ttl must be 1..3600 seconds, got '0'" \
  "$PS_SERVER" --cluster "$dir/two.json" --task 0 --replicas 2 --etcd 127.0.0.1:1 \
  --lease-ttl 0
# R = 1 touches no etcd: none runs yet, and PS_ETCD points nowhere
PS_ETCD=127.0.0.1:1 start_ps "$dir/two.json" 0 "$dir/r1.log" --replicas 1
if [ -n "$ADDR" ] && ! grep -q "etcd" "$dir/r1.log"; then
  ok "--replicas 1 serves with no etcd around"
else
  bad "--replicas 1 serves with no etcd around" "$(cat "$dir/r1.log")"
fi
kill -TERM "$PID" 2> /dev/null; wait "$PID" 2> /dev/null

etcd_start failover || { bad "etcd starts"; finish; exit 1; }

# ---- 2. three ps, kill -9 of a primary ----
# start_one T: ps/T on its address in $dir/repl.json; P[T] its pid
declare -a P
start_one() {
  : > "$dir/ps$1.out"
  "$PS_SERVER" --cluster "$dir/repl.json" --job ps --task "$1" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job fo --lease-ttl "$TTL" --grace-secs 2 \
    > "$dir/ps$1.out" 2>> "$dir/ps$1.log" &
  P[$1]=$!
}
started=0
for ((try = 0; try < 5 && !started; try++)); do
  read -r -a ports < <(pick_ports 3)
  echo "{\"ps\": [\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\", \"127.0.0.1:${ports[2]}\"]}" > "$dir/repl.json"
  for t in 0 1 2; do start_one "$t"; done
  up=0
  for ((i = 0; i < 1200 && up < 3; i++)); do
    up=0
    for t in 0 1 2; do
      grep -q "ready on" "$dir/ps$t.out" && up=$((up + 1)) && continue
      kill -0 "${P[$t]}" 2> /dev/null || break 2
    done
    [ "$up" = 3 ] || sleep 0.05
  done
  if [ "$up" = 3 ]; then started=1; break; fi
  for t in 0 1 2; do kill -KILL "${P[$t]}" 2> /dev/null; wait "${P[$t]}" 2> /dev/null; done
  grep -q "address in use" "$dir"/ps*.log || break
done
[ "$started" = 1 ] || { bad "3 ps-server --replicas 2 start" "$(tail -n 20 "$dir"/ps*.log)"; finish; exit 1; }
ok "3 ps-server --replicas 2 start and join the view"

st_() { "$PSCTL" --cluster "$dir/repl.json" --etcd "$ETCD_ENDPOINTS" --repl-job fo \
  --replicas 2 --timeout-ms 5000 "$@"; }
if repl_wait_status '^shard 0: ps/0 primary.*ps/1 backup' '^shard 1: ps/1 primary.*ps/2 backup' \
  '^shard 2: ps/2 primary.*ps/0 backup'; then
  ok "every shard on its placement, primary and backup"
else
  bad "every shard on its placement, primary and backup" "$out"
fi

export PS_RPC_TIMEOUT=20
"$FAILOVER_CLIENT" "$dir/repl.json" "$ETCD_ENDPOINTS" fo 0 counter "$dir/stop" \
  > "$dir/client.out" 2> "$dir/client.log" &
CPID=$!
wait_for "$dir/client.out" "^ack 200 " 60 || bad "the client updates shard 0" "$(cat "$dir/client.out" "$dir/client.log" | tail)"
kill -KILL "${P[0]}"
killed_ms=$(date +%s%3N)
wait "${P[0]}" 2> /dev/null
before=$(grep -c '^ack ' "$dir/client.out")
for ((i = 0; i < 200; i++)); do
  first=$(awk -v k="$killed_ms" '$1 == "ack" && $3 > k { print $3; exit }' "$dir/client.out")
  [ -n "$first" ] && break
  sleep 0.05
done
if [ -n "$first" ]; then
  took=$((first - killed_ms))
  echo "failover: first acknowledged update $took ms after the kill -9"
  if [ "$took" -lt 2000 ]; then ok "kill -9 of the primary: updates go on within 2 s ($took ms)"; else bad "kill -9 of the primary: updates go on within 2 s ($took ms)"; fi
else
  bad "kill -9 of the primary: updates go on" "$(tail "$dir/client.out" "$dir/client.log" "$dir"/ps1.log)"
fi
if repl_wait_status '^shard 0: ps/1 primary \(since epoch'; then
  ok "ps/1 is shard 0's primary in a new epoch"
else
  bad "ps/1 is shard 0's primary in a new epoch" "$out"
fi
# found by the fast path (refused Health/Checks), not by the lease's expiry
if grep -q "ps/0 looks dead (its Health/Check is refused)" "$dir/ps1.log" "$dir/ps2.log"; then
  ok "the kill -9 is found by the refused Health/Checks, not the lease"
else
  bad "the kill -9 is found by the refused Health/Checks, not the lease" \
    "$(grep -h "looks dead" "$dir/ps1.log" "$dir/ps2.log")"
fi
# the ps that won the view's CAS detected the failure: its log has the time
if grep -qE "view epoch [0-9]+: .*\(failover [0-9]+ ms after the failure was detected\)" \
  "$dir/ps1.log" "$dir/ps2.log"; then
  ok "the view change is logged with the failover time"
else
  bad "the view change is logged with the failover time" "$(grep -h view "$dir/ps1.log" "$dir/ps2.log")"
fi

# ---- 3. the killed ps rejoins ----
start_one 0
wait_for "$dir/ps0.out" "ready on" 30 || bad "ps/0 restarts" "$(tail "$dir/ps0.log")"
if repl_wait_status '^shard 0: ps/1 primary.*ps/0 backup' '^shard 2: ps/2 primary.*ps/0 backup'; then
  ok "the restarted ps/0 rejoins and is in sync"
else
  bad "the restarted ps/0 rejoins and is in sync" "$out"
fi
grep -qE "view epoch [0-9]+: .*~" "$dir/ps1.log" "$dir/ps2.log" &&
  ok "it rejoined SYNCING first (a view with a syncing replica)" ||
  bad "it rejoined SYNCING first" "$(grep 'view epoch' "$dir"/ps*.log)"
touch "$dir/stop"
wait "$CPID"; crc=$?
acks=$(grep -c '^ack ' "$dir/client.out")
value=$(awk '$1 == "value" { print $2 }' "$dir/client.out")
if [ "$crc" = 0 ] && [ "$value" = "$acks" ] && [ "$acks" -gt "$before" ]; then
  ok "no acknowledged update lost: $acks acknowledged, the value is $value"
else
  bad "no acknowledged update lost (exit $crc): $acks acknowledged, the value is $value" \
    "$(tail -5 "$dir/client.out" "$dir/client.log")"
fi
out=$(st_ verify 2>&1); r=$?
if [ "$r" = 0 ] && [[ "$out" == *"shard 0: ps/1 ps/0 identical"* ]]; then
  ok "psctl verify: shard 0's replicas are identical"
else
  bad "psctl verify: shard 0's replicas are identical (exit $r)" "$out"
fi

# ---- 4. SIGSTOP of a primary past its lease: fenced, exit 75 ----
kill -STOP "${P[2]}"
if repl_wait_status '^shard 2: ps/0 primary'; then
  ok "SIGSTOP of ps/2: ps/0 becomes shard 2's primary after the lease TTL"
else
  bad "SIGSTOP of ps/2: ps/0 becomes shard 2's primary" "$out"
fi
kill -CONT "${P[2]}"
for ((i = 0; i < 200; i++)); do kill -0 "${P[2]}" 2> /dev/null || break; sleep 0.1; done
wait "${P[2]}"; rc2=$?
if [ "$rc2" = 75 ] && grep -q "ps/2 fenced: " "$dir/ps2.log"; then
  ok "after SIGCONT the old primary is fenced and exits 75"
else
  bad "after SIGCONT the old primary is fenced and exits 75 (exit $rc2)" "$(tail "$dir/ps2.log")"
fi

# ---- 5. a lost shard ----
# shard 2 now lives on ps/0 alone (ps/2 is gone): kill it too
repl_wait_status '^shard 2: ps/0 primary' > /dev/null
kill -KILL "${P[0]}"; wait "${P[0]}" 2> /dev/null
if wait_for "$dir/ps1.log" "shard 2 is lost \(its replicas ps/0 are gone\): restore from the latest checkpoint" 20; then
  ok "a lost shard: ERROR naming it and its replicas"
else
  bad "a lost shard: ERROR naming it and its replicas" "$(tail "$dir/ps1.log")"
fi
grep -q "ERROR.*shard 2 is lost" "$dir/ps1.log" && ok "logged at ERROR" || bad "logged at ERROR" "$(grep lost "$dir/ps1.log")"

# a clean SIGTERM of the last ps: exit 0, its lease revoked
kill -TERM "${P[1]}"; wait "${P[1]}"; r=$?
[ "$r" = 0 ] && ok "SIGTERM: exit 0" || bad "SIGTERM: exit 0 (exit $r)" "$(tail "$dir/ps1.log")"

# ---- 6. tokens: the ps call each other with the "replica" token ----
printf 'worker wtok-1234567890abcdef\nadmin atok-1234567890abcdef\nreplica rtok-1234567890abcdef\n' > "$dir/tokens"
grep -v -e replica -e admin "$dir/tokens" > "$dir/tokens-noreplica"
chmod 600 "$dir/tokens" "$dir/tokens-noreplica"
read -r -a ports < <(pick_ports 2)
echo "{\"ps\": [\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\"]}" > "$dir/tok.json"
expect "--replicas with a token file without a replica token: exit 2" 2 \
  "has no 'replica TOKEN' line" \
  "$PS_SERVER" --cluster "$dir/tok.json" --task 0 --replicas 2 --etcd "$ETCD_ENDPOINTS" \
  --auth-token-file "$dir/tokens-noreplica"
for t in 0 1; do
  : > "$dir/tok$t.out"
  "$PS_SERVER" --cluster "$dir/tok.json" --job ps --task "$t" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job fot --lease-ttl "$TTL" --grace-secs 2 \
    --auth-token-file "$dir/tokens" > "$dir/tok$t.out" 2>> "$dir/tok$t.log" &
  P[$t]=$!
done
wait_for "$dir/tok0.out" "ready on" 30 && wait_for "$dir/tok1.out" "ready on" 30 ||
  bad "2 ps-server --replicas 2 with tokens start" "$(tail -n 5 "$dir"/tok*.log)"
: > "$dir/stop3"; rm -f "$dir/stop3"
PS_AUTH_TOKEN=wtok-1234567890abcdef "$FAILOVER_CLIENT" "$dir/tok.json" "$ETCD_ENDPOINTS" \
  fot 0 counter "$dir/stop3" > "$dir/c3.out" 2> "$dir/c3.log" &
C3=$!
# a Replicate refused for its token would drop ps/1 from shard 0 (and the
# primary would then acknowledge alone): the replicas must stay together
wait_for "$dir/c3.out" "^ack 100 " 60
tst=$(PS_AUTH_TOKEN=atok-1234567890abcdef "$PSCTL" --cluster "$dir/tok.json" \
  --etcd "$ETCD_ENDPOINTS" --repl-job fot --replicas 2 status 2>&1)
if grep -q "^ack 100 " "$dir/c3.out" && ! grep -q "dropping it from shard" "$dir/tok0.log" &&
  grep -qE "^shard 0: ps/0 primary.*ps/1 backup" <<< "$tst"; then
  ok "with tokens, updates are replicated under the replica token and acknowledged"
else
  bad "with tokens, updates are replicated under the replica token" \
    "$tst $(tail -n 5 "$dir/c3.out" "$dir/c3.log" "$dir/tok0.log")"
fi
touch "$dir/stop3"; wait "$C3" 2> /dev/null
# the whole job stops (SIGTERM, one ps after the other): the last replica
# of each shard leaves cleanly, which is no failure to log at ERROR
for t in 0 1; do kill -TERM "${P[$t]}"; wait "${P[$t]}" 2> /dev/null; done
if ! grep -q "ERROR" "$dir/tok0.log" "$dir/tok1.log" &&
  grep -q "INFO ps/1: shard 0 ends: its last replica (ps/1) stopped cleanly" "$dir/tok1.log"; then
  ok "a job that stops: its last replicas leave at INFO, no ERROR"
else
  bad "a job that stops: its last replicas leave at INFO, no ERROR" \
    "$(grep -h -e ERROR -e ends "$dir/tok0.log" "$dir/tok1.log")"
fi
# a client with a short deadline (psctl --timeout-ms 1000, as the chief's
# 2 s heartbeat client) still reads the view when etcd answers late: the
# view's etcd calls get at least 10 s (etcd stopped for 2.5 s; the ps are
# gone, so status then fails on them, not on etcd)
kill -STOP "$ETCD_PID"
(sleep 2.5; kill -CONT "$ETCD_PID") &
cont=$!
slow=$(PS_AUTH_TOKEN=atok-1234567890abcdef "$PSCTL" --cluster "$dir/tok.json" --timeout-ms 1000 \
  --etcd "$ETCD_ENDPOINTS" --repl-job fot --replicas 2 status 2>&1)
wait "$cont"; kill -CONT "$ETCD_PID" 2> /dev/null
if grep -q "view epoch" <<< "$slow" && ! grep -qi "etcd.*deadline" <<< "$slow"; then
  ok "a short client deadline: the view is read from an etcd that answers after 2.5 s"
else
  bad "a short client deadline: the view is read from an etcd that answers after 2.5 s" "$slow"
fi
etcd_stop
finish
