#!/usr/bin/env bash
# The Kubernetes manifests of deploy/k8s, validated offline against the API
# schemas (kubernetes-models from the npm registry, installed once into
# $NPM_DIR), and a broken manifest to show the check can fail.  Every pod
# template passes the "restricted" Pod Security Standard, checked field by
# field, each rule broken once to see its error; and what the manifests
# promise besides (requests and limits, probes, claims, a
# PodDisruptionBudget for the ps, workers in Jobs).  The image recipe is
# checked for what the manifests rely on.
# The secure variants (paramserver-secure.yaml, tfjob-secure.yaml) get the
# same validation plus validate.mjs --secure (--require-auth, files from
# read-only Secret volumes, a Secret each for the ps, the chief and the
# other workers, TLS-capable probes, no token in the YAML), broken copies
# to show those checks fail, and a run through real processes
# (localpods.mjs): the Secrets made by the commands in the manifest's own
# comment (deploy/gen-certs.sh, kubectl create secret as a stand-in that
# writes files), every pod its manifest's command with its mounts, the
# probes run against the ps, and a short training job to its checkpoint.
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
cp "$here/validate.mjs" "$here/localpods.mjs" "$here/mutate.mjs" "$npm_dir/"
root=$(cd "$here/../.." && pwd)
v() { node "$npm_dir/validate.mjs" "$@"; }

expect "paramserver.yaml is valid, its 3 pod templates restricted" 0 \
  "ok $k8s/paramserver.yaml: 10 documents, 3 pod templates restricted" v "$k8s/paramserver.yaml"
expect "tfjob.yaml is valid, its 2 pod templates restricted" 0 \
  "ok $k8s/tfjob.yaml: 3 documents, 2 pod templates restricted" v "$k8s/tfjob.yaml"
# the check can fail: a replica count that is not a number, a misspelled
# field, a spec that does not match the StatefulSets
sed 's/replicas: 2/replicas: two/' "$k8s/paramserver.yaml" > "$dir/bad1.yaml"
expect "replicas: two is refused" 1 "spec/replicas must be integer" v "$dir/bad1.yaml"
sed 's/containerPort: 2222/containerPortt: 2222/' "$k8s/paramserver.yaml" > "$dir/bad2.yaml"
expect "a misspelled containerPort is refused" 1 "must have required property containerPort" v "$dir/bad2.yaml"
sed 's/"ps-1.ps:2222"/"ps-1.ps:2222", "ps-2.ps:2222"/' "$k8s/paramserver.yaml" > "$dir/bad3.yaml"
expect "a spec that does not match the StatefulSet" 1 "job ps has 3 tasks but its StatefulSet or Job runs 2" v "$dir/bad3.yaml"
sed 's/"worker-1.worker:2222"/"worker-1.worker:2222", "worker-2.worker:2222"/' "$k8s/paramserver.yaml" > "$dir/bad3b.yaml"
expect "a spec that does not match the Job" 1 "job worker has 3 tasks but its StatefulSet or Job runs 2" v "$dir/bad3b.yaml"
sed 's/restartPolicy: OnFailure/restartPolicy: Sometimes/' "$k8s/tfjob.yaml" > "$dir/bad4.yaml"
expect "a TFJob restart policy that does not exist" 1 "restartPolicy Sometimes is not a restart policy" v "$dir/bad4.yaml"

