// k8s/base/prometheusrule.yaml (Prometheus Operator) must carry exactly the
// groups of prometheus/alerts.yml, the file that promtool checks and tests.
// usage: node rules-sync.mjs alerts.yml prometheusrule.yaml
import fs from 'node:fs'; import { isDeepStrictEqual } from 'node:util'; import YAML from 'yaml';
const [alertsFile, crFile] = process.argv.slice(2);
const want = YAML.parse(fs.readFileSync(alertsFile, 'utf8')).groups;
const have = YAML.parse(fs.readFileSync(crFile, 'utf8')).spec?.groups;
const rules = gs => new Map((gs ?? []).flatMap(g => g.rules.map(r => [`${g.name}/${r.alert ?? r.record}`, r])));
const a = rules(want), b = rules(have), errs = [];
for (const [k, r] of a) if (!isDeepStrictEqual(r, b.get(k))) errs.push(b.has(k) ? `${k} differs` : `${k} missing from ${crFile}`);
for (const k of b.keys()) if (!a.has(k)) errs.push(`${k} is not in ${alertsFile}`);
if (!errs.length && !isDeepStrictEqual(want, have)) errs.push('group names or order differ');
console.log(errs.length ? `FAIL ${crFile} is out of sync with ${alertsFile}` : `ok   ${crFile} = ${alertsFile} (${a.size} rules)`);
errs.forEach(e => console.log(`     ${e}`));
process.exit(errs.length ? 1 : 0);
