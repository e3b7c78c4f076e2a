// Validates Kubernetes manifests offline against the API schemas
// (the npm package kubernetes-models; no cluster, no kubectl server).
//   node validate.mjs FILE...
// Every document must be a kind this script knows; a TFJob's pod
// templates are checked as core/v1 pod templates.  The paramserver
// cluster spec in a ConfigMap must name as many tasks as the StatefulSets
// and Indexed Jobs run.  Every pod template must pass the "restricted"
// Pod Security Standard (podSecurity below) and what the manifests promise
// besides (deployChecks below: requests and limits, probes, claims,
// a PodDisruptionBudget for the ps, no finished task run again).
// A spec with a "replication" section of 2 or 3 replicas must have its
// etcd in the file (replicationChecks below).
// Prints "ok FILE: N documents, P pod templates restricted" or the
// errors, and exits 1 on any.
//   node validate.mjs --secure FILE...
// also checks what a secure variant promises (secureChecks below).
import fs from 'node:fs';
import yaml from 'js-yaml';
import { StatefulSet } from 'kubernetes-models/apps/v1';
import { Job } from 'kubernetes-models/batch/v1';
import { PodDisruptionBudget } from 'kubernetes-models/policy/v1';
import { ConfigMap, PersistentVolumeClaim, PodTemplate, Service } from 'kubernetes-models/v1';

const models = {
  'apps/v1 StatefulSet': StatefulSet,
  'batch/v1 Job': Job,
  'policy/v1 PodDisruptionBudget': PodDisruptionBudget,
  'v1 ConfigMap': ConfigMap,
  'v1 PersistentVolumeClaim': PersistentVolumeClaim,
  'v1 Service': Service,
};
let failed = 0;

function check(what, fn) {
  try {
    fn();
  } catch (e) {
    failed++;
    console.log(`FAIL ${what}: ${e.message}`);
  }
}

function tfjob(file, doc) {
  const specs = doc.spec?.tfReplicaSpecs;
  if (!specs || typeof specs !== 'object') throw new Error('TFJob without spec.tfReplicaSpecs');
  for (const [role, rs] of Object.entries(specs)) {
    if (!['Chief', 'PS', 'Worker', 'Evaluator', 'Master'].includes(role))
      throw new Error(`TFJob replica type ${role} is not one of Chief, PS, Worker, Evaluator`);
    if (!Number.isInteger(rs.replicas) || rs.replicas < 1)
      throw new Error(`TFJob ${role}.replicas must be a positive integer`);
    if (!['Always', 'OnFailure', 'Never', 'ExitCode'].includes(rs.restartPolicy))
      throw new Error(`TFJob ${role}.restartPolicy ${rs.restartPolicy} is not a restart policy`);
    new PodTemplate({ metadata: { name: `${doc.metadata.name}-${role}` }, template: rs.template }).validate();
    if (!rs.template.spec.containers.some((c) => c.name === 'tensorflow'))
      throw new Error(`TFJob ${role}: the operator needs a container named tensorflow`);
  }
}

// ---- --secure: TLS, client certificates and tokens from Secrets.
// Every container that runs ps-server (by command, or by the image's
// entrypoint when it has none) has --require-auth (or PS_REQUIRE_AUTH=1) and
// takes its certificate, key, client CA and token file from a Secret
// volume; every ps-worker its CA, certificate, key and token likewise.
// Secret volumes have defaultMode 0400 or 0440 and every mount of one is
// readOnly.  The ps, the chief and the other workers mount different
// Secrets (so no worker holds the ps's token file or an admin token), which
// needs a chief of its own (job chief, or a TFJob Chief).  A ps serving TLS
// has a readiness probe and no grpc: probe (it does not speak TLS).  No
// token is in the file: no Secret documents, no PS_AUTH_TOKEN value, no
// long hex string.
const SECRET_MODES = [0o400, 0o440];
const words = (c) =>
  [...(c.command ?? []), ...(c.args ?? [])].join(' ').split(/\s+/).filter(Boolean);
