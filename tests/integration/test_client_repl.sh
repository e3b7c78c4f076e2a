#!/usr/bin/env bash
# The client under replicated ps shards (issue 23; worker/LIBRARY.md
# "Replication"), with a real etcd on ports picked at run time:
#  A. against fake ps tasks (repl_fake_ps.py) and views the test writes to
#     etcd itself, the client's side alone:
#     a. a call for shard S goes to S's primary in the view, with
#        Route{S, epoch};
#     b. an update whose primary is gone (UNAVAILABLE) is sent again to the
#        new primary once the view moves on, with the same (client_id, seq);
#     c. an answer from a stale primary (its epoch older than the since of
#        the shard's primary in the client's view) is refused and the call
#        goes to the new primary; one that stays stale fails, naming it;
#     d. psctl status shows each shard's replicas and roles, psctl verify
#        says identical (exit 0) or names the variable that differs and
#        where (exit 1);
#  B. real ps-server --replicas 2 (3 tasks): ps-worker trains linreg while
#     the primary of global_step's shard is killed -9, and goes on to its
#     --steps with the global step never going back; psctl status shows
#     the new roles, psctl verify says identical; a save after the
#     failover writes one part per distinct primary, and restores.
# Every process is stopped by pid however the script ends.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}; PS_WORKER=${PS_WORKER:?}
REPL_CLIENT=${REPL_CLIENT:?}; FAKE_PS=${FAKE_PS:?}
source "$(dirname "$0")/../support/lib.sh"
test_init client-repl
BAD_TAIL=40
command -v etcd > /dev/null || { bad "etcd" "not installed (apt-get install etcd-server)"; finish; }
PY=/usr/bin/python3
"$PY" -c 'import grpc' 2> /dev/null || { bad "python3-grpcio" "not installed (deploy/setup.sh installs it)"; finish; }
export ETCDCTL_API=3