# The "restricted" Pod Security Standard (kubernetes.io/docs/concepts/
# security/pod-security-standards), field by field: each change below
# breaks one control in one pod template, and validate.mjs refuses the file
# with exactly one error (n=2: two) naming the control, the file and the
# object.
pss_n=0
# [n=N] pss NAME FILE KIND/NAME MESSAGE PATH=JSON...: that change is refused so
pss() {
  local name=$1 f=$2 t=$3 msg=$4 out=$dir/pss-$((++pss_n)).yaml o rc; shift 4
  node "$npm_dir/mutate.mjs" "$f" "$out" "$t" "$@" || { bad "$name: mutate.mjs $*"; return; }
  o=$(v "$out" 2>&1); rc=$?
  if [ "$rc" = 1 ] && [ "$(grep -c '^FAIL' <<< "$o")" = "${n:-1}" ] && grep -F -- "FAIL $out" <<< "$o" | grep -F -- "$msg" > /dev/null; then
    ok "$name is refused"
  else
    bad "$name is refused (exit $rc; want exit 1 and ${n:-1} error(s), one 'FAIL $out...$msg')" "$o"
  fi
}
P=spec.template.spec C=spec.template.spec.containers.0
A='spec.template.metadata.annotations[container.apparmor.security.beta.kubernetes.io/ps]'
T=spec.tfReplicaSpecs.PS.template.spec
ps=$k8s/paramserver.yaml tf=$k8s/tfjob.yaml
# baseline
pss "hostNetwork" "$ps" StatefulSet/ps 'StatefulSet ps: restricted "Host Namespaces": spec.hostNetwork must be false' \
  "$P.hostNetwork=true"
pss "hostPID" "$ps" Job/worker 'Job worker: restricted "Host Namespaces": spec.hostPID must be false' "$P.hostPID=true"
pss "hostIPC" "$tf" TFJob/paramserver-mlp 'TFJob paramserver-mlp PS: restricted "Host Namespaces": spec.hostIPC must be false' \
  "$T.hostIPC=true"
pss "a privileged container" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Privileged Containers": containers ps: securityContext.privileged must be false' \
  "$C.securityContext.privileged=true"
pss "a Windows HostProcess pod" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "HostProcess": spec.securityContext.windowsOptions.hostProcess must be false' \
  "$P.securityContext.windowsOptions={\"hostProcess\":true}"
n=2 pss "capability SYS_ADMIN added" "$ps" Job/worker \
  'Job worker: restricted "Capabilities": containers worker: securityContext.capabilities.add SYS_ADMIN is beyond the baseline set' \
  "$C.securityContext.capabilities.add=[\"SYS_ADMIN\"]"
n=2 pss "a hostPath volume" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "HostPath Volumes": volume ckpt: hostPath must not be used' \
  "$P.volumes.1={\"name\":\"ckpt\",\"hostPath\":{\"path\":\"/srv/ckpt\"}}"
