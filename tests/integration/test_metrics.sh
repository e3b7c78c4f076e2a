#!/usr/bin/env bash
# Prometheus metrics of ps-server (--metrics-port): the page passes
# `promtool check metrics`, counts what the ps did (RPCs by method and
# code, a checkpoint shard, the variables held, an embedding table's rows,
# evictions and refused keys), and a real Prometheus
# (Debian's) scrapes it and answers a query over it.  Ports are picked at
# run time; every process is stopped however the script ends.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}; PS_WORKER=${PS_WORKER:?}
source "$(dirname "$0")/../support/lib.sh"
test_init metrics

# listening PID PORT: the local addresses PID listens on at PORT (ss), one a line
listening() {
  ss -Hltnp "sport = :$2" | grep -F "pid=$1," | awk '{print $4}' | sort
}
# a non-loopback IPv4 address of this host, if it has one
OTHER_IP=$(ip -4 -o addr show scope global 2>/dev/null | awk '{sub(/\/.*/, "", $4); print $4; exit}')

mkdir -p "$dir/ck"
echo '{"ps": ["127.0.0.1:0"]}' > "$dir/c.json"
fifo="$dir/ready"; mkfifo "$fifo"
"$PS_SERVER" --cluster "$dir/c.json" --job ps --task 0 --metrics-port 0 --checkpoint-dir "$dir/ck" \
  > "$fifo" 2> "$dir/ps.log" &
