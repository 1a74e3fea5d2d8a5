// The compose file, its GPU and replicated overrides and the rendered k8s
// overlays must start the same processes with the same flags (addresses and
// indexes aside), and each must be self-consistent: shard indexes 0..S-1
// with S = --num_shards, worker indexes 0..W-1 with W = --num_workers,
// --servers listing the shards in index order on their --listen port, k8s
// replicas/completions = S/W, and container ports = the ports the flags
// listen on.
// Replication (--replicas=R > 1): R in 2..3 and <= S; shards and workers
// agree on --replicas, --etcd_endpoints and --job, and have --etcd_endpoints;
// a compose shard's --advertise_address is its service name and --listen port
// (k8s-refs.mjs checks the pod DNS name in k8s); every --etcd_endpoints entry
// is an etcd of the setup on its client port, k8s lists every member, and
// etcd's --initial-cluster lists exactly its StatefulSet's pods;
// --lease_ttl_s (default 2) is at least the shortest lease that etcd grants
// with its --heartbeat-interval / --election-timeout (it silently raises a
// shorter TTL to that). The replicated setups run the unreplicated flags
// plus the replication flags only; the secured overlays (cpu-tls,
// replicated-tls), when given, their plain overlay's flags plus TLS flags.
// The shards of every setup open a data port (--data_listen, a declared
// container port in k8s); the secured ones serve it in TLS.
// With SHARDTRAIN_BIN_DIR set, every flag of every setup must also be one
// that the built ps-server / ps-worker / psctl list in --helpfull, and etcd's
// and etcdctl's flags ones their --help lists (when they are on PATH).
// usage: node flag-parity.mjs compose.yml compose.gpu.yml compose.replicated.yml
//          k8s-cpu.yaml k8s-gpu.yaml k8s-replicated.yaml
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import YAML from 'yaml';

const [composeFile, gpuFile, repFile, cpuK8s, gpuK8s, repK8s, cpuTlsK8s, repTlsK8s] = process.argv.slice(2);
if (!repK8s) { console.error('usage: flag-parity.mjs compose.yml compose.gpu.yml compose.replicated.yml k8s-cpu.yaml k8s-gpu.yaml k8s-replicated.yaml [k8s-cpu-tls.yaml k8s-replicated-tls.yaml]'); process.exit(2); }
const errs = [];
const flags = argv => Object.fromEntries(argv.filter(a => a.startsWith('--'))
  .map(a => { const i = a.indexOf('='); return i < 0 ? [a.slice(2), 'true'] : [a.slice(2, i), a.slice(i + 1)]; }));
const port = addr => addr?.replace(/\/$/, '').split(':').pop();
// Flags that differ by design between processes, and those only the replicated setups have.
const PER_PROCESS = ['shard_index', 'worker_index', 'servers', 'advertise_address'];
const REPLICATION = ['replicas', 'etcd_endpoints', 'job', 'lease_ttl_s', 'advertise_address'];
// ... and those only the secured overlays have (k8s-refs.mjs checks their files and etcd's TLS).
const SECURITY = ['tls_cert', 'tls_key', 'tls_ca', 'tls_client_ca', 'tls_peer_ca', 'auth_token_file',
                  'etcd_ca', 'etcd_cert', 'etcd_key'];
const omit = (f, keys) => Object.fromEntries(Object.entries(f).filter(([k]) => !keys.includes(k)));
const strip = f => omit(f, PER_PROCESS);
const same = (a, b, what) => {
  for (const k of new Set([...Object.keys(a), ...Object.keys(b)])) {
    if (a[k] !== b[k]) errs.push(`${what}: --${k} is ${a[k] ?? '(unset)'} vs ${b[k] ?? '(unset)'}`);
  }
};
// Every flag each binary is started with, and where: {binary: {flag: [where]}}.
const used = {};
const use = (argv, where) => {
  if (!Array.isArray(argv) || !argv.length) return;
  const bin = path.basename(argv[0]);
  if (!['ps-server', 'ps-worker', 'psctl', 'etcd', 'etcdctl'].includes(bin)) return;
  for (const k of Object.keys(flags(argv.slice(1)))) ((used[bin] ??= {})[k] ??= new Set()).add(where);
};