pss "a hostPort" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Host Ports": containers ps: ports hostPort 2222 must be 0 or unset' "$C.ports.0.hostPort=2222"
pss "AppArmor unconfined (annotation)" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "AppArmor": annotation container.apparmor.security.beta.kubernetes.io/ps must be runtime/default or localhost/* (is "unconfined")' \
  "$A=\"unconfined\""
pss "AppArmor Unconfined (field)" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "AppArmor": containers ps: securityContext.appArmorProfile.type must be RuntimeDefault, Localhost or unset (is "Unconfined")' \
  "$C.securityContext.appArmorProfile={\"type\":\"Unconfined\"}"
pss "an SELinux type spc_t" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "SELinux": spec.securityContext.seLinuxOptions.type must be container_t' \
  "$P.securityContext.seLinuxOptions={\"type\":\"spc_t\"}"
pss "an SELinux user" "$ps" Job/worker \
  'Job worker: restricted "SELinux": containers worker: securityContext.seLinuxOptions.user must be unset (is "system_u")' \
  "$C.securityContext.seLinuxOptions={\"user\":\"system_u\"}"
pss "an unmasked /proc" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "/proc Mount Type": containers ps: securityContext.procMount must be Default or unset (is "Unmasked")' \
  "$C.securityContext.procMount=\"Unmasked\""
pss "an unsafe sysctl" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Sysctls": spec.securityContext.sysctls kernel.msgmax is not a safe sysctl' \
  "$P.securityContext.sysctls=[{\"name\":\"kernel.msgmax\",\"value\":\"65536\"}]"
pss "seccomp Unconfined (pod)" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Seccomp": spec.securityContext.seccompProfile.type must be RuntimeDefault or Localhost (is "Unconfined")' \
  "$P.securityContext.seccompProfile.type=\"Unconfined\"" "$C.securityContext.seccompProfile={\"type\":\"RuntimeDefault\"}"
# restricted
pss "an nfs volume" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Volume Types": volume ckpt: type nfs is not one of configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected, secret' \
  "$P.volumes.1={\"name\":\"ckpt\",\"nfs\":{\"server\":\"nfs\",\"path\":\"/ckpt\"}}"
pss "allowPrivilegeEscalation unset" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Privilege Escalation": containers ps: securityContext.allowPrivilegeEscalation must be false (is unset)' \
  "$C.securityContext.allowPrivilegeEscalation="
pss "allowPrivilegeEscalation true" "$tf" TFJob/paramserver-mlp \
  'TFJob paramserver-mlp PS: restricted "Privilege Escalation": containers tensorflow: securityContext.allowPrivilegeEscalation must be false (is true)' \
  "$T.containers.0.securityContext.allowPrivilegeEscalation=true"
pss "runAsNonRoot unset" "$ps" Job/worker \
  'Job worker: restricted "Running as Non-root": containers worker: runAsNonRoot must be true' \
  "$P.securityContext.runAsNonRoot="
pss "runAsNonRoot false in a container" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Running as Non-root": containers ps: runAsNonRoot must be true, in its securityContext or the pod'"'"'s (is false)' \
  "$C.securityContext.runAsNonRoot=false"
n=2 pss "runAsNonRoot false in the pod" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Running as Non-root": spec.securityContext.runAsNonRoot must be true (is false)' \
  "$P.securityContext.runAsNonRoot=false"
n=2 pss "runAsUser 0 (pod)" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Running as Non-root user": spec.securityContext.runAsUser must not be 0' \
  "$P.securityContext.runAsUser=0"
n=2 pss "runAsUser 0 (container)" "$tf" TFJob/paramserver-mlp \
  'TFJob paramserver-mlp PS: restricted "Running as Non-root user": containers tensorflow: securityContext.runAsUser must not be 0' \
  "$T.containers.0.securityContext.runAsUser=0"
pss "no seccomp profile" "$ps" Job/worker \
  'Job worker: restricted "Seccomp": containers worker: seccompProfile.type must be RuntimeDefault or Localhost, in its securityContext or the pod'"'"'s (is unset)' \
  "$P.securityContext.seccompProfile="
pss "seccomp Unconfined (container)" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Seccomp": containers ps: seccompProfile.type must be RuntimeDefault or Localhost' \
  "$C.securityContext.seccompProfile={\"type\":\"Unconfined\"}"
pss "capabilities not dropped" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Capabilities": containers ps: securityContext.capabilities.drop must include ALL (is unset)' \
  "$C.securityContext.capabilities="
pss "capability CHOWN added" "$tf" TFJob/paramserver-mlp \
  'TFJob paramserver-mlp PS: restricted "Capabilities": containers tensorflow: securityContext.capabilities.add may only hold NET_BIND_SERVICE (holds CHOWN)' \
  "$T.containers.0.securityContext.capabilities.add=[\"CHOWN\"]"
pss "an init container without the restricted context" "$ps" StatefulSet/ps \
  'StatefulSet ps: restricted "Privilege Escalation": initContainers init: securityContext.allowPrivilegeEscalation must be false' \
  "$P.initContainers=[{\"name\":\"init\",\"image\":\"paramserver:0.1\",\"command\":[\"true\"],\"securityContext\":{\"capabilities\":{\"drop\":[\"ALL\"]}},\"resources\":{\"requests\":{\"cpu\":\"1\",\"memory\":\"1Gi\"},\"limits\":{\"cpu\":\"1\",\"memory\":\"1Gi\"}}}]"
# ... and what the standard allows passes: NET_BIND_SERVICE added, a
# Localhost seccomp profile, container_t, runtime/default
node "$npm_dir/mutate.mjs" "$ps" "$dir/pss-ok.yaml" StatefulSet/ps "$C.securityContext.capabilities.add=[\"NET_BIND_SERVICE\"]" \
  "$P.securityContext.seccompProfile={\"type\":\"Localhost\",\"localhostProfile\":\"ps.json\"}" \
  "$P.securityContext.seLinuxOptions={\"type\":\"container_t\",\"level\":\"s0:c1,c2\"}" "$A=\"runtime/default\""
expect "restricted: what the standard allows passes" 0 "ok $dir/pss-ok.yaml: 10 documents, 3 pod templates restricted" \
  v "$dir/pss-ok.yaml"

# what the manifests promise besides the standard
pss "a pod without runAsUser" "$ps" StatefulSet/ps \
  'StatefulSet ps container ps: no runAsUser with a numeric uid other than 0 (is unset)' "$P.securityContext.runAsUser="
pss "a container without a memory limit" "$ps" StatefulSet/ps 'StatefulSet ps container ps: no resources.limits.memory' \
  "$C.resources.limits.memory="
pss "a TFJob container without a cpu request" "$tf" TFJob/paramserver-mlp \
  'TFJob paramserver-mlp PS container tensorflow: no resources.requests.cpu' "$T.containers.0.resources.requests.cpu="
pss "a request above its limit" "$ps" Job/worker \
  'Job worker container worker: resources.requests.memory 3Gi is above its limit 2Gi' "$C.resources.requests.memory=\"3Gi\""
pss "a TFJob ps without a livenessProbe" "$tf" TFJob/paramserver-mlp \
  'TFJob paramserver-mlp PS container tensorflow: runs ps-server without a livenessProbe' "$T.containers.0.livenessProbe="
pss "a ps no PodDisruptionBudget selects" "$ps" PodDisruptionBudget/ps \
  'StatefulSet ps: no PodDisruptionBudget selects its pods (labels {"app":"paramserver","role":"ps"})' \
  'spec.selector.matchLabels.role="worker"'
n=2 pss "a claim the file does not define" "$tf" PersistentVolumeClaim/paramserver-ckpt \
  'TFJob paramserver-mlp PS: volume ckpt: PersistentVolumeClaim paramserver-ckpt is not defined in the file' \
  'metadata.name="other"'
pss "a worker Job under restartPolicy Always" "$ps" Job/worker \
  'Job worker container worker: runs ps-worker, which finishes, in a Job (restartPolicy Always): it would run again once done' \
  "$P.restartPolicy=\"Always\""
pss "a Job that is not Indexed" "$ps" Job/worker \
  'document 10 (Job worker): Job worker: completionMode must be Indexed' "spec.completionMode=\"NonIndexed\""
# the workers as a StatefulSet (the old paramserver.yaml): the chief, done
# (--keep-ps), would be run again for ever
pss "workers in a StatefulSet" "$ps" Job/worker \
  'StatefulSet worker container worker: runs ps-worker, which finishes, in a StatefulSet (restartPolicy Always): it would run again once done; use a Job (or a TFJob)' \
  'apiVersion="apps/v1"' 'kind="StatefulSet"' spec.completionMode= spec.completions= spec.parallelism= \
  spec.backoffLimit= "$P.subdomain=" "$P.restartPolicy=" 'spec.serviceName="worker"' spec.replicas=2 \
  'spec.selector={"matchLabels":{"app":"paramserver","role":"worker"}}'

# replicated shards (issue 23): the etcd StatefulSet and the ps settings
# the spec's replication section needs; each change is refused, naming it
E=StatefulSet/ps-etcd
n=3 pss "an etcd of 4 members" "$ps" $E \
  'etcd StatefulSet ps-etcd runs 4 members: use an odd number, at least 3 (a majority survives the loss of one)' \
  spec.replicas=4
n=3 pss "an etcd of 1 member" "$ps" $E \
  'replication.etcd: ps-etcd-1.ps-etcd:2379: StatefulSet ps-etcd runs 1 members, 0 to 0' spec.replicas=1
pss "etcd members started in order" "$ps" $E \
  'etcd StatefulSet ps-etcd: podManagementPolicy must be Parallel' 'spec.podManagementPolicy="OrderedReady"'
pss "an etcd Service that is not headless" "$ps" Service/ps-etcd \
  'Service ps-etcd: etcd'"'"'s members find each other by pod DNS name: it must be headless (clusterIP: None)' \
  'spec.clusterIP="10.0.0.10"'
pss "an etcd Service that hides members not ready" "$ps" Service/ps-etcd \
  'Service ps-etcd: publishNotReadyAddresses must be true' 'spec.publishNotReadyAddresses=false'
pss "an --initial-cluster without every member" "$ps" $E \
  'etcd StatefulSet ps-etcd: --initial-cluster does not name member ps-etcd-2 by its pod DNS name (ps-etcd-2=http://ps-etcd-2.ps-etcd:PEER)' \
  'spec.template.spec.containers.0.args.6="--initial-cluster=ps-etcd-0=http://ps-etcd-0.ps-etcd:2380,ps-etcd-1=http://ps-etcd-1.ps-etcd:2380"'
pss "an etcd StatefulSet no PodDisruptionBudget selects" "$ps" $E \
  'etcd StatefulSet ps-etcd: no PodDisruptionBudget keeps its quorum in a drain' \
  'spec.template.metadata.labels.role="etcd2"' 'spec.selector.matchLabels.role="etcd2"'
sed 's/ps-etcd-2\.ps-etcd:2379"/etcd-2.ps-etcd:2379"/' "$ps" > "$dir/r1.yaml"
sed -i 's/^\(              --etcd \).*/\1ps-etcd-0.ps-etcd:2379,ps-etcd-1.ps-etcd:2379,etcd-2.ps-etcd:2379/' "$dir/r1.yaml"
expect "an etcd endpoint that is no pod of the StatefulSet" 1 \
  "replication.etcd: etcd-2.ps-etcd:2379 is not a pod NAME-K.SVC:PORT of a StatefulSet NAME (serviceName SVC) in this file" \
  v "$dir/r1.yaml"
