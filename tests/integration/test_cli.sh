#!/usr/bin/env bash
# CLI tests: ps-server, psctl and ps-demo through real processes on
# 127.0.0.1 with kernel-picked ports.  Every error a user can reach from the
# command line is checked by its message.  Prints "N passed, N failed".
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}; PS_DEMO=${PS_DEMO:?}
source "$(dirname "$0")/../support/lib.sh"
test_init cli

expect "ps-server --help" 0 "usage: ps-server" "$PS_SERVER" --help
expect "ps-server --version" 0 "ps-server 0." "$PS_SERVER" --version
expect "psctl --help" 0 "usage: psctl" "$PSCTL" --help
expect "psctl --version" 0 "psctl 0." "$PSCTL" --version
expect "ps-server bad flag" 2 "usage:" "$PS_SERVER" --frobnicate
expect "ps-server bad task" 2 "--task must be a non-negative integer" "$PS_SERVER" --task x
expect "psctl unknown command" 2 "unknown command 'frob'" "$PSCTL" --cluster /dev/null frob
expect "psctl no command" 2 "no command given" "$PSCTL"

# Bad cluster specs: named file, what is wrong, no crash.
expect "missing spec file" 2 "cluster spec $dir/none.json" "$PS_SERVER" --cluster "$dir/none.json" --job ps --task 0
echo '{"ps": ["127.0.0.1:0",]' > "$dir/badjson.json"
expect "invalid JSON" 2 "$dir/badjson.json: invalid JSON" "$PS_SERVER" --cluster "$dir/badjson.json" --job ps --task 0
echo '{"ps": ["localhost"]}' > "$dir/noport.json"
expect "address without port" 2 "is not host:port" "$PS_SERVER" --cluster "$dir/noport.json" --job ps --task 0
echo '["127.0.0.1:1"]' > "$dir/array.json"
expect "top level not an object" 2 "top level must be an object" "$PS_SERVER" --cluster "$dir/array.json" --job ps --task 0
echo '{"ps": ["127.0.0.1:0"]}' > "$dir/one.json"
expect "task not in spec" 2 "not in cluster spec" "$PS_SERVER" --cluster "$dir/one.json" --job ps --task 3
expect "psctl bad spec" 2 "$dir/badjson.json" "$PSCTL" --cluster "$dir/badjson.json" status
expect "bad TF_CONFIG" 2 "TF_CONFIG" env TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:0"]}, "task": {"type": "ps"' "$PS_SERVER"
expect "TF_CONFIG task missing" 2 "TF_CONFIG: task ps/4 is not in the cluster" \
  env TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:0"]}, "task": {"type": "ps", "index": 4}}' "$PS_SERVER"
expect "no identity at all" 2 "no cluster spec" env -u TF_CONFIG -u SLURM_PROCID "$PS_SERVER"

# A real cluster: ps/0 from a spec file, ps/1 from TF_CONFIG.
echo '{"ps": ["127.0.0.1:0", "127.0.0.1:0"]}' > "$dir/boot.json"
start_ps "$dir/boot.json" 0; A0=$ADDR; P0=$PID
fifo="$dir/ready.tf"; mkfifo "$fifo"
TF_CONFIG='{"cluster": {"ps": ["127.0.0.1:0", "127.0.0.1:0"]}, "task": {"type": "ps", "index": 1}}' \
  "$PS_SERVER" > "$fifo" 2>> "$dir/ps.log" &
