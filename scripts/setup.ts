/**
 * First-run setup: builds the pinned Go components (tools, control plane, test servers) into the
 * cache outside the checkout, with progress, and reuses cached builds.
 * Usage: `npm run setup -- [--for full|demo|start] [component...] [--pull-cache <registry/repo>]
 * [--push-cache <registry/repo>]`. `--for full` (the default; `npm test`, `npm run bench`) builds
 * every component but those built only when named (`need` in `layers/manifest.ts`), installs the Debian packages (`scripts/apt.ts`) and moto's server (the
 * SQS-compatible test server) into the project's Python venv (`scripts/python.ts`); `--for demo`
 * (`npm run demo`) only what the demo runs, `--for start` (`npm start`) every tool the runtime
 * runs and the local control plane, no test server (`scripts/setup-plan.ts`). Named components build only
 * those. With a shared tool cache (`layers/toolcache.ts`; `--pull-cache` or
 * `KAPP_LAMBDA_TOOL_CACHE_REGISTRY`) each component the repository holds and the committed lock
 * (`layers/toolcache.lock.json`, or `KAPP_LAMBDA_TOOL_CACHE_LOCK`) lists is pulled before it
 * would be built; `--push-cache` also pushes each component the repository or the lock lacks
 * and records it in the lock, to commit.
 */
import { binPath, buildComponent, cacheRoot } from '../layers/gobuild.js';
import { component } from '../layers/manifest.js';
import { buildConnector, buildHardenAddon, buildLauncher } from '../layers/native.js';
import { openToolCache, type ToolCache, toolCacheTag } from '../layers/toolcache.js';
import { ensureDebianPackages } from './apt.js';
import { ensurePythonPackages } from './python.js';
import { setupCommandLine, setupPlan } from './setup-plan.js';

const args = setupCommandLine(process.argv.slice(2), process.env, {
  out: (t) => process.stdout.write(t),
  err: (t) => process.stderr.write(t),
});
if (typeof args === 'number') process.exit(args);
const plan = setupPlan(args.profile);
const wanted = args.names.length ? args.names.map(component) : plan.components;
const started = Date.now();
const log = (m: string) => process.stderr.write(`[setup +${Math.round((Date.now() - started) / 1000)}s] ${m}\n`);
log(`cache: ${cacheRoot()} (profile ${args.profile})`);
await ensureDebianPackages(log, plan.debianPackages);
if (plan.python) await ensurePythonPackages(log);
if (args.names.length === 0 && plan.native) {
  buildHardenAddon(log);
  buildLauncher(log);
  buildConnector(log);
}
let shared: ToolCache | undefined;
if (args.cacheRepo) {
  // Only the project's imgpkg, patched against layer entries that leave the pull directory
  // (`patchImgpkgLayerPaths`), pulls: never one from PATH. Built first when not cached yet.
  const imgpkg = component('imgpkg');
  await buildComponent(imgpkg, log);
  shared = await openToolCache({
    repo: args.cacheRepo,
    imgpkg: binPath(imgpkg, 'imgpkg'),
    ...(args.lockFile ? { lockFile: args.lockFile } : {}),
  });
  log(`tool cache ${args.cacheRepo}: ${shared.tags.size} tags${args.push ? ', pushing what it lacks' : ''}`);
}
for (const c of wanted) {
  if (shared) {
    // A failed or unverified pull leaves nothing behind: the component is built as without a cache.
    const pulled = await shared
      .pull(c, log)
      .catch((e: Error) => log(`${e.message}: ${String(e.cause)}; building instead`));
    if (pulled === 'unlocked' && shared.tags.has(toolCacheTag(c))) {
      log(
        `${c.name} ${c.version}: the registry holds ${toolCacheTag(c)} but the tool cache lock does not list it: building`,
      );
    }
  }
  await buildComponent(c, log);
  if (shared && args.push) await shared.push(c, log);
}
log(`ready in ${Math.round((Date.now() - started) / 1000)}s`);
