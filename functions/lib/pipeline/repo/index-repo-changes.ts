/**
 * What a PackageRepository reconcile changed, told to the PackageInstalls (event-driven upgrades
 * in a cluster, docs/decisions.md D8): after a successful deploy (or delete) the index-repo
 * function compares the versions it now deployed with those it deployed before (the
 * repository's pointer, `../../packaging/repo-index.ts` {@link RepoPointer}), records the new
 * ones, and, when a refName gained or lost versions, hands a `repo.indexed` event on. The
 * install function turns it into one `ref-changed` event per PackageInstall the change may move
 * (`../install/install-fanout.ts`), so they reconcile at once instead of after a timer.
 *
 * Upstream reaches the same end differently: its PackageInstall controller watches Packages
 * (`packageinstall_version_handler.go`) and enqueues the PackageInstalls of a created, updated
 * or deleted Package's refName. kapp-lambda's forwarder does not watch Packages (one event per
 * Package of every repository of every cluster, for nothing most of the time); the function that
 * deployed them knows what changed.
 *
 * Delivery: the pointer is written before the event is handed on. The embedded runtime runs the
 * event in the same loop and retries it, not the reconcile, when it fails; on Lambda a failed
 * hand-off redelivers the repository's event, whose new run finds the pointer already advanced,
 * so those PackageInstalls wait for their App's sync (the safety net, 10m by default).
 *
 * Across the fleet (docs/decisions.md D9, `../source-poll.ts`): a repository source polled once per
 * period for the whole fleet (a per-source poll record in the store), and a tag that moves to a
 * new digest sending `ref-changed` to every cluster's PackageRepository on that source; each then
 * deploys the one index of the new digest and reaches this module, which fans out to its
 * PackageInstalls as in a single cluster.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import {
  EventValidationError,
  MAX_EVENT_BYTES,
  MAX_INDEXED_CHANGES,
  MAX_INDEXED_VERSIONS,
  type ObjectRef,
  type RepoIndexedData,
  type RepoIndexedEvent,
  repoIndexedEvent,
} from '../../../../events/schema.js';
import { repoIndexKey } from '../../artifact/keys.js';
import {
  diffRepoVersions,
  type RepoPointer,
  type RepoVersionChange,
  type RepoVersions,
  readPreviousVersions,
  readRepositoryVersions,
  repoPointerKey,
  writeRepoPointer,
} from '../../packaging/repo-index.js';
import type { PipelineDeps } from '../deps.js';
import { infraStep } from '../retry-bound.js';

/** What a successful repository run deployed: the index digest (when indexed for the fleet) and its versions. */
export interface DeployedVersions {
  /** Hex index digest; absent for a repository fetched with a Secret. */
  index?: string;
  /** Per refName, the versions deployed; read from the index when absent. */
  versions?: RepoVersions;
}

/** Room kept for the envelope and the object reference when sizing `changes`, bytes. */
const ENVELOPE_ROOM = 8 * 1024;

/**
 * The `changes` of a `repo.indexed` event, or `undefined` (everything changed) when they exceed
 * the schema's bounds or the event size: a PackageInstall is then reconciled for any refName.
 */
function boundedChanges(changes: RepoVersionChange[]): RepoVersionChange[] | undefined {
  if (changes.length > MAX_INDEXED_CHANGES) return undefined;
  if (changes.some((c) => c.versions.length > MAX_INDEXED_VERSIONS || c.versions.some((v) => v.length > 256)))
    return undefined;
  return Buffer.byteLength(JSON.stringify(changes)) > MAX_EVENT_BYTES - ENVELOPE_ROOM ? undefined : changes;
}

/**
 * After a successful deploy (`deployed`) or delete (`'deleted'`) of `object`: compares with the
 * repository's pointer, records what is deployed now (or removes the pointer), and returns the
 * `repo.indexed` event when some refName gained or lost versions.
 *
 * @returns the event to hand on, or `undefined` when no version changed.
 * @throws InfraStepError (store failures): the run is retried.
 */
export async function announceRepoChanges(
  object: ObjectRef,
  deployed: DeployedVersions | 'deleted',
  deps: PipelineDeps,
): Promise<RepoIndexedEvent | undefined> {
  const key = repoPointerKey(object.clusterId, object.namespace, object.name);
  const previous = await infraStep('reading the repository pointer', () =>
    readPreviousVersions(deps.store, key, object.uid),
  );
  let now: RepoVersions = {};
  if (deployed !== 'deleted') {
    const index = deployed.index;
    now =
      deployed.versions ??
      (index
        ? ((await infraStep('reading the repository index', () => readRepositoryVersions(deps.store, index))) ?? {})
        : {});
  }
  const changes = diffRepoVersions(previous, now);
  if (deployed === 'deleted') {
    await infraStep('removing the repository pointer', () => deps.store.delete(key));
  } else if (changes.length > 0 || previous === undefined) {
    const pointer: RepoPointer = deployed.index
      ? { uid: object.uid, index: deployed.index }
      : { uid: object.uid, versions: now };
    await infraStep('storing the repository pointer', () => writeRepoPointer(deps.store, key, pointer));
  }
  if (changes.length === 0) return undefined;
  const time = deps.now();
  const bounded = boundedChanges(changes);
  const data: RepoIndexedData = {
    object,
    run: {
      generation: object.generation,
      runId: createHash('sha256')
        .update(`${object.uid}/${object.resourceVersion}/${time.toISOString()}`)
        .digest('hex')
        .slice(0, 32),
      startedAt: time.toISOString(),
    },
    artifacts: deployed !== 'deleted' && deployed.index ? { indexKey: repoIndexKey(deployed.index) } : {},
  };
  if (!bounded) return repoIndexedEvent(data, { time });
  try {
    return repoIndexedEvent({ ...data, changes: bounded }, { time });
  } catch (err) {
    // A refName or version the event contract does not accept: announce "everything changed".
    if (!(err instanceof EventValidationError)) throw err;
    return repoIndexedEvent(data, { time });
  }
}
