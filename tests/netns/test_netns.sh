#!/usr/bin/env bash
# Four hosts in network namespaces on a bridge (the bridge in a namespace
# of its own: nothing is added to the root namespace, and every process of
# the test runs inside a namespace it created): ps/0, ps/1, worker/0 (the
# chief) and worker/1.  Training goes on across them; ps/1's link is taken
# down for 10 s and restored (a warning is logged while a step waits, and
# training resumes); ps/0 is killed with -9 and restarted on its host (the
# chief restores from the latest checkpoint); the job ends well.  Root
# only; the namespaces are deleted however the test ends.
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PS_WORKER=${PS_WORKER:?}
source "$(dirname "$0")/../support/lib.sh"
test_init netns
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null; then
  bad "network namespaces" "needs root and iproute2"
  finish
fi
ns=pst$$
net=10.213.$((RANDOM % 200 + 20))
test_cleanup_hook() {
  for i in 1 2 3 4; do
    for p in $(ip netns pids "$ns-h$i" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
    ip netns del "$ns-h$i" 2>/dev/null
  done
  ip netns del "$ns-sw" 2>/dev/null
}
ip netns add "$ns-sw" && ip -n "$ns-sw" link add br0 type bridge && ip -n "$ns-sw" link set br0 up \
  || { bad "bridge" "cannot create namespaces"; finish; }
for i in 1 2 3 4; do
  ip netns add "$ns-h$i"
  ip -n "$ns-sw" link add p$i type veth peer name eth0 netns "$ns-h$i"
  ip -n "$ns-sw" link set p$i master br0
  ip -n "$ns-sw" link set p$i up
  ip -n "$ns-h$i" addr add "$net.$i/24" dev eth0
  ip -n "$ns-h$i" link set eth0 up
  ip -n "$ns-h$i" link set lo up
done
ok "four hosts on a bridge ($net.0/24)"
spec="$dir/spec.json"
echo "{\"ps\": [\"$net.1:2222\", \"$net.2:2222\"], \"worker\": [\"$net.3:2222\", \"$net.4:2222\"]}" > "$spec"
ck="$dir/ck"; mkdir -p "$ck"
start_ps_in() { # HOST TASK
  local fifo="$dir/ready$1.$RANDOM"
  mkfifo "$fifo"
  ip netns exec "$ns-h$1" "$PS_SERVER" --cluster "$spec" --job ps --task "$2" --checkpoint-dir "$ck" \
    > "$fifo" 2>> "$dir/ps$2.log" &
  PID=$!
  local line=""
  read -r -t 60 line < "$fifo"
  rm -f "$fifo"
  [[ "$line" == *"ready on"* ]]
}
start_ps_in 1 0 && ps0=$PID || bad "ps/0 starts" "$(cat "$dir/ps0.log")"
start_ps_in 2 1 && ps1=$PID || bad "ps/1 starts" "$(cat "$dir/ps1.log")"
W=(--model linreg --steps 3000 --log-every 50 --save-every-steps 100 --checkpoint-dir "$ck" --batch 50)
ip netns exec "$ns-h3" "$PS_WORKER" "${W[@]}" --cluster "$spec" --job worker --task 0 \
  > "$dir/w0.out" 2> "$dir/w0.log" &
w0=$!
ip netns exec "$ns-h4" "$PS_WORKER" "${W[@]}" --cluster "$spec" --job worker --task 1 \
  > "$dir/w1.out" 2> "$dir/w1.log" &
w1=$!
steps() { grep -c "step [0-9]* loss" "$1" 2>/dev/null; }
if wait_for "$dir/w0.log" "saved checkpoint" 120; then
  ok "training across the hosts (a checkpoint saved)"
  # worker/1 is stopped (SIGSTOP) from here, and the chief too while ps/0 is
  # killed and restarted: both share --steps, and after the link is back,
  # worker/1 alone could finish the job before the chief takes a step, or
  # either before the chief has seen the restart
  kill -STOP "$w1"
  # ps/1's link down for 10 s, then back
  ip -n "$ns-sw" link set p2 down
  sleep 10
  ip -n "$ns-sw" link set p2 up
  check "a warning while a step waits on the dead link" grep -q "still waiting after [0-9]* s for /paramserver.Ps/[A-Za-z]* on $net.2:2222" "$dir/w0.log" "$dir/w1.log"
  n=$(steps "$dir/w0.log")
  wait_for "$dir/w0.log" "step [0-9]* loss" 1 > /dev/null
  for ((i = 0; i < 1200; i++)); do [ "$(steps "$dir/w0.log")" -gt "$n" ] && break; sleep 0.1; done
  check "training resumes once the link is back" test "$(steps "$dir/w0.log")" -gt "$n"
  # ps/0 killed with -9 and started again on its host
  kill -STOP "$w0"
  kill -KILL "$ps0"; wait "$ps0" 2>/dev/null
  start_ps_in 1 0 && ps0=$PID || bad "ps/0 restarts" "$(tail -5 "$dir/ps0.log")"
  kill -CONT "$w0" "$w1"
  wait_for "$dir/w0.log" "recovered \(restored\)" 120
  check "after ps/0 was killed, the chief restored it from the checkpoint" grep -q "recovered (restored)" "$dir/w0.log"
else
  bad "training across the hosts" "$(tail -5 "$dir/w0.log")"
fi
kill -CONT "$w0" "$w1" 2> /dev/null
wait "$w0"; r0=$?; wait "$w1"; r1=$?
check "both workers finish (exit $r0 $r1)" test "$r0$r1" = 00
wait "$ps0"; p0=$?; wait "$ps1"; p1=$?
check "the chief shut both ps down (exit $p0 $p1)" test "$p0$p1" = 00
finish
