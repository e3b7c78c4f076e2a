#!/usr/bin/env bash
# Replication under TLS and tokens (issue 23, DESIGN.md "Replication",
# "Calls between replicas"): a real etcd, real ps-server --replicas 2
# serving TLS (deploy/gen-certs.sh) with a token file holding a
# "replica" role, and failover_client updating shard 0 over TLS.
#  1. 3 ps start and replicate under TLS; kill -9 of shard 0's primary:
#     its backup takes over, no acknowledged update lost, psctl verify
#     (over TLS, admin token) says the replicas are identical; no ps
#     opens a replication link (it would carry the data in the clear).
#  2. a ps whose replica token has the worker role on its backup: every
#     Replicate is refused PERMISSION_DENIED naming the role, the primary
#     logs it and drops the backup, the backup holds nothing.
#  3. a ps that does not trust the backup's certificate (PS_TLS_CA of
#     another CA): the Replicate fails on the certificate, logged, and the
#     backup holds nothing.
# (test_failover.sh covers a token file with no replica token at all.)
set -u
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
source "$(dirname "$0")/../support/repl.sh"
test_init repl_tls
GEN_CERTS=${GEN_CERTS:-$(dirname "$0")/../../deploy/gen-certs.sh}
TTL=2
C="$dir/c"
C2="$dir/c2"
bash "$GEN_CERTS" --tokens "$C" > "$dir/gen.log" 2>&1 || { bad "gen-certs" "$(cat "$dir/gen.log")"; finish; exit 1; }
bash "$GEN_CERTS" "$C2" > "$dir/gen2.log" 2>&1 || { bad "gen-certs (another CA)" "$(cat "$dir/gen2.log")"; finish; exit 1; }
RTOK=rtok-1234567890abcdef
cp "$C/tokens" "$dir/tokens"
echo "replica $RTOK" >> "$dir/tokens"
# the same token, but with the worker role: a backup with this file
# refuses Replicate from a ps that sends it as its replica token
grep -v '^replica ' "$C/tokens" > "$dir/tokens-worker"
echo "worker $RTOK" >> "$dir/tokens-worker"
chmod 600 "$dir/tokens" "$dir/tokens-worker"
TLS=(--tls-cert "$C/server.crt" --tls-key "$C/server.key")
export PS_RPC_TIMEOUT=20

etcd_start repl_tls || { bad "etcd starts"; finish; exit 1; }

declare -a P
# start_one SPEC JOB T TOKENS CA: ps/T of SPEC under TLS; P[T] its pid
start_one() {
  : > "$dir/$2$3.out"
  env PS_TLS_CA="$5" "$PS_SERVER" --cluster "$1" --job ps --task "$3" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job "$2" --lease-ttl "$TTL" --grace-secs 2 \
    "${TLS[@]}" --auth-token-file "$4" > "$dir/$2$3.out" 2>> "$dir/$2$3.log" &
  P[$3]=$!
}
# start_all SPEC JOB N TOKENS... CA...: N ps of JOB, ps/T with the Tth
# token file and CA
start_all() {
  local spec=$1 job=$2 n=$3
  shift 3
  local -a tok=("${@:1:n}") ca=("${@:n+1:n}")
  repl_start_one() { start_one "$spec" "$job" "$1" "${tok[$1]}" "${ca[$1]}"; }
  repl_start "$n" "$spec" "$job"
}
# pst_ SPEC JOB CMD: psctl over TLS with the admin token
pst_() {
  "$PSCTL" --cluster "$1" --etcd "$ETCD_ENDPOINTS" --repl-job "$2" --replicas 2 \
    --timeout-ms 5000 --tls-ca "$C/ca.crt" --token-file "$C/admin.token" "${@:3}"
}
# wait_status SPEC JOB REGEX...: until psctl status matches every REGEX (20 s)
wait_status() {
  local spec=$1 job=$2
  shift 2
  st_() { "$PSCTL" --cluster "$spec" --etcd "$ETCD_ENDPOINTS" --repl-job "$job" --replicas 2 \
    --timeout-ms 5000 --tls-ca "$C/ca.crt" --token-file "$C/admin.token" "$@"; }
  repl_wait_status "$@"
}
# client SPEC JOB STOPFILE OUT: failover_client on shard 0 over TLS
client() {
  env PS_TLS_CA="$C/ca.crt" PS_TOKEN_FILE="$C/worker.token" "$FAILOVER_CLIENT" "$1" \
    "$ETCD_ENDPOINTS" "$2" 0 counter "$3" > "$4.out" 2> "$4.log" &
  CPID=$!
}

