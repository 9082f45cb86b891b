/**
 * Builds what the embedded runtime runs, and nothing else, into the tool cache
 * (`KAPP_LAMBDA_CACHE`): the pinned components carrying the tools the functions run
 * (`TOOL_NAMES`, from the tool table `layers/tools.ts`), the launcher, the connector and the
 * hardening addon, with the same builders as `npm run setup` (`layers/gobuild.ts`,
 * `layers/native.ts`). The runtime image (`infra/runtime/Containerfile`) runs it, so the image
 * has no list of versions of its own. Unlike setup it installs no Debian or Python package (the
 * image installs gcc and git itself) and builds no test component.
 *
 * Usage: `npx tsx scripts/build-runtime-tools.ts`.
 *
 * @module
 */
import { TOOL_NAMES } from '../functions/lib/exec/runner.js';
import { buildComponent, cacheRoot } from '../layers/gobuild.js';
import { COMPONENTS, type GoComponent } from '../layers/manifest.js';
import { buildConnector, buildHardenAddon, buildLauncher } from '../layers/native.js';
import { runIfEntry } from './cli.js';

/**
 * The pinned components the embedded runtime runs a binary of: every component with a binary
 * named in `TOOL_NAMES`, in manifest order (`git`, a system tool, is none of them).
 */
export function runtimeComponents(tools: readonly string[] = TOOL_NAMES): GoComponent[] {
  return COMPONENTS.filter((c) => c.binaries.some((b) => tools.includes(b.bin)));
}

/** Builds {@link runtimeComponents} and the native helpers; logs progress on stderr. */
async function main(): Promise<number> {
  const started = Date.now();
  const log = (m: string) =>
    process.stderr.write(`[runtime-tools +${Math.round((Date.now() - started) / 1000)}s] ${m}\n`);
  log(`cache: ${cacheRoot()}`);
  buildHardenAddon(log);
  buildLauncher(log);
  buildConnector(log);
  for (const c of runtimeComponents()) await buildComponent(c, log);
  log(`ready in ${Math.round((Date.now() - started) / 1000)}s`);
  return 0;
}

runIfEntry(import.meta.filename, 'build-runtime-tools', () => main());
