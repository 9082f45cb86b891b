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
