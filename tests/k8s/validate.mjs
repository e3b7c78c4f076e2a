// Validates Kubernetes manifests offline against the API schemas
// (the npm package kubernetes-models; no cluster, no kubectl server).
//   node validate.mjs FILE...
// Every document must be a kind this script knows; a TFJob's pod
// templates are checked as core/v1 pod templates.  The paramserver
// cluster spec in a ConfigMap must name as many tasks as the StatefulSets
// run.  Prints "ok FILE: N documents" or the errors, and exits 1 on any.
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

for (const file of process.argv.slice(2)) {
  const docs = yaml.loadAll(fs.readFileSync(file, 'utf8')).filter((d) => d != null);
  const replicas = {};
  let spec = null;
  docs.forEach((doc, i) => {
    const what = `${file} document ${i + 1} (${doc.kind} ${doc.metadata?.name})`;
    check(what, () => {
      if (doc.apiVersion === 'kubeflow.org/v1' && doc.kind === 'TFJob') return tfjob(file, doc);
      const M = models[`${doc.apiVersion} ${doc.kind}`];
      if (!M) throw new Error(`unknown kind ${doc.apiVersion} ${doc.kind}`);
      new M(doc).validate();
      if (doc.kind === 'StatefulSet') replicas[doc.metadata.name] = doc.spec.replicas;
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
  if (!failed) console.log(`ok ${file}: ${docs.length} documents`);
}
process.exit(failed ? 1 : 0);