sed 's/,ps-etcd-2\.ps-etcd:2379"/"/; s/^\(              --etcd ps-etcd-0.ps-etcd:2379,ps-etcd-1.ps-etcd:2379\).*/\1/' "$ps" > "$dir/r2.yaml"
expect "etcd endpoints that leave a member out" 1 \
  "replication.etcd names 2 of the 3 members of StatefulSet ps-etcd: name them all" v "$dir/r2.yaml"
sed 's/--log-format json --replicas 2$/--log-format json --replicas 3/' "$ps" > "$dir/r3.yaml"
expect "a ps whose --replicas is not the spec's" 1 \
  "StatefulSet ps container ps: --replicas 3 is not the spec's replication.replicas 2" v "$dir/r3.yaml"
sed 's/"replicas": 2, "job"/"replicas": 3, "job"/; s/--log-format json --replicas 2$/--log-format json --replicas 3/' "$ps" > "$dir/r4.yaml"
expect "more replicas than ps tasks" 1 "replication.replicas 3 is more than the 2 ps tasks" v "$dir/r4.yaml"

# the secure variants, offline
expect "paramserver-secure.yaml is valid, and secure" 0 \
  "ok $k8s/paramserver-secure.yaml: 9 documents, 3 pod templates restricted (secure)" v --secure "$k8s/paramserver-secure.yaml"
