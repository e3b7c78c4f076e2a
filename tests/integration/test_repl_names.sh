#!/usr/bin/env bash
# With --replicas a ps holds the shards it backs up in the same store as
# its own, keyed by name: a variable name belongs to one shard (DESIGN.md
# "Shards and their placement").  A real etcd, real ps-server --replicas 2,
# failover_client making and updating variable x:
#  a. 2 ps (each holds both shards): x made and updated on shard 0; making
#     x on shard 1 is refused (ALREADY_EXISTS, naming x and both shards)
#     by ps/1, which holds shard 0's x as its backup.  Nothing changed:
#     the view's epoch is the same, both shards keep their in-sync
#     backup, psctl verify says identical, shard 0's x holds its acks.
#     Then a partitioned w, a part in each shard: a Delete of w sent to
#     shard 0 removes shard 0's part only, not ps/0's copy of shard 1's
#     (psctl verify: identical).
#  b. 3 ps (shard 0 on ps/0+ps/1, shard 2 on ps/2+ps/0): x made on shard
#     0, then on shard 2, whose primary ps/2 does not hold shard 0.  ps/0
#     refuses shard 2's CREATE of x (an ERROR naming x and both shards)
#     and is dropped from shard 2, which goes on, degraded, on ps/2; shard
#     0's x is never touched by shard 2's updates (its value is its own
#     acks, psctl verify: shard 0 identical); the rejoins that fail again
#     back off (a WARN), so the view's epoch grows slowly; out of shard 2,
#     ps/0 keeps no copy of it (shard 2's y, deleted there, is made again
#     in shard 0 on ps/0); once x is
#     deleted from shard 2, ps/0 rejoins it and every shard is identical.
#  No ps crashes, no sanitizer report.
set -u
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
source "$(dirname "$0")/../support/repl.sh"
test_init repl_names
export PS_RPC_TIMEOUT=20
/usr/bin/python3 -c 'import grpc' 2> /dev/null ||
  { bad "/usr/bin/python3 has grpc (deploy/setup.sh installs python3-grpcio)"; finish; exit 1; }
etcd_start repl_names || { bad "etcd starts"; finish; exit 1; }

declare -a P
JOB=two
N=2
start_one() {
  : > "$dir/$JOB$1.out"
  "$PS_SERVER" --cluster "$dir/$JOB.json" --job ps --task "$1" --replicas 2 \
    --etcd "$ETCD_ENDPOINTS" --repl-job "$JOB" --lease-ttl 2 --grace-secs 2 \
    > "$dir/$JOB$1.out" 2>> "$dir/$JOB$1.log" &
  P[$1]=$!
}
repl_start_one() { start_one "$1"; }
st_() { "$PSCTL" --cluster "$dir/$JOB.json" --etcd "$ETCD_ENDPOINTS" --repl-job "$JOB" \
  --replicas 2 --timeout-ms 5000 "$@"; }
stop_all() {
  local t
  for ((t = 0; t < N; t++)); do kill -TERM "${P[$t]}" 2> /dev/null; wait "${P[$t]}" 2> /dev/null; done
}
test_cleanup_hook() {
  [ -z "${B0:-}" ] || kill -KILL "$B0" 2> /dev/null
  stop_all
}
epoch() { st_ status 2>&1 | sed -n 's/^replication: .*view epoch \([0-9]*\).*/\1/p' | head -1; }

# raw_create T SHARD NAME: a Create of float scalar NAME in SHARD sent
# straight to ps/T (what the client library would refuse to send: it
# checks every ps for the name first); raw_assign T SHARD NAME VALUE: an
# Update assigning VALUE to it.  Each prints "ok" or "code C: TEXT".
raw_create() { raw_call "$1" "$2" "$3" create; }
# raw_part T SHARD NAME OFFSET: a Create of NAME, a [2] float part at
# OFFSET of partitioned variable w [4] (zeros); raw_delete T SHARD NAME
raw_part() { raw_call "$1" "$2" "$3" "part:$4"; }
raw_delete() { raw_call "$1" "$2" "$3" delete; }
raw_assign() { raw_call "$1" "$2" "$3" "$4"; }
raw_call() {
  local addr
  addr=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ps"][int(sys.argv[2])])' "$dir/$JOB.json" "$1")
  timeout 20 /usr/bin/python3 - "$addr" "$2" "$3" "$(epoch)" "$4" << 'PY'
import grpc, struct, sys
from pbwire import ld, varint  # tests/support (lib.sh sets PYTHONPATH)
addr, shard, name, epoch = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), int(sys.argv[4])
what = sys.argv[5]
route = varint(1 << 3) + varint(shard) + varint(2 << 3) + varint(epoch)
if what == "create":
    spec = ld(1, name) + varint(2 << 3) + varint(1)  # DT_FLOAT
    req, method = ld(1, spec) + ld(100, route), "Create"
