/**
 * An in-memory {@link ObjectWatcher} for unit tests and benchmarks of the forwarder: an object
 * store with a global resourceVersion counter, a watch-event history (so a watch resumed from a
 * resourceVersion replays exactly what came after it), pagination, bookmarks, 410 after
 * compaction, and hooks to drop, fail or silently stall the watches that are open.
 *
 * Not used in production code paths; it lives here so benchmarks can share it.
 *
 * @module
 */
import {
  type DiscoveredKind,
  type KubeObject,
  type ListOptions,
  type ListResult,
  type ObjectWatcher,
  type ResourceKind,
  type WatchEvent,
  WatchGoneError,
  type WatchOptions,
} from '../../functions/lib/kube/port.js';

/** A recorded call of {@link FakeObjectWatcher}. */
export type FakeWatcherCall =
  | ({ op: 'list'; resource: string } & ListOptions)
  | ({ op: 'watch'; resource: string } & Omit<WatchOptions, 'allowWatchBookmarks'>)
  | { op: 'discover'; group: string; kind: string };

/** Whether `o` matches a field selector; only `metadata.name=<name>` is understood (else throws). */
function selects(fieldSelector: string | undefined, o: KubeObject): boolean {
  if (fieldSelector === undefined) return true;
  const m = /^metadata\.name=(.+)$/.exec(fieldSelector);
  if (!m) throw new Error(`FakeWatcher: unsupported field selector ${fieldSelector}`);
  return o.metadata.name === m[1];
}

/**
 * Whether `o` matches a label selector: `key` (exists) or `key=value`, comma-separated terms
 * (else throws).
 */
function labelSelects(labelSelector: string | undefined, o: KubeObject): boolean {
  if (labelSelector === undefined) return true;
  const labels = o.metadata.labels ?? {};
  return labelSelector.split(',').every((term) => {
    const m = /^([A-Za-z0-9./_-]+)(?:=(.*))?$/.exec(term);
    if (!m) throw new Error(`FakeWatcher: unsupported label selector ${labelSelector}`);
    return m[2] === undefined ? m[1]! in labels : labels[m[1]!] === m[2];
  });
}

/** What a metadata-only answer keeps of an object (`PartialObjectMetadata`). */
function metadataOf(o: KubeObject, metadataOnly: boolean | undefined): KubeObject {
  const copy = structuredClone(o);
  return metadataOnly ? { apiVersion: copy.apiVersion, kind: copy.kind, metadata: copy.metadata } : copy;
}

interface Session {
  resource: string;
  namespace: string | undefined;
  fieldSelector: string | undefined;
  labelSelector: string | undefined;
  metadataOnly: boolean | undefined;
  onEvent: (e: WatchEvent) => void;
  /** Delivers nothing while true (a half-open connection). */
  stalled: boolean;
  end: (err?: unknown) => void;
}

interface HistoryEntry {
  rv: number;
  type: 'ADDED' | 'MODIFIED' | 'DELETED';
  object: KubeObject;
}

function resKey(r: ResourceKind): string {
  return `${r.apiVersion}/${r.kind}`;
}

/** The inverse of {@link resKey}: the kind is after the last `/`. */
function splitResKey(key: string): [string, string] {
  const i = key.lastIndexOf('/');
  return [key.slice(0, i), key.slice(i + 1)];
}

function objKey(o: KubeObject): string {
  return `${o.metadata.namespace ?? ''}/${o.metadata.name}`;
}

/** See the module comment. Resource versions are decimal integers as strings. */
export class FakeObjectWatcher implements ObjectWatcher {
  /** Every list and watch call, in order. */
  readonly calls: FakeWatcherCall[] = [];
  /** Errors the next list calls throw, consumed in order. */
  readonly listFailures: unknown[] = [];
  /** Errors the next watch calls reject with, consumed in order. */
  readonly watchFailures: unknown[] = [];
  /** When true, a list with a `continue` token fails with 410 (an expired token). */
  expireContinueTokens = false;
  private rv: number;
  private readonly stores = new Map<string, Map<string, KubeObject>>();
  private readonly history = new Map<string, HistoryEntry[]>();
  private readonly compactedTo = new Map<string, number>();
  private sessions: Session[] = [];
  private uidSeq = 0;

  /** @param startRv - resourceVersion before the first write. Default 1000. */
  constructor(startRv = 1000) {
    this.rv = startRv;
  }

  /** The current (latest) resourceVersion. */
  get resourceVersion(): string {
    return String(this.rv);
  }

