// A manifest with one document changed, for test_k8s.sh's negative checks:
//   node mutate.mjs IN OUT KIND/NAME PATH=JSON...
// sets PATH (dot-separated keys and array indices, from the document of
// that kind and name; [KEY] for a key with dots) to the JSON value,
// creating objects on the way; PATH= (empty) deletes it.  For example
// spec.template.metadata.annotations[prometheus.io/port]="9101"
import fs from 'node:fs';
import yaml from 'js-yaml';

const [input, output, target, ...sets] = process.argv.slice(2);
if (!target || sets.length === 0) {
  console.error('usage: node mutate.mjs IN OUT KIND/NAME PATH=JSON...');
  process.exit(2);
}
const docs = yaml.loadAll(fs.readFileSync(input, 'utf8')).filter((d) => d != null);
const doc = docs.find((d) => `${d.kind}/${d.metadata?.name}` === target);
if (!doc) {
  console.error(`mutate: no ${target} in ${input}`);
  process.exit(1);
}
for (const s of sets) {
  const eq = s.indexOf('=');
  const keys = [...s.slice(0, eq).matchAll(/\[([^\]]*)\]|[^.[\]]+/g)].map((m) => m[1] ?? m[0]);
  const raw = s.slice(eq + 1);
  let o = doc;
  for (const k of keys.slice(0, -1)) o = o[k] ??= {};
  const last = keys[keys.length - 1];
  if (raw === '') delete o[last];
  else o[last] = JSON.parse(raw);
}
fs.writeFileSync(output, docs.map((d) => yaml.dump(d, { lineWidth: -1 })).join('---\n'));
