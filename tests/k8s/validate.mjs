// Validates Kubernetes manifests offline against the API schemas
// (the npm package kubernetes-models; no cluster, no kubectl server).
//   node validate.mjs FILE...
// Every document must be a kind this script knows; a TFJob's pod
// templates are checked as core/v1 pod templates.  The paramserver
// cluster spec in a ConfigMap must name as many tasks as the StatefulSets
// run.  Prints "ok FILE: N documents" or the errors, and exits 1 on any.
//   node validate.mjs --secure FILE...
// also checks what a secure variant promises (secureChecks below).
import fs from 'node:fs';
import yaml from 'js-yaml';
import { StatefulSet } from 'kubernetes-models/apps/v1';
import { ConfigMap, PersistentVolumeClaim, PodTemplate, Service } from 'kubernetes-models/v1';

const models = {
  'apps/v1 StatefulSet': StatefulSet,
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
            job: role.toLowerCase(), tfjob: true });
        return tfjob(file, doc);
      }
      const M = models[`${doc.apiVersion} ${doc.kind}`];
      if (!M) throw new Error(`unknown kind ${doc.apiVersion} ${doc.kind}`);
      new M(doc).validate();
      if (doc.kind === 'StatefulSet') {
        replicas[doc.metadata.name] = doc.spec.replicas;
        const ps = doc.spec.template.spec;
        pods.push({ what: `StatefulSet ${doc.metadata.name}`, spec: ps, job: jobOfArgs(ps) ?? doc.metadata.name });
      }
      if (doc.kind === 'ConfigMap' && doc.data?.['cluster.json'])
        spec = JSON.parse(doc.data['cluster.json']);
    });
  });
  if (spec)
    check(`${file} cluster spec`, () => {
      for (const [job, tasks] of Object.entries(spec)) {
        if (replicas[job] !== undefined && replicas[job] !== tasks.length)
          throw new Error(`job ${job} has ${tasks.length} tasks but its StatefulSet runs ${replicas[job]}`);
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
  if (!failed) console.log(`ok ${file}: ${docs.length} documents${secure ? ' (secure)' : ''}`);
}
process.exit(failed ? 1 : 0);
