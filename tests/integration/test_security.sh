#!/usr/bin/env bash
# Security through real processes (common/SECURITY.md): certificates and
# tokens from deploy/gen-certs.sh; ps-server with TLS, mutual TLS and
# tokens; psctl, ps-worker and ps-launch as clients; Debian's python3-grpcio
# as a client that is not ours (raw requests, its own TLS).
#  1. flag and file errors, each seen by its message;
#  2. a plaintext client, a client of another CA, and an mTLS client
#     without a certificate are refused;
#  3. every admin RPC refuses a missing, a wrong and a worker token with its
#     code and message, and nothing changes (values, checkpoints, the ps);
#  4. a training job end to end with TLS + client certificates + tokens
#     (ps-launch --secure), the chief on an admin token;
#  5. SIGHUP rotates the certificate and the tokens without a restart;
#  6. --max-checkpoint-bytes refuses a save that would go over, for admins too;
#  7. the same settings from the cluster spec's "security" section.
# Prints "N passed, N failed".
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}; PS_WORKER=${PS_WORKER:?}; PS_LAUNCH=${PS_LAUNCH:?}
GEN_CERTS=${GEN_CERTS:-$(dirname "$0")/../../deploy/gen-certs.sh}
source "$(dirname "$0")/../support/lib.sh"
test_init security
BAD_TAIL=30

C="$dir/certs"; C2="$dir/other"
bash "$GEN_CERTS" --tokens "$C" > "$dir/gen.log" 2>&1 || { bad "gen-certs" "$(cat "$dir/gen.log")"; finish; }
bash "$GEN_CERTS" --tokens "$C2" > "$dir/gen2.log" 2>&1 || { bad "gen-certs (a second CA)" "$(cat "$dir/gen2.log")"; finish; }
TLS=(--tls-cert "$C/server.crt" --tls-key "$C/server.key")
ADMIN=(--tls-ca "$C/ca.crt" --token-file "$C/admin.token")
WORKER=(--tls-ca "$C/ca.crt" --token-file "$C/worker.token")
echo '{"ps": ["127.0.0.1:0"]}' > "$dir/one.json"
spec_of() { echo "{\"ps\": [\"$1\"], \"worker\": [\"127.0.0.1:0\"]}" > "$2"; }
files_bytes() { find "$1" -type f -printf '%s\n' | awk '{ s += $1 } END { print s + 0 }'; }

# ---- 1. flags and files
expect "--tls-cert without --tls-key" 2 "TLS needs both --tls-cert and --tls-key (got only --tls-cert)" \
  "$PS_SERVER" --cluster "$dir/one.json" --tls-cert "$C/server.crt"
expect "--tls-client-ca without a certificate" 2 "--tls-client-ca needs --tls-cert and --tls-key" \
  "$PS_SERVER" --cluster "$dir/one.json" --tls-client-ca "$C/ca.crt"
expect "missing certificate file" 1 "--tls-cert $dir/none.crt: No such file" \
  "$PS_SERVER" --cluster "$dir/one.json" --tls-cert "$dir/none.crt" --tls-key "$C/server.key"
expect "a key that is not a PEM key" 1 "--tls-key $C/server.crt: not a PEM private key" \
  "$PS_SERVER" --cluster "$dir/one.json" --tls-cert "$C/server.crt" --tls-key "$C/server.crt"
expect "key of another certificate" 1 "the key $C2/server.key is not the private key of the certificate $C/server.crt" \
  "$PS_SERVER" --cluster "$dir/one.json" --tls-cert "$C/server.crt" --tls-key "$C2/server.key"
expect "--require-auth without anything" 2 "--require-auth: refusing to start without TLS (--tls-cert, --tls-key) and tokens" \
  "$PS_SERVER" --cluster "$dir/one.json" --require-auth
expect "PS_REQUIRE_AUTH=1 with TLS only" 2 "refusing to start without tokens (--auth-token-file)" \
  env PS_REQUIRE_AUTH=1 "$PS_SERVER" --cluster "$dir/one.json" "${TLS[@]}"
