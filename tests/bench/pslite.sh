#!/usr/bin/env bash
# This project against dmlc/ps-lite, in interleaved rounds (opt-in:
# tests/bench/run.sh pslite).
#   PSLITE_DIR=DIR tests/bench/pslite.sh BUILD [ROUNDS] [bench_ps options]
# PSLITE_DIR is a built ps-lite (make DEPS_PATH=/usr PROTOC=/usr/bin/protoc,
# with Debian's libzmq3-dev libprotobuf-dev protobuf-compiler): ps-lite is
# only run and linked, never copied.  The workload is bench_ps (d), the
# sparse one; with --bulk-mib N bench_ps (a), dense N MiB pushes and
# pulls, and the servers' peak RSS holding what (a) left on ours; with
# --scalar [--iters N] bench_ps (b), the scalar add's round trip, on one
# CPU and on two; with --agg [--mib N] [--reps N] bench_agg, 2 servers and
# 2 workers at once, unpinned; --recv-window N, in any mode, fixes our
# side's HTTP/2 windows (bench_ps and bench_agg pass it on).  Each round
# runs one round of ours, then
# the same workload on ps-lite (pslite_sparse.cc, pslite_dense.cc,
# pslite_scalar.cc or pslite_agg.cc; one server and one worker pinned as
# bench_ps pins its servers and client, the scheduler beside the server,
# or 2 + 2 unpinned; compiled as the ps's kernels are: -O3
# -fno-math-errno).
# stdout: each round's figures (with how much CPU the rest of the machine
# took meanwhile: a busy neighbour skews a round), then `bench:' lines
# with the median of the rounds' ratios (this project / ps-lite) and their
# range, and the bounds: our raw TCP baseline and iperf3 (the wire; not
# for the scalar round trip, which iperf3 cannot measure) over ps-lite.  Every process started here is stopped when the script ends, in
# every outcome; ps-lite's get PSLITE_TIMEOUT seconds (default 600).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: pslite.sh BUILD [ROUNDS] [bench_ps options]}
rounds=${2:-3}
shift $(($# >= 2 ? 2 : 1))
pl=${PSLITE_DIR:?set PSLITE_DIR to a built dmlc/ps-lite (see tests/bench/README.md)}
[ -f "$pl/build/libps.a" ] || { echo "pslite.sh: $pl/build/libps.a missing: build ps-lite first" >&2; exit 2; }
tmo=${PSLITE_TIMEOUT:-600}
rows=1048576 dim=64 batch=8192 zipf=1.1 steps=100 op=add bulk= reps= agg= mib=4 scalar= iters=5000
args=("$@") ours=()
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    --rows) rows=${args[$((i + 1))]} ;;
    --dim) dim=${args[$((i + 1))]} ;;
    --batch) batch=${args[$((i + 1))]} ;;
    --zipf) zipf=${args[$((i + 1))]} ;;
    --sparse-steps) steps=${args[$((i + 1))]} ;;
    --sparse-op) op=${args[$((i + 1))]} ;;
    --bulk-mib) bulk=${args[$((i + 1))]} ;;
    --reps) reps=${args[$((i + 1))]} ;;
    --mib) mib=${args[$((i + 1))]} ;;
    --iters) iters=${args[$((i + 1))]} ;;
    --agg) agg=1; continue ;;
    --scalar) scalar=1; continue ;;
  esac
  ours+=("${args[$i]}")
done
# bench_ps (b) warms up with 500 calls (fewer when --iters is smaller)
src=pslite_sparse part=d pargs=($rows $dim $batch $zipf $steps $op)
[ -n "$bulk" ] && src=pslite_dense part=a pargs=($((bulk << 20)) ${reps:-11})
[ -n "$scalar" ] && src=pslite_scalar part=b pargs=($iters $((iters < 500 ? iters : 500)))
[ -n "$agg" ] && src=pslite_agg pargs=($((mib << 20)) ${reps:-50})
bin="$build/tests/bench/$src"
g++ -std=c++14 -O3 -fno-math-errno -isystem "$pl/include" -I"$here" "$here/$src.cc" \
  "$pl/build/libps.a" -lprotobuf-lite -lzmq -pthread -o "$bin"
