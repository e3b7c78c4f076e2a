#!/usr/bin/env bash
# Cut-through of large assigns (ps/repl_stage.c, DESIGN.md "The replication
# link"): a primary forwards the bytes of an ASSIGN of >= 2 MiB
# (PS_REPL_STAGE_MIN) to its backups in STAGE frames while they still
# arrive; the update's VALUE entry then names the stage.  A real etcd, 2
# real ps-server --replicas 2 (ps/0 primary of shard 0 and backup of shard
# 1, ps/1 the other way), big_assign_client (the public client API):
#  a. float assigns of 1.9 to 8 MiB, sizes just under, at and over 2 MiB,
#     5 rounds over 8 variables of both shards: every one acknowledged,
#     each variable reads back as its last value, psctl verify says
#     identical, and each primary's ps_replication_cut_through_bytes_total
#     grew by the bytes of its shard's >= 2 MiB assigns and by none of the
#     smaller ones;
#  b. 12 assigns of 8 MiB + 4 bytes to an 8 MiB variable (refused after
#     their bytes arrived: "Assign requires shapes of both tensors to
#     match", naming the variable), then 2 of the right shape in float64
#     (dtype mismatch): each refused; then a good one is acknowledged and
#     reads back.  The stages of the refused ones were dropped (UNSTAGE):
#     the backup, which holds at most 8 stages per connection and closes
#     the link at a 9th, still has shard 0 in sync, the view's epoch did
#     not move, the link was opened once (the primary reopens a closed one
#     without a word), the counter took the good assign only, verify
#     identical;
#  c. hostile frames from python3 on each ps's link port after a valid
#     HELLO (port and key from a raw Replicate call with open_link): every
#     STAGE, UNSTAGE and BATCH error answered by an ACK with its code and
#     text, then the connection closed; the ACK of a refused STAGE or
#     UNSTAGE has -1 entries applied and the ps logs a WARN naming the
#     task of the HELLO and the text; a refused BATCH's has 0 and there
#     is no such WARN (a BATCH's errors are only answered); an UNSTAGE of
#     an unknown id is not answered and the connection serves on; a
#     staged entry in a Replicate gRPC call is refused INVALID_ARGUMENT.
#     Then both ps alive, more large assigns acknowledged, verify
#     identical, no ERROR, no sanitizer report;
#  d. kill -9 of ps/1 (shard 0's backup) while 2 streams of 4 MiB assigns
#     run on shard 0: ps/0 lives, the assigns go on being acknowledged
#     (shard 0 degraded), ps/1 restarted rejoins, the cut-through resumes,
#     each stream's last value reads back, verify identical;
#  then a new cluster of 2 ps --replicas 2:
#  e. multi-item Updates: 8 times one Update (seeds differing) of a
#     SCATTER_UPDATE of float [64K] mt with int64 indices (its index bytes
#     come first in the request's bulk bytes), an ASSIGN of 8 MiB to ma,
#     one of 1 MiB to ms, one of 3 MiB to mb, on shard 0: ma's bytes start
#     at 768 KiB of the request and mb's at 9.75 MiB, so a stage that took
#     a wrong offset (0) would forward mb's buffer whole before its bytes
#     came.  Each acknowledged, psctl verify identical after each (a later
#     Update would hide a divergence), the 4 variables read back as the
#     last left them, ps/0's counter grew by the 8 + 3 MiB of each and not
#     by the 1 MiB;
#  f. 12 concurrent streams of 3 MiB assigns to 12 variables of shard 1
#     for about 3 s (the primary keeps at most 8 stages per backup: the
#     others go with their bytes in the batch): every assign acknowledged,
#     each variable reads back as its stream's last, no WARN or ERROR in
#     either log, neither "stages at once" nor a refused frame, the view's
#     epoch did not move, the link was not reopened, the counter grew,
#     verify identical;
#  g. the same with --no-repl-link: every assign acknowledged, the
#     counter stays 0, verify identical;
#  h. R = 1 (2 plain ps-server): every assign acknowledged and read back,
#     no replication metrics.
set -u
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
source "$(dirname "$0")/../support/repl.sh"
test_init repl_cut_through
export PS_RPC_TIMEOUT=20
LIMIT=67108864 # --max-tensor-bytes 64M
MIB2=2097152   # PS_REPL_STAGE_MIN
/usr/bin/python3 -c 'import grpc' 2> /dev/null ||
  { bad "/usr/bin/python3 has grpc (deploy/setup.sh installs python3-grpcio)"; finish; exit 1; }
etcd_start repl_cut_through || { bad "etcd starts"; finish; exit 1; }

