/**
 * Lays out one Lambda layer per function (`PIPELINE_STAGES`: fetch, template, deploy,
 * index-repo, install) from the cached Go builds, holding only the binaries that function runs
 * (none for install: its layer is the hardening addon alone; git for fetch and index-repo,
 * `./git.ts`), and prints each function's unzipped size
 * (bundled code + its layer). Exits non-zero when a function exceeds Lambda's 250 MB
 * unzipped limit (code plus all layers).
 *
 * Usage: `npm run build:layers` (builds missing tools first).
 * Output: `<cache>/layers/<stage>/bin/<tool>` and `<cache>/layers/sizes.json`.
 */
import { existsSync } from 'node:fs';
import { copyFile, mkdir, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { PIPELINE_STAGES } from '../functions/lib/api/functions.js';
import { bundleFunction, functionEntry } from './bundle.js';
import { addGitToLayer, GIT_LAYER_STAGES } from './git.js';
import { buildComponent, cacheRoot } from './gobuild.js';
import { COMPONENTS, type Stage } from './manifest.js';
import {
  buildConnector,
  buildHardenAddon,
  buildLauncher,
  CONNECTOR_NAME,
  HARDEN_ADDON_NAME,
  LAUNCHER_NAME,
} from './native.js';

/** Lambda's limit on a function's unzipped deployment package plus layers, in bytes (250 MiB as AWS counts it). */
export const LAMBDA_UNZIPPED_LIMIT = 262_144_000;

/** The functions that have a layer: every one with a queue (`PIPELINE_STAGES`). */
export const STAGES: readonly Stage[] = PIPELINE_STAGES;

/** Size report of one function. All sizes in bytes. */
export interface FunctionSize {
  stage: Stage;
  /** Binaries in the layer's `bin/`, in manifest order, then `git`. */
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
 * Every binary a stage's layer puts in `bin/` that the function may run: its Go tools
 * ({@link layerTools}) and `git` for {@link GIT_LAYER_STAGES}.
 */
export function layerBins(stage: Stage): string[] {
  return [...layerTools(stage).map((t) => t.bin), ...(GIT_LAYER_STAGES.includes(stage) ? ['git'] : [])];
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

/** What {@link assembleStageLayer} laid out. */
export interface StageLayer {
  /** The layer's `bin/` (Lambda's `/opt/bin`): its tools, `kl-launch`, and `git` where carried. */
  binDir: string;
  /** Binaries in `bin/`, in manifest order, then `git`. */
  tools: string[];
  /** Bytes of everything in the layer. */
  bytes: number;
}

/**
 * Lays out one function's layer in `layerDir` (emptied first), exactly as it ships:
 * `bin/<tool>` (its Go tools, `kl-launch`), `bin/git` and `git/` for the functions that run
 * vendir ({@link GIT_LAYER_STAGES}, `./git.ts`), and `lib/` (the hardening addon). Tests run a
 * stage's tools from here with nothing from the host `PATH`.
 *
 * @param stage - the function.
 * @param layerDir - where to lay it out (e.g. a test's temp dir).
 * @param log - progress lines.
 * @param root - cache root of the tool builds.
 * @throws Error when a tool build fails.
 */
export async function assembleStageLayer(
  stage: Stage,
  layerDir: string,
  log: (m: string) => void,
  root = cacheRoot(),
): Promise<StageLayer> {
  const dir = path.join(layerDir, 'bin');
  await rm(layerDir, { recursive: true, force: true });
  await mkdir(dir, { recursive: true });
  let bytes = 0;
  const tools: string[] = [];
  for (const { component, bin } of layerTools(stage)) {
    const src = path.join(await buildComponent(component, log, root), bin);
    await copyFile(src, path.join(dir, bin));
    bytes += (await stat(src)).size;
    tools.push(bin);
  }
  // The tool launcher (functions/lib/exec/runner.ts `launcher`) beside the tools; a function
  // that runs no tool (install) needs none.
  if (tools.length > 0) {
    const launcher = buildLauncher(log, root);
    await copyFile(launcher, path.join(dir, LAUNCHER_NAME));
    bytes += (await stat(launcher)).size;
  }
  if (GIT_LAYER_STAGES.includes(stage)) {
    bytes += (await addGitToLayer(layerDir, log, root)).bytes;
    tools.push('git');
    // git:// goes through the egress proxy with it (GIT_PROXY_COMMAND), and so would ssh if the
    // runtime image ever carried one: the copy named `ssh` (first on the tools' PATH) runs the
    // system's ssh with the connector as ProxyCommand, or fails as a missing ssh does today.
    const connector = buildConnector(log, root);
    for (const name of [CONNECTOR_NAME, 'ssh']) {
      await copyFile(connector, path.join(dir, name));
      bytes += (await stat(connector)).size;
    }
  }
  // The hardening addon (functions/lib/exec/harden.ts) at /opt/lib, loaded at init.
  const addon = buildHardenAddon(log, root);
  await mkdir(path.join(layerDir, 'lib'), { recursive: true });
  await copyFile(addon, path.join(layerDir, 'lib', HARDEN_ADDON_NAME));
  bytes += (await stat(addon)).size;
  return { binDir: dir, tools, bytes };
}

/**
 * Builds the per-stage layers (`<root>/layers/<stage>`, {@link assembleStageLayer}) and
 * measures each function.
 * @throws Error when a tool build fails.
 */
export async function buildLayers(log: (m: string) => void, root = cacheRoot()): Promise<FunctionSize[]> {
  const sizes: FunctionSize[] = [];
  const bundles = path.join(root, 'bundles');
  await mkdir(bundles, { recursive: true });
  for (const stage of STAGES) {
    const layer = await assembleStageLayer(stage, path.join(root, 'layers', stage), log, root);
    const codeBytes = await bundleBytes(stage, bundles);
    const totalBytes = layer.bytes + codeBytes;
    sizes.push({
      stage,
      tools: layer.tools,
      layerBytes: layer.bytes,
      codeBytes,
      totalBytes,
      withinLimit: totalBytes <= LAMBDA_UNZIPPED_LIMIT,
    });
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
