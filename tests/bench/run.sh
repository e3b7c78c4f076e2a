#!/bin/sh
# One-command benchmark run in a release build:
#   tests/bench/run.sh [bench_ps options]     (e.g. --reps 15 --iters 20000)
#   tests/bench/run.sh ckpt [bench_ckpt options]   (only the checkpoint bench)
#   tests/bench/run.sh agg [bench_agg options]     (only 2 ps + 2 workers;
#                                 --clients 4: only 1 ps serving 4 workers)
#   tests/bench/run.sh jobs [STEPS] [REPS]         (only the training-job bench)
#   tests/bench/run.sh failover [KILLS]  (only failover and rejoin, R=2 on etcd)
#   tests/bench/run.sh repl [bench_repl options]  (only R=2 against R=1)
#   tests/bench/run.sh table [bench_table options] (only the embedding table)
#   tests/bench/run.sh ctr [EXAMPLES] [STEPS]  (only the CTR job at full size)
#   PSLITE_DIR=DIR tests/bench/run.sh pslite-table [ROUNDS] [options]
#                                 (the embedding table against ps-lite's KV
#                                 server, interleaved rounds)
#   PSLITE_DIR=DIR tests/bench/run.sh pslite [ROUNDS] [options]
#                                (against dmlc/ps-lite: the sparse workload;
#                                 --bulk-mib N dense; --agg 2 ps + 2 workers)
#   sudo tests/bench/run.sh shaped [RATE ...] [-- bench_wire options]
#                                (root: bfloat16 against float32 pushes to a
#                                 ps behind a tbf-shaped veth; RATE as tc
#                                 takes it or none, default none 10gbit 25gbit)
# Configures build-release (meson setup build-release -Dbuildtype=release)
# if it is missing, builds only what the benches need, and runs bench_ps
# (its part (a) also against iperf3 when it is installed), bench_agg
# (2 ps + 2 workers, then 1 ps serving 4 workers against 1 alone),
# bench_train, bench_repl (R=2 against R=1 on a local etcd),
# bench_table (10M rows, with saves of 1.6 GB), bench_embed_threads (one
# table, 1 thread against 2), bench_ckpt (about 1 GiB
# written and read 4 times per repetition, in $TMPDIR or /tmp),
# bench_jobs.sh (ps-worker on 2 ps + 2 workers against one process),
# bench_ctr.sh (the CTR job on 1M examples) and failover.sh (kill -9 of a primary
# and rejoin of a 256 MiB shard, R=2 on a local etcd).  BENCH_BUILD=DIR uses another build
# directory (configured the same way if missing).
# Results: `bench:' lines on stdout; detail on stderr.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
build=${BENCH_BUILD:-build-release}
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" -Dbuildtype=release >&2
fi
if [ "${1:-}" = shaped ]; then
  shift
  if [ "$(id -u)" != 0 ]; then
    echo "run.sh shaped: needs root (network namespaces, tc): sudo tests/bench/run.sh shaped" >&2
    exit 2
  fi
  ninja -C "$build" tests/bench/bench_wire ps/ps-server >&2
  PS_SERVER="$root/$build/ps/ps-server" exec bash "$root/tests/bench/shaped.sh" "$root/$build" "$@"
fi
ninja -C "$build" tests/bench/bench_ps tests/bench/bench_agg tests/bench/bench_train tests/bench/bench_ckpt tests/bench/bench_repl tests/bench/bench_table tests/bench/bench_embed_threads \
  ps/ps-server worker/ps-worker deploy/ps-launch tests/chaos/chaos_client worker/psctl >&2
PS_SERVER="$root/$build/ps/ps-server"
export PS_SERVER
if [ "${1:-}" = jobs ]; then
  shift
  exec bash "$root/tests/bench/bench_jobs.sh" "$root/$build" "$@"
fi
if [ "${1:-}" = ctr ]; then
  shift
  exec bash "$root/tests/bench/bench_ctr.sh" "$root/$build" "$@"
fi
if [ "${1:-}" = failover ]; then
  shift
  exec bash "$root/tests/bench/failover.sh" "$root/$build" "$@"
fi
if [ "${1:-}" = pslite ]; then
  shift
  exec bash "$root/tests/bench/pslite.sh" "$root/$build" "$@"
fi
if [ "${1:-}" = pslite-table ]; then
  shift
  exec bash "$root/tests/bench/pslite_table.sh" "$root/$build" "$@"
fi
if [ "${1:-}" = table ]; then
  shift
  exec "$root/$build/tests/bench/bench_table" "$@"
fi
if [ "${1:-}" = repl ]; then
  shift
  exec "$root/$build/tests/bench/bench_repl" "$@"
fi
if [ "${1:-}" = ckpt ]; then
  shift
  exec "$root/$build/tests/bench/bench_ckpt" "$@"
fi
if [ "${1:-}" = agg ]; then
  shift
  exec "$root/$build/tests/bench/bench_agg" "$@"
fi
"$root/$build/tests/bench/bench_ps" "$@"
"$root/$build/tests/bench/bench_agg"
"$root/$build/tests/bench/bench_agg" --clients 4
"$root/$build/tests/bench/bench_train"
"$root/$build/tests/bench/bench_repl"
"$root/$build/tests/bench/bench_table"
"$root/$build/tests/bench/bench_embed_threads"
"$root/$build/tests/bench/bench_ckpt"
bash "$root/tests/bench/bench_jobs.sh" "$root/$build"
bash "$root/tests/bench/bench_ctr.sh" "$root/$build"
exec bash "$root/tests/bench/failover.sh" "$root/$build"
