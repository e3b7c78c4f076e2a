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
for lib in libgrpc29 libprotobuf-c1 libuv1 libmicrohttpd12 libopenblas0-pthread; do
  check "image: runtime has $lib" grep -q "$lib" "$df"
done
finish
