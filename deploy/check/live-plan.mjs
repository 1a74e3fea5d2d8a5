// Turns docker-compose.yml (with overrides such as docker-compose.replicated.yml
// merged over it) into the command lines the live test runs on 127.0.0.1: the
// compose commands with only addresses, ports, paths and the run's length
// changed. Prints JSON {processes: {service: argv} (shards first),
// healthcheck: the shards' healthcheck argv with its address as @ADDR@,
// etcd: {service: argv} (etcd services, none without the replicated
// override), etcd_healthcheck: theirs, address @ADDR@, prometheus_config:
// the file the compose Prometheus loads}. Placeholders the
// test fills in: @SERVERS@ (a worker's --servers), @PORT@ (a replicated
// shard's --listen and --advertise_address port), @NAME@ (etcd service NAME's
// client address in --etcd_endpoints), @CLIENT_PORT@ / @PEER_PORT@ (etcd's).
// With --prometheus, the compose Prometheus config with its targets replaced.
// usage: node live-plan.mjs compose.yml [override.yml ...] WORKDIR [binary:flag=value ...]
//        node live-plan.mjs --prometheus prometheus.yml alerts.yml targets.json
//          (targets.json: {job: {service: "127.0.0.1:port"}}; a job without targets gets none)
import fs from 'node:fs'; import path from 'node:path'; import YAML from 'yaml';

if (process.argv[2] === '--prometheus') {
  const [promFile, alertsFile, targetsFile] = process.argv.slice(3);
  const cfg = YAML.parse(fs.readFileSync(promFile, 'utf8'));
  const targets = JSON.parse(fs.readFileSync(targetsFile, 'utf8'));
  cfg.global = { ...cfg.global, scrape_interval: '1s', evaluation_interval: '1s' };
  cfg.rule_files = [path.resolve(alertsFile)];
  for (const job of cfg.scrape_configs) {
    // One group per target, labelled like the compose service, so the panels read the same.
    job.static_configs = Object.entries(targets[job.job_name] ?? {}).map(([name, addr]) => ({ targets: [addr], labels: { instance: name } }));
  }
  process.stdout.write(YAML.stringify(cfg));
  process.exit(0);
}

