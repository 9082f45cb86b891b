/**
 * First-run setup: builds the pinned Go components (tools, control plane, test servers) into the
 * cache outside the checkout, with progress, and reuses cached builds.
 * Usage: `tsx scripts/setup.ts [--for full|demo] [component...]`. `--for full` (the default;
 * `npm test`, `npm run bench`) builds all but the `optional` components (e.g. kapp-controller,
 * which only the benchmark needs and builds on demand), installs the Debian packages
 * (`scripts/apt.ts`) and moto's server (the SQS-compatible test server) into the project's
 * Python venv (`scripts/python.ts`); `--for demo` (`npm run demo`) only what the demo runs
 * (`scripts/setup-plan.ts`). Named components build only those.
 */
import { buildComponent, cacheRoot } from '../layers/gobuild.js';
import { component } from '../layers/manifest.js';
import { buildConnector, buildHardenAddon, buildLauncher } from '../layers/native.js';
import { ensureDebianPackages } from './apt.js';
import { ensurePythonPackages } from './python.js';
import { parseSetupArgs, setupPlan } from './setup-plan.js';

const { profile, names } = parseSetupArgs(process.argv.slice(2));
const plan = setupPlan(profile);
const wanted = names.length ? names.map(component) : plan.components;
const started = Date.now();
const log = (m: string) => process.stderr.write(`[setup +${Math.round((Date.now() - started) / 1000)}s] ${m}\n`);
log(`cache: ${cacheRoot()} (profile ${profile})`);
await ensureDebianPackages(log, plan.debianPackages);
if (plan.python) await ensurePythonPackages(log);
if (names.length === 0 && plan.native) {
  buildHardenAddon(log);
  buildLauncher(log);
  buildConnector(log);
}
for (const c of wanted) await buildComponent(c, log);
log(`ready in ${Math.round((Date.now() - started) / 1000)}s`);
