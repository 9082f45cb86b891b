/**
 * The stages' scratch directories under the configured tmp root, and the removal at a cold start
 * of those (and of the runner's run directories) a previous process left behind. Below the
 * pipeline so that the planners' runs (`../fetch/run.ts`) make theirs as the stages do.
 *
 * @module
 */
import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import path from 'node:path';
import { RUN_DIR_PREFIX } from './sandbox.js';

/** The names of the stages' scratch directories (`<prefix>-XXXXXX` under the tmp root). */
export const SCRATCH_PREFIXES = ['deploy', 'fetch', 'fetch-http', 'index-repo', 'template'] as const;

/**
 * Makes a fresh scratch directory under the configured tmp root; remove it with
 * {@link removeScratch} in a `finally`.
 */
export async function makeScratch(
  deps: { config: { tmpRoot: string } },
  prefix: (typeof SCRATCH_PREFIXES)[number],
): Promise<string> {
  await mkdir(deps.config.tmpRoot, { recursive: true });
  return await mkdtemp(path.join(deps.config.tmpRoot, `${prefix}-`));
}

/** Removes a scratch directory; never throws (a leftover temp dir must not fail a run). */
export async function removeScratch(dir: string): Promise<void> {
  await rm(dir, { recursive: true, force: true }).catch(() => undefined);
}

/** A name {@link makeScratch} or the runner's run directories (`./sandbox.ts`) give. */
const LEFTOVER_NAME = new RegExp(
  `^(?:${[...SCRATCH_PREFIXES, RUN_DIR_PREFIX.slice(0, -1)].join('|')})-[A-Za-z0-9]{6}$`,
);

/**
 * Removes the scratch and tool run directories a previous process left under `tmpRoot`, for a
 * process that is the only one using it (a Lambda function at its cold start: one process per
 * execution environment, one invocation at a time). Every run removes its own directories when
 * it ends, but a process the platform ends mid-run (out of memory, killed at the time limit)
 * cannot, and Lambda may start the next process in the same environment with `/tmp` as it
 * was: its tools, which share the function's uid there, could then read another App's fetched
 * sources or rendered manifests. Only names this runtime makes are removed; never throws.
 *
 * @returns the names removed
 */
export async function removeLeftoverScratch(tmpRoot: string): Promise<string[]> {
  const names = await readdir(tmpRoot).catch(() => [] as string[]);
  const stale = names.filter((n) => LEFTOVER_NAME.test(n));
  await Promise.all(stale.map((n) => removeScratch(path.join(tmpRoot, n))));
  return stale;
}

/**
 * What a scratch or run directory under the tmp root is shown as (`/tmp/kapp-lambda-<name>`,
 * e.g. `/tmp/kapp-lambda-template`): a stable stand-in in upstream's shape (kapp-controller shows
 * its own `/etc/kappctrl-mem-tmp/kapp-controller-fetch-template-deploy<random>/…`), never the
 * real path, which changes with every run (and every `npm start`), so a failure repeated run
 * after run reads the same and no reader learns the runtime's temp layout.
 */
export const SCRATCH_SHOWN_AS = '/tmp/kapp-lambda-';

/**
 * A function rewriting every path of a directory {@link makeScratch} or the runner
 * (`./sandbox.ts` `makeRunDirs`) made under `tmpRoot` to {@link SCRATCH_SHOWN_AS}`<name>`
 * (`<tmpRoot>/template-Ab12Cd/src/0/x.yml` → `/tmp/kapp-lambda-template/src/0/x.yml`,
 * `<tmpRoot>/run-Xy34Zw/home` → `/tmp/kapp-lambda-run/home`). Any other text, other paths under
 * `tmpRoot` included, is returned unchanged. Linear in the text.
 *
 * @param tmpRoot - The configured tmp root (`PipelineConfig.tmpRoot`, the runner's `tmpDir`).
 */
export function scratchPathRewriter(tmpRoot: string): (text: string) => string {
  // `/` itself resolves to '' here, so the pattern starts at the name's own `/`.
  const root = path.resolve(tmpRoot).replace(/\/+$/, '');
  const escaped = root.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
  // Longer names first (`fetch-http` before `fetch`).
  const names = [...SCRATCH_PREFIXES, RUN_DIR_PREFIX.slice(0, -1)].sort((a, b) => b.length - a.length);
  const pattern = new RegExp(
    `(?<![A-Za-z0-9_.~-])${escaped}/(${names.join('|')})-[A-Za-z0-9]{6}(?![A-Za-z0-9_.-])`,
    'g',
  );
  return (text) => (text.includes(`${root}/`) ? text.replace(pattern, `${SCRATCH_SHOWN_AS}$1`) : text);
}