printf 'worker shorttoken\n' > "$dir/short"
expect "a short token" 2 "--auth-token-file $dir/short, line 1: a token must have 16 to 4096 characters" \
  "$PS_SERVER" --cluster "$dir/one.json" --auth-token-file "$dir/short"
printf '# tokens\n\nroot 0123456789abcdef0123\n' > "$dir/badrole"
expect "a bad role, by line" 2 "--auth-token-file $dir/badrole, line 3: role 'root' is not worker, admin or replica" \
  "$PS_SERVER" --cluster "$dir/one.json" --auth-token-file "$dir/badrole"
printf 'admin 0123456789abcdef0123\nworker 0123456789abcdef0123\n' > "$dir/twice"
expect "a token listed twice" 2 "line 2: the same token is listed twice" \
  "$PS_SERVER" --cluster "$dir/one.json" --auth-token-file "$dir/twice"
mkfifo "$dir/fifo"
expect "a FIFO as token file (no hang)" 2 "--auth-token-file $dir/fifo: not a regular file" \
  timeout 10 "$PS_SERVER" --cluster "$dir/one.json" --auth-token-file "$dir/fifo"
printf 'worker 0123456789abcdef0123\000456\n' > "$dir/nul"
expect "a NUL byte in the token file" 2 "--auth-token-file $dir/nul: has a NUL byte" \
  "$PS_SERVER" --cluster "$dir/one.json" --auth-token-file "$dir/nul"
printf '# nothing\n' > "$dir/empty"
expect "no token at all" 2 "--auth-token-file $dir/empty: no token in it" \
  "$PS_SERVER" --cluster "$dir/one.json" --auth-token-file "$dir/empty"
expect "psctl: client certificate without a CA" 2 "needs the CA of the ps certificates too" \
  "$PSCTL" --cluster "$dir/one.json" --tls-cert "$C/client-admin.crt" --tls-key "$C/client-admin.key" status
expect "psctl: a client certificate without its key" 2 "a client certificate needs both --tls-cert and --tls-key" \
  "$PSCTL" --cluster "$dir/one.json" --tls-ca "$C/ca.crt" --tls-cert "$C/client-admin.crt" status
expect "--max-checkpoint-bytes: not a size" 2 "--max-checkpoint-bytes must be a non-negative integer" \
  "$PS_SERVER" --cluster "$dir/one.json" --max-checkpoint-bytes 1X
expect "PS_MAX_CHECKPOINT_BYTES: not a size" 2 "PS_MAX_CHECKPOINT_BYTES must be a non-negative integer" \
  env PS_MAX_CHECKPOINT_BYTES=lots "$PS_SERVER" --cluster "$dir/one.json"
echo '{"ps": ["127.0.0.1:0"], "security": {"ca": 7}}' > "$dir/secnum.json"
expect "spec section: a path that is not a string" 2 "security.ca must be a file path" \
  "$PSCTL" --cluster "$dir/secnum.json" status
expect "psctl: missing token file" 2 "token file $dir/none.token: No such file" \
  "$PSCTL" --cluster "$dir/one.json" --token-file "$dir/none.token" status
expect "ps-launch --secure: a file missing" 2 "--secure $dir/none: $dir/none/ca.crt" \
  "$PS_LAUNCH" --ps 1 --secure "$dir/none"
# the exposure is named when nothing protects the port
start_ps "$dir/one.json" 0 "$dir/open.log"
check "a ps with neither TLS nor tokens warns" has "$dir/open.log" "no TLS and no tokens: anyone who can reach port"
spec_of "$ADDR" "$dir/open.json"
expect "plaintext ps: a TLS client is told" 1 "(the ps does not serve TLS: drop --tls-ca" "$PSCTL" --cluster "$dir/open.json" "${WORKER[@]}" status
kill -TERM "$PID"; wait "$PID"

# ---- 2. TLS, mutual TLS
start_ps "$dir/one.json" 0 "$dir/tls.log" "${TLS[@]}" --auth-token-file "$C/tokens"
TP=$PID; spec_of "$ADDR" "$dir/tls.json"
check "TLS ps logs what protects it" has "$dir/tls.log" "TLS, 2 token(s), 1 admin"
check "TLS ps: gRPC's window probing, the default" has "$dir/tls.log" \
  "HTTP/2 receive windows grow with gRPC's bandwidth-delay probing (the default; --recv-window N fixes them)"
