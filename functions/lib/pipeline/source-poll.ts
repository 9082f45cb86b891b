/**
 * Event-driven upgrades across the fleet (docs/decisions.md D9): a tagged PackageRepository or
 * App source is polled once per period for the whole fleet, not once per cluster or App, and a
 * tag or branch that moves sends every cluster's PackageRepositories and Apps on it a reconcile
 * event at once. Issue 24 item 2 brought Apps in, and with them http sources without `sha256`
 * (resolved to the body's sha256) and helm chart versions (resolved through the chart
 * repository's `index.yaml` to `<version>@sha256:<digest>`).
 *
 * - **Source poll record**, one per distinct source (`imgpkgBundle`/`image` by tag, `git` by
 *   branch or tag, or a `tagSelection`/`refSelection`; `http` without `sha256`; `helmChart`; no
 *   Secret: `sourceTracked` of `../api/pin-rule.ts`, the rule the
 *   forwarder's quiet rule reads too), keyed by the source's identity, not the cluster:
 *   `cache/source-poll/sha256/<hex>.json` = {@link SourcePollRecord} (`resolved` digest, commit,
 *   http body sha256 or chart `<version>@sha256:<digest>`,
 *   `polledAt`, `changedAt`, and the members `cluster/namespace/name`, each with its `kind` (App;
 *   absent: a PackageRepository, as in records written before Apps joined) and the `resolved` it
 *   last deployed (a repository) or fetched (an App)). Every write is a compare-and-swap (`ObjectStore.putIfMatch`), so of the
 *   pollers of one period one wins and the others read its result.
 * - **Resolution** without vendir: one registry `HEAD` of the manifest
 *   (`../fetch/registry-digest.ts`), one `git ls-remote` (`../fetch/git-ls-remote.ts`), one GET
 *   hashed (`../fetch/http-digest.ts`) or one `index.yaml` GET (`../fetch/helm-index.ts`); for a
 *   selection, vendir's choice over the registry's tag list then that tag's `HEAD`, or over
 *   `git ls-remote --tags` (`../fetch/tag-selection.ts`); under the URL policy.
 * - **A repository run** ({@link trackSource}) uses a record younger than the poll period as is,
 *   else resolves and writes it, joins the members, and fetches the source pinned to `resolved`
 *   (so an indexed digest runs kapp only). The run that fetched and templated the new digest (the
 *   fleet's one) sends `ref-changed` to the members still behind as soon as it stored the index
 *   ({@link memberIndexed}), while its own kapp deploys; after its deploy ({@link memberDeployed})
 *   a run records the digest it deployed.
 * - **An App's fetch stage** ({@link trackAppSources}) does the same per polled `spec.fetch[]`
 *   entry, joining as an App member at the `resolved` it fetches, and fetches that entry pinned
 *   to it: Apps on one source, in any namespace or cluster, share one pinned fetch
 *   (`../fetch/pinned.ts`). A deleted App leaves its records ({@link leaveSource}).
 * - **The poll** ({@link pollSources}: a timer in the embedded runtime, an EventBridge schedule of
 *   the index-repo function on Lambda) resolves every record older than the period (one request
 *   per source, whatever the fleet size) and pokes members behind `resolved`: when nobody has
 *   deployed or indexed the new digest yet, only the first member (the leader: it fetches and
 *   templates once, then pokes the rest itself), else every member behind; a leader that did not move
 *   within {@link LEADER_GRACE_MS} makes the poll poke them all. Apps have no leader: every App
 *   behind is poked at once (each renders its own templates; the render cache dedupes identical
 *   ones), with cause `source moved: <kind> <url> <ref>@<resolved>`.
 * - **A source the poll cannot resolve** (server down, tag or branch gone, URL refused) marks its
 *   record `failingSince`, and the poll that saw it fail pokes every member once (cause `source
 *   poll failed: <kind> <url> <ref>`). A member's run does not reuse a failing record: it
 *   resolves for itself and, failing too, fetches by ref, so its status says what is wrong as
 *   upstream's next sync would, and a failed App keeps its syncPeriod until the source is back.
 *   A good resolution clears the mark.
 * - **Record checks** (embedded runtime only): the leader pokes only the members its own runtime
 *   serves, and a poll pokes only those too, so in a fleet of runtimes each serving some clusters
 *   the rest learned of a move or of the leader's deploy at their own next poll (up to a period
 *   per hop, two hops). Between polls each runtime reads the records every
 *   `config.sourceCheckPeriodMs` ({@link DEFAULT_SOURCE_CHECK_PERIOD_MS}) and pokes its members
 *   behind by the same rule ({@link pollSources} with `resolve: false`): no registry request, so
 *   still one resolution per source per period for the fleet.
 *
 * The forwarders stay read-only: everything here happens in the functions, and the `ref-changed`
 * events go through the runtime's transport (`deps.emit`), as the forwarders' own events do.
 *
 * @module
 */

import pMap from 'p-map';
import {
  type KappEvent,
  type ObjectRef,
  objectEvent,
  SOURCE_FAILED_CAUSE_PREFIX,
  SOURCE_MOVED_CAUSE_PREFIX,
} from '../../../events/schema.js';
import type { App, AppFetch, PackageRepository, PackageRepositoryFetch } from '../api/index.js';
import { canonicalJson, sha256Hex } from '../artifact/keys.js';
import {
  type PolledFetch,
  type PolledSource,
  pinnedFetchOf,
  polledSourceOf,
  resolveSource,
} from '../fetch/source-resolve.js';
import { fetchPassesUrlPolicy } from '../fetch/url-policy.js';
import { APP_API_VERSION, type KubeObject, PACKAGING_API_VERSION } from '../kube/port.js';
import { hasTrueCondition } from '../reconcile/timer.js';
import type { ObjectStore } from '../store/port.js';
import type { PipelineDeps } from './deps.js';

/** Default poll period of a source, ms: 1 minute (one request per source per minute). */
export const DEFAULT_SOURCE_POLL_PERIOD_MS = 60_000;
/**
 * Default period of an embedded runtime's record checks between its polls, ms: 2 s (reads of the
 * local or shared object store only; see `sourceCheckPeriodMs` of the pipeline config).
 */
export const DEFAULT_SOURCE_CHECK_PERIOD_MS = 2_000;
/** How long the poll lets the leader build a new digest's index before poking every member, ms. */
export const LEADER_GRACE_MS = 5 * 60_000;
/** Where the poll records live. */
export const SOURCE_POLL_PREFIX = 'cache/source-poll/sha256/';
/**
 * Most members one cluster may hold in a source's record: 100. The record is shared by every
 * cluster on the source and rewritten whole on each join and deploy; without a bound one
 * tenant's thousands of repositories on a popular public tag grew it (and the compare-and-swap
 * conflicts of everyone on it) without limit. A repository past the bound still fetches the
 * record's digest; it is not poked when the tag moves and upgrades on its own sync period.
 */
