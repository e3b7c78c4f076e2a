#!/usr/bin/env bash
# The image (deploy/k8s/Dockerfile) built from the tree and run, with
# buildah and no registry and no container daemon:
#  - the base debian:12-slim is docker.io/library/debian:12-slim in
#    buildah's storage if it is there already; else the root file system
#    tarball $PS_IMAGE_BASE_TAR (default ~/.cache/paramserver/
#    debian-12-slim.tar), imported; else, with PS_IMAGE_BOOTSTRAP=1, that
#    tarball is made first (mmdebstrap --variant=minbase bookworm, from the
#    Debian mirror; a few minutes).  Without any of them the test is
#    skipped (exit 77), saying how to get one: bash deploy/setup.sh image.
#  - the tree (git's files, or the tree without build*/ and .git) is built
#    with buildah bud --isolation chroot --network host --layers (the
#    package layers are cached: a rebuild compiles the tree only);
#  - in the image, as its own user (no --user: what a pod runs as), with
#    buildah run --isolation chroot: the user is uid and gid 10001, as every
#    manifest's runAsUser, runAsGroup and fsGroup say; ps-server, psctl,
#    ps-worker and ps-launch --help; and a short job (ps-launch: 1 ps, 1
#    worker, 50 steps) that writes its checkpoint to /ckpt (the volume the
#    manifests mount there) as that user.
# PS_IMAGE_TEST=0 skips it.  The image is tagged localhost/paramserver:test-PID
# and that tag removed at the end (PS_IMAGE_KEEP=NAME tags it NAME too,
# which stays); its layers stay cached (buildah rmi --prune removes them).
# Prints the build time, the image size and the job's last lines.
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
root=${PS_SOURCE_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
skip() {
  echo "SKIP: $*"
  exit 77
}
[ "${PS_IMAGE_TEST:-1}" != 0 ] || skip "PS_IMAGE_TEST=0"
command -v buildah > /dev/null || skip "no buildah (apt-get install buildah; bash deploy/setup.sh image)"
test_init image
base=docker.io/library/debian:12-slim
tag=localhost/paramserver:test-$$ # its own: runs at once do not meet
base_tar=${PS_IMAGE_BASE_TAR:-${XDG_CACHE_HOME:-$HOME/.cache}/paramserver/debian-12-slim.tar}
ctr=""
# Every process of the test in the image: its buildah run leads a session
# of its own ($dir/run.sid while it runs), and each process inside has
# PS_IMAGE_RUN=$dir in its environment (ps-launch's tasks run in sessions
# of their own): at exit each is killed by its pid.
test_cleanup_hook() {
  local e p sid
  trap '' TERM INT # a signal now would cut the clean-up short
  sid=$(cat "$dir/run.sid" 2> /dev/null)
  [ -n "$sid" ] && kill -KILL -- "-$sid" 2> /dev/null
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}
    p=${p%/environ}
    tr '\0' '\n' 2> /dev/null < "$e" | grep -xF "PS_IMAGE_RUN=$dir" > /dev/null && kill -KILL "$p" 2> /dev/null
  done
  [ -n "$ctr" ] && buildah rm "$ctr" > /dev/null 2>&1
  buildah rmi "$tag" > /dev/null 2>&1
}

# the base image
if ! buildah inspect --type image "$base" > /dev/null 2>&1; then
  if [ ! -s "$base_tar" ]; then
    [ "${PS_IMAGE_BOOTSTRAP:-0}" = 1 ] \
      || skip "no $base and no $base_tar (bash deploy/setup.sh image makes it; or PS_IMAGE_BOOTSTRAP=1)"
    command -v mmdebstrap > /dev/null || skip "PS_IMAGE_BOOTSTRAP=1 needs mmdebstrap (apt-get install mmdebstrap)"
    mkdir -p "$(dirname "$base_tar")"
    echo "image: making $base_tar (mmdebstrap --variant=minbase bookworm)"
    if ! mmdebstrap --variant=minbase --format=tar bookworm "$base_tar.part" > "$dir/mmdebstrap.log" 2>&1; then
      rm -rf "$base_tar.part"
      bad "image: mmdebstrap --variant=minbase bookworm" "$(tail -20 "$dir/mmdebstrap.log")"
      finish
    fi
    mv "$base_tar.part" "$base_tar"
  fi
  # podman import, or (no podman) buildah: a scratch container with the
  # tarball unpacked, committed
  if command -v podman > /dev/null; then
    podman import "$base_tar" "$base" > "$dir/import.log" 2>&1
  else
    c=$(buildah from scratch) && buildah add "$c" "$base_tar" / > "$dir/import.log" 2>&1 \
      && buildah commit --rm "$c" "$base" >> "$dir/import.log" 2>&1
  fi
  rc=$?
  check "image: $base imported from $base_tar" test "$rc" = 0
  [ "$rc" = 0 ] || { cat "$dir/import.log"; finish; }
