// The pods of a manifest as local processes, for test_k8s.sh: no cluster,
// no container engine, but the manifest's own commands, probes, mounts and
// Secrets, so that what a pod runs is what the test runs.
//   node localpods.mjs MANIFEST OUTDIR SECRETS_DIR
// For every pod of every StatefulSet (replicas), Indexed Job (completions)
// and TFJob (replica types)
// writes OUTDIR/POD/run (its container), OUTDIR/POD/readiness and
// OUTDIR/POD/liveness (its exec probes), and one line "POD JOB INDEX" in
// OUTDIR/pods (ps first) and "HOST" in OUTDIR/ps-hosts: the names the
// cluster would give the ps (TFJob: namespace default).  The stand-ins:
//  - the pod network: every task of the cluster spec (the ConfigMap's
//    cluster.json, or the TF_CONFIG the TFJob operator would pass) is
//    127.0.0.1 at a free port, and 127.0.0.1:2222 inside a pod (its own
//    gRPC port) is that pod's port; --metrics-port N becomes 0;
//  - volumes: a ConfigMap's keys and a Secret's files (SECRETS_DIR/NAME/KEY,
//    with the volume's mode) are copied into OUTDIR/POD/vol/NAME; a
//    PersistentVolumeClaim is OUTDIR/pvc/CLAIM, shared; each mountPath in
//    the commands becomes that directory;
//  - /usr/bin/ps-server, ps-worker and psctl are $PS_SERVER, $PS_WORKER,
//    $PSCTL; the environment is the container's env, HOSTNAME (the pod's
//    name), JOB_COMPLETION_INDEX (an Indexed Job's pod) and TF_CONFIG only.
// $WORKER_ARGS, if set, is appended to every ps-worker command (a short run).
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import yaml from 'js-yaml';

const [manifest, out, secrets] = process.argv.slice(2).map((a) => a && path.resolve(a));
if (!secrets) {
  console.error('usage: node localpods.mjs MANIFEST OUTDIR SECRETS_DIR');
  process.exit(2);
}
const die = (msg) => {
  console.error(`localpods: ${manifest}: ${msg}`);
  process.exit(1);
};
const docs = yaml.loadAll(fs.readFileSync(manifest, 'utf8')).filter((d) => d != null);
const programs = {
  '/usr/bin/ps-server': process.env.PS_SERVER,
  '/usr/bin/ps-worker': process.env.PS_WORKER,
  '/usr/bin/psctl': process.env.PSCTL,
};
const configMaps = Object.fromEntries(
  docs.filter((d) => d.kind === 'ConfigMap').map((d) => [d.metadata.name, d.data ?? {}]));

// free ports: listen on port 0, note it, close (all open at once: distinct)
async function freePorts(n) {
  const listen = () =>
    new Promise((ok) => {
      const s = net.createServer();
      s.listen(0, '127.0.0.1', () => ok(s));
    });
  const servers = await Promise.all(Array.from({ length: n }, listen));
  const ports = servers.map((s) => s.address().port);
  await Promise.all(servers.map((s) => new Promise((ok) => s.close(ok))));
  return ports;
}

// pods: {name, job, index, spec (pod spec), env (extra)}; tasks: "host:port" -> port
const pods = [];
const tasks = {};
const psHosts = [];
for (const d of docs) {
  if (d.kind === 'StatefulSet' || d.kind === 'Job') {
    const spec = JSON.parse(configMaps['paramserver-cluster']?.['cluster.json'] ?? 'null');
    if (!spec) die(`${d.kind} ${d.metadata.name} without the ConfigMap paramserver-cluster's cluster.json`);
    // a StatefulSet's pods NAME-I; an Indexed Job's too (the hostname), in
    // the subdomain of its Service
    const job = d.kind === 'Job';
    if (job && d.spec.completionMode !== 'Indexed') die(`Job ${d.metadata.name} is not Indexed`);
    const n = job ? d.spec.completions : d.spec.replicas;
    const domain = job ? d.spec.template.spec.subdomain : d.metadata.name;
    for (let i = 0; i < n; i++) {
      const name = `${d.metadata.name}-${i}`;
      const j = Object.keys(spec).find((j) => spec[j][i]?.startsWith(`${name}.${domain}:`));
      if (!j) die(`pod ${name} is in no job of cluster.json`);
      pods.push({ name, job: j, index: i, spec: d.spec.template.spec, addr: spec[j][i], completionIndex: job ? i : undefined });
    }
    for (const a of Object.values(spec).flat()) tasks[a] = 0;
    if (psHosts.length === 0) psHosts.push(...spec.ps.map((a) => a.replace(/:\d+$/, '')));
  } else if (d.kind === 'TFJob') {
    for (const [type, rs] of Object.entries(d.spec.tfReplicaSpecs)) {
      const job = type.toLowerCase();
      for (let i = 0; i < rs.replicas; i++) {
        const name = `${d.metadata.name}-${job}-${i}`;
        const addr = `${name}.default.svc:2222`; // as the operator names them
        pods.push({ name, job, index: i, spec: rs.template.spec, addr, tfjob: true });
        tasks[addr] = 0;
        if (job === 'ps') psHosts.push(addr.replace(/:\d+$/, ''));
      }
    }
  }
}
if (pods.length === 0) die('no StatefulSet, Job or TFJob');
const ports = await freePorts(Object.keys(tasks).length);
Object.keys(tasks).forEach((a, k) => (tasks[a] = ports[k]));
const local = (a) => `127.0.0.1:${tasks[a]}`;
const tfCluster = {};
for (const p of pods.filter((p) => p.tfjob)) (tfCluster[p.job] ??= [])[p.index] = local(p.addr);

