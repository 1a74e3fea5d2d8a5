// Turns a rendered overlay's etcd StatefulSet and its clients into command
// lines on 127.0.0.1, for k8s-etcd-live.sh: every member's container command
// and args with only its addresses, ports and paths changed (etcd-N.etcd and
// 0.0.0.0 -> 127.0.0.1, each member's client / peer / metrics port -> the
// ports given, the data dir -> DATA/etcd-N, the etcd-tls mount -> CERTS);
// the ps-server container's --etcd_* flags and the wait-for-etcd init
// container's script and environment (ConfigMap and env), changed the same
// way. Prints bash: arrays member_0.. (argv), health_0.. (the readiness
// probe's URL), shard_etcd_flags (argv tail), wait_script and wait_env.
// usage: node k8s-etcd-plan.mjs RENDERED.yaml CERTS DATA PORTS
//   PORTS: client,peer,metrics per member, members separated by ';'
import fs from 'node:fs'; import YAML from 'yaml';

const [file, certs, data, portList] = process.argv.slice(2);
if (!portList) { console.error('usage: node k8s-etcd-plan.mjs RENDERED.yaml CERTS DATA PORTS'); process.exit(2); }
const objs = YAML.parseAllDocuments(fs.readFileSync(file, 'utf8')).map(d => d.toJS()).filter(Boolean);
const cms = Object.fromEntries(objs.filter(o => o.kind === 'ConfigMap').map(o => [o.metadata.name, o.data ?? {}]));
const die = m => { console.error(`k8s-etcd-plan: ${m}`); process.exit(1); };
const etcd = objs.find(o => o.kind === 'StatefulSet' && o.spec.template.spec.containers.some(c => c.command?.[0] === 'etcd'));
const shards = objs.find(o => o.kind === 'StatefulSet' && o.metadata.name === 'ps-server');
if (!etcd || !shards) die(`${file} has no etcd StatefulSet or no ps-server StatefulSet`);
const container = etcd.spec.template.spec.containers.find(c => c.command?.[0] === 'etcd');
const named = Object.fromEntries((container.ports ?? []).map(p => [String(p.containerPort), p.name]));
const ports = portList.split(';').map(m => { const [client, peer, metrics] = m.split(',').map(Number); return { client, peer, metrics }; });
if (ports.length !== (etcd.spec.replicas ?? 1)) die(`${ports.length} port triples for ${etcd.spec.replicas} members`);
const mount = (container.volumeMounts ?? []).find(m => m.name === 'etcd-tls')?.mountPath ?? '/etc/shardtrain/etcd-tls';
const dataMount = (container.volumeMounts ?? []).find(m => m.name === 'etcd-data')?.mountPath;
const base = etcd.metadata.name, svc = etcd.spec.serviceName;

// One member's (or a client's: self -1) view of an address: host and port mapped.
const local = (s, self) => s.replace(new RegExp(`(0\\.0\\.0\\.0|${base}-(\\d+)\\.${svc}):(\\d+)`, 'g'), (m, host, n, port) => {
  const i = n === undefined ? self : Number(n), kind = named[port];
  if (i < 0 || !ports[i] || !kind) die(`cannot map ${m} (member ${i}, port ${port})`);
  return `127.0.0.1:${ports[i][kind]}`;
}).replaceAll(`${mount}/`, `${certs}/`);
const env = (c, vars) => {
  const out = Object.assign({}, ...(c.envFrom ?? []).map(e => cms[e.configMapRef?.name] ?? {}));
  for (const e of c.env ?? []) out[e.name] = e.value ?? (e.valueFrom?.fieldRef?.fieldPath === 'metadata.name' ? vars.POD_NAME : undefined);
  return out;
};
const expand = (s, vars) => s.replace(/\$\((\w+)\)/g, (m, v) => vars[v] ?? m);
const q = s => `'${String(s).replaceAll("'", `'\\''`)}'`;
const out = [];
ports.forEach((p, i) => {
  const vars = env(container, { POD_NAME: `${base}-${i}` });
  const argv = [...container.command, ...(container.args ?? [])].map(a => {
    a = local(expand(a, vars), i);
    return dataMount ? a.replace(`=${dataMount}`, `=${data}/${base}-${i}`) : a;
  });
  out.push(`member_${i}=(${argv.map(q).join(' ')})`);
  const probe = container.readinessProbe?.httpGet;
  if (probe) out.push(`health_${i}=${q(`http://127.0.0.1:${p[named[String(probe.port)] ? named[String(probe.port)] : probe.port]}${probe.path}`)}`);
});
const sc = shards.spec.template.spec.containers.find(c => c.command?.[0] === 'ps-server');
const svars = env(sc, { POD_NAME: 'ps-server-0' });
const flags = [...(sc.command ?? []), ...(sc.args ?? [])].map(a => expand(a, svars))
  .filter(a => /^--(etcd_\w+|job)=/.test(a)).map(a => local(a, -1));
out.push(`shard_etcd_flags=(${flags.map(q).join(' ')})`);
const wait = (shards.spec.template.spec.initContainers ?? []).find(c => c.name === 'wait-for-etcd');
if (!wait) die('ps-server has no wait-for-etcd init container');
const wenv = env(wait, {});
out.push(`wait_script=${q(wait.command[2])}`);
// Only what the script and etcdctl read (the ConfigMap also holds the training's settings).
const wanted = ([k, v]) => v !== undefined && (k.startsWith('ETCDCTL_') || wait.command[2].includes(`$${k}`));
out.push(`wait_env=(${Object.entries(wenv).filter(wanted).map(([k, v]) => q(`${k}=${local(v, -1)}`)).join(' ')})`);
console.log(out.join('\n'));
