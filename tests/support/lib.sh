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

finish() {
  echo "$pass passed, $fail failed"
  [ "$fail" = 0 ]
  exit
}