elif what.startswith("part:"):
    init = ld(1, b"zeros") + ld(12, b"w") + ld(13, varint(4)) + varint(14 << 3) + varint(int(what[5:]))
    spec = ld(1, name) + varint(2 << 3) + varint(1) + ld(3, varint(2)) + ld(4, init)
    req, method = ld(1, spec) + ld(100, route), "Create"
elif what == "delete":
    req, method = ld(1, name) + ld(100, route), "Delete"
else:  # an ASSIGN (op 0) of a float scalar, its 4 bytes inline
    upd = ld(1, name) + varint(3 << 3) + varint(1)
    req = ld(1, upd) + ld(2, struct.pack("<f", float(what))) + ld(100, route)
    method = "Update"
ch = grpc.insecure_channel(addr)
call = ch.unary_unary("/paramserver.Ps/" + method)
try:
    call(req, timeout=10)
    print("ok")
except grpc.RpcError as e:
    print("code %s: %s" % (e.code().name, e.details()))
PY
}

# client TAG SHARD [N [NAME]]: failover_client making NAME (x) on SHARD;
# with N, until N acknowledged updates, then stopped; without, it runs on
# ($CPID)
client() {
  "$FAILOVER_CLIENT" "$dir/$JOB.json" "$ETCD_ENDPOINTS" "$JOB" "$2" "${4:-x}" "$dir/stop-$1" \
    > "$dir/$1.out" 2> "$dir/$1.log" &
  CPID=$!
  [ -n "${3:-}" ] || return 0
  wait_for "$dir/$1.out" "^ack $3 " 60
  touch "$dir/stop-$1"
  wait "$CPID"
}
# acked TAG: the client's acknowledged updates equal the value it read
acked() {
  local a v
  a=$(grep -c '^ack ' "$dir/$1.out")
  v=$(awk '$1 == "value" { print $2 }' "$dir/$1.out")
  [ "$a" -gt 0 ] && [ "$v" = "$a" ]
}
alive() {
  local t
  for ((t = 0; t < N; t++)); do kill -0 "${P[$t]}" 2> /dev/null || return 1; done
}
no_sanitizer() { ! grep -qE "runtime error|Sanitizer|==[0-9]+==" "$dir/$JOB"*.log; }

# ---- a. 2 ps ----
repl_start 2 "$dir/$JOB.json" "$JOB" || { bad "2 ps-server --replicas 2 start" "$(tail -n 5 "$dir/$JOB"*.log)"; finish; exit 1; }
IN2=('^shard 0: ps/0 primary.*ps/1 backup' '^shard 1: ps/1 primary.*ps/0 backup')
repl_wait_status "${IN2[@]}" || bad "two: each shard in sync" "$out"
e0=$(epoch)
client a0 0 50
show="$dir/a0.out $dir/a1.out $dir/${JOB}0.log $dir/${JOB}1.log"
check "two: x on shard 0 takes 50 updates, none lost" acked a0
out=$(raw_create 1 1 x)
check "two: a Create of x in shard 1 sent to ps/1 is refused: ALREADY_EXISTS naming x and both shards" \
  grep -q '^code ALREADY_EXISTS: variable x already exists in shard 0 (on ps/1); with --replicas a variable name belongs to one shard: it cannot also be made in shard 1$' <<< "$out"

check "two: the view's epoch did not move ($e0)" test "$(epoch)" = "$e0"
check "two: both shards keep their in-sync backup" repl_wait_status "${IN2[@]}"
out=$(st_ verify 2>&1)
check "two: psctl verify: shard 0 identical (1 variable), shard 1 identical (0)" \
  bash -c "grep -q '^shard 0: ps/0 ps/1 identical (1 variables)' <<< \"\$1\" && grep -q '^shard 1: ps/1 ps/0 identical (0 variables)' <<< \"\$1\"" _ "$out"
# a Delete of partitioned w on shard 0 takes shard 0's part only: ps/0
# also holds shard 1's part, as its backup
r0=$(raw_part 0 0 w/part_0 0)
r1=$(raw_part 1 1 w/part_1 2)
check "two: parts w/part_0 (shard 0) and w/part_1 (shard 1) made ($r0, $r1)" \
  test "$r0" = ok -a "$r1" = ok