// etcd's shortest lease (s): 3/2 of its election timeout in whole heartbeat
// ticks, rounded up to whole seconds (etcdserver: minTTL); 2 s with its defaults.
function etcdTiming(f, where) {
  const hb = Number(f['heartbeat-interval'] ?? 100), el = Number(f['election-timeout'] ?? 1000);
  if (el < 5 * hb) errs.push(`${where}: etcd refuses --election-timeout=${el} below 5 x --heartbeat-interval=${hb}`);
  return Math.ceil(Math.floor(3 * Math.floor(el / hb) / 2) * hb / 1000);
}

// docker-compose: {binary: [{name, flags}]}, etcd services with their client address and timing.
function compose(file, base = {}) {
  const doc = YAML.parse(fs.readFileSync(file, 'utf8'), { merge: true });
  const out = { 'ps-server': [], 'ps-worker': [], etcd: [] };
  for (const [name, svc] of Object.entries({ ...base, ...doc.services })) {
    const cmd = doc.services[name]?.command ?? svc.command;
    const test = doc.services[name]?.healthcheck?.test ?? svc.healthcheck?.test;
    if (Array.isArray(cmd) && cmd[0] in out) out[cmd[0]].push({ name, flags: flags(cmd) });
    use(cmd, `${path.basename(file)} ${name}`);
    if (Array.isArray(test) && test[0] === 'CMD') use(test.slice(1), `${path.basename(file)} ${name} healthcheck`);
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
  // An etcd service is reached by its service name on the port it advertises.
  const etcd = c.etcd.map(e => {
    const adv = (e.flags['advertise-client-urls'] ?? e.flags['listen-client-urls'] ?? 'http://localhost:2379').split(',')[0];
    return { where: `${file} ${e.name}`, members: [`${e.name}:${port(adv)}`], minTtl: etcdTiming(e.flags, `${file} ${e.name}`) };
  });
  checkReplication(file, shards, workers, etcd, s => `${s.name}:${port(s.flags.listen)}`);
  return { shard: strip(shards[0].flags), worker: strip(workers[0].flags) };
}

// shards / workers: [{name, flags}]; etcd: [{where, members: ["host:port"], minTtl}];
// ownAddress(shard): its expected --advertise_address (null: checked elsewhere).
function checkReplication(what, shards, workers, etcd, ownAddress) {
  const R = Number(shards[0].flags.replicas ?? 1), S = Number(shards[0].flags.num_shards);
  if (R === 1) return;
  if (!Number.isInteger(R) || R < 1 || R > 3 || R > S) errs.push(`${what}: --replicas=${shards[0].flags.replicas} must be 1..3 and <= --num_shards=${S}`);
  for (const p of [...shards, ...workers]) {
    if (!p.flags.etcd_endpoints) { errs.push(`${what} ${p.name}: --replicas=${R} needs --etcd_endpoints`); continue; }
    for (const k of ['replicas', 'etcd_endpoints', 'job']) {
      if (p.flags[k] !== shards[0].flags[k]) errs.push(`${what} ${p.name}: --${k}=${p.flags[k] ?? '(unset)'}, shard ${shards[0].name} has ${shards[0].flags[k] ?? '(unset)'}`);
    }
  }
  for (const s of shards) {
    const want = ownAddress(s);
    if (want && s.flags.advertise_address !== want) errs.push(`${what} ${s.name}: --advertise_address=${s.flags.advertise_address ?? '(unset)'}, its own address is ${want}`);
  }
  const endpoints = (shards[0].flags.etcd_endpoints ?? '').split(',').filter(Boolean);
  if (!endpoints.length) return;
  if (!etcd.length) { console.log(`     ${what}: --etcd_endpoints=${endpoints} is an etcd outside this setup (not checked)`); return; }
  const members = etcd.flatMap(e => e.members);
  for (const ep of endpoints) if (!members.includes(ep)) errs.push(`${what}: --etcd_endpoints entry ${ep} is not an etcd client address of this setup (${members.join(', ')})`);
  const missing = members.filter(m => !endpoints.includes(m));
  if (missing.length) errs.push(`${what}: --etcd_endpoints lists ${endpoints.length} of ${members.length} etcd members (missing ${missing.join(', ')}): clients lose etcd with the members they list`);
  const ttl = Number(shards[0].flags.lease_ttl_s ?? 2), minTtl = Math.max(...etcd.map(e => e.minTtl));
  if (ttl < minTtl) errs.push(`${what}: --lease_ttl_s=${ttl} is below etcd's shortest lease ${minTtl} s (${etcd[0].where}: --heartbeat-interval / --election-timeout); etcd would silently grant ${minTtl} s`);
}

// k8s: flags of the StatefulSet / Job containers with $(VARS) from the ConfigMap and the env.
function k8s(file) {
  const objs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8')).map(d => d.toJS()).filter(Boolean);
  const cms = Object.fromEntries(objs.filter(o => o.kind === 'ConfigMap').map(o => [o.metadata.name, o.data]));
  const expand = (o, c) => {
    const env = Object.assign({}, ...(c.envFrom ?? []).map(e => cms[e.configMapRef?.name] ?? {}));
    for (const e of c.env ?? []) if (e.value !== undefined) env[e.name] = e.value;
    return [...(c.command ?? []), ...(c.args ?? [])].map(a => a.replace(/\$\((\w+)\)/g, (m, v) => env[v] ?? m));
  };
  const all = objs.filter(o => o.spec?.template?.spec).map(o => {
    const c = o.spec.template.spec.containers[0];
    const argv = expand(o, c);
    const ports = Object.fromEntries((c.ports ?? []).map(p => [p.name, String(p.containerPort)]));
    for (const x of [...(o.spec.template.spec.initContainers ?? []), ...o.spec.template.spec.containers]) {
      use(x.command?.[0] === 'sh' ? [] : expand(o, x), `${path.basename(file)} ${o.kind}/${o.metadata.name}`);
      for (const q of ['startupProbe', 'readinessProbe', 'livenessProbe']) use(x[q]?.exec?.command, `${path.basename(file)} ${o.kind}/${o.metadata.name} ${q}`);
    }
    // A flag emptied by a component ($(VAR) set to nothing) is as good as unset.
    const set = Object.fromEntries(Object.entries(flags(argv)).filter(([, v]) => v !== ''));
    return { o, argv, flags: set, ports, name: `${o.kind}/${o.metadata.name}` };
  });
  const sts = all.find(x => x.o.kind === 'StatefulSet' && x.argv[0] === 'ps-server');
  const job = all.find(x => x.o.kind === 'Job' && x.argv[0] === 'ps-worker');
  if (!sts || !job) { errs.push(`${file}: needs a StatefulSet running ps-server and a Job running ps-worker`); return; }
  const S = sts.flags.num_shards, W = job.flags.num_workers;
  if (String(sts.o.spec.replicas) !== S) errs.push(`${file}: StatefulSet replicas ${sts.o.spec.replicas}, --num_shards=${S}`);
  if (String(job.o.spec.completions) !== W || String(job.o.spec.parallelism) !== W) errs.push(`${file}: Job completions/parallelism ${job.o.spec.completions}/${job.o.spec.parallelism}, --num_workers=${W}`);
  const expected = [...Array(Number(S)).keys()].map(i => `${sts.o.metadata.name}-${i}.${sts.o.spec.serviceName}:${port(sts.flags.listen)}`).join(',');
  if (job.flags.servers !== expected) errs.push(`${file}: --servers=${job.flags.servers}, shards are ${expected}`);
  if (sts.ports.grpc !== port(sts.flags.listen) || sts.ports.metrics !== port(sts.flags.metrics_listen)) errs.push(`${file}: shard container ports ${JSON.stringify(sts.ports)} vs flags ${sts.flags.listen} ${sts.flags.metrics_listen}`);
  if (sts.flags.data_listen && sts.ports.data !== port(sts.flags.data_listen)) errs.push(`${file}: shard container ports ${JSON.stringify(sts.ports)} vs --data_listen=${sts.flags.data_listen}`);
  if (job.ports.metrics !== port(job.flags.metrics_listen)) errs.push(`${file}: worker container ports ${JSON.stringify(job.ports)} vs --metrics_listen=${job.flags.metrics_listen}`);
  // etcd StatefulSets: members <name>-i.<serviceName>:<client port>, i < replicas.
  const etcd = all.filter(x => x.o.kind === 'StatefulSet' && x.argv[0] === 'etcd').map(e => {
    const n = e.o.spec.replicas ?? 1, base = e.o.metadata.name, svc = e.o.spec.serviceName;
    const pods = [...Array(n).keys()].map(i => `${base}-${i}`);
    const peer = e.ports.peer ?? port(e.flags['listen-peer-urls'] ?? ':2380');
    const peerScheme = (e.flags['listen-peer-urls'] ?? 'http://').split('://')[0];
    const want = pods.map(p => `${p}=${peerScheme}://${p}.${svc}:${peer}`).join(',');
    if (n > 1 && e.flags['initial-cluster'] !== want) errs.push(`${file} ${e.name}: --initial-cluster=${e.flags['initial-cluster'] ?? '(unset)'}, its ${n} pods are ${want}`);
    const client = e.ports.client ?? port(e.flags['listen-client-urls'] ?? ':2379');
    return { where: `${file} ${e.name}`, members: pods.map(p => `${p}.${svc}:${client}`), minTtl: etcdTiming(e.flags, `${file} ${e.name}`) };
  });
  checkReplication(file, [{ name: sts.name, flags: sts.flags }], [{ name: job.name, flags: job.flags }], etcd, () => null);
  return { shard: strip(sts.flags), worker: strip(job.flags) };
}

const base = compose(composeFile);
const baseServices = YAML.parse(fs.readFileSync(composeFile, 'utf8'), { merge: true }).services;
const cpu = checkCompose(base, composeFile);
const gpu = checkCompose(compose(gpuFile, baseServices), `${composeFile} + ${gpuFile}`);
const rep = checkCompose(compose(repFile, baseServices), `${composeFile} + ${repFile}`);
const kcpu = k8s(cpuK8s), kgpu = k8s(gpuK8s), krep = k8s(repK8s);
if (cpu && gpu && rep && kcpu && kgpu && krep) {
  same(cpu.shard, kcpu.shard, `shard flags: compose vs ${cpuK8s}`);
  same(cpu.worker, kcpu.worker, `worker flags: compose vs ${cpuK8s}`);
  same(gpu.shard, kgpu.shard, `shard flags: compose+gpu vs ${gpuK8s}`);
  same(gpu.worker, kgpu.worker, `worker flags: compose+gpu vs ${gpuK8s}`);
  if (cpu.worker.device !== 'cpu' || gpu.worker.device !== 'cuda') errs.push(`--device: cpu setup has ${cpu.worker.device}, gpu setup has ${gpu.worker.device}`);
  for (const [s, f] of [[cpu, composeFile], [gpu, gpuFile], [kcpu, cpuK8s], [kgpu, gpuK8s]]) {
    if ((s.shard.replicas ?? '1') !== '1') errs.push(`${f}: --replicas=${s.shard.replicas} in an unreplicated setup`);
  }
  for (const [s, f] of [[cpu, composeFile], [gpu, gpuFile], [rep, repFile], [kcpu, cpuK8s], [kgpu, gpuK8s], [krep, repK8s]]) {
    if (!s.shard.data_listen) errs.push(`${f}: the plaintext setup's shards open no data port (--data_listen)`);
  }
  same(omit(rep.shard, REPLICATION), cpu.shard, `shard flags: compose+replicated (without replication flags) vs compose`);
  same(omit(rep.worker, REPLICATION), cpu.worker, `worker flags: compose+replicated (without replication flags) vs compose`);
  // etcd addresses differ by design (one compose service, k8s members); each side is checked above.
  same(omit(rep.shard, ['etcd_endpoints']), omit(krep.shard, ['etcd_endpoints']), `shard flags: compose+replicated vs ${repK8s}`);
  same(omit(rep.worker, ['etcd_endpoints']), omit(krep.worker, ['etcd_endpoints']), `worker flags: compose+replicated vs ${repK8s}`);
  if ((rep.shard.replicas ?? '1') === '1') errs.push(`${repFile}: the replicated setup runs --replicas=${rep.shard.replicas ?? '(unset)'}`);
}
// The secured overlays run their plain overlay's flags plus security flags only.
for (const [secured, plain, file, plainFile] of [[cpuTlsK8s && k8s(cpuTlsK8s), kcpu, cpuTlsK8s, cpuK8s],
                                                  [repTlsK8s && k8s(repTlsK8s), krep, repTlsK8s, repK8s]]) {
  if (!secured || !plain) continue;
  if (!secured.shard.data_listen) errs.push(`${file}: the secured setup's shards open no data port (--data_listen; with TLS they serve it in TLS)`);
  same(omit(secured.shard, SECURITY), plain.shard, `shard flags: ${file} (without TLS flags) vs ${plainFile}`);
  same(omit(secured.worker, SECURITY), plain.worker, `worker flags: ${file} (without TLS flags) vs ${plainFile}`);
  if (!SECURITY.some(k => k in secured.shard)) errs.push(`${file}: the secured overlay's shards run no TLS flag`);
}

// The flags exist: the built binaries' --helpfull, etcd's and etcdctl's --help.
let known = 0;
if (process.env.SHARDTRAIN_BIN_DIR) {
  for (const [bin, fl] of Object.entries(used)) {
    const ours = ['ps-server', 'ps-worker', 'psctl'].includes(bin);
    const exe = ours ? path.join(process.env.SHARDTRAIN_BIN_DIR, bin) : bin;
    if (ours && !fs.existsSync(exe)) { errs.push(`${exe} not built`); continue; }
    const r = spawnSync(exe, [ours ? '--helpfull' : '--help'], { encoding: 'utf8', timeout: 10000 });
    if (r.error) { console.log(`     ${bin}: not on PATH, its flags not checked`); continue; }
    const have = new Set([...`${r.stdout}${r.stderr}`.matchAll(/^\s+(?:-\w, )?--([a-z0-9_-]+)/gm)].map(m => m[1]));
    for (const [f, where] of Object.entries(fl)) {
      known++;
      if (!have.has(f)) errs.push(`${bin} has no flag --${f} (used by ${[...where].join(', ')})`);
    }
  }
} else {
  console.log('     SHARDTRAIN_BIN_DIR unset: flags not checked against the binaries');
}
const count = (s, keys) => Object.keys(s ?? {}).filter(k => keys(k)).length;
console.log(errs.length ? 'FAIL flag parity' : `ok   compose (+gpu, +replicated) and k8s overlays agree: ${count(cpu.shard, () => true)} shard flags, ${count(cpu.worker, () => true)} worker flags, replication flags ${count(krep.shard, k => REPLICATION.includes(k))} (shards) / ${count(krep.worker, k => REPLICATION.includes(k))} (workers); ${known} flag uses exist in the binaries`);
errs.forEach(e => console.log(`     ${e}`));
process.exit(errs.length ? 1 : 0);
