/**
 * The code the stack deploys, as directories: each function's bundle (`bundleFunctions`, the
 * project's one esbuild recipe in `layers/bundle.ts`) and each function's layer (laid out by
 * `npm run build:layers`, `layers/build.ts`).
 *
 * @module
 */
import { existsSync } from 'node:fs';
import path from 'node:path';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/api/functions.js';
import { HARDEN_ADDON_NAME } from '../../layers/native.js';
import type { StageAssets } from './stack.js';

/**
 * The layer directories `npm run build:layers` made under `<layersRoot>/<stage>` (`bin/` tools
 * and the launcher, `lib/` the hardening addon), checked to exist.
 * @throws Error naming the missing layers and the command that builds them.
 */
export function builtLayers(layersRoot: string): Record<PipelineStage, string> {
  const dirs = Object.fromEntries(PIPELINE_STAGES.map((s) => [s, path.join(layersRoot, s)])) as Record<
    PipelineStage,
    string
  >;
  const missing = PIPELINE_STAGES.filter((s) => !existsSync(path.join(dirs[s], 'lib', HARDEN_ADDON_NAME)));
  if (missing.length > 0) {
    throw new Error(`no layer for ${missing.join(', ')} under ${layersRoot}: run \`npm run build:layers\` first`);
  }
  return dirs;
}

/** Pairs code and layer directories per stage. */
export function stageAssets(
  code: Record<PipelineStage, string>,
  layers: Record<PipelineStage, string>,
): Record<PipelineStage, StageAssets> {
  return Object.fromEntries(PIPELINE_STAGES.map((s) => [s, { codeDir: code[s], layerDir: layers[s] }])) as Record<
    PipelineStage,
    StageAssets
  >;
}