declare -a P MP LP X
JOB=cut
FLAGS=()
R1_PIDS=()
start_one() {
  : > "$dir/$JOB$1.out"
  "$PS_SERVER" --cluster "$dir/$JOB.json" --job ps --task "$1" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job "$JOB" --lease-ttl 2 --grace-secs 2 \
    --metrics-port 0 --max-tensor-bytes 64M "${FLAGS[@]}" \
    > "$dir/$JOB$1.out" 2>> "$dir/$JOB$1.log" &
  P[$1]=$!
}
repl_start_one() { start_one "$1"; }
# stop_all: SIGTERM to each ps, waits; X[T] its exit status
stop_all() {
  local t
  for t in 0 1; do
    [ -n "${P[$t]:-}" ] || continue
    kill -TERM "${P[$t]}" 2> /dev/null
    wait "${P[$t]}" 2> /dev/null
    X[$t]=$?
    P[$t]=""
  done
}
# stopped WHAT: after stop_all, each ps exited 0, its log without ERROR or
# sanitizer report (leaks are reported at exit)
stopped() {
  local t
  for t in 0 1; do
    [ "${X[$t]}" = 0 ] && ok "$JOB: $1: ps/$t exits 0 on SIGTERM" ||
      bad "$JOB: $1: ps/$t exits 0 on SIGTERM (${X[$t]})" "$(tail -n 20 "$dir/$JOB$t.log")"
  done
  clean_logs "$1"
}
# (lib.sh kills every child left; this stops the ps first, by pid)
test_cleanup_hook() {
  local p
  stop_all
  for p in "${R1_PIDS[@]}"; do kill -KILL "$p" 2> /dev/null; done
}
st_() { "$PSCTL" --cluster "$dir/$JOB.json" --etcd "$ETCD_ENDPOINTS" --repl-job "$JOB" \
  --replicas 2 --timeout-ms 5000 "$@"; }
IN_SYNC=('^shard 0: ps/0 primary.*ps/1 backup' '^shard 1: ps/1 primary.*ps/0 backup')
epoch() { st_ status 2>&1 | sed -n 's/^replication: .*view epoch \([0-9]*\).*/\1/p' | head -n 1; }
# steady WHAT: both shards keep their in-sync backup, and the view's epoch
# is still $e0
steady() {
  local e1
  repl_wait_status "${IN_SYNC[@]}" && ok "$1: both shards keep their in-sync backup" ||
    bad "$1: both shards keep their in-sync backup" "$out"
  e1=$(epoch)
  [ -n "$e0" ] && [ "$e0" = "$e1" ] && ok "$1: the view's epoch did not move ($e0)" ||
    bad "$1: the view's epoch did not move ('$e0' -> '$e1')"
}
# ports T: MP[T] and LP[T], ps/T's metrics and link ports from its log
ports() {
  MP[$1]=$(sed -n 's/.*metrics on port \([0-9]*\) .*/\1/p' "$dir/$JOB$1.log" | tail -n 1)
  LP[$1]=$(sed -n 's/.*replication link on port \([0-9]*\) .*/\1/p' "$dir/$JOB$1.log" | tail -n 1)
}
# m T NAME: metric NAME on ps/T (empty: no such line)
m() { curl -sf "http://127.0.0.1:${MP[$1]}/metrics" | awk -v n="$2" '$1 == n { print $2 }'; }
cut_bytes() { m "$1" ps_replication_cut_through_bytes_total; }
# big TAG [ETCD JOB]: big_assign_client on $dir/$JOB.json with the commands
# of $dir/TAG.cmd; its output in $dir/TAG.out, its exit status in $rc
big() {
  "$BIG_ASSIGN_CLIENT" "$dir/$JOB.json" "${2:-$ETCD_ENDPOINTS}" "${3:-$JOB}" \
    < "$dir/$1.cmd" > "$dir/$1.out" 2> "$dir/$1.log"
  rc=$?
}
# clean_logs WHAT: no ERROR and no sanitizer report in $JOB's ps logs
clean_logs() {
  local t pat=" ERROR |runtime error|Sanitizer|==[0-9]+=="
  for t in 0 1; do
    if grep -qE "$pat" "$dir/$JOB$t.log"; then
      bad "$JOB: $1: ps/$t's log holds no ERROR and no sanitizer report" \
        "$(grep -E "$pat" "$dir/$JOB$t.log" | head -n 20)"
    else
      ok "$JOB: $1: ps/$t's log holds no ERROR and no sanitizer report"
    fi
  done
}
# links_opened T N: ps/T opened its link to the other ps N times
links_opened() {
  local n
  n=$(grep -c "replication to ps/$((1 - $1)) over its replication link" "$dir/$JOB$1.log")
  [ "$n" = "$2" ] && ok "$JOB: ps/$1 opened its link to ps/$((1 - $1)) $2 time(s)" ||
    bad "$JOB: ps/$1 opened its link to ps/$((1 - $1)) $2 time(s) ($n)" \
      "$(grep -h "replication" "$dir/$JOB$1.log" | tail -n 20)"
}

# The variables of a and g: NAME SHARD ELEMS (floats: 4 bytes each)
VARS=(a0 0 2097152 # 8 MiB
  a1 0 524288      # 2 MiB exactly
  a2 0 524287      # 2 MiB - 4 bytes: not forwarded
  a3 0 786432      # 3 MiB
  b0 1 1048576     # 4 MiB
  b1 1 500000      # 2000000 bytes: not forwarded
  b2 1 1310720     # 5 MiB
  b3 1 524289)     # 2 MiB + 4 bytes