export const MAX_MEMBERS_PER_CLUSTER = 100;
/**
 * Shortest time between two pokes of one App for moves of its source, ms: 1 minute, the default
 * poll period (see `PollOptions.pokedAt`). Not the poll period itself: a runtime that relies on
 * record checks may poll rarely, and a second move must still reach its Apps.
 */
export const APP_POKE_INTERVAL_MS = 60_000;
/** Sources {@link pollSources} resolves at once: 8. */
export const POLL_CONCURRENCY = 8;
/**
 * Members one poke reads at once (their cluster loaded, their object read), and clusters one
 * poke loads at once: 8. One after another, a member cluster that held each request to the
 * client's 120 s bound held every member behind it (100 such members: 100 × 120 s, beyond the
 * 900 s function), and one that refused connections failed the poke of every member after it.
 */
export const MEMBER_CONCURRENCY = 8;
/**
 * Longest a poke waits for one member or one member cluster, ms: 20 s, far below the index-repo
 * function's 900 s, and cut sooner by the function deadline (`deps.deadline`). A member past it
 * is logged, counted ({@link PollSummary.memberFailures}) and left for the next poll or record
 * check (nothing marks it poked); the other members' events are sent meanwhile.
 */
export const MEMBER_DEADLINE_MS = 20_000;
/**
 * Compare-and-swap attempts before a record update gives up: every member of a source joins and
 * records its deploy in the one record, so a fleet of N repositories reconciling at once makes up
 * to N-1 conflicts for the last writer (10 attempts lost members at 20 cluster ids in the upgrade
 * bench). Conflicts wait {@link casBackoffMs} before the next read.
 */
const CAS_ATTEMPTS = 60;

/** Jittered wait after the `attempt`-th lost compare-and-swap, ms: up to 10·2^min(attempt,5) (≤ 320). */
function casBackoffMs(attempt: number): number {
  return Math.random() * 10 * 2 ** Math.min(attempt, 5);
}

/**
 * Runs `work` on every item, at most `concurrency` at once (p-map), and starts no item once
 * `stop()` says so; each item's result (or `undefined`, not started) in item order.
 */
function pooled<T, R>(
  items: readonly T[],
  concurrency: number,
  work: (item: T) => Promise<R>,
  stop: () => boolean = () => false,
): Promise<(R | undefined)[]> {
  return pMap(items, (item) => (stop() ? undefined : work(item)), { concurrency: Math.max(1, concurrency) });
}

/** `items` from index `floor(start · length)` on, then the ones before it (`start` on `[0, 1)`). */
function rotated<T>(items: readonly T[], start: number): T[] {
  const from = Math.floor(Math.min(Math.max(start, 0), 0.999_999) * items.length);
  return [...items.slice(from), ...items.slice(0, from)];
}

/** A member (or its cluster) did not answer within {@link MEMBER_DEADLINE_MS} or the function deadline. */
export class MemberTimeoutError extends Error {
  override readonly name = 'MemberTimeoutError';
}

/**
 * `step()`, given up after {@link MEMBER_DEADLINE_MS} or when `deps.deadline` fires, whichever
 * comes first (the step itself is left to end on its own; nothing of it is used).
 * @throws MemberTimeoutError; what `step` throws
 */
async function withinMemberDeadline<T>(
  step: () => Promise<T>,
  deps: Pick<PipelineDeps, 'deadline'>,
  what: string,
): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  let onAbort: (() => void) | undefined;
  const cut = new Promise<never>((_, reject) => {
    const fail = () => reject(new MemberTimeoutError(`${what}: no answer within the member deadline`));
    if (deps.deadline?.aborted) return fail();
    timer = setTimeout(fail, MEMBER_DEADLINE_MS);
    timer.unref?.();
    onAbort = fail;
    deps.deadline?.addEventListener('abort', onAbort, { once: true });
  });
  try {
    return await Promise.race([step(), cut]);
  } finally {
    clearTimeout(timer);
    if (onAbort) deps.deadline?.removeEventListener('abort', onAbort);
  }
}

/** The kinds that join a source's record: absent in a member means `PackageRepository` (records written before Apps joined). */
export type MemberKind = 'App' | 'PackageRepository';

/** One PackageRepository or App on a source. */
export interface SourceMember {
  /** What it is (poked as); absent: a PackageRepository. */
  kind?: MemberKind;
  cluster: string;
  namespace: string;
  name: string;
  /** `metadata.uid` when it joined. */
  uid: string;
  /**
   * The `resolved` value it last deployed (a repository: written after its deploy) or fetched
   * (an App: written when its fetch joins, since a failed App keeps its sync period anyway).
   */
  at?: string;
}

/** The fleet-wide poll record of one source (JSON, version 1). */
export interface SourcePollRecord {
  v: 1;
  source: PolledSource;
  /** Image digest `sha256:<hex>`, git commit id, http body hex sha256, or chart `<version>@sha256:<hex>`. */
  resolved: string;
  /** RFC 3339 time of the last resolution. */
  polledAt: string;
  /** RFC 3339 time `resolved` last changed. */
  changedAt: string;
  members: SourceMember[];
  /**
   * The `resolved` value whose repository index the fleet has stored (written by the leader as
   * soon as it stored it, before its own deploy): the members behind may then be poked, they find
   * the index and run kapp only. Absent in records written before it existed.
   */
  indexed?: string;
  /**
   * RFC 3339 time of the first failed resolution since the last good one, while the source
   * cannot be polled; absent when the last resolution succeeded. Its members' runs then resolve
   * for themselves (and, failing, fetch by ref and report it as upstream's sync would) instead
   * of reusing `resolved`, and the poll that saw it fail pokes them once ({@link pollSources}).
   */
  failingSince?: string;
}

export type { PolledSource } from '../fetch/source-resolve.js';
export { pinnedFetchOf, polledSourceOf } from '../fetch/source-resolve.js';

/** The poll period in force, ms (`config.sourcePollPeriodMs`, default {@link DEFAULT_SOURCE_POLL_PERIOD_MS}). */
export function sourcePollPeriodMs(deps: Pick<PipelineDeps, 'config'>): number {
  return deps.config.sourcePollPeriodMs ?? DEFAULT_SOURCE_POLL_PERIOD_MS;
}