# start_etcd: a one-member etcd on two free ports (again on fresh ones when
# another process took one first); ETCD (HOST:PORT) and ETCD_PID; ready
# when /health says so.
start_etcd() {
  local try p q
  for ((try = 0; try < 5; try++)); do
    read -r p q < <("$PY" -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
    rm -rf "$dir/etcd.data"
    etcd --name t --data-dir "$dir/etcd.data" \
      --listen-client-urls "http://127.0.0.1:$p" --advertise-client-urls "http://127.0.0.1:$p" \
      --listen-peer-urls "http://127.0.0.1:$q" --initial-advertise-peer-urls "http://127.0.0.1:$q" \
      --initial-cluster "t=http://127.0.0.1:$q" --heartbeat-interval 10 --election-timeout 100 \
      --logger zap --log-outputs stderr --log-level warn 2> "$dir/etcd.log" &
    ETCD_PID=$!
    ETCD=127.0.0.1:$p
    local i
    for ((i = 0; i < 200; i++)); do
      if curl -fsS "http://$ETCD/health" 2> /dev/null | grep -q '"health":"true"'; then return 0; fi
      kill -0 "$ETCD_PID" 2> /dev/null || break
      sleep 0.05
    done
    kill -KILL "$ETCD_PID" 2> /dev/null; wait "$ETCD_PID" 2> /dev/null
    grep -q "address already in use" "$dir/etcd.log" || break
    echo "etcd: a port was taken, again on fresh ones"
  done
  bad "etcd started" "$(cat "$dir/etcd.log")"
  finish
}
put_view() { etcdctl --endpoints "$ETCD" put "/paramserver/$1/view" "$2" > /dev/null; }

start_etcd

# ---- A. the client against fake ps tasks ----------------------------------
# fake NAME MODE...: a fake ps; FPID, FADDR
fake() {
  local name=$1 port="$dir/${1//\//_}.port"; shift
  "$PY" "$FAKE_PS" "$name" "$port" "$dir/calls.log" "$@" 2>> "$dir/fake.log" &
  FPID=$!
  echo "$FPID" > "$dir/${name//\//_}.pid"
  local i
  for ((i = 0; i < 400; i++)); do [ -s "$port" ] && break; sleep 0.05; done
  [ -s "$port" ] || { bad "fake $name started" "$(cat "$dir/fake.log")"; finish; }
  FADDR=127.0.0.1:$(cat "$port")
}
# ps/0: a primary that is gone; ps/1: the new one; ps/2: stopped a while,
# then answers with its old epoch; ps/3: its replica of shard 3 differs
fake ps/0 unavailable digest=w:5:111; A0=$FADDR
fake ps/1 epoch=4 digest=w:5:111; A1=$FADDR
fake ps/2 epoch=2 hold="$dir/release" digest=w:5:222; A2=$FADDR
fake ps/3 epoch=4 digest=w:5:111; A3=$FADDR
echo "{\"ps\": [\"$A0\", \"$A1\", \"$A2\", \"$A3\"]}" > "$dir/fake.json"
J='"replicas":2,"joined":[true,true,true,true]'
put_view fk "{\"epoch\":3,$J,\"shards\":[{\"replicas\":[0,1],\"syncing\":[],\"since\":1},{\"replicas\":[1,0],\"syncing\":[],\"since\":1},{\"replicas\":[2,3],\"syncing\":[],\"since\":1},{\"replicas\":[3,2],\"syncing\":[],\"since\":1}]}"
rc() { PS_RPC_TIMEOUT=${RPC:-20} "$REPL_CLIENT" "$dir/fake.json" "$ETCD" fk "$@"; }

# a. routing
out=$(rc read 1 w 2>&1)
if [[ "$out" == *"ok value=0"* ]] && grep -q "^ps/1 Read shard=1 epoch=3 " "$dir/calls.log" &&
  ! grep -q "^ps/0 Read" "$dir/calls.log"; then
  ok "a call for shard 1 goes to its primary ps/1 with Route{1, 3}"
else
  bad "a call for shard 1 goes to its primary ps/1 with Route{1, 3}" "$out
$(cat "$dir/calls.log")"
fi

# b, c: an update on shard 0 (its primary gone) and a read of shard 2 (its
# primary stopped) wait; the view moves on to epoch 4; the read's answer,
# stamped epoch 2, comes only after the client has the new view
rc update 0 w > "$dir/upd.out" 2> "$dir/upd.err" &
UPD=$!
rc read 2 w > "$dir/read.out" 2> "$dir/read.err" &
RD=$!
wait_for "$dir/calls.log" "^ps/0 Update shard=0 epoch=3 " 20 || bad "the update reached ps/0"
wait_for "$dir/calls.log" "^ps/2 Read shard=2 epoch=3 " 20 || bad "the read reached ps/2"
put_view fk "{\"epoch\":4,$J,\"shards\":[{\"replicas\":[1],\"syncing\":[],\"since\":4},{\"replicas\":[1,0],\"syncing\":[],\"since\":1},{\"replicas\":[3],\"syncing\":[],\"since\":4},{\"replicas\":[2,3],\"syncing\":[],\"since\":4}]}"
wait_for "$dir/read.err" "replication view now epoch 4" 20 || bad "the reader saw view epoch 4" "$(cat "$dir/read.err")"
touch "$dir/release"
wait "$UPD"; urc=$?
wait "$RD"; rrc=$?
first=$(grep "^ps/0 Update" "$dir/calls.log" | head -1 | sed 's/.*client_id=//')
again=$(grep "^ps/1 Update shard=0 epoch=4 " "$dir/calls.log" | head -1 | sed 's/.*client_id=//')
if [ "$urc" = 0 ] && grep -q "ok version=7" "$dir/upd.out" && [ -n "$first" ] &&
  [ "$first" = "$again" ] && [[ "$first" != "-1 "* ]] && [[ "$first" != "0 "* ]]; then
  ok "an update whose primary is gone goes to the new one with the same (client_id, seq): $first"
else
  bad "an update whose primary is gone goes to the new one with the same (client_id, seq)" \
    "rc $urc: $(cat "$dir/upd.out" "$dir/upd.err")
first: $first again: $again
$(cat "$dir/calls.log")"
fi
if [ "$rrc" = 0 ] && grep -q "ok value=0" "$dir/read.out" &&
  grep -q "a stale answer for shard 2 refused: view epoch 2, older than epoch 4 at which ps/3 became its primary" "$dir/read.err" &&
  grep -q "^ps/3 Read shard=2 epoch=4 " "$dir/calls.log"; then
  ok "a stale primary's answer is refused and the read goes to the new primary"
else
  bad "a stale primary's answer is refused and the read goes to the new primary" \
    "rc $rrc: $(cat "$dir/read.out" "$dir/read.err")
$(cat "$dir/calls.log")"
fi
# c. an answer that stays stale (shard 3's primary ps/2 since epoch 4
# answers epoch 2): the call fails within the rpc timeout, naming it
t0=$(date +%s%N)
out=$(RPC=2 rc read 3 w 2>&1); r=$?
ms=$((($(date +%s%N) - t0) / 1000000))
if [ "$r" = 1 ] && [[ "$out" == *"error FAILED_PRECONDITION: ps/2 at $A2: Read: a stale answer for shard 3 refused: view epoch 2, older than epoch 4 at which ps/2 became its primary"* ]] &&
  [ "$ms" -lt 8000 ]; then
  ok "an answer that stays stale fails the call after the rpc timeout (${ms} ms)"
else
  bad "an answer that stays stale fails the call after the rpc timeout (${ms} ms, exit $r)" "$out"
fi

# d. psctl status and verify
ps_() { "$PSCTL" --cluster "$dir/fake.json" --etcd "$ETCD" --repl-job fk --timeout-ms 3000 "$@"; }
out=$(ps_ status 2>&1)
if [[ "$out" == *"replication: 2 replicas per shard, view epoch 4"* ]] &&
  [[ "$out" == *"placement (R=2, ring order): 0=[0,1] 1=[1,2] 2=[2,3] 3=[3,0]"* ]] &&
  [[ "$out" == *"shard 0: ps/1 primary (since epoch 4)"* ]] &&
  [[ "$out" == *"shard 1: ps/1 primary (since epoch 1), ps/0 backup (lag unknown)"* ]] &&
  [[ "$out" == *"shard 3: ps/2 primary (since epoch 4), ps/3 backup"* ]]; then
  ok "psctl status shows each shard's replicas and roles"
else
  bad "psctl status shows each shard's replicas and roles" "$out"
fi
expect "psctl verify names the variable that differs and where" 1 \
  "shard 3: variable w differs on ps/2: version 5 crc32c 0x000000de 4 bytes, ps/3: version 5 crc32c 0x0000006f 4 bytes" \
  ps_ verify
out=$(ps_ verify 2>&1)
if [[ "$out" == *"shard 1: ps/1 ps/0 identical (1 variables)"* ]] &&
  [[ "$out" == *"shard 3: ps/2 ps/3 differ (1 differences)"* ]]; then
  ok "psctl verify: identical shards and the one that differs"
else
  bad "psctl verify: identical shards and the one that differs" "$out"
fi
put_view fk "{\"epoch\":5,$J,\"shards\":[{\"replicas\":[1],\"syncing\":[],\"since\":4},{\"replicas\":[1,0],\"syncing\":[],\"since\":1},{\"replicas\":[3],\"syncing\":[],\"since\":4},{\"replicas\":[3],\"syncing\":[],\"since\":5}]}"
expect "psctl verify: every shard identical, exit 0" 0 "shard 3: ps/3 identical (1 variables)" ps_ verify
# the cluster spec's "replication" section stands for the flags
echo "{\"ps\": [\"$A0\", \"$A1\", \"$A2\", \"$A3\"], \"replication\": {\"replicas\": 2, \"etcd\": \"$ETCD\", \"job\": \"fk\"}}" > "$dir/fake-spec.json"
expect "the spec's replication section: etcd and job" 0 "replication: 2 replicas per shard, view epoch 5" \
  env -u PS_ETCD "$PSCTL" --cluster "$dir/fake-spec.json" --timeout-ms 3000 status
expect "PS_ETCD names the endpoints" 0 "shard 3: ps/3 primary (since epoch 5)" \
  env PS_ETCD="$ETCD" "$PSCTL" --cluster "$dir/fake.json" --repl-job fk --timeout-ms 3000 status
expect "psctl --replicas is checked" 2 "--replicas must be 1, 2 or 3, got '4'" \
  "$PSCTL" --cluster "$dir/fake.json" --replicas 4 status
expect "--replicas 2 without etcd is refused" 2 "--replicas 2 needs the etcd endpoints" \
  env -u PS_ETCD "$PSCTL" --cluster "$dir/fake.json" --replicas 2 status
# a save: one part per distinct primary (ps/1 of shards 0 and 1, ps/3 of
# 2 and 3), Snapshot and Save with Route{-1, 5}, the merge of 2 parts on
# the last; ps/3's first Snapshot says its view differs: the whole save
# is made again
kill "$(cat "$dir/ps_3.pid")" 2> /dev/null; wait "$(cat "$dir/ps_3.pid")" 2> /dev/null
rm -f "$dir/ps_3.port"
fake ps/3 epoch=5 snap_stale=1 digest=w:5:111; A3=$FADDR
echo "{\"ps\": [\"$A0\", \"$A1\", \"$A2\", \"$A3\"]}" > "$dir/fake.json"
: > "$dir/calls.log"
out=$(ps_ save fk 2>&1); r=$?
snaps=$(grep -c " Snapshot shard=-1 epoch=5 " "$dir/calls.log")
if [ "$r" = 0 ] && [[ "$out" == *"saved fk (0 bytes from 2 ps)"* ]] &&
  [[ "$out" == *"save fk made again by a newer replication view"*"view epoch differs (stale)"* ]] &&
  [ "$snaps" = 4 ] && ! grep -qE "^ps/[02] (Snapshot|Save)" "$dir/calls.log" &&
  [ "$(grep -c "^ps/[13] Save shard=-1 epoch=5 .* parts=2$" "$dir/calls.log")" = 2 ] &&
  grep -q "^ps/3 Merge .* parts=2$" "$dir/calls.log"; then
  ok "a save writes one part per distinct primary, and is made again whole after a stale answer"
else
  bad "a save writes one part per distinct primary, and is made again whole after a stale answer (exit $r)" "$out
$(cat "$dir/calls.log")"
fi
# a probe of shard 0 asks its primary: ps/0 gone does not hold it
kill "$(cat "$dir/ps_0.pid")" 2> /dev/null; wait "$(cat "$dir/ps_0.pid")" 2> /dev/null
expect "a probe of a shard asks its primary, not the task that is gone" 0 "ok probe" \
  env PS_RPC_TIMEOUT=3 "$REPL_CLIENT" "$dir/fake.json" "$ETCD" fk probe 0 -
hold_port
expect "an etcd that does not answer is named" 2 "etcd at 127.0.0.1:$HELD_PORT: get \"/paramserver/default/view\"" \
  "$PSCTL" --cluster "$dir/fake.json" --etcd "127.0.0.1:$HELD_PORT" --replicas 2 --timeout-ms 2000 status
put_view bad '{"epoch":"x"}'
expect "a view that does not decode is named" 2 "replication view at /paramserver/bad/view in etcd: " \
  "$PSCTL" --cluster "$dir/fake.json" --etcd "$ETCD" --repl-job bad status

# ---- unreplicated: verify has one replica per shard ------------------------
start_ps_cluster 2 "$dir/ps1.log" || { bad "ps tasks started" "$(cat "$dir/ps1.log")"; finish; }
echo "{\"ps\": [$PS_LIST], \"worker\": [\"127.0.0.1:1\"]}" > "$dir/r1.json"
out=$(timeout 120 "$PS_WORKER" --cluster "$dir/r1.json" --job worker --task 0 --model linreg \
  --steps 5 --keep-ps --no-final-save 2>&1) || bad "ps-worker trained unreplicated" "$out"
out=$("$PSCTL" --cluster "$dir/r1.json" verify 2>&1); r=$?
if [ "$r" = 0 ] && [[ "$out" =~ "shard 0: ps/0 identical (".*" variables)" ]] &&
  [[ "$out" =~ "shard 1: ps/1 identical (" ]] && [[ "$out" != *"replication:"* ]]; then
  ok "psctl verify without replication: each shard trivially identical"
else
  bad "psctl verify without replication: each shard trivially identical (exit $r)" "$out"
fi
for p in "${PS_PIDS[@]}"; do kill -TERM "$p" 2> /dev/null; wait "$p" 2> /dev/null; done

# ---- B. real ps-server --replicas 2: a primary killed -9 while training ----
mkdir -p "$dir/ckpt"
# start_repl: ps/0..2 with --replicas 2 on ports picked now, started
# together (each joins the view in etcd); again on fresh ports when one
# was taken first.  RP (pids), $dir/repl.json (with one worker)
start_repl() {
  local try t ports
  for ((try = 0; try < 5; try++)); do
    read -r -a ports < <(pick_ports 3)
    echo "{\"ps\": [\"127.0.0.1:${ports[0]}\", \"127.0.0.1:${ports[1]}\", \"127.0.0.1:${ports[2]}\"], \"worker\": [\"127.0.0.1:1\"]}" > "$dir/repl.json"
    RP=()
    for t in 0 1 2; do
      : > "$dir/rps$t.out"
      "$PS_SERVER" --cluster "$dir/repl.json" --job ps --task "$t" --replicas 2 --etcd "$ETCD" \
        --checkpoint-dir "$dir/ckpt" > "$dir/rps$t.out" 2>> "$dir/rps$t.log" &
      RP+=($!)
    done
    local up=0 i
    for ((i = 0; i < 1200 && up < 3; i++)); do
      up=0
      for t in 0 1 2; do
        grep -q "ready on" "$dir/rps$t.out" && up=$((up + 1)) && continue
        kill -0 "${RP[$t]}" 2> /dev/null || break 2 # it exited
      done
      [ "$up" = 3 ] || sleep 0.05
    done
    [ "$up" = 3 ] && return 0
    for t in 0 1 2; do kill -KILL "${RP[$t]}" 2> /dev/null; wait "${RP[$t]}" 2> /dev/null; done
    grep -q "address in use" "$dir"/rps*.log || break
    echo "a ps port was taken: again on fresh ones"
  done
  bad "3 ps-server --replicas 2 started" "$(tail -n 20 "$dir"/rps*.log)"
  finish
}
start_repl
rp_() { "$PSCTL" --cluster "$dir/repl.json" --etcd "$ETCD" --timeout-ms 5000 "$@"; }
# every shard with both replicas in sync
for ((i = 0; i < 200; i++)); do
  out=$(rp_ status 2>&1)
  [ "$(grep -cE '^shard [0-2]: ps/[0-2] primary .*, ps/[0-2] backup' <<< "$out")" = 3 ] && break
  sleep 0.1
done
if [[ "$out" == *"shard 0: ps/0 primary"*", ps/1 backup"* ]] &&
  [[ "$out" == *"shard 2: ps/2 primary"*", ps/0 backup"* ]]; then
  ok "psctl status shows the roles of the real ps: primary and backup"
else
  bad "psctl status shows the roles of the real ps: primary and backup" "$out"
fi
STEPS=300
timeout 300 "$PS_WORKER" --cluster "$dir/repl.json" --job worker --task 0 --model linreg \
  --steps "$STEPS" --log-every 5 --replicas 2 --etcd "$ETCD" --checkpoint-dir "$dir/ckpt" \
  --keep-ps --rpc-timeout 20 > "$dir/worker.out" 2> "$dir/worker.log" &
WPID=$!
wait_for "$dir/worker.log" "step [0-9]*[05]0 loss" 120 || bad "ps-worker trains" "$(tail -20 "$dir/worker.log")"
# the primary of shard 0 (global_step's: ps/0) dies
kill -KILL "${RP[0]}"; wait "${RP[0]}" 2> /dev/null
killed_at=$(grep -oE "step [0-9]+ loss" "$dir/worker.log" | tail -1 | grep -oE "[0-9]+")
wait "$WPID"; wrc=$?
steps=$(grep -oE "\bstep [0-9]+ loss" "$dir/worker.log" | grep -oE "[0-9]+")
back=$(awk 'NR > 1 && $1 < prev { print prev " -> " $1 } { prev = $1 }' <<< "$steps")
last=$(tail -1 <<< "$steps")
if [ "$wrc" = 0 ] && [ -z "$back" ] && [ -n "$killed_at" ] && [ "$last" -gt "$killed_at" ] &&
  ! grep -q "waiting for the cluster to recover" "$dir/worker.log"; then
  ok "ps-worker trains on across the kill -9 of a primary (killed at step $killed_at, last $last), the step never back"
else
  bad "ps-worker trains on across the kill -9 of a primary (exit $wrc; back: $back)" \
    "$(tail -30 "$dir/worker.log")"
fi
out=$(rp_ read global_step 2>&1)
if [[ "$out" == *$'\n'"$STEPS"* ]]; then ok "global_step is $STEPS after the failover"; else bad "global_step is $STEPS after the failover" "$out"; fi
out=$(rp_ status 2>&1)
if [[ "$out" == *"shard 0: ps/1 primary (since epoch"* ]] && [[ "$out" == *"ps/0 down"* || "$out" != *"shard 0: ps/1 primary"*", ps/0"* ]]; then
  ok "psctl status: ps/1 is shard 0's primary after the failover"
else
  bad "psctl status: ps/1 is shard 0's primary after the failover" "$out"
fi
out=$(rp_ verify 2>&1); r=$?
if [ "$r" = 0 ] && [[ "$out" == *"shard 1: ps/1 ps/2 identical ("* ]]; then
  ok "psctl verify after the failover: identical"
else
  bad "psctl verify after the failover: identical (exit $r)" "$out"
fi
# a save after the failover: one part per distinct primary (ps/1 holds
# shards 0 and 1, ps/2 shard 2: two parts), then a restore of it
out=$(rp_ save after 2>&1); r=$?
if [ "$r" = 0 ] && [[ "$out" == "saved after ("*" bytes from 2 ps)"* ]] &&
  [ -f "$dir/ckpt/after.index" ]; then
  ok "a save after the failover writes one part per distinct primary (2)"
else
  bad "a save after the failover writes one part per distinct primary (exit $r)" "$out
$(ls "$dir/ckpt")"
fi
expect "a restore after the failover" 0 "restored" rp_ restore after
for t in 1 2; do kill -TERM "${RP[$t]}" 2> /dev/null; wait "${RP[$t]}" 2> /dev/null; done

finish