# rounds TAG N: $dir/TAG.cmd creates VARS and assigns N values to each, in
# turns (seed 100*round + k), then reads each back as its last; LARGE[S]
# and SMALL[S]: the bytes of shard S's assigns of >= 2 MiB, the fewest
# bytes of one smaller assign of S
rounds() {
  local r k name shard elems bytes
  LARGE=(0 0) SMALL=(0 0) NCALLS=0 NVARS=$((${#VARS[@]} / 3))
  : > "$dir/$1.cmd"
  for ((k = 0; k < NVARS; k++)); do
    echo "create ${VARS[3 * k + 1]} ${VARS[3 * k]} ${VARS[3 * k + 2]}" >> "$dir/$1.cmd"
  done
  for ((r = 1; r <= $2; r++)); do
    for ((k = 0; k < NVARS; k++)); do
      name=${VARS[3 * k]} shard=${VARS[3 * k + 1]} elems=${VARS[3 * k + 2]}
      echo "assign $shard $name $elems $((100 * r + k))" >> "$dir/$1.cmd"
      bytes=$((4 * elems))
      NCALLS=$((NCALLS + 1))
      if [ "$bytes" -ge "$MIB2" ]; then
        LARGE[shard]=$((LARGE[shard] + bytes))
      elif [ "${SMALL[shard]}" = 0 ] || [ "$bytes" -lt "${SMALL[shard]}" ]; then
        SMALL[shard]=$bytes
      fi
    done
  done
  for ((k = 0; k < NVARS; k++)); do
    echo "read ${VARS[3 * k + 1]} ${VARS[3 * k]} ${VARS[3 * k + 2]} $((100 * $2 + k))" >> "$dir/$1.cmd"
  done
}
# acked TAG WHAT: TAG's client succeeded: $NCALLS acks, each variable
# reads back as its last value
acked() {
  local n s
  n=$(grep -c '^ack ' "$dir/$1.out")
  s=$(grep -c '^same ' "$dir/$1.out")
  if [ "$rc" = 0 ] && [ "$n" = "$NCALLS" ] && [ "$s" = "$NVARS" ]; then
    ok "$JOB: $2: $NCALLS large assigns acknowledged, each of $NVARS variables reads back as its last"
  else
    bad "$JOB: $2: $NCALLS large assigns acknowledged, each of $NVARS variables reads back as its last (exit $rc, $n acks, $s same)" \
      "$(grep -v '^ack ' "$dir/$1.out" | head -n 20; tail -n 5 "$dir/$1.log")"
  fi
}
# counted T BEFORE WANT MAX WHAT: ps/T's counter grew from BEFORE by WANT
# bytes at least and by less than MAX
counted() {
  local now
  now=$(cut_bytes "$1")
  if [ -n "$now" ] && [ "$((now - $2))" -ge "$3" ] && [ "$((now - $2))" -lt "$4" ]; then
    ok "$JOB: ps/$1's ps_replication_cut_through_bytes_total grew by $((now - $2)) ($5)"
  else
    bad "$JOB: ps/$1's ps_replication_cut_through_bytes_total grew by >= $3 and < $4 ($5): '$2' -> '$now'" \
      "$(curl -s "http://127.0.0.1:${MP[$1]}/metrics" | grep -E '^ps_repl')"
  fi
}

# start2 WHAT: 2 ps-server --replicas 2 of $JOB ("WHAT start"), or the
# test ends; then their ports (ports)
start2() {
  if repl_start 2 "$dir/$JOB.json" "$JOB"; then
    ok "$1 start"
  else
    bad "$1 start" "$(tail -n 5 "$dir/$JOB"[01].log)"
    finish; exit 1
  fi
  for t in 0 1; do ports "$t"; done
}

# ---- a. large assigns on 2 ps --replicas 2 ----
start2 "2 ps-server --replicas 2"
if [ -n "${MP[0]}" ] && [ -n "${MP[1]}" ] && [ -n "${LP[0]}" ] && [ -n "${LP[1]}" ]; then
  ok "each ps logs its metrics port and its link port (${MP[*]}; ${LP[*]})"
else
  bad "each ps logs its metrics port and its link port" "$(head -n 20 "$dir/$JOB"[01].log)"
  finish; exit 1
fi
repl_wait_status "${IN_SYNC[@]}" || bad "each shard has its primary and in-sync backup" "$out"
c0=$(cut_bytes 0) c1=$(cut_bytes 1)
[ "$c0" = 0 ] && [ "$c1" = 0 ] && ok "ps_replication_cut_through_bytes_total is 0 at the start" ||
  bad "ps_replication_cut_through_bytes_total is 0 at the start ('$c0', '$c1')"
curl -sf "http://127.0.0.1:${MP[0]}/metrics" |
  grep -qx '# TYPE ps_replication_cut_through_bytes_total counter' &&
  ok "ps_replication_cut_through_bytes_total is typed counter" ||
  bad "ps_replication_cut_through_bytes_total is typed counter"
rounds a 5
big a
acked a "a"
counted 0 "$c0" "${LARGE[0]}" "$((LARGE[0] + SMALL[0]))" \
  "shard 0's assigns of >= 2 MiB, ${LARGE[0]} bytes, not one of the smaller"
counted 1 "$c1" "${LARGE[1]}" "$((LARGE[1] + SMALL[1]))" \
  "shard 1's assigns of >= 2 MiB, ${LARGE[1]} bytes, not one of the smaller"
repl_verify 4 4

# ---- b. failing large assigns: their stages dropped ----
V=2097152 # 8 MiB
{
  echo "create 0 v $V"
  echo "assign 0 v $V 1"
} > "$dir/b0.cmd"
big b0
[ "$rc" = 0 ] && grep -q '^ack v 1 ' "$dir/b0.out" && ok "b: v (8 MiB) made and assigned" ||
  bad "b: v (8 MiB) made and assigned (exit $rc)" "$(cat "$dir/b0.out" "$dir/b0.log")"
e0=$(epoch)
c0=$(cut_bytes 0)
{
  for ((i = 1; i <= 12; i++)); do echo "assign 0 v $((V + 1)) $((1000 + i))"; done
  echo "assign 0 v $V 2001 double"
  echo "assign 0 v $V 2002 double"
  echo "assign 0 v $V 77"
  echo "read 0 v $V 77"
} > "$dir/b.cmd"
big b
n=$(grep -cF "INVALID_ARGUMENT: Assign requires shapes of both tensors to match. lhs shape= [$V] rhs shape= [$((V + 1))]   [[{{node v/Assign}}]]" "$dir/b.out")
[ "$n" = 12 ] && ok "b: 12 assigns of [$((V + 1))] to v [$V] refused: shapes must match, naming v" ||
  bad "b: 12 assigns of [$((V + 1))] to v [$V] refused: shapes must match, naming v ($n)" "$(cat "$dir/b.out")"
n=$(grep -cF "INVALID_ARGUMENT: Assign v: value has dtype double that does not match dtype float of the variable" "$dir/b.out")
[ "$n" = 2 ] && ok "b: then 2 float64 assigns to float v refused, naming v" ||
  bad "b: then 2 float64 assigns to float v refused, naming v ($n)" "$(cat "$dir/b.out")"
grep -qx "ack v 77 $((4 * V))" "$dir/b.out" && grep -qx "same v 77" "$dir/b.out" &&
  ok "b: then a good assign of v is acknowledged and reads back" ||
  bad "b: then a good assign of v is acknowledged and reads back" "$(tail -n 3 "$dir/b.out" "$dir/b.log")"
counted 0 "$c0" "$((4 * V))" "$((8 * V))" "the good assign only, not the 14 refused"
steady b
links_opened 0 1
repl_verify 5 4
if grep -q "stages at once" "$dir/$JOB"[01].log; then
  bad "b: no ps ran out of stages" "$(grep -h "stages at once" "$dir/$JOB"[01].log)"
else
  ok "b: no ps ran out of stages"
fi
clean_logs "after b"

# ---- c. hostile frames on the links ----
# hostile T: as ps/(1-T), every case on ps/T's link; a line per case:
# NAME|CODE|APPLIED|TEXT|closed or open (after the ACK; APPLIED: its
# entries applied)
hostile() {
  local addr
  addr=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ps"][int(sys.argv[2])])' "$dir/$JOB.json" "$1")
  timeout 60 /usr/bin/python3 - "$addr" "$((1 - $1))" << 'PY'
import socket, struct, sys
import grpc
from pbwire import fields, ld, varint, vi  # tests/support (lib.sh sets PYTHONPATH)
addr, other = sys.argv[1], int(sys.argv[2])
MAGIC = 0x4c525350
HELLO, BATCH, ACK, STAGE, UNSTAGE = 1, 2, 3, 4, 5

def hdr(kind, meta, data):
    return struct.pack("<IIQQ", MAGIC, kind, meta, data)

def stage(sid, total, off, data=b"", claim=None):
    n = len(data) if claim is None else claim
    return hdr(STAGE, 24, n) + struct.pack("<QQQ", sid, total, off) + data

def unstage(sid):
    return hdr(UNSTAGE, 8, 0) + struct.pack("<Q", sid)

def entry(kind=0, value_bytes=16, initialized=True, staged=0):
    # float [4] w of shard 0
    e = vi(1, kind) + vi(2, 0) + ld(3, b"w") + vi(4, 1) + ld(5, varint(4))
    if value_bytes:
        e += vi(11, value_bytes)
    if initialized:
        e += vi(12, 1)
    if staged:
        e += vi(17, staged)
    return e

def request(entries=(), open_link=False):
    q = vi(2, other) + b"".join(ld(3, e) for e in entries)
    return q + (vi(5, 1) if open_link else b"")

def batch(*entries):
    q = request(entries)
    return hdr(BATCH, len(q), 0) + q

rep = grpc.insecure_channel(addr).unary_unary("/paramserver.Ps/Replicate")
f = dict(fields(rep(request(open_link=True), timeout=10)))
port, key = f.get(3, 0), f.get(4, b"")
if not port or len(key) != 32:
    print("no link offered: %r" % f)
    sys.exit(1)

class Bad(Exception):
    pass

def read(s, n):
    b = b""
    while len(b) < n:
        k = s.recv(n - len(b))
        if not k:
            raise Bad("closed after %d of %d bytes" % (len(b), n))
        b += k
    return b

def ack(s):
    magic, kind, meta, data = struct.unpack("<IIQQ", read(s, 24))
    if magic != MAGIC or kind != ACK or data != 0 or not 20 <= meta <= 275:
        raise Bad("bad header: magic %08x kind %d meta %d data %d" % (magic, kind, meta, data))
    m = read(s, meta)
    code, applied = struct.unpack("<Iq", m[:12])
    return code, applied, m[20:].decode("ascii", "replace")

def after(s):
    s.settimeout(1)
    try:
        return "closed" if s.recv(1) == b"" else "more bytes"
    except socket.timeout:
        return "open"
    except ConnectionResetError:
        return "closed"

def connect():
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(hdr(HELLO, 36, 0) + struct.pack("<I", other) + key)
    code, _, text = ack(s)
    if code != 0:
        raise Bad("HELLO refused: %d %s" % (code, text))
    return s

# exactly the bytes the ps reads before it answers: unread bytes at its
# close would make the kernel reset the connection, maybe before the ACK
cases = [
    ("stage_meta16", hdr(STAGE, 16, 0) + bytes(16)),
    ("stage_id0", stage(0, 100, 0)),
    ("stage_total0", stage(5, 0, 0)),
    ("stage_total_big", stage(5, 67108865, 0)),
    ("stage_past", stage(5, 10, 8, claim=4)),
    ("stage_start", stage(7, 100, 10, claim=10)),
    ("stage_ninth", b"".join(stage(i, 2, 0, b"x") for i in range(1, 9)) + stage(9, 2, 0, claim=1)),
    ("stage_offset", stage(3, 10, 0, b"abcd") + stage(3, 10, 6, claim=2)),
    ("stage_total_changed", stage(3, 10, 0, b"abcd") + stage(3, 12, 4, claim=2)),
    ("unstage_meta4", hdr(UNSTAGE, 4, 0) + bytes(4)),
    ("batch_missing", batch(entry(staged=42))),
    ("batch_incomplete", stage(42, 16, 0, bytes(8)) + batch(entry(staged=42))),
    ("batch_unstaged", stage(42, 16, 0, bytes(16)) + unstage(42) + batch(entry(staged=42))),
    ("batch_wrong_size", stage(42, 20, 0, bytes(20)) + batch(entry(staged=42))),
    ("batch_novalue", batch(entry(value_bytes=0, initialized=False, staged=9))),
    ("batch_delete", batch(entry(kind=3, value_bytes=0, initialized=False, staged=9))),
]
for name, frames in cases:
    try:
        s = connect()
        s.sendall(frames)
        code, applied, text = ack(s)
        print("%s|%d|%d|%s|%s" % (name, code, applied, text, after(s)))
        s.close()
    except (Bad, OSError) as e:
        print("%s|no answer|%r|" % (name, e))
# UNSTAGE of an id never staged: no answer, and the connection serves on
# (an empty batch is applied: ACK 0)
try:
    s = connect()
    s.sendall(unstage(999))
    s.settimeout(0.5)
    try:
        got = "answered %r" % s.recv(24)
    except socket.timeout:
        got = "silent"
    s.settimeout(10)
    s.sendall(batch())
    code, _, text = ack(s)
    print("unstage_unknown|%s|%d|%s|%s" % (got, code, text, after(s)))
    s.close()
except (Bad, OSError) as e:
    print("unstage_unknown|no answer|%r|" % e)
# staged bytes never come in a Replicate call
try:
    rep(request([entry(staged=7)]), timeout=10)
    print("grpc_staged|OK||")
except grpc.RpcError as e:
    print("grpc_staged|%s|%s|" % (e.code().name, e.details()))
PY
}
# frame_is OUT T NAME CODE TEXT: case NAME on ps/T's link got an ACK with
# CODE and TEXT, then the connection was closed; a STAGE or UNSTAGE (NAME
# stage_* or unstage_*): the ACK has -1 entries applied and ps/T logged
# the WARN naming ps/(1-T), the HELLO's task, and TEXT; a BATCH: 0 applied
# and no such WARN
frame_is() {
  local warn="replication link: a frame from ps/$((1 - $2)) was refused: $5" what
  if [[ $3 == stage_* || $3 == unstage_* ]]; then
    what="code $4 \"$5\" and -1 applied, then closed; WARN \"$warn\""
    if grep -qxF "$3|$4|-1|$5|closed" <<< "$1" &&
      grep -F " WARN " "$dir/$JOB$2.log" | grep -qF "$warn"; then
      ok "ps/$2's link, $3: $what"
    else
      bad "ps/$2's link, $3: $what" "$(grep "^$3|" <<< "$1"; grep -F "a frame from" "$dir/$JOB$2.log")"
    fi
  else
    what="code $4 \"$5\" and 0 applied, then closed; no WARN of a refused frame"
    if grep -qxF "$3|$4|0|$5|closed" <<< "$1" && ! grep -qF "was refused: $5" "$dir/$JOB$2.log"; then
      ok "ps/$2's link, $3: $what"
    else
      bad "ps/$2's link, $3: $what" "$(grep "^$3|" <<< "$1"; grep -F "was refused: $5" "$dir/$JOB$2.log")"
    fi
  fi
}
for t in 0 1; do
  out=$(hostile "$t" 2>&1)
  lim="(the limit is $LIMIT)"
  frame_is "$out" "$t" stage_meta16 3 "replication link: a stage header of 16 bytes"
  frame_is "$out" "$t" stage_id0 3 "replication link: stage 0 of 100 bytes $lim"
  frame_is "$out" "$t" stage_total0 3 "replication link: stage 5 of 0 bytes $lim"
  frame_is "$out" "$t" stage_total_big 3 "replication link: stage 5 of $((LIMIT + 1)) bytes $lim"
  frame_is "$out" "$t" stage_past 3 "replication link: 4 bytes at 8 of stage 5, past its 10 bytes"
  frame_is "$out" "$t" stage_start 3 "replication link: stage 7 starts at byte 10, not 0"
  frame_is "$out" "$t" stage_ninth 8 "replication link: more than 8 stages at once"
  frame_is "$out" "$t" stage_offset 3 "replication link: stage 3: 2 bytes at 6, where 4 of 10 came"
  frame_is "$out" "$t" stage_total_changed 3 "replication link: stage 3: 2 bytes at 4, where 4 of 10 came"
  frame_is "$out" "$t" unstage_meta4 3 "replication link: an unstage header of 4 bytes"
  whole="replication link: entry 0 (w) names stage 42, which did not come whole with 16 bytes"
  frame_is "$out" "$t" batch_missing 3 "$whole"
  frame_is "$out" "$t" batch_incomplete 3 "$whole"
  frame_is "$out" "$t" batch_unstaged 3 "$whole"
  frame_is "$out" "$t" batch_wrong_size 3 "$whole"
  frame_is "$out" "$t" batch_novalue 3 "Replicate: entry 0 (w) names stage 9 but is no value"
  frame_is "$out" "$t" batch_delete 3 "Replicate: entry 0 (w) names stage 9 but is no value"
  if grep -qxF "unstage_unknown|silent|0||open" <<< "$out"; then
    ok "ps/$t's link: an UNSTAGE of an unknown id is not answered; the connection serves on"
  else
    bad "ps/$t's link: an UNSTAGE of an unknown id is not answered; the connection serves on" \
      "$(grep "^unstage_unknown|" <<< "$out")"
  fi
  if grep -qxF "grpc_staged|INVALID_ARGUMENT|Replicate: entry 0 (w) names stage 7: staged bytes come only over the replication link|" <<< "$out"; then
    ok "ps/$t: a Replicate call with a staged entry: INVALID_ARGUMENT, staged bytes come only over the link"
  else
    bad "ps/$t: a Replicate call with a staged entry: INVALID_ARGUMENT, staged bytes come only over the link" \
      "$(grep -v '|closed$' <<< "$out")"
  fi
done
for t in 0 1; do
  kill -0 "${P[$t]}" 2> /dev/null && ok "c: ps/$t is alive after the hostile frames" ||
    bad "c: ps/$t is alive after the hostile frames" "$(tail -n 5 "$dir/$JOB$t.log")"
done
c0=$(cut_bytes 0) c1=$(cut_bytes 1)
{
  echo "assign 0 a0 2097152 900"
  echo "assign 1 b2 1310720 901"
  echo "assign 0 v $V 902"
  echo "assign 1 b0 1048576 903"
  echo "read 0 a0 2097152 900"
  echo "read 1 b2 1310720 901"
  echo "read 0 v $V 902"
  echo "read 1 b0 1048576 903"
} > "$dir/c.cmd"
big c
[ "$rc" = 0 ] && [ "$(grep -c '^ack ' "$dir/c.out")" = 4 ] && [ "$(grep -c '^same ' "$dir/c.out")" = 4 ] &&
  ok "c: then 4 large assigns on both shards acknowledged and read back" ||
  bad "c: then 4 large assigns on both shards acknowledged and read back (exit $rc)" "$(cat "$dir/c.out" "$dir/c.log")"
counted 0 "$c0" "$((4 * 2097152 + 4 * V))" "$((4 * 2097152 + 4 * V + 1))" "still forwarded"
counted 1 "$c1" "$((4 * 1310720 + 4 * 1048576))" "$((4 * 1310720 + 4 * 1048576 + 1))" "still forwarded"
repl_wait_status "${IN_SYNC[@]}" && ok "c: both shards keep their in-sync backup" ||
  bad "c: both shards keep their in-sync backup" "$out"
links_opened 0 1
links_opened 1 1
repl_verify 5 4
clean_logs "after c"

# ---- d. kill -9 of the backup during streams of large assigns ----
# two streams, of s0 and s1: while one's batch is out, the other's bytes
# arrive, so the backup most likely dies with stages on the way
S=1048576 # 4 MiB
declare -a D
for k in 0 1; do
  printf 'create 0 s%s %s\nstream 0 s%s %s %s\n' "$k" "$S" "$k" "$S" "$dir/stop-d" > "$dir/d$k.cmd"
  "$BIG_ASSIGN_CLIENT" "$dir/$JOB.json" "$ETCD_ENDPOINTS" "$JOB" < "$dir/d$k.cmd" \
    > "$dir/d$k.out" 2> "$dir/d$k.log" &
  D[$k]=$!
done
acks() { grep -c '^ack ' "$dir/d$1.out"; }
# more_acks N: each stream has N acks more than it had (30 s)
more_acks() {
  local k
  local -a had=("$(acks 0)" "$(acks 1)")
  for k in 0 1; do
    wait_count "$dir/d$k.out" '^ack ' "$((had[k] + $1))" 30 || return 1
  done
}
for k in 0 1; do
  wait_for "$dir/d$k.out" "^ack 5 " 60 || bad "d: the stream of 4 MiB assigns to s$k on shard 0 runs" \
    "$(cat "$dir/d$k.out" "$dir/d$k.log")"
done
kill -KILL "${P[1]}"; wait "${P[1]}" 2> /dev/null
P[1]=""
if more_acks 10; then
  ok "d: after kill -9 of ps/1 both streams' assigns go on being acknowledged ($(acks 0), $(acks 1))"
else
  bad "d: after kill -9 of ps/1 both streams' assigns go on being acknowledged ($(acks 0), $(acks 1))" \
    "$(tail -n 3 "$dir"/d[01].out "$dir"/d[01].log; tail -n 10 "$dir/${JOB}0.log")"
fi
kill -0 "${P[0]}" 2> /dev/null && ok "d: ps/0, shard 0's primary, is alive" ||
  bad "d: ps/0, shard 0's primary, is alive" "$(tail -n 20 "$dir/${JOB}0.log")"
if repl_wait_status '^shard 0: ps/0 primary' && ! grep '^shard 0:' <<< "$out" | grep -q 'ps/1'; then
  ok "d: shard 0 runs degraded on ps/0"
else
  bad "d: shard 0 runs degraded on ps/0" "$out"
fi
start_one 1
if wait_for "$dir/${JOB}1.out" "ready on" 60; then
  ok "d: ps/1 restarts"
else
  bad "d: ps/1 restarts" "$(tail -n 10 "$dir/${JOB}1.log")"
fi
ports 1
if repl_wait_status '^shard 0: ps/0 primary.*ps/1 backup' '^shard 1: ps/[01] primary.*ps/[01] backup'; then
  ok "d: ps/1 rejoins: both shards in sync again"
else
  bad "d: ps/1 rejoins: both shards in sync again" "$out"
fi
c0=$(cut_bytes 0)
more_acks 5 || bad "d: both streams acknowledged after the rejoin ($(acks 0), $(acks 1))"
# the link may come back a little after the copy (a primary whose offer
# failed asks again a second later): up to 10 s of the streams for it
for ((i = 0; i < 100; i++)); do
  v=$(cut_bytes 0)
  [ -n "$v" ] && [ "$((v - c0))" -ge "$((4 * S))" ] && break
  sleep 0.1
done
counted 0 "$c0" "$((4 * S))" "$((1 << 40))" "forwarded to the rejoined ps/1"
touch "$dir/stop-d"
for k in 0 1; do
  wait "${D[$k]}"; drc=$?
  last=$(sed -n 's/^last //p' "$dir/d$k.out")
  if [ "$drc" = 0 ] && ! grep -q '^error' "$dir/d$k.out" && [ -n "$last" ] && [ "$last" -gt 0 ] &&
    grep -qx "same s$k $last" "$dir/d$k.out"; then
    ok "d: all $last assigns of the stream to s$k acknowledged, s$k reads back as the last"
  else
    bad "d: all assigns of the stream to s$k acknowledged, s$k reads back as the last (exit $drc)" \
      "$(grep -v '^ack ' "$dir/d$k.out"; tail -n 5 "$dir/d$k.log")"
  fi
done
links_opened 0 2
repl_verify 7 4
stop_all
stopped "stopped after d"

# ---- e and f: a cluster of their own ----
# (in cut, their 50 MiB would make d's rejoin copy more than
# --max-tensor-bytes, which ps does not survive yet: a batch of the copy
# goes over the backup's limit, the backup refuses it, and the primary
# waits on the half-written batch)
JOB=many
start2 "2 ps-server --replicas 2 (again)"
repl_wait_status "${IN_SYNC[@]}" || bad "e: each shard has its primary and in-sync backup" "$out"

# ---- e. multi-item Updates: a scatter with indices, then 3 assigns ----
# NAME ELEMS of the Update's items, in order: mt scattered (64K int64
# indices, 64K floats), ma 8 MiB, ms 1 MiB (not forwarded), mb 3 MiB
MULTI=(mt 65536 ma 2097152 ms 262144 mb 786432)
NMULTI=8
MLARGE=$((NMULTI * 4 * (MULTI[3] + MULTI[7])))
c0=$(cut_bytes 0)
{
  printf 'create 0 %s %s\n' "${MULTI[@]}"
  echo "assign 0 mt ${MULTI[1]} 1" # (a scatter needs it initialized)
} > "$dir/e-0.cmd"
big e-0
[ "$rc" = 0 ] && [ "$(grep -c '^created ' "$dir/e-0.out")" = 4 ] &&
  ok "e: mt, ma, ms, mb made on shard 0, mt assigned" ||
  bad "e: mt, ma, ms, mb made on shard 0, mt assigned (exit $rc)" "$(cat "$dir/e-0.out" "$dir/e-0.log")"
nack=0 diverged=0 vouts=""
for ((r = 1; r <= NMULTI; r++)); do
  echo "multi 0 $((10 * r)) ${MULTI[*]}" > "$dir/e-$r.cmd"
  big "e-$r"
  [ "$rc" = 0 ] && grep -qx "ack multi $((10 * r)) [0-9]*" "$dir/e-$r.out" && nack=$((nack + 1))
  if ! repl_identical 4 0; then
    diverged=$((diverged + 1))
    vouts+="after Update $r:"$'\n'"$vout"$'\n'
  fi
done
[ "$nack" = "$NMULTI" ] &&
  ok "e: $NMULTI Updates of a scatter with indices and 3 assigns (8, 1, 3 MiB) acknowledged" ||
  bad "e: $NMULTI Updates of a scatter with indices and 3 assigns (8, 1, 3 MiB) acknowledged ($nack)" \
    "$(cat "$dir"/e-[1-9].out; tail -n 5 "$dir"/e-[1-9].log)"
[ "$diverged" = 0 ] &&
  ok "e: psctl verify: replicas identical after each of the $NMULTI multi-item Updates" ||
  bad "e: psctl verify: replicas identical after each of the $NMULTI multi-item Updates ($diverged differ)" \
    "$vouts"
# the last Update's seed: mt's; ma, ms, mb have the next 3
{
  for k in 0 1 2 3; do
    echo "read 0 ${MULTI[2 * k]} ${MULTI[2 * k + 1]} $((10 * NMULTI + k))"
  done
} > "$dir/e.cmd"
big e
[ "$rc" = 0 ] && [ "$(grep -c '^same ' "$dir/e.out")" = 4 ] &&
  ok "e: mt, ma, ms and mb read back as the last Update left them" ||
  bad "e: mt, ma, ms and mb read back as the last Update left them (exit $rc)" \
    "$(cat "$dir/e.out" "$dir/e.log")"
counted 0 "$c0" "$MLARGE" "$((MLARGE + NMULTI * 4 * MULTI[5]))" \
  "the $NMULTI Updates' 8 and 3 MiB assigns, $MLARGE bytes, not the 1 MiB ones"

# ---- f. more concurrent large assigns than a backup's 8 stages ----
NSTREAM=12
CE=786432 # 3 MiB
e0=$(epoch)
c1=$(cut_bytes 1)
declare -a F MARK
for t in 0 1; do MARK[$t]=$(stat -c %s "$dir/$JOB$t.log"); done
for ((k = 0; k < NSTREAM; k++)); do
  printf 'create 1 c%s %s\nstream 1 c%s %s %s\n' "$k" "$CE" "$k" "$CE" "$dir/stop-f" > "$dir/f-$k.cmd"
  "$BIG_ASSIGN_CLIENT" "$dir/$JOB.json" "$ETCD_ENDPOINTS" "$JOB" < "$dir/f-$k.cmd" \
    > "$dir/f-$k.out" 2> "$dir/f-$k.log" &
  F[$k]=$!
done
# about 3 s of all of them at once
for ((k = 0; k < NSTREAM; k++)); do wait_for "$dir/f-$k.out" '^ack 1 ' 60; done
sleep 3
touch "$dir/stop-f"
nok=0 total=0 fails=""
for ((k = 0; k < NSTREAM; k++)); do
  wait "${F[$k]}"; brc=$?
  last=$(sed -n 's/^last //p' "$dir/f-$k.out")
  if [ "$brc" = 0 ] && ! grep -q '^error' "$dir/f-$k.out" && [ -n "$last" ] && [ "$last" -gt 0 ] &&
    grep -qx "same c$k $last" "$dir/f-$k.out"; then
    nok=$((nok + 1)) total=$((total + last))
  else
    fails+="c$k (exit $brc): $(grep -v '^ack ' "$dir/f-$k.out"; tail -n 3 "$dir/f-$k.log")"$'\n'
  fi
done
[ "$nok" = "$NSTREAM" ] &&
  ok "f: $NSTREAM concurrent streams of 3 MiB assigns on shard 1: all $total acknowledged, each variable reads back as its stream's last" ||
  bad "f: $NSTREAM concurrent streams of 3 MiB assigns on shard 1: all acknowledged, each variable reads back as its stream's last ($nok did)" \
    "$fails"
counted 1 "$c1" 1 "$((total * 4 * CE + 1))" "some of the $((total * 4 * CE)) bytes of the streams"
since=$(for t in 0 1; do
  tail -c +"$((MARK[t] + 1))" "$dir/$JOB$t.log" |
    grep -E " (WARN|ERROR) |stages at once|was refused|refused a frame" | sed "s|^|ps/$t: |"
done)
[ -z "$since" ] && ok "f: no WARN or ERROR in either log, no \"stages at once\", no refused frame" ||
  bad "f: no WARN or ERROR in either log, no \"stages at once\", no refused frame" "$since"
steady f
links_opened 1 1
repl_verify 4 12

stop_all
stopped "f, stopped"

# ---- g. --no-repl-link ----
JOB=nolink
FLAGS=(--no-repl-link)
start2 "2 ps-server --replicas 2 --no-repl-link"
repl_wait_status "${IN_SYNC[@]}" || bad "g: each shard has its primary and in-sync backup" "$out"
rounds g 2
big g
acked g "g"
for t in 0 1; do
  v=$(cut_bytes "$t")
  [ "$v" = 0 ] && ok "g: ps/$t's ps_replication_cut_through_bytes_total stays 0" ||
    bad "g: ps/$t's ps_replication_cut_through_bytes_total stays 0 ('$v')"
done
repl_verify 4 4
repl_no_link g
stop_all
stopped "g, stopped"
etcd_stop

# ---- h. R = 1 ----
JOB=r1
if start_ps_cluster 2 "$dir/r1.log" --metrics-port 0 --max-tensor-bytes 64M; then
  ok "2 ps-server (R = 1) start"
else
  bad "2 ps-server (R = 1) start" "$(tail -n 5 "$dir/r1.log")"
  finish; exit 1
fi
R1_PIDS=("${PS_PIDS[@]}")
echo "{\"ps\": [$PS_LIST]}" > "$dir/r1.json"
rounds h 2
big h - -
acked h "h (R = 1)"
for t in 0 1; do
  MP[$t]=$(sed -n "s/.*ps\/$t: metrics on port \([0-9]*\) .*/\1/p" "$dir/r1.log" | tail -n 1)
  v=$(curl -sf "http://127.0.0.1:${MP[$t]}/metrics")
  if grep -q '^ps_uptime_seconds' <<< "$v" && ! grep -q '^ps_replication' <<< "$v"; then
    ok "h: ps/$t serves metrics, no replication ones"
  else
    bad "h: ps/$t serves metrics, no replication ones" "$(grep -E '^ps_(repl|uptime)' <<< "$v")"
  fi
done
for t in 0 1; do
  kill -TERM "${R1_PIDS[$t]}" 2> /dev/null; wait "${R1_PIDS[$t]}" 2> /dev/null; X[$t]=$?
  [ "${X[$t]}" = 0 ] && ok "h: ps/$t exits 0 on SIGTERM" || bad "h: ps/$t exits 0 on SIGTERM (${X[$t]})"
done
R1_PIDS=()
if grep -qE " ERROR |runtime error|Sanitizer|==[0-9]+==" "$dir/r1.log"; then
  bad "h: no ERROR and no sanitizer report" "$(grep -E " ERROR |runtime error|Sanitizer|==[0-9]+==" "$dir/r1.log")"
else
  ok "h: no ERROR and no sanitizer report"
fi
finish
