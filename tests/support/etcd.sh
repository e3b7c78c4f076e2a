# etcd for the script tests (Debian's etcd-server: `etcd`, or $ETCD), on
# top of lib.sh.  Source both, then test_init, then:
#   source "$(dirname "$0")/../support/lib.sh"
#   source "$(dirname "$0")/../support/etcd.sh"
#   test_init NAME
#   etcd_start NAME     # one member
#   etcd_cluster3 NAME  # or a cluster of three
# Both set
#   ETCD_ENDPOINTS  the client endpoints, "127.0.0.1:P[,127.0.0.1:P...]"
#                   (what ps-server --etcd and ps_etcd_connect take)
#   ETCD_CLIENTS    array: member i's client endpoint
#   ETCD_PIDS       array: member i's pid (empty while it is stopped)
#   ETCD_LOGS       array: member i's log ($dir/etcd-NAME-mI.log)
# and etcd_start also ETCD_ENDPOINT and ETCD_PID (its one member).
# Members run with fast raft timings (heartbeat 10 ms, election 100 ms:
# the shortest lease TTL is then 1 s), data in $dir.  Ports are picked
# free (lib.sh's pick_ports); when etcd finds one taken in between
# ("address already in use") the whole set starts again on new ports, up
# to 5 times.  Ready when every member's /health says {"health":"true"}
# (15 s at most; a 3-member cluster can take 2 s, ETCD_NOTES.md).  Each
# returns 0, or 1 after saying why on stderr (then nothing is left running).
#
# Members are background jobs of the test's shell: lib.sh's EXIT trap kills
# them by pid however the test ends.  So call these functions directly,
# never inside $(...) or a pipeline (a subshell's jobs are not the test's).
#   etcd_kill I         SIGKILL member I, wait for it (its data stays)
#   etcd_restart I      start member I again (same ports and data), wait
#                       until healthy
#   etcd_stop           SIGTERM every member, wait (SIGKILL after 10 s)

ETCD_PIDS=()
ETCD_CLIENTS=()
ETCD_LOGS=()
ETCD_ENDPOINTS=""
_ETCD_PEERS=()
_ETCD_CLUSTER=""
_ETCD_NAME=""
_ETCD_TOKEN=""

# _etcd_spawn I: member I in the background (ETCD_PIDS[I])
_etcd_spawn() {
  local i=$1 c="http://${ETCD_CLIENTS[$1]}" p="http://127.0.0.1:${_ETCD_PEERS[$1]}"
  "${ETCD:-etcd}" --name "m$i" --data-dir "$dir/etcd-$_ETCD_NAME-m$i.data" \
    --listen-client-urls "$c" --advertise-client-urls "$c" \
    --listen-peer-urls "$p" --initial-advertise-peer-urls "$p" \
    --initial-cluster "$_ETCD_CLUSTER" --initial-cluster-state new \
    --initial-cluster-token "$_ETCD_TOKEN" \
    --heartbeat-interval 10 --election-timeout 100 \
    --logger zap --log-outputs stderr --log-level warn \
    > /dev/null 2>> "${ETCD_LOGS[$i]}" &
  ETCD_PIDS[i]=$!
}

# _etcd_alive PID: running (a zombie, exited but not yet waited for, is not)
_etcd_alive() {
  local _pid _comm state
  { read -r _pid _comm state _ < "/proc/$1/stat"; } 2> /dev/null || return 1
  [ "$state" != Z ]
}

# etcd_wait_healthy I [SECONDS]: until member I's /health says true; 1 if
# it exited or the time ran out
etcd_wait_healthy() {
  local i=$1 end=$((SECONDS + ${2:-15}))
  while ((SECONDS <= end)); do
    _etcd_alive "${ETCD_PIDS[$i]}" || return 1
    curl -s -m 1 "http://${ETCD_CLIENTS[$i]}/health" 2> /dev/null |
      grep -q '"health":"true"' && return 0
    sleep 0.02
  done
  return 1
}