expect "TLS ps: psctl with CA and token" 0 "up vars=0" "$PSCTL" --cluster "$dir/tls.json" "${WORKER[@]}" status
expect "TLS ps: a plaintext client is refused" 1 "Socket closed (if the ps serves TLS, give --tls-ca" "$PSCTL" --cluster "$dir/tls.json" --token-file "$C/worker.token" status
expect "a client sending its token without TLS is warned" 1 "sending a bearer token without TLS" \
  "$PSCTL" --cluster "$dir/tls.json" --token-file "$C/worker.token" status
expect "TLS ps: a client of another CA is refused" 1 "certificate verify failed (the ps certificate is not signed by --tls-ca" \
  "$PSCTL" --cluster "$dir/tls.json" --tls-ca "$C2/ca.crt" --token-file "$C/worker.token" status
expect "TLS ps: the environment instead of flags" 0 "up vars=0" \
  env PS_TLS_CA="$C/ca.crt" PS_TOKEN_FILE="$C/worker.token" "$PSCTL" --cluster "$dir/tls.json" status
expect "TLS ps: the token in PS_AUTH_TOKEN" 0 "up vars=0" \
  env PS_TLS_CA="$C/ca.crt" PS_AUTH_TOKEN="$(cat "$C/worker.token")" "$PSCTL" --cluster "$dir/tls.json" status
# the ps's own environment names: PS_TLS_CERT is a client's certificate
PS_PREFIX="env PS_SERVER_TLS_CERT=$C/server.crt PS_SERVER_TLS_KEY=$C/server.key PS_TLS_CERT=$C/client-worker.crt" \
  start_ps "$dir/one.json" 0 "$dir/envps.log"
spec_of "$ADDR" "$dir/envps.json"
check "ps: TLS from PS_SERVER_TLS_CERT/KEY" has "$dir/envps.log" "TLS, no tokens"
check "ps: TLS from the environment, window probing too" has "$dir/envps.log" "bandwidth-delay probing (the default; --recv-window N fixes them)"
expect "ps: TLS from the environment serves" 0 "up vars=0" "$PSCTL" --cluster "$dir/envps.json" --tls-ca "$C/ca.crt" status
kill -TERM "$PID"; wait "$PID"
start_ps "$dir/one.json" 0 "$dir/mtls.log" "${TLS[@]}" --tls-client-ca "$C/ca.crt"
MP=$PID; spec_of "$ADDR" "$dir/mtls.json"
expect "mTLS ps: a client certificate of the CA" 0 "up vars=0" \
  "$PSCTL" --cluster "$dir/mtls.json" --tls-ca "$C/ca.crt" --tls-cert "$C/client-worker.crt" --tls-key "$C/client-worker.key" status
expect "mTLS ps: no client certificate is refused" 1 "UNAVAILABLE" \
  "$PSCTL" --cluster "$dir/mtls.json" --tls-ca "$C/ca.crt" status
expect "mTLS ps: a certificate of another CA is refused" 1 "UNAVAILABLE" \
  "$PSCTL" --cluster "$dir/mtls.json" --tls-ca "$C/ca.crt" --tls-cert "$C2/client-worker.crt" --tls-key "$C2/client-worker.key" status
check "mTLS without tokens warns" has "$dir/mtls.log" "TLS without tokens: every client with a certificate of --tls-client-ca may do everything"
kill -TERM "$MP"; wait "$MP"
# gRPC's own listener serves TLS: the monitor still finds its connections
# and holds --max-connections (5 raw connections to a limit of 2: 3 shut)
start_ps "$dir/one.json" 0 "$dir/conns.log" "${TLS[@]}" --max-connections 2
CP=$PID
# python: N raw TCP connections to HOST:PORT, and how many the ps closed
raw_conns_py='
from rawgrpc import open_raw, closed
'
conns_py=$raw_conns_py'
import sys, time
socks = open_raw(sys.argv[1], 5)
for _ in range(100):  # the monitor looks every 0.2 s with TLS: up to 10 s
    if closed(socks) >= 3:
        break
    time.sleep(0.1)
