#!/usr/bin/env bash
# Starts NPS ps-server tasks on 127.0.0.1 with ports the kernel picks, writes
# the real cluster spec, runs a command against it, then stops the tasks
# (SIGTERM; each must exit 0).  The command sees the spec as $PS_CLUSTER.
#
#   deploy/local-cluster.sh BUILD_DIR NPS COMMAND [ARGS...]
set -euo pipefail
build=${1:?build dir}; nps=${2:?number of ps tasks}; shift 2
dir=$(mktemp -d /tmp/ps-local-XXXXXX)
pids=()
cleanup() {
  local rc=0
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    if ! wait "$p"; then echo "local-cluster: ps pid $p exited non-zero" >&2; rc=1; fi
  done
  rm -rf "$dir"
  return $rc
}
trap 'cleanup || true' INT TERM

boot="$dir/boot.json"
addrs=()
for ((i = 0; i < nps; i++)); do addrs+=("\"127.0.0.1:0\""); done
(IFS=,; echo "{\"ps\": [${addrs[*]}]}") > "$boot"
addrs=()
for ((i = 0; i < nps; i++)); do
  fifo="$dir/ready.$i"
  mkfifo "$fifo"
  "$build/ps/ps-server" --cluster "$boot" --job ps --task "$i" ${PS_EXTRA_ARGS:-} > "$fifo" &
  pids+=($!)
  read -r -t 60 line < "$fifo" || { echo "local-cluster: ps/$i did not start" >&2; cleanup; exit 1; }
  addrs+=("\"${line##* }\"")
  echo "local-cluster: $line" >&2
done
export PS_CLUSTER="$dir/cluster.json"
(IFS=,; echo "{\"ps\": [${addrs[*]}], \"worker\": [\"127.0.0.1:0\"]}") > "$PS_CLUSTER"
set +e
"$@"
rc=$?
set -e
cleanup || rc=1
exit $rc
