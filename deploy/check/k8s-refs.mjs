// Cross-references in rendered Kubernetes manifests that no schema can see,
// each a mistake that deploys cleanly and then does nothing:
//   - a Service / PodMonitor / NetworkPolicy / PodDisruptionBudget selector
//     that matches no pod template (no endpoints, no targets, no protection);
//   - a NetworkPolicy ingress podSelector (same namespace) that matches no pod
//     template, which silently blocks the peers it meant to admit;
//   - a named port (Service targetPort, PodMonitor port, probe port) that the
//     selected pods do not declare;
//   - envFrom / configMapKeyRef naming a ConfigMap that is not rendered;
//   - a $(VAR) in command/args that no env entry defines (Kubernetes then
//     passes the text "$(VAR)" through unchanged);
//   - a StatefulSet whose serviceName is not a headless Service;
//   - a volumeMount naming no volume of its pod (nor a StatefulSet's
//     volumeClaimTemplate), or a file flag (--tls_*, --auth_token_file,
//     --etcd_ca/cert/key, etcd's --cert-file, --peer-key-file, ...) in a
//     container's command, args or exec probes, or etcdctl's ETCDCTL_CACERT
//     / _CERT / _KEY, whose path lies under none of that container's mounts
//     (the process then fails at start);
//   - one image repository run with different tags (a component's containers
//     missed the overlay's `images:` tag: etcd or an init container from
//     another build than the shards);
//   - a connection that a flag names (--servers, and each shard's data port
//     its --data_listen names on the same host, --etcd_endpoints, etcd's
//     --initial-cluster: from this pod; --advertise_address, etcd's
//     --initial-advertise-peer-urls: from the other pods of its StatefulSet)
//     to a pod of this render, on a port that pod does not declare or that
//     the NetworkPolicies selecting that pod do not admit from the caller
//     (the call then times out at run time, only where the CNI enforces
//     NetworkPolicy); and an own-address flag (--advertise_address, etcd's
//     --advertise-client-urls / --initial-advertise-peer-urls) that does not
//     name the pod itself, evaluated for every pod of a StatefulSet with
//     $(VARS) expanded from the ConfigMaps and the downward API. Hosts of no rendered Service (an
//     external etcd) are not checked;
//   - TLS to etcd that cannot connect: a client (--etcd_endpoints, or
//     etcdctl in its pod's init containers, ETCDCTL_*) without a CA for an
//     etcd that serves https, with one for a plain one, or without a
//     certificate for an etcd with --client-cert-auth; an etcd whose client
//     or peer URLs mix http and https, or that serves https without its
//     certificate and key, or checks certificates without a CA.
// usage: node k8s-refs.mjs rendered.yaml
import fs from 'node:fs';
import YAML from 'yaml';

const objs = YAML.parseAllDocuments(fs.readFileSync(process.argv[2], 'utf8')).map(d => d.toJS()).filter(Boolean);
const errs = [];
const id = o => `${o.kind}/${o.metadata?.name}`;
const configMaps = new Map(objs.filter(o => o.kind === 'ConfigMap').map(o => [o.metadata.name, o.data ?? {}]));

// Pod templates with the ports their containers declare.
const pods = [];
for (const o of objs) {
  const t = o.spec?.template;
  if (!t?.spec) continue;
  pods.push({ owner: o, labels: t.metadata?.labels ?? {}, spec: t.spec,
              ports: new Set(t.spec.containers.flatMap(c => (c.ports ?? []).flatMap(p => [p.name, p.containerPort]))) });
}
const matches = (sel, labels) => sel && Object.entries(sel).every(([k, v]) => labels[k] === v);
const selected = sel => pods.filter(p => matches(sel, p.labels));