fi

# the build context: the tree's files as git sees them (tracked and new,
# not ignored), else the tree without build directories and .git
mkdir -p "$dir/ctx"
if git -C "$root" rev-parse --show-toplevel > /dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
    | xargs -0 cp -P --parents -t "$dir/ctx")
else
  tar -C "$root" --exclude='./build*' --exclude=./.git -cf - . | tar -C "$dir/ctx" -xf -
fi
check "image: the build context holds the Dockerfile and no build directory" \
  test -f "$dir/ctx/deploy/k8s/Dockerfile" -a ! -e "$dir/ctx/build/build.ninja"

t0=$(date +%s)
buildah bud --isolation chroot --network host --layers --pull=false -f deploy/k8s/Dockerfile \
  -t "$tag" "$dir/ctx" > "$dir/build.log" 2>&1
rc=$?
secs=$(($(date +%s) - t0))
if [ "$rc" != 0 ]; then
  bad "image: buildah bud -f deploy/k8s/Dockerfile (exit $rc after $secs s)" "$(tail -30 "$dir/build.log")"
  finish
fi
size=$(buildah images --format '{{.Size}}' "$tag" | head -1)
ok "image: built from the tree in $secs s, $size"
if [ -n "${PS_IMAGE_KEEP:-}" ]; then
  check "image: tagged $PS_IMAGE_KEEP" buildah tag "$tag" "$PS_IMAGE_KEEP"
fi

# the image's user, and the manifests' (every runAsUser, runAsGroup and
# fsGroup of deploy/k8s/*.yaml)
user=$(buildah inspect --type image --format '{{.OCIv1.Config.User}}' "$tag")
check "image: USER is 10001:10001 ($user)" test "$user" = 10001:10001
ids=$(grep -hoE '(runAsUser|runAsGroup|fsGroup): *[0-9]+' "$root"/deploy/k8s/*.yaml | awk '{print $2}' | sort | uniq -c)
check "image: every runAsUser, runAsGroup and fsGroup of the manifests is 10001 ($(echo $ids))" \
  test "$(echo "$ids" | awk '{print $2}' | sort -u)" = 10001

ctr=$(buildah from --pull-never "$tag") || { bad "image: buildah from $tag"; finish; }
# inside CMD...: CMD in the image, with a deadline (see test_cleanup_hook)
inside() {
  local pid rc
  setsid buildah run --isolation chroot --env "PS_IMAGE_RUN=$dir" "$ctr" -- timeout -k 5 120 "$@" \
    > "$dir/out" 2>&1 &
  pid=$!
  echo "$pid" > "$dir/run.sid"
  wait "$pid"
  rc=$?
  rm -f "$dir/run.sid"
  cat "$dir/out"
  return $rc
}
expect "image: runs as uid 10001, gid 10001 (id)" 0 "uid=10001(paramserver) gid=10001(paramserver)" inside id
expect "image: ps-server --help" 0 "usage: ps-server" inside ps-server --help
expect "image: psctl --help" 0 "usage: psctl" inside psctl --help
expect "image: ps-worker --help" 0 "usage: ps-worker" inside ps-worker --help
expect "image: ps-launch --help" 0 "usage: ps-launch" inside ps-launch --help
expect "image: /ckpt belongs to the user" 0 "10001:10001 755" inside stat -c '%u:%g %a' /ckpt

# a short job: 1 ps, 1 worker, 50 steps, its checkpoint in /ckpt
inside ps-launch --ps 1 --workers 1 --ps-arg --checkpoint-dir=/ckpt -- \
  ps-worker --model mlp --steps 50 --checkpoint-dir /ckpt > "$dir/job.log" 2>&1
rc=$?
show=$dir/job.log
check "image: ps-launch, 1 ps + 1 worker, 50 steps, exits 0 (exit $rc)" test "$rc" = 0
check "image: ... the chief trained to global step 50" grep -q "^worker/0: global step 50$" "$dir/job.log"
check "image: ... and the ps stopped with it" grep -q "^ps/0: .* INFO ps/0: stopped (" "$dir/job.log"
show=""
grep -E "^worker/0: (global step|test accuracy)|trained 50 local steps" "$dir/job.log" | sed 's/^/    /'
expect "image: ... its checkpoint in /ckpt, written by uid 10001" 0 "10001 model.ckpt-50.index" \
  inside sh -c 'cd /ckpt && stat -c "%u %n" model.ckpt-50.index'
finish
