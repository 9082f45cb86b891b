/**
 * The deploy record behind the no-op resync: what an App's last successful `kapp deploy` left
 * in its cluster, so a periodic resync whose render inputs are unchanged can confirm that
 * nothing drifted without running kapp (docs/decisions.md D11).
 *
 * Upstream runs `kapp deploy` on every resync; kapp then lists the app's resources (its label
 * `kapp.k14s.io/app=<id>`, in the group/kinds its app record names), diffs them against the
 * manifest and reverts any hand edit or deletion. Here the deploy stage, after a successful
 * deploy, lists the same resources with the App's own identity and keeps, sealed per cluster
 * (`../artifact/sealed.ts`, kind `deploy-record`), a {@link DeployRecord}: the manifest key
 * (a content digest), a digest of the deploy-relevant spec, the generation, and per listed
 * collection every object's uid, resourceVersion and {@link liveDigest}. A resync for the same
 * generation, manifest and deploy spec lists the collections again: the same objects, each
 * unchanged ({@link driftOf}), end the reconcile without kapp; anything else runs kapp as
 * today, which reverts the drift and records again.
 *
 * What counts as drift: an object missing, replaced (another uid), added under the label, or
 * changed anywhere but `status` (its resourceVersion moved and its content without `status`,
 * `resourceVersion` and `managedFields` differs). A status-only write (a Deployment's
 * controller) is not drift: kapp ignores `status` when it diffs, so upstream's kapp would
 * change nothing either. A controller's write outside `status` (e.g. the
 * `deployment.kubernetes.io/revision` annotation) is seen as drift once: kapp runs, changes
 * nothing, and the record then holds it. A false positive only runs kapp; the checks below are
 * built so that no drift kapp would revert passes unseen:
 *
 * - the record is taken after kapp exits, and refused ({@link writtenByOthersSince}) when any
 *   listed object was written outside `status` by another field manager since kapp started
 *   (a hand edit racing the record), so the baseline is what kapp left;
 * - every document of the manifest must be among the listed objects
 *   ({@link uncoveredDocument}), so a namespace or kind the lists missed never hides drift;
 * - lists use the App's own credentials (the ServiceAccount token kapp gets), never the
 *   runtime's identity: what the App may not read runs kapp, which fails as upstream's. (The
 *   deploy stage keeps no record for an App deploying through a kubeconfig Secret.)
 *
 * @module
 */
import { parseAllDocuments } from 'yaml';
import { KAPP_FIELD_MANAGER } from '../api/constants.js';
import type { App, AppStatusDeploy } from '../api/index.js';
import { canonicalJson, sha256Hex } from '../artifact/keys.js';
import { errorFromResponse } from '../kube/client.js';
import { KubeApiError, type KubeObject } from '../kube/port.js';
import type { RestTransport } from '../kube/transport.js';
import type { KappAppMeta } from './kapp.js';

/** Version of the {@link DeployRecord} layout; a record of another version is not used. */
export const DEPLOY_RECORD_VERSION = 1;

/**
 * Annotations under which kapp applies a document by another name (`versioned`: `<name>-ver-N`)
 * or does not own it (`noop`, `exists`): such documents are not looked for by name.
 */
const NOT_BY_NAME = ['kapp.k14s.io/versioned', 'kapp.k14s.io/noop', 'kapp.k14s.io/exists'];

/** A group and kind (`metav1.GroupKind`; `''` is the core group). */
export interface GroupKind {
  group: string;
  kind: string;
}

/** One listed object as recorded. */
export interface RecordedObject {
  name: string;
  /** Absent for a cluster-scoped object. */
  namespace?: string;
  uid: string;
  resourceVersion: string;
  /** {@link liveDigest} of the object. */
  digest: string;
}

/** A collection listed by the app's label: a group/kind in one namespace, or cluster-wide. */
export interface LiveCollection extends GroupKind {
  /** REST path of the list: `/api/v1/namespaces/<ns>/configmaps`, `/apis/rbac.authorization.k8s.io/v1/clusterroles`. */
  path: string;
}

/** A {@link LiveCollection} with the objects it held. */
export interface RecordedCollection extends LiveCollection {
  objects: RecordedObject[];
}