/** The record check period in force, ms (`config.sourceCheckPeriodMs`, default {@link DEFAULT_SOURCE_CHECK_PERIOD_MS}; 0: off). */
export function sourceCheckPeriodMs(deps: Pick<PipelineDeps, 'config'>): number {
  return deps.config.sourceCheckPeriodMs ?? DEFAULT_SOURCE_CHECK_PERIOD_MS;
}

/** The record key of a source: `cache/source-poll/sha256/<sha256 of its identity>.json`. */
export function sourcePollKey(source: PolledSource): string {
  return `${SOURCE_POLL_PREFIX}${sha256Hex(canonicalJson({ v: 1, ...source }))}.json`;
}

/** The resolver in force: `deps.resolveSource`, or {@link resolveSource}. */
function resolverOf(deps: PipelineDeps): (source: PolledSource) => Promise<string> {
  return (
    deps.resolveSource ??
    ((source) =>
      resolveSource(source, {
        runner: deps.runner,
        ...(deps.config.urlPolicy ? { urlPolicy: deps.config.urlPolicy } : {}),
        // The fleet's progress rule, as the fetch's own download of the source gets it.
        ...(deps.config.fetchStall ? { stall: deps.config.fetchStall } : {}),
      }))
  );
}

/** Parses a stored record; `undefined` for a missing or malformed one. */
function parseRecord(body: Buffer | undefined): SourcePollRecord | undefined {
  if (!body) return undefined;
  try {
    const r = JSON.parse(body.toString('utf8')) as SourcePollRecord;
    return r?.v === 1 && typeof r.resolved === 'string' && Array.isArray(r.members) ? r : undefined;
  } catch {
    return undefined;
  }
}

/**
 * The message of `err.cause` (a StoreError wraps the filesystem or S3 error that explains it), or
 * `undefined`; logged beside the error so a failing record update says why (no content, no keys).
 */
export function causeOf(err: unknown): string | undefined {
  const cause = (err as { cause?: unknown } | undefined)?.cause;
  return cause === undefined ? undefined : cause instanceof Error ? cause.message : String(cause);
}

/**
 * The source could not be resolved (registry or git server error, refused URL): the repository
 * run fetches by tag. Only this error falls back so; a record that cannot be read or written
 * fails the run, which is retried, rather than leaving the repository out of the members.
 */