// Compose files first (a later one merged over the earlier ones the way
// `docker-compose -f a -f b` merges the keys used here: command replaced,
// healthcheck keys replaced one by one), then WORKDIR.
const args = process.argv.slice(2);
const files = [];
while (args.length && /\.ya?ml$/.test(args[0])) files.push(args.shift());
const [work, ...overrides] = args;
if (!files.length || !work) {
  console.error('usage: node live-plan.mjs compose.yml [override.yml ...] WORKDIR [binary:flag=value ...]');
  process.exit(2);
}
const services = {};
for (const f of files) {
  for (const [name, svc] of Object.entries(YAML.parse(fs.readFileSync(f, 'utf8'), { merge: true }).services ?? {})) {
    const m = { ...services[name], ...svc };
    if (services[name]?.healthcheck && svc.healthcheck) m.healthcheck = { ...services[name].healthcheck, ...svc.healthcheck };
    services[name] = m;
  }
}
const exe = svc => Array.isArray(svc.command) ? svc.command[0] : undefined;
const flagOf = (argv, flag) => argv.find(a => a.startsWith(`--${flag}=`))?.slice(flag.length + 3);
const cmdOf = svc => svc.healthcheck?.test ? svc.healthcheck.test.slice(svc.healthcheck.test[0] === 'CMD' ? 1 : 0) : [];
// etcd services: the client address a compose service reaches each one at
// (its name and the port it advertises), replaced by @NAME@ in
// --etcd_endpoints, which the test fills with 127.0.0.1:PORT once it runs.
const etcdNames = {};
for (const [name, svc] of Object.entries(services)) {
  if (exe(svc) !== 'etcd') continue;
  const url = (flagOf(svc.command, 'advertise-client-urls') ?? 'http://localhost:2379').split(',')[0];
  etcdNames[`${name}:${new URL(url).port || 2379}`] = name;
}
const plan = {}, etcd = {};
let healthcheck = null, etcdHealthcheck = null;
for (const [name, svc] of Object.entries(services)) {
  if (!['ps-server', 'ps-worker', 'etcd'].includes(exe(svc))) continue;
  const argv = [...svc.command];
  const set = (flag, value) => {
    const i = argv.findIndex(a => a.startsWith(`--${flag}=`));
    if (i >= 0) argv[i] = `--${flag}=${value}`; else argv.push(`--${flag}=${value}`);
  };
  if (argv[0] === 'etcd') {
    // One member on 127.0.0.1: client and peer ports picked by the test
    // (@CLIENT_PORT@, @PEER_PORT@), data in the run's folder.
    const member = flagOf(argv, 'name') ?? 'default';
    set('data-dir', `${work}/${name}-data`);
    set('listen-client-urls', 'http://127.0.0.1:@CLIENT_PORT@');
    set('advertise-client-urls', 'http://127.0.0.1:@CLIENT_PORT@');
    set('listen-peer-urls', 'http://127.0.0.1:@PEER_PORT@');
    set('initial-advertise-peer-urls', 'http://127.0.0.1:@PEER_PORT@');
    set('initial-cluster', `${member}=http://127.0.0.1:@PEER_PORT@`);
    etcd[name] = argv;
    etcdHealthcheck = cmdOf(svc).map(a => a.replace(/^--endpoints=.*/, '--endpoints=http://@ADDR@'));
    continue;
  }
  // A replicated shard tells the others where it is (--advertise_address):
  // it listens on a port the test picks (@PORT@) and advertises that.
  if (argv[0] === 'ps-server') {
    const advertised = flagOf(argv, 'advertise_address') !== undefined;
    set('listen', advertised ? '127.0.0.1:@PORT@' : '127.0.0.1:0');
    if (advertised) set('advertise_address', '127.0.0.1:@PORT@');
  }
  set('metrics_listen', '127.0.0.1:0');
  if (flagOf(argv, 'data_listen') !== undefined) set('data_listen', '127.0.0.1:0');
  set('port_file', `${work}/${name}.port`);
  const endpoints = flagOf(argv, 'etcd_endpoints');
  if (endpoints !== undefined) {
    set('etcd_endpoints', endpoints.split(',').map(e => {
      if (!etcdNames[e]) throw new Error(`${name}: --etcd_endpoints entry ${e} is no etcd service of ${files.join(' + ')}`);
      return `@${etcdNames[e]}@`;
    }).join(','));
  }
  if (argv[0] === 'ps-server') {
    set('checkpoint_dir', `${work}/${name}-checkpoints`);
    healthcheck = cmdOf(svc).map(a => a.replace(/^--server=.*/, '--server=@ADDR@'));
  }
  if (argv[0] === 'ps-worker') set('servers', '@SERVERS@');
  for (const o of overrides) {
    const [, bin, flag, value] = o.match(/^([\w-]+):(\w+)=(.*)$/);
    if (bin === argv[0]) set(flag, value);
  }
  plan[name] = argv;
}
// The config file the compose Prometheus loads (--config.file), as a path on
// this machine through its bind mounts (relative to the first file's folder).
let prometheusConfig = null;
for (const svc of Object.values(services)) {
  if (!/(^|\/)prometheus(:|$)/.test(svc.image ?? '')) continue;
  const file = flagOf(svc.command ?? [], 'config.file') ?? '/etc/prometheus/prometheus.yml';
  for (const v of svc.volumes ?? []) {
    const [src, dst] = typeof v === 'string' ? v.split(':') : [v.source, v.target];
    const rel = src && /^[.\/]/.test(src) ? path.posix.relative(dst, file) : '..';
    if (!rel.startsWith('..')) prometheusConfig = path.resolve(path.dirname(files[0]), src, rel);
  }
  if (!prometheusConfig) throw new Error(`Prometheus --config.file=${file} is in none of its bind mounts`);
}
const order = Object.keys(plan).sort((a, b) => (plan[a][0] === 'ps-server' ? 0 : 1) - (plan[b][0] === 'ps-server' ? 0 : 1));
const processes = Object.fromEntries(order.map(k => [k, plan[k]]));
process.stdout.write(JSON.stringify({ processes, healthcheck, etcd, etcd_healthcheck: etcdHealthcheck,
  prometheus_config: prometheusConfig }, null, 1) + '\n');
