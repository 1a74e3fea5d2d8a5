// Emit each manifest as a typed object literal and let tsc do excess-property (unknown field) + type checks,
// using kubernetes-models / @kubernetes-models/prometheus-operator interfaces. Covers CRDs too.
// Each error is reported with the Kind/name of the object it is in.
// usage: TC_DIR=scratch node k8s-typecheck.mjs rendered.yaml...
import fs from 'node:fs'; import YAML from 'yaml'; import { execFileSync } from 'node:child_process';
const out = process.env.TC_DIR ?? fs.mkdtempSync('/tmp/k8s-typecheck-'); fs.mkdirSync(out, { recursive: true });
const lines = []; const owner = []; let n = 0;
for (const file of process.argv.slice(2)) for (const doc of YAML.parseAllDocuments(fs.readFileSync(file, 'utf8'))) {
  const o = doc.toJS(); if (!o) continue;
  const [g, v] = o.apiVersion.includes('/') ? o.apiVersion.split('/') : [null, o.apiVersion];
  const mod = g === 'monitoring.coreos.com' ? `@kubernetes-models/prometheus-operator/${g}/${v}/${o.kind}` : `kubernetes-models/${g ? g + '/' : ''}${v}/${o.kind}`;
  const body = `export const r${n}: T${n} = ${JSON.stringify(o, null, 2)};`.split('\n');
  lines.push(`import type { I${o.kind} as T${n} } from '${mod}';`, ...body);
  owner.push(...Array(body.length + 1).fill(`${o.kind}/${o.metadata?.name}`)); n++;
}
fs.writeFileSync(`${out}/manifests.ts`, lines.join('\n') + '\n');
fs.writeFileSync(`${out}/tsconfig.json`, JSON.stringify({ compilerOptions: { strict: true, noEmit: true, module: 'nodenext', moduleResolution: 'nodenext', skipLibCheck: true, typeRoots: [] }, files: ['manifests.ts'] }));
if (!fs.existsSync(`${out}/node_modules`)) fs.symlinkSync(new URL('./node_modules', import.meta.url).pathname, `${out}/node_modules`);
try {
  execFileSync(new URL('./node_modules/.bin/tsc', import.meta.url).pathname, ['-p', out, '--pretty', 'false'], { encoding: 'utf8' });
  console.log(`ok   ${n} objects type-check (no unknown fields)`);
} catch (e) {
  for (const l of `${e.stdout ?? ''}${e.stderr ?? ''}`.split('\n').filter(Boolean)) {
    const m = l.match(/manifests\.ts\((\d+),\d+\): (.*)/);
    console.log(m ? `FAIL ${owner[m[1] - 1] ?? '?'}: ${m[2]}` : l);
  }
  process.exit(1);
}
