// Turns docker-compose.yml into the command lines the live test runs on
// 127.0.0.1: the compose commands with only addresses, ports, paths and the
// run's length changed. Prints JSON {processes: {service: argv} (shards
// first), healthcheck: the shards' healthcheck argv with its address as
// @ADDR@}; with --prometheus, the compose Prometheus config with its targets
// replaced.
// usage: node live-plan.mjs compose.yml WORKDIR [binary:flag=value ...]
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

const [composeFile, work, ...overrides] = process.argv.slice(2);
const services = YAML.parse(fs.readFileSync(composeFile, 'utf8'), { merge: true }).services;
const plan = {};
let healthcheck = null;
for (const [name, svc] of Object.entries(services)) {
  const argv = svc.command;
  if (!Array.isArray(argv) || !['ps-server', 'ps-worker'].includes(argv[0])) continue;
  const set = (flag, value) => {
    const i = argv.findIndex(a => a.startsWith(`--${flag}=`));
    if (i >= 0) argv[i] = `--${flag}=${value}`; else argv.push(`--${flag}=${value}`);
  };
  if (argv[0] === 'ps-server') set('listen', '127.0.0.1:0');
  set('metrics_listen', '127.0.0.1:0');
  set('port_file', `${work}/${name}.port`);
  if (argv[0] === 'ps-server') {
    set('checkpoint_dir', `${work}/${name}-checkpoints`);
    const test = svc.healthcheck?.test ?? [];
    healthcheck = test.slice(test[0] === 'CMD' ? 1 : 0).map(a => a.replace(/^--server=.*/, '--server=@ADDR@'));
  }
  if (argv[0] === 'ps-worker') set('servers', '@SERVERS@');
  for (const o of overrides) {
    const [, bin, flag, value] = o.match(/^([\w-]+):(\w+)=(.*)$/);
    if (bin === argv[0]) set(flag, value);
  }
  plan[name] = argv;
}
const order = Object.keys(plan).sort((a, b) => (plan[a][0] === 'ps-server' ? 0 : 1) - (plan[b][0] === 'ps-server' ? 0 : 1));
const processes = Object.fromEntries(order.map(k => [k, plan[k]]));
process.stdout.write(JSON.stringify({ processes, healthcheck }, null, 1) + '\n');
