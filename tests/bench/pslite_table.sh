#!/usr/bin/env bash
# bench_table (an embedding table of 10M rows, Zipf batches, lookup +
# Adagrad) against the same workload on dmlc/ps-lite's own KV server
# (pslite_table.cc), in interleaved rounds (opt-in: tests/bench/run.sh
# pslite-table).
#   PSLITE_DIR=DIR tests/bench/pslite_table.sh BUILD [ROUNDS] [--rows N]
#     [--dim N] [--batch N] [--zipf S] [--steps N]
# PSLITE_DIR is a built ps-lite (tests/bench/README.md): only run and
# linked, never copied.  ps-lite runs a scheduler, one server and one
# worker on this machine, unpinned as ours (one ps-server, one client).
# stdout: each round's figures, then `bench:' lines with the median of the
# rounds' ratios (this project / ps-lite) and their range; targets: lookup
# and update rows/s at least 2x ps-lite's.  Every process started here is
# stopped when the script ends, in every outcome.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:?usage: pslite_table.sh BUILD [ROUNDS] [options]}
rounds=${2:-3}
shift $(($# >= 2 ? 2 : 1))
pl=${PSLITE_DIR:?set PSLITE_DIR to a built dmlc/ps-lite (see tests/bench/README.md)}
[ -f "$pl/build/libps.a" ] || { echo "pslite_table.sh: $pl/build/libps.a missing" >&2; exit 2; }
tmo=${PSLITE_TIMEOUT:-900}
rows=10000000 dim=16 batch=8192 zipf=1.1 steps=200
while [ $# -gt 0 ]; do
  case "$1" in
    --rows) rows=$2 ;; --dim) dim=$2 ;; --batch) batch=$2 ;; --zipf) zipf=$2 ;;
    --steps) steps=$2 ;;
    *) echo "pslite_table.sh: unknown option $1" >&2; exit 2 ;;
  esac
  shift 2
done
bin="$build/tests/bench/pslite_table"
g++ -std=c++14 -O3 -fno-math-errno -isystem "$pl/include" -I"$here" "$here/pslite_table.cc" \
  "$pl/build/libps.a" -lprotobuf-lite -lzmq -pthread -o "$bin"
tmp=$(mktemp -d)
trap 'set +e; kill $(jobs -p) 2> /dev/null; wait 2> /dev/null; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM HUP

pslite_once() {
  local port pids=() rc=0 c
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  export DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$port
  args=($rows $dim $batch $zipf $steps)
  DMLC_ROLE=scheduler timeout -k 5 "$tmo" "$bin" "${args[@]}" > /dev/null 2>> "$tmp/pslite.err" &
  pids+=($!)
  DMLC_ROLE=server timeout -k 5 "$tmo" "$bin" "${args[@]}" > "$tmp/server" 2>> "$tmp/pslite.err" &
  pids+=($!)
  DMLC_ROLE=worker timeout -k 5 "$tmo" "$bin" "${args[@]}" > "$tmp/worker" 2>> "$tmp/pslite.err" &
  pids+=($!)
  for ((c = 0; c < ${#pids[@]}; c++)); do
    wait -n "${pids[@]}" 2> /dev/null || { rc=1; break; }
  done
  [ $rc -eq 0 ] || kill $(jobs -p) 2> /dev/null
  wait
  return $rc
}

field() { sed -n "s/.*$2 \([0-9.]*\).*/\1/p" "$1" | head -1; }
: > "$tmp/ratios"
for ((r = 1; r <= rounds; r++)); do
  PS_SERVER=$build/ps/ps-server "$build/tests/bench/bench_table" --rows "$rows" --dim "$dim" \
    --batch "$batch" --zipf "$zipf" --steps "$steps" --rounds 1 --policy 0 --pause 0 \
    > "$tmp/ours" 2> "$tmp/ours.err" || { echo "pslite_table.sh: bench_table failed" >&2; tail -5 "$tmp/ours.err" >&2; exit 1; }
  pslite_once || { echo "pslite_table.sh: ps-lite failed" >&2; tail -5 "$tmp/pslite.err" >&2; exit 1; }
  ol=$(field "$tmp/ours" table_lookup_rows_per_s); ou=$(field "$tmp/ours" table_update_rows_per_s)
  orss=$(field "$tmp/ours" table_rss_bytes_per_row)
  pl_=$(field "$tmp/worker" lookup_rows); pu=$(field "$tmp/worker" update_rows)
  prss=$(field "$tmp/server" peak_rss_mib)
  echo "round $r: lookup ours $ol rows/s, ps-lite ${pl_}M; update ours $ou, ps-lite ${pu}M;" \
    "rss per row ours $orss B, ps-lite $(awk -v m="$prss" -v n="$rows" 'BEGIN { printf "%.1f", m * 1048576 / n }') B"
  awk -v ol="$ol" -v ou="$ou" -v pl="$pl_" -v pu="$pu" -v orss="$orss" -v prss="$prss" -v n="$rows" \
    'BEGIN { printf "%.3f %.3f %.3f\n", ol / (pl * 1e6), ou / (pu * 1e6), orss / (prss * 1048576 / n) }' >> "$tmp/ratios"
done
for k in 1 2 3; do
  name=$( [ $k = 1 ] && echo table_lookup_rows || { [ $k = 2 ] && echo table_update_rows || echo table_rss_per_row; } )
  tgt=$( [ $k = 3 ] && echo "(lower is better)" || echo "target=>= 2.0" )
  sort -n -k$k "$tmp/ratios" | awk -v k=$k -v name="$name" -v tgt="$tgt" '
    { v[NR] = $k } END { printf "bench: %s_vs_pslite %.2f [%.2f-%.2f] %s\n", name, v[int((NR + 1) / 2)], v[1], v[NR], tgt }'
done
