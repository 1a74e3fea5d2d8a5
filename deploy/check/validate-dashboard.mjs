// Offline Grafana dashboard JSON validation:
//  1) structural: tsc checks each dashboard against the Dashboard type of @grafana/grafana-foundation-sdk
//     (excess properties = unknown fields, wrong types, bad enum strings, missing required fields), and each
//     panel's `options` / `fieldConfig.defaults.custom` (typed `any` there) against its panel plugin's types;
//  2) semantic: known panel types, unique panel ids, datasource uids exist in provisioning, PromQL of every
//     target parses (promtool).
// usage: WORK_DIR=scratch node validate-dashboard.mjs datasources.yml dashboard.json...
import fs from 'node:fs'; import { execFileSync } from 'node:child_process'; import YAML from 'yaml';
const [dsFile, ...files] = process.argv.slice(2);
const dsUids = new Set(YAML.parse(fs.readFileSync(dsFile, 'utf8')).datasources.map(d => d.uid));
const work = process.env.WORK_DIR ?? fs.mkdtempSync('/tmp/dashcheck-'); fs.mkdirSync(work, { recursive: true });
if (!fs.existsSync(`${work}/node_modules`)) fs.symlinkSync(new URL('./node_modules', import.meta.url).pathname, `${work}/node_modules`);
// Panel plugins whose option types the SDK ships (module name = panel type), and those that also type
// fieldConfig.defaults.custom (the others take none).
const PLUGINS = ['timeseries', 'stat', 'bargauge', 'gauge', 'heatmap', 'table', 'text', 'piechart', 'histogram', 'barchart', 'statetimeline', 'statushistory', 'logs'];
const CUSTOM = ['timeseries', 'heatmap', 'table', 'piechart', 'histogram', 'barchart', 'statetimeline', 'statushistory'];
let failed = 0;
const ts = [`import type { Dashboard } from '@grafana/grafana-foundation-sdk/dashboard';`,
  `import type * as cog from '@grafana/grafana-foundation-sdk/cog';`,
  `import type * as prom from '@grafana/grafana-foundation-sdk/prometheus';`,
  ...PLUGINS.map(p => `import type * as ${p} from '@grafana/grafana-foundation-sdk/${p}';`),
  // JSON holds enum *values*: map string enums to their literal unions; panel targets are Prometheus queries.
  `type J<T> = 0 extends (1 & T) ? any : T extends cog.Dataquery ? J<Omit<prom.Dataquery, '_implementsDataqueryVariant'>>`,
  `  : T extends string ? \`\${T}\` : T extends (infer U)[] ? J<U>[] : T extends object ? { [K in keyof T as T[K] extends Function ? never : K]: J<T[K]> } : T;`,
  // Grafana fills in omitted options with defaults: check names and types, not presence.
  `type P<T> = T extends (infer U)[] ? P<U>[] : T extends object ? { [K in keyof T]?: P<T[K]> } : T;`];
const rules = { groups: [] };
files.forEach((f, i) => {
  const d = JSON.parse(fs.readFileSync(f, 'utf8'));
  ts.push(`// ${f}`, `export const d${i}: J<Dashboard> = ${JSON.stringify(d, null, 1)};`);
  const errs = [], ids = new Set(), panels = (d.panels ?? []).flatMap(p => [p, ...(p.panels ?? [])]);
  const g = { name: `dash${i}`, rules: [] };
  for (const p of panels) {
    if (ids.has(p.id)) errs.push(`panel "${p.title}": duplicate id ${p.id}`); ids.add(p.id);
    if (p.type !== 'row' && !PLUGINS.includes(p.type)) errs.push(`panel "${p.title}": unknown panel type "${p.type}"`);
    if (PLUGINS.includes(p.type)) {
      ts.push(`// ${f} panel ${p.id} "${p.title}"`,
        `export const o${i}_${p.id}: J<P<${p.type}.Options>> = ${JSON.stringify(p.options ?? {})};`,
        `export const c${i}_${p.id}: ${CUSTOM.includes(p.type) ? `J<P<${p.type}.FieldConfig>>` : 'Record<string, never>'} = ${JSON.stringify(p.fieldConfig?.defaults?.custom ?? {})};`);
    }
    for (const ds of [p.datasource, ...(p.targets ?? []).map(t => t.datasource)]) if (ds?.uid && !ds.uid.startsWith('$') && !dsUids.has(ds.uid)) errs.push(`panel "${p.title}": unknown datasource uid "${ds.uid}"`);
    for (const t of p.targets ?? []) if (t.expr) g.rules.push({ record: `dash:p${p.id}_${t.refId}`, expr: t.expr
      .replace(/\$__(rate_interval|interval|range)|\$\{__(rate_interval|interval|range)\}/g, '5m').replace(/\$\{?(\w+)(:\w+)?\}?/g, 'x') });
  }
  rules.groups.push(g);
  if (errs.length) { failed++; console.log(`FAIL ${f}`); errs.forEach(e => console.log('     ' + e)); }
});
fs.writeFileSync(`${work}/dashboards.ts`, ts.join('\n') + '\n');
fs.writeFileSync(`${work}/tsconfig.json`, JSON.stringify({ compilerOptions: { strict: true, noEmit: true, module: 'nodenext', moduleResolution: 'nodenext', skipLibCheck: true, types: [] }, files: ['dashboards.ts'] }));
try { execFileSync(new URL('./node_modules/.bin/tsc', import.meta.url).pathname, ['-p', work, '--pretty', 'false'], { encoding: 'utf8' }); }
catch (e) {  // name the file and the nearest panel title above each error
  failed++; const src = ts.join('\n').split('\n');
  for (const l of `${e.stdout ?? ''}${e.stderr ?? ''}`.split('\n').filter(Boolean)) {
    const m = l.match(/dashboards\.ts\((\d+),\d+\): (.*)/); if (!m) { console.log(l); continue; }
    const above = src.slice(0, m[1]).reverse();
    const where = above.find(x => x.startsWith('// '))?.slice(3), title = above.find(x => /^\s*"title": /.test(x))?.trim();
    console.log(`FAIL ${where}${title && !where.includes(' panel ') ? ` near ${title}` : ''}: ${m[2]}`);
  }
}
fs.writeFileSync(`${work}/promql.rules.yml`, YAML.stringify(rules));
try { execFileSync('promtool', ['check', 'rules', `${work}/promql.rules.yml`], { stdio: ['ignore', 'ignore', 'inherit'] }); } catch { failed++; console.log('FAIL PromQL in dashboard targets (see promtool output above)'); }
console.log(failed ? 'dashboards: FAILED' : `dashboards: ${files.length} ok (types, panel options, datasources, ${rules.groups.reduce((n, g) => n + g.rules.length, 0)} PromQL queries)`);
process.exit(failed ? 1 : 0);