// the value of FLAG (--flag V or --flag=V) in a container's command, else
// of its environment variable ENV ('(valueFrom)' for one from elsewhere)
function setting(c, flag, env) {
  const w = words(c);
  for (let i = 0; i < w.length; i++) {
    if (w[i] === flag) return w[i + 1] ?? '';
    if (w[i].startsWith(`${flag}=`)) return w[i].slice(flag.length + 1);
  }
  const e = (c.env ?? []).find((v) => v.name === env);
  return e ? (e.value ?? '(valueFrom)') : undefined;
}
const runsServer = (c) =>
  words(c).some((w) => /(^|\/)ps-server$/.test(w)) || (!c.command && /paramserver/.test(c.image ?? ''));
const runsWorker = (c) => words(c).some((w) => /(^|\/)ps-worker$/.test(w));
const SERVER_FILES = [['--tls-cert', 'PS_TLS_CERT'], ['--tls-key', 'PS_TLS_KEY'],
  ['--tls-client-ca', 'PS_TLS_CLIENT_CA'], ['--auth-token-file', 'PS_AUTH_TOKEN_FILE']];
const CLIENT_FILES = [['--tls-ca', 'PS_TLS_CA'], ['--tls-cert', 'PS_TLS_CERT'], ['--tls-key', 'PS_TLS_KEY'],
  ['--token-file', 'PS_TOKEN_FILE']];
const octal = (m) => (m === undefined ? 'unset (0644)' : `0${m.toString(8)}`);

// pods: [{what, spec, role}], role 'ps', 'chief', 'worker' (a worker that
// is not the chief) or 'worker0' (a worker template whose task 0 is the chief)
function secureChecks(file, text, docs, pods) {
  const err = [];
  if (/\b[0-9a-fA-F]{32,}\b/.test(text)) err.push('a long hex string (a token?) is in the file');
  if (docs.some((d) => d.kind === 'Secret'))
    err.push('a Secret is in the file: its data would be in the YAML; create it with kubectl');
  const secretsOf = { ps: new Set(), chief: new Set(), worker: new Set() };
  for (const { what, spec: ps, role } of pods) {
    const vols = new Map((ps.volumes ?? []).map((v) => [v.name, v]));
    for (const v of vols.values()) {
      if (!v.secret) continue;
      const modes = [v.secret.defaultMode, ...(v.secret.items ?? []).map((i) => i.mode).filter((m) => m !== undefined)];
      if (!modes.every((m) => SECRET_MODES.includes(m)))
        err.push(`${what}: secret volume ${v.name} has mode ${modes.map(octal).join(', ')}, not 0400 or 0440`);
    }
    for (const c of [...(ps.initContainers ?? []), ...(ps.containers ?? [])]) {
      const cw = `${what} container ${c.name}`;
      const secretMounts = (c.volumeMounts ?? []).filter((m) => vols.get(m.name)?.secret);
      for (const m of secretMounts)
        if (m.readOnly !== true) err.push(`${cw}: secret volume ${m.name} is mounted without readOnly: true`);
      for (const e of c.env ?? [])
        if ((e.name === 'PS_AUTH_TOKEN' && e.value !== undefined) || /^[0-9a-fA-F]{32,}$/.test(e.value ?? ''))
          err.push(`${cw}: a token inline in env ${e.name}`);
      let files, kind;
      if (runsServer(c)) {
        kind = 'ps';
        files = SERVER_FILES;
        const env = (c.env ?? []).find((v) => v.name === 'PS_REQUIRE_AUTH')?.value;
        if (!words(c).includes('--require-auth') && !['1', 'true'].includes(env))
          err.push(`${cw}: runs ps-server without --require-auth (or PS_REQUIRE_AUTH=1)`);
        if (!c.readinessProbe) err.push(`${cw}: no readinessProbe`);
        for (const p of ['readinessProbe', 'livenessProbe', 'startupProbe'])
          if (c[p]?.grpc)
            err.push(`${cw}: ${p} grpc: cannot connect to a ps serving TLS (use exec: psctl ... status)`);
      } else if (runsWorker(c)) {
        kind = role === 'chief' ? 'chief' : 'worker';
        files = CLIENT_FILES;
        if (role === 'worker0')
          err.push(`${cw}: its task 0 is the chief, which needs the admin token the other workers must ` +
            'not have: run the chief as its own job (chief, or a TFJob Chief)');
      } else continue;
      // each file from a mounted Secret; note which Secret
      for (const [flag, env] of files) {
        const p = setting(c, flag, env);
        const m = secretMounts.find((m) => p?.startsWith(`${m.mountPath.replace(/\/$/, '')}/`));
        if (p === undefined) err.push(`${cw}: no ${flag} (or ${env})`);
        else if (!m) err.push(`${cw}: ${flag} ${p} is not in a mounted Secret`);
        else secretsOf[kind].add(vols.get(m.name).secret.secretName);
      }
    }
  }
  for (const [a, b] of [['ps', 'chief'], ['ps', 'worker'], ['chief', 'worker']])
    for (const s of secretsOf[a])
      if (secretsOf[b].has(s))
        err.push(`Secret ${s} is mounted by the ${a} and by the ${b === 'worker' ? 'other workers' : b}`);
  if (!secretsOf.ps.size) err.push('no container runs ps-server with its files from a Secret');
  for (const e of err)
    check(`${file} (secure)`, () => {
      throw new Error(e);
    });
}