/** What an App's last successful deploy left in its cluster (see the module comment). */
export interface DeployRecord {
  v: typeof DEPLOY_RECORD_VERSION;
  /** The App's `metadata.generation` the deploy ran for. */
  generation: number;
  /** The rendered manifest's artifact key (names its content digest). */
  manifestKey: string;
  /** {@link deploySpecDigest} of the App as deployed. */
  specDigest: string;
  /** `<labelKey>=<labelValue>` of kapp's app. */
  labelSelector: string;
  collections: RecordedCollection[];
}

/**
 * Digest of what, besides the manifest, decides what `kapp deploy` does: the App's name,
 * namespace, `spec.deploy`, `spec.serviceAccountName`, `spec.cluster`, `spec.defaultNamespace`,
 * the controller's `kappDeployRawOptions` and kapp's version. (The Secrets and ConfigMaps a
 * render reads are in the manifest key; the ServiceAccount's permissions are exercised by the
 * check's own reads.)
 */
export function deploySpecDigest(
  app: Pick<App, 'metadata' | 'spec'>,
  config: { kappDeployRawOptions?: readonly string[]; toolVersions: Readonly<Record<string, string>> },
): string {
  const { spec, metadata } = app;
  return sha256Hex(
    canonicalJson(
      JSON.parse(
        JSON.stringify({
          name: metadata.name ?? '',
          namespace: metadata.namespace ?? '',
          deploy: spec.deploy ?? [],
          serviceAccountName: spec.serviceAccountName ?? '',
          cluster: spec.cluster ?? null,
          defaultNamespace: spec.defaultNamespace ?? '',
          rawOptions: config.kappDeployRawOptions ?? [],
          kapp: config.toolVersions.kapp ?? '',
        }),
      ),
    ),
  );
}

/**
 * Digest of an object as kapp diffs it: everything but `status`, `metadata.resourceVersion` and
 * `metadata.managedFields` (which status writes move).
 */
export function liveDigest(obj: KubeObject): string {
  const { status: _status, metadata, ...rest } = obj;
  const { resourceVersion: _rv, managedFields: _mf, ...meta } = metadata;
  return sha256Hex(canonicalJson({ ...rest, metadata: meta }));
}

/** What {@link reuseBlocker} compares the record with: this run. */
export interface ReuseInput {
  generation: number;
  manifestKey: string;
  specDigest: string;
  /** The run continues a deploy cut by the function deadline. */
  continuation: boolean;
  /** `kapp inspect` is asked for (it runs on every reconcile, as upstream). */
  inspect: boolean;
  /** `status.deploy` as read. */
  lastDeploy: AppStatusDeploy | undefined;
}

/**
 * Why a run cannot end without kapp before the cluster is even read, or `undefined` when the
 * record matches the run: same generation, manifest and deploy spec, no continuation and no
 * inspect, and `status.deploy` still shows a finished successful kapp run. Pure.
 */
export function reuseBlocker(record: DeployRecord | undefined, run: ReuseInput): string | undefined {
  if (!record || record.v !== DEPLOY_RECORD_VERSION) return 'no deploy record';
  if (run.continuation) return 'a continued deploy';
  if (run.inspect) return 'kapp inspect is asked for';
  if (record.generation !== run.generation) return 'a new generation';
  if (record.manifestKey !== run.manifestKey) return 'a changed manifest';
  if (record.specDigest !== run.specDigest) return 'a changed deploy spec';
  const last = run.lastDeploy;
  if (last?.finished !== true || last.exitCode !== 0 || last.error) return 'the last deploy did not succeed';
  return undefined;
}

/** `namespace/name` or `name`. */
function nameOf(o: { name: string; namespace?: string | undefined }): string {
  return o.namespace ? `${o.namespace}/${o.name}` : o.name;
}

/**
 * Why the live objects differ from the record, or `undefined` when every recorded collection
 * holds exactly its recorded objects, each unchanged but for `status`. Pure.
 *
 * @param listed - the objects each recorded collection's list returned, by path.
 */
