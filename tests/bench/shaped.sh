#!/usr/bin/env bash
# bfloat16 against float32 pushes on a rate-limited link (run by
# `tests/bench/run.sh shaped [RATE ...] [-- bench_wire options]`):
#   shaped.sh BUILD [RATE ...] [-- bench_wire options]
# Two network namespaces joined by a veth pair (MTU 9000, jumbo frames as
# on 10/25 Gbit/s links), nothing added to the root namespace: a real
# ps-server (PS_SERVER, else BUILD/ps/ps-server) listens on its veth
# address in one, and BUILD/tests/bench/bench_wire runs in the other.  For
# each RATE (tc's units: 10gbit, 2500mbit...; "none": the veth unshaped;
# default: none 10gbit 25gbit) both directions are shaped with tbf, iperf3
# (when installed) measures what the link then carries, and bench_wire
# runs.  Root only.  Everything it starts runs in the namespaces it
# creates (names with this shell's pid), and the namespaces and their
# processes are removed however it ends.  BURST_US (default 200): tbf's
# bucket, in microseconds of the rate (at least 64 KiB): bytes that pass
# at the veth's own speed after an idle moment.  Exit status 1 when a
# run failed (bench_wire's check, the ps), 2 for a bad argument.
set -uo pipefail
build=${1:?usage: shaped.sh BUILD [RATE ...] [-- bench_wire options]}
shift
PS_SERVER=${PS_SERVER:-$build/ps/ps-server}
wire=$build/tests/bench/bench_wire
rates=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  rates+=("$1")
  shift
done
[ "${1:-}" = -- ] && shift
[ ${#rates[@]} -gt 0 ] || rates=(none 10gbit 25gbit)
burst_us=${BURST_US:-200}
if [ "$(id -u)" != 0 ] || ! command -v ip > /dev/null || ! command -v tc > /dev/null; then
  echo "shaped.sh: needs root, iproute2 (ip) and tc: run it as sudo tests/bench/run.sh shaped" >&2
  exit 2
fi
# RATE in bit/s, or nothing when tc would not take it
rate_bps() {
  echo "$1" | awk '{
    if (match($0, /^[0-9]+(\.[0-9]+)?/) == 0) exit
    n = substr($0, 1, RLENGTH); u = substr($0, RLENGTH + 1)
    m["bit"] = 1; m["kbit"] = 1e3; m["mbit"] = 1e6; m["gbit"] = 1e9; m["tbit"] = 1e12
    if (u in m && n > 0) printf "%.0f\n", n * m[u] }'
}
for r in "${rates[@]}"; do
  if [ "$r" != none ] && [ -z "$(rate_bps "$r")" ]; then
    echo "shaped.sh: rate $r: give none or a number with bit, kbit, mbit, gbit or tbit" >&2
    exit 2
  fi
done
ns=psw$$
nsp=$ns-ps
nsc=$ns-cl
net=10.214.$((RANDOM % 200 + 20))
dir=$(mktemp -d "${TMPDIR:-/tmp}/shaped.XXXXXX") || exit 1
ps_pid=""
# shellcheck disable=SC2317 # run by the traps
cleanup() {
  local p n
  [ -n "$ps_pid" ] && kill -KILL "$ps_pid" 2> /dev/null
  for n in "$nsp" "$nsc"; do
    for p in $(ip netns pids "$n" 2> /dev/null); do kill -KILL "$p" 2> /dev/null; done
    ip netns del "$n" 2> /dev/null
  done
  rm -rf "$dir"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
if ! { ip netns add "$nsp" && ip netns add "$nsc" &&
  ip -n "$nsp" link add v0 mtu 9000 type veth peer name v1 mtu 9000 netns "$nsc" &&
  ip -n "$nsp" addr add "$net.1/24" dev v0 && ip -n "$nsc" addr add "$net.2/24" dev v1 &&
  ip -n "$nsp" link set v0 up && ip -n "$nsc" link set v1 up &&
  ip -n "$nsp" link set lo up && ip -n "$nsc" link set lo up; }; then
  echo "shaped.sh: cannot create the namespaces and their veth pair" >&2
  exit 1
fi
echo "{\"ps\": [\"$net.1:2222\"]}" > "$dir/spec.json"
mkfifo "$dir/ready"
ip netns exec "$nsp" "$PS_SERVER" --cluster "$dir/spec.json" --job ps --task 0 \
  --bind "$net.1" > "$dir/ready" 2> "$dir/ps.log" &
ps_pid=$!
line=""
read -r -t 60 line < "$dir/ready"
if [[ "$line" != *"ready on"* ]]; then
  echo "shaped.sh: the ps did not start:" >&2
  tail -5 "$dir/ps.log" >&2
  exit 1
fi
echo "shaped.sh: $line (namespace $nsp; bench_wire in $nsc, veth MTU 9000)" >&2
# shape RATE: tbf on both ends' egress, or none
shape() {
  local n dev bps burst
  for n in "$nsp:v0" "$nsc:v1"; do
    dev=${n#*:}
    n=${n%%:*}
    if [ "$1" = none ]; then
      ip netns exec "$n" tc qdisc del dev "$dev" root 2> /dev/null || true
    else
      bps=$(rate_bps "$1")
      burst=$(awk -v b="$bps" -v u="$burst_us" 'BEGIN { x = b / 8 * u / 1e6;
        printf "%.0f\n", x < 65536 ? 65536 : x }')
      ip netns exec "$n" tc qdisc replace dev "$dev" root tbf rate "$1" burst "$burst" \
        latency 10ms || return 1
    fi
  done
}
status=0
for r in "${rates[@]}"; do
  if ! shape "$r"; then
    echo "shaped.sh: tc refused rate $r" >&2
    status=1
    continue
  fi
  ip netns exec "$nsp" tc qdisc show dev v0 >&2
  if command -v iperf3 > /dev/null; then
    ip netns exec "$nsp" iperf3 -s -1 -B "$net.1" > "$dir/iperf3s.log" 2>&1 &
    ip_pid=$!
    sleep 0.3
    bits=$(ip netns exec "$nsc" iperf3 -c "$net.1" -t 2 -f m 2> /dev/null |
      awk '/receiver/ { for (i = 1; i < NF; i++) if ($(i + 1) == "Mbits/sec") v = $i }
           END { if (v != "") printf "%.2f\n", v / 1000 }')
    kill "$ip_pid" 2> /dev/null
    wait "$ip_pid" 2> /dev/null
    if [ -n "$bits" ]; then
      echo "bench: wire_${r}_iperf3 $bits Gbit/s"
    else
      echo "bench: wire_${r}_iperf3 skipped (iperf3 failed)"
    fi
  else
    echo "bench: wire_${r}_iperf3 skipped (no iperf3)"
  fi
  bps=0
  [ "$r" != none ] && bps=$(rate_bps "$r")
  # in the background: a signal's trap runs at once, not after the run
  ip netns exec "$nsc" "$wire" "$net.1:2222" --label "$r" --link-bps "$bps" "$@" &
  wait $! || status=1
done
kill -TERM "$ps_pid"
wait "$ps_pid"
rc=$?
ps_pid=""
if [ "$rc" != 0 ]; then
  echo "shaped.sh: the ps exited with status $rc:" >&2
  tail -5 "$dir/ps.log" >&2
  status=1
fi
exit $status