P1=$!; read -r -t 60 line < "$fifo"; A1=${line##* }
[[ "$line" == "ps/1 ready on 127.0.0.1:"* ]] && ok "TF_CONFIG identity" || bad "TF_CONFIG identity" "$line"
echo "{\"ps\": [\"$A0\", \"$A1\"]}" > "$dir/cluster.json"
expect "port in use is refused" 1 "cannot listen on 0.0.0.0:${A0##*:}" "$PS_SERVER" --cluster "$dir/cluster.json" --job ps --task 0
expect "port in use names the spec address" 1 "this task is $A0 in the cluster spec" "$PS_SERVER" --cluster "$dir/cluster.json" --job ps --task 0
expect "--bind: port in use there" 1 "cannot listen on 127.0.0.1:${A0##*:}" "$PS_SERVER" --cluster "$dir/cluster.json" --job ps --task 0 --bind 127.0.0.1
expect "--bind: empty" 2 "--bind must be a host name or address" "$PS_SERVER" --cluster "$dir/cluster.json" --bind ''

# The spec's host name need not resolve where the ps runs (a StatefulSet
# pod's own DNS name does not until the pod is Ready): it listens on every
# interface at the spec's port.
echo '{"ps": ["ps-0.ps.invalid:0"]}' > "$dir/k8s.json"
start_ps "$dir/k8s.json" 0; KP=${ADDR##*:}
[[ "$ADDR" == "ps-0.ps.invalid:"* ]] && ok "unresolvable spec host serves" || bad "unresolvable spec host serves" "$ADDR"
echo "{\"ps\": [\"127.0.0.1:$KP\"]}" > "$dir/k8sc.json"
expect "reached on 127.0.0.1" 0 "ps/0 127.0.0.1:$KP up" "$PSCTL" --cluster "$dir/k8sc.json" status
kill -TERM "$PID"; wait "$PID"
expect "--bind to an unresolvable host" 1 "cannot listen on ps-0.ps.invalid:0" "$PS_SERVER" --cluster "$dir/k8s.json" --bind ps-0.ps.invalid

# grpc.health.v1.Health through Debian's python3-grpcio, a client that is
# not ours (as a Kubernetes grpc: probe or grpc_health_probe): Check says
# SERVING (status 1), an unknown service is NOT_FOUND; Watch sends the
# status (SERVICE_UNKNOWN, 3, for an unknown service) and holds the stream
# open: after 1.5 s the client's deadline ends it, not the ps.
health_py='
import grpc, sys
ch = grpc.insecure_channel(sys.argv[1])
ident = lambda b: b
check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=ident, response_deserializer=ident)
watch = ch.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=ident, response_deserializer=ident)
print("check", check(b"", timeout=10).hex(), check(b"\n\x0eparamserver.Ps", timeout=10).hex())
try:
    check(b"\n\x03foo", timeout=10)
except grpc.RpcError as e:
    print("foo", e.code().name, e.details())
for req in (b"", b"\n\x03foo"):
    got = []
    try:
        for m in watch(req, timeout=1.5):
            got.append(m.hex())
        print("watch ended", got)
    except grpc.RpcError as e:
        print("watch", got, e.code().name)
'
# A Watch open when the ps stops gets NOT_SERVING (2), then the stream ends
# OK; with --drain-secs the open stream is no call in flight, so the drain
# ends after its 3 s of quiet, not after 60 s.  More than 1024 streams at
# once: RESOURCE_EXHAUSTED naming the limit, and the ps serves on.
watch_stop_py='
import grpc, os, signal, sys, time
ch = grpc.insecure_channel(sys.argv[1])
ident = lambda b: b
watch = ch.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=ident, response_deserializer=ident)
it = watch(b"", timeout=30)
print("first", next(it).hex(), flush=True)
t0 = time.time()
os.kill(int(sys.argv[2]), signal.SIGTERM)
try:
    got = [m.hex() for m in it]
    dt = time.time() - t0
    print("then", got, "ended", "at once" if dt < 2.5 else "after the drain quiet" if dt < 20 else "after %.1f s" % dt)
except grpc.RpcError as e:
    print("then", e.code().name, e.details())
'
watch_many_py='
import grpc, sys
ch = grpc.insecure_channel(sys.argv[1])
ident = lambda b: b
watch = ch.unary_stream("/grpc.health.v1.Health/Watch", request_serializer=ident, response_deserializer=ident)
check = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=ident, response_deserializer=ident)
open_ = []
for i in range(1024):
    it = watch(b"", timeout=60)
    assert next(it) == b"\x08\x01", i
    open_.append(it)
try:
    next(watch(b"", timeout=60))
    print("1025th opened")
except grpc.RpcError as e:
    print("1025th", e.code().name, e.details())
for it in open_:
    it.cancel()