// ---- The Pod Security Standards, "restricted" profile (which contains
// "baseline"), field by field as kubernetes.io/docs/concepts/security/
// pod-security-standards lists them (Kubernetes 1.25 and later).  Each
// violation is reported as: WHAT: restricted "CONTROL": FIELD ...
const BASELINE_CAPS = ['AUDIT_WRITE', 'CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'FSETID', 'KILL', 'MKNOD',
  'NET_BIND_SERVICE', 'SETFCAP', 'SETGID', 'SETPCAP', 'SETUID', 'SYS_CHROOT'];
const SAFE_SYSCTLS = ['kernel.shm_rmid_forced', 'net.ipv4.ip_local_port_range',
  'net.ipv4.ip_unprivileged_port_start', 'net.ipv4.tcp_syncookies', 'net.ipv4.ping_group_range',
  'net.ipv4.ip_local_reserved_ports', 'net.ipv4.tcp_keepalive_time', 'net.ipv4.tcp_fin_timeout',
  'net.ipv4.tcp_keepalive_intvl', 'net.ipv4.tcp_keepalive_probes'];
const RESTRICTED_VOLUMES = ['configMap', 'csi', 'downwardAPI', 'emptyDir', 'ephemeral',
  'persistentVolumeClaim', 'projected', 'secret'];
const SELINUX_TYPES = ['', 'container_t', 'container_init_t', 'container_kvm_t', 'container_engine_t'];
const show = (v) => (v === undefined ? 'unset' : JSON.stringify(v));