export function driftOf(record: DeployRecord, listed: ReadonlyMap<string, readonly KubeObject[]>): string | undefined {
  for (const c of record.collections) {
    const all = listed.get(c.path);
    if (!all) return `${c.kind} ${c.path} was not listed`;
    const recorded = new Set(c.objects.map((r) => r.uid));
    const items = all.filter((o) => !ignoredByKapp(o, c.group) || recorded.has(o.metadata.uid));
    const byUid = new Map(items.map((o) => [o.metadata.uid, o]));
    for (const r of c.objects) {
      const live = byUid.get(r.uid);
      if (!live) return `${c.kind} ${nameOf(r)} was deleted or replaced`;
      if (live.metadata.resourceVersion !== r.resourceVersion && liveDigest(live) !== r.digest) {
        return `${c.kind} ${nameOf(r)} was changed`;
      }
    }
    if (items.length !== c.objects.length) return `${c.kind} ${c.path} holds objects kapp did not leave`;
  }
  return undefined;
}

/** kapp's identity annotation (`v1;<namespace>/<group>/<Kind>/<name>;<apiVersion>`). */
const KAPP_IDENTITY_ANNOTATION = 'kapp.k14s.io/identity';

/**
 * Whether kapp leaves this listed object alone when the manifest does not name it: a controller
 * made it for another (it has `ownerReferences`: a Deployment's ReplicaSets and Pods carry the
 * kapp label through their templates) and it is transient to kapp, i.e. its
 * `kapp.k14s.io/identity` annotation does not name the object itself (kapp's
 * `IdentityAnnotation.Valid`; a ReplicaSet copies its Deployment's, which names the Deployment).
 * kapp neither applies nor prunes such objects, so neither does the record count them: otherwise
 * every App with a Deployment refused its record (`Pod … was written by
 * kube-controller-manager`) and each new Pod read as drift, so every resync ran kapp. An object
 * with `ownerReferences` whose identity is valid is not ignored: kapp prunes it (a planted
 * `ConfigMap` with the App's label, a copied identity and an owner), and a versioned document
 * (`<name>-ver-N`) the manifest gave owners is applied and diffed by kapp, so both stay drift.
 *
 * @param group - the API group of the collection the object was listed from (list items of
 *   built-in kinds carry no `apiVersion`).
 */
function ignoredByKapp(o: KubeObject, group: string): boolean {
  const refs = (o.metadata as { ownerReferences?: unknown }).ownerReferences;
  if (!Array.isArray(refs) || refs.length === 0) return false;
  const identity = o.metadata.annotations?.[KAPP_IDENTITY_ANNOTATION];
  if (typeof identity !== 'string') return true;
  const pieces = identity.split(';');
  const key = `${o.metadata.namespace ?? ''}/${group}/${o.kind}/${o.metadata.name}`;
  return !(pieces[0] === 'v1' && pieces.length === 3 && pieces[1] === key);
}

/** The `time` of a `managedFields` entry as ms, or NaN. */
function entryTime(entry: unknown): number {
  const t = (entry as { time?: unknown }).time;
  return typeof t === 'string' ? Date.parse(t) : Number.NaN;
}

/**
 * Allowance for the API server's clock running behind the function's, ms (60 s): writes by
 * others this long before kapp started still refuse a record, so a skewed clock cannot let a
 * hand edit racing kapp pass as kapp's (at worst kapp runs on a resync or two more).
 */
export const CLOCK_SKEW_ALLOWANCE_MS = 60_000;

/**
 * Why the objects may not be taken as what kapp left, or `undefined`: any object written
 * outside `status` by a field manager other than kapp at or after `since` less
 * {@link CLOCK_SKEW_ALLOWANCE_MS} (whole seconds, as `managedFields` times are) — a hand edit
 * between kapp's writes and the lists. Pure.
 */
export function writtenByOthersSince(items: readonly KubeObject[], since: Date): string | undefined {
  const from = Math.floor((since.getTime() - CLOCK_SKEW_ALLOWANCE_MS) / 1000) * 1000;
  for (const o of items) {
    const fields = Array.isArray(o.metadata.managedFields) ? (o.metadata.managedFields as unknown[]) : [];
    for (const e of fields) {
      const { manager, subresource } = e as { manager?: unknown; subresource?: unknown };
      if (subresource === 'status' || manager === KAPP_FIELD_MANAGER) continue;
      const t = entryTime(e);
      if (Number.isNaN(t) || t >= from) return `${o.kind} ${nameOf(o.metadata)} was written by ${String(manager)}`;
    }
  }
  return undefined;
}

