#!/usr/bin/env bash
# The replication link (ps/repl_link.c, DESIGN.md "The replication link"):
# a real etcd, 2 real ps-server --replicas 2 (ps/0 primary of shard 0 and
# backup of shard 1, ps/1 the other way), failover_client updating both
# shards, raw frames from python3 sockets.
#  a. each ps logs "replication link on port N"; after updates to shards 0
#     and 1 each primary logs that it replicates over its backup's link,
#     no acknowledged update is lost, psctl verify says identical;
#  b. hostile frames on each ps's link port, each answered by an ACK with
#     its gRPC code and text, then the connection closed: 24 bytes that are
#     no header (INVALID_ARGUMENT, "not a frame"), a HELLO with a wrong key
#     (PERMISSION_DENIED, "wrong key", and the ps WARNs), a HELLO of 2^40
#     meta bytes (RESOURCE_EXHAUSTED, "over the limit"), a BATCH before any
#     HELLO (INVALID_ARGUMENT, the kind).  Then both ps are alive, take
#     more updates, psctl verify says identical, their logs hold no ERROR
#     and no sanitizer report;
#  c. the same cluster with --no-repl-link: no link port, no primary over
#     a link, and the updates still replicate (psctl verify identical);
#     no ERROR, no sanitizer report.
set -u
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
source "$(dirname "$0")/../support/repl.sh"
test_init repl_link
TTL=2
export PS_RPC_TIMEOUT=20
etcd_start repl_link || { bad "etcd starts"; finish; exit 1; }

declare -a P LP
JOB=link
FLAGS=()
start_one() {
  : > "$dir/$JOB$1.out"
  "$PS_SERVER" --cluster "$dir/$JOB.json" --job ps --task "$1" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job "$JOB" --lease-ttl "$TTL" --grace-secs 2 \
    "${FLAGS[@]}" > "$dir/$JOB$1.out" 2>> "$dir/$JOB$1.log" &
  P[$1]=$!
}
repl_start_one() { start_one "$1"; }
st_() { "$PSCTL" --cluster "$dir/$JOB.json" --etcd "$ETCD_ENDPOINTS" --repl-job "$JOB" \
  --replicas 2 --timeout-ms 5000 "$@"; }
IN_SYNC=('^shard 0: ps/0 primary.*ps/1 backup' '^shard 1: ps/1 primary.*ps/0 backup')
stop_all() { for t in 0 1; do kill -TERM "${P[$t]}" 2> /dev/null; wait "${P[$t]}" 2> /dev/null; done; }

# frame PORT CASE: sends one hostile frame to 127.0.0.1:PORT and prints
# what came back: "code C", "text T", then "closed" or "open" (the
# connection after the ACK), or "no answer" / "bad header ..."
frame() {
  timeout 20 python3 - "$1" "$2" << 'EOF'
import os, socket, struct, sys
port, case = int(sys.argv[1]), sys.argv[2]
MAGIC = 0x4c525350
def hdr(kind, meta, data, magic=MAGIC):
    return struct.pack("<IIQQ", magic, kind, meta, data)
s = socket.create_connection(("127.0.0.1", port), timeout=2)
# exactly the bytes the ps reads before it answers: unread bytes at its
# close would make the kernel reset the connection, maybe before the ACK
if case == "garbage":
    s.sendall(b"GET / HTTP/1.1\r\nHost: ps\r\n\r\n"[:24])
elif case == "wrongkey":  # task 0 is a task of the cluster: only the key is wrong
    s.sendall(hdr(1, 36, 0) + struct.pack("<I", 0) + os.urandom(32))
elif case == "hugemeta":
    s.sendall(hdr(1, 1 << 40, 0))
elif case == "batchfirst":
    s.sendall(hdr(2, 10, 0))
def read(n):
    b = b""
    while len(b) < n:
        k = s.recv(n - len(b))
        if not k:
            raise EOFError
        b += k
    return b
try:
    magic, kind, meta, data = struct.unpack("<IIQQ", read(24))
    if magic != MAGIC or kind != 3 or data != 0 or not 20 <= meta <= 275:
        print("bad header: magic %08x kind %d meta %d data %d" % (magic, kind, meta, data))
        sys.exit(0)
    m = read(meta)
except (EOFError, OSError) as e:
    print("no answer (%r)" % e)
    sys.exit(0)
code, applied, epoch = struct.unpack("<IqQ", m[:20])
print("code %d" % code)
print("text " + m[20:].decode("ascii", "replace"))
try:
    print("closed" if s.recv(1) == b"" else "more bytes")
except socket.timeout:
    print("open")
except ConnectionResetError:
    print("closed")
EOF
}

# hostile T CASE CODE TEXT: CASE on ps/T's link answers CODE with TEXT, closes
hostile() {
  local out
  out=$(frame "${LP[$1]}" "$2" 2>&1)
  if grep -qx "code $3" <<< "$out" && grep -q "^text .*$4" <<< "$out" &&
    [ "$(tail -n 1 <<< "$out")" = closed ]; then
    ok "ps/$1's link, $2: an ACK with code $3 \"$4\", then closed"
  else
    bad "ps/$1's link, $2: an ACK with code $3 \"$4\", then closed" "$out"
  fi
}