time.sleep(1.5)  # and no more than 3 after more looks
print("closed", closed(socks))
'
expect "TLS ps: --max-connections holds (3 of 5 shut)" 0 "closed 3" /usr/bin/python3 -c "$conns_py" "$ADDR"
check "TLS ps: the limit is logged" has "$dir/conns.log" "2 connections open (--max-connections): closing new ones"
kill -TERM "$CP"; wait "$CP"
# with tokens, a connection that makes no call with a valid token within
# 10 s is shut (3 raw connections), one that did keeps its slot
start_ps "$dir/one.json" 0 "$dir/idle.log" --auth-token-file "$C/tokens"
IP=$PID
idle_py=$raw_conns_py'
import grpc, sys, time
addr, tok = sys.argv[1], sys.argv[2]
ch = grpc.insecure_channel(addr)
status = ch.unary_unary("/paramserver.Ps/Status", request_serializer=lambda b: b,
                        response_deserializer=lambda b: b)
status(b"", metadata=[("authorization", "Bearer " + tok)], timeout=10)
# a Watch on the same connection ends if the ps shuts it
from rawgrpc import watch_health
ended = watch_health(ch)
socks = open_raw(addr, 3)
t0 = time.time()
while closed(socks) < 3 and time.time() - t0 < 20:
    time.sleep(0.1)
time.sleep(1)
print("closed", closed(socks), "after", 10 if time.time() - t0 >= 9 else 0,
      "watch", ended[0] if ended else "open")
'
expect "tokens: idle connections without a valid call are shut after 10 s, a worker's stays" 0 \
  "closed 3 after 10 watch open" /usr/bin/python3 -c "$idle_py" "$ADDR" "$(cat "$C/worker.token")"
check "tokens: the shut connections are logged" has "$dir/idle.log" "connection(s) that made no call with a valid token within 10 s"
kill -TERM "$IP"; wait "$IP"
# gRPC's TLS listener gave up for good once out of descriptors: the ps
# accepts TLS connections itself now and hands them to gRPC, so after 300
# connections at once on 128 descriptors a new client gets in (the limit
# still keeps half of them free)
(ulimit -n 128; exec "$PS_SERVER" --cluster "$dir/one.json" "${TLS[@]}" > "$dir/fd.out" 2> "$dir/fd.log") &
FP=$!
wait_for "$dir/fd.out" "ready on" 30
check "TLS ps: the connection limit keeps half the descriptors free" has "$dir/fd.log" "at most 48 connections; TLS"
/usr/bin/python3 -c '
import socket, sys, time
host, port = sys.argv[1].rsplit(":", 1)
socks = []
for _ in range(300):
    try:
        socks.append(socket.create_connection((host, int(port)), timeout=1))
    except OSError:
        pass
time.sleep(int(sys.argv[2]))
' "$(awk '{print $NF}' "$dir/fd.out")" 10 &
HOLD=$!
wait_for "$dir/fd.log" "48 connections open" 15
FADDR=$(awk '{print $NF}' "$dir/fd.out")
spec_of "$FADDR" "$dir/fd.json"
kill "$HOLD" 2> /dev/null; wait "$HOLD" 2> /dev/null
expect "TLS ps: a client gets in after 300 connections flooded it" 0 "ps/0" \
  "$PSCTL" --cluster "$dir/fd.json" --tls-ca "$C/ca.crt" status
check "TLS ps: no listener stopped" test "$(grep -c 'accepts no more' "$dir/fd.log")" = 0
kill -TERM "$FP"; wait "$FP"

# ---- 3. roles: a job leaves variables and a checkpoint behind
ck="$dir/ck"; mkdir -p "$ck"
kill -TERM "$TP"; wait "$TP"
start_ps "$dir/one.json" 0 "$dir/roles.log" "${TLS[@]}" --auth-token-file "$C/tokens" --checkpoint-dir "$ck"
RP=$PID; spec_of "$ADDR" "$dir/roles.json"
"$PS_WORKER" --cluster "$dir/roles.json" --job worker --task 0 --model linreg --steps 20 --log-every 10 \
  --checkpoint-dir "$ck" --keep-ps "${ADMIN[@]}" > "$dir/w.out" 2> "$dir/w.err"
