/**
 * The fleet-wide repository index as the index-repo function uses it (`../../packaging/repo-index.ts`
 * holds the keys and formats): looked up before the fetch for a pinned source, after the fetch by
 * the fetched tree's digest, and stored after a successful template.
 *
 * A hit is reported in status as the App pipeline reports its fetch and render cache hits
 * (`../app/fetch.ts`, `../app/template.ts`): `status.fetch` with the recorded vendir lock config as stdout
 * and exit code 0, `status.template` with the recorded stderr and exit code 0, both timed by this
 * run; the deploy part is kapp's own, as always.
 *
 * @module
 */

import { fetchIsPrivate, type PackageRepository } from '../../api/index.js';
import { parseArtifactKey } from '../../artifact/keys.js';
import { pinnedFetchIdentity } from '../../fetch/pinned.js';
import { fetchPassesUrlPolicy } from '../../fetch/url-policy.js';
import {
  findRepoIndex,
  type RepoIndexHit,
  type RepoIndexRecipe,
  type RepoVersions,
  repoIndexDigest,
  repoIndexSourceDigest,
  storeRepoIndex,
  storeSourceRecord,
} from '../../packaging/repo-index.js';
import { fetchConfigDigest } from '../../reconcile/controller-config.js';
import { redactSecrets } from '../../reconcile/redact.js';
import type { StageResult } from '../../reconcile/result.js';
import type { PipelineDeps } from '../deps.js';
import { infraStep } from '../retry-bound.js';

/** How one run of a PackageRepository uses the fleet index. */
export interface RepoIndexPlan {
  /** What besides the fetched tree decides the index (bundle flag, tool versions). */
  recipe: RepoIndexRecipe;
  /** `<namespace>/<name>` of the repository (its Packages' package-repository-ref). */
  ref: string;
  /**
   * The pinned source's lookup digest (`repoIndexSourceDigest`) when `spec.fetch` is pinned and
   * passes the URL policy: a hit then skips vendir too. A tag or branch the fleet polls arrives
   * here already pinned (`../source-poll.ts`); absent for a selection, a source with a Secret or
   * one that could not be resolved: those are fetched and only the template is skipped.
   */
  source?: string;
}

/**
 * The index plan of a run, or `undefined` when the fetch uses a Secret (its content is sealed per
 * cluster and never shared).
 * @throws what the URL policy check throws for reasons other than a refusal (DNS failures are
 *   refusals: the fetch then runs and reports them)
 */
export async function planRepoIndex(
  pkgr: PackageRepository,
  ref: { namespace: string; name: string },
  deps: PipelineDeps,
): Promise<RepoIndexPlan | undefined> {
  const fetch = [pkgr.spec.fetch];
  if (fetchIsPrivate(fetch)) return undefined;
  const v = deps.config.toolVersions;
  const recipe: RepoIndexRecipe = {
    bundle: Boolean(pkgr.spec.fetch.imgpkgBundle),
    tools: { ytt: v.ytt ?? '', kbld: v.kbld ?? '' },
  };
  const plan: RepoIndexPlan = { recipe, ref: `${ref.namespace}/${ref.name}` };
  // As an App's pinned fetch: keyed by the cluster's fetch configuration too (`../app/fetch.ts`).
  const identity = pinnedFetchIdentity(
    fetch,
    v.vendir ?? '',
    {},
    deps.clusterConfig ? fetchConfigDigest(deps.clusterConfig) : '',
  );
  if (!identity) return plan;
  // A source this runtime's URL policy refuses is never served from the index: the fetch runs
  // and fails with the policy's message.
  if (!(await fetchPassesUrlPolicy(fetch, deps))) return plan;
  return { ...plan, source: repoIndexSourceDigest(identity, recipe) };
}

/** The index digest of a shared fetch artifact, or `undefined` for a private key. */
export function indexDigestOf(plan: RepoIndexPlan, fetchKey: string): string | undefined {
  const parsed = parseArtifactKey(fetchKey);
  return parsed?.kind === 'fetch' ? repoIndexDigest(parsed.sha256, plan.recipe) : undefined;
}

/** The index of a pinned source, before any fetch. */
export async function findPinnedIndex(
  plan: RepoIndexPlan | undefined,
  deps: PipelineDeps,
): Promise<RepoIndexHit | undefined> {
  const source = plan?.source;
  if (!source) return undefined;
  return await infraStep('reading the repository index', () => findRepoIndex(deps.store, source));
}

/**
 * The index of a fetched tree (`fetchKey`), before templating it. A hit for a pinned source that
 * had no record of its own (the index was built from a tag or branch with the same content) also
 * records the source, with this run's `fetchStdout`, so its next run skips the fetch.
 */
export async function findFetchedIndex(
  plan: RepoIndexPlan | undefined,
  fetchKey: string,
  fetchStdout: string,
  deps: PipelineDeps,
): Promise<RepoIndexHit | undefined> {
  const digest = plan && indexDigestOf(plan, fetchKey);
  if (!digest) return undefined;
  const hit = await infraStep('reading the repository index', () => findRepoIndex(deps.store, digest));
  const source = plan.source;
  if (hit && source) {
    await infraStep('storing the repository index', () =>
      storeSourceRecord(deps.store, source, hit, redactSecrets(fetchStdout)),
    );
  }
  return hit;
}

/**
 * Stores the index a run rendered (no-op without a plan or for a private fetch artifact).
 * @param rendered - the manifest and versions, and the fetch stdout and template stderr the
 *   status of a later hit shows (secrets redacted before they are stored)
 */
export async function storeIndex(
  plan: RepoIndexPlan | undefined,
  fetchKey: string,
  rendered: { manifest: string; versions?: RepoVersions; fetchStdout: string; templateStderr: string },
  deps: PipelineDeps,
): Promise<void> {
  const index = plan && indexDigestOf(plan, fetchKey);
  if (!plan || !index) return;
  await infraStep('storing the repository index', () =>
    storeRepoIndex(deps.store, {
      index,
      manifest: rendered.manifest,
      versions: rendered.versions ?? {},
      ref: plan.ref,
      fetchStdout: redactSecrets(rendered.fetchStdout),
      templateStderr: redactSecrets(rendered.templateStderr),
      ...(plan.source ? { source: plan.source } : {}),
    }),
  );
}

/** The stage result a hit reports for a skipped tool: exit code 0 with the recorded output. */
export function cachedResult(output: { stdout?: string; stderr?: string }): StageResult {
  return { stdout: output.stdout ?? '', stderr: output.stderr ?? '', exitCode: 0, finished: true };
}
