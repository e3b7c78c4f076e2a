#!/bin/sh
# One-command benchmark run in a release build:
#   tests/bench/run.sh [bench_ps options]     (e.g. --reps 15 --iters 20000)
# Configures build-release (meson setup build-release -Dbuildtype=release)
# if it is missing, builds only what the bench needs, and runs it.
# Results: `bench:' lines on stdout; detail on stderr.
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
if [ ! -f build-release/build.ninja ]; then
  meson setup build-release -Dbuildtype=release >&2
fi
ninja -C build-release tests/bench/bench_ps tests/bench/bench_train ps/ps-server >&2
PS_SERVER="$root/build-release/ps/ps-server"
export PS_SERVER
"$root/build-release/tests/bench/bench_ps" "$@"
exec "$root/build-release/tests/bench/bench_train"
