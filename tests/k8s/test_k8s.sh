#!/usr/bin/env bash
# The Kubernetes manifests of deploy/k8s, validated offline against the API
# schemas (kubernetes-models from the npm registry, installed once into
# $NPM_DIR), and a broken manifest to show the check can fail.  The image
# recipe is checked for what the manifests rely on.
set -uo pipefail
source "$(dirname "$0")/../support/lib.sh"
test_init k8s
here=$(cd "$(dirname "$0")" && pwd)
k8s="$here/../../deploy/k8s"
npm_dir=${NPM_DIR:?}
mkdir -p "$npm_dir"
if [ ! -d "$npm_dir/node_modules/kubernetes-models" ]; then
  (cd "$npm_dir" && npm install --silent --no-audit --no-fund kubernetes-models@5 js-yaml@4 > npm.log 2>&1) \
    || { bad "npm install kubernetes-models" "$(tail -5 "$npm_dir/npm.log")"; finish; }
fi
cp "$here/validate.mjs" "$npm_dir/validate.mjs"
v() { node "$npm_dir/validate.mjs" "$@"; }

expect "paramserver.yaml is valid" 0 "ok $k8s/paramserver.yaml: 6 documents" v "$k8s/paramserver.yaml"
expect "tfjob.yaml is valid" 0 "ok $k8s/tfjob.yaml: 1 documents" v "$k8s/tfjob.yaml"
# the check can fail: a replica count that is not a number, a misspelled
# field, a spec that does not match the StatefulSets
sed 's/replicas: 2/replicas: two/' "$k8s/paramserver.yaml" > "$dir/bad1.yaml"
expect "replicas: two is refused" 1 "spec/replicas must be integer" v "$dir/bad1.yaml"
sed 's/containerPort: 2222/containerPortt: 2222/' "$k8s/paramserver.yaml" > "$dir/bad2.yaml"
expect "a misspelled containerPort is refused" 1 "must have required property containerPort" v "$dir/bad2.yaml"
sed 's/"ps-1.ps:2222"/"ps-1.ps:2222", "ps-2.ps:2222"/' "$k8s/paramserver.yaml" > "$dir/bad3.yaml"
expect "a spec that does not match the StatefulSet" 1 "job ps has 3 tasks but its StatefulSet runs 2" v "$dir/bad3.yaml"
sed 's/restartPolicy: OnFailure/restartPolicy: Sometimes/' "$k8s/tfjob.yaml" > "$dir/bad4.yaml"
expect "a TFJob restart policy that does not exist" 1 "restartPolicy Sometimes is not a restart policy" v "$dir/bad4.yaml"

# the image: multi-stage, Debian 12, non-root, the programs the manifests run
df="$k8s/Dockerfile"
check "image: two stages from debian:12" test "$(grep -c '^FROM debian:12' "$df")" = 2
check "image: runs as a non-root user" grep -q '^USER 10001' "$df"
check "image: installs ps-server and ps-worker (meson install)" grep -q 'meson install' "$df"
# The runtime stage's packages, with what they depend on, must hold every
# shared library the programs load (the image cannot be built here: no
# container engine; this is what a missing package would break).
runtime=$(awk '/^FROM/ {n++} n == 2' "$df" | sed -n '/apt-get install/,/rm -rf/p' \
  | tr ' \\' '\n\n' | grep -E '^lib|^zlib|^ca-certificates' | sort -u)
check "image: the runtime stage installs packages ($(echo $runtime | wc -w))" test -n "$runtime"
if command -v dpkg > /dev/null && command -v apt-cache > /dev/null; then
  # debian:12-slim has libc6, libgcc-s1 and libstdc++6 already
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances $runtime libc6 libgcc-s1 libstdc++6 2> /dev/null \
    | grep -v '^ ' | sed 's/:amd64$//' | sort -u > "$dir/closure"
  for prog in "${PS_SERVER:?}" "${PS_WORKER:?}" "${PSCTL:?}"; do
    missing=""
    # (a sanitizer build's runtime libraries are not the image's)
    for l in $(ldd "$prog" | awk '$3 ~ /^\// && $1 !~ /^lib(a|ub|t|l)san/ {print $3}'); do
      r=$(readlink -f "$l")
      pkg=$( (dpkg -S "$r" || dpkg -S "/usr$r" || dpkg -S "${r#/usr}") 2> /dev/null | head -1 | cut -d: -f1)
      grep -qx "${pkg:-none}" "$dir/closure" || missing+=" ${pkg:-?}($l)"
    done
    check "image: the runtime packages hold every library of $(basename "$prog")${missing:+ (missing:$missing)}" test -z "$missing"
  done
  # and the check can fail: without libmicrohttpd12 ps-server lacks one
  grep -vx 'libmicrohttpd12' "$dir/closure" > "$dir/closure2"
  l=$(ldd "$PS_SERVER" | awk '/libmicrohttpd/ {print $3}')
  r=$(readlink -f "$l"); pkg=$( (dpkg -S "$r" || dpkg -S "/usr$r") 2> /dev/null | head -1 | cut -d: -f1)
  check "image: a runtime stage without libmicrohttpd12 would miss $pkg" test "$pkg" = libmicrohttpd12 -a -z "$(grep -x "$pkg" "$dir/closure2")"
else
  bad "image: runtime libraries" "needs dpkg and apt-cache (Debian)"
fi
finish