/** One document of a manifest, as kapp reads it. */
export interface ManifestDoc extends GroupKind {
  version: string;
  name: string;
  namespace?: string;
  annotations: Record<string, string>;
}

/** Reads an object-like document (or the items of a `List`) into `out`. */
function collectDoc(doc: unknown, out: ManifestDoc[]): void {
  if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) return;
  const d = doc as { apiVersion?: unknown; kind?: unknown; metadata?: unknown; items?: unknown };
  if (typeof d.kind !== 'string' || typeof d.apiVersion !== 'string') return;
  if (d.kind.endsWith('List') && Array.isArray(d.items)) {
    for (const item of d.items) collectDoc(item, out);
    return;
  }
  // kapp's own configuration (`kapp.k14s.io/v1alpha1` `Config`) is read by kapp and never
  // applied (kapp's `config.NewConfFromResources` takes it out of the resources), so no list
  // would ever hold it: counting it kept every App that ships one from a no-op resync.
  if (d.kind === 'Config' && d.apiVersion.startsWith('kapp.k14s.io/')) return;
  const m = (d.metadata ?? {}) as { name?: unknown; namespace?: unknown; annotations?: unknown };
  const slash = d.apiVersion.indexOf('/');
  out.push({
    group: slash < 0 ? '' : d.apiVersion.slice(0, slash),
    version: slash < 0 ? d.apiVersion : d.apiVersion.slice(slash + 1),
    kind: d.kind,
    name: typeof m.name === 'string' ? m.name : '',
    ...(typeof m.namespace === 'string' && m.namespace ? { namespace: m.namespace } : {}),
    annotations: m.annotations && typeof m.annotations === 'object' ? (m.annotations as Record<string, string>) : {},
  });
}

/**
 * The documents of a rendered manifest (multi-document YAML; `List` items expanded).
 * @throws Error when the YAML does not parse (kapp accepted it, so this is not expected).
 */
export function manifestDocs(manifest: string): ManifestDoc[] {
  const out: ManifestDoc[] = [];
  for (const doc of parseAllDocuments(manifest)) {
    if (doc.errors.length > 0) throw new Error('the rendered manifest does not parse as YAML');
    collectDoc(doc.toJS(), out);
  }
  return out;
}

/**
 * The documents with the namespaces kapp gave them: `--into-ns` puts every document that names a
 * namespace into that one, then `--map-ns` renames each `<from>` namespace to `<to>`. Without
 * this the record looked for (and listed) the manifest's own namespaces, e.g. an App whose
 * chart pins `namespace: default` deployed with `intoNs`: its identity may not list `default`,
 * so no record was ever kept and every resync ran kapp. A document without a namespace keeps
 * none (kapp puts it in the default namespace, which is listed anyway). Pure.
 */
export function placedDocs(docs: readonly ManifestDoc[], intoNs?: string, mapNs?: readonly string[]): ManifestDoc[] {
  const map = new Map<string, string>();
  for (const m of mapNs ?? []) {
    const at = m.indexOf('=');
    if (at > 0) map.set(m.slice(0, at), m.slice(at + 1));
  }
  if (!intoNs && map.size === 0) return [...docs];
  return docs.map((d) => {
    if (!d.namespace) return d;
    const into = intoNs || d.namespace;
    return { ...d, namespace: map.get(into) ?? into };
  });
}

/**
 * Why the lists miss a document of the manifest, or `undefined` when each document kapp applies
 * by its own name is among the listed objects of its group/kind (in its namespace when it names
 * one). Pure.
 */
export function uncoveredDocument(
  docs: readonly ManifestDoc[],
  collections: readonly RecordedCollection[],
): string | undefined {
  for (const d of docs) {
    if (NOT_BY_NAME.some((a) => a in d.annotations)) continue;
    const found = collections.some(
      (c) =>
        c.group === d.group &&
        c.kind === d.kind &&
        c.objects.some((o) => o.name === d.name && (!d.namespace || !o.namespace || o.namespace === d.namespace)),
    );
    if (!found) return `${d.kind} ${nameOf(d)} is not among the listed objects`;
  }
  return undefined;
}