expect "tfjob-secure.yaml is valid, and secure" 0 \
  "ok $k8s/tfjob-secure.yaml: 4 documents, 3 pod templates restricted (secure)" v --secure "$k8s/tfjob-secure.yaml"
expect "the secure manifests hold no token and no Secret (grep)" 1 "" \
  grep -nE '[0-9a-fA-F]{32}|PS_AUTH_TOKEN|kind: *Secret' "$k8s/paramserver-secure.yaml" "$k8s/tfjob-secure.yaml"
# the secure checks can fail: the plain manifests, and broken secure ones
expect "paramserver.yaml is not secure (--require-auth)" 1 \
  "StatefulSet ps container ps: runs ps-server without --require-auth" v --secure "$k8s/paramserver.yaml"
expect "paramserver.yaml is not secure (grpc: probe)" 1 \
  "readinessProbe grpc: cannot connect to a ps serving TLS" v --secure "$k8s/paramserver.yaml"
expect "tfjob.yaml is not secure (worker 0 is the chief)" 1 \
  "Worker container tensorflow: its task 0 is the chief" v --secure "$k8s/tfjob.yaml"
sec=$k8s/paramserver-secure.yaml
sed 's/ --require-auth$//' "$sec" > "$dir/sbad1.yaml"
expect "secure: a ps without --require-auth is refused" 1 \
  "StatefulSet ps container ps: runs ps-server without --require-auth" v --secure "$dir/sbad1.yaml"
