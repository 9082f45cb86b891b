/**
 * First-run setup: builds every pinned Go component (tools, control plane, test servers)
 * into the cache outside the checkout, with progress, and reuses cached builds.
 * Usage: `tsx scripts/setup.ts [component...]` (default: all but the `optional` ones, e.g.
 * kapp-controller, which only the benchmark needs and builds on demand). Debian packages the tests
 * need (docker-registry, git) are installed by `scripts/apt.ts` when missing, moto's server (the
 * SQS-compatible test server) by `scripts/python.ts` (`pip install --user`).
 */
import { buildComponent, cacheRoot } from '../layers/gobuild.js';
import { COMPONENTS, component } from '../layers/manifest.js';
import { buildConnector, buildHardenAddon, buildLauncher } from '../layers/native.js';
import { ensureDebianPackages } from './apt.js';
import { ensurePythonPackages } from './python.js';

const names = process.argv.slice(2);
const wanted = names.length ? names.map(component) : COMPONENTS.filter((c) => !c.optional);
const started = Date.now();
const log = (m: string) => process.stderr.write(`[setup +${Math.round((Date.now() - started) / 1000)}s] ${m}\n`);
log(`cache: ${cacheRoot()}`);
await ensureDebianPackages(log);
await ensurePythonPackages(log);
if (names.length === 0) {
  buildHardenAddon(log);
  buildLauncher(log);
  buildConnector(log);
}
for (const c of wanted) await buildComponent(c, log);
log(`ready in ${Math.round((Date.now() - started) / 1000)}s`);
