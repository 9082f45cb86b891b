/**
 * First-run setup: builds every pinned Go component (tools, control plane, test servers)
 * into the cache outside the checkout, with progress, and reuses cached builds.
 * Usage: `tsx scripts/setup.ts [component...] [--pull-cache <registry/repo>] [--push-cache <registry/repo>]`
 * (default: all but the `optional` ones, e.g. kapp-controller, which only the benchmark needs and
 * builds on demand). With a shared tool cache (`layers/toolcache.ts`; `--pull-cache` or
 * `KAPP_LAMBDA_TOOL_CACHE_REGISTRY`) each component the repository holds is pulled before it
 * would be built; `--push-cache` also pushes each component the repository lacks. Debian packages
 * the tests need (docker-registry, git) are installed by `scripts/apt.ts` when missing, moto's
 * server (the SQS-compatible test server) by `scripts/python.ts` (`pip install --user`).
 */
import { binPath, buildComponent, cacheRoot } from '../layers/gobuild.js';
import { COMPONENTS, component } from '../layers/manifest.js';
import { buildConnector, buildHardenAddon, buildLauncher } from '../layers/native.js';
import { bootstrapImgpkg, openToolCache, parseSetupArgs, type ToolCache } from '../layers/toolcache.js';
import { ensureDebianPackages } from './apt.js';
import { ensurePythonPackages } from './python.js';

const args = parseSetupArgs(process.argv.slice(2), process.env);
const wanted = args.names.length ? args.names.map(component) : COMPONENTS.filter((c) => !c.optional);
const started = Date.now();
const log = (m: string) => process.stderr.write(`[setup +${Math.round((Date.now() - started) / 1000)}s] ${m}\n`);
log(`cache: ${cacheRoot()}`);
await ensureDebianPackages(log);
await ensurePythonPackages(log);
if (args.names.length === 0) {
  buildHardenAddon(log);
  buildLauncher(log);
  buildConnector(log);
}
let shared: ToolCache | undefined;
if (args.cacheRepo) {
  const imgpkg = component('imgpkg');
  let bin = bootstrapImgpkg(binPath(imgpkg, 'imgpkg'), process.env);
  if (!bin) {
    log('no imgpkg yet to pull with: building imgpkg first');
    await buildComponent(imgpkg, log);
    bin = binPath(imgpkg, 'imgpkg');
  }
  shared = await openToolCache({ repo: args.cacheRepo, imgpkg: bin });
  log(`tool cache ${args.cacheRepo}: ${shared.tags.size} tags${args.push ? ', pushing what it lacks' : ''}`);
}
for (const c of wanted) {
  if (shared) {
    // A failed or unverified pull leaves nothing behind: the component is built as without a cache.
    await shared.pull(c, log).catch((e: Error) => log(`${e.message}: ${String(e.cause)}; building instead`));
  }
  await buildComponent(c, log);
  if (shared && args.push) await shared.push(c, log);
}
log(`ready in ${Math.round((Date.now() - started) / 1000)}s`);
