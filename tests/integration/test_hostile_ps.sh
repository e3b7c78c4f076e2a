#!/usr/bin/env bash
# Clients against a ps that lies (ps/SERVER.md "Limits", issue 21 point 16): a
# python3-grpcio server (hostile_ps.py) answers every ps method as a real
# ps would, except for one lie per mode.  psctl and ps-worker must report
# each lie with its code and a text naming the ps task, the method and what
# was wrong, exit non-zero, and never crash (this runs under ASan + UBSan
# in build-asan/); a List flood stays bounded in memory.
# Prints "N passed, N failed".
set -uo pipefail
PSCTL=${PSCTL:?}; PS_WORKER=${PS_WORKER:?}
HOSTILE=${HOSTILE_PS:-$(dirname "$0")/hostile_ps.py}
source "$(dirname "$0")/../support/lib.sh"
test_init hostile_ps
BAD_TAIL=30
PY=/usr/bin/python3
if ! "$PY" -c 'import grpc' 2> /dev/null; then
  bad "python3-grpcio" "not installed (deploy/setup.sh installs it)"
  finish
fi

# hostile MODE: starts the lying ps; $ADDR, $SPEC (psctl) and $WSPEC
# (ps-worker) name it, $HPID is its pid (stopped by stop_hostile, else at exit)
n_started=0
hostile() {
  n_started=$((n_started + 1))
  local pf="$dir/port.$n_started"
  "$PY" "$HOSTILE" "$1" "$pf" > "$dir/hostile.$n_started.log" 2>&1 &
  HPID=$!
  if ! wait_for "$pf" '^[0-9]+$' 30; then
    bad "hostile ps ($1) did not start" "$(cat "$dir/hostile.$n_started.log")"
    return 1
  fi
  ADDR="127.0.0.1:$(cat "$pf")"
  SPEC="$dir/spec.$n_started.json"; WSPEC="$dir/wspec.$n_started.json"
  echo "{\"ps\": [\"$ADDR\"]}" > "$SPEC"
  echo "{\"ps\": [\"$ADDR\"], \"worker\": [\"127.0.0.1:0\"]}" > "$WSPEC"
}
stop_hostile() { kill "$HPID" 2> /dev/null; wait "$HPID" 2> /dev/null; }

# expect_clean NAME WANT_RC WANT COMMAND...: expect, and no sanitizer report
# or signal in the output
expect_clean() {
  local name=$1 want_rc=$2 want=$3; shift 3
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [[ "$out" == *"runtime error"* || "$out" == *"Sanitizer"* ]]; then
    bad "$name (a sanitizer report)" "$out"; return
  fi
  if [ "$rc" != "$want_rc" ]; then bad "$name (exit $rc, want $want_rc)" "$out"; return; fi
  if [[ "$out" != *"$want"* ]]; then bad "$name (missing '$want')" "$out"; return; fi
  ok "$name"
}
# rss_below NAME TIMEFILE: the peak RSS /usr/bin/time wrote to TIMEFILE is
# under 200 MiB (the bound of every flood check here)
rss_below() {
  local rss
  rss=$(sed -n 's/^maxrss_kb=//p' "$2")
  if [ -n "$rss" ] && [ "$rss" -lt 204800 ]; then
    ok "$1 RSS ${rss} kB < 200 MiB"
  else
    bad "$1 RSS ${rss:-?} kB (want < 200 MiB)" "$(cat "$2")"
  fi
}
worker() { timeout 120 "$PS_WORKER" --cluster "$WSPEC" --job worker --task 0 --steps 3 --no-restore "$@"; }

# ---- flags
expect "psctl --max-message-bytes below the minimum" 2 \
  "psctl: --max-message-bytes must be a size of at least 16777232 bytes" \
  "$PSCTL" --cluster /dev/null --max-message-bytes 1K vars
expect "ps-worker --max-message-bytes malformed" 2 \
  "ps-worker: --max-message-bytes must be a size of at least 16777232 bytes" \
  "$PS_WORKER" --local --max-message-bytes 12Q
expect "psctl --help documents --max-message-bytes" 0 "--max-message-bytes N" "$PSCTL" --help
expect "ps-worker --help documents --max-message-bytes" 0 "--max-message-bytes N" \
  "$PS_WORKER" --help

# ---- a Read answered OK with no header message
if hostile read_no_header; then
  expect_clean "psctl read: Read without a header" 1 \
    "INTERNAL: ps/0 at $ADDR: Read: the answer has no header (variable w)" \
    "$PSCTL" --cluster "$SPEC" read w
  expect_clean "ps-worker: Read without a header" 1 \
    "ps/0 at $ADDR: Read: the answer has no header (variable global_step)" worker
  stop_hostile
fi