sed 's/"--require-auth"\]/]/' "$k8s/tfjob-secure.yaml" > "$dir/sbad2.yaml"
expect "secure: a TFJob PS without --require-auth is refused" 1 \
  "PS container tensorflow: runs ps-server without --require-auth" v --secure "$dir/sbad2.yaml"
sed '/mountPath: \/etc\/paramserver-tls/{n;s/readOnly: true/readOnly: false/}' "$sec" > "$dir/sbad3.yaml"
expect "secure: a Secret mounted read-write is refused" 1 \
  "secret volume tls is mounted without readOnly: true" v --secure "$dir/sbad3.yaml"
sed '0,/defaultMode: 288/s//defaultMode: 420/' "$sec" > "$dir/sbad4.yaml"
expect "secure: a Secret volume of mode 0644 is refused" 1 \
  "StatefulSet ps: secret volume tls has mode 0644, not 0400 or 0440" v --secure "$dir/sbad4.yaml"
# (into the worker container's env list, beside PS_POLL_SPIN_US)
sed "/^        - name: worker\$/,/^          env:\$/s/^          env:\$/&\n            - {name: PS_AUTH_TOKEN, value: \"$(openssl rand -hex 32)\"}/" \
  "$sec" > "$dir/sbad5.yaml"
expect "secure: an inline token is refused" 1 \
  "Job worker container worker: a token inline in env PS_AUTH_TOKEN" v --secure "$dir/sbad5.yaml"
sed 's/secretName: paramserver-worker-tls/secretName: paramserver-chief-tls/' "$sec" > "$dir/sbad6.yaml"
expect "secure: workers mounting the chief's Secret is refused" 1 \
  "Secret paramserver-chief-tls is mounted by the chief and by the other workers" v --secure "$dir/sbad6.yaml"
sed 's|--tls-ca /etc/paramserver-tls/ca.crt|--tls-ca /etc/paramserver/ca.crt|' "$sec" > "$dir/sbad7.yaml"
expect "secure: a CA file outside the Secret is refused" 1 \
  "Job chief container chief: --tls-ca /etc/paramserver/ca.crt is not in a mounted Secret" \
  v --secure "$dir/sbad7.yaml"

