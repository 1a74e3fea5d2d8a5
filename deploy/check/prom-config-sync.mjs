// The compose Prometheus of the replicated setup (docker-compose.yml with
// docker-compose.replicated.yml merged over it) must scrape what the
// unreplicated one scrapes, the same way, plus every etcd service:
//   - each compose file's prometheus service loads a config file that exists
//     (its --config.file, found through the service's bind mounts); the
//     override's command is the base one but for --config.file;
//   - the replicated config equals the base config but for added
//     scrape_configs (global, rule_files, ... and every base job unchanged,
//     in order);
//   - the added jobs scrape exactly the etcd services of the merged setup,
//     each on the client address it advertises (scheme included), and nothing else;
//   - every job="..." the alert rules select on is a job of the replicated
//     config (the etcd rules need the job to be called etcd).
// usage: node prom-config-sync.mjs docker-compose.yml docker-compose.replicated.yml alerts.yml
import fs from 'node:fs'; import path from 'node:path'; import { isDeepStrictEqual } from 'node:util'; import YAML from 'yaml';
const [baseFile, repFile, alertsFile] = process.argv.slice(2);
if (!alertsFile) { console.error('usage: prom-config-sync.mjs docker-compose.yml docker-compose.replicated.yml alerts.yml'); process.exit(2); }
const errs = [];
const load = f => YAML.parse(fs.readFileSync(f, 'utf8'), { merge: true });
const base = load(baseFile).services ?? {}, over = load(repFile).services ?? {};
const merged = Object.fromEntries([...new Set([...Object.keys(base), ...Object.keys(over)])]
  .map(n => [n, { ...base[n], ...over[n] }]));
const flag = (argv, f) => argv?.find(a => typeof a === 'string' && a.startsWith(`--${f}=`))?.slice(f.length + 3);

// The Prometheus service: the one whose image is Prometheus.
const promName = Object.keys(base).find(n => /(^|\/)prometheus(:|$)/.test(base[n].image ?? ''));
if (!promName) { console.log(`FAIL ${baseFile}: no Prometheus service (image prom/prometheus)`); process.exit(1); }
// The host file behind a container path, through the service's bind mounts
// (relative to the first compose file's folder, as compose resolves them).
function hostFile(svc, containerPath, composeFile) {
  for (const v of svc.volumes ?? []) {
    const [src, dst] = typeof v === 'string' ? v.split(':') : [v.source, v.target];
    if (!src || !/^[.\/]/.test(src)) continue;
    const rel = path.posix.relative(dst, containerPath);
    if (!rel.startsWith('..') && !path.isAbsolute(rel)) return path.resolve(path.dirname(composeFile), src, rel);
  }
  return null;
}
function config(svc, composeFile, what) {
  const file = flag(svc.command, 'config.file') ?? '/etc/prometheus/prometheus.yml';
  const host = hostFile(svc, file, composeFile);
  if (!host) { errs.push(`${what}: --config.file=${file} is in no bind mount of service ${promName}`); return null; }
  if (!fs.existsSync(host)) { errs.push(`${what}: --config.file=${file} is ${path.relative(process.cwd(), host)}, which does not exist`); return null; }
  return { file: host, cfg: YAML.parse(fs.readFileSync(host, 'utf8')) };
}
const b = config(base[promName], baseFile, baseFile);
const r = config(merged[promName], baseFile, `${baseFile} + ${repFile}`);
const baseCmd = base[promName].command ?? [], repCmd = merged[promName].command ?? [];
const noConfig = argv => argv.filter(a => !a.startsWith('--config.file='));
if (!isDeepStrictEqual(noConfig(baseCmd), noConfig(repCmd))) {
  errs.push(`${repFile} ${promName}: command differs from ${baseFile}'s beyond --config.file: ${JSON.stringify(noConfig(repCmd))} vs ${JSON.stringify(noConfig(baseCmd))}`);
}