# ---- a 5 MB List of 2.5 million empty entries: refused by their count
# before any is unpacked, psctl's memory stays bounded (the old client
# took 1.2 GiB)
if hostile list_flood; then
  expect_clean "psctl vars: a List flood of empty entries" 1 \
    "ps/0 at $ADDR: List: 2500000 variables, more than the" \
    /usr/bin/time -f "maxrss_kb=%M" -o "$dir/flood.time" "$PSCTL" --cluster "$SPEC" vars
  rss_below "psctl vars: List flood" "$dir/flood.time"
  # under a 1 GiB address-space limit (the old client segfaulted in an
  # unchecked calloc); not under ASan, whose shadow memory needs more
  if ! ldd "$PSCTL" 2> /dev/null | grep libasan > /dev/null; then
    expect_clean "psctl vars: a List flood under prlimit --as=1G" 1 \
      "ps/0 at $ADDR: List: 2500000 variables, more than the" \
      prlimit --as=$((1 << 30)) "$PSCTL" --cluster "$SPEC" vars
  fi
  stop_hostile
fi

# ---- a flood of valid List entries under the receive limit: 3.6 million
# of 9 bytes, each a ps_var_info of some 340 bytes (the old client took
# 1.3 GiB and listed them all); counted before anything is allocated
if hostile list_valid_flood; then
  expect_clean "psctl vars: a flood of 3.6 million valid List entries" 1 \
    "ps/0 at $ADDR: List: 3600000 variables, more than the" \
    /usr/bin/time -f "maxrss_kb=%M" -o "$dir/vflood.time" "$PSCTL" --cluster "$SPEC" vars
  expect_clean "psctl vars: the List flood's error names the limit" 1 \
    "a client holds with a limit of 33554432 bytes (--max-message-bytes)" \
    "$PSCTL" --cluster "$SPEC" vars
  rss_below "psctl vars: valid List flood" "$dir/vflood.time"
  stop_hostile
fi

# ---- a Restore answer of 16 million empty names (32 MB): its entries are
# counted before protobuf-c unpacks them (the old client took 700 MB)
if hostile restore_flood; then
  expect_clean "psctl restore: a flood of 16 million names" 1 \
    "ps/0 at $ADDR: Restore: 16000000 entries, more than the" \
    /usr/bin/time -f "maxrss_kb=%M" -o "$dir/rflood.time" "$PSCTL" --cluster "$SPEC" restore
  rss_below "psctl restore: names flood" "$dir/rflood.time"
  stop_hostile
fi

# ---- a checkpoint list (psctl restore's first call) of one tensor with
# 15 million empty slices (30 MB): tensors and slices are counted on the
# wire before protobuf-c unpacks them (the old client asked for 5 GB)
if hostile restore_list_flood; then
  expect_clean "psctl restore: a list of 15 million slices" 1 \
    "ps/0 at $ADDR: Restore: the checkpoint's list has more than" \
    /usr/bin/time -f "maxrss_kb=%M" -o "$dir/lflood.time" "$PSCTL" --cluster "$SPEC" restore
  expect_clean "psctl restore: the list flood's error names the limit" 1 \
    "tensors and slices, the most a client holds with a limit of 33554432 bytes (--max-message-bytes)" \
    "$PSCTL" --cluster "$SPEC" restore
  rss_below "psctl restore: list flood" "$dir/lflood.time"
  stop_hostile
fi

# ---- a checkpoint list out of order (a bundle's index is sorted)
if hostile restore_list_disorder; then
  expect_clean "psctl restore: a checkpoint list out of order" 1 \
    "ps/0 at $ADDR: Restore: tensor a after b: the checkpoint's tensors are not in order, or one is listed twice" \
    "$PSCTL" --cluster "$SPEC" restore
  stop_hostile
fi

# ---- a List naming a variable twice
if hostile list_dup; then
  expect_clean "psctl vars: a variable listed twice" 1 \
    "ps/0 at $ADDR: List: variable w is listed twice" \
    "$PSCTL" --cluster "$SPEC" vars
  stop_hostile
fi

# ---- a Read whose header came and whose call then ended UNAVAILABLE: the
# retry parses a header again, and the first one's rows (a deduplicated
# gather of wide_deep's embeddings) are freed (ASan's leak check at exit)
if hostile read_retry; then
  expect_clean "ps-worker: a gather read retried after its header" 0 \
    "test accuracy" \
    timeout 120 "$PS_WORKER" --cluster "$WSPEC" --job worker --task 0 --steps 0 \
    --no-restore --model wide_deep
  if grep -q "read_retry: a gather's header sent" "$dir/hostile.$n_started.log"; then
    ok "ps-worker: the hostile ps ended a gather read after its header"
  else
    bad "ps-worker: the hostile ps saw no gather read" "$(cat "$dir/hostile.$n_started.log")"
  fi
  stop_hostile
fi

