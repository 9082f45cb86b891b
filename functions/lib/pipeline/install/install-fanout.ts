/**
 * The install function's side of event-driven upgrades (docs/decisions.md D8): a `repo.indexed` event
 * (a repository deployed Packages whose versions changed, `../repo/index-repo-changes.ts`) becomes one
 * `ref-changed` object event per PackageInstall the change may move, sent through the runtime's
 * transport (`deps.emit`), each reconciled by `runInstall` under its own ordering key, at once.
 *
 * Which PackageInstalls (upstream `PackageInstallVersionHandler`, `packageinstall_version_handler.go`,
 * reference §3.1): those in the repository's namespace, or in every namespace when the repository
 * is in the packaging global namespace, except namespaces annotated
 * `kapp-controller.carvel.dev/exclude-global-packages` (they do not see its Packages); whose
 * `spec.packageRef.refName` is a changed refName; and, as upstream, whose `versionSelection`
 * accepts at least one of that refName's added or removed versions (a PackageInstall without a
 * version selection, or when the event lists no changes, is always sent: its reconcile reports
 * what is wrong). A PackageInstall failing with `Package <refName> not found` or no matching
 * version is sent as soon as a repository provides a version it accepts, which is how it
 * recovers without a timer.
 *
 * @module
 */
import { type KappEvent, objectEvent, type RepoIndexedEvent } from '../../../../events/schema.js';
import { DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../../api/constants.js';
import type { PackageInstall } from '../../api/packaging.js';
import { parsePackageInstall } from '../../api/parse.js';
import { PackageInstallResource } from '../../api/resources.js';
import type { RepoVersionChange } from '../../packaging/repo-index.js';
import { listAll, visibleGlobalNamespace } from '../../packaging/resolver.js';
import { highestConstrainedVersion, withExactPrereleaseRule } from '../../packaging/versions.js';
import type { PipelineDeps } from '../deps.js';
import { installView } from './install.js';

/**
 * Whether a change of `versions` may move `pkgi` (upstream: the changed Package's version passes
 * its `versionSelection`; a selection that does not parse passes nothing, as upstream).
 */
export function selectionAccepts(pkgi: PackageInstall, versions: readonly string[]): boolean {
  const selection = pkgi.spec.packageRef?.versionSelection;
  if (!selection) return true;
  try {
    highestConstrainedVersion(
      versions,
      withExactPrereleaseRule({
        ...(selection.constraints === undefined ? {} : { constraints: selection.constraints }),
        ...(selection.prereleases === undefined ? {} : { prereleases: selection.prereleases }),
      }),
    );
    return true;
  } catch {
    return false;
  }
}

/**
 * The PackageInstalls among `candidates` that `changes` may move (see the module comment);
 * `changes` `undefined` means every refName changed. Pure.
 */
export function affectedInstalls(
  candidates: readonly PackageInstall[],
  changes: readonly RepoVersionChange[] | undefined,
): PackageInstall[] {
  const byRef = changes && new Map(changes.map((c) => [c.refName, c.versions]));
  return candidates.filter((pkgi) => {
    if (pkgi.metadata.deletionTimestamp) return false;
    if (!byRef) return true;
    const versions = byRef.get(pkgi.spec.packageRef?.refName ?? '');
    return versions !== undefined && selectionAccepts(pkgi, versions);
  });
}

/**
 * Handles a `repo.indexed` event: lists the PackageInstalls in the repository's scope, keeps those
 * the change may move, and emits a `ref-changed` object event for each.
 *
 * @throws KubeApiError when a list or namespace read fails, TransportError when an event is not
 *   accepted: the event is retried (the `ref-changed` events are idempotent).
 */
export async function fanOutRepoIndexed(event: RepoIndexedEvent, deps: PipelineDeps): Promise<void> {
  const { object, changes } = event.data;
  const kube = installView(deps, object.clusterId);
  const global = deps.config.packagingGlobalNamespace ?? DEFAULT_PACKAGING_GLOBAL_NAMESPACE;
  const isGlobal = object.namespace === global;
  const all = await listAll(kube, PackageInstallResource, isGlobal ? undefined : object.namespace, parsePackageInstall);
  const candidates = affectedInstalls(all, changes);
  const sees = new Map<string, boolean>();
  const targets: PackageInstall[] = [];
  for (const pkgi of candidates) {
    const ns = pkgi.metadata.namespace ?? '';
    if (isGlobal && ns !== global) {
      if (!sees.has(ns)) sees.set(ns, (await visibleGlobalNamespace(kube, ns, { globalNamespace: global })) === global);
      if (!sees.get(ns)) continue;
    }
    targets.push(pkgi);
  }
  const time = deps.now();
  const events: KappEvent[] = targets.map((pkgi) =>
    objectEvent(
      {
        clusterId: object.clusterId,
        kind: 'PackageInstall',
        apiVersion: PackageInstallResource.apiVersion,
        namespace: pkgi.metadata.namespace ?? '',
        name: pkgi.metadata.name ?? '',
        uid: pkgi.metadata.uid ?? '',
        generation: pkgi.metadata.generation ?? 0,
        resourceVersion: pkgi.metadata.resourceVersion ?? '',
      },
      'ref-changed',
      // The repo.indexed event as the cause: a retried fan-out re-sends the same ids (deduplicated
      // by the FIFO queue), while two index runs at one PackageInstall resourceVersion stay distinct.
      { time, cause: `${event.type}/${event.id}` },
    ),
  );
  deps.log.info(
    { subject: event.subject, changed: changes?.length ?? 'all', installs: events.length },
    'repository versions changed; PackageInstalls reconciled',
  );
  if (events.length === 0) return;
  if (!deps.emit) {
    deps.log.warn({ subject: event.subject, installs: events.length }, 'no transport for fan-out events; dropped');
    return;
  }
  await deps.emit(events);
}