  /**
   * Creates or replaces an object (deep-copied): assigns the next resourceVersion, a uid when
   * it has none (`uid-<n>`, or the stored object's uid on update) and `generation: 1` when
   * unset, then sends `ADDED` or `MODIFIED` to open watches.
   *
   * @returns The stored copy.
   */
  apply(obj: KubeObject): KubeObject {
    const copy = structuredClone(obj);
    const key = resKey(copy);
    const store = this.store(key);
    const prev = store.get(objKey(copy));
    copy.metadata.uid ||= prev?.metadata.uid ?? `uid-${++this.uidSeq}`;
    copy.metadata.generation ??= 1;
    copy.metadata.resourceVersion = String(++this.rv);
    store.set(objKey(copy), copy);
    this.record(key, {
      rv: this.rv,
      type: prev && prev.metadata.uid === copy.metadata.uid ? 'MODIFIED' : 'ADDED',
      object: copy,
    });
    return copy;
  }

  /**
   * Deletes an object, sending `DELETED` (with a new resourceVersion) to open watches.
   *
   * @returns The deleted object, or `undefined` when it did not exist.
   */
  remove(resource: ResourceKind, namespace: string, name: string): KubeObject | undefined {
    const key = resKey(resource);
    const store = this.store(key);
    const prev = store.get(`${namespace}/${name}`);
    if (!prev) return undefined;
    store.delete(`${namespace}/${name}`);
    const gone = structuredClone(prev);
    gone.metadata.resourceVersion = String(++this.rv);
    this.record(key, { rv: this.rv, type: 'DELETED', object: gone });
    return gone;
  }

  /** The stored object, or `undefined`. */
  get(resource: ResourceKind, namespace: string, name: string): KubeObject | undefined {
    return this.store(resKey(resource)).get(`${namespace}/${name}`);
  }

  /**
   * Sends a `BOOKMARK` to every open, non-stalled watch every `ms` (kube-apiserver sends one
   * about every minute), so a reflector's watchdog tells a quiet watch from a stalled one.
   * Uses the global timers (fake ones in tests).
   * @returns Stops the bookmarks.
   */
  bookmarkEvery(ms: number): () => void {
    const timer = setInterval(() => {
      for (const key of new Set(this.sessions.map((s) => s.resource))) {
        const [apiVersion, kind] = splitResKey(key);
        this.bookmark({ apiVersion, kind });
      }
    }, ms);
    return () => clearInterval(timer);
  }

  /** Sends a `BOOKMARK` at the current resourceVersion to open, non-stalled watches of `resource`. */
  bookmark(resource: ResourceKind): void {
    const key = resKey(resource);
    const object = {
      apiVersion: resource.apiVersion,
      kind: resource.kind,
      metadata: { name: '', uid: '', resourceVersion: String(this.rv) },
    } as KubeObject;
    for (const s of this.sessions) if (s.resource === key && !s.stalled) s.onEvent({ type: 'BOOKMARK', object });
  }

  /** Forgets the history of `resource`: watches from an older resourceVersion now get 410. */
  compact(resource: ResourceKind): void {
    const key = resKey(resource);
    this.compactedTo.set(key, this.rv);
    this.history.set(key, []);
  }

  /** Ends open watches of `resource` (all when omitted) normally, as a server timeout does. */
  dropWatches(resource?: ResourceKind): void {
    this.endSessions(resource, undefined);
  }

  /** Ends open watches of `resource` (all when omitted) with `err` (e.g. a {@link WatchGoneError}). */
  failWatches(err: unknown, resource?: ResourceKind): void {
    this.endSessions(resource, err);
  }

  /** Makes open watches of `resource` deliver nothing from now on, without ending them. */
  stallWatches(resource: ResourceKind): void {
    const key = resKey(resource);
    for (const s of this.sessions) if (s.resource === key) s.stalled = true;
  }

  /** Number of open watches of `resource` (all when omitted). */
  openWatches(resource?: ResourceKind): number {
    const key = resource ? resKey(resource) : undefined;
    return this.sessions.filter((s) => key === undefined || s.resource === key).length;
  }

  /** Recorded watch calls for `resource`. */
  watchCalls(resource: ResourceKind): Extract<FakeWatcherCall, { op: 'watch' }>[] {
    const key = resKey(resource);
    return this.calls.filter(
      (c): c is Extract<FakeWatcherCall, { op: 'watch' }> => c.op === 'watch' && c.resource === key,
    );
  }

  /** Recorded list calls for `resource`. */
  listCalls(resource: ResourceKind): Extract<FakeWatcherCall, { op: 'list' }>[] {
    const key = resKey(resource);
    return this.calls.filter(
      (c): c is Extract<FakeWatcherCall, { op: 'list' }> => c.op === 'list' && c.resource === key,
    );
  }

  async list<T extends KubeObject = KubeObject>(resource: ResourceKind, options: ListOptions): Promise<ListResult<T>> {
    const key = resKey(resource);
    this.calls.push({ op: 'list', resource: key, ...options });
    const failure = this.listFailures.shift();
    if (failure !== undefined) throw failure;
    if (options.continue !== undefined && this.expireContinueTokens) {
      throw new WatchGoneError('list: 410 continue token expired');
    }
    const all = [...this.store(key).values()]
      .filter((o) => options.namespace === undefined || o.metadata.namespace === options.namespace)
      .filter((o) => selects(options.fieldSelector, o) && labelSelects(options.labelSelector, o))
      .sort((a, b) => (objKey(a) < objKey(b) ? -1 : 1));
    const [snapshot, offsetText] = options.continue ? options.continue.split(':') : [String(this.rv), '0'];
    const offset = Number(offsetText);
    const limit = options.limit ?? all.length;
    const items = all.slice(offset, offset + limit).map((o) => metadataOf(o, options.metadataOnly) as T);
    const next = offset + limit < all.length ? `${snapshot}:${offset + limit}` : undefined;
    return { items, resourceVersion: snapshot!, continue: next };
  }

