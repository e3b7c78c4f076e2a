#!/usr/bin/env bash
# A ps at rest holds its variables, not the memory of its last transfers
# (issue 24, point 5), through a real ps-server and the public client API
# (big_assign_client): a 64 MiB and a 4 MiB float variable, assigned and
# read back four times each.  While bytes move, the ps keeps freed big
# buffers for reuse (common/tensor.c) and free heap for the next transfer
# (common/rpc.c); IDLE_TRIM_MS (2 s) after the last of them it gives both
# back (common/rpc_monitor.c, idle_trim).  Checked: its resident memory
# above the one it started with comes down to at most 1.1 x the bytes held
# + 16 MiB, within 15 s; and a transfer after the trim still works.
# Every process is stopped however the script ends (lib.sh).
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; BIG=${BIG_ASSIGN_CLIENT:?}
source "$(dirname "$0")/../support/lib.sh"
test_init memrest

rss() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
echo '{"ps": ["127.0.0.1:0"]}' > "$dir/boot.json"
# Under AddressSanitizer freed memory waits in a quarantine: a small one,
# released promptly, keeps the figures about the ps.
PS_PREFIX="env ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=4:allocator_release_to_os_interval_ms=100" \
  start_ps "$dir/boot.json" 0 "$dir/ps.log" --log-level debug
[ -n "$ADDR" ] || { bad "ps-server starts" "$(cat "$dir/ps.log")"; finish; }
echo "{\"ps\": [\"$ADDR\"]}" > "$dir/spec.json"
base=$(rss "$PID")
W=$((16 << 20)) V=$((1 << 20)) # elements: 64 MiB and 4 MiB of float32
held=$(((W + V) * 4 / 1024))   # kB
{
  echo "create 0 w $W"
  echo "create 0 v $V"
  for s in 1 2 3 4; do
    echo "assign 0 w $W $s"
    echo "read 0 w $W $s"
    echo "assign 0 v $V $s"
    echo "read 0 v $V $s"
  done
} > "$dir/cmds"
"$BIG" "$dir/spec.json" - - < "$dir/cmds" > "$dir/out" 2>&1
check "4 rounds of 64 MiB and 4 MiB assigns and reads, each read back the same" \
  test "$(grep -c '^same ' "$dir/out")" = 8
busy=$(rss "$PID")
limit=$((held * 11 / 10 + 16 * 1024))
after=$busy
for ((i = 0; i < 150; i++)); do # up to 15 s
  after=$(rss "$PID")
  [ $((after - base)) -le $limit ] && break
  sleep 0.1
done
echo "VmRSS: at start $base kB, after the transfers $busy kB (peak $(hwm "$PID") kB), at rest $after kB; held $held kB"
check "at rest the ps holds its variables: VmRSS - start $((after - base)) kB <= 1.1 x $held + 16384 kB" \
  test $((after - base)) -le $limit
show="$dir/ps.log"
check "the ps logged what it gave back" grep -qE "DEBUG ps/0: at rest: gave back [1-9][0-9]* MiB" "$dir/ps.log"
show=""
printf 'assign 0 w %s 9\nread 0 w %s 9\n' $W $W | "$BIG" "$dir/spec.json" - - > "$dir/out2" 2>&1
check "a transfer after the trim" grep -q "^same w 9" "$dir/out2"
kill -TERM "$PID"; wait "$PID"
finish
