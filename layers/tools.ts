/**
 * The one table of the tools the functions run: each tool's pinned version, its binaries, and
 * which functions carry and run it. Every other list of tools is derived from it: the Go builds
 * (`./manifest.ts` takes the version and the layers from here and adds the build recipe), the
 * layers (`./build.ts`, `./git.ts`), the allow-lists (`TOOL_NAMES` and `STAGE_TOOLS` in
 * `functions/lib/exec/runner.ts`), the tool versions of the render-cache key
 * (`renderToolVersions`, `functions/lib/artifact/keys.ts`) and the e2e crash test's template tools.
 *
 * Pure data that imports nothing, so the functions' core can read it without pulling the Go
 * build recipe (`./manifest.ts`, `./gobuild.ts`) into the Lambda bundles.
 *
 * Row order is the allow-list order (`TOOL_NAMES`, `STAGE_TOOLS`): the fetch tools, then the
 * template tools, with kapp after kbld and git last. The Go build order is `./manifest.ts`'s.
 *
 * @module
 */
import type { PipelineStage } from '../functions/lib/api/functions.js';

/**
 * A function of the pipeline: one of `PIPELINE_STAGES` (`functions/lib/api/functions.ts`, a
 * leaf that imports nothing, so this table stays importable from the Lambda bundles and the
 * Go build recipe alike).
 */
export type ToolStage = PipelineStage;

/** One tool a function may run. */
export interface Tool {
  /** Name; for a Go-built tool, its component in `./manifest.ts` (the build cache key with the version). */
  readonly name: string;
  /**
   * Pinned version, `vX.Y.Z` (the Go module's). Absent for git, which is the build machine's git
   * relocated into the layer (`./git.ts`), not a pinned build.
   */
  readonly version?: string;
  /** Binaries the layer carries, e.g. `['age', 'age-keygen']`. */
  readonly bins: readonly string[];
  /** Binaries the functions may run (their allow-list); defaults to {@link Tool.bins}. */
  readonly runs?: readonly string[];
  /** Functions whose Lambda layer carries {@link Tool.bins}. */
  readonly stages: readonly ToolStage[];
  /**
   * Functions whose allow-list names {@link Tool.runs}; defaults to {@link Tool.stages}. Narrower
   * for git: vendir runs the layer's git from `PATH` in fetch without it being on the list.
   */
  readonly allowedIn?: readonly ToolStage[];
  /**
   * `false` for a template tool whose version cannot change a render, so it stays out of the
   * render-cache key ({@link RENDER_TOOLS}). Every other template tool is in the key by default:
   * a new one cannot be forgotten there, and a tool upgrade re-renders.
   */
  readonly renderKey?: false;
}

/**
 * Every tool, in allow-list order. Upstream kapp-controller's image carries the same Carvel set
 * (`hack/dependencies.yml`); kustomize is kapp-lambda's own template step. Versions and why they
 * are these: `./manifest.ts`.
 */
export const TOOLS: readonly Tool[] = [
  { name: 'vendir', version: 'v0.44.0', bins: ['vendir'], stages: ['fetch', 'index-repo'] },
  { name: 'imgpkg', version: 'v0.46.1', bins: ['imgpkg'], stages: ['fetch', 'index-repo'] },
  { name: 'ytt', version: 'v0.55.3', bins: ['ytt'], stages: ['template', 'index-repo'] },
  { name: 'kbld', version: 'v0.46.0', bins: ['kbld'], stages: ['template', 'index-repo'] },
  { name: 'kapp', version: 'v0.64.2', bins: ['kapp'], stages: ['deploy', 'index-repo'] },
  { name: 'helm', version: 'v3.22.0', bins: ['helm'], stages: ['fetch', 'template'] },
  { name: 'sops', version: 'v3.13.3', bins: ['sops'], stages: ['template'] },
  {
    name: 'age',
    version: 'v1.2.1',
    bins: ['age', 'age-keygen'],
    runs: ['age'],
    stages: ['template'],
    // sops links age's library for decryption; no render runs the age binary
    renderKey: false,
  },
  { name: 'cue', version: 'v0.17.1', bins: ['cue'], stages: ['template'] },
  { name: 'kustomize', version: 'v5.8.2', bins: ['kustomize'], stages: ['template'] },
  { name: 'git', bins: ['git'], stages: ['fetch', 'index-repo'], allowedIn: ['index-repo'] },
];

/**
 * Looks up a tool by name.
 * @throws Error when the name is not in {@link TOOLS}.
 */
export function tool(name: string): Tool {
  const t = TOOLS.find((x) => x.name === name);
  if (!t) throw new Error(`unknown tool ${name}`);
  return t;
}

/** The functions whose allow-list names a tool ({@link Tool.allowedIn}, by default its {@link Tool.stages}). */
export function allowedStages(t: Tool): readonly ToolStage[] {
  return t.allowedIn ?? t.stages;
}

/** The binaries of a tool the functions may run ({@link Tool.runs}, by default its {@link Tool.bins}). */
export function runBins(t: Tool): readonly string[] {
  return t.runs ?? t.bins;
}

/** The binaries a function may run: {@link Tool.runs} of every tool allowed in it, in table order. */
export function stageTools(stage: ToolStage): string[] {
  return TOOLS.filter((t) => allowedStages(t).includes(stage)).flatMap(runBins);
}

/**
 * The binaries whose versions key a render (`renderToolVersions` in
 * `functions/lib/artifact/keys.ts`): those the template function may run, less the tools marked
 * `renderKey: false`. Today `ytt`, `kbld`, `helm`, `sops`, `cue`, `kustomize`.
 */
export const RENDER_TOOLS: readonly string[] = TOOLS.filter(
  (t) => allowedStages(t).includes('template') && t.renderKey !== false,
).flatMap(runBins);