  watch<T extends KubeObject = KubeObject>(
    resource: ResourceKind,
    options: WatchOptions,
    onEvent: (event: WatchEvent<T>) => void,
    signal?: AbortSignal,
  ): Promise<void> {
    const key = resKey(resource);
    this.calls.push({
      op: 'watch',
      resource: key,
      resourceVersion: options.resourceVersion,
      ...(options.namespace === undefined ? {} : { namespace: options.namespace }),
      ...(options.timeoutSeconds === undefined ? {} : { timeoutSeconds: options.timeoutSeconds }),
      ...(options.fieldSelector === undefined ? {} : { fieldSelector: options.fieldSelector }),
      ...(options.labelSelector === undefined ? {} : { labelSelector: options.labelSelector }),
      ...(options.metadataOnly ? { metadataOnly: true } : {}),
    });
    const failure = this.watchFailures.shift();
    if (failure !== undefined) return Promise.reject(failure);
    const from = Number(options.resourceVersion);
    if (from < (this.compactedTo.get(key) ?? 0)) {
      return Promise.reject(new WatchGoneError(`watch ${key}: 410 too old resource version: ${from}`));
    }
    return new Promise<void>((resolve, reject) => {
      const session: Session = {
        resource: key,
        namespace: options.namespace,
        fieldSelector: options.fieldSelector,
        labelSelector: options.labelSelector,
        metadataOnly: options.metadataOnly,
        onEvent: onEvent as (e: WatchEvent) => void,
        stalled: false,
        end: (err) => {
          this.sessions = this.sessions.filter((s) => s !== session);
          signal?.removeEventListener('abort', onAbort);
          if (err === undefined) resolve();
          else reject(err);
        },
      };
      const onAbort = () => session.end();
      if (signal?.aborted) {
        resolve();
        return;
      }
      signal?.addEventListener('abort', onAbort, { once: true });
      this.sessions.push(session);
      // Replay what happened after `from`, as the API server's watch cache does.
      for (const h of this.history.get(key) ?? []) {
        if (h.rv > from && this.matches(session, h.object)) {
          session.onEvent({ type: h.type, object: metadataOf(h.object, session.metadataOnly) });
        }
      }
    });
  }

  /**
   * Kinds {@link discover} answers, keyed by `<group>/<kind>`: `serve` adds one (a CRD installed),
   * deleting an entry removes it.
   */
  readonly served = new Map<string, DiscoveredKind>();

  /** Makes {@link discover} answer for `kind` (`apiVersion` `<group>/<version>` or `v1`). */
  serve(kind: ResourceKind, plural: string, namespaced = true): DiscoveredKind {
    const slash = kind.apiVersion.lastIndexOf('/');
    const group = slash < 0 ? '' : kind.apiVersion.slice(0, slash);
    const version = kind.apiVersion.slice(slash + 1);
    const discovered: DiscoveredKind = { ...kind, type: { group, version, plural, namespaced } };
    this.served.set(`${group}/${kind.kind}`, discovered);
    return discovered;
  }

  /** {@inheritDoc ObjectWatcher.discover} */
  async discover(group: string, kind: string): Promise<DiscoveredKind | undefined> {
    this.calls.push({ op: 'discover', group, kind });
    return this.served.get(`${group}/${kind}`);
  }

  private matches(s: Session, o: KubeObject): boolean {
    return (
      (s.namespace === undefined || s.namespace === o.metadata.namespace) &&
      selects(s.fieldSelector, o) &&
      labelSelects(s.labelSelector, o)
    );
  }

  private store(key: string): Map<string, KubeObject> {
    let s = this.stores.get(key);
    if (!s) {
      s = new Map();
      this.stores.set(key, s);
    }
    return s;
  }

  private record(key: string, entry: HistoryEntry): void {
    let h = this.history.get(key);
    if (!h) {
      h = [];
      this.history.set(key, h);
    }
    h.push(entry);
    for (const s of [...this.sessions]) {
      if (s.resource === key && !s.stalled && this.matches(s, entry.object)) {
        s.onEvent({ type: entry.type, object: metadataOf(entry.object, s.metadataOnly) });
      }
    }
  }

  private endSessions(resource: ResourceKind | undefined, err: unknown): void {
    const key = resource ? resKey(resource) : undefined;
    for (const s of [...this.sessions]) if (key === undefined || s.resource === key) s.end(err);
  }
}
