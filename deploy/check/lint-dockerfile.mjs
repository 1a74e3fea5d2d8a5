// Dockerfile lint: dockerfile-utils' diagnostics (unknown instructions and
// flags, bad durations/ports, duplicate stage names, ...) plus what a build
// would only reveal on a machine with a Docker engine:
//   - COPY --from= names an earlier stage (else the builder pulls an image of that name);
//   - exec-form (JSON) CMD/ENTRYPOINT/RUN/HEALTHCHECK CMD really is a JSON string array
//     (else it silently becomes shell form);
//   - the final stage runs as a non-root USER and has a HEALTHCHECK.
// usage: node lint-dockerfile.mjs Dockerfile...
import fs from 'node:fs';
import { validate } from 'dockerfile-utils';
import { DockerfileParser } from 'dockerfile-ast';

let bad = 0;
for (const f of process.argv.slice(2)) {
  const text = fs.readFileSync(f, 'utf8');
  const errs = validate(text).map(d =>
    `${f}:${d.range.start.line + 1}: [${d.severity === 1 ? 'error' : 'warning'}] ${d.message}`);
  const at = (i, msg) => errs.push(`${f}:${i.getRange().start.line + 1}: [error] ${msg}`);

  const stages = [];  // names (or indexes) of the stages seen so far
  let user = null, healthcheck = false;
  for (const i of DockerfileParser.parse(text).getInstructions()) {
    const kw = i.getKeyword(), args = i.getArgumentsContent() ?? '';
    if (kw === 'FROM') {
      stages.push(i.getBuildStage() ?? String(stages.length));
      user = null; healthcheck = false;
    }
    if (kw === 'COPY') for (const flag of i.getFlags()) {
      const from = flag.getName() === 'from' ? flag.getValue() : null;
      if (from && !stages.slice(0, -1).includes(from) && !/[:/@]/.test(from)) {
        at(i, `COPY --from=${from}: no earlier stage has that name`);
      }
    }
    if (kw === 'USER') user = args.trim();
    if (kw === 'HEALTHCHECK') healthcheck = !/^NONE\b/i.test(args.trim());
    const exec = kw === 'HEALTHCHECK' ? args.replace(/^\s*CMD\s+/i, '') : args;
    if (['CMD', 'ENTRYPOINT', 'RUN', 'HEALTHCHECK'].includes(kw) && exec.trim().startsWith('[')) {
      let ok = false;
      try { const v = JSON.parse(exec); ok = Array.isArray(v) && v.every(s => typeof s === 'string'); } catch { }
      if (!ok) at(i, `${kw}: exec form is not a JSON array of strings (it would run as shell form)`);
    }
  }
  if (!user || /^(root|0)(:|$)/.test(user)) errs.push(`${f}: [error] final stage must set a non-root USER`);
  if (!healthcheck) errs.push(`${f}: [error] final stage has no HEALTHCHECK`);

  console.log(`${errs.length ? 'FAIL' : 'ok  '} ${f}`);
  for (const e of errs) console.log(`     ${e}`);
  bad += errs.length;
}
process.exit(bad ? 1 : 0);
