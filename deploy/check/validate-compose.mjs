// Validate docker-compose files against the compose-spec JSON schema shipped in dclint, reporting ALL errors,
// plus cross-reference checks that the schema cannot express: named volumes and depends_on targets exist, and a
// `condition: service_healthy` dependency has a healthcheck to wait for (else `up` fails at run time).
// Several files are merged in order, as `docker-compose -f a -f b` does for the keys used here: a later file's
// depends_on, environment and labels add to the earlier ones', its healthcheck keys replace theirs one by one, any
// other key (command, ...) replaces the earlier value.
import fs from 'node:fs'; import path from 'node:path'; import { createRequire } from 'node:module';
import YAML from 'yaml'; import Ajv from 'ajv'; import addFormats from 'ajv-formats';
const require = createRequire(import.meta.url);
const schema = JSON.parse(fs.readFileSync(new URL('./node_modules/dclint/schemas/compose.schema.json', import.meta.url), 'utf8'));
const ajv = new Ajv({ allErrors: true, strict: false }); addFormats(ajv);
delete schema['$schema']; const validate = ajv.compile(schema);
let failed = 0;
// depends_on: [a] = {a: {condition: service_started}}; environment / labels: ["K=V"] = {K: "V"}.
const asMap = v => !Array.isArray(v) ? v : Object.fromEntries(v.map(e => e.includes?.('=')
  ? [e.slice(0, e.indexOf('=')), e.slice(e.indexOf('=') + 1)] : [e, { condition: 'service_started' }]));
const merged = { services: {}, volumes: {} };
for (const f of process.argv.slice(2)) {
  const doc = YAML.parse(fs.readFileSync(f, 'utf8'), { merge: true }); // resolve anchors and << merge keys
  const errs = [];
  if (!validate(doc)) for (const e of validate.errors) errs.push(`${e.instancePath || '/'} ${e.message}${e.params?.additionalProperty ? ` (${e.params.additionalProperty})` : ''}${e.params?.allowedValues ? ` ${JSON.stringify(e.params.allowedValues)}` : ''}`);
  for (const [n, s] of Object.entries(doc?.services ?? {})) {
    const m = { ...merged.services[n], ...s };
    for (const k of ['depends_on', 'environment', 'labels', 'healthcheck']) {
      if (merged.services[n]?.[k] && s[k]) m[k] = { ...asMap(merged.services[n][k]), ...asMap(s[k]) };
    }
    merged.services[n] = m;
  }
  Object.assign(merged.volumes, doc?.volumes);
  const svcs = merged.services, vols = Object.keys(merged.volumes);
  for (const [n, s] of Object.entries(svcs)) {
    for (const v of s.volumes ?? []) { const src = typeof v === 'string' ? v.split(':')[0] : v.source;
      if (src && !/^[.\/~$]/.test(src) && !vols.includes(src)) errs.push(`/services/${n}/volumes named volume "${src}" not declared at top level`); }
    const deps = Array.isArray(s.depends_on) ? s.depends_on : Object.keys(s.depends_on ?? {});
    for (const d of deps) if (!(d in svcs)) errs.push(`/services/${n}/depends_on unknown service "${d}"`);
    for (const [d, c] of Object.entries(Array.isArray(s.depends_on) ? {} : s.depends_on ?? {})) {
      const hc = svcs[d]?.healthcheck;
      if (c?.condition === 'service_healthy' && (!hc?.test || hc.disable || hc.test[0] === 'NONE')) errs.push(`/services/${n}/depends_on "${d}" waits for service_healthy but ${d} has no healthcheck`);
    }
  }
  console.log(`${errs.length ? 'FAIL' : 'ok  '} ${f}`); errs.forEach(e => console.log('   ' + e)); failed += !!errs.length;
}
process.exit(failed ? 1 : 0);