check "an admin-token chief trains and saves over TLS" has "$dir/w.out" "checkpoint $ck/model.ckpt-20"
"$PS_WORKER" --cluster "$dir/roles.json" --job worker --task 0 --model linreg --steps 30 --log-every 10 \
  --checkpoint-dir "$ck" --keep-ps "${WORKER[@]}" > "$dir/w2.out" 2> "$dir/w2.err"
# a chief restarting on a live cluster re-initializes the coordinator's
# counters, the first admin act of a chief
check "a worker-token chief is refused: PERMISSION_DENIED" has "$dir/w2.err" "re-initializing it needs an admin token (this call's token has the worker role)"
values() { for v in global_step linear/kernel linear/bias; do "$PSCTL" --cluster "$dir/roles.json" "${ADMIN[@]}" read "$v" 2>&1; done; }
before_vals=$(values)
before_ck=$(ls -l --time-style=+%s.%N "$ck" | md5sum)
# the same RPCs as raw requests from python3-grpcio, over its own TLS
roles_py='
import grpc, sys
addr, ca, tok = sys.argv[1], open(sys.argv[2], "rb").read(), sys.argv[3]
ch = grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates=ca))
ident = lambda b: b
# method -> a real request: every variable (Initialize of initialized ones,
# the issue'"'"'s 0-byte attack), a snapshot id, a checkpoint prefix...
reqs = {"Initialize": b"", "Snapshot": b"\x08\x07", "Release": b"\x08\x07",
        "Save": b"\x12\x04evil\x18\x00\x20\x01", "Merge": b"\x0a\x04evil\x10\x01",
        "Restore": b"\x0a\x0dmodel.ckpt-20", "Delete": b"\x0a\x0dlinear/kernel",
        "Shutdown": b"\x0a\x04evil"}
md = [] if tok == "-" else [("authorization", "Bearer " + tok)]
for m, body in reqs.items():
    call = ch.unary_unary("/paramserver.Ps/" + m, request_serializer=ident, response_deserializer=ident)
    try:
        call(body, metadata=md, timeout=10)
        print(m, "OK")
    except grpc.RpcError as e:
        print(m, e.code().name, e.details())
'
if /usr/bin/python3 -c 'import grpc' 2> /dev/null; then
  for who in missing wrong worker; do
    case $who in
      missing) tok=- want="UNAUTHENTICATED %s: no bearer token" ;;
      wrong) tok=0123456789abcdef0123456789abcdef want="UNAUTHENTICATED %s: the bearer token is not one of this ps's tokens" ;;
      worker) tok=$(cat "$C/worker.token") want="PERMISSION_DENIED %s needs an admin token; this call's token has the worker role" ;;
    esac
    out=$(/usr/bin/python3 -c "$roles_py" "$ADDR" "$C/ca.crt" "$tok" 2>&1)
    for m in Snapshot Release Save Merge Restore Delete Shutdown; do
      # shellcheck disable=SC2059
      w=$(printf "$want" "$m")
      [[ "$out" == *"$m $w"* ]] && ok "$who token: $m refused" || bad "$who token: $m refused (want '$w')" "$out"
    done
    if [ $who = worker ]; then
      w="already holds a value; re-initializing it needs an admin token (this call's token has the worker role)"
    else
      w="Initialize $(printf "$want" Initialize)"
    fi
    [[ "$out" == *"$w"* ]] && ok "$who token: re-Initialize refused" || bad "$who token: re-Initialize refused (want '$w')" "$out"
  done
else
  bad "python3-grpcio" "not installed (deploy/setup.sh installs it)"
fi
# A caller without a token cannot make the ps buffer its request: the
# message is read only after the token checks out (8 calls of 30 MiB each,
# refused; the ps's peak memory grows by far less than their 240 MiB).
hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
flood_py='
import grpc, sys, threading
addr, ca = sys.argv[1], open(sys.argv[2], "rb").read()
ch = grpc.secure_channel(addr, grpc.ssl_channel_credentials(root_certificates=ca),
                         options=[("grpc.max_send_message_length", -1)])