PID=$!
read -r -t 60 line < "$fifo"; A=${line##* }
[[ "$line" == *" ready on "* ]] || { bad "ps started" "$line $(cat "$dir/ps.log")"; finish; }
MP=$(sed -n 's/.*metrics on port \([0-9]*\) .*/\1/p' "$dir/ps.log" | head -1)
[ -n "$MP" ] && ok "metrics port logged ($MP)" || bad "metrics port logged" "$(cat "$dir/ps.log")"
echo "{\"ps\": [\"$A\"]}" > "$dir/cc.json"
"$PSCTL" --cluster "$dir/cc.json" status > /dev/null
"$PSCTL" --cluster "$dir/cc.json" status > /dev/null
"$PSCTL" --cluster "$dir/cc.json" restore nosuch > /dev/null 2>&1
"$PSCTL" --cluster "$dir/cc.json" save snap > /dev/null
# an embedding table (admission after 2 lookups, 2 rows at most): keys 1-4
# looked up twice, raw gRPC (pbwire)
/usr/bin/python3 - "$A" <<'PY' > "$dir/tables.out" 2>&1 || bad "table calls" "$(cat "$dir/tables.out")"
import struct, sys
import grpc
from pbwire import ld, vi
ch = grpc.insecure_channel(sys.argv[1])
raw = dict(request_serializer=lambda b: b, response_deserializer=lambda b: b)
policy = vi(1, 2) + vi(6, 2)
spec = ld(1, b"emb") + vi(2, 1) + vi(3, 4) + ld(7, policy)
ch.unary_unary("/paramserver.Ps/TableCreate", **raw)(ld(1, spec), timeout=10)
keys = struct.pack("<4q", 1, 2, 3, 4)
look = ld(1, b"emb") + vi(2, 9) + vi(3, 4) + vi(4, 1) + ld(6, keys)
for _ in range(2):
    list(ch.stream_stream("/paramserver.Ps/TableLookup", **raw)(iter([look]), timeout=10))
print("ok")
PY

curl -sf "http://127.0.0.1:$MP/metrics" > "$dir/m.txt"; rc=$?
[ "$rc" = 0 ] && ok "GET /metrics" || bad "GET /metrics (curl exit $rc)"
check "two Status calls counted" grep -q '^ps_rpc_calls_total{method="paramserver.Ps/Status",code="OK"} 2$' "$dir/m.txt"
check "a failed call counted by its code" grep -q '^ps_rpc_calls_total{method="paramserver.Ps/Restore",code="NOT_FOUND"} 1$' "$dir/m.txt"
check "latency histogram" grep -q '^ps_rpc_duration_seconds_bucket{method="paramserver.Ps/Status",le="+Inf"} 2$' "$dir/m.txt"
check "bytes sent" grep -Eq '^ps_rpc_sent_bytes_total\{method="paramserver.Ps/Status"\} [1-9][0-9]*$' "$dir/m.txt"
check "the checkpoint shard" grep -q '^ps_checkpoint_saves_total 1$' "$dir/m.txt"
check "variables held" grep -q '^ps_variables 0$' "$dir/m.txt"
check "an embedding table's rows" grep -q '^ps_embedding_rows{table="emb"} 2$' "$dir/m.txt"
check "rows evicted for room" grep -q '^ps_embedding_evicted_total{table="emb"} 2$' "$dir/m.txt"
check "keys admission refused" \
  grep -q '^ps_embedding_admission_refused_total{table="emb"} 4$' "$dir/m.txt"
check "rows expired" grep -q '^ps_embedding_expired_total{table="emb"} 0$' "$dir/m.txt"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$MP/other")
[ "$code" = 404 ] && ok "another path is 404" || bad "another path is 404 (got $code)"

if command -v promtool > /dev/null; then
  out=$(promtool check metrics < "$dir/m.txt" 2>&1); rc=$?
  [ "$rc" = 0 ] && ok "promtool check metrics" || bad "promtool check metrics (exit $rc)" "$out"
else
  bad "promtool check metrics" "promtool is not installed (deploy/setup.sh installs prometheus)"
fi

# A real Prometheus scrapes the ps every second; its query API then has
# the ps's series.
if command -v prometheus > /dev/null; then
  cat > "$dir/prom.yml" <<YML
global:
  scrape_interval: 1s
scrape_configs:
  - job_name: ps
    static_configs:
      - targets: ["127.0.0.1:$MP"]
YML
  prometheus --config.file="$dir/prom.yml" --storage.tsdb.path="$dir/tsdb" \
    --web.listen-address=127.0.0.1:0 > "$dir/prom.log" 2>&1 &
  PROM=$!
  # (port 0: the port it bound, from its log line 'msg="Listening on"
  # address=127.0.0.1:PORT')
  PP=""
  for ((i = 0; i < 300; i++)); do
    PP=$(sed -n 's/.*msg="Listening on" address=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/prom.log" | head -1)
    [ -n "$PP" ] && break
    sleep 0.1
  done
  [ -n "$PP" ] || bad "Prometheus listens (on a port of its own)" "$(tail -5 "$dir/prom.log")"
  got=""
  for ((i = 0; i < 300; i++)); do
    got=$(curl -s "http://127.0.0.1:$PP/api/v1/query?query=ps_rpc_calls_total%7Bmethod%3D%22paramserver.Ps%2FStatus%22%2Ccode%3D%22OK%22%7D" 2>/dev/null)
    [[ "$got" == *'"value":['*'"2"]'* ]] && break
    sleep 0.1
  done
  [[ "$got" == *'"job":"ps"'*'"value":['*'"2"]'* ]] && ok "Prometheus scrapes the ps" \
    || bad "Prometheus scrapes the ps" "$got $(tail -5 "$dir/prom.log")"
  up=$(curl -s "http://127.0.0.1:$PP/api/v1/query?query=up")
  [[ "$up" == *'"value":['*'"1"]'* ]] && ok "the target is up" || bad "the target is up" "$up"
  kill -TERM "$PROM"; wait "$PROM" 2>/dev/null
else
  bad "Prometheus scrapes the ps" "prometheus is not installed (deploy/setup.sh installs it)"
fi

# ps-worker's page while it trains: steps, examples, loss, and the calls
# to each ps with the time it waited for them.
echo "{\"ps\": [\"$A\"], \"worker\": [\"127.0.0.1:0\"]}" > "$dir/w.json"
"$PS_WORKER" --cluster "$dir/w.json" --job worker --task 0 --model linreg --steps 100000000 \
  --log-every 50 --metrics-port 0 --metrics-bind 127.0.0.1 --keep-ps --no-restore \
  > "$dir/w.out" 2> "$dir/w.log" &
W=$!
if wait_for "$dir/w.log" "step [0-9]+ loss" 120 && wait_for "$dir/w.log" "metrics on port" 5; then
  WP=$(sed -n 's/.*metrics on port \([0-9]*\) .*/\1/p' "$dir/w.log" | head -1)
  curl -sf "http://127.0.0.1:$WP/metrics" > "$dir/w.txt"
  check "worker: steps counted" grep -Eq '^ps_worker_steps_total [1-9][0-9]*$' "$dir/w.txt"
  check "worker: examples/s" grep -Eq '^ps_worker_examples_per_second [1-9]' "$dir/w.txt"
  check "worker: calls to ps/0" grep -Eq '^ps_worker_ps_calls_total\{ps="ps/0"\} [1-9][0-9]*$' "$dir/w.txt"
  check "worker --metrics-bind 127.0.0.1: listens there only" \
    test "$(listening "$W" "$WP")" = "127.0.0.1:$WP"
  check "worker: time waited for ps/0" grep -Eq '^ps_worker_ps_wait_seconds_total\{ps="ps/0"\} [0-9.]+$' "$dir/w.txt"
  if command -v promtool > /dev/null; then
    out=$(promtool check metrics < "$dir/w.txt" 2>&1); rc=$?
    [ "$rc" = 0 ] && ok "worker: promtool check metrics" || bad "worker: promtool check metrics (exit $rc)" "$out"
  fi
else
  bad "worker trains with --metrics-port" "$(tail -5 "$dir/w.log")"
fi
kill -TERM "$W"; wait "$W"; rc=$?
[ "$rc" = 143 ] && ok "worker stops on SIGTERM (143: before --steps)" || bad "worker stops on SIGTERM (exit $rc, want 143)" "$(tail -5 "$dir/w.log")"

# --bind: the metrics page (plain HTTP, no authentication) listens where
# the RPC port does, not on every interface; --metrics-bind overrides it.
start_ps "$dir/c.json" 0 "$dir/b.log" --bind 127.0.0.1 --metrics-port 0
BPID=$PID
BP=$(sed -n 's/.*metrics on port \([0-9]*\) of 127.0.0.1 .*/\1/p' "$dir/b.log" | head -1)
if [ -n "$ADDR" ] && [ -n "$BP" ]; then
  got=$(listening "$BPID" "$BP")
  [ "$got" = "127.0.0.1:$BP" ] && ok "--bind 127.0.0.1: the metrics socket is bound to 127.0.0.1 only" \
    || bad "--bind 127.0.0.1: the metrics socket is bound to 127.0.0.1 only" "$got"
  check "--bind 127.0.0.1: GET /metrics on 127.0.0.1" curl -sf -o /dev/null "http://127.0.0.1:$BP/metrics"
  if [ -n "$OTHER_IP" ]; then
    curl -s -m 5 -o /dev/null "http://$OTHER_IP:$BP/metrics"; rc=$?
    [ "$rc" = 7 ] && ok "--bind 127.0.0.1: no metrics on $OTHER_IP" \
      || bad "--bind 127.0.0.1: no metrics on $OTHER_IP (curl exit $rc, want 7: refused)"
  fi
else
  bad "ps with --bind 127.0.0.1 --metrics-port 0" "$(cat "$dir/b.log")"
fi
kill -TERM "$BPID"; wait "$BPID"
start_ps "$dir/c.json" 0 "$dir/b6.log" --bind 127.0.0.1 --metrics-bind ::1 --metrics-port 0
BPID=$PID
BP=$(sed -n 's/.*metrics on port \([0-9]*\) of ::1 .*/\1/p' "$dir/b6.log" | head -1)
got=$(listening "$BPID" "${BP:-0}")
[ -n "$ADDR" ] && [ "$got" = "[::1]:$BP" ] && ok "--metrics-bind ::1: the metrics socket is bound to ::1 only" \
  || bad "--metrics-bind ::1: the metrics socket is bound to ::1 only" "$got $(cat "$dir/b6.log")"
check "--metrics-bind ::1: GET /metrics on [::1]" curl -sf -o /dev/null "http://[::1]:$BP/metrics"
kill -TERM "$BPID"; wait "$BPID"
start_ps "$dir/c.json" 0 "$dir/ba.log" --bind 127.0.0.1 --metrics-bind 0.0.0.0 --metrics-port 0
BPID=$PID
BP=$(sed -n 's/.*metrics on port \([0-9]*\) of every interface .*/\1/p' "$dir/ba.log" | head -1)
got=$(listening "$BPID" "${BP:-0}")
[ -n "$ADDR" ] && [[ "$got" == "*:$BP" || "$got" == "[::]:$BP" ]] \
  && ok "--metrics-bind 0.0.0.0: every interface" \
  || bad "--metrics-bind 0.0.0.0: every interface" "$got $(cat "$dir/ba.log")"
kill -TERM "$BPID"; wait "$BPID"
expect "--metrics-bind without --metrics-port" 2 "ps-server: --metrics-bind needs --metrics-port" "$PS_SERVER" --cluster "$dir/c.json" --metrics-bind 127.0.0.1
expect "ps-worker: --metrics-bind without --metrics-port" 2 "ps-worker: --metrics-bind needs --metrics-port" "$PS_WORKER" --cluster "$dir/w.json" --job worker --task 0 --metrics-bind 127.0.0.1
expect "--metrics-bind: a name that does not resolve" 1 "--metrics-port 0: cannot serve metrics on no-such-host.invalid:" "$PS_SERVER" --cluster "$dir/c.json" --metrics-port 0 --metrics-bind no-such-host.invalid
expect "--metrics-bind: not an address of this host" 1 "--metrics-port 0: cannot serve metrics on port 0 of 203.0.113.77 (in use, not an address of this host, or no permission)" "$PS_SERVER" --cluster "$dir/c.json" --metrics-port 0 --metrics-bind 203.0.113.77
expect "--metrics-bind: empty" 2 "ps-server: --metrics-bind must be a host name or address, got ''" "$PS_SERVER" --cluster "$dir/c.json" --metrics-port 0 --metrics-bind ''
expect "--metrics-port: bad value" 2 "--metrics-port must be a port number" "$PS_SERVER" --cluster "$dir/c.json" --metrics-port 70000
expect "--metrics-port: in use" 1 "--metrics-port $MP: cannot serve metrics on port $MP" "$PS_SERVER" --cluster "$dir/c.json" --metrics-port "$MP"
kill -TERM "$PID"; wait "$PID"; rc=$?
[ "$rc" = 0 ] && ok "ps stops cleanly" || bad "ps stops cleanly (exit $rc)" "$(tail -5 "$dir/ps.log")"
finish
