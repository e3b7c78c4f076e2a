#!/usr/bin/env bash
# Resource exhaustion from outside (issue 21, points 18 and 19), through a
# real ps-server and psctl:
# - a refused huge request message: the ps's memory comes back to its
#   baseline (VmRSS, a ratio against the baseline of the same run); a Read
#   of --max-read-names long names is answered, and a header over
#   --max-message-bytes is refused with a message naming the limit;
# - psctl latest on a state file of 100,000 entries finishes in time;
# - silent connections (no HTTP/2 preface, no TLS handshake) under an
#   open-file limit of 256 are closed within 10 s, plaintext and TLS, so a
#   real client gets in; with TLS, a listener that ran out of descriptors
#   accepts again.
# Ports are picked at run time; every process is stopped however the
# script ends (lib.sh).
set -uo pipefail
PS_SERVER=${PS_SERVER:?}; PSCTL=${PSCTL:?}
source "$(dirname "$0")/../support/lib.sh"
test_init exhaustion

PY=/usr/bin/python3
if ! $PY -c 'import grpc' 2> /dev/null; then
  bad "python3-grpcio" "not installed (deploy/setup.sh installs it)"
  finish
fi
rss() { sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
hwm() { sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' "/proc/$1/status"; }
echo '{"ps": ["127.0.0.1:0"]}' > "$dir/one.json"
# Under AddressSanitizer freed memory waits in a quarantine and its
# allocator keeps freed pages: a small quarantine and a prompt release keep
# the figures about the ps, not the sanitizer.
ASAN_PS="env ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=4:allocator_release_to_os_interval_ms=100"

# ---- point 19: memory after a refused huge message ----
big_py='
import grpc, sys
addr, size = sys.argv[1], int(sys.argv[2])
ch = grpc.insecure_channel(addr, options=[("grpc.max_send_message_length", -1)])
call = ch.unary_unary("/paramserver.Ps/Read", request_serializer=lambda b: b,
                      response_deserializer=lambda b: b)
# a ReadRequest header: one item whose name is the rest of the message
body = bytearray(b"\x0a")
n = size
def varint(v):
    out = bytearray()
    while True:
        out.append((v & 0x7f) | (0x80 if v >= 0x80 else 0))
        v >>= 7
        if v == 0:
            return out
item_len = size  # approximately: the header is a little over size bytes
body += varint(item_len + 1 + len(varint(item_len)))
body += b"\x0a" + varint(item_len) + b"a" * item_len
try:
    call(bytes(body), timeout=120)
    print("OK")
except grpc.RpcError as e:
    print(e.code().name, e.details())
'
PS_PREFIX=$ASAN_PS start_ps "$dir/one.json" 0 "$dir/mem.log"
MP=$PID MA=$ADDR
echo "{\"ps\": [\"$MA\"]}" > "$dir/mem.json"
"$PSCTL" --cluster "$dir/mem.json" status > /dev/null
# A Read at --max-read-names (100,000 items) of 300-byte names (a header of
# 30.6 MB: every nested ReadItem costs framing) is within every limit and
# is answered; one byte over --max-message-bytes is refused with its
# message.
many_py='
import grpc, sys
addr, n, nlen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
opts = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
ch = grpc.insecure_channel(addr, options=opts)
def call(m, b):
    return ch.unary_unary("/paramserver.Ps/" + m, request_serializer=lambda x: x,
                          response_deserializer=lambda x: x)(b, timeout=120)
def varint(v):
    out = bytearray()
    while True:
        out.append((v & 0x7f) | (0x80 if v >= 0x80 else 0))
        v >>= 7
        if v == 0:
            return bytes(out)
def ld(tag, b):
    return bytes([tag]) + varint(len(b)) + b
name = b"v" * nlen
init = ld(0x0a, b"zeros")
spec = ld(0x0a, name) + b"\x10\x01" + ld(0x22, init)  # float32, shape [], zeros
call("Create", ld(0x0a, spec))
call("Initialize", ld(0x0a, name))
item = ld(0x0a, ld(0x0a, name))
hdr = item * n
print("header", len(hdr))
try:
    r = list(ch.stream_stream("/paramserver.Ps/Read", request_serializer=lambda x: x,
                              response_deserializer=lambda x: x)(iter([hdr]), timeout=120))
    print("OK", len(r), "message(s)")
except grpc.RpcError as e:
    print(e.code().name, e.details())
'
out=$($PY -c "$many_py" "$MA" 100000 300 2>&1)
echo "$out"
case $out in
  *"header 30600000"*"OK "*) ok "a Read of 100,000 names of 300 bytes (a 30.6 MB header) is answered" ;;
  *) bad "a Read of 100,000 names of 300 bytes (a 30.6 MB header) is answered" "$out" ;;
