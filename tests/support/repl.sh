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