for (const o of objs) {
  const sel = { Service: o.spec?.selector, PodMonitor: o.spec?.selector?.matchLabels,
                NetworkPolicy: o.spec?.podSelector?.matchLabels,
                PodDisruptionBudget: o.spec?.selector?.matchLabels }[o.kind];
  if (sel === undefined) continue;
  const hit = selected(sel);
  if (!hit.length) { errs.push(`${id(o)}: selector ${JSON.stringify(sel)} matches no pod template`); continue; }
  for (const rule of o.kind === 'NetworkPolicy' ? o.spec.ingress ?? [] : []) {
    for (const peer of rule.from ?? []) {
      if (peer.podSelector && !peer.namespaceSelector && !selected(peer.podSelector.matchLabels).length) {
        errs.push(`${id(o)}: ingress peer ${JSON.stringify(peer.podSelector.matchLabels)} matches no pod template`);
      }
    }
  }
  const ports = o.kind === 'Service' ? (o.spec.ports ?? []).map(p => p.targetPort ?? p.port)
    : o.kind === 'PodMonitor' ? (o.spec.podMetricsEndpoints ?? []).map(e => e.port) : [];
  for (const port of ports) for (const p of hit) {
    if (!p.ports.has(port)) errs.push(`${id(o)}: port "${port}" is not declared by ${id(p.owner)}`);
  }
}

// Flags (ours, etcd's) and etcdctl's environment that name a file the process reads at start.
const FILE_FLAGS = new RegExp('--(tls_cert|tls_key|tls_ca|tls_client_ca|auth_token_file|etcd_ca|etcd_cert|etcd_key'
  + '|cert-file|key-file|trusted-ca-file|peer-cert-file|peer-key-file|peer-trusted-ca-file)=(\\S+)', 'g');
const FILE_ENV = ['ETCDCTL_CACERT', 'ETCDCTL_CERT', 'ETCDCTL_KEY'];
for (const p of pods) {
  const indexed = p.owner.kind === 'Job' && p.owner.spec.completionMode === 'Indexed';
  for (const c of [...(p.spec.initContainers ?? []), ...p.spec.containers]) {
    const where = `${id(p.owner)} container ${c.name}`;
    const vars = new Set(indexed ? ['JOB_COMPLETION_INDEX'] : []);
    for (const e of c.env ?? []) {
      vars.add(e.name);
      const ref = e.valueFrom?.configMapKeyRef;
      if (ref && !(configMaps.get(ref.name) ?? {})[ref.key]) errs.push(`${where}: env ${e.name}: no ConfigMap ${ref.name} key ${ref.key}`);
    }
    for (const e of c.envFrom ?? []) {
      const name = e.configMapRef?.name;
      if (!name) continue;
      if (!configMaps.has(name)) errs.push(`${where}: envFrom ConfigMap ${name} is not rendered`);
      else Object.keys(configMaps.get(name)).forEach(k => vars.add((e.prefix ?? '') + k));
    }
    for (const a of [...(c.command ?? []), ...(c.args ?? [])]) {
      for (const [, v] of a.matchAll(/(?<!\$)\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g)) {
        if (!vars.has(v)) errs.push(`${where}: $(${v}) in "${a}" is defined by no env entry`);
      }
    }
    for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
      const port = c[probe]?.grpc?.port ?? c[probe]?.httpGet?.port ?? c[probe]?.tcpSocket?.port;
      if (port !== undefined && !(c.ports ?? []).some(q => q.name === port || q.containerPort === port)) {
        errs.push(`${where}: ${probe} port ${port} is not a container port`);
      }
    }
    const volumes = new Set([...(p.spec.volumes ?? []).map(v => v.name),
                             ...(p.owner.spec.volumeClaimTemplates ?? []).map(v => v.metadata?.name)]);
    const mounts = c.volumeMounts ?? [];
    for (const m of mounts) {
      if (!volumes.has(m.name)) errs.push(`${where}: volumeMount "${m.name}" names no volume of the pod`);
    }
    const words = [...(c.command ?? []), ...(c.args ?? []),
                   ...['startupProbe', 'readinessProbe', 'livenessProbe'].flatMap(q => c[q]?.exec?.command ?? [])];
    const files = words.flatMap(w => [...w.matchAll(FILE_FLAGS)].map(([, flag, path]) => [`--${flag}`, path]));
    for (const e of c.env ?? []) if (FILE_ENV.includes(e.name) && e.value) files.push([`env ${e.name}`, e.value]);
    for (const [what, path] of files) {
      if (!mounts.some(m => path.startsWith(m.mountPath.replace(/\/$/, '') + '/'))) {
        errs.push(`${where}: ${what}=${path} is under none of the container's volumeMounts`);
      }
    }
  }
}

