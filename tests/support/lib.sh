# The shell library of the script tests (tests/*/test_*.sh), sourced as
#   source "$(dirname "$0")/../support/lib.sh"
#   test_init NAME      # scratch dir $dir, counters, the EXIT trap
# Every child a test starts in the background is killed when the script
# ends, however it ends (EXIT, TERM, INT), and $dir is removed; a script
# adds its own cleanup by defining test_cleanup_hook.  Ends with
#   finish              # prints "N passed, N failed", exits 0 or 1
pass=0
fail=0
BAD_TAIL=${BAD_TAIL:-0} # bad(): show only the last N lines of the output (0: all)
# the tests' Python snippets import their shared helpers (rawgrpc.py)
export PYTHONPATH="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)${PYTHONPATH:+:$PYTHONPATH}"

_test_cleanup() {
  # only children not reaped yet: a pid already waited for may belong to
  # another process by now
  for p in $(jobs -p); do kill -KILL "$p" 2>/dev/null; done
  wait 2>/dev/null
  if declare -F test_cleanup_hook >/dev/null; then test_cleanup_hook; fi
  [ -n "${dir:-}" ] && [ -z "${KEEP_DIR:-}" ] && rm -rf "$dir"
}

# test_init NAME: $dir = a fresh /tmp/ps-NAME-XXXXXX, removed at exit.
test_init() {
  dir=$(mktemp -d "/tmp/ps-$1-XXXXXX") || exit 2
  trap _test_cleanup EXIT
  trap 'exit 143' TERM
  trap 'exit 130' INT
}

ok() { pass=$((pass + 1)); echo "ok: $1"; }
# bad NAME [OUTPUT]
bad() {
  fail=$((fail + 1))
  echo "FAIL: $1"
  if [ -n "${2:-}" ]; then
    if [ "$BAD_TAIL" -gt 0 ]; then echo "$2" | tail -"$BAD_TAIL"; else echo "$2"; fi | sed 's/^/    /'
  fi
}

# expect NAME WANT_RC WANT_SUBSTRING COMMAND...
expect() {
  local name=$1 want_rc=$2 want=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ "$rc" != "$want_rc" ]; then bad "$name (exit $rc, want $want_rc)" "$out"; return; fi
  if [[ "$out" != *"$want"* ]]; then bad "$name (missing '$want')" "$out"; return; fi
  ok "$name"
}

# check NAME COMMAND...: ok if COMMAND succeeds; on failure shows the file
# named by $show, if set
show=""
check() {
  local name=$1; shift
  if "$@"; then ok "$name"; else bad "$name" "$([ -n "$show" ] && cat $show)"; fi
}

# wait_for FILE EXTENDED-REGEX [SECONDS]: until a line of FILE matches
wait_for() {
  local i
  for ((i = 0; i < ${3:-60} * 20; i++)); do
    grep -qE -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.05
  done
  return 1
}

# has FILE PATTERN: a line of FILE matches PATTERN (a basic regex)
has() { grep -q -- "$2" "$1"; }

# wait_count FILE EXTENDED-REGEX N SECONDS: until N lines of FILE match
wait_count() {
  local i
  for ((i = 0; i < $4 * 20; i++)); do
    [ "$(grep -cE -- "$2" "$1" 2> /dev/null)" -ge "$3" ] && return 0
    sleep 0.05
  done
  return 1
}

# start_ps SPEC TASK [LOG [FLAG...]]: a ps-server ($PS_SERVER) in the background;
# sets PID and ADDR from its readiness line (60 s at most; ADDR empty if
# it never came).  Runs it under $PS_PREFIX (e.g. setpriv --pdeathsig).
start_ps() {
  local fifo="$dir/ready.$RANDOM$RANDOM" line=""
  mkfifo "$fifo"
  ${PS_PREFIX:-} "$PS_SERVER" --cluster "$1" --job ps --task "$2" "${@:4}" > "$fifo" 2>> "${3:-$dir/ps.log}" &
  PID=$!
  read -r -t 60 line < "$fifo" || true
  rm -f "$fifo"
  ADDR=${line##* }
  [[ "$line" == *" ready on "* ]] || ADDR=""
}

# Ports.  A port found free by binding port 0 and closing the socket is
# free only at that moment: anything (another test's server, an outgoing
# connection's local port) may take it before the process meant for it
# binds.  So:
# - a ps that can start before its clients gets port 0 (its spec says
#   127.0.0.1:0) and reports the port it bound (start_ps, start_ps_cluster);
#   the clients' spec is written from those addresses;
# - a port that must stay closed (a ps that never answers) is held bound,
#   never listening, for the test's life (hold_port): connecting to it is
#   refused, and nothing else can bind it;
# - only a ps whose port must be in the spec before it starts (its clients
#   start first) gets pick_ports, and start_ps_on tells "address in use"
#   apart, so that the caller starts again on fresh ports, saying so.

# start_ps_cluster N LOG [FLAG...]: N ps-servers (tasks 0..N-1 of a spec
# of N ps on port 0); PS_PIDS and PS_ADDRS (HOST:PORT each) from their
# readiness lines, PS_LIST their addresses as a JSON list's items.  Fails
# (after saying which) when one never came up.
start_ps_cluster() {
  local n=$1 log=$2 t boot="$dir/boot-ps.$RANDOM$RANDOM.json" items=""
  shift 2
  for ((t = 0; t < n; t++)); do items="$items${items:+, }\"127.0.0.1:0\""; done
  echo "{\"ps\": [$items]}" > "$boot"
  PS_PIDS=() PS_ADDRS=() PS_LIST=""
  for ((t = 0; t < n; t++)); do
    start_ps "$boot" "$t" "$log" "$@"
    PS_PIDS+=("$PID")
    [ -n "$ADDR" ] || { echo "ps/$t never came up (log: $log)" >&2; return 1; }
    PS_ADDRS+=("$ADDR")
    PS_LIST="$PS_LIST${PS_LIST:+, }\"$ADDR\""
  done
}

# hold_port: HELD_PORT, a port of 127.0.0.1 bound but never listening by a
# background process (killed at exit), so that connecting to it is refused
# and nothing else can bind it.
hold_port() {
  local fifo="$dir/hold.$RANDOM$RANDOM"
  mkfifo "$fifo"
  python3 -c '
import socket, sys, time
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1], flush=True)
sys.stdout.close()
while True:
    time.sleep(3600)' > "$fifo" &
  HELD_PORT=""
  read -r -t 10 HELD_PORT < "$fifo"
  rm -f "$fifo"
  [ -n "$HELD_PORT" ]
}

# pick_ports N: N ports of 127.0.0.1 free at this moment (see above: only
# with start_ps_on)
pick_ports() {
  python3 -c '
import socket, sys
ss = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in ss: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in ss))' "$1"
}

# start_ps_on SPEC TASK LOG [FLAG...]: start_ps on the port SPEC names for
# the task.  0: ready (PID, ADDR); 2: that port was taken before the ps
# bound it (it said "address in use"; the caller starts again on fresh
# ports); 1: it failed otherwise.
start_ps_on() {
  local before=0
  [ -f "$3" ] && before=$(wc -l < "$3")
  start_ps "$@"
  [ -n "$ADDR" ] && return 0
  kill -KILL "$PID" 2> /dev/null; wait "$PID" 2> /dev/null
  tail -n +"$((before + 1))" "$3" | grep ": address in use" > /dev/null && return 2
  return 1
}

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
  exit
}