/** REST coordinates of a group/kind, from discovery. */
interface Served {
  prefix: string;
  plural: string;
  namespaced: boolean;
}

/** GETs `path` as JSON. @throws KubeApiError on a non-2xx answer. */
async function getJson(rest: RestTransport, path: string, query?: Record<string, string>): Promise<unknown> {
  const res = await rest.send({ method: 'GET', path, ...(query ? { query } : {}) });
  if (res.statusCode < 200 || res.statusCode > 299) throw errorFromResponse(`GET ${path}`, res);
  return res.body;
}

/**
 * Finds where `gk` is served: the version a manifest document uses, else the group's preferred
 * version (`/apis/<group>`), then its resource list (`/api/v1` or `/apis/<group>/<version>`).
 * @throws Error when the kind is not served; KubeApiError when discovery fails.
 */
async function discover(rest: RestTransport, gk: GroupKind, docs: readonly ManifestDoc[]): Promise<Served> {
  let version = docs.find((d) => d.group === gk.group && d.kind === gk.kind)?.version;
  if (!version) {
    if (gk.group === '') version = 'v1';
    else {
      const group = (await getJson(rest, `/apis/${gk.group}`)) as { preferredVersion?: { version?: string } };
      version = group.preferredVersion?.version ?? '';
    }
  }
  const prefix = gk.group === '' ? `/api/${version}` : `/apis/${gk.group}/${version}`;
  const list = (await getJson(rest, prefix)) as {
    resources?: Array<{ name?: string; kind?: string; namespaced?: boolean }>;
  };
  const r = (list.resources ?? []).find((x) => x.kind === gk.kind && x.name && !x.name.includes('/'));
  if (!r?.name) throw new Error(`${gk.kind}.${gk.group} is not served`);
  return { prefix, plural: r.name, namespaced: Boolean(r.namespaced) };
}

/**
 * The collections kapp reads for its app: every used group/kind, cluster-wide when
 * cluster-scoped, else in each namespace of the last change, of the manifest's documents and
 * the default one.
 * @throws what discovery throws.
 */
export async function liveCollections(
  rest: RestTransport,
  meta: Pick<KappAppMeta, 'usedGKs' | 'lastChangeNamespaces'>,
  docs: readonly ManifestDoc[],
  defaultNamespace: string,
): Promise<LiveCollection[]> {
  const namespaces = [
    ...new Set(
      [...meta.lastChangeNamespaces, ...docs.map((d) => d.namespace ?? ''), defaultNamespace].filter(
        (n) => n && n !== '(cluster)',
      ),
    ),
  ].sort();
  const served = await Promise.all(meta.usedGKs.map((gk) => discover(rest, gk, docs)));
  return meta.usedGKs.flatMap((gk, i) => {
    const s = served[i] as Served;
    const one = (path: string): LiveCollection => ({ group: gk.group, kind: gk.kind, path });
    return s.namespaced
      ? namespaces.map((ns) => one(`${s.prefix}/namespaces/${encodeURIComponent(ns)}/${s.plural}`))
      : [one(`${s.prefix}/${s.plural}`)];
  });
}

/**
 * Lists each collection by the app's label, in parallel.
 * @returns the items by path (each item's `kind` filled in from its collection).
 * @throws KubeApiError when a list fails (e.g. 403: the App's identity may not list it).
 */
export async function listCollections(
  rest: RestTransport,
  collections: readonly LiveCollection[],
  labelSelector: string,
): Promise<Map<string, KubeObject[]>> {
  const lists = await Promise.all(
    collections.map(async (c) => {
      const body = (await getJson(rest, c.path, { labelSelector })) as { items?: KubeObject[] };
      return (body.items ?? []).map((o) => ({ ...o, kind: o.kind ?? c.kind }));
    }),
  );
  return new Map(collections.map((c, i) => [c.path, lists[i] as KubeObject[]]));
}