# ---- empty messages after a Read's data: a protocol error at once, not
# the call's deadline (8 s here; ps-worker's is 300 s)
if hostile read_empty_tail; then
  t0=$(date +%s%N)
  expect_clean "psctl read: empty messages after the data" 1 \
    "INTERNAL: ps/0 at $ADDR: /paramserver.Ps/Read: an empty data message" \
    "$PSCTL" --cluster "$SPEC" --timeout-ms 8000 read w
  ms=$((($(date +%s%N) - t0) / 1000000))
  if [ "$ms" -lt 4000 ]; then ok "psctl read: empty messages refused in $ms ms"; else bad "psctl read: empty messages took $ms ms (the deadline is 8000)"; fi
  expect_clean "ps-worker: empty messages after global_step's data" 1 \
    "ps/0 at $ADDR: /paramserver.Ps/Read: an empty data message" worker
  stop_hostile
fi

# ---- a List answer over the client's --max-message-bytes (gRPC's own
# words for it vary between versions: only the client's are matched)
if hostile list_big; then
  expect_clean "psctl vars: an answer over the default limit" 1 \
    "an answer over the limit of 33554432 bytes (--max-message-bytes)" \
    "$PSCTL" --cluster "$SPEC" vars
  expect_clean "psctl vars: an answer over the limit names the ps" 1 \
    "psctl: ps/0 at $ADDR: " \
    "$PSCTL" --cluster "$SPEC" vars
  expect_clean "psctl vars: --max-message-bytes 20M" 1 \
    "an answer over the limit of 20971520 bytes (--max-message-bytes)" \
    "$PSCTL" --cluster "$SPEC" --max-message-bytes 20M vars
  # let through, the answer's 40 MB name is refused by the checks after it
  expect_clean "psctl vars: --max-message-bytes 64M lets it in, its name is refused" 1 \
    "ps/0 at $ADDR: List: answer: VarInfo.name is 41943040 bytes; the limit is 4096" \
    "$PSCTL" --cluster "$SPEC" --max-message-bytes 64M vars
  stop_hostile
fi

# ---- IsInitialized: 0 entries for 1 name
if hostile isinit_empty; then
  expect_clean "psctl read: IsInitialized with 0 entries for 1 name" 1 \
    "ps/0 at $ADDR: IsInitialized: 0 answers for 1 names (w)" \
    "$PSCTL" --cluster "$SPEC" read w
  stop_hostile
fi

# ---- a [3,0] shape followed by data: a protocol error at once, not the
# call's deadline (20 s here)
if hostile read_shape_30; then
  t0=$(date +%s%N)
  expect_clean "psctl read: data after a [3,0] shape" 1 \
    "INTERNAL: ps/0 at $ADDR: /paramserver.Ps/Read: more data than announced (0 bytes)" \
    "$PSCTL" --cluster "$SPEC" --timeout-ms 20000 read w
  ms=$((($(date +%s%N) - t0) / 1000000))
  if [ "$ms" -lt 10000 ]; then ok "psctl read: [3,0] refused in $ms ms"; else bad "psctl read: [3,0] took $ms ms (the deadline is 20000)"; fi
  expect_clean "ps-worker: data after a [3,0] global_step" 1 \
    "ps/0 at $ADDR: /paramserver.Ps/Read: more data than announced (0 bytes)" worker
  stop_hostile
fi

# ---- a Read announcing float32 [2^40]: checked against this machine's
# memory before the allocator is asked (ASan aborted on it)
if hostile read_huge; then
  expect_clean "psctl read: a [2^40] tensor" 1 \
    "RESOURCE_EXHAUSTED: ps/0: Read: variable w: float of shape [1099511627776] is 4398046511104 bytes, more than this machine's memory" \
    "$PSCTL" --cluster "$SPEC" read w
  expect_clean "ps-worker: a [2^40] global_step" 1 \
    "ps/0: Read: variable global_step: float of shape [1099511627776] is 4398046511104 bytes" worker
  stop_hostile
fi

# ---- a Read answering another variable
if hostile read_wrong_name; then
  expect_clean "psctl read: a tensor of another name" 1 \
    "ps/0 at $ADDR: Read: tensor 0 is v, the variable asked for is w" \
    "$PSCTL" --cluster "$SPEC" read w
  stop_hostile
fi

# ---- an Update answer without its versions
if hostile update_count; then
  expect_clean "ps-worker: Update answered with 0 versions" 1 \
    "ps/0 at $ADDR: Update: 0 versions, 0 stale flags and 0 steps for" worker
  stop_hostile
fi

# ---- a Merge answer that names no checkpoint (a sibling: every decoder
# checks its answer); global_step is answered as float [0]
if hostile merge_empty; then
  expect_clean "psctl save: Merge naming no checkpoint" 1 \
    "ps/0 at $ADDR: Merge: the answer names no checkpoint" \
    "$PSCTL" --cluster "$SPEC" save
  stop_hostile
fi

finish