print("after", check(b"", timeout=10).hex(), next(watch(b"", timeout=10)).hex())
'
if /usr/bin/python3 -c 'import grpc' 2>/dev/null; then
  expect "health Check: SERVING" 0 "check 0801 0801" /usr/bin/python3 -c "$health_py" "$A0"
  expect "health Check: unknown service" 0 "foo NOT_FOUND Health.Check: unknown service foo" /usr/bin/python3 -c "$health_py" "$A0"
  expect "health Watch: SERVING, held open" 0 "watch ['0801'] DEADLINE_EXCEEDED" /usr/bin/python3 -c "$health_py" "$A0"
  expect "health Watch: SERVICE_UNKNOWN, held open" 0 "watch ['0803'] DEADLINE_EXCEEDED" /usr/bin/python3 -c "$health_py" "$A0"
  expect "health Watch: 1025 streams" 0 "1025th RESOURCE_EXHAUSTED /grpc.health.v1.Health/Watch: 1024 response streams are open, the most this server keeps" /usr/bin/python3 -c "$watch_many_py" "$A0"
  expect "health Watch: the ps serves on after" 0 "after 0801 0801" /usr/bin/python3 -c "$watch_many_py" "$A0"
  echo '{"ps": ["127.0.0.1:0"]}' > "$dir/w.json"
  start_ps "$dir/w.json" 0
  expect "health Watch: NOT_SERVING when the ps stops" 0 "then ['0802'] ended at once" /usr/bin/python3 -c "$watch_stop_py" "$ADDR" "$PID"
  wait "$PID"; r=$?; [ "$r" = 0 ] && ok "watched ps exits 0" || bad "watched ps exits 0 (got $r)"
  start_ps "$dir/w.json" 0 "$dir/ps.log" --drain-secs 60
  expect "health Watch: a draining ps ends after 3 s quiet" 0 "then ['0802'] ended after the drain quiet" /usr/bin/python3 -c "$watch_stop_py" "$ADDR" "$PID"
  wait "$PID"; r=$?; [ "$r" = 0 ] && ok "drained ps exits 0" || bad "drained ps exits 0 (got $r)"
else
  bad "health checks" "/usr/bin/python3 has no grpc module (deploy/setup.sh installs python3-grpcio)"
fi

expect "status both up" 0 "ps/1 $A1 up vars=0" "$PSCTL" --cluster "$dir/cluster.json" status