# _etcd_boot N NAME: N members (see above)
_etcd_boot() {
  local n=$1 attempt i taken ports
  _ETCD_NAME=$2
  _ETCD_TOKEN="$2-$$-$RANDOM$RANDOM"
  for ((attempt = 0; attempt < 5; attempt++)); do
    read -r -a ports <<< "$(pick_ports $((2 * n)))"
    ETCD_PIDS=() ETCD_CLIENTS=() ETCD_LOGS=() _ETCD_PEERS=() _ETCD_CLUSTER=""
    ETCD_ENDPOINTS=""
    for ((i = 0; i < n; i++)); do
      ETCD_CLIENTS[i]="127.0.0.1:${ports[2 * i]}"
      _ETCD_PEERS[i]=${ports[2 * i + 1]}
      ETCD_LOGS[i]="$dir/etcd-$_ETCD_NAME-m$i.log"
      ETCD_ENDPOINTS="$ETCD_ENDPOINTS${ETCD_ENDPOINTS:+,}${ETCD_CLIENTS[i]}"
      _ETCD_CLUSTER="$_ETCD_CLUSTER${_ETCD_CLUSTER:+,}m$i=http://127.0.0.1:${_ETCD_PEERS[i]}"
      rm -rf "$dir/etcd-$_ETCD_NAME-m$i.data" "${ETCD_LOGS[i]}"
    done
    for ((i = 0; i < n; i++)); do _etcd_spawn "$i"; done
    taken=0
    for ((i = 0; i < n; i++)); do
      etcd_wait_healthy "$i" && continue
      grep -q 'address already in use' "${ETCD_LOGS[@]}" 2> /dev/null && taken=1
      etcd_stop
      if ((taken)); then
        echo "etcd $_ETCD_NAME: a port was taken before etcd bound it; new ports" >&2
        continue 2
      fi
      echo "etcd $_ETCD_NAME: member m$i never became healthy (log: ${ETCD_LOGS[i]}):" >&2
      tail -5 "${ETCD_LOGS[i]}" >&2
      return 1
    done
    return 0
  done
  echo "etcd $_ETCD_NAME: no free ports after 5 tries" >&2
  return 1
}

etcd_start() {
  _etcd_boot 1 "${1:-etcd}" || return 1
  ETCD_ENDPOINT=${ETCD_CLIENTS[0]}
  ETCD_PID=${ETCD_PIDS[0]}
}

etcd_cluster3() {
  _etcd_boot 3 "${1:-etcd}"
}

etcd_kill() {
  [ -n "${ETCD_PIDS[$1]:-}" ] || return 0
  kill -KILL "${ETCD_PIDS[$1]}" 2> /dev/null
  wait "${ETCD_PIDS[$1]}" 2> /dev/null
  ETCD_PIDS[$1]=""
}

etcd_restart() {
  etcd_kill "$1"
  _etcd_spawn "$1"
  etcd_wait_healthy "$1" && return 0
  echo "etcd $_ETCD_NAME: member m$1 did not come back (log: ${ETCD_LOGS[$1]})" >&2
  return 1
}

etcd_stop() {
  local i k
  for i in "${!ETCD_PIDS[@]}"; do
    [ -n "${ETCD_PIDS[i]}" ] && kill -TERM "${ETCD_PIDS[i]}" 2> /dev/null
  done
  for i in "${!ETCD_PIDS[@]}"; do
    [ -n "${ETCD_PIDS[i]}" ] || continue
    for ((k = 0; k < 500; k++)); do
      _etcd_alive "${ETCD_PIDS[i]}" || break
      sleep 0.02
    done
    kill -KILL "${ETCD_PIDS[i]}" 2> /dev/null
    wait "${ETCD_PIDS[i]}" 2> /dev/null
    ETCD_PIDS[i]=""
  done
}
