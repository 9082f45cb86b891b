/**
 * Lays out one Lambda layer per function (`PIPELINE_STAGES`: fetch, template, deploy,
 * index-repo, install) from the cached Go builds, holding only the binaries that function runs
 * (none for install: its layer is the hardening addon alone), and prints each function's unzipped size
 * (bundled code + its layer). Exits non-zero when a function exceeds Lambda's 250 MB
 * unzipped limit (code plus all layers).
 *
 * Usage: `npm run build:layers` (builds missing tools first).
 * Output: `<cache>/layers/<stage>/bin/<tool>` and `<cache>/layers/sizes.json`.
 */
import { existsSync } from 'node:fs';
import { copyFile, mkdir, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { PIPELINE_STAGES } from '../functions/lib/transport/port.js';
import { bundleFunction, functionEntry } from './bundle.js';
import { buildComponent, cacheRoot } from './gobuild.js';
import { COMPONENTS, type Stage } from './manifest.js';
import { buildHardenAddon, buildLauncher, HARDEN_ADDON_NAME, LAUNCHER_NAME } from './native.js';

/** Lambda's limit on a function's unzipped deployment package plus layers, in bytes (250 MiB as AWS counts it). */
export const LAMBDA_UNZIPPED_LIMIT = 262_144_000;

/** The functions that have a layer: every one with a queue (`PIPELINE_STAGES`). */
export const STAGES: readonly Stage[] = PIPELINE_STAGES;

/** Size report of one function. All sizes in bytes. */
export interface FunctionSize {
  stage: Stage;
  /** Binaries in the layer, in manifest order. */
  tools: string[];
  layerBytes: number;
  /** Size of the esbuild bundle of `functions/<stage>/index.ts`, 0 when that entry does not exist yet. */
  codeBytes: number;
  totalBytes: number;
  withinLimit: boolean;
}

/** Binaries a stage's layer carries, in manifest order. */
export function layerTools(stage: Stage): { component: (typeof COMPONENTS)[number]; bin: string }[] {
  return COMPONENTS.filter((c) => c.layers.includes(stage)).flatMap((c) =>
    c.binaries.map((b) => ({ component: c, bin: b.bin })),
  );
}

/**
 * The pinned version (without `v`) of each tool of a stage's layer, keyed by binary: the
 * function's `KAPP_LAMBDA_TOOL_VERSIONS` (part of the render-cache key). `{}` for install.
 */
export function layerToolVersions(stage: Stage): Record<string, string> {
  return Object.fromEntries(layerTools(stage).map(({ component: c, bin }) => [bin, c.version.replace(/^v/, '')]));
}

async function bundleBytes(stage: Stage, outDir: string): Promise<number> {
  if (!existsSync(functionEntry(stage))) return 0;
  return bundleFunction(stage, path.join(outDir, `${stage}.mjs`));
}

/**
 * Builds the per-stage layers and measures each function.
 * @throws Error when a tool build fails.
 */
export async function buildLayers(log: (m: string) => void, root = cacheRoot()): Promise<FunctionSize[]> {
  const sizes: FunctionSize[] = [];
  const bundles = path.join(root, 'bundles');
  await mkdir(bundles, { recursive: true });
  for (const stage of STAGES) {
    const dir = path.join(root, 'layers', stage, 'bin');
    await rm(path.dirname(dir), { recursive: true, force: true });
    await mkdir(dir, { recursive: true });
    let layerBytes = 0;
    const tools: string[] = [];
    for (const { component, bin } of layerTools(stage)) {
      const src = path.join(await buildComponent(component, log, root), bin);
      await copyFile(src, path.join(dir, bin));
      layerBytes += (await stat(src)).size;
      tools.push(bin);
    }
    // The tool launcher (functions/lib/exec/runner.ts `launcher`) beside the tools; a function
    // that runs no tool (install) needs none.
    if (tools.length > 0) {
      const launcher = buildLauncher(log, root);
      await copyFile(launcher, path.join(dir, LAUNCHER_NAME));
      layerBytes += (await stat(launcher)).size;
    }
    // The hardening addon (functions/lib/exec/harden.ts) at /opt/lib, loaded at init.
    const addon = buildHardenAddon(log, root);
    await mkdir(path.join(path.dirname(dir), 'lib'), { recursive: true });
    await copyFile(addon, path.join(path.dirname(dir), 'lib', HARDEN_ADDON_NAME));
    layerBytes += (await stat(addon)).size;
    const codeBytes = await bundleBytes(stage, bundles);
    const totalBytes = layerBytes + codeBytes;
    sizes.push({ stage, tools, layerBytes, codeBytes, totalBytes, withinLimit: totalBytes <= LAMBDA_UNZIPPED_LIMIT });
  }
  await writeFile(path.join(root, 'layers', 'sizes.json'), `${JSON.stringify(sizes, null, 2)}\n`);
  return sizes;
}

const mb = (n: number) => `${(n / 1_048_576).toFixed(1)} MiB`;

if (import.meta.url === `file://${process.argv[1]}`) {
  const sizes = await buildLayers((m) => process.stderr.write(`[layers] ${m}\n`));
  const rows = sizes.map(
    (s) =>
      `${s.stage.padEnd(9)} ${mb(s.codeBytes).padStart(10)} ${mb(s.layerBytes).padStart(10)} ${mb(s.totalBytes).padStart(10)}  ${s.withinLimit ? 'ok' : 'OVER 250 MB'}  ${s.tools.join(' ')}`,
  );
  process.stdout.write(
    `function       code      layer      total  limit  tools\n${rows.join('\n')}\n(limit: ${mb(LAMBDA_UNZIPPED_LIMIT)} unzipped per function)\n`,
  );
  if (sizes.some((s) => !s.withinLimit)) process.exit(1);
}