// meta: the pod template's metadata; spec: its pod spec; what: e.g.
// "StatefulSet ps".  Returns the violations.
function podSecurity(what, meta, spec) {
  const err = [];
  const bad = (control, text) => err.push(`${what}: restricted "${control}": ${text}`);
  const psc = spec.securityContext ?? {};
  const containers = [['containers', spec.containers ?? []], ['initContainers', spec.initContainers ?? []],
    ['ephemeralContainers', spec.ephemeralContainers ?? []]];
  const all = containers.flatMap(([kind, list]) => list.map((c) => [`${kind} ${c.name}`, c]));
  // baseline
  if (psc.windowsOptions?.hostProcess === true)
    bad('HostProcess', 'spec.securityContext.windowsOptions.hostProcess must be false or unset');
  for (const f of ['hostNetwork', 'hostPID', 'hostIPC'])
    if (spec[f] === true) bad('Host Namespaces', `spec.${f} must be false or unset (is true)`);
  for (const [cw, c] of all) {
    const sc = c.securityContext ?? {};
    if (sc.windowsOptions?.hostProcess === true)
      bad('HostProcess', `${cw}: securityContext.windowsOptions.hostProcess must be false or unset`);
    if (sc.privileged === true) bad('Privileged Containers', `${cw}: securityContext.privileged must be false or unset`);
    for (const cap of sc.capabilities?.add ?? [])
      if (!BASELINE_CAPS.includes(cap))
        bad('Capabilities', `${cw}: securityContext.capabilities.add ${cap} is beyond the baseline set`);
    for (const p of c.ports ?? [])
      if (p.hostPort) bad('Host Ports', `${cw}: ports hostPort ${p.hostPort} must be 0 or unset`);
    if (sc.procMount !== undefined && sc.procMount !== 'Default')
      bad('/proc Mount Type', `${cw}: securityContext.procMount must be Default or unset (is ${show(sc.procMount)})`);
  }
  for (const v of spec.volumes ?? [])
    if (v.hostPath) bad('HostPath Volumes', `volume ${v.name}: hostPath must not be used`);
  // AppArmor: the fields (1.30) and the annotations
  const apparmorOk = (t) => t === undefined || t === 'RuntimeDefault' || t === 'Localhost';
  if (!apparmorOk(psc.appArmorProfile?.type))
    bad('AppArmor', `spec.securityContext.appArmorProfile.type must be RuntimeDefault, Localhost or unset (is ${show(psc.appArmorProfile.type)})`);
  for (const [cw, c] of all)
    if (!apparmorOk(c.securityContext?.appArmorProfile?.type))
      bad('AppArmor', `${cw}: securityContext.appArmorProfile.type must be RuntimeDefault, Localhost or unset (is ${show(c.securityContext.appArmorProfile.type)})`);
  for (const [k, v] of Object.entries(meta?.annotations ?? {}))
    if (k.startsWith('container.apparmor.security.beta.kubernetes.io/') &&
        v !== 'runtime/default' && !v.startsWith('localhost/'))
      bad('AppArmor', `annotation ${k} must be runtime/default or localhost/* (is ${show(v)})`);
  // SELinux
  const selinux = (where, o) => {
    if (!o) return;
    if (o.type !== undefined && !SELINUX_TYPES.includes(o.type))
      bad('SELinux', `${where}seLinuxOptions.type must be container_t, container_init_t, container_kvm_t, container_engine_t or unset (is ${show(o.type)})`);
    for (const f of ['user', 'role'])
      if (o[f] !== undefined && o[f] !== '') bad('SELinux', `${where}seLinuxOptions.${f} must be unset (is ${show(o[f])})`);
  };
  selinux('spec.securityContext.', psc.seLinuxOptions);
  for (const [cw, c] of all) selinux(`${cw}: securityContext.`, c.securityContext?.seLinuxOptions);
  // seccomp: never Unconfined (baseline); RuntimeDefault or Localhost for
  // every container, at the pod or the container level (restricted)
  const seccompOk = (t) => t === 'RuntimeDefault' || t === 'Localhost';
  if (psc.seccompProfile?.type !== undefined && !seccompOk(psc.seccompProfile.type))
    bad('Seccomp', `spec.securityContext.seccompProfile.type must be RuntimeDefault or Localhost (is ${show(psc.seccompProfile.type)})`);
  for (const [cw, c] of all) {
    const t = c.securityContext?.seccompProfile?.type;
    if (t !== undefined ? !seccompOk(t) : !seccompOk(psc.seccompProfile?.type))
      bad('Seccomp', `${cw}: seccompProfile.type must be RuntimeDefault or Localhost, in its securityContext or the pod's (is ${show(t ?? psc.seccompProfile?.type)})`);
  }
  for (const s of psc.sysctls ?? [])
    if (!SAFE_SYSCTLS.includes(s.name)) bad('Sysctls', `spec.securityContext.sysctls ${s.name} is not a safe sysctl`);
  // restricted
  for (const v of spec.volumes ?? []) {
    const type = Object.keys(v).find((k) => k !== 'name');
    if (!RESTRICTED_VOLUMES.includes(type))
      bad('Volume Types', `volume ${v.name}: type ${type} is not one of ${RESTRICTED_VOLUMES.join(', ')}`);
  }
  if (psc.runAsNonRoot === false) bad('Running as Non-root', 'spec.securityContext.runAsNonRoot must be true (is false)');
  if (psc.runAsUser === 0) bad('Running as Non-root user', 'spec.securityContext.runAsUser must not be 0');
  for (const [cw, c] of all) {
    const sc = c.securityContext ?? {};
    if (sc.allowPrivilegeEscalation !== false)
      bad('Privilege Escalation', `${cw}: securityContext.allowPrivilegeEscalation must be false (is ${show(sc.allowPrivilegeEscalation)})`);
    if (sc.runAsNonRoot === false || (sc.runAsNonRoot === undefined && psc.runAsNonRoot !== true))
      bad('Running as Non-root', `${cw}: runAsNonRoot must be true, in its securityContext or the pod's (is ${show(sc.runAsNonRoot ?? psc.runAsNonRoot)})`);
    if (sc.runAsUser === 0) bad('Running as Non-root user', `${cw}: securityContext.runAsUser must not be 0`);
    const caps = sc.capabilities ?? {};
    if (!(caps.drop ?? []).includes('ALL'))
      bad('Capabilities', `${cw}: securityContext.capabilities.drop must include ALL (is ${show(caps.drop)})`);
    for (const cap of caps.add ?? [])
      if (cap !== 'NET_BIND_SERVICE')
        bad('Capabilities', `${cw}: securityContext.capabilities.add may only hold NET_BIND_SERVICE (holds ${cap})`);
  }
  return err;
}

