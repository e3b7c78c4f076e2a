#!/usr/bin/env bash
# tests/support/etcd.sh, the etcd helper of the script tests: one member
# and a 3-member cluster on free ports, ready when they say so, a member
# killed and restarted with its data, everything stopped by pid.
source "$(dirname "$0")/../support/lib.sh"
source "$(dirname "$0")/../support/etcd.sh"
test_init etcd-sh
command -v etcdctl > /dev/null || { echo "etcdctl missing (deploy/setup.sh installs etcd-client)"; exit 1; }
ctl() { ETCDCTL_API=3 etcdctl --dial-timeout 2s --command-timeout 3s "$@"; }

if etcd_start single; then
  ok "etcd_start: ready on $ETCD_ENDPOINT (pid $ETCD_PID)"
  expect "put and get through the single member" 0 "v1" \
    bash -c "etcdctl --endpoints=$ETCD_ENDPOINT put /k v1 > /dev/null && etcdctl --endpoints=$ETCD_ENDPOINT get /k"
  check "ETCD_ENDPOINTS is the one member" [ "$ETCD_ENDPOINTS" = "$ETCD_ENDPOINT" ]
  pid=$ETCD_PID
  etcd_stop
  check "etcd_stop stopped it" bash -c "! kill -0 $pid 2> /dev/null"
else
  bad "etcd_start"
fi

if etcd_cluster3 three; then
  ok "etcd_cluster3: ready on $ETCD_ENDPOINTS"
  check "three endpoints" [ "${#ETCD_CLIENTS[@]}" = 3 ]
  expect "a put through member 2" 0 "OK" ctl --endpoints="${ETCD_CLIENTS[2]}" put /c a
  etcd_kill 0
  # (a put may time out while the two elect a new leader: again, 10 s at most)
  end=$((SECONDS + 10))
  until ctl --endpoints="${ETCD_CLIENTS[1]}" put /c b > "$dir/put.out" 2>&1 || ((SECONDS > end)); do
    sleep 0.1
  done
  show="$dir/put.out" check "writes go on without member 0" grep -q OK "$dir/put.out"
  expect "member 0 is down" 1 "" ctl --endpoints="${ETCD_CLIENTS[0]}" get /c
  if etcd_restart 0; then
    ok "etcd_restart 0"
    # a restarted member catches up from its peers
    for ((i = 0; i < 100; i++)); do
      [ "$(ctl --endpoints="${ETCD_CLIENTS[0]}" get --print-value-only /c 2> /dev/null)" = b ] && break
      sleep 0.05
    done
    expect "member 0 has the write it missed" 0 "b" ctl --endpoints="${ETCD_CLIENTS[0]}" get --print-value-only /c
  else
    bad "etcd_restart 0"
  fi
  pids=("${ETCD_PIDS[@]}")
  etcd_stop
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2> /dev/null && alive=$((alive + 1)); done
  check "etcd_stop stopped all three" [ "$alive" = 0 ]
else
  bad "etcd_cluster3"
fi
finish