# ---- 1. TLS between replicas; kill -9 of a primary ----
S="$dir/tls.json"
if start_all "$S" tls 3 "$dir/tokens" "$dir/tokens" "$dir/tokens" \
  "$C/ca.crt" "$C/ca.crt" "$C/ca.crt"; then
  ok "3 ps-server --replicas 2 with TLS and tokens start"
else
  bad "3 ps-server --replicas 2 with TLS and tokens start" "$(tail -n 5 "$dir"/tls*.log)"
  finish; exit 1
fi
grep -q "TLS, 3 token(s)" "$dir/tls0.log" && ok "the ps logs that TLS and 3 tokens protect it" ||
  bad "the ps logs that TLS and 3 tokens protect it" "$(head -n 5 "$dir/tls0.log")"
if wait_status "$S" tls '^shard 0: ps/0 primary.*ps/1 backup' '^shard 1: ps/1 primary.*ps/2 backup' \
  '^shard 2: ps/2 primary.*ps/0 backup'; then
  ok "psctl status over TLS: every shard has its primary and in-sync backup"
else
  bad "psctl status over TLS: every shard has its primary and in-sync backup" "$out"
fi
client "$S" tls "$dir/stop1" "$dir/c1"
if wait_for "$dir/c1.out" "^ack 100 " 60; then
  ok "updates are acknowledged under TLS"
else
  bad "updates are acknowledged under TLS" "$(tail -n 5 "$dir/c1.out" "$dir/c1.log" "$dir/tls0.log")"
fi
if grep -q "replication to ps/1 failed" "$dir/tls0.log"; then
  bad "no Replicate to the backup failed" "$(grep "replication to" "$dir/tls0.log")"
else
  ok "no Replicate to the backup failed"
fi
# the replication link would carry the batches in the clear: none under TLS
if grep -q "replication link on port" "$dir"/tls[012].log; then
  bad "under TLS no ps opens a replication link" "$(grep -h "replication link" "$dir"/tls[012].log)"
else
  ok "under TLS no ps opens a replication link"
fi
kill -KILL "${P[0]}"
killed_ms=$(date +%s%3N)
wait "${P[0]}" 2> /dev/null
before=$(grep -c '^ack ' "$dir/c1.out")
first=""
for ((i = 0; i < 200; i++)); do
  first=$(awk -v k="$killed_ms" '$1 == "ack" && $3 > k { print $3; exit }' "$dir/c1.out")
  [ -n "$first" ] && break
  kill -0 "$CPID" 2> /dev/null || break
  sleep 0.05
done
if [ -n "$first" ]; then
  ok "kill -9 of the primary under TLS: updates go on ($((first - killed_ms)) ms)"
else
  bad "kill -9 of the primary under TLS: updates go on" "$(tail -n 5 "$dir/c1.out" "$dir/c1.log" "$dir/tls1.log")"
fi
if wait_status "$S" tls '^shard 0: ps/1 primary \(since epoch'; then
  ok "ps/1 is shard 0's primary in a new epoch"
else
  bad "ps/1 is shard 0's primary in a new epoch" "$out"
fi
touch "$dir/stop1"
wait "$CPID"; crc=$?
acks=$(grep -c '^ack ' "$dir/c1.out")
value=$(awk '$1 == "value" { print $2 }' "$dir/c1.out")
if [ "$crc" = 0 ] && [ "$value" = "$acks" ] && [ "$acks" -gt "$before" ]; then
  ok "no acknowledged update lost under TLS: $acks acknowledged, the value is $value"
else
  bad "no acknowledged update lost under TLS (exit $crc): $acks acknowledged, the value is $value" \
    "$(tail -n 5 "$dir/c1.out" "$dir/c1.log")"
fi
# the killed ps comes back over TLS and copies its shards
start_one "$S" tls 0 "$dir/tokens" "$C/ca.crt"
wait_for "$dir/tls0.out" "ready on" 30 || bad "ps/0 restarts" "$(tail "$dir/tls0.log")"
if wait_status "$S" tls '^shard 0: ps/1 primary.*ps/0 backup' '^shard 2: ps/2 primary.*ps/0 backup'; then
  ok "the restarted ps/0 copies its shards over TLS and is in sync"
else
  bad "the restarted ps/0 copies its shards over TLS and is in sync" "$out"
fi
out=$(pst_ "$S" tls verify 2>&1); r=$?
if [ "$r" = 0 ] && [[ "$out" == *"shard 0: ps/1 ps/0 identical"* ]]; then
  ok "psctl verify over TLS: shard 0's replicas are identical"
else
  bad "psctl verify over TLS: shard 0's replicas are identical (exit $r)" "$out"