# the first two CPUs this script may use, as bench_ps takes them
cpus=()
IFS=, read -ra spans <<< "$(taskset -pc $$ | sed 's/.*: //')"
for s in "${spans[@]}"; do
  for ((c = ${s%-*}; c <= ${s#*-}; c++)); do cpus+=($c); done
done
c0=${cpus[0]} c1=${cpus[1]:-${cpus[0]}}
tmp=$(mktemp -d)
# (set +e: under -e the trap would stop at kill's complaint of no jobs)
trap 'set +e; kill $(jobs -p) 2> /dev/null; wait 2> /dev/null; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP

# The CPU the rest of the machine took between load_mark and load_others
# (into $others), in % of all its CPUs: /proc/stat's user + nice + system
# time less what this script's children (waited for) took.  Both run in
# this shell, never in $(...): a subshell's `times' does not see them.
load_mark() {
  local _c u n s rest
  read -r _c u n s rest < /proc/stat
  times > "$tmp/times"
  echo $((u + n + s)) "$(awk -v hz="$(getconf CLK_TCK)" 'END { gsub(/[ms]/, " "); print int(($1 * 60 + $2 + $3 * 60 + $4) * hz) }' "$tmp/times")" "$(awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t }' /proc/stat)"
}
load_others() {
  local b0 m0 t0 b1 m1 t1
  load_mark > "$tmp/mark1"
  read -r b0 m0 t0 < "$tmp/mark0"
  read -r b1 m1 t1 < "$tmp/mark1"
  others=$(((b1 - b0 - (m1 - m0)) * 100 / (t1 - t0 > 0 ? t1 - t0 : 1)))
  [ $others -ge 0 ] || others=0 # the two clocks' rounding
}

# iperf3 as the wire limit: $IPERF3 if set, else the first iperf3 on
# PATH (none: the *_iperf3_bound lines are left out, and stdout says so).
ip3=${IPERF3:-$(command -v iperf3 || true)}
[ -n "$ip3" ] || echo "pslite.sh: no iperf3: its bounds are skipped"
# wire_gbs TAG BYTES REVERSE SCPU CCPU: the receiver's GB/s of one iperf3
# transfer over 127.0.0.1 (BYTES 0: a steady run, -t 1), client to
# server (REVERSE 1: -R, server to client), a one-off server on CPU SCPU
# and the client on CCPU (-: unpinned); prints nothing when it failed
# (why: on stderr).  Both processes are gone when it returns, each
# bounded by 60 s.
wire_gbs() {
  local tag=$1 bytes=$2 rev=$3 sc=$4 cc=$5 port spid try t
  [ -n "$ip3" ] || return 0
  for try in 1 2 3; do # a port taken between the pick and the bind
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    : > "$tmp/$tag.s"
    timeout -k 5 60 $(pin "$sc") "$ip3" -s -1 -B 127.0.0.1 -p "$port" --forceflush > "$tmp/$tag.s" 2>&1 &
    spid=$!
    for ((t = 0; t < 500; t++)); do # readiness: its own line, 5 s at most
      grep -q "Server listening" "$tmp/$tag.s" && break
      kill -0 $spid 2> /dev/null || break
      sleep 0.01
    done
    if grep -q "Server listening" "$tmp/$tag.s"; then
      timeout -k 5 60 $(pin "$cc") "$ip3" -c 127.0.0.1 -p "$port" $([ "$bytes" -gt 0 ] && echo "-n $bytes" || echo "-t 1") \
        $([ "$rev" = 1 ] && echo -R) -J > "$tmp/$tag.c" 2>&1 || true
      kill $spid 2> /dev/null || true # a client that never connected
      wait $spid 2> /dev/null || true
      python3 -c 'import json, sys
try:
    print("%.3f" % (json.load(open(sys.argv[1]))["end"]["sum_received"]["bits_per_second"] / 8e9))
except Exception as e:
    sys.stderr.write("pslite.sh: iperf3 gave no rate (%s)\n" % e)' "$tmp/$tag.c"
      return 0
    fi
    kill $spid 2> /dev/null; wait $spid 2> /dev/null || true
  done
  echo "pslite.sh: the iperf3 server did not listen: $(tail -1 "$tmp/$tag.s")" >&2
}

# ps-lite: a scheduler, 1 server and 1 worker (@2 @3 @4: the CPUs of
# scheduler, server and worker; - leaves one unpinned), or 2 + 2
# unpinned (@1: one or agg); the worker's stdout to stdout, the servers' to
# $tmp/server.
pin() { [ "$1" = - ] || echo "taskset -c $1"; }
pslite_once() {
  local port n=1 c pids=()
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  [ "$1" = agg ] && n=2
  export DMLC_NUM_SERVER=$n DMLC_NUM_WORKER=$n DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$port
  : > "$tmp/server"
  DMLC_ROLE=scheduler timeout -k 5 "$tmo" $(pin "${2:--}") "$bin" "${pargs[@]}" > /dev/null 2>> "$tmp/pslite.err" &
  pids+=($!)
  for ((c = 0; c < n; c++)); do
    DMLC_ROLE=server timeout -k 5 "$tmo" $(pin "${3:--}") "$bin" "${pargs[@]}" >> "$tmp/server" 2>> "$tmp/pslite.err" &
    pids+=($!)
  done
  for ((c = 0; c < n; c++)); do
    DMLC_ROLE=worker timeout -k 5 "$tmo" $(pin "${4:--}") "$bin" "${pargs[@]}" 2>> "$tmp/pslite.err" &
    pids+=($!)
  done
  # one that fails leaves the others waiting for it: then stop them all
  local rc=0
  for ((c = 0; c < ${#pids[@]}; c++)); do
    wait -n "${pids[@]}" 2> /dev/null || { rc=1; break; }
  done
  [ $rc -eq 0 ] || kill $(jobs -p) 2> /dev/null
  wait
  return $rc
}
pslite_round() { pslite_once one "$c1" "$c1" "$c0"; }
pslite_fail() { echo "pslite.sh: ps-lite failed" >&2; tail -5 "$tmp/pslite.err" >&2; exit 1; }

# ours: bench_ps --only @1 [options]; stdout to $tmp/ours, stderr to
# $tmp/ours.cur (and appended to $tmp/ours.err).  Waited for in the
# background, so that a signal to this script ends it at once.
ours_wait() {
  local rc=0
  wait $! || rc=1
  cat "$tmp/ours.cur" >> "$tmp/ours.err"
  [ $rc -eq 0 ] || { echo "pslite.sh: bench_ps failed" >&2; tail -5 "$tmp/ours.cur" >&2; exit 1; }
}
ours_once() {
  local p=$1
  shift
  PS_SERVER="$build/ps/ps-server" "$build/tests/bench/bench_ps" --only "$p" "$@" > "$tmp/ours" 2> "$tmp/ours.cur" &
  ours_wait
}

num() { sed -n "s/.*$1 \([0-9.]*\).*/\1/p"; }
# the in-run raw TCP baseline of a `bench:' line of ours
base() { sed -n "s/.*$1[a-z_]* [0-9.]* [^ ]* baseline=\([0-9.]*\).*/\1/p"; }
# the iperf3 GB/s of a `bench: NAME_vs_iperf3' line of (a)
ipf() { sed -n "s/.* $1_vs_iperf3 [0-9.]* [a-z]*=[0-9.]* GB\/s iperf3=\([0-9.]*\) .*/\1/p"; }
# two iperf3 pairs at once, unpinned, of @1 bytes each (@2 1: -R): the
# sum of their GB/s, or nothing
wire_two() {
  wire_gbs agg1 "$1" "$2" - - > "$tmp/w1" &
  local p1=$!
  wire_gbs agg2 "$1" "$2" - - > "$tmp/w2" &
  wait $p1 $!
  awk 'NR == FNR { a = $1; next } { if (a > 0 && $1 > 0) printf "%.2f", a + $1 }' "$tmp/w1" "$tmp/w2"
}
for ((r = 1; r <= rounds; r++)); do
  load_mark > "$tmp/mark0"
  if [ -n "$agg" ]; then
    PS_SERVER="$build/ps/ps-server" "$build/tests/bench/bench_agg" --rounds 1 "${ours[@]}" > "$tmp/ours" 2>> "$tmp/ours.err" &
    wait $! || { echo "pslite.sh: bench_agg failed" >&2; tail -5 "$tmp/ours.err" >&2; exit 1; }
    pslite_once agg > "$tmp/theirs" || pslite_fail
    # aggregate GB/s: all bytes of both workers over the longer worker's time
    gb=$(awk -v m="$mib" -v n="${reps:-50}" 'BEGIN { print m * 1048576 * 2 * 2 * n / 1e9 }')
    o_push=$(num "agg_push_${mib}MiB" < "$tmp/ours"); o_pull=$(num "agg_pull_${mib}MiB" < "$tmp/ours")
    t_push=$(num agg_push_s < "$tmp/theirs" | sort -g | tail -1); t_pull=$(num agg_pull_s < "$tmp/theirs" | sort -g | tail -1)
    t_push=$(awk -v g="$gb" -v s="$t_push" 'BEGIN { printf "%.2f", g / s }'); t_pull=$(awk -v g="$gb" -v s="$t_pull" 'BEGIN { printf "%.2f", g / s }')
    b_push=$(base "agg_push_${mib}MiB" < "$tmp/ours"); b_pull=$(base "agg_pull_${mib}MiB" < "$tmp/ours")
    # iperf3: two pairs at once, unpinned, each moving one worker's bytes
    i_push=$(wire_two $((mib * 1048576 * 2 * ${reps:-50})) 0); i_pull=$(wire_two $((mib * 1048576 * 2 * ${reps:-50})) 1)
    load_others
    echo "round $r: aggregate push $o_push vs ps-lite $t_push GB/s (raw TCP $b_push, iperf3 ${i_push:-?}); pull $o_pull vs $t_pull GB/s (raw TCP $b_pull, iperf3 ${i_pull:-?}); others $others% CPU"
    echo "$o_push $t_push $o_pull $t_pull $b_push $b_pull 0 0 0 ${i_push:-0} ${i_pull:-0}" >> "$tmp/rounds"
    continue
  fi
  if [ -n "$scalar" ]; then
    # one CPU: bench_ps (b) as it pins itself; ps-lite all on $c0
    ours_once b "${ours[@]}"
    o1=$(num assign_add_latency < "$tmp/ours"); b1=$(num assign_add_tcp_rtt < "$tmp/ours"); o1p=$(sed -n 's/.*ps assign_add:.* p99 \([0-9.]*\) us.*/\1/p' "$tmp/ours.cur")
    pslite_once one "$c0" "$c0" "$c0" > "$tmp/theirs" || pslite_fail
    t1=$(num median < "$tmp/theirs"); t1p=$(num p99 < "$tmp/theirs")
    line="round $r: one CPU $o1 vs ps-lite $t1 us (p99 $o1p vs $t1p; raw TCP $b1)"
    if [ "$c1" != "$c0" ]; then
      ours_once b --split-b "${ours[@]}"
      o2=$(num assign_add_latency < "$tmp/ours"); b2=$(num assign_add_tcp_rtt < "$tmp/ours"); o2p=$(sed -n 's/.*ps assign_add:.* p99 \([0-9.]*\) us.*/\1/p' "$tmp/ours.cur")
      pslite_round > "$tmp/theirs" || pslite_fail
      t2=$(num median < "$tmp/theirs"); t2p=$(num p99 < "$tmp/theirs")
      line="$line; two CPUs $o2 vs $t2 us (p99 $o2p vs $t2p; raw TCP $b2)"
    else
      o2=1 t2=1 o2p=1 t2p=1 b2=1
    fi
    load_others
    echo "$line; others $others% CPU"
    echo "$o1 $t1 $o1p $t1p $o2 $t2 $o2p $t2p ${b1:-0} ${b2:-0}" >> "$tmp/rounds"
    continue
  fi
  ours_once $part "${ours[@]}"
  if [ -n "$bulk" ]; then
    # ours' ps then holds what (a) left (its ps_peak_rss line: baseline=
    # the held MiB): bulk, and on a bench_ps with a second size of (a)
    # that size too, 8 of its transfers after each bulk one (its
    # SMALL_PER_REP); ps-lite's server gets the same keys and transfers.
    o_rss=$(num ps_peak_rss < "$tmp/ours"); held=$(base ps_peak_rss < "$tmp/ours")
    small=$(awk -v h="${held:-0}" -v b="$bulk" 'BEGIN { s = h - b; print (s > 0 ? int(s * 1048576 + 0.5) : 0) }')
    pargs=($((bulk << 20)) ${reps:-11})
    [ "$small" -gt 0 ] && pargs+=($small 8)
    pslite_round > "$tmp/theirs" || pslite_fail
    # push = assign, pull = read; GB/s, larger is better: ratio ours / theirs
    o_push=$(num "assign_${bulk}MiB" < "$tmp/ours"); o_pull=$(num "read_${bulk}MiB" < "$tmp/ours")
    t_push=$(num dense_push < "$tmp/theirs"); t_pull=$(num dense_pull < "$tmp/theirs")
    b_push=$(base "assign_${bulk}MiB" < "$tmp/ours"); b_pull=$(base "read_${bulk}MiB" < "$tmp/ours")
    # iperf3 of the same bytes, placed as the ps and the client, in (a)
    i_push=$(ipf "assign_${bulk}MiB" < "$tmp/ours"); i_pull=$(ipf "read_${bulk}MiB" < "$tmp/ours")
    t_rss=$(num server_peak_rss < "$tmp/server")
    load_others
    echo "round $r: push $o_push vs ps-lite $t_push GB/s (raw TCP $b_push, iperf3 ${i_push:-?}); pull $o_pull vs $t_pull GB/s (raw TCP $b_pull, iperf3 ${i_pull:-?}); server peak RSS ${o_rss:-?} vs ${t_rss:-?} MiB holding ${held:-?} MiB; others $others% CPU"
    echo "$o_push $t_push $o_pull $t_pull $b_push $b_pull ${o_rss:-0} ${t_rss:-0} ${held:-0} ${i_push:-0} ${i_pull:-0}" >> "$tmp/rounds"
    continue
  fi
  pslite_round > "$tmp/theirs" || pslite_fail
  o_step=$(grep 'sparse_step' "$tmp/ours" | grep -v _bf16 | num 'sparse_step[a-z_]*')
  o_pull=$(grep 'sparse_pull_rows' "$tmp/ours" | num 'sparse_pull_rows[a-z_]*')
  o_push=$(grep 'sparse_push_rows' "$tmp/ours" | grep -v _bf16 | num 'sparse_push_rows[a-z_]*')
  # the bfloat16 push of the same run (scatter-add only: else 0)
  h_step=$(num sparse_step_bf16 < "$tmp/ours"); h_push=$(num sparse_push_rows_bf16 < "$tmp/ours")
  t_step=$(num sparse_step < "$tmp/theirs"); t_pull=$(num pull_rows < "$tmp/theirs"); t_push=$(num push_rows < "$tmp/theirs")
  b_step=$(base sparse_step < "$tmp/ours"); b_pull=$(base sparse_pull_rows < "$tmp/ours"); b_push=$(base sparse_push_rows < "$tmp/ours")
  # iperf3's steady rate each way, placed as the ps and the client, as
  # the time to move a step's bytes: the distinct ids of the first batch
  # (bench_ps's stderr), each an 8-byte id and a row up on the push, an
  # id up and a row down on the pull
  uniq=$(sed -n 's/.* \([0-9]*\) unique in the first.*/\1/p' "$tmp/ours.cur" | head -1)
  w_up=$(wire_gbs sparse 0 0 "$c1" "$c0"); w_down=$(wire_gbs sparse 0 1 "$c1" "$c0")
  i_step= i_pull= i_push=
  if [ -n "$w_up" ] && [ -n "$w_down" ] && [ -n "$uniq" ]; then
    read -r i_step i_pull i_push <<< "$(awk -v u="$uniq" -v d="$dim" -v b="$batch" -v up="$w_up" -v dn="$w_down" 'BEGIN {
      if (u <= 0 || up <= 0 || dn <= 0) { print "0 0 0"; exit }
      push = u * (8 + 4 * d) / (up * 1e9); pull = u * 8 / (up * 1e9) + u * 4 * d / (dn * 1e9)
      printf "%.3f %.2f %.2f", (push + pull) * 1e3, b / pull / 1e6, b / push / 1e6 }')"
  fi
  load_others
  bf=; [ -n "$h_push" ] && bf="; bfloat16 push $h_push M rows/s, step $h_step ms"
  echo "round $r: step $o_step ms vs ps-lite $t_step ms (raw TCP $b_step, iperf3 ${i_step:-?}); pull $o_pull vs $t_pull M rows/s (raw TCP $b_pull, iperf3 ${i_pull:-?}); push $o_push vs $t_push M rows/s (raw TCP $b_push, iperf3 ${i_push:-?})$bf; others $others% CPU"
  echo "$o_step $t_step $o_pull $t_pull $o_push $t_push $b_step $b_pull $b_push ${h_step:-0} ${h_push:-0} ${i_step:-0} ${i_pull:-0} ${i_push:-0}" >> "$tmp/rounds"
done
# awk: the median of a[1..n], sorting a in place (a[1], a[n] are the range)
med='function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }; return a[int((n + 1) / 2)] }'
if [ -n "$scalar" ]; then
  awk -v two="$([ "$c1" != "$c0" ] && echo 1)" "$med"'
function row(what, where, o, t, n, target, who,   i, q, mq, mo, mt) {
  for (i = 1; i <= n; i++) if (o[i] <= 0 || t[i] <= 0) return # a figure missing
  for (i = 1; i <= n; i++) q[i] = o[i] / t[i]
  mq = med(q, n); mo = med(o, n); mt = med(t, n)
  printf "bench: pslite_scalar_%s %.2f range=%.2f-%.2f placement=%s %s=%.1f us ps-lite=%.1f us%s\n", what, mq, q[1], q[n], where, who, mo, mt, target
}
{ n++; a[n] = $1; b[n] = $2; c[n] = $3; d[n] = $4; e[n] = $5; f[n] = $6; g[n] = $7; h[n] = $8; k[n] = $9; l[n] = $10 }
END {
  row("us_ratio", "one-cpu", a, b, n, " target=<= 0.9", "ours"); row("p99_us_ratio", "one-cpu", c, d, n, "", "ours")
  row("us_tcp_bound", "one-cpu", k, b, n, " (raw TCP / ps-lite)", "tcp")
  if (two) {
    row("us_ratio", "two-cpus", e, f, n, " target=<= 0.9", "ours"); row("p99_us_ratio", "two-cpus", g, h, n, "", "ours")
    row("us_tcp_bound", "two-cpus", l, f, n, " (raw TCP / ps-lite)", "tcp")
  }
}' "$tmp/rounds"
  exit 0
fi
if [ -n "$bulk" ] || [ -n "$agg" ]; then
  what=dense_${bulk}MiB; [ -n "$agg" ] && what=agg_${mib}MiB
  awk -v what="$what" -v rss="$bulk" "$med"'
{ n++; q[n] = $1 / $2; p[n] = $3 / $4; bq[n] = $5 / $2; bp[n] = $6 / $4
  if ($7 > 0 && $8 > 0) { m++; s[m] = $7 / $8; so[m] = $7; st[m] = $8; held = $9 }
  if ($10 > 0 && $11 > 0) { k++; iq[k] = $10 / $2; ip[k] = $11 / $4 } }
END {
  mq = med(q, n); mp = med(p, n); mbq = med(bq, n); mbp = med(bp, n)
  printf "bench: pslite_%s_push_ratio %.2f range=%.2f-%.2f target=>= 1.2\n", what, mq, q[1], q[n]
  printf "bench: pslite_%s_pull_ratio %.2f range=%.2f-%.2f target=>= 1.2\n", what, mp, p[1], p[n]
  printf "bench: pslite_%s_push_tcp_bound %.2f range=%.2f-%.2f (raw TCP / ps-lite)\n", what, mbq, bq[1], bq[n]
  printf "bench: pslite_%s_pull_tcp_bound %.2f range=%.2f-%.2f (raw TCP / ps-lite)\n", what, mbp, bp[1], bp[n]
  if (k == n) {
    miq = med(iq, k); mip = med(ip, k)
    printf "bench: pslite_%s_push_iperf3_bound %.2f range=%.2f-%.2f (iperf3 / ps-lite)\n", what, miq, iq[1], iq[k]
    printf "bench: pslite_%s_pull_iperf3_bound %.2f range=%.2f-%.2f (iperf3 / ps-lite)\n", what, mip, ip[1], ip[k]
  }
  if (rss != "" && m > 0) {
    ms = med(s, m); mo = med(so, m); mt = med(st, m)
    printf "bench: pslite_peak_rss_ratio %.2f range=%.2f-%.2f ours=%.1f MiB ps-lite=%.1f MiB held=%.1f MiB target=<= 1.1\n", ms, s[1], s[m], mo, mt, held
  }
}' "$tmp/rounds"
  exit 0
fi
sfx=; [ "$op" = adagrad ] && sfx=_adagrad
awk -v sfx="$sfx" "$med"'
{ n++; s[n] = $1 / $2; p[n] = $3 / $4; q[n] = $5 / $6; bs[n] = $7 / $2; bp[n] = $8 / $4; bq[n] = $9 / $6
  if ($10 > 0 && $11 > 0) { m++; hs[m] = $10 / $2; hq[m] = $11 / $6 }
  if ($12 > 0 && $13 > 0 && $14 > 0) { k++; is[k] = $12 / $2; ip[k] = $13 / $4; iq[k] = $14 / $6 } }
END {
  ms = med(s, n); mp = med(p, n); mq = med(q, n); mbs = med(bs, n); mbp = med(bp, n); mbq = med(bq, n)
  printf "bench: pslite_sparse_step%s_ratio %.2f range=%.2f-%.2f target=<= 0.6\n", sfx, ms, s[1], s[n]
  printf "bench: pslite_sparse_pull_rows%s_ratio %.2f range=%.2f-%.2f target=>= 1.5\n", sfx, mp, p[1], p[n]
  printf "bench: pslite_sparse_push_rows%s_ratio %.2f range=%.2f-%.2f target=>= 1.5\n", sfx, mq, q[1], q[n]
  printf "bench: pslite_sparse_step%s_tcp_bound %.2f range=%.2f-%.2f (raw TCP / ps-lite)\n", sfx, mbs, bs[1], bs[n]
  printf "bench: pslite_sparse_pull_rows%s_tcp_bound %.2f range=%.2f-%.2f (raw TCP / ps-lite)\n", sfx, mbp, bp[1], bp[n]
  printf "bench: pslite_sparse_push_rows%s_tcp_bound %.2f range=%.2f-%.2f (raw TCP / ps-lite)\n", sfx, mbq, bq[1], bq[n]
  if (k == n) {
    mis = med(is, k); mip = med(ip, k); miq = med(iq, k)
    printf "bench: pslite_sparse_step%s_iperf3_bound %.2f range=%.2f-%.2f (iperf3 / ps-lite)\n", sfx, mis, is[1], is[k]
    printf "bench: pslite_sparse_pull_rows%s_iperf3_bound %.2f range=%.2f-%.2f (iperf3 / ps-lite)\n", sfx, mip, ip[1], ip[k]
    printf "bench: pslite_sparse_push_rows%s_iperf3_bound %.2f range=%.2f-%.2f (iperf3 / ps-lite)\n", sfx, miq, iq[1], iq[k]
  }
  if (m > 0) { # ours pushing bfloat16 against ps-lite pushing float32
    mhs = med(hs, m); mhq = med(hq, m)
    printf "bench: pslite_sparse_step_bf16_ratio %.2f range=%.2f-%.2f target=<= 0.6\n", mhs, hs[1], hs[m]
    printf "bench: pslite_sparse_push_rows_bf16_ratio %.2f range=%.2f-%.2f target=>= 1.5\n", mhq, hq[1], hq[m]
  }
}' "$tmp/rounds"