// ---- What the manifests promise besides.  pods: [{what, spec, kind,
// labels, restart (a TFJob replica's restartPolicy)}], docs: the file's
// documents.
//  - every container has requests and limits for cpu and memory, no
//    request above its limit;
//  - every container runs as a numeric uid other than 0 (runAsUser, its
//    own or the pod's): the kubelet enforces runAsNonRoot only for an image
//    whose USER is numeric, and the pod names the uid the image's files
//    (/ckpt) belong to;
//  - a container that runs ps-server has a readiness and a liveness probe;
//  - a container that runs ps-worker (it finishes) is not under a
//    controller that runs it again once it is done (StatefulSet, Deployment,
//    ReplicaSet, DaemonSet; or restartPolicy Always): a Job or a TFJob;
//  - every persistentVolumeClaim a pod uses is defined in the file;
//  - a PodDisruptionBudget selects the ps pods.
const QTY = { '': 1, m: 1e-3, k: 1e3, M: 1e6, G: 1e9, T: 1e12, Ki: 1024, Mi: 1024 ** 2, Gi: 1024 ** 3, Ti: 1024 ** 4 };
function quantity(q) {
  const m = /^([0-9.]+)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$/.exec(String(q));
  return m ? Number(m[1]) * QTY[m[2] ?? ''] : NaN;
}
const selects = (sel, labels) =>
  Object.entries(sel?.matchLabels ?? {}).every(([k, v]) => labels?.[k] === v) &&
  Object.keys(sel?.matchLabels ?? {}).length > 0;