# The wildcards listen on IPv4 and IPv6 both, as gRPC's own listener does.
hosts=(127.0.0.1)
if grep -q ' lo$' /proc/net/if_inet6 2>/dev/null; then hosts+=('[::1]'); else echo "note: no IPv6 on lo, [::1] not tried"; fi
for wild in '0.0.0.0' '[::]'; do
  echo "{\"ps\": [\"$wild:0\"]}" > "$dir/wild.json"
  start_ps "$dir/wild.json" 0; WP=${ADDR##*:}
  for host in "${hosts[@]}"; do
    echo "{\"ps\": [\"$host:$WP\"]}" > "$dir/wildc.json"
    expect "$wild listens on $host" 0 "ps/0 $host:$WP up" "$PSCTL" --cluster "$dir/wildc.json" status
  done
  kill -TERM "$PID"; wait "$PID"
done
expect "demo runs" 0 "embedding[1,4] += 1" "$PS_DEMO" "$dir/cluster.json"
expect "status counts" 0 "ps/0 $A0 up vars=2 bytes=56" "$PSCTL" --cluster "$dir/cluster.json" status
expect "vars lists" 0 "embedding                                float      [6,2]            ps/1   yes" "$PSCTL" --cluster "$dir/cluster.json" vars
expect "read prints value" 0 "[-0.5, -0.5, -0.5]" "$PSCTL" --cluster "$dir/cluster.json" read dense/bias
expect "read scalar" 0 "global_step (DT_INT64) [] on ps/0" "$PSCTL" --cluster "$dir/cluster.json" read global_step
expect "read unknown" 1 "variable nope not found on any ps task" "$PSCTL" --cluster "$dir/cluster.json" read nope
expect "psctl via TF_CONFIG" 0 "ps/0 $A0 up" env TF_CONFIG="{\"cluster\": {\"ps\": [\"$A0\", \"$A1\"], \"worker\": [\"127.0.0.1:0\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}" "$PSCTL" status

expect "save needs --checkpoint-dir" 1 "has no --checkpoint-dir" "$PSCTL" --cluster "$dir/cluster.json" save

# Checkpoint files, no cluster needed; TensorFlow wrote these.
data="$(cd "$(dirname "$0")/../data/tf-checkpoints" && pwd)"
expect "inspect a TF checkpoint" 0 "a (DT_FLOAT) []" "$PSCTL" inspect "$data/half_plus_two_cpu/variables"
expect "inspect --all prints values" 0 "tensor_name:  counter" "$PSCTL" inspect --all "$data/counter/variables"
expect "inspect a missing checkpoint" 1 "$dir/none.index" "$PSCTL" inspect "$dir/none"
expect "latest of an empty dir" 1 "no checkpoint in $dir" "$PSCTL" latest "$dir"
expect "inspect needs a prefix" 2 "needs a checkpoint prefix" "$PSCTL" inspect

# SIGINT and SIGTERM stop a task cleanly (exit 0); psctl sees it down.
kill -INT "$P1"; wait "$P1"; rc=$?
[ "$rc" = 0 ] && ok "SIGINT exits 0" || bad "SIGINT exits 0 (got $rc)"
expect "status shows down" 1 "ps/1 $A1 down (UNAVAILABLE" "$PSCTL" --cluster "$dir/cluster.json" status
kill -TERM "$P0"; wait "$P0"; rc=$?
[ "$rc" = 0 ] && ok "SIGTERM exits 0" || bad "SIGTERM exits 0 (got $rc)"
# --log-format json: every stderr line is one JSON object with time,
# level, task and msg (log collectors); a bad value exits 2.
expect "--log-format: bad value" 2 "unknown --log-format 'xml'" "$PS_SERVER" --cluster "$dir/boot.json" --log-format xml
fifo="$dir/ready.json"; mkfifo "$fifo"
"$PS_SERVER" --cluster "$dir/boot.json" --job ps --task 0 --log-format json > "$fifo" 2> "$dir/json.log" &
JP=$!; read -r -t 60 line < "$fifo"; JA=${line##* }
echo "{\"ps\": [\"$JA\"]}" > "$dir/jc.json"
"$PSCTL" --cluster "$dir/jc.json" read 'no"such\var' > /dev/null 2>&1
kill -TERM "$JP"; wait "$JP"
out=$(/usr/bin/python3 -c '
import json, sys
n = 0
for line in open(sys.argv[1], encoding="utf-8"):
    o = json.loads(line)
    assert set(o) == {"time", "level", "task", "msg"}, o
    assert o["task"] == "ps/0" and o["time"].endswith("Z"), o
    n += 1
print("lines", n)
' "$dir/json.log" 2>&1); rc=$?
[ "$rc" = 0 ] && [[ "$out" == "lines "[2-9]* ]] && ok "--log-format json: every line is JSON" || bad "--log-format json: every line is JSON" "$out $(cat "$dir/json.log")"

# psctl shutdown: each ps stops as on SIGTERM and exits 0; a second one
# finds them down.
echo '{"ps": ["127.0.0.1:0", "127.0.0.1:0"]}' > "$dir/sd.json"
start_ps "$dir/sd.json" 0; S0=$ADDR; SP0=$PID
start_ps "$dir/sd.json" 1; S1=$ADDR; SP1=$PID
echo "{\"ps\": [\"$S0\", \"$S1\"]}" > "$dir/sdc.json"
expect "psctl shutdown" 0 "ps/1 $S1 shutting down" "$PSCTL" --cluster "$dir/sdc.json" shutdown
wait "$SP0"; r0=$?; wait "$SP1"; r1=$?
[ "$r0$r1" = 00 ] && ok "shut down ps exit 0" || bad "shut down ps exit 0 (got $r0 $r1)"
grep -q "Shutdown asked by a client: psctl shutdown" "$dir/ps.log" && ok "the ps logged the shutdown" || bad "the ps logged the shutdown" "$(tail -5 "$dir/ps.log")"
expect "psctl shutdown of a stopped cluster" 1 "ps/0 $S0 not shut down (UNAVAILABLE" "$PSCTL" --cluster "$dir/sdc.json" --timeout-ms 500 shutdown
grep -q "ERROR\|AddressSanitizer\|runtime error" "$dir/ps.log" && bad "ps logs clean" "$(cat "$dir/ps.log")" || ok "ps logs clean"

finish