fi
for t in 0 1 2; do kill -TERM "${P[$t]}"; wait "${P[$t]}" 2> /dev/null; done

# ---- 2. the replica token has the worker role on the backup ----
S="$dir/role.json"
if start_all "$S" role 2 "$dir/tokens" "$dir/tokens-worker" "$C/ca.crt" "$C/ca.crt"; then
  ok "2 ps start, the backup with the replica token as a worker token"
else
  bad "2 ps start, the backup with the replica token as a worker token" "$(tail -n 5 "$dir"/role*.log)"
  finish; exit 1
fi
client "$S" role "$dir/stop2" "$dir/c2"
want="Replicate needs a replica or admin token; this call's token has the worker role"
if wait_for "$dir/role0.log" "replication to ps/1 failed: .*$want" 30; then
  ok "a replica token with the worker role is refused: the primary logs why"
else
  bad "a replica token with the worker role is refused: the primary logs why" \
    "$(tail -n 5 "$dir/role0.log" "$dir/c2.log")"
fi
wait_for "$dir/c2.out" "^ack 20 " 30 || bad "the primary acknowledges without the refused backup" "$(tail -n 3 "$dir/c2.out" "$dir/c2.log")"
touch "$dir/stop2"; wait "$CPID" 2> /dev/null
out=$(env PS_TLS_CA="$C/ca.crt" PS_TOKEN_FILE="$C/admin.token" "$PSCTL" --cluster "$S" status 2>&1)
if grep -qE "ps/1 .*up vars=0" <<< "$out" && grep -qE "ps/0 .*up vars=1" <<< "$out"; then
  ok "the refused backup holds nothing, the primary holds the variable"
else
  bad "the refused backup holds nothing, the primary holds the variable" "$out"
fi
for t in 0 1; do kill -TERM "${P[$t]}"; wait "${P[$t]}" 2> /dev/null; done

# ---- 3. a primary that does not trust its backup's certificate ----
S="$dir/ca.json"
if start_all "$S" ca 2 "$dir/tokens" "$dir/tokens" "$C2/ca.crt" "$C/ca.crt"; then
  ok "2 ps start, ps/0 with the CA of another certificate set"
else
  bad "2 ps start, ps/0 with the CA of another certificate set" "$(tail -n 5 "$dir"/ca*.log)"
  finish; exit 1
fi
client "$S" ca "$dir/stop3" "$dir/c3"
if wait_for "$dir/ca0.log" "replication to ps/1 failed: .*certificate verify failed" 30; then
  ok "a backup certificate not signed by PS_TLS_CA: the Replicate fails, logged"
else
  bad "a backup certificate not signed by PS_TLS_CA: the Replicate fails, logged" \
    "$(tail -n 5 "$dir/ca0.log" "$dir/c3.log")"
fi
wait_for "$dir/c3.out" "^ack 20 " 30 || bad "the primary acknowledges without the untrusted backup" "$(tail -n 3 "$dir/c3.out" "$dir/c3.log")"
touch "$dir/stop3"; wait "$CPID" 2> /dev/null
# ps/0's Health/Checks of ps/1 fail their handshake too: a
# misconfiguration, no proof of death.  ps/1 must stay in the view and
# serve (it used to be removed and fenced, exit 75)
if wait_for "$dir/ca0.log" "WARN ps/0: cannot check ps/1 at .*certificate verify failed.*it is not taken for dead" 10 &&
  ! grep -q "ps/1 looks dead" "$dir/ca0.log" && kill -0 "${P[1]}" 2> /dev/null; then
  ok "a Check that fails its handshake: WARN, the healthy peer stays"
else
  bad "a Check that fails its handshake: WARN, the healthy peer stays" \
    "$(grep -h -e "cannot check" -e "looks dead" -e fenced "$dir/ca0.log" "$dir/ca1.log")"
fi
kill -TERM "${P[1]}" 2> /dev/null; wait "${P[1]}"; r1=$?
kill -TERM "${P[0]}" 2> /dev/null; wait "${P[0]}" 2> /dev/null
[ "$r1" = 0 ] && ok "the untrusted backup was not fenced: SIGTERM, exit 0" ||
  bad "the untrusted backup was not fenced: SIGTERM, exit 0 (exit $r1)" "$(tail -n 5 "$dir/ca1.log")"
if grep -q "stopped (0 variables, 0 bytes released)" "$dir/ca1.log"; then
  ok "the untrusted backup held nothing"
else
  bad "the untrusted backup held nothing" "$(tail -n 5 "$dir/ca1.log")"
fi
etcd_stop
finish
