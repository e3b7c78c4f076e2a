# Helpers of the replication tests (tests/integration/test_repl_*.sh),
# sourced after lib.sh and etcd.sh.
#   repl_start N SPEC PFX [EXTRA_JSON]: writes SPEC, a cluster of N ps on
#     free loopback ports (plus EXTRA_JSON, e.g. ', "worker": [...]'), and
#     calls the test's own `repl_start_one T` for each task, which starts
#     ps/T, writes its stdout to $dir/PFX$T.out, its log to $dir/PFX$T.log,
#     and sets P[T]; waits until every one printed its readiness line.
#     A port taken meanwhile ("address in use", also a --repl-link-port
#     "Address already in use"): all are killed and it
#     tries again on new ports, up to 5 times.  0, or 1.
#   repl_wait_status REGEX...: until the test's `st_ status` matches every
#     REGEX (20 s); $out is its last output.  0, or 1.
#   repl_updates NAME N: $FAILOVER_CLIENT on shard 0 and on shard 1 of the
#     test's 2-ps cluster $dir/$JOB.json (variables NAME0 and NAME1: a name
#     is one shard's) until each has N acknowledged updates; then checks
#     (ok/bad) that no acknowledged update was lost.
#   repl_identical N0 N1: the test's `st_ verify` says shard 0 (N0
#     variables) and shard 1 (N1) are identical on both ps of its 2-ps
#     cluster: 0, or 1; $vout is what it said.
#   repl_verify N0 [N1]: repl_identical N0 N1 (N1 else N0), as ok or bad.
#   repl_no_link WHAT: checks (ok/bad) that neither ps of $JOB logged a
#     link port or a primary over a link (--no-repl-link).

repl_start() {
  local n=$1 spec=$2 pfx=$3 extra=${4:-} try t i up list
  for ((try = 0; try < 5; try++)); do
    read -r -a ports < <(pick_ports "$n")
    list=""
    for ((t = 0; t < n; t++)); do list+="${list:+, }\"127.0.0.1:${ports[$t]}\""; done
    echo "{\"ps\": [$list]$extra}" > "$spec"
    for ((t = 0; t < n; t++)); do repl_start_one "$t"; done
    up=0
    for ((i = 0; i < 1200 && up < n; i++)); do
      up=0
      for ((t = 0; t < n; t++)); do
        grep -q "ready on" "$dir/$pfx$t.out" && up=$((up + 1)) && continue
        kill -0 "${P[$t]}" 2> /dev/null || break 2
      done
      [ "$up" = "$n" ] || sleep 0.05
    done
    [ "$up" = "$n" ] && return 0
    for ((t = 0; t < n; t++)); do kill -KILL "${P[$t]}" 2> /dev/null; wait "${P[$t]}" 2> /dev/null; done
    grep -qiE "address (already )?in use" "$dir/$pfx"*.log || return 1
  done
  return 1
}

repl_wait_status() {
  local i r ok_
  for ((i = 0; i < 200; i++)); do
    out=$(st_ status 2>&1)
    ok_=1
    for r in "$@"; do grep -qE -- "$r" <<< "$out" || ok_=0; done
    [ "$ok_" = 1 ] && return 0
    sleep 0.1
  done
  return 1
}

repl_updates() {
  local s crc acks value all=1
  local -a pids
  for s in 0 1; do
    [ ! -e "$dir/stop-$1-$s" ] || { bad "repl_updates: name $1 used twice"; return; }
    "$FAILOVER_CLIENT" "$dir/$JOB.json" "$ETCD_ENDPOINTS" "$JOB" "$s" "$1$s" "$dir/stop-$1-$s" \
      > "$dir/$1-$s.out" 2> "$dir/$1-$s.log" &
    pids[$s]=$!
  done
  for s in 0 1; do
    wait_for "$dir/$1-$s.out" "^ack $2 " 60 || all=0
    touch "$dir/stop-$1-$s"
  done
  for s in 0 1; do
    wait "${pids[$s]}"; crc=$?
    acks=$(grep -c '^ack ' "$dir/$1-$s.out")
    value=$(awk '$1 == "value" { print $2 }' "$dir/$1-$s.out")
    if [ "$all" = 1 ] && [ "$crc" = 0 ] && [ "$acks" -ge "$2" ] && [ "$value" = "$acks" ]; then
      ok "$JOB: $acks updates of $1$s on shard $s acknowledged, none lost"
    else
      bad "$JOB: $2 updates of $1$s on shard $s acknowledged, none lost (exit $crc, $acks acknowledged, value '$value')" \
        "$(tail -n 3 "$dir/$1-$s.out" "$dir/$1-$s.log" "$dir/$JOB"[01].log)"
    fi
  done
}

repl_identical() {
  local r
  vout=$(st_ verify 2>&1); r=$?
  vout+=$'\n'"(exit $r)"
  [ "$r" = 0 ] && grep -qE "^shard 0: ps/[01] ps/[01] identical \($1 variables\)" <<< "$vout" &&
    grep -qE "^shard 1: ps/[01] ps/[01] identical \($2 variables\)" <<< "$vout"
}

repl_verify() {
  local n1=${2:-$1}
  if repl_identical "$1" "$n1"; then
    ok "$JOB: psctl verify: both shards' replicas identical ($1 and $n1 variables)"
  else
    bad "$JOB: psctl verify: both shards' replicas identical ($1 and $n1 variables)" "$vout"
  fi
}

repl_no_link() {
  local t
  for t in 0 1; do
    if grep -q -e "replication link on port" -e "over its replication link" "$dir/$JOB$t.log"; then
      bad "$1: ps/$t neither listens for nor uses a link" "$(grep -h "replication link" "$dir/$JOB$t.log")"
    else
      ok "$1: ps/$t neither listens for nor uses a link"
    fi
  done
}