/** What {@link recordLive} needs besides the cluster. */
export interface RecordInput {
  generation: number;
  manifestKey: string;
  specDigest: string;
  /** The rendered manifest kapp deployed. */
  manifest: string;
  /** kapp's app metadata after the deploy. */
  meta: KappAppMeta;
  /** Namespace kapp put documents without one in. */
  defaultNamespace: string;
  /** The App's `deploy[0].kapp.intoNs` (`--into-ns`): kapp moved each namespaced document there. */
  intoNs?: string;
  /** The App's `deploy[0].kapp.mapNs` (`--map-ns=<from>=<to>`), applied after `intoNs` as kapp does. */
  mapNs?: readonly string[];
  /** When kapp started: writes by others since then refuse the record. */
  kappStartedAt: Date;
}

/**
 * Lists what the deploy left and builds its record.
 * @returns the record, or why none may be kept (the next resync then runs kapp).
 * @throws KubeApiError when discovery or a list fails (a list refused with 403 is a `refused`).
 */
export async function recordLive(
  rest: RestTransport,
  input: RecordInput,
): Promise<{ record: DeployRecord } | { refused: string }> {
  if (!input.meta.labelKey || !input.meta.labelValue) return { refused: "kapp's app metadata has no label" };
  const docs = placedDocs(manifestDocs(input.manifest), input.intoNs, input.mapNs);
  const labelSelector = `${input.meta.labelKey}=${input.meta.labelValue}`;
  const collections = await liveCollections(rest, input.meta, docs, input.defaultNamespace);
  let listed: Awaited<ReturnType<typeof listCollections>>;
  try {
    listed = await listCollections(rest, collections, labelSelector);
  } catch (err) {
    // The App's own identity may not list what it deployed (RBAC narrower than this check
    // needs): expected, not a fault; every resync of it runs kapp, as upstream.
    if (err instanceof KubeApiError && err.statusCode === 403) {
      return { refused: `the App's identity may not list what it deployed (every resync runs kapp): ${err.message}` };
    }
    throw err;
  }
  // Objects a controller made for another (Pods of a Deployment) count only when the manifest names them.
  const named = (o: KubeObject) =>
    docs.some(
      (d) => d.kind === o.kind && d.name === o.metadata.name && (!d.namespace || d.namespace === o.metadata.namespace),
    );
  for (const c of collections) {
    const items = listed.get(c.path) ?? [];
    listed.set(
      c.path,
      items.filter((o) => !ignoredByKapp(o, c.group) || named(o)),
    );
  }
  const all = [...listed.values()].flat();
  const raced = writtenByOthersSince(all, input.kappStartedAt);
  if (raced) return { refused: raced };
  const recorded: RecordedCollection[] = collections.map((c) => ({
    ...c,
    objects: (listed.get(c.path) ?? []).map((o) => ({
      name: o.metadata.name,
      ...(o.metadata.namespace ? { namespace: o.metadata.namespace } : {}),
      uid: o.metadata.uid,
      resourceVersion: o.metadata.resourceVersion,
      digest: liveDigest(o),
    })),
  }));
  const missing = uncoveredDocument(docs, recorded);
  if (missing) return { refused: missing };
  return {
    record: {
      v: DEPLOY_RECORD_VERSION,
      generation: input.generation,
      manifestKey: input.manifestKey,
      specDigest: input.specDigest,
      labelSelector,
      collections: recorded,
    },
  };
}

/**
 * Lists the record's collections again and compares.
 * @returns why kapp must run (drift, or a list the App's identity cannot make), or `undefined`
 *   when nothing changed.
 */
export async function checkLive(rest: RestTransport, record: DeployRecord): Promise<string | undefined> {
  let listed: Map<string, KubeObject[]>;
  try {
    listed = await listCollections(rest, record.collections, record.labelSelector);
  } catch (err) {
    return `listing failed: ${(err as Error).message}`;
  }
  return driftOf(record, listed);
}

/**
 * Parses a stored record.
 * @returns the record, or `undefined` when it is not one of this version.
 */
export function parseDeployRecord(body: Buffer | undefined): DeployRecord | undefined {
  if (!body) return undefined;
  try {
    const r = JSON.parse(body.toString('utf8')) as DeployRecord;
    return r && r.v === DEPLOY_RECORD_VERSION && Array.isArray(r.collections) ? r : undefined;
  } catch {
    return undefined;
  }
}