function deployChecks(docs, pods) {
  const err = [];
  const claims = new Set(docs.filter((d) => d.kind === 'PersistentVolumeClaim').map((d) => d.metadata?.name));
  const pdbs = docs.filter((d) => d.kind === 'PodDisruptionBudget');
  for (const { what, spec, kind, labels, restart: rp } of pods) {
    let server = false;
    for (const c of [...(spec.initContainers ?? []), ...(spec.containers ?? [])]) {
      const cw = `${what} container ${c.name}`;
      const uid = c.securityContext?.runAsUser ?? spec.securityContext?.runAsUser;
      if (!Number.isInteger(uid) || uid <= 0)
        err.push(`${cw}: no runAsUser with a numeric uid other than 0 (is ${show(uid)})`);
      for (const r of ['cpu', 'memory']) {
        const req = c.resources?.requests?.[r];
        const lim = c.resources?.limits?.[r];
        if (req === undefined) err.push(`${cw}: no resources.requests.${r}`);
        if (lim === undefined) err.push(`${cw}: no resources.limits.${r}`);
        if (req !== undefined && lim !== undefined && !(quantity(req) <= quantity(lim)))
          err.push(`${cw}: resources.requests.${r} ${req} is above its limit ${lim}`);
      }
      if (runsServer(c)) {
        server = true;
        for (const p of ['readinessProbe', 'livenessProbe']) if (!c[p]) err.push(`${cw}: runs ps-server without a ${p}`);
      }
      if (runsWorker(c)) {
        const restart = rp ?? spec.restartPolicy ?? 'Always';
        if (['StatefulSet', 'Deployment', 'ReplicaSet', 'DaemonSet'].includes(kind) || restart === 'Always')
          err.push(`${cw}: runs ps-worker, which finishes, in a ${kind} (restartPolicy ${restart}): it would ` +
            'run again once done; use a Job (or a TFJob)');
      }
    }
    for (const v of spec.volumes ?? [])
      if (v.persistentVolumeClaim && !claims.has(v.persistentVolumeClaim.claimName))
        err.push(`${what}: volume ${v.name}: PersistentVolumeClaim ${v.persistentVolumeClaim.claimName} is not defined in the file`);
    if (server && !pdbs.some((d) => selects(d.spec?.selector, labels)))
      err.push(`${what}: no PodDisruptionBudget selects its pods (labels ${show(labels)})`);
  }
  for (const d of pdbs) {
    const { maxUnavailable: mu, minAvailable: ma } = d.spec ?? {};
    if (mu === undefined && ma === undefined)
      err.push(`PodDisruptionBudget ${d.metadata?.name}: neither maxUnavailable nor minAvailable`);
  }
  return err;
}