esac
expect "a header over --max-message-bytes is refused" 0 \
  "RESOURCE_EXHAUSTED /paramserver.Ps/Read: request header of 33554442 bytes is over the limit of 33554432 bytes (--max-message-bytes)" \
  $PY -c "$big_py" "$MA" $((32 << 20))
sleep 1.5 # the monitor's look at the heap (once a second) settles
base=$(rss "$MP")
HUGE_MIB=${PS_TEST_HUGE_MIB:-1024}
expect "a $HUGE_MIB MiB header is refused" 0 "RESOURCE_EXHAUSTED" \
  $PY -c "$big_py" "$MA" $((HUGE_MIB << 20))
# What the refused message took (its peak over the baseline) comes back:
# at least 90 % of it within 10 s.  glibc keeps the free top of a
# thread's heap below M_TRIM_THRESHOLD (64 MiB: common/rpc.c, tune_malloc),
# so "all of it" would be wrong; before, 40 % of a 1 GiB message stayed.
# Under AddressSanitizer the shadow of the freed heap (an eighth of it)
# stays resident: 80 %.
pct=90
ldd "$PS_SERVER" | grep libasan > /dev/null && pct=80
peak=$(hwm "$MP") after=0
for ((i = 0; i < 100; i++)); do # up to 10 s
  after=$(rss "$MP")
  [ $((100 * (peak - after))) -ge $((pct * (peak - base))) ] && break
  sleep 0.1
done
echo "VmRSS: baseline $base kB, peak $peak kB, after the refused $HUGE_MIB MiB message $after kB"
check "the memory comes back ($pct %): VmRSS $after kB after a peak of $peak kB (baseline $base kB)" \
  test $((100 * (peak - after))) -ge $((pct * (peak - base)))
# The ps logs a trim when it made one ("gave N MiB of freed heap back");
# glibc sometimes returns the pages itself when they are freed, and then
# there is nothing to trim and nothing to log (1 run in 5 under load): the
# property is the RSS above, the line is only shown.
grep -E "INFO ps/0: gave [0-9]* MiB of freed heap back" "$dir/mem.log" ||
  echo "(no trim was needed: the memory came back when it was freed)"
expect "the ps serves on" 0 "ps/0" "$PSCTL" --cluster "$dir/mem.json" status
kill -TERM "$MP"; wait "$MP"

# ---- point 19: a state file of 100,000 entries ----
mkdir -p "$dir/ck"
$PY - "$dir/ck" << 'PYEOF'
import sys
d, n = sys.argv[1], 100000
with open(d + "/checkpoint", "w") as f:
    f.write('model_checkpoint_path: "model.ckpt-%d"\n' % n)
    for i in range(1, n + 1):
        f.write('all_model_checkpoint_paths: "model.ckpt-%d"\n' % i)
    for i in range(1, n + 1):
        f.write("all_model_checkpoint_timestamps: %d.5\n" % (1700000000 + i))
open(d + "/model.ckpt-%d.index" % n, "w").close()
PYEOF
t0=$(date +%s%N)
out=$(timeout 30 "$PSCTL" latest "$dir/ck" 2>&1); rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
[ "$rc" = 0 ] && [ "$out" = "$dir/ck/model.ckpt-100000" ] \
  && ok "psctl latest on 100,000 entries ($ms ms)" \
  || bad "psctl latest on 100,000 entries (exit $rc after $ms ms; 124: over 30 s)" "$out"