# clean_logs: the logs of $JOB's ps (stopped) hold no ERROR and no
# sanitizer report
clean_logs() {
  local t
  for t in 0 1; do
    if grep -qE " ERROR |runtime error|Sanitizer|==[0-9]+==" "$dir/$JOB$t.log"; then
      bad "$JOB: ps/$t's log holds no ERROR and no sanitizer report" \
        "$(grep -E " ERROR |runtime error|Sanitizer|==[0-9]+==" "$dir/$JOB$t.log")"
    else
      ok "$JOB: ps/$t's log holds no ERROR and no sanitizer report"
    fi
  done
}

# ---- a. the link carries the batches ----
if repl_start 2 "$dir/$JOB.json" "$JOB"; then
  ok "2 ps-server --replicas 2 start"
else
  bad "2 ps-server --replicas 2 start" "$(tail -n 5 "$dir/$JOB"[01].log)"
  finish; exit 1
fi
for t in 0 1; do
  LP[$t]=$(sed -n 's/.*replication link on port \([0-9]*\) .*/\1/p' "$dir/$JOB$t.log" | tail -n 1)
  if [ -n "${LP[$t]}" ] && [ "${LP[$t]}" -gt 0 ]; then
    ok "ps/$t logs its replication link's port (${LP[$t]})"
  else
    bad "ps/$t logs its replication link's port" "$(head -n 20 "$dir/$JOB$t.log")"
    finish; exit 1
  fi
done
repl_wait_status "${IN_SYNC[@]}" || bad "each shard has its primary and in-sync backup" "$out"
repl_updates a 100
for t in 0 1; do
  b=$((1 - t))
  if wait_for "$dir/$JOB$t.log" "INFO .*replication to ps/$b over its replication link \(127\.0\.0\.1:${LP[$b]}\)" 10; then
    ok "ps/$t, shard $t's primary, replicates to ps/$b over its link (port ${LP[$b]})"
  else
    bad "ps/$t, shard $t's primary, replicates to ps/$b over its link (port ${LP[$b]})" \
      "$(grep -h "replication" "$dir/$JOB$t.log")"
  fi
done
repl_verify 1

# ---- b. hostile frames on the link ports ----
for t in 0 1; do
  hostile "$t" garbage 3 "replication link: not a frame (magic 20544547)"
  hostile "$t" wrongkey 7 "replication link: wrong key (ask for the link with a Replicate call)"
  if grep -q "WARN .*replication link: a connection that did not present this ps's key .* was refused" \
    "$dir/$JOB$t.log"; then
    ok "ps/$t WARNs about the connection with a wrong key"
  else
    bad "ps/$t WARNs about the connection with a wrong key" "$(tail -n 5 "$dir/$JOB$t.log")"
  fi
  hostile "$t" hugemeta 8 "replication link: a frame of 1099511627776 + 0 bytes, over the limit of 36 + 0"
  hostile "$t" batchfirst 3 "replication link: a frame of kind 2 where 1 belongs"
done
for t in 0 1; do
  kill -0 "${P[$t]}" 2> /dev/null && ok "ps/$t is alive after the hostile frames" ||
    bad "ps/$t is alive after the hostile frames" "$(tail -n 5 "$dir/$JOB$t.log")"
done
repl_updates b 50
repl_verify 2
# the primaries kept their links: no batch went another way since
for t in 0 1; do
  n=$(grep -c "replication to ps/$((1 - t)) over its replication link" "$dir/$JOB$t.log")
  [ "$n" = 1 ] && ok "ps/$t opened its link once" ||
    bad "ps/$t opened its link once ($n)" "$(grep -h "replication" "$dir/$JOB$t.log")"
done
stop_all
clean_logs

# ---- c. --no-repl-link ----
JOB=nolink
FLAGS=(--no-repl-link)
if repl_start 2 "$dir/$JOB.json" "$JOB"; then
  ok "2 ps-server --replicas 2 --no-repl-link start"
else
  bad "2 ps-server --replicas 2 --no-repl-link start" "$(tail -n 5 "$dir/$JOB"[01].log)"
  finish; exit 1
fi
repl_wait_status "${IN_SYNC[@]}" || bad "--no-repl-link: each shard has its primary and in-sync backup" "$out"
repl_updates c 50
repl_verify 1
repl_no_link --no-repl-link
stop_all
clean_logs

# ---- d. --repl-link-port: a bad value, a port taken ----
expect "--repl-link-port x: exit 2, saying the range" 2 \
  "ps-server: --repl-link-port must be 0..65535, got 'x'" \
  "$PS_SERVER" --cluster "$dir/$JOB.json" --job ps --task 0 --repl-link-port x
# a port held by a listener of the test's own: ps/0 cannot listen there
python3 -c 'import socket, time
s = socket.socket(); s.bind(("0.0.0.0", 0)); s.listen()
print(s.getsockname()[1], flush=True); time.sleep(120)' > "$dir/held.port" &
holder=$!
wait_for "$dir/held.port" "^[0-9]+$" 10 || bad "the test holds a port"
held=$(head -n 1 "$dir/held.port")
expect "--repl-link-port $held (taken): exit 1, naming the port" 1 \
  "replication link: cannot listen on port $held of every interface" \
  "$PS_SERVER" --cluster "$dir/$JOB.json" --job ps --task 0 --replicas 2 \
  --etcd "$ETCD_ENDPOINTS" --repl-job taken --lease-ttl "$TTL" --repl-link-port "$held"
kill "$holder" 2> /dev/null; wait "$holder" 2> /dev/null
etcd_stop
finish