// ---- replicated shards (the spec's "replication" section, replicas >= 2):
//  - the section's etcd endpoints are the pods NAME-K.SVC:PORT of one
//    StatefulSet NAME in the file, every one of its members, SVC its
//    serviceName: a headless Service (clusterIP None) that publishes
//    addresses before the pods are ready (bootstrap needs the names) and
//    has the client port PORT;
//  - that StatefulSet runs an odd number of members, at least 3 (a
//    majority survives one loss), started together (podManagementPolicy
//    Parallel: each member waits for the others), and each member's
//    --initial-cluster names every member NAME-K=http://NAME-K.SVC:PEER by
//    its pod DNS name; a PodDisruptionBudget selects its pods;
//  - no more replicas than ps tasks;
//  - the ps run in a StatefulSet (a ps that exits, fenced, comes back
//    with its identity and rejoins), and a ps-server's own --replicas and
//    --etcd, if given, are the section's.
function replicationChecks(docs, spec, pods) {
  const err = [];
  const r = spec.replication;
  if (!r || !(r.replicas >= 2)) return err;
  const nps = Array.isArray(spec.ps) ? spec.ps.length : 0;
  if (r.replicas > nps) err.push(`replication.replicas ${r.replicas} is more than the ${nps} ps tasks`);
  if (typeof r.etcd !== 'string' || r.etcd === '') {
    err.push('replication: no "etcd" endpoints (the etcd StatefulSet\'s pods, NAME-K.SVC:2379)');
    return err;
  }
  const sets = docs.filter((d) => d.kind === 'StatefulSet');
  const services = docs.filter((d) => d.kind === 'Service');
  const seen = new Map(); // etcd StatefulSet name -> Set of members named
  let bad = false;
  for (const ep of r.etcd.split(',')) {
    const m = /^([a-z0-9-]+)-([0-9]+)\.([a-z0-9-]+):([0-9]+)$/.exec(ep);
    const sts = m && sets.find((d) => d.metadata?.name === m[1] && d.spec?.serviceName === m[3]);
    if (!sts) {
      err.push(`replication.etcd: ${ep} is not a pod NAME-K.SVC:PORT of a StatefulSet NAME (serviceName SVC) in this file`);
      bad = true;
      continue;
    }
    const k = Number(m[2]);
    if (k >= sts.spec.replicas) {
      err.push(`replication.etcd: ${ep}: StatefulSet ${m[1]} runs ${sts.spec.replicas} members, 0 to ${sts.spec.replicas - 1}`);
      bad = true;
    }
    const svc = services.find((d) => d.metadata?.name === m[3]);
    if (!svc) err.push(`replication.etcd: ${ep}: no Service ${m[3]} in this file`);
    else if (!(svc.spec?.ports ?? []).some((p) => String(p.port) === m[4]))
      err.push(`replication.etcd: ${ep}: Service ${m[3]} has no port ${m[4]}`);
    if (!seen.has(sts)) seen.set(sts, new Set());
    seen.get(sts).add(k);
  }
  if (seen.size > 1) err.push(`replication.etcd names pods of ${seen.size} StatefulSets: one etcd cluster only`);
  for (const [sts, ks] of seen) {
    const name = sts.metadata.name;
    const n = sts.spec.replicas;
    const svcName = sts.spec.serviceName;
    if (!bad && ks.size !== n)
      err.push(`replication.etcd names ${ks.size} of the ${n} members of StatefulSet ${name}: name them all (a client moves to another on a loss)`);
    if (!(n >= 3 && n % 2 === 1))
      err.push(`etcd StatefulSet ${name} runs ${n} members: use an odd number, at least 3 (a majority survives the loss of one)`);
    if (sts.spec.podManagementPolicy !== 'Parallel')
      err.push(`etcd StatefulSet ${name}: podManagementPolicy must be Parallel (each member waits for the others to bootstrap; is ${show(sts.spec.podManagementPolicy)})`);
    const svc = services.find((d) => d.metadata?.name === svcName);
    if (svc && svc.spec?.clusterIP !== 'None')
      err.push(`Service ${svcName}: etcd's members find each other by pod DNS name: it must be headless (clusterIP: None)`);
    if (svc && svc.spec?.publishNotReadyAddresses !== true)
      err.push(`Service ${svcName}: publishNotReadyAddresses must be true (members resolve each other before they are ready)`);
    const c = (sts.spec.template?.spec?.containers ?? [])[0] ?? {};
    const ic = (setting(c, '--initial-cluster', 'ETCD_INITIAL_CLUSTER') ?? '').split(',');
    for (let k = 0; k < n; k++) {
      const re = new RegExp(`^${name}-${k}=http://${name}-${k}\\.${svcName}:[0-9]+$`);
      if (!ic.some((x) => re.test(x)))
        err.push(`etcd StatefulSet ${name}: --initial-cluster does not name member ${name}-${k} by its pod DNS name (${name}-${k}=http://${name}-${k}.${svcName}:PEER)`);
    }
    const labels = sts.spec.template?.metadata?.labels;
    if (!docs.some((d) => d.kind === 'PodDisruptionBudget' && selects(d.spec?.selector, labels)))
      err.push(`etcd StatefulSet ${name}: no PodDisruptionBudget keeps its quorum in a drain`);
  }
  for (const { what, spec: ps, kind } of pods)
    for (const c of ps.containers ?? []) {
      if (!runsServer(c)) continue;
      if (kind !== 'StatefulSet' && kind !== 'TFJob')
        err.push(`${what}: a replicated ps runs in a StatefulSet, so that a ps that exits (75: fenced) comes back with its task identity and rejoins`);
      const rep = setting(c, '--replicas', 'PS_REPLICAS');
      if (rep !== undefined && rep !== String(r.replicas))
        err.push(`${what} container ${c.name}: --replicas ${rep} is not the spec's replication.replicas ${r.replicas}`);
      const e = setting(c, '--etcd', 'PS_ETCD');
      if (e !== undefined && e !== r.etcd)
        err.push(`${what} container ${c.name}: --etcd ${e} is not the spec's replication.etcd ${r.etcd}`);
    }
  return err;
}

// the job a StatefulSet's worker runs as (--job NAME)
function jobOfArgs(ps) {
  for (const c of ps.containers ?? []) if (runsWorker(c)) return setting(c, '--job', 'PS_JOB');
  return undefined;
}

// a pod template's role for secureChecks
function roleOf(jobs, job) {
  if (job === 'chief' || job === 'master') return 'chief';
  if (job === 'worker') return jobs.includes('chief') || jobs.includes('master') ? 'worker' : 'worker0';
  return job;
}