# ---- point 18: silent connections under an open-file limit of 256 ----
# 250 raw TCP connections that send nothing (no HTTP/2 preface, no TLS
# ClientHello) stay open on the client's side; a real call must get in
# within ~15 s (connections that made no call are closed after 10 s), and
# they are logged.  Plaintext, then TLS.
GEN_CERTS=${GEN_CERTS:-$(dirname "$0")/../../deploy/gen-certs.sh}
C="$dir/certs"
bash "$GEN_CERTS" "$C" > "$dir/gen.log" 2>&1 || bad "gen-certs" "$(cat "$dir/gen.log")"
silent_py='
import grpc, socket, sys, time
addr, ca, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
host, port = addr.rsplit(":", 1)
socks = []
for _ in range(n):
    try:
        socks.append(socket.create_connection((host, int(port)), timeout=5))
    except OSError:
        pass
t0 = time.time()
err = "none"
while time.time() - t0 < 30:
    if ca == "-":
        ch = grpc.insecure_channel(addr)
    else:
        ch = grpc.secure_channel(addr, grpc.ssl_channel_credentials(open(ca, "rb").read()),
                                 options=[("grpc.ssl_target_name_override", "localhost")])
    st = ch.unary_unary("/paramserver.Ps/Status", request_serializer=lambda b: b,
                        response_deserializer=lambda b: b)
    try:
        st(b"", timeout=2)
        break
    except grpc.RpcError as e:
        err = e.code().name + " " + str(e.details())
    finally:
        ch.close()
    time.sleep(0.2)
else:
    print("no call got in for 30 s with %d silent connections open; last: %s" % (len(socks), err))
    sys.exit(1)
print("%d silent connections: a call got in after %.0f s" % (len(socks), time.time() - t0))
'
for mode in plaintext TLS; do
  flags=() ca=-
  if [ $mode = TLS ]; then flags=(--tls-cert "$C/server.crt" --tls-key "$C/server.key"); ca="$C/ca.crt"; fi
  PS_PREFIX="prlimit --nofile=256:256" start_ps "$dir/one.json" 0 "$dir/silent-$mode.log" "${flags[@]}"
  SP=$PID
  if [ -z "$ADDR" ]; then bad "$mode: ps under prlimit --nofile=256" "$(cat "$dir/silent-$mode.log")"; continue; fi
  out=$($PY -c "$silent_py" "$ADDR" "$ca" 250 2>&1); rc=$?
  secs=$(echo "$out" | sed -n 's/.*a call got in after \([0-9]*\) s.*/\1/p')
  [ "$rc" = 0 ] && [ -n "$secs" ] && [ "$secs" -le 15 ] \
    && ok "$mode, 256 descriptors: $out" || bad "$mode, 256 descriptors: a call gets in within 15 s" "$out"
  check "$mode: the silent connections closed are logged" has "$dir/silent-$mode.log" "connection(s) that made no call within 10 s"
  check "$mode: the ps is still up" kill -0 "$SP"
  kill -TERM "$SP"; wait "$SP"
done

# A connection that made a call keeps its slot: a health Watch opened
# after a Status call on the same channel is still open 12 s later, while
# a silent socket opened beside it is closed (plaintext, no tokens).
watch_py='
import grpc, socket, sys, time
addr = sys.argv[1]
ch = grpc.insecure_channel(addr)
ch.unary_unary("/paramserver.Ps/Status", request_serializer=lambda b: b,
               response_deserializer=lambda b: b)(b"", timeout=10)
from rawgrpc import watch_health
ended = watch_health(ch)
host, port = addr.rsplit(":", 1)
raw = socket.create_connection((host, int(port)))
raw.settimeout(15)
t0 = time.time()
gone = False
try:  # the ps sends its HTTP/2 SETTINGS first: read to the end
    while not gone:
        gone = raw.recv(4096) == b""
except socket.timeout:
    pass
except OSError:
    gone = True
waited = time.time() - t0
time.sleep(max(0, 12 - waited))
print("silent socket closed" if gone else "silent socket open", "after %.0f s;" % waited,
      "watch", ended[0] if ended else "open")
