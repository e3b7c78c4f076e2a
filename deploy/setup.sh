#!/usr/bin/env bash
# One-command set-up for a fresh Debian 12 machine (run as root):
#
#   bash deploy/setup.sh demo   install what is missing, build, run the main job
#   bash deploy/setup.sh test   install what is missing, build, run every test
#                               (plain build, then under ASan + UBSan, then
#                               the concurrency tests under TSan; last a
#                               release build, -O3, as the image builds)
#   bash deploy/setup.sh tsan   only the concurrency tests under ThreadSanitizer
#   bash deploy/setup.sh fuzz [SECONDS]
#                               libFuzzer build (clang) of tests/fuzz; runs each
#                               RPC target for SECONDS (default 600)
#   bash deploy/setup.sh chaos [ROUNDS]
#                               build, then the correctness checker
#                               (tests/chaos/chaos.sh) for ROUNDS fault
#                               rounds (default 20) on 3 ps --replicas 2
#   bash deploy/setup.sh build  install and build only
#   bash deploy/setup.sh image  the container image (deploy/k8s/Dockerfile)
#                               built from the tree with buildah, no registry
#                               and no daemon, and run (tests/image): --help
#                               of every program and a short job in it as its
#                               unprivileged user.  Installs buildah, podman
#                               and mmdebstrap; the first run makes the
#                               debian:12-slim base with mmdebstrap (cached in
#                               ~/.cache/paramserver/debian-12-slim.tar); the
#                               image stays as localhost/paramserver:0.1
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-demo}