// One tag per image repository.
const tags = new Map();
for (const p of pods) for (const c of [...(p.spec.initContainers ?? []), ...p.spec.containers]) {
  const [, repo, tag] = c.image.match(/^(.*?)(?::([\w.-]+))?(?:@.*)?$/);
  if (!tags.has(repo)) tags.set(repo, new Map());
  tags.get(repo).set(tag ?? '(none, i.e. latest)', `${id(p.owner)} container ${c.name}`);
}
for (const [repo, t] of tags) if (t.size > 1) errs.push(`image ${repo} runs with ${t.size} tags (an images: tag that missed some containers?): ${[...t].map(([k, w]) => `${k} (${w})`).join(', ')}`);

// Connections named by flags, and the NetworkPolicies on their way.
const services = objs.filter(o => o.kind === 'Service');
const portNumber = (p, port) => {  // a container port of pod template p, by name or number
  for (const c of p.spec.containers) for (const q of c.ports ?? []) if (q.name === port || q.containerPort === Number(port)) return q;
  return null;
};
// host:port -> {pod, port (container port object), index (StatefulSet pod) } or null when not in this render.
const resolve = addr => {
  const m = addr.replace(/^[a-z]+:\/\//, '').match(/^([^:/]+):(\d+)\/?$/);
  if (!m) return { error: `"${addr}" is not host:port` };
  const [, host, port] = m;
  const parts = host.split('.');
  const ns = i => parts.length === i || (parts[i] === objs.find(o => o.kind === 'Namespace')?.metadata.name
    && (parts.length === i + 1 || parts.slice(i + 1).join('.').match(/^svc(\.cluster\.local)?$/)));
  // pod-N.service[.namespace[.svc[.cluster.local]]]: one pod of the StatefulSet governed by that headless Service.
  const sts = objs.find(o => o.kind === 'StatefulSet' && o.spec.serviceName === parts[1] && parts[0].startsWith(o.metadata.name + '-'));
  if (sts && ns(2)) {
    const index = Number(parts[0].slice(sts.metadata.name.length + 1));
    const p = pods.find(q => q.owner === sts);
    if (!(index >= 0 && index < (sts.spec.replicas ?? 1))) return { error: `${host}: ${id(sts)} has no pod ${parts[0]} (replicas ${sts.spec.replicas})` };
    return { pods: [p], port: Number(port), index, owner: sts };
  }
  // service[.namespace...]: the pods it selects, on its targetPort (a headless Service's DNS names the pods: the port is theirs).
  const svc = services.find(o => o.metadata.name === parts[0]);
  if (svc && ns(1)) {
    const sp = svc.spec.clusterIP === 'None' ? null : (svc.spec.ports ?? []).find(q => q.port === Number(port));
    if (svc.spec.clusterIP !== 'None' && !sp) return { error: `${host}: ${id(svc)} has no port ${port}` };
    return { pods: selected(svc.spec.selector), port: sp ? sp.targetPort ?? sp.port : Number(port), owner: svc };
  }
  return null;
};
const admits = (target, source, port) => {  // NetworkPolicy semantics for one namespace, matchLabels selectors
  const pols = objs.filter(o => o.kind === 'NetworkPolicy' && matches(o.spec.podSelector?.matchLabels ?? {}, target.labels)
    && (o.spec.policyTypes ?? ['Ingress']).includes('Ingress'));
  if (!pols.length) return true;
  return pols.some(o => (o.spec.ingress ?? []).some(rule =>
    (!rule.from?.length || rule.from.some(peer => peer.podSelector && !peer.namespaceSelector && !peer.ipBlock
      && matches(peer.podSelector.matchLabels ?? {}, source.labels)))
    && (!rule.ports?.length || rule.ports.some(q => (q.protocol ?? 'TCP') === (port.protocol ?? 'TCP')
      && (q.port === undefined || q.port === port.name || q.port === port.containerPort
          || (q.endPort !== undefined && port.containerPort >= q.port && port.containerPort <= q.endPort))))));
};
// The port a shard's --data_listen opens (its ConfigMaps' $(VARS) expanded), or null: none.
const dataPort = t => {
  for (const c of t.spec.containers) {
    const env = {};
    for (const e of c.envFrom ?? []) Object.assign(env, configMaps.get(e.configMapRef?.name) ?? {});
    for (const a of [...(c.command ?? []), ...(c.args ?? [])]) {
      const m = a.replace(/(?<!\$)\$\(([A-Za-z_]\w*)\)/g, (x, v) => env[v] ?? x).match(/^--data_listen=(.*)$/);
      if (m && m[1] !== '') return m[1].split(':').pop();
    }
  }
  return null;
};
const once = new Set();
const report = e => { if (!once.has(e)) { once.add(e); errs.push(e); } };
// TLS to etcd: what etcd's flags demand, what its clients bring.
const argFlags = c => Object.fromEntries([...(c.command ?? []), ...(c.args ?? [])].filter(a => a.startsWith('--'))
  .map(a => { const i = a.indexOf('='); return i < 0 ? [a.slice(2), 'true'] : [a.slice(2, i), a.slice(i + 1)]; }));
const etcdOf = t => t.spec.containers.find(c => (c.command ?? [])[0] === 'etcd');
const scheme = url => (url ?? 'http://').split('://')[0];
function etcdClientAgrees(p, c, where, t) {  // c (of pod p) names etcd pod t in --etcd_endpoints
  const e = etcdOf(t);
  if (!e) return;
  const ef = argFlags(e), cf = argFlags(c), https = scheme(ef['listen-client-urls']) === 'https';
  // etcd 3.4 asks for a client certificate once it has a CA for them, --client-cert-auth or not.
  const certAuth = ef['client-cert-auth'] === 'true' || Boolean(ef['trusted-ca-file']);
  if (https && !cf.etcd_ca) report(`${where}: ${id(t.owner)} serves https (--listen-client-urls), and this client has no --etcd_ca`);
  if (!https && cf.etcd_ca) report(`${where}: --etcd_ca, but ${id(t.owner)} serves plain http (--listen-client-urls)`);
  if (https && certAuth && !(cf.etcd_cert && cf.etcd_key)) report(`${where}: ${id(t.owner)} demands client certificates (--client-cert-auth, --trusted-ca-file), and this client has no --etcd_cert/--etcd_key`);
  // etcdctl in an init container of the same pod (the wait-for-etcd script): its TLS settings come from ETCDCTL_*.
  for (const ic of p.spec.initContainers ?? []) {
    if (!JSON.stringify([ic.command, ic.args]).includes('etcdctl')) continue;
    const env = new Set((ic.env ?? []).map(v => v.name));
    if (https !== env.has('ETCDCTL_CACERT')) report(`${id(p.owner)} init container ${ic.name}: ${id(t.owner)} serves ${https ? 'https' : 'plain http'}, and its etcdctl ${https ? 'has no' : 'has'} ETCDCTL_CACERT`);
    if (https && certAuth && !(env.has('ETCDCTL_CERT') && env.has('ETCDCTL_KEY'))) report(`${id(p.owner)} init container ${ic.name}: ${id(t.owner)} demands client certificates, and its etcdctl has no ETCDCTL_CERT/ETCDCTL_KEY`);
  }
}
// An etcd's own URLs and certificates agree: one scheme for its client URLs, one for its peer URLs
// (--initial-cluster included); https needs a certificate and key, client-cert-auth a CA.
for (const p of pods) {
  const e = etcdOf(p);
  if (!e) continue;
  const f = argFlags(e), where = `${id(p.owner)} container ${e.name}`;
  for (const [kind, urls, cert, key, auth, ca] of [
    ['client', ['listen-client-urls', 'advertise-client-urls'], 'cert-file', 'key-file', 'client-cert-auth', 'trusted-ca-file'],
    ['peer', ['listen-peer-urls', 'initial-advertise-peer-urls', 'initial-cluster'], 'peer-cert-file', 'peer-key-file', 'peer-client-cert-auth', 'peer-trusted-ca-file']]) {
    // --initial-cluster lists name=URL pairs.
    const schemes = new Set(urls.flatMap(u => (f[u] ?? '').split(',').filter(Boolean)
      .map(x => scheme(u === 'initial-cluster' ? x.slice(x.indexOf('=') + 1) : x))));
    if (schemes.size > 1) report(`${where}: its ${kind} URLs mix ${[...schemes].join(' and ')} (--${urls.join(', --')})`);
    if (schemes.has('https') && !(f[cert] && f[key])) report(`${where}: https ${kind} URLs need --${cert} and --${key}`);
    if (f[auth] === 'true' && !f[ca]) report(`${where}: --${auth} needs --${ca}`);
  }
}

const CONNECT = ['servers', 'etcd_endpoints', 'initial-cluster'];   // this pod calls these
const SELF = ['advertise_address', 'initial-advertise-peer-urls', 'advertise-client-urls'];  // this pod's own address
const PEERS = ['advertise_address', 'initial-advertise-peer-urls'];  // ... which its StatefulSet peers call
for (const p of pods) for (let i = 0; i < (p.owner.kind === 'StatefulSet' ? p.owner.spec.replicas ?? 1 : 1); i++) {
  // Pod i of a StatefulSet (its name and pod-index label from the downward API), or one pod of a Job.
  const podName = p.owner.kind === 'StatefulSet' ? `${p.owner.metadata.name}-${i}` : `${p.owner.metadata.name}-${i}-x`;
  for (const c of p.spec.containers) {
    const where = `${id(p.owner)} container ${c.name}`;
    const env = {};
    for (const e of c.envFrom ?? []) Object.entries(configMaps.get(e.configMapRef?.name) ?? {}).forEach(([k, v]) => { env[(e.prefix ?? '') + k] = v; });
    for (const e of c.env ?? []) {
      const f = e.valueFrom?.fieldRef?.fieldPath;
      env[e.name] = e.value ?? (f === 'metadata.name' ? podName : f?.includes('pod-index') ? String(i) : undefined);
    }
    if (p.owner.kind === 'Job') env.JOB_COMPLETION_INDEX ??= String(i);
    for (const a of [...(c.command ?? []), ...(c.args ?? [])]) {
      const m = a.replace(/(?<!\$)\$\(([A-Za-z_]\w*)\)/g, (x, v) => env[v] ?? x).match(/^--([\w-]+)=(.*)$/);
      if (!m || ![...CONNECT, ...SELF].includes(m[1])) continue;
      const [, flag, value] = m;
      for (const item of value.split(',')) {
        const addr = flag === 'initial-cluster' ? item.slice(item.indexOf('=') + 1) : item;
        const r = resolve(addr);
        if (r?.error) { report(`${where}: --${flag}: ${r.error}`); continue; }
        if (!r) { if (SELF.includes(flag)) report(`${where}: --${flag}=${value} names no pod of this render`); continue; }
        if (SELF.includes(flag) && (r.owner !== p.owner || r.index !== i)) {
          report(`${where}: --${flag}=${value} is not the pod's own address (for pod ${podName} it names ${r.index === undefined ? id(r.owner) : `${r.owner.metadata.name}-${r.index}`})`);
          continue;
        }
        const sources = SELF.includes(flag) && !PEERS.includes(flag) ? [] : [p];
        for (const t of r.pods) {
          const port = portNumber(t, r.port);
          if (!port) { report(`${where}: --${flag}=${item}: port ${r.port} is not a container port of ${id(t.owner)}`); continue; }
          for (const src of sources) if (!admits(t, src, port)) {
            report(`${where}: --${flag}=${item}: no NetworkPolicy admits ${id(src.owner)} pods to ${id(t.owner)} on port ${port.containerPort}`);
          }
          if (flag === 'etcd_endpoints') etcdClientAgrees(p, c, where, t);
          // A shard's answers name its data port; the worker connects there on the same host.
          const data = flag === 'servers' ? dataPort(t) : null;
          if (data === null) continue;
          const dport = portNumber(t, data);
          if (!dport) { report(`${where}: --${flag}=${item}: the data port ${data} (--data_listen) is not a container port of ${id(t.owner)}`); continue; }
          if (!admits(t, p, dport)) report(`${where}: --${flag}=${item}: no NetworkPolicy admits ${id(p.owner)} pods to ${id(t.owner)}'s data port ${dport.containerPort}`);
        }
      }
    }
  }
}

for (const o of objs.filter(o => o.kind === 'StatefulSet')) {
  const svc = objs.find(s => s.kind === 'Service' && s.metadata.name === o.spec.serviceName);
  if (!svc || svc.spec.clusterIP !== 'None') errs.push(`${id(o)}: serviceName "${o.spec.serviceName}" is not a headless Service`);
}

console.log(errs.length ? `FAIL ${process.argv[2]}` : `ok   ${objs.length} objects: selectors, ports, ConfigMaps, $(VARS), volumes and file flags resolve; one tag per image; the flags' connections pass the NetworkPolicies; TLS to etcd agrees`);
errs.forEach(e => console.log(`     ${e}`));
process.exit(errs.length ? 1 : 0);