export class SourceResolutionError extends Error {
  override readonly name = 'SourceResolutionError';
  /**
   * @param record - the source's record as marked failing by this failure (a poll that claimed
   *   an existing record), for the poll's pokes; absent when there was no record to mark
   */
  constructor(
    source: PolledSource,
    cause: unknown,
    readonly record?: SourcePollRecord,
  ) {
    super(`resolving ${source.url} failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
  }
}

/** Reads a record. @throws StoreError */
export async function readSourcePoll(store: ObjectStore, key: string): Promise<SourcePollRecord | undefined> {
  return parseRecord(await store.get(key));
}

/**
 * Read-modify-write of a record under compare-and-swap: `change` gets the current record (or
 * `undefined`) and returns the new one, or `undefined` to leave it as is. Retried on conflict.
 * @returns the record as stored after the update (or as read when unchanged).
 * @throws StoreError; Error when {@link CAS_ATTEMPTS} writes in a row lost
 */
export async function updateSourcePoll(
  store: ObjectStore,
  key: string,
  change: (cur: SourcePollRecord | undefined) => SourcePollRecord | undefined,
): Promise<SourcePollRecord | undefined> {
  for (let i = 0; i < CAS_ATTEMPTS; i++) {
    const got = await store.getVersioned(key);
    const cur = parseRecord(got?.body);
    const next = change(cur);
    if (!next) return cur;
    // A malformed record is replaced as if absent, under its version.
    if ((await store.putIfMatch(key, JSON.stringify(next), got?.etag)) === 'written') return next;
    await new Promise((r) => setTimeout(r, casBackoffMs(i)));
  }
  throw new Error(`source poll record ${key}: ${CAS_ATTEMPTS} conflicting writes in a row`);
}

/** Whether a member is an App (else a PackageRepository). */
const isApp = (m: Pick<SourceMember, 'kind'>) => m.kind === 'App';

/** A member's id: `cluster/namespace/name` for a repository (as before Apps joined), `App:…` for an App. */
const memberId = (m: Pick<SourceMember, 'kind' | 'cluster' | 'namespace' | 'name'>) =>
  `${isApp(m) ? 'App:' : ''}${m.cluster}/${m.namespace}/${m.name}`;

/** The member id of an object (its kind decides, see {@link memberId}). */
const objectMemberId = (o: Pick<ObjectRef, 'kind' | 'clusterId' | 'namespace' | 'name'>) =>
  memberId({
    kind: o.kind === 'App' ? 'App' : 'PackageRepository',
    cluster: o.clusterId,
    namespace: o.namespace,
    name: o.name,
  });

/**
 * Slack of {@link isFresh}: a tenth of the period, at most 5 s. A poller's timer fires once per
 * period, but its claim lands a little after each tick (a run's start, a store round trip), so
 * with no slack a tick that reaches the check sooner than the last one reached its claim finds
 * the record still fresh, skips, and the source waits almost two periods. With it a source is
 * resolved at most once per 0.9 period.
 */
export function pollFreshSlackMs(periodMs: number): number {
  return Math.min(periodMs / 10, 5000);
}

/**
 * Whether `rec` was polled less than one period (less {@link pollFreshSlackMs}) before `now`.
 * A `polledAt` later than `now` (beyond the same slack, for clocks apart) is not fresh: no
 * poller wrote it, and a record dated in 2100 would otherwise never be polled again.
 */
function isFresh(rec: SourcePollRecord, now: Date, periodMs: number): boolean {
  const age = now.getTime() - Date.parse(rec.polledAt);
  const slack = pollFreshSlackMs(periodMs);
  return age >= -slack && age < periodMs - slack;
}

/** `rec` (or a new record) with a new resolution at `now`. */
function polled(
  rec: SourcePollRecord | undefined,
  source: PolledSource,
  resolved: string,
  now: Date,
): SourcePollRecord {
  const at = now.toISOString();
  return {
    v: 1,
    source,
    resolved,
    polledAt: at,
    changedAt: rec && rec.resolved === resolved ? rec.changedAt : at,
    members: rec?.members ?? [],
  };
}

/** `rec` resolved again to its `resolved`: no longer failing. */
function withoutFailing(rec: SourcePollRecord): SourcePollRecord {
  const { failingSince: _, ...rest } = rec;
  return rest;
}

/** What {@link pollIfDue} did. */
interface PollOutcome {
  /** The record after the poll (`undefined`: none, and none could be made). */
  rec: SourcePollRecord | undefined;
  /** Whether this call resolved the source (sent the request). */
  polled: boolean;
  /** Whether `resolved` moved. */
  changed: boolean;
}

/**
 * Polls `source` when its record is absent or older than the period, or always when `force`, or
 * (`forRun`: a member's run) when the record is failing. A stale record is claimed
 * first (compare-and-swap of `polledAt`), so of concurrent pollers only the winner sends the
 * request; it then writes what it resolved. A resolution that fails after the claim leaves the
 * previous `resolved` in the record, marked `failingSince`, until a resolution succeeds.
 * @throws SourceResolutionError; StoreError, or Error when {@link updateSourcePoll} gave up
 */
async function pollIfDue(
  key: string,
  source: PolledSource,
  deps: PipelineDeps,
  force = false,
  forRun = false,
): Promise<PollOutcome> {
  const periodMs = sourcePollPeriodMs(deps);
  let claimed = false;
  const claim = await updateSourcePoll(deps.store, key, (cur) => {
    // A run does not reuse a record the poll could not resolve: it resolves for itself, so a
    // source that stays unreachable fails the run as upstream's fetch by ref would.
    const failing = forRun && cur?.failingSince !== undefined;
    claimed = cur !== undefined && (force || failing || !isFresh(cur, deps.now(), periodMs));
    return claimed && cur ? { ...cur, polledAt: deps.now().toISOString() } : undefined;
  });
  if (claim && !claimed) return { rec: claim, polled: false, changed: false };
  let resolved: string;
  try {
    resolved = await resolverOf(deps)(source);
  } catch (err) {
    // The members' runs must not keep reusing the last `resolved` as if the source were
    // reachable: mark the record failing (the first failure's time is kept).
    const failing =
      claim &&
      (await updateSourcePoll(deps.store, key, (cur) =>
        cur && !cur.failingSince ? { ...cur, failingSince: deps.now().toISOString() } : undefined,
      ));
    throw new SourceResolutionError(source, err, failing || undefined);
  }
  const rec = await updateSourcePoll(deps.store, key, (cur) =>
    cur?.resolved === resolved
      ? cur.failingSince
        ? withoutFailing(cur)
        : undefined
      : polled(cur, source, resolved, deps.now()),
  );
  const changed = claim !== undefined && rec?.resolved !== claim.resolved;
  if (changed) deps.log.info({ source: source.url, ref: source.ref, resolved }, 'source moved to a new digest');
  return { rec, polled: true, changed };
}

/** What a run tracks of one polled source. */
export interface TrackedSource<F extends PolledFetch = PackageRepositoryFetch> {
  /** The record key. */
  key: string;
  /** The digest or commit the run fetches. */
  resolved: string;
  /** The fetch pinned to `resolved`. */
  fetch: F;
}

/**
 * For a repository run: the pinned fetch of its polled source, from a fresh record or a
 * resolution of its own (written for the fleet), with the repository joined to the members.
 *
 * @returns `undefined` when the source is not polled (see {@link polledSourceOf}), the URL policy
 *   refuses it (the fetch then runs and reports that), or the resolution failed (logged; the run
 *   fetches by tag as before, and vendir reports what is wrong).
 * @throws StoreError, or Error when {@link updateSourcePoll} gave up: the record could not be
 *   read, claimed or joined; the run is retried, so the repository is never left out of the
 *   members it must be poked as.
 */
export async function trackSource(
  pkgr: PackageRepository,
  object: ObjectRef,
  deps: PipelineDeps,
): Promise<TrackedSource | undefined> {
  // An http repository keeps its timer and fetches as written: its pinned fetch would fail when
  // the body is not the one the poll hashed, and the repository's fetch has no fallback for it
  // (the App's fetch stage has: `./app/fetch.ts`). `repositoryInputsFixed` of the forwarder agrees.
  if (pkgr.spec.fetch.http) return undefined;
  return await trackFetch(pkgr.spec.fetch, memberOf(object, 'PackageRepository'), deps);
}

/** What an App's fetch stage tracks of its polled sources. */
export interface TrackedAppSources {
  /** `spec.fetch` with each polled entry pinned to its record's `resolved` (the others as they were). */
  fetch: AppFetch[];
  /** The polled entries, in `spec.fetch` order. */
  tracked: TrackedSource<AppFetch>[];
}

/**
 * For an App's fetch stage: each `spec.fetch[]` entry the poll follows (see {@link polledSourceOf},
 * the rule the forwarder's quiet rule shares) joins its source's record as an App member, at the
 * `resolved` it will fetch, and is fetched pinned to it: two Apps on one branch or tag, in any
 * namespace or cluster, then share one pinned fetch (`../fetch/pinned.ts`), and a move pokes
 * them ({@link pollSources}). An entry whose resolution failed or whose URL the policy refuses is
 * fetched as written (as {@link trackSource}).
 * @throws StoreError, or Error when {@link updateSourcePoll} gave up (the run is retried)
 */
export async function trackAppSources(app: App, object: ObjectRef, deps: PipelineDeps): Promise<TrackedAppSources> {
  const fetch = [...(app.spec.fetch ?? [])];
  const tracked: TrackedSource<AppFetch>[] = [];
  const self = memberOf(object, 'App');
  // A spec not reconciled yet resolves its sources now, as upstream's fetch by ref reaches the
  // source on every change: an unreachable registry or git server fails a new generation
  // as upstream's does, instead of a fresh record and the pinned fetch cache hiding it. Not
  // `observedGeneration` alone: a new generation's run wrote it with `Reconciling` before this
  // stage. Only a resync of a generation that succeeded uses a fresh record as it is.
  const force = !(
    app.status?.observedGeneration === app.metadata.generation &&
    hasTrueCondition(app.status?.conditions, 'ReconcileSucceeded')
  );
  for (const [i, entry] of fetch.entries()) {
    const t = await trackFetch(entry, self, deps, { atJoin: true, force });
    if (!t) continue;
    fetch[i] = t.fetch;
    tracked.push(t);
  }
  return { fetch, tracked };
}

/**
 * The member an object joins as. A repository's entry carries no `kind` (its absence means
 * PackageRepository), so records stay as they were for repositories and readable both ways.
 */
function memberOf(object: ObjectRef, kind: MemberKind): SourceMember {
  return {
    ...(kind === 'App' ? { kind } : {}),
    cluster: object.clusterId,
    namespace: object.namespace,
    name: object.name,
    uid: object.uid,
  };
}

/**
 * The pinned fetch of one polled source, `self` joined to its record (with `at` = the record's
 * `resolved` when `opts.atJoin`), resolved now when `opts.force` even if the record is fresh;
 * see {@link trackSource} for `undefined` and the errors.
 */
async function trackFetch<F extends PolledFetch>(
  fetch: F,
  self: SourceMember,
  deps: PipelineDeps,
  opts: { atJoin?: boolean; force?: boolean } = {},
): Promise<TrackedSource<F> | undefined> {
  const source = polledSourceOf(fetch);
  if (!source) return undefined;
  if (!(await fetchPassesUrlPolicy([fetch], deps))) return undefined;
  const key = sourcePollKey(source);
  let due: PollOutcome;
  try {
    due = await pollIfDue(key, source, deps, opts.force, true);
  } catch (err) {
    if (!(err instanceof SourceResolutionError)) throw err;
    deps.log.warn(
      { source: source.url, ref: source.ref, err: (err.cause as Error | undefined)?.message ?? err.message },
      'source resolution failed; fetching by tag',
    );
    return undefined;
  }
  if (!due.rec) return undefined;
  const rec =
    (await updateSourcePoll(deps.store, key, (cur) =>
      joined(cur, opts.atJoin && cur ? { ...self, at: cur.resolved } : self),
    )) ?? due.rec;
  return { key, resolved: rec.resolved, fetch: pinnedFetchOf(fetch, rec.resolved) };
}

/**
 * `cur` with `self` among its members (replacing an entry of the same id with another uid, or
 * with another `at` when `self` has one), members sorted by id; `undefined` when there is nothing
 * to change, no record, or `self`'s cluster already has {@link MAX_MEMBERS_PER_CLUSTER} others.
 */
function joined(cur: SourcePollRecord | undefined, self: SourceMember): SourcePollRecord | undefined {
  const mine = cur?.members.find((m) => memberId(m) === memberId(self));
  if (!cur || (mine && mine.uid === self.uid && (self.at === undefined || mine.at === self.at))) return undefined;
  const others = cur.members.filter((m) => memberId(m) !== memberId(self));
  if (others.filter((m) => m.cluster === self.cluster).length >= MAX_MEMBERS_PER_CLUSTER) return undefined;
  const members = [...others, self];
  return { ...cur, members: members.sort((a, b) => (memberId(a) < memberId(b) ? -1 : 1)) };
}

/**
 * Whether this runtime serves `clusterId` now (known, and led here in the embedded runtime). A
 * registry that loads clusters at run time (the fleet registry on Lambda) is asked to load it
 * first: a scheduled poll starts with none loaded, and would otherwise poke no member at all.
 * The load is bounded by the member deadline ({@link withinMemberDeadline}).
 * @returns `'failed'` when the load threw or timed out (logged): the cluster's members are
 *   counted as failures, not as served elsewhere.
 */
async function serves(deps: PipelineDeps, clusterId: string): Promise<boolean | 'failed'> {
  const prepare = deps.clusters.prepare;
  if (prepare) {
    try {
      await withinMemberDeadline(() => prepare.call(deps.clusters, clusterId), deps, `loading cluster ${clusterId}`);
    } catch (err) {
      deps.log.warn({ clusterId, err: (err as Error).message }, 'source poll: cluster not loaded; member skipped');
      return 'failed';
    }
  }
  if (!deps.clusters.clusterIds().includes(clusterId)) return false;
  try {
    deps.clusters.deployView(clusterId);
    return true;
  } catch {
    return false;
  }
}

/** The members of {@link filterServed}. */
interface ServedMembers {
  /** The members whose cluster this runtime serves. */
  served: SourceMember[];
  /** The members whose cluster could not be loaded ({@link serves} `'failed'`). */
  failed: SourceMember[];
}

/**
 * The members whose cluster this runtime serves ({@link serves}), each cluster asked once,
 * {@link MEMBER_CONCURRENCY} clusters at once: one cluster whose load hangs or fails holds
 * no other's.
 */
async function filterServed(members: readonly SourceMember[], deps: PipelineDeps): Promise<ServedMembers> {
  const clusters = [...new Set(members.map((m) => m.cluster))];
  const answers = await pooled(clusters, MEMBER_CONCURRENCY, (c) => serves(deps, c));
  const served = new Map(clusters.map((c, i) => [c, answers[i]]));
  return {
    served: members.filter((m) => served.get(m.cluster) === true),
    failed: members.filter((m) => served.get(m.cluster) === 'failed'),
  };
}

/** Whether the object as read still fetches the source of `key` (an App: any of its entries). */
function stillOn(obj: { spec?: unknown }, kind: MemberKind, key: string): boolean {
  const spec = obj.spec as { fetch?: unknown } | undefined;
  const fetches = (kind === 'App' ? (Array.isArray(spec?.fetch) ? spec.fetch : []) : [spec?.fetch]) as PolledFetch[];
  return fetches.some((f) => {
    const source = f && typeof f === 'object' ? polledSourceOf(f) : undefined;
    return source !== undefined && sourcePollKey(source) === key;
  });
}

/** What {@link pokeMembers} did, member by member. */
interface PokeOutcome {
  /** The ids ({@link memberId}) of the members sent `ref-changed`. */
  sent: Set<string>;
  /** Members whose cluster or object could not be read within the member deadline (logged). */
  failed: number;
  /** Repositories not poked because `spec.paused` (a paused run does nothing; unpausing reconciles it). */
  paused: number;
}

/** An empty {@link PokeOutcome}, or the sum of `outcomes`. */
function pokeOutcome(...outcomes: PokeOutcome[]): PokeOutcome {
  return {
    sent: new Set(outcomes.flatMap((o) => [...o.sent])),
    failed: outcomes.reduce((n, o) => n + o.failed, 0),
    paused: outcomes.reduce((n, o) => n + o.paused, 0),
  };
}

/** Options of {@link pokeMembers}. */
interface PokeOptions {
  /** The poke of a source the poll cannot resolve (its cause says so), else of a move to `rec.resolved`. */
  failing?: boolean;
  /**
   * Send one event only, to the first target (in the order given) whose object reads, is still
   * on the source and is not paused: the leader. Read {@link MEMBER_CONCURRENCY} at a time.
   */
  leader?: boolean;
}

/**
 * Sends `ref-changed` to `targets` (members this runtime serves), after reading each: a
 * repository or App that is gone, was recreated (another uid) or now names another source
 * leaves the record instead, and a paused repository is skipped. Each member on its own,
 * {@link MEMBER_CONCURRENCY} at once, each read bounded by {@link withinMemberDeadline}: a member
 * whose cluster refuses connections, hangs or answers late is logged and counted, and every other
 * member's event is still sent.
 * @throws StoreError (leaving the record), TransportError (the send): the caller's event or tick
 *   is retried
 */
async function pokeMembers(
  key: string,
  rec: Pick<SourcePollRecord, 'source' | 'resolved' | 'failingSince'>,
  targets: readonly SourceMember[],
  deps: PipelineDeps,
  opts: PokeOptions = {},
): Promise<PokeOutcome> {
  const { resolved, source } = rec;
  const failingSince = opts.failing ? rec.failingSince : undefined;
  // `<kind> <url> <ref>`; an http source has no ref.
  const what = [source.kind, source.url, source.ref].filter((p) => p !== '').join(' ');
  const outcome = pokeOutcome();
  const events: { id: string; event: KappEvent }[] = [];
  const leave: string[] = [];
  const check = async (m: SourceMember): Promise<KappEvent | undefined> => {
    const kind: MemberKind = isApp(m) ? 'App' : 'PackageRepository';
    const apiVersion = kind === 'App' ? APP_API_VERSION : PACKAGING_API_VERSION;
    let obj: KubeObject | undefined;
    try {
      obj = await withinMemberDeadline(
        () => deps.clusters.deployView(m.cluster).getObject({ apiVersion, kind, namespace: m.namespace, name: m.name }),
        deps,
        `reading ${memberId(m)}`,
      );
    } catch (err) {
      outcome.failed += 1;
      deps.log.warn(
        { key, member: memberId(m), err: (err as Error).message },
        'source poll: member not read; left for the next poll',
      );
      return undefined;
    }
    if (!obj || obj.metadata.uid !== m.uid || !stillOn(obj, kind, key)) {
      leave.push(memberId(m));
      return undefined;
    }
    if (kind === 'PackageRepository' && (obj.spec as { paused?: unknown } | undefined)?.paused === true) {
      outcome.paused += 1;
      return undefined;
    }
    return objectEvent(
      {
        clusterId: m.cluster,
        kind,
        apiVersion,
        namespace: m.namespace,
        name: m.name,
        uid: m.uid,
        generation: obj.metadata.generation ?? 0,
        resourceVersion: obj.metadata.resourceVersion ?? '0',
      },
      'ref-changed',
      // The digest is the cause (part of the event id): a poke for a newer digest is never
      // taken by SQS FIFO deduplication for the copy of an older one at the same resourceVersion.
      // An App's cause says what moved, for its reconcile log.
      // A failing source's poke names the failure's start instead: one id per failure.
      {
        time: deps.now(),
        cause: failingSince
          ? kind === 'App'
            ? `${SOURCE_FAILED_CAUSE_PREFIX}${what}`
            : `source-failed@${failingSince}`
          : kind === 'App'
            ? `${SOURCE_MOVED_CAUSE_PREFIX}${what}@${resolved}`
            : `source@${resolved}`,
      },
    );
  };
  // A leader: the first eligible in the order given, read a pool's worth at a time; else all.
  const step = opts.leader ? MEMBER_CONCURRENCY : Math.max(targets.length, 1);
  for (let i = 0; i < targets.length && !(opts.leader && events.length > 0); i += step) {
    const chunk = targets.slice(i, i + step);
    for (const [j, e] of (await pooled(chunk, MEMBER_CONCURRENCY, check)).entries()) {
      if (!e || (opts.leader && events.length > 0)) continue;
      const id = memberId(chunk[j] as SourceMember);
      events.push({ id, event: e });
      outcome.sent.add(id);
    }
  }
  if (leave.length > 0) {
    await updateSourcePoll(deps.store, key, (cur) =>
      cur ? { ...cur, members: cur.members.filter((m) => !leave.includes(memberId(m))) } : undefined,
    );
  }
  if (events.length > 0) {
    if (!deps.emit) deps.log.warn({ key, events: events.length }, 'no transport for source fan-out events; dropped');
    // In the record's order (by member id), whatever order they were read in.
    else await deps.emit(events.sort((a, b) => (a.id < b.id ? -1 : 1)).map((e) => e.event));
  }
  if (outcome.failed > 0 || outcome.paused > 0) {
    deps.log.info(
      { key, sent: events.length, failed: outcome.failed, paused: outcome.paused },
      'source poll: some members not poked',
    );
  }
  return outcome;
}

/**
 * After a repository run deployed `tracked.resolved`: records it as the member's `at` (joining the
 * member again if the record lost it, e.g. a record recreated since the run's join), and, when
 * `fetched` (this run fetched the digest and has not poked the members through
 * {@link memberIndexed}: it found the fetched content already indexed), sends `ref-changed` to
 * every member this runtime serves that is behind the record.
 * @throws StoreError, KubeApiError, TransportError (the caller retries the run)
 */
export async function memberDeployed(
  tracked: TrackedSource,
  object: ObjectRef,
  fetched: boolean,
  deps: PipelineDeps,
): Promise<void> {
  const self: SourceMember = { ...memberOf(object, 'PackageRepository'), at: tracked.resolved };
  const rec = await updateSourcePoll(deps.store, tracked.key, (cur) => joined(cur, self));
  if (!fetched || !rec || rec.resolved !== tracked.resolved) return;
  await pokeServedBehind(tracked.key, rec, object, deps);
}

/**
 * After the run that fetched `tracked.resolved` stored its repository index (before its own
 * deploy): marks the record `indexed` and sends `ref-changed` to every member this runtime serves
 * that is behind (other runtimes' checks and polls poke theirs on seeing `indexed`). The members
 * find the index and run kapp only, in parallel with the leader's kapp instead of after it.
 * @returns how many were sent.
 * @throws StoreError, KubeApiError, TransportError (the caller retries the run)
 */
export async function memberIndexed(tracked: TrackedSource, object: ObjectRef, deps: PipelineDeps): Promise<number> {
  const rec = await updateSourcePoll(deps.store, tracked.key, (cur) =>
    cur && cur.resolved === tracked.resolved && cur.indexed !== tracked.resolved
      ? { ...cur, indexed: tracked.resolved }
      : undefined,
  );
  if (!rec || rec.resolved !== tracked.resolved) return 0;
  return await pokeServedBehind(tracked.key, rec, object, deps);
}

/** Sends `ref-changed` to the members of `rec` this runtime serves that are behind, except `self`; logs how many. */
async function pokeServedBehind(
  key: string,
  rec: SourcePollRecord,
  self: Pick<ObjectRef, 'clusterId' | 'kind' | 'namespace' | 'name'>,
  deps: PipelineDeps,
): Promise<number> {
  const selfId = objectMemberId(self);
  const { served: behind } = await filterServed(
    rec.members.filter((m) => m.at !== rec.resolved && memberId(m) !== selfId),
    deps,
  );
  if (behind.length === 0) return 0;
  const { sent } = await pokeMembers(key, rec, rotated(behind, Math.random()), deps);
  deps.log.info(
    { source: rec.source.url, resolved: rec.resolved, members: sent.size },
    'new source digest indexed; members reconciled',
  );
  return sent.size;
}

/**
 * A repository or App being deleted leaves the records of its polled sources (`fetch`: the
 * repository's `spec.fetch`, or an App's entries). Without it a record kept a deleted member until
 * the source moved, and a cluster that churns Apps filled its {@link MAX_MEMBERS_PER_CLUSTER}.
 * @throws StoreError
 */
export async function leaveSource(
  fetch: PolledFetch | readonly PolledFetch[],
  object: ObjectRef,
  deps: PipelineDeps,
): Promise<void> {
  const self = objectMemberId(object);
  const keys = new Set<string>();
  for (const f of Array.isArray(fetch) ? fetch : [fetch]) {
    const source = polledSourceOf(f as PolledFetch);
    if (source) keys.add(sourcePollKey(source));
  }
  for (const key of keys) {
    await updateSourcePoll(deps.store, key, (cur) =>
      cur?.members.some((m) => memberId(m) === self)
        ? { ...cur, members: cur.members.filter((m) => memberId(m) !== self) }
        : undefined,
    );
  }
}

/** What one {@link pollSources} did. */
export interface PollSummary {
  /** Records read. */
  sources: number;
  /** Sources resolved by this poll (the others were fresh, or another poller won). */
  polled: number;
  /** Sources whose digest changed in this poll. */
  changed: number;
  /** `ref-changed` events sent. */
  poked: number;
  /** Sources whose resolution failed (logged). */
  failed: number;
  /**
   * Members not poked because their cluster or object could not be read within
   * {@link MEMBER_DEADLINE_MS} (refused, failed, hung; logged): left for the next poll or check.
   */
  memberFailures: number;
  /** Paused repositories not poked. */
  paused: number;
}

/** Options of {@link pollSources}. */
export interface PollOptions {
  /**
   * Member → time of its last poke, kept by a long-lived poller (the embedded timer): an App
   * (`<member>`) is poked for a move at most once per {@link APP_POKE_INTERVAL_MS} (or the
   * period, when shorter) whatever value the source moved to, so a source whose value moves at
   * every resolution (an http body with a timestamp, whose resolution any tenant on the URL can
   * force by bumping its own App's generation) costs each App at most one reconcile a minute; a
   * repository (`<member>@<resolved>`) once per period per value, so a member that keeps failing
   * is poked at most once per period while a new value still reaches it at once (its leader's
   * index, handed on by the record checks); a failing source's pokes are
   * `<member>@failing:<since>`. Default: none.
   */
  pokedAt?: Map<string, number>;
  /**
   * Whether records older than the period are resolved again (the poll proper). `false` makes a
   * record check: the records are only read and the members behind them poked, with no registry
   * or git request, so a runtime that serves some clusters of a fleet acts on another runtime's
   * poll (a tag moved) or leader (the new digest indexed) within one check. Default true.
   */
  resolve?: boolean;
  /**
   * Where in the record list this poll starts, as a fraction on `[0, 1)` (default
   * `Math.random()`): the list is in key order, so without a moving start the sources after a
   * few whose servers hold each request to the timeout would be reached late in every poll,
   * and on Lambda, whose poll must fit one invocation, perhaps never; from a random start
   * every source comes early in some polls.
   */
  start?: number;
  /**
   * Where in a record's repositories behind the leader is looked for, as a fraction on `[0, 1)`
   * (default: from the hash of the record key and its `resolved`, so the leader of one move
   * stays the same across polls while each move starts elsewhere): a member that never builds
   * the index (paused, unreachable, hostile) is not the first one every time. The members of
   * a fan-out are poked in a random rotation for the same reason.
   */
  leaderStart?: number;
}

/**
 * One poll of the fleet's sources (the embedded runtime's timer, the Lambda poll event),
 * {@link POLL_CONCURRENCY} at a time: every record with members older than the period is resolved again and
 * written under compare-and-swap (one poller wins per period), unless `opts.resolve` is false (a
 * record check); then the members this runtime serves that are behind are poked (see the module
 * comment for who).
 * @throws StoreError on a failed list (a failed record is logged and skipped)
 */
export async function pollSources(deps: PipelineDeps, opts: PollOptions = {}): Promise<PollSummary> {
  const summary: PollSummary = { sources: 0, polled: 0, changed: 0, poked: 0, failed: 0, memberFailures: 0, paused: 0 };
  const count = (o: PokeOutcome) => {
    summary.poked += o.sent.size;
    summary.memberFailures += o.failed;
    summary.paused += o.paused;
  };
  const periodMs = sourcePollPeriodMs(deps);
  const started = deps.now().getTime();
  for (const [k, at] of opts.pokedAt ?? []) if (started - at >= periodMs) opts.pokedAt?.delete(k);
  const keys: string[] = [];
  for (let page = await deps.store.list(SOURCE_POLL_PREFIX); ; ) {
    keys.push(...page);
    if (page.length < 1000) break;
    page = await deps.store.list(SOURCE_POLL_PREFIX, { startAfter: page[page.length - 1] });
  }
  const order = rotated(keys, opts.start ?? Math.random());
  const pollOne = async (key: string) => {
    summary.sources += 1;
    try {
      const stored = await readSourcePoll(deps.store, key);
      // A record every member left (deleted objects, sources no longer named) has no one to
      // poke: it is not resolved. Without this each source ever tracked was resolved every
      // period for ever (a tenant's throwaway tags, or a server that answers once and then holds
      // each request to the deadline, ahead of everyone's). A member joining again resolves it.
      if (!stored || stored.members.length === 0) return;
      if (opts.resolve === false && stored.failingSince) {
        count(await pokeFailing(key, stored, deps, opts, periodMs));
        return;
      }
      const due =
        opts.resolve === false
          ? { rec: stored, polled: false, changed: false }
          : await pollIfDue(key, stored.source, deps);
      if (due.polled) summary.polled += 1;
      if (due.changed) summary.changed += 1;
      const rec = due.rec;
      if (!rec) return;
      count(await pokeBehind(key, rec, deps, opts, periodMs));
    } catch (err) {
      summary.failed += 1;
      deps.log.warn({ key, err: (err as Error).message, cause: causeOf(err) }, 'source poll failed');
      if (err instanceof SourceResolutionError && err.record) {
        count(
          await pokeFailing(key, err.record, deps, opts, periodMs).catch((e: unknown) => {
            deps.log.warn({ key, err: (e as Error).message }, 'source poll: members of a failing source not poked');
            return pokeOutcome();
          }),
        );
      }
    }
  };
  // A few sources at a time: one whose server holds its request to the deadline must not hold
  // every source behind it (the record keys are hashes, and the start moves: `opts.start`). None
  // starts once the function deadline has come; the next poll reaches them.
  await pooled(order, POLL_CONCURRENCY, pollOne, () => deps.deadline?.aborted === true);
  return summary;
}

/**
 * The pokes for a record whose source the poll cannot resolve (`failingSince` set): every member
 * this runtime serves, once per failure (only while the failure is younger than a period, and at
 * most once per runtime with `opts.pokedAt`). Each member's run resolves the source itself and,
 * failing too, fetches by ref and reports the failure in status, as upstream's next sync would;
 * a failed App is never quiet, so its forwarder then sends it at its syncPeriod (item 3 of issue
 * 24: "a source cannot be polled" sends the event as before). Without this a fleet's Apps on a
 * source that went away kept their last good status until the safety period.
 */
async function pokeFailing(
  key: string,
  rec: SourcePollRecord,
  deps: PipelineDeps,
  opts: PollOptions,
  periodMs: number,
): Promise<PokeOutcome> {
  const since = rec.failingSince;
  const now = deps.now().getTime();
  if (!since || now - Date.parse(since) >= periodMs) return pokeOutcome();
  // Once per failure: never again while the failure lasts (a new failure has a new `since`).
  return await pokeOnce(key, rec, rec.members, deps, opts, {
    keyOf: (m) => `${memberId(m)}@failing:${since}`,
    intervalOf: () => Number.POSITIVE_INFINITY,
    failing: true,
  });
}

/**
 * Sends `ref-changed` to the `candidates` this runtime serves that `opts.pokedAt` says were not
 * poked under `keyOf(m)` within `intervalOf(m)` ms, and records the pokes there (only of the
 * members sent one: a member that failed, was paused or was not the leader is tried again).
 * `rule.leader`: the repositories among them are candidates for the one leader ({@link pokeMembers}).
 * @returns what was sent (see {@link pokeMembers}); a candidate whose cluster could not be loaded
 *   counts as failed.
 */
async function pokeOnce(
  key: string,
  rec: SourcePollRecord,
  candidates: readonly SourceMember[],
  deps: PipelineDeps,
  opts: PollOptions,
  rule: {
    keyOf: (m: SourceMember) => string;
    intervalOf: (m: SourceMember) => number;
    failing?: boolean;
    leader?: boolean;
  },
): Promise<PokeOutcome> {
  const now = deps.now().getTime();
  const { served, failed } = await filterServed(candidates, deps);
  const due = (m: SourceMember) => {
    const last = opts.pokedAt?.get(rule.keyOf(m));
    return last === undefined || now - last >= rule.intervalOf(m);
  };
  const unloaded = pokeOutcome();
  unloaded.failed = failed.length;
  // The leader candidates, in the fleet's one order for this move (every runtime computes the
  // same): the served ones up to the first another runtime serves (that one's runtime leads) or
  // that was poked already (it leads); a member whose cluster did not load is passed over.
  const leaders: SourceMember[] = [];
  if (rule.leader) {
    const start = opts.leaderStart ?? Number.parseInt(sha256Hex(`${key}\n${rec.resolved}`).slice(0, 8), 16) / 2 ** 32;
    for (const m of rotated(
      candidates.filter((c) => !isApp(c)),
      start,
    )) {
      if (failed.includes(m)) continue;
      if (!served.includes(m) || !due(m)) break;
      leaders.push(m);
    }
  }
  const all = served.filter((m) => (!rule.leader || isApp(m)) && due(m));
  const targets = [...leaders, ...all];
  if (targets.length === 0) return unloaded;
  // Marked before the sends (a check and a poll of one runtime never poke a member twice), and
  // unmarked for the members not sent one.
  for (const m of targets) opts.pokedAt?.set(rule.keyOf(m), now);
  const outcome = pokeOutcome(
    unloaded,
    leaders.length > 0
      ? await pokeMembers(key, rec, leaders, deps, { failing: rule.failing, leader: true })
      : pokeOutcome(),
    all.length > 0
      ? await pokeMembers(key, rec, rotated(all, Math.random()), deps, { failing: rule.failing })
      : pokeOutcome(),
  );
  for (const m of targets) if (!outcome.sent.has(memberId(m))) opts.pokedAt?.delete(rule.keyOf(m));
  return outcome;
}

/** The poll's pokes for one record (see the module comment). */
async function pokeBehind(
  key: string,
  rec: SourcePollRecord,
  deps: PipelineDeps,
  opts: PollOptions,
  periodMs: number,
): Promise<PokeOutcome> {
  const behind = rec.members.filter((m) => m.at !== rec.resolved);
  if (behind.length === 0) return pokeOutcome();
  // The leader is a repository's (it builds the index the others reuse); an App renders its own
  // templates (the render cache dedupes identical ones), so every App behind is poked at once.
  const repos = rec.members.filter((m) => !isApp(m));
  const reposBehind = behind.filter((m) => !isApp(m));
  const someoneAt = rec.indexed === rec.resolved || repos.some((m) => m.at === rec.resolved);
  const leaderLate = deps.now().getTime() - Date.parse(rec.changedAt) > LEADER_GRACE_MS;
  // Until someone is at the new value, one repository leads: the first behind, from a start that
  // moves with each move (`PollOptions.leaderStart`), whose object reads, is still on the source
  // and is not paused (a paused or unreachable first member delayed every move by the grace).
  // An App is poked at most once per APP_POKE_INTERVAL_MS whatever value the source moved to (see
  // `PollOptions.pokedAt`); a repository once per period per value, as its leader's index and
  // the runtimes' record checks hand a new value on.
  return await pokeOnce(key, rec, [...reposBehind, ...behind.filter(isApp)], deps, opts, {
    keyOf: (m) => (isApp(m) ? memberId(m) : `${memberId(m)}@${rec.resolved}`),
    intervalOf: (m) => (isApp(m) ? Math.min(periodMs, APP_POKE_INTERVAL_MS) : periodMs),
    leader: !(someoneAt || leaderLate),
  });
}