const q = (s) => `'${String(s).replaceAll("'", "'\\''")}'`;
const esc = (s) => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
pods.sort((a, b) => (b.job === 'ps') - (a.job === 'ps')); // ps first (a stable sort)
fs.mkdirSync(path.join(out, 'pvc'), { recursive: true });
const listing = [];
for (const p of pods) {
  const dir = path.join(out, p.name);
  fs.mkdirSync(path.join(dir, 'vol'), { recursive: true });
  const own = `127.0.0.1:${tasks[p.addr]}`;
  const rewrite = (text) => {
    for (const a of Object.keys(tasks)) text = text.replaceAll(a, local(a));
    return text.replace(/\b(127\.0\.0\.1|localhost):2222\b/g, own);
  };
  const vols = new Map((p.spec.volumes ?? []).map((v) => [v.name, v]));
  const volDir = (name) => {
    const v = vols.get(name);
    if (!v) die(`${p.name}: no volume ${name}`);
    if (v.persistentVolumeClaim) return path.join(out, 'pvc', v.persistentVolumeClaim.claimName);
    const vd = path.join(dir, 'vol', name);
    if (fs.existsSync(vd)) return vd;
    fs.mkdirSync(vd, { recursive: true });
    if (v.configMap) {
      const data = configMaps[v.configMap.name];
      if (!data) die(`${p.name}: volume ${name}: no ConfigMap ${v.configMap.name} in the manifest`);
      for (const [k, val] of Object.entries(data)) fs.writeFileSync(path.join(vd, k), rewrite(val));
    } else if (v.secret) {
      const sd = path.join(secrets, v.secret.secretName);
      if (!fs.existsSync(sd)) die(`${p.name}: volume ${name}: Secret ${v.secret.secretName} was not created`);
      const items = v.secret.items ?? fs.readdirSync(sd).map((k) => ({ key: k, path: k }));
      for (const it of items) {
        const from = path.join(sd, it.key);
        if (!fs.existsSync(from)) die(`${p.name}: Secret ${v.secret.secretName} has no key ${it.key}`);
        fs.copyFileSync(from, path.join(vd, it.path));
        fs.chmodSync(path.join(vd, it.path), it.mode ?? v.secret.defaultMode ?? 0o644);
      }
    } else if (!v.emptyDir) {
      die(`${p.name}: volume ${name}: only configMap, secret, persistentVolumeClaim, emptyDir`);
    }
    return vd;
  };
  const c = p.spec.containers[0];
  const mounts = {};
  for (const m of c.volumeMounts ?? []) mounts[m.mountPath.replace(/\/$/, '')] = volDir(m.name);
  for (const d of Object.values(mounts)) fs.mkdirSync(d, { recursive: true });
  const subst = { ...mounts, ...programs };
  const keys = Object.keys(subst).sort((a, b) => b.length - a.length).map(esc);
  const re = new RegExp(`(^|[^\\w./-])(${keys.join('|')})(?=/|$|[^\\w.-])`, 'g');
  const fix = (s) =>
    rewrite(s.replace(re, (m, pre, k) => pre + subst[k]))
      .replace(/--metrics-port(\s+|=)\d+/g, (m, sep) => `--metrics-port${sep}0`);
  const argv = (list) => list.map((s, i) => (list[i - 1] === '--metrics-port' ? '0' : fix(s)));
  const env = [`PATH=${process.env.PATH}`, `HOSTNAME=${p.name}`];
  if (p.completionIndex !== undefined) env.push(`JOB_COMPLETION_INDEX=${p.completionIndex}`);
  if (p.tfjob)
    env.push(`TF_CONFIG=${JSON.stringify({ cluster: tfCluster, task: { type: p.job, index: p.index } })}`);
  for (const e of c.env ?? []) {
    if (e.value === undefined) die(`${p.name}: env ${e.name}: only value`);
    env.push(`${e.name}=${fix(e.value)}`);
  }
  const script = (cmd) => `#!/bin/sh\nexec env -i ${env.map(q).join(' ')} ${cmd.map(q).join(' ')}\n`;
  let cmd = argv([...(c.command ?? []), ...(c.args ?? [])]);
  if (cmd.length === 0) die(`${p.name}: no command (the image's entrypoint is not known here)`);
  const extra = process.env.WORKER_ARGS;
  if (extra && cmd.some((w) => w.includes(programs['/usr/bin/ps-worker']))) {
    if (/(^|\/)sh$/.test(cmd[0]) && cmd[1] === '-c') cmd[2] += ` ${extra}`;
    else cmd = cmd.concat(extra.split(/\s+/).filter(Boolean));
  }
  fs.writeFileSync(path.join(dir, 'run'), script(cmd), { mode: 0o755 });
  for (const probe of ['readiness', 'liveness']) {
    const pr = c[`${probe}Probe`];
    if (pr?.exec) fs.writeFileSync(path.join(dir, probe), script(argv(pr.exec.command)), { mode: 0o755 });
  }
  listing.push(`${p.name} ${p.job} ${p.index}`);
}
fs.writeFileSync(path.join(out, 'pods'), listing.join('\n') + '\n');
fs.writeFileSync(path.join(out, 'ps-hosts'), psHosts.join('\n') + '\n');