// etcd services of the merged setup and the address each advertises to clients.
const etcd = Object.entries(merged).filter(([, s]) => Array.isArray(s.command) && s.command[0] === 'etcd')
  .map(([n, s]) => { const u = new URL((flag(s.command, 'advertise-client-urls') ?? 'http://localhost:2379').split(',')[0]);
    return { name: n, scheme: u.protocol.replace(':', ''), target: `${u.hostname}:${u.port || 2379}` }; });

if (b && r) {
  const rel = f => path.basename(f);
  const bf = rel(b.file), rf = rel(r.file);
  if (etcd.length && b.file === r.file) errs.push(`${repFile}: the replicated setup runs etcd (${etcd.map(e => e.name).join(', ')}) but its Prometheus loads ${bf}, the unreplicated config`);
  for (const k of new Set([...Object.keys(b.cfg), ...Object.keys(r.cfg)])) {
    if (k !== 'scrape_configs' && !isDeepStrictEqual(b.cfg[k], r.cfg[k])) errs.push(`${rf}: ${k} differs from ${bf}'s`);
  }
  const bj = b.cfg.scrape_configs ?? [], rj = r.cfg.scrape_configs ?? [];
  const byName = new Map(rj.map(j => [j.job_name, j]));
  for (const j of bj) {
    if (!byName.has(j.job_name)) errs.push(`${rf}: job ${j.job_name} of ${bf} is missing`);
    else if (!isDeepStrictEqual(j, byName.get(j.job_name))) errs.push(`${rf}: job ${j.job_name} differs from ${bf}'s`);
  }
  const baseNames = bj.map(j => j.job_name);
  const order = rj.map(j => j.job_name).filter(n => baseNames.includes(n));
  if (order.length === baseNames.length && !isDeepStrictEqual(order, baseNames)) errs.push(`${rf}: jobs of ${bf} in another order (${order.join(', ')})`);
  // The added jobs: etcd services only, every one of them.
  const added = rj.filter(j => !baseNames.includes(j.job_name));
  const scraped = new Set();
  for (const j of added) {
    const scheme = j.scheme ?? 'http';
    if (j.metrics_path && j.metrics_path !== '/metrics') errs.push(`${rf}: job ${j.job_name} scrapes ${j.metrics_path}; etcd serves /metrics`);
    for (const t of (j.static_configs ?? []).flatMap(c => c.targets ?? [])) {
      const e = etcd.find(x => x.target === t);
      if (!e) errs.push(`${rf}: job ${j.job_name} target ${t} is not the client address of an etcd service of ${repFile} (${etcd.map(x => x.target).join(', ') || 'none'})`);
      else if (e.scheme !== scheme) errs.push(`${rf}: job ${j.job_name} scrapes ${t} over ${scheme}, etcd ${e.name} serves ${e.scheme}`);
      else scraped.add(t);
    }
  }
  for (const e of etcd) if (!scraped.has(e.target)) errs.push(`${rf}: etcd service ${e.name} (${e.target}) is not scraped`);
  // Jobs the alert rules select on.
  const jobs = new Set(rj.map(j => j.job_name));
  const alerts = YAML.parse(fs.readFileSync(alertsFile, 'utf8')).groups.flatMap(g => g.rules);
  for (const rule of alerts) {
    for (const job of new Set([...(rule.expr ?? '').matchAll(/\bjob\s*=\s*"([^"]+)"/g)].map(m => m[1]))) {
      if (!jobs.has(job)) errs.push(`${path.basename(alertsFile)} ${rule.alert ?? rule.record}: selects job="${job}", which ${rf} does not scrape`);
    }
  }
  if (!errs.length) console.log(`ok   ${rf} = ${bf} (${bj.length} jobs) + ${added.map(j => j.job_name).join(', ')} scraping ${[...scraped].join(', ')}; the alert rules' jobs are all scraped`);
}
if (errs.length) { console.log(`FAIL Prometheus configs of ${path.basename(baseFile)} (+ ${path.basename(repFile)})`); errs.forEach(e => console.log(`     ${e}`)); }
process.exit(errs.length ? 1 : 0);