# image: needs none of the build packages (the image builds the tree itself)
if [ "$mode" = image ]; then
  im_missing=()
  for p in buildah podman mmdebstrap; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || im_missing+=("$p")
  done
  if ((${#im_missing[@]})); then
    echo "setup: installing ${im_missing[*]}" >&2
    sudo_cmd=()
    [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
    "${sudo_cmd[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
      "${im_missing[@]}" >/dev/null
  fi
  echo "== the image, built from the tree and run (tests/image/test_image.sh)"
  PS_IMAGE_BOOTSTRAP=1 PS_IMAGE_KEEP=localhost/paramserver:0.1 bash tests/image/test_image.sh
  exit
fi

# build-essential brings gcc and g++ (tests/install builds a C++ program)
packages=(build-essential meson ninja-build pkg-config
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler libuv1-dev check
  libjson-c-dev libsnappy-dev zlib1g-dev libopenblas-dev iperf3 clang-format
  dataset-fashion-mnist python3-grpcio libmicrohttpd-dev
  prometheus curl slurm-wlm munge
  etcd-server etcd-client iproute2 iptables)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# node and npm (offline Kubernetes schema checks, tests/k8s): Debian's
# packages unless the commands are there already (e.g. from NodeSource,
# whose nodejs carries npm and conflicts with Debian's npm package)
command -v node > /dev/null || missing+=(nodejs)
command -v npm > /dev/null || missing+=(npm)
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}" >&2
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

jobs=$(nproc 2>/dev/null || echo 2)
# The concurrency tests run under ThreadSanitizer: they use ps_store and the
# tensor buffers from many threads without gRPC (gRPC is not built with
# TSan, so tests through it would only report its uninstrumented
# synchronisation).  No suppressions are needed for them; if one ever is,
# it must name uninstrumented third-party code only (tests/unit/tsan.supp).
tsan_tests=(unit_store_threads unit_store unit_tensor unit_embed)
tsan() {
  if [ ! -f build-tsan/build.ninja ]; then
    meson setup build-tsan -Db_sanitize=thread -Db_lundef=false >/dev/null
  fi
  ninja -C build-tsan -j "$jobs" tests/unit/test_store_threads tests/unit/test_store \
    tests/unit/test_tensor tests/unit/test_embed >/dev/null
  echo "== concurrency tests under ThreadSanitizer (build-tsan/)"
  TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/unit/tsan.supp" \
    meson test -C build-tsan --no-rebuild --print-errorlogs --num-processes "$jobs" "${tsan_tests[@]}"
}
build() { # dir, meson options... (quiet; a failure shows its output)
  local dir=$1 log; shift
  log=$(mktemp)
  if { [ ! -f "$dir/build.ninja" ] && ! meson setup "$dir" "$@" > "$log" 2>&1; } ||
    ! ninja -C "$dir" -j "$jobs" > "$log" 2>&1; then
    echo "setup.sh: the build in $dir failed:" >&2
    tail -n 60 "$log" >&2
    rm -f "$log"
    return 1
  fi
  rm -f "$log"
}

case "$mode" in
  build)
    build build
    ;;
  demo)
    build build
    deploy/demo.sh build
    ;;
  test)
    build build
    echo "== tests (build/)"
    meson test -C build --print-errorlogs --num-processes "$jobs"
    build build-asan -Db_sanitize=address,undefined -Db_lundef=false
    echo "== tests under AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/)"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      meson test -C build-asan --print-errorlogs --num-processes "$jobs"
    tsan
    # gcc warns at -O3 where -O2 does not (-Werror): the image is a release
    # build, so the tree must build as one
    echo "== a release build (build-release/)"
    build build-release --buildtype=release
    ;;
  tsan)
    tsan
    ;;
  chaos)
    rounds=${2:-20}
    [[ "$rounds" =~ ^[0-9]+$ ]] || { echo "usage: bash deploy/setup.sh chaos [ROUNDS]" >&2; exit 2; }
    build build
    PS_SERVER=build/ps/ps-server PSCTL=build/worker/psctl \
      CHAOS_CLIENT=build/tests/chaos/chaos_client bash tests/chaos/chaos.sh --rounds "$rounds"
    ;;
  fuzz)
    secs=${2:-600}
    fz_missing=()
    for p in clang libclang-rt-14-dev; do
      dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || fz_missing+=("$p")
    done
    if ((${#fz_missing[@]})); then
      echo "setup: installing ${fz_missing[*]}" >&2
      sudo_cmd=()
      [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
      "${sudo_cmd[@]}" apt-get update -qq
      DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
        "${fz_missing[@]}" >/dev/null
    fi
    if [ ! -f build-fuzz/build.ninja ]; then
      CC=clang meson setup build-fuzz -Dfuzzing=true -Db_sanitize=address,undefined \
        -Db_lundef=false -Dc_args=-fsanitize=fuzzer-no-link >/dev/null
    fi
    ninja -C build-fuzz -j "$jobs" >/dev/null
    for exe in build-fuzz/tests/fuzz/fuzz_rpc_*; do # one per method (tests/fuzz/meson.build)
      [ -f "$exe" ] && [ -x "$exe" ] || continue
      m=${exe##*/fuzz_rpc_}
      mkdir -p "build-fuzz/corpus/$m" "build-fuzz/crashes/$m"
      echo "== fuzz_rpc_$m for $secs s (new inputs: build-fuzz/corpus/$m)"
      seeds=(tests/fuzz/corpus_rpc/_generic)
      [ -d "tests/fuzz/corpus_rpc/$m" ] && seeds=("tests/fuzz/corpus_rpc/$m" "${seeds[@]}")
      # -fork=1 with -ignore_*: a crash is saved and the run goes on
      PS_FUZZ_STRICT=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        "build-fuzz/tests/fuzz/fuzz_rpc_$m" -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 \
        -fork=1 -ignore_crashes=1 -ignore_ooms=1 -ignore_timeouts=1 \
        -artifact_prefix="build-fuzz/crashes/$m/" -print_final_stats=1 \
        "build-fuzz/corpus/$m" "${seeds[@]}" 2>&1 | grep -v ' INFO \| WARN ' | tail -25 || true
    done
    if compgen -G "build-fuzz/crashes/*/*" >/dev/null; then
      echo "setup: inputs that failed are in build-fuzz/crashes/ (reproduce: the target with the file)" >&2
      exit 1
    fi
    ;;
  *)
    echo "usage: bash deploy/setup.sh [demo|test|tsan|fuzz [SECONDS]|chaos [ROUNDS]|build|image]" >&2
    exit 2
    ;;
esac