call = ch.unary_unary("/paramserver.Ps/Update", request_serializer=lambda b: b,
                      response_deserializer=lambda b: b)
body = b"\x0a" + b"\x00" * (30 << 20)
out = []
def one():
    try:
        call(body, timeout=30)
        out.append("OK")
    except grpc.RpcError as e:
        out.append(e.code().name)
ts = [threading.Thread(target=one) for _ in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print(" ".join(sorted(out)))
'
if /usr/bin/python3 -c 'import grpc' 2> /dev/null; then
  # its own ps: under AddressSanitizer, freed memory waits in a quarantine
  # (256 MB) and would count as peak; a small one keeps the figure honest
  PS_PREFIX="env ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=4" \
    start_ps "$dir/one.json" 0 "$dir/mem.log" "${TLS[@]}" --auth-token-file "$C/tokens"
  h0=$(hwm "$PID")
  expect "no token: 8 calls of 30 MiB refused" 0 "$(printf 'UNAUTHENTICATED %.0s' 1 2 3 4 5 6 7 8 | sed 's/ $//')" \
    /usr/bin/python3 -c "$flood_py" "$ADDR" "$C/ca.crt"
  h1=$(hwm "$PID")
  check "no token: the ps did not buffer them (peak +$((h1 - h0)) kB)" test $((h1 - h0)) -lt 65536
  kill -TERM "$PID"; wait "$PID"
fi
expect "worker token: psctl save refused" 1 "PERMISSION_DENIED: Snapshot needs an admin token" "$PSCTL" --cluster "$dir/roles.json" "${WORKER[@]}" save
expect "worker token: psctl rm refused" 1 "PERMISSION_DENIED: Delete needs an admin token" "$PSCTL" --cluster "$dir/roles.json" "${WORKER[@]}" rm linear/kernel
expect "worker token: psctl restore refused" 1 "PERMISSION_DENIED: Restore needs an admin token" "$PSCTL" --cluster "$dir/roles.json" "${WORKER[@]}" restore
expect "worker token: psctl shutdown refused" 1 "PERMISSION_DENIED: Shutdown needs an admin token" "$PSCTL" --cluster "$dir/roles.json" "${WORKER[@]}" shutdown
expect "worker token: lists and reads" 0 "linear/kernel" "$PSCTL" --cluster "$dir/roles.json" "${WORKER[@]}" vars
after_vals=$(values)
after_ck=$(ls -l --time-style=+%s.%N "$ck" | md5sum)
check "refused calls changed no value" test "$before_vals" = "$after_vals"
check "refused calls changed no checkpoint" test "$before_ck" = "$after_ck"
check "the ps is still up" kill -0 "$RP"
check "refused calls are logged" has "$dir/roles.log" "WARN ps/0: refused [0-9]* call(s) for their token in the last 10 s; the last from ipv"
if grep -qF -- "$(cat "$C/worker.token")" "$dir/roles.log" || grep -qF -- "$(cat "$C/admin.token")" "$dir/roles.log"; then
  bad "no token in the ps log"
else
  ok "no token in the ps log"
fi

# ---- 6. the checkpoint quota holds for admins too
kill -TERM "$RP"; wait "$RP"
start_ps "$dir/one.json" 0 "$dir/quota.log" "${TLS[@]}" --auth-token-file "$C/tokens" --checkpoint-dir "$ck" \
  --max-checkpoint-bytes "$(files_bytes "$ck")"
QP=$PID; spec_of "$ADDR" "$dir/quota.json"
# the chief restores the variables (step 20 already: it trains no more)
"$PS_WORKER" --cluster "$dir/quota.json" --job worker --task 0 --model linreg --steps 20 \
  --checkpoint-dir "$ck" --keep-ps "${ADMIN[@]}" > "$dir/wq.out" 2> "$dir/wq.err"
check "quota: the chief restored" has "$dir/wq.err" "cluster ready (restored) at global step 20"
before_ck=$(ls -l --time-style=+%s.%N "$ck" | md5sum)
expect "--max-checkpoint-bytes: an admin save over the quota is refused" 1 \
  "RESOURCE_EXHAUSTED: Save of $ck/model.ckpt-20" "$PSCTL" --cluster "$dir/quota.json" "${ADMIN[@]}" save
expect "... naming the limit" 1 "more than --max-checkpoint-bytes" "$PSCTL" --cluster "$dir/quota.json" "${ADMIN[@]}" save
check "--max-checkpoint-bytes: nothing written" test "$before_ck" = "$(ls -l --time-style=+%s.%N "$ck" | md5sum)"
kill -TERM "$QP"; wait "$QP"
# saves at once cannot all pass the check: a 100 KB model, room for one
# more checkpoint's data and a half, four saves together: one succeeds
ckq="$dir/ckq"; mkdir -p "$ckq"
start_ps "$dir/one.json" 0 "$dir/quota2.log" "${TLS[@]}" --auth-token-file "$C/tokens" --checkpoint-dir "$ckq"
QP=$PID; spec_of "$ADDR" "$dir/quota2.json"
"$PS_WORKER" --cluster "$dir/quota2.json" --job worker --task 0 --model mlp --hidden 32 --steps 5 \
  --checkpoint-dir "$ckq" --keep-ps "${ADMIN[@]}" > "$dir/wq2.out" 2> "$dir/wq2.err"
data=$(find "$ckq" -name '*.data-*' -printf '%s\n' | head -1)
quota=$(($(files_bytes "$ckq") + data * 3 / 2))
kill -TERM "$QP"; wait "$QP"
start_ps "$dir/one.json" 0 "$dir/quota3.log" "${TLS[@]}" --auth-token-file "$C/tokens" --checkpoint-dir "$ckq" \
  --max-checkpoint-bytes "$quota"
QP=$PID; spec_of "$ADDR" "$dir/quota3.json"
"$PS_WORKER" --cluster "$dir/quota3.json" --job worker --task 0 --model mlp --hidden 32 --steps 5 \
  --checkpoint-dir "$ckq" --keep-ps "${ADMIN[@]}" > "$dir/wq3.out" 2> "$dir/wq3.err"
for k in 1 2 3 4; do
  "$PSCTL" --cluster "$dir/quota3.json" "${ADMIN[@]}" --max-to-keep -1 save "at$k" > "$dir/qs$k.out" 2>&1 &
  eval "qs$k=\$!"
done
saved=0
for k in 1 2 3 4; do
  eval "wait \$qs$k" && saved=$((saved + 1))
done
check "--max-checkpoint-bytes: 1 of 4 saves at once passes ($saved; $(data=0; cat "$dir"/qs*.out | tr '\n' ' ' | cut -c1-300))" test "$saved" = 1
check "--max-checkpoint-bytes: the directory stays within it plus an index ($(files_bytes "$ckq") of $quota)" \
  test "$(files_bytes "$ckq")" -le $((quota + 8192))
kill -TERM "$QP"; wait "$QP"

# ---- 5. SIGHUP: a new certificate (another CA) and a new token file
R="$dir/rot"; mkdir -p "$R"
cp "$C/server.crt" "$C/server.key" "$C/tokens" "$R/"
start_ps "$dir/one.json" 0 "$dir/rot.log" --tls-cert "$R/server.crt" --tls-key "$R/server.key" --auth-token-file "$R/tokens"
HP=$PID; spec_of "$ADDR" "$dir/rot.json"
expect "rotation: the first CA works" 0 "up" "$PSCTL" --cluster "$dir/rot.json" "${WORKER[@]}" status
printf 'garbage\n' > "$R/server.crt"
kill -HUP "$HP"
wait_for "$dir/rot.log" "SIGHUP: kept the old TLS certificate" 10
check "rotation: a bad certificate is refused, the old one kept" has "$dir/rot.log" "SIGHUP: kept the old TLS certificate: --tls-cert $R/server.crt: not a PEM certificate"
expect "rotation: still serving the old one" 0 "up" "$PSCTL" --cluster "$dir/rot.json" "${WORKER[@]}" status
cp "$C2/server.crt" "$C2/server.key" "$R/"
cp "$C2/tokens" "$R/tokens"
kill -HUP "$HP"
# the first SIGHUP reloaded the tokens too: wait for this one's lines
wait_count "$dir/rot.log" "SIGHUP: 2 token\(s\) reloaded" 2 10
check "rotation: logged" has "$dir/rot.log" "SIGHUP: TLS certificate reloaded"
expect "rotation: the new CA and token work" 0 "up" \
  "$PSCTL" --cluster "$dir/rot.json" --tls-ca "$C2/ca.crt" --token-file "$C2/worker.token" status
expect "rotation: the old CA no longer verifies" 1 "UNAVAILABLE" "$PSCTL" --cluster "$dir/rot.json" --tls-ca "$C/ca.crt" --token-file "$C2/worker.token" status
expect "rotation: the old token is refused" 1 "UNAUTHENTICATED" \
  "$PSCTL" --cluster "$dir/rot.json" --tls-ca "$C2/ca.crt" --token-file "$C/worker.token" status
check "rotation: the same process" kill -0 "$HP"
kill -TERM "$HP"; wait "$HP"

# ---- 7. the same settings from the cluster spec's "security" section
cat > "$dir/secspec.json" << EOF
{"ps": ["127.0.0.1:0"], "worker": ["127.0.0.1:0"],
 "security": {"server_cert": "$C/server.crt", "server_key": "$C/server.key",
              "client_ca": "$C/ca.crt", "auth_token_file": "$C/tokens", "require_auth": true,
              "ca": "$C/ca.crt", "client_cert": "$C/client-worker.crt",
              "client_key": "$C/client-worker.key", "token_file": "$C/worker.token",
              "admin_token_file": "$C/admin.token"}}
EOF
start_ps "$dir/secspec.json" 0 "$dir/secspec.log"
SP=$PID
check "spec section: the ps serves mTLS with tokens" has "$dir/secspec.log" "TLS with client certificates, 2 token(s), 1 admin"
sed "s/\"ps\": \[\"127.0.0.1:0\"\]/\"ps\": [\"$ADDR\"]/" "$dir/secspec.json" > "$dir/secspec2.json"
expect "spec section: psctl needs no flag" 0 "up vars=0" "$PSCTL" --cluster "$dir/secspec2.json" status
expect "spec section: psctl acts as admin" 0 "shutting down" "$PSCTL" --cluster "$dir/secspec2.json" shutdown
wait "$SP"
sed 's/"require_auth": true/"require_auth": true, "tls_ca": "x"/' "$dir/secspec.json" > "$dir/badsec.json"
expect "spec section: an unknown key" 2 "security: unknown key \"tls_ca\"" "$PS_SERVER" --cluster "$dir/badsec.json"
sed 's/"require_auth": true/"require_auth": "yes"/' "$dir/secspec.json" > "$dir/badsec2.json"
expect "spec section: require_auth not a boolean" 2 "security.require_auth must be true or false" "$PSCTL" --cluster "$dir/badsec2.json" status

# ---- 4. a training job end to end: TLS, client certificates, tokens
ck4="$dir/ck4"; mkdir -p "$ck4"
"$PS_LAUNCH" --ps 2 --workers 2 --secure "$C" --ps-arg "--checkpoint-dir=$ck4" -- \
  "$PS_WORKER" --model mlp --hidden 32 --batch 50 --log-every 50 --steps 200 --checkpoint-dir "$ck4" \
  > "$dir/job.out" 2> "$dir/job.err"
rc=$?
check "secure job: exits 0 ($rc)" test "$rc" = 0
check "secure job: the ps serve TLS with client certificates and tokens" \
  has "$dir/job.err" "ps/0: .*TLS with client certificates, 2 token(s), 1 admin"
check "secure job: the worker joined" has "$dir/job.err" "worker/1: .*cluster ready (joined)"
check "secure job: a final checkpoint" bash -c "ls '$ck4' | grep -q 'model.ckpt-2[0-9][0-9].index'"
check "secure job: test accuracy" grep -q "worker/0: test accuracy" "$dir/job.out"
finish