# the secure variants through real processes (localpods.mjs)
# kubectl, as the manifests' comments use it: "create secret generic NAME
# --from-file=[KEY=]FILE..." writes $secrets_dir/NAME/KEY; apply is noted
kubectl() {
  [ "$1" = -n ] && shift 2
  if [ "$1" = apply ] && [ "$2" = -f ]; then echo "$3" >> "$secrets_dir/applied"; return 0; fi
  [ "$1 $2 $3" = "create secret generic" ] || { echo "kubectl stand-in: $* is not handled" >&2; return 1; }
  local d=$secrets_dir/$4 a k f; shift 4
  [ ! -e "$d" ] || { echo "kubectl stand-in: secret ${d##*/} exists" >&2; return 1; }
  mkdir -p "$d"
  for a; do
    case $a in
      --from-file=*=*) k=${a#--from-file=}; f=${k#*=}; k=${k%%=*} ;;
      --from-file=*) f=${a#--from-file=}; k=${f##*/} ;;
      *) echo "kubectl stand-in: $a is not handled" >&2; return 1 ;;
    esac
    cp "$f" "$d/$k" || return 1
  done
}
# wait_pid PID SECONDS: its exit status, 124 if it is still running then
wait_pid() {
  local i
  for ((i = 0; i < $2 * 10; i++)); do kill -0 "$1" 2> /dev/null || break; sleep 0.1; done
  kill -0 "$1" 2> /dev/null && return 124
  wait "$1"
}
# run_secure NAME MANIFEST: its Secrets, its pods as processes, the ps
# probes, a short training job to its checkpoint; the ps then stop
run_secure() {
  local name=$1 m=$2 w=$dir/$1 pod job p rc crt hosts h ck step tokens role want ps_pods up=yes
  local -A pid=()
  secrets_dir=$w/secrets
  mkdir -p "$w/cwd" "$secrets_dir" && ln -s "$root/deploy" "$w/cwd/deploy"
  sed -n 's/^#   //p' "$m" > "$w/commands.sh"
  (cd "$w/cwd" || exit 1; set -e; source "$w/commands.sh") > "$w/commands.log" 2>&1
  rc=$?
  show=$w/commands.log
  check "$name: the commands in its comment make the Secrets ($(grep -c 'create secret' "$w/commands.sh"))" \
    test "$rc" = 0
  show=""
  check "$name: ... and apply it" test "$(cat "$secrets_dir/applied" 2> /dev/null)" = "deploy/k8s/${m##*/}"
  WORKER_ARGS="--model linreg --steps 300 --log-every 100" PS_SERVER=$PS_SERVER PS_WORKER=$PS_WORKER PSCTL=$PSCTL \
    node "$npm_dir/localpods.mjs" "$m" "$w/pods" "$secrets_dir" > "$w/localpods.log" 2>&1 \
    || { bad "$name: its pods" "$(cat "$w/localpods.log")"; return; }
  crt=$(ls "$secrets_dir"/*/server.crt | head -1)
  hosts=""
  for h in $(cat "$w/pods/ps-hosts"); do
    openssl x509 -in "$crt" -noout -checkhost "$h" | grep ' does match' > /dev/null && hosts+=" $h" || hosts+=" NOT:$h"
  done
  check "$name: server.crt names every ps as the workers dial it:$hosts" \
    test -n "$hosts" -a "${hosts/NOT:/}" = "$hosts"
  # the Secrets as the pods see them: mode 0440; the chief's token is an
  # admin one, every other worker's a worker one
  p=$(stat -c %a "$w"/pods/*/vol/*/{server.key,client.key,token,tokens} 2> /dev/null | sort -u | tr '\n' ' ')
  check "$name: Secret files mounted with mode 0440 ($p)" test "$p" = "440 "
  tokens=$(ls "$secrets_dir"/*/tokens | head -1)
  for pod in $(awk '$2 != "ps" {print $1}' "$w/pods/pods"); do
    for p in "$w/pods/$pod"/vol/*/token; do
      role=$(awk -v t="$(cat "$p")" '$2 == t {print $1}' "$tokens")
      want="worker"; [[ $pod == *chief* ]] && want="admin"
      check "$name: $pod's token has the $want role (${role:-none})" test "$role" = "$want"
    done
  done

  while read -r pod job _; do
    [ "$job" = ps ] || continue
    "$w/pods/$pod/run" > "$w/$pod.out" 2> "$w/$pod.log" &
    pid[$pod]=$!
  done < "$w/pods/pods"
  for pod in "${!pid[@]}"; do
    show=$w/$pod.log
    wait_for "$w/$pod.out" " ready on " 30 || up=no
    check "$name: $pod starts (--require-auth, its files from the Secret)" grep -q " ready on " "$w/$pod.out"
    check "$name: $pod serves TLS with client certificates and the tokens (2, 1 admin)" \
      grep -q "serving on .*; TLS with client certificates, 2 token(s), 1 admin)" "$w/$pod.log"
    show=""
    for p in readiness liveness; do
      [ -x "$w/pods/$pod/$p" ] || continue
      expect "$name: $pod's ${p}Probe passes" 0 " up" "$w/pods/$pod/$p"
    done
  done
  [ "$up" = yes ] || return
  while read -r pod job _; do
    [ "$job" = ps ] && continue
    "$w/pods/$pod/run" > "$w/$pod.out" 2> "$w/$pod.log" &
    pid[$pod]=$!
  done < "$w/pods/pods"
  # the chief first: if it fails, the others wait for it in vain
  local wait_s=120
  for pod in $(awk '$2 != "ps" {print ($2 == "chief" ? 0 : 1), $1}' "$w/pods/pods" | sort -s -k1,1 | cut -d' ' -f2); do
    wait_pid "${pid[$pod]}" "$wait_s"; rc=$?
    [ "$rc" = 0 ] || wait_s=2
    show=$w/$pod.log
    check "$name: $pod trains and exits 0 (exit $rc)" test "$rc" = 0
    show=""
  done
  ck=$w/pods/pvc/paramserver-ckpt
  step=$(sed -n 's/^global step \([0-9]*\)$/\1/p' "$w"/*chief*.out | tail -1)
  check "$name: the chief saved its checkpoint at the last step ($step)" \
    test -n "$step" -a -f "$ck/model.ckpt-$step.index"
  ps_pods=$(awk '$2 == "ps" {print $1}' "$w/pods/pods")
  if grep -q -- "--keep-ps" "$m"; then
    # a StatefulSet's ps stay up (--keep-ps): still Ready; SIGTERM stops them
    for pod in $ps_pods; do expect "$name: $pod still Ready after the job" 0 " up" "$w/pods/$pod/readiness"; done
    for pod in $ps_pods; do kill -TERM "${pid[$pod]}"; done
    sleep 0.3
    for pod in $ps_pods; do kill -TERM "${pid[$pod]}" 2> /dev/null; done
  fi
  for pod in $ps_pods; do
    wait_pid "${pid[$pod]}" 30; rc=$?
    check "$name: $pod exits 0 (exit $rc)" test "$rc" = 0
  done
  p=$(awk '$2 == "ps" {print $1; exit}' "$w/pods/pods")
  expect "$name: $p's readinessProbe fails once it is down" 1 " down (" "$w/pods/$p/readiness"
  p=$(grep -hE "refused [0-9]+ call|PERMISSION_DENIED|UNAUTHENTICATED|needs an admin token" "$w"/*.log | head -3)
  check "$name: no call refused${p:+: $p}" test -z "$p"
}
run_secure paramserver-secure "$k8s/paramserver-secure.yaml"
run_secure tfjob-secure "$k8s/tfjob-secure.yaml"

# the image: multi-stage, Debian 12, non-root, the programs the manifests run
df="$k8s/Dockerfile"
check "image: two stages from debian:12" test "$(grep -c '^FROM debian:12' "$df")" = 2
check "image: runs as the manifests' user and group, 10001" grep -qx 'USER 10001:10001' "$df"
check "image: installs ps-server and ps-worker (meson install)" grep -q 'meson install' "$df"
# The runtime stage's packages, with what they depend on, must hold every
# shared library the programs load (this runs everywhere; tests/image
# builds the image and runs it where buildah is).
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