'
start_ps "$dir/one.json" 0 "$dir/watch.log"
WP=$PID
out=$($PY -c "$watch_py" "$ADDR" 2>&1)
# (the monitor looks once a second, and a loaded machine adds a little)
[[ "$out" == "silent socket closed after 1"[0-3]" s; watch open" ]] \
  && ok "a connection that made a call stays, a silent one goes: $out" \
  || bad "a connection that made a call stays, a silent one goes (want: closed after 10-13 s, watch open)" "$out"
kill -TERM "$WP"; wait "$WP"

# A live call is not a silent socket: a client that opens a Read and sends
# its first message only after 12 s gets its answer (before, its
# connection was shut at 10 s: gRPC handed the call over only with its
# first message, UNAVAILABLE "Socket closed"), while a silent socket
# opened beside it is still closed after 10-13 s.  Plaintext and TLS.
late_py='
import grpc, socket, sys, threading, time
addr, ca = sys.argv[1], sys.argv[2]
def channel():
    opts = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own
    if ca == "-":
        return grpc.insecure_channel(addr, options=opts)
    return grpc.secure_channel(addr, grpc.ssl_channel_credentials(open(ca, "rb").read()),
                               options=opts + [("grpc.ssl_target_name_override", "localhost")])
def ld(tag, b):
    out = bytearray([tag]); v = len(b)
    while True:
        out.append((v & 0x7f) | (0x80 if v >= 0x80 else 0)); v >>= 7
        if v == 0:
            return bytes(out) + b
ident = lambda b: b
setup = channel()
spec = ld(0x0a, b"late") + b"\x10\x01" + ld(0x22, ld(0x0a, b"zeros"))
setup.unary_unary("/paramserver.Ps/Create", ident, ident)(ld(0x0a, spec), timeout=10)
setup.unary_unary("/paramserver.Ps/Initialize", ident, ident)(ld(0x0a, b"late"), timeout=10)
setup.close()
host, port = addr.rsplit(":", 1)
raw = socket.create_connection((host, int(port)))
raw.settimeout(15)
t0 = time.time()
def later():
    time.sleep(12)
    yield ld(0x0a, ld(0x0a, b"late"))
result = []
def call():
    ch = channel()
    try:
        got = list(ch.stream_stream("/paramserver.Ps/Read", ident, ident)(later(), timeout=30))
        # whole seconds, rounded down: answered within 1 s of its message
        result.append("OK, %d message(s) after %d s" % (len(got), int(time.time() - t0)))
    except grpc.RpcError as e:
        result.append("%s %s after %.1f s" % (e.code().name, e.details(), time.time() - t0))
th = threading.Thread(target=call)
th.start()
gone = False
try:  # the ps sends its HTTP/2 SETTINGS (or TLS ServerHello) only after bytes; read to the end
    while not gone:
        gone = raw.recv(4096) == b""
except socket.timeout:
    pass
except OSError:
    gone = True
waited = time.time() - t0
th.join()
print("late Read:", result[0] + ";", "silent socket", "closed" if gone else "open",
      "after %.0f s" % waited)
'
for mode in plaintext TLS; do
  flags=() ca=-
  if [ $mode = TLS ]; then flags=(--tls-cert "$C/server.crt" --tls-key "$C/server.key"); ca="$C/ca.crt"; fi
  start_ps "$dir/one.json" 0 "$dir/late-$mode.log" "${flags[@]}"
  LP=$PID
  out=$($PY -c "$late_py" "$ADDR" "$ca" 2>&1)
  [[ "$out" == "late Read: OK, "[1-9]" message(s) after 12 s; silent socket closed after 1"[0-3]" s" ]] \
    && ok "$mode: a call whose first message comes after 12 s is served, a silent socket goes: $out" \
    || bad "$mode: a call whose first message comes after 12 s is served (want: OK, silent socket closed after 10-13 s)" "$out"
  kill -TERM "$LP"; wait "$LP"
done