const secure = process.argv.includes('--secure');
for (const file of process.argv.slice(2).filter((a) => a !== '--secure')) {
  const text = fs.readFileSync(file, 'utf8');
  const docs = yaml.loadAll(text).filter((d) => d != null);
  const pods = [];
  const replicas = {};
  let spec = null;
  docs.forEach((doc, i) => {
    const what = `${file} document ${i + 1} (${doc.kind} ${doc.metadata?.name})`;
    check(what, () => {
      if (doc.apiVersion === 'kubeflow.org/v1' && doc.kind === 'TFJob') {
        for (const [role, rs] of Object.entries(doc.spec?.tfReplicaSpecs ?? {}))
          pods.push({ what: `TFJob ${doc.metadata.name} ${role}`, spec: rs.template?.spec ?? {},
            meta: rs.template?.metadata, labels: rs.template?.metadata?.labels, kind: 'TFJob',
            restart: rs.restartPolicy === 'ExitCode' ? 'Never' : rs.restartPolicy,
            job: role.toLowerCase(), tfjob: true });
        return tfjob(file, doc);
      }
      const M = models[`${doc.apiVersion} ${doc.kind}`];
      if (!M) throw new Error(`unknown kind ${doc.apiVersion} ${doc.kind}`);
      new M(doc).validate();
      if (doc.spec?.template?.spec) {
        // a pod template: StatefulSet, Job, (Deployment, ...)
        const name = doc.metadata.name;
        const t = doc.spec.template;
        pods.push({ what: `${doc.kind} ${name}`, spec: t.spec, meta: t.metadata, labels: t.metadata?.labels,
          kind: doc.kind, job: jobOfArgs(t.spec) ?? name });
        if (doc.kind === 'StatefulSet') replicas[name] = doc.spec.replicas;
        if (doc.kind === 'Job') {
          // a task's address is NAME-I.NAME: an Indexed Job's pod NAME-I in
          // the subdomain NAME (the headless Service), all running at once
          replicas[name] = doc.spec.completions;
          if (doc.spec.completionMode !== 'Indexed')
            throw new Error(`Job ${name}: completionMode must be Indexed (its pods' names and task indices)`);
          if (t.spec.subdomain !== name)
            throw new Error(`Job ${name}: spec.template.spec.subdomain must be ${name} (is ${t.spec.subdomain})`);
          if (doc.spec.parallelism !== doc.spec.completions)
            throw new Error(`Job ${name}: parallelism ${doc.spec.parallelism} is not its completions ${doc.spec.completions}`);
        }
      }
      if (doc.kind === 'ConfigMap' && doc.data?.['cluster.json'])
        spec = JSON.parse(doc.data['cluster.json']);
    });
  });
  if (spec)
    check(`${file} cluster spec`, () => {
      for (const [job, tasks] of Object.entries(spec)) {
        if (job === 'replication' || job === 'security') continue; // not jobs
        if (replicas[job] !== undefined && replicas[job] !== tasks.length)
          throw new Error(`job ${job} has ${tasks.length} tasks but its StatefulSet or Job runs ${replicas[job]}`);
        tasks.forEach((a, k) => {
          if (!a.startsWith(`${job}-${k}.${job}:`))
            throw new Error(`${job}/${k} is ${a}, not the pod ${job}-${k} of Service ${job}`);
        });
      }
    });
  if (secure) {
    // the jobs: the cluster spec's (StatefulSets), or the TFJob's replica types
    const jobs = spec ? Object.keys(spec) : pods.filter((p) => p.tfjob).map((p) => p.job);
    pods.forEach((p) => (p.role = roleOf(jobs, p.job)));
    secureChecks(file, text, docs, pods);
  }
  for (const p of pods)
    for (const e of podSecurity(p.what, p.meta, p.spec))
      check(file, () => {
        throw new Error(e);
      });
  for (const e of deployChecks(docs, pods))
    check(file, () => {
      throw new Error(e);
    });
  for (const e of spec ? replicationChecks(docs, spec, pods) : [])
    check(file, () => {
      throw new Error(e);
    });
  if (!failed)
    console.log(`ok ${file}: ${docs.length} documents, ${pods.length} pod templates restricted${secure ? ' (secure)' : ''}`);
}
process.exit(failed ? 1 : 0);
