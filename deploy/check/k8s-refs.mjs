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
//     volumeClaimTemplate), or a file flag (--tls_cert,
//     --tls_key, --tls_ca, --tls_client_ca, --auth_token_file) in a
//     container's command, args or exec probes whose path lies under none of
//     that container's mounts (the process then fails at start).
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
    for (const w of words) {
      for (const [, flag, path] of w.matchAll(/--(tls_cert|tls_key|tls_ca|tls_client_ca|auth_token_file)=(\S+)/g)) {
        if (!mounts.some(m => path.startsWith(m.mountPath.replace(/\/$/, '') + '/'))) {
          errs.push(`${where}: --${flag}=${path} is under none of the container's volumeMounts`);
        }
      }
    }
  }
}

for (const o of objs.filter(o => o.kind === 'StatefulSet')) {
  const svc = objs.find(s => s.kind === 'Service' && s.metadata.name === o.spec.serviceName);
  if (!svc || svc.spec.clusterIP !== 'None') errs.push(`${id(o)}: serviceName "${o.spec.serviceName}" is not a headless Service`);
}

console.log(errs.length ? `FAIL ${process.argv[2]}` : `ok   ${objs.length} objects: selectors, ports, ConfigMaps, $(VARS), volumes and file flags resolve`);
errs.forEach(e => console.log(`     ${e}`));
process.exit(errs.length ? 1 : 0);