# ---- point 18: a burst of connections at TLS ----
# gRPC 1.51's own listener stopped for good on its first accept4 error
# (EMFILE); the ps now accepts TLS connections itself, as it does
# plaintext ones, and hands them to gRPC: a burst of twice the open-file
# limit leaves it accepting.
burst_py='
import grpc, resource, socket, sys, time
addr, ca, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
resource.setrlimit(resource.RLIMIT_NOFILE, (n + 256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
host, port = addr.rsplit(":", 1)
socks, t0 = [], time.time()
for _ in range(n):
    s = socket.socket()
    s.setblocking(False)
    try:
        s.connect((host, int(port)))
    except BlockingIOError:
        pass
    socks.append(s)
burst = time.time() - t0
time.sleep(2)
# the burst stays open: the slots free up as its silent connections are
# shut after 10 s, and the call gets in then
t0 = time.time()
err = "none"
while time.time() - t0 < 40:
    ch = grpc.secure_channel(addr, grpc.ssl_channel_credentials(open(ca, "rb").read()),
                             options=[("grpc.ssl_target_name_override", "localhost")])
    try:
        ch.unary_unary("/paramserver.Ps/Status", request_serializer=lambda b: b,
                       response_deserializer=lambda b: b)(b"", timeout=2)
        break
    except grpc.RpcError as e:
        err = e.code().name + " " + str(e.details())
    finally:
        ch.close()
    time.sleep(0.2)
else:
    print("no call got in for 40 s after a burst of %d connections (still open); last: %s" % (n, err))
    sys.exit(1)
print("a burst of %d connections in %.1f s, still open: a call got in %.0f s after" % (n, burst, time.time() - t0))
for s in socks:
    s.close()
'
PS_PREFIX="prlimit --nofile=512:512" start_ps "$dir/one.json" 0 "$dir/burst.log" \
  --tls-cert "$C/server.crt" --tls-key "$C/server.key"
BP=$PID
if [ -n "$ADDR" ]; then
  out=$($PY -c "$burst_py" "$ADDR" "$C/ca.crt" 1024 2>&1); rc=$?
  secs=$(echo "$out" | sed -n 's/.*a call got in \([0-9]*\) s after.*/\1/p')
  [ "$rc" = 0 ] && [ -n "$secs" ] && [ "$secs" -le 20 ] && ok "TLS, 512 descriptors: $out" \
    || bad "TLS, 512 descriptors: a call gets in within 20 s of a burst of 1024 connections held open" "$out $(tail -5 "$dir/burst.log")"
  # what the burst proves: the ps ran out of descriptors (or slots) and
  # went on accepting, its own loop, not gRPC's listener
  check "TLS: the burst ran the ps out of descriptors or slots" \
    grep -Eq "accepting connections: Too many open files; retrying every 100 ms|connections open \(--max-connections\): closing new ones" "$dir/burst.log"
  check "TLS: gRPC's listener was not used" test "$(grep -c 'accepts no more' "$dir/burst.log")" = 0
  check "TLS: the ps is still up after the burst" kill -0 "$BP"
  kill -TERM "$BP"; wait "$BP"
else
  bad "TLS ps under prlimit --nofile=512" "$(cat "$dir/burst.log")"
fi

# ---- gRPC's external-connection handler of another type ----
# The ps calls the handler gRPC stores for its "external:" port only if
# its C++ type is the one of gRPC 1.51; another (PS_TLS_HANDLER_TYPE names
# another, as another build would) is warned about and gRPC's own
# listener serves TLS instead.
PS_PREFIX="env PS_TLS_HANDLER_TYPE=N4grpc11OtherHandlerE" start_ps "$dir/one.json" 0 \
  "$dir/rtti.log" --tls-cert "$C/server.crt" --tls-key "$C/server.key"
RP=$PID
if [ -n "$ADDR" ]; then
  check "a handler of another type is warned about" has "$dir/rtti.log" \
    "WARN ps/0: TLS: gRPC's external-connection handler is not of the type this ps was built for (N12_GLOBAL__N_125ExternalConnectionHandlerE): gRPC's own listener accepts TLS connections instead"
  out=$($PY -c "$silent_py" "$ADDR" "$C/ca.crt" 0 2>&1)
  [[ "$out" == "0 silent connections: a call got in after "* ]] \
    && ok "TLS through gRPC's listener: $out" || bad "TLS through gRPC's listener" "$out"
  kill -TERM "$RP"; wait "$RP"
else
  bad "TLS ps with a handler of another type" "$(cat "$dir/rtti.log")"
fi

finish