out=$(raw_delete 0 0 w)
check "two: a Delete of w on shard 0 ($out)" test "$out" = ok
out=$(st_ verify 2>&1)
check "two: shard 1's part is still on both its replicas (psctl verify: identical)" \
  bash -c "grep -q '^shard 0: ps/0 ps/1 identical (1 variables)' <<< \"\$1\" && grep -q '^shard 1: ps/1 ps/0 identical (1 variables)' <<< \"\$1\"" _ "$out"
check "two: both ps alive, no sanitizer report" bash -c "$(declare -f alive no_sanitizer); P=(${P[*]}); N=$N; dir='$dir'; JOB=$JOB; alive && no_sanitizer"
stop_all

# ---- b. 3 ps ----
JOB=three
N=3
repl_start 3 "$dir/$JOB.json" "$JOB" || { bad "3 ps-server --replicas 2 start" "$(tail -n 5 "$dir/$JOB"*.log)"; finish; exit 1; }
IN3=('^shard 0: ps/0 primary.*ps/1 backup' '^shard 1: ps/1 primary.*ps/2 backup' '^shard 2: ps/2 primary.*ps/0 backup')
repl_wait_status "${IN3[@]}" || bad "three: each shard in sync" "$out"
show="$dir/b0.out $dir/b2.out $dir/${JOB}0.log $dir/${JOB}2.log"
client b0 0
B0=$CPID
wait_for "$dir/b0.out" "^ack 20 " 60
client y2 2 10 y # y, a variable of shard 2 (ps/2, and ps/0 as its backup)
check "three: y on shard 2 takes 10 updates" acked y2
out=$(raw_create 2 2 x)
check "three: a Create of x in shard 2 sent to ps/2 (which holds no shard 0) is made ($out)" \
  test "$out" = ok
# (before the fix ps/0 shared its own x with shard 2, and this Assign
# reached it)
out=$(raw_assign 2 2 x 1000)
check "three: an Assign of 1000 to shard 2's x is acknowledged ($out)" test "$out" = ok
check "three: ps/0 refuses shard 2's CREATE of x, naming both shards" wait_for "$dir/${JOB}0.log" \
  'ERROR ps/0: Replicate: CREATE of x for shard 2: variable x already exists in shard 0 \(on ps/0\)' 5
check "three: ps/2 drops ps/0 from shard 2 and goes on degraded" wait_for "$dir/${JOB}2.log" \
  'WARN ps/2: shard 2 runs on one replica \(ps/2\)' 5
# the rejoins fail again (the CREATE): they back off
check "three: a rejoin dropped again backs off (a WARN)" wait_for "$dir/${JOB}0.log" \
  'WARN ps/0: replication: out of a shard again [0-9]+ s after the last rejoin: the next rejoin waits [0-9]+ s' 30
# without the backoff a rejoin and its drop every 2 s: 16 epochs in 16 s
e1=$(epoch)
sleep 16
e2=$(epoch)
check "three: the view's epoch grows slowly while the names clash ($e1 -> $e2 in 16 s)" \
  test "$((e2 - e1))" -le 8
# ps/0, out of shard 2, keeps no copy of it: y deleted from shard 2 (on
# ps/2 alone) can be made in shard 0 on ps/0
check "three: ps/0 drops its copy of shard 2 when it is out of it" wait_for "$dir/${JOB}0.log" \
  'INFO ps/0: replication: dropped [0-9]+ variable\(s\) of shard 2 \(no longer a replica of it\)' 5
out=$(raw_delete 2 2 y)
check "three: a Delete of y on shard 2 ($out)" test "$out" = ok
out=$(raw_create 0 0 y)
check "three: y made again in shard 0 on ps/0 ($out)" test "$out" = ok
touch "$dir/stop-b0"
wait "$B0"
B0=""
check "three: shard 0's x took only its own updates, none lost" acked b0
# x gone from shard 2: ps/0 rejoins it
# (psctl rm deletes on every ps: shard 0's x goes too)
check "three: psctl rm x" st_ rm x
# (the rejoin's wait may have grown to 8 s)
insync3() { repl_wait_status "${IN3[@]}" || repl_wait_status "${IN3[@]}" || repl_wait_status "${IN3[@]}"; }
check "three: after x is deleted, every shard is in sync again" insync3
out=$(st_ verify 2>&1)
check "three: psctl verify: every shard identical" \
  bash -c "[ \$(grep -c ' identical (' <<< \"\$1\") = 3 ]" _ "$out"
check "three: the 3 ps alive, no sanitizer report" bash -c "$(declare -f alive no_sanitizer); P=(${P[*]}); N=$N; dir='$dir'; JOB=$JOB; alive && no_sanitizer"
stop_all
finish
