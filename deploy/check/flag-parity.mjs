// The compose file, its GPU override and the rendered k8s overlays must start
// the same processes with the same flags (addresses and indexes aside), and
// each must be self-consistent: shard indexes 0..S-1 with S = --num_shards,
// worker indexes 0..W-1 with W = --num_workers, --servers listing the shards
// in index order on their --listen port, k8s replicas/completions = S/W, and
// container ports = the ports the flags listen on.
// usage: node flag-parity.mjs compose.yml compose.gpu.yml k8s-cpu.yaml k8s-gpu.yaml
import fs from 'node:fs';
import YAML from 'yaml';

const [composeFile, gpuFile, cpuK8s, gpuK8s] = process.argv.slice(2);
const errs = [];
const flags = argv => Object.fromEntries(argv.filter(a => a.startsWith('--'))
  .map(a => { const i = a.indexOf('='); return i < 0 ? [a.slice(2), 'true'] : [a.slice(2, i), a.slice(i + 1)]; }));
const port = addr => addr?.split(':').pop();
// Flags that differ by design between the two deployments.
const PER_PROCESS = ['shard_index', 'worker_index', 'servers'];
const strip = f => Object.fromEntries(Object.entries(f).filter(([k]) => !PER_PROCESS.includes(k)));
const same = (a, b, what) => {
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    if (a[k] !== b[k]) errs.push(`${what}: --${k} is ${a[k] ?? '(unset)'} vs ${b[k] ?? '(unset)'}`);
  }
};

// docker-compose: {binary: [{service, flags}]}
function compose(file, base = {}) {
  const doc = YAML.parse(fs.readFileSync(file, 'utf8'), { merge: true });
  const out = { 'ps-server': [], 'ps-worker': [] };
  for (const [name, svc] of Object.entries({ ...base, ...doc.services })) {
    const cmd = doc.services[name]?.command ?? svc.command;
    if (Array.isArray(cmd) && out[cmd[0]]) out[cmd[0]].push({ name, flags: flags(cmd) });
  }
  return out;
}
function checkCompose(c, file) {
  const shards = c['ps-server'], workers = c['ps-worker'];
  if (!shards.length || !workers.length) { errs.push(`${file}: needs ps-server and ps-worker services`); return; }
  const S = Number(shards[0].flags.num_shards), W = Number(workers[0].flags.num_workers);
  const idx = (list, key) => list.map(s => Number(s.flags[key])).sort((a, b) => a - b).join(',');
  if (shards.length !== S || idx(shards, 'shard_index') !== [...Array(S).keys()].join(',')) errs.push(`${file}: shard indexes ${idx(shards, 'shard_index')} for --num_shards=${S}`);
  if (workers.length !== W || idx(workers, 'worker_index') !== [...Array(W).keys()].join(',')) errs.push(`${file}: worker indexes ${idx(workers, 'worker_index')} for --num_workers=${W}`);
  for (const s of shards.slice(1)) same(strip(shards[0].flags), strip(s.flags), `${file} ${shards[0].name} vs ${s.name}`);
  for (const w of workers.slice(1)) same(strip(workers[0].flags), strip(w.flags), `${file} ${workers[0].name} vs ${w.name}`);
  if (shards[0].flags.num_workers !== String(W)) errs.push(`${file}: shards say --num_workers=${shards[0].flags.num_workers}, ${W} workers`);
  const expected = [...shards].sort((a, b) => a.flags.shard_index - b.flags.shard_index)
    .map(s => `${s.name}:${port(s.flags.listen)}`).join(',');
  for (const w of workers) if (w.flags.servers !== expected) errs.push(`${file} ${w.name}: --servers=${w.flags.servers}, shards are ${expected}`);
  return { shard: strip(shards[0].flags), worker: strip(workers[0].flags) };
}

// k8s: flags of the StatefulSet / Job containers with $(VARS) from the ConfigMap.
function k8s(file) {
  const objs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8')).map(d => d.toJS()).filter(Boolean);
  const cms = Object.fromEntries(objs.filter(o => o.kind === 'ConfigMap').map(o => [o.metadata.name, o.data]));
  const pick = kind => {
    const o = objs.find(x => x.kind === kind);
    const c = o.spec.template.spec.containers[0];
    const env = Object.assign({}, ...(c.envFrom ?? []).map(e => cms[e.configMapRef?.name] ?? {}));
    const argv = [...(c.command ?? []), ...(c.args ?? [])].map(a => a.replace(/\$\((\w+)\)/g, (m, v) => env[v] ?? m));
    const ports = Object.fromEntries((c.ports ?? []).map(p => [p.name, String(p.containerPort)]));
    return { o, argv, flags: flags(argv), ports };
  };
  const sts = pick('StatefulSet'), job = pick('Job');
  if (sts.argv[0] !== 'ps-server' || job.argv[0] !== 'ps-worker') errs.push(`${file}: StatefulSet must run ps-server, Job ps-worker`);
  const S = sts.flags.num_shards, W = job.flags.num_workers;
  if (String(sts.o.spec.replicas) !== S) errs.push(`${file}: StatefulSet replicas ${sts.o.spec.replicas}, --num_shards=${S}`);
  if (String(job.o.spec.completions) !== W || String(job.o.spec.parallelism) !== W) errs.push(`${file}: Job completions/parallelism ${job.o.spec.completions}/${job.o.spec.parallelism}, --num_workers=${W}`);
  const expected = [...Array(Number(S)).keys()].map(i => `${sts.o.metadata.name}-${i}.${sts.o.spec.serviceName}:${port(sts.flags.listen)}`).join(',');
  if (job.flags.servers !== expected) errs.push(`${file}: --servers=${job.flags.servers}, shards are ${expected}`);
  if (sts.ports.grpc !== port(sts.flags.listen) || sts.ports.metrics !== port(sts.flags.metrics_listen)) errs.push(`${file}: shard container ports ${JSON.stringify(sts.ports)} vs flags ${sts.flags.listen} ${sts.flags.metrics_listen}`);
  if (job.ports.metrics !== port(job.flags.metrics_listen)) errs.push(`${file}: worker container ports ${JSON.stringify(job.ports)} vs --metrics_listen=${job.flags.metrics_listen}`);
  return { shard: strip(sts.flags), worker: strip(job.flags) };
}

const base = compose(composeFile);
const baseServices = YAML.parse(fs.readFileSync(composeFile, 'utf8'), { merge: true }).services;
const cpu = checkCompose(base, composeFile);
const gpu = checkCompose(compose(gpuFile, baseServices), `${composeFile} + ${gpuFile}`);
const kcpu = k8s(cpuK8s), kgpu = k8s(gpuK8s);
if (cpu && gpu) {
  same(cpu.shard, kcpu.shard, `shard flags: compose vs ${cpuK8s}`);
  same(cpu.worker, kcpu.worker, `worker flags: compose vs ${cpuK8s}`);
  same(gpu.shard, kgpu.shard, `shard flags: compose+gpu vs ${gpuK8s}`);
  same(gpu.worker, kgpu.worker, `worker flags: compose+gpu vs ${gpuK8s}`);
  if (cpu.worker.device !== 'cpu' || gpu.worker.device !== 'cuda') errs.push(`--device: cpu setup has ${cpu.worker.device}, gpu setup has ${gpu.worker.device}`);
}
console.log(errs.length ? 'FAIL flag parity' : `ok   compose, compose+gpu and k8s overlays agree: ${Object.keys(cpu.shard).length} shard flags, ${Object.keys(cpu.worker).length} worker flags`);
errs.forEach(e => console.log(`     ${e}`));
process.exit(errs.length ? 1 : 0);
