/**
 * The forwarder's index of referenced Secrets and ConfigMaps: which watched objects reference
 * which Secret or ConfigMap (same namespace, reference §3.1), the last resourceVersion seen of
 * each, and the list/watch handling that tells a referenced object's change from a replay.
 *
 * Only referenced Secrets and ConfigMaps are stored; an unreferenced one is dropped as it is
 * listed or watched. What a change means for a referencing object (`ref-changed`, or nothing
 * when it was already asked to reconcile) is the forwarder's rule: the index reports through
 * {@link RefHooks}. The event rules are written up in `README.md` ("Event rules").
 *
 * @module
 */
import type { KubeObject, WatchEvent } from '../../functions/lib/kube/port.js';
import { NO_REFS, type ObjectRefs } from './kinds.js';
import type { ReflectorHandler } from './reflector.js';

/** {@link RefType} of a Secret. */
export const REF_SECRET = 0;
/** {@link RefType} of a ConfigMap. */
export const REF_CONFIG_MAP = 1;
/**
 * {@link RefType} of a ServiceAccount: an App's `spec.serviceAccountName`, which its deploy reads
 * (upstream does not track it and applies a change at the next sync; here the App is asked at
 * once, so an App quiet at its sync period does not wait for its safety period).
 */
export const REF_SERVICE_ACCOUNT = 2;
/** Which referenced kind: {@link REF_SECRET}, {@link REF_CONFIG_MAP} or {@link REF_SERVICE_ACCOUNT} (an array index). */
export type RefType = typeof REF_SECRET | typeof REF_CONFIG_MAP | typeof REF_SERVICE_ACCOUNT;

/** The referenced kinds, by {@link RefType}. */
const REF_KINDS = ['Secret', 'ConfigMap', 'ServiceAccount'] as const;
const REF_TYPES: readonly RefType[] = [REF_SECRET, REF_CONFIG_MAP, REF_SERVICE_ACCOUNT];

/** {@link RefEntry.rv} of a referenced object known not to exist. */
const ABSENT = '';

/**
 * namespace → name → value. Nested rather than keyed by `ns/name` so that no key string is
 * allocated per entry: the namespace key is interned and the name is the one the state holds.
 */
export class NamespacedMap<V> {
  private readonly byNamespace = new Map<string, Map<string, V>>();
  private count = 0;

  /** Number of entries over all namespaces. */
  get size(): number {
    return this.count;
  }

  /** The value at `namespace`/`name`, or `undefined`. */
  get(namespace: string, name: string): V | undefined {
    return this.byNamespace.get(namespace)?.get(name);
  }

  /** Sets (or replaces) the value at `namespace`/`name`. */
  set(namespace: string, name: string, value: V): void {
    let m = this.byNamespace.get(namespace);
    if (!m) {
      m = new Map();
      this.byNamespace.set(namespace, m);
    }
    const before = m.size;
    m.set(name, value);
    this.count += m.size - before;
  }

  /** Removes `namespace`/`name` (nothing when absent); an emptied namespace is dropped. */
  delete(namespace: string, name: string): void {
    const m = this.byNamespace.get(namespace);
    if (!m?.delete(name)) return;
    this.count--;
    if (m.size === 0) this.byNamespace.delete(namespace);
  }

  /** Entries of one namespace, or of all when `namespace` is undefined, as `[namespace, name, value]`. */
  *entries(namespace?: string): Generator<[string, string, V]> {
    const scopes =
      namespace === undefined ? [...this.byNamespace] : [[namespace, this.byNamespace.get(namespace)] as const];
    for (const [ns, m] of scopes) {
      if (!m) continue;
      // Copy: callers delete while iterating.
      for (const [name, v] of [...m]) yield [ns, name, v];
    }
  }
}

/**
 * What the index needs of a referencing object: its namespace (interned) and the names it
 * references, which {@link RefIndex.update} replaces.
 */
export interface Referrer {
  readonly namespace: string;
  /** Referenced Secret names (shared empty array when none). */
  secrets: readonly string[];
  /** Referenced ConfigMap names (shared empty array when none). */
  configMaps: readonly string[];
  /** Referenced ServiceAccount names (shared empty array when none). */
  serviceAccounts: readonly string[];
}

/** The names `r` references of type `t`. */
function namesOf(r: Referrer, t: RefType): readonly string[] {
  return t === REF_SECRET ? r.secrets : t === REF_CONFIG_MAP ? r.configMaps : r.serviceAccounts;
}

/** A referenced Secret, ConfigMap or ServiceAccount. */
interface RefEntry<R> {
  /** resourceVersion; `ABSENT` when known not to exist; `undefined` when not seen yet. */
  rv: string | undefined;
  /** The referencing objects: one (the common case, no array), or several. */
  referrers: R | R[];
  mark: number;
  /** `epoch` when created (entries created during a list are not swept by it). */
  readonly born: number;
}

/**
 * How the {@link RefIndex} reports a referenced object's change, once per referrer in
 * referrer order. `cause` is the `ref-changed` cause: `Secret/<name>@<rv>`, `ConfigMap/…`,
 * `@gone-<rv>` when deleted.
 */
export interface RefHooks<R> {
  /** The referenced object changed (new resourceVersion) or went away since it was last seen. */
  changed(referrer: R, cause: string): void;
  /**
   * The referenced object is seen for the first time by a list (no baseline: the first list
   * after a restart); `writtenMs` is its {@link lastWriteTime} (NaN when unknown). The caller
   * tells whether that write came after the referrer's last reconcile.
   */
  firstSeen(referrer: R, cause: string, writtenMs: number): void;
}

/** Which watched objects reference which Secret and ConfigMap, and what was last seen of each. */
export class RefIndex<R extends Referrer> {
  private readonly maps: [NamespacedMap<RefEntry<R>>, NamespacedMap<RefEntry<R>>, NamespacedMap<RefEntry<R>>] = [
    new NamespacedMap(),
    new NamespacedMap(),
    new NamespacedMap(),
  ];
  /** Counts list starts: marks of lists, births of entries. */
  private epoch = 0;

  /** @param hooks - Where changes go; see {@link RefHooks}. */
  constructor(private readonly hooks: RefHooks<R>) {}

  /** Referenced Secrets + ConfigMaps + ServiceAccounts tracked. */
  get size(): number {
    return this.maps[0].size + this.maps[1].size + this.maps[2].size;
  }

  /** Records what a new referrer references. */
  add(r: R): void {
    for (const t of REF_TYPES) this.addRefs(t, r, namesOf(r, t));
  }

  /** Forgets a referrer; a referenced object no one references any more is dropped. */
  remove(r: R): void {
    for (const t of REF_TYPES) this.dropRefs(t, r, namesOf(r, t));
  }

  /** Replaces what `r` references by `refs` (nothing to do when the names are the same). */
  update(r: R, refs: ObjectRefs): void {
    const accounts = refs.serviceAccounts ?? NO_REFS.secrets;
    if (
      sameNames(r.secrets, refs.secrets) &&
      sameNames(r.configMaps, refs.configMaps) &&
      sameNames(r.serviceAccounts, accounts)
    ) {
      return;
    }
    this.remove(r);
    r.secrets = refs.secrets.length ? refs.secrets : NO_REFS.secrets;
    r.configMaps = refs.configMaps.length ? refs.configMaps : NO_REFS.configMaps;
    r.serviceAccounts = accounts.length ? accounts : NO_REFS.secrets;
    this.add(r);
  }

  /**
   * The reflector handler of one referenced kind in one scope (`ns` undefined: all
   * namespaces): a relist diffs against what was seen, a watch event compares resourceVersions.
   */
  handler(t: RefType, ns: string | undefined): ReflectorHandler {
    let mark = 0;
    return {
      listStart: () => {
        mark = ++this.epoch;
      },
      listItem: (obj) => this.onListed(t, obj, mark),
      listEnd: () => this.sweep(t, ns, mark),
      event: (ev) => this.onEvent(t, ev),
    };
  }

  private addRefs(t: RefType, r: R, names: readonly string[]): void {
    const map = this.maps[t];
    for (const name of names) {
      const e = map.get(r.namespace, name);
      if (!e) map.set(r.namespace, name, { rv: undefined, referrers: r, mark: 0, born: this.epoch });
      else if (Array.isArray(e.referrers)) e.referrers.push(r);
      else if (e.referrers !== r) e.referrers = [e.referrers, r];
    }
  }

  private dropRefs(t: RefType, r: R, names: readonly string[]): void {
    const map = this.maps[t];
    for (const name of names) {
      const e = map.get(r.namespace, name);
      if (!e) continue;
      if (!Array.isArray(e.referrers)) {
        if (e.referrers === r) map.delete(r.namespace, name);
        continue;
      }
      const i = e.referrers.indexOf(r);
      if (i >= 0) e.referrers.splice(i, 1);
      if (e.referrers.length === 1) e.referrers = e.referrers[0]!;
    }
  }

  private onListed(t: RefType, obj: KubeObject, mark: number): void {
    const e = this.maps[t].get(obj.metadata.namespace ?? '', obj.metadata.name);
    if (!e) return;
    e.mark = mark;
    const rv = obj.metadata.resourceVersion;
    if (e.rv === rv) return;
    const known = e.rv !== undefined;
    e.rv = rv;
    const cause = refCause(t, obj.metadata.name, rv);
    if (known) {
      for (const r of referrersOf(e)) this.hooks.changed(r, cause);
      return;
    }
    // No baseline (first list after a restart): changed since the referrer's last reconcile?
    const written = lastWriteTime(obj);
    for (const r of referrersOf(e)) this.hooks.firstSeen(r, cause, written);
  }

  private sweep(t: RefType, ns: string | undefined, mark: number): void {
    for (const [, name, e] of this.maps[t].entries(ns)) {
      if (e.mark === mark || e.born >= mark) continue;
      const last = e.rv;
      e.rv = ABSENT;
      if (last === undefined || last === ABSENT) continue;
      for (const r of referrersOf(e)) this.hooks.changed(r, refCause(t, name, `gone-${last}`));
    }
  }

  private onEvent(t: RefType, ev: WatchEvent): void {
    const e = this.maps[t].get(ev.object.metadata.namespace ?? '', ev.object.metadata.name);
    if (!e) return;
    const rv = ev.object.metadata.resourceVersion;
    if (ev.type === 'DELETED') {
      e.rv = ABSENT;
    } else {
      if (e.rv === rv) return;
      e.rv = rv;
    }
    const cause = refCause(t, ev.object.metadata.name, ev.type === 'DELETED' ? `gone-${rv}` : rv);
    for (const r of referrersOf(e)) this.hooks.changed(r, cause);
  }
}

function sameNames(x: readonly string[], y: readonly string[]): boolean {
  return x === y || (x.length === y.length && x.every((v, i) => v === y[i]));
}

/** The cause of a `ref-changed` (part of its event id): `Secret/<name>@<rv>`, `ConfigMap/…`, `ServiceAccount/…`. */
function refCause(t: RefType, name: string, version: string): string {
  return `${REF_KINDS[t]}/${name}@${version}`;
}

function referrersOf<R>(e: RefEntry<R>): readonly R[] {
  return Array.isArray(e.referrers) ? e.referrers : [e.referrers];
}

/**
 * When a Secret or ConfigMap was last written, per its metadata: the latest of
 * `creationTimestamp` and `metadata.managedFields[].time` (ms; NaN when neither is set).
 */
export function lastWriteTime(obj: KubeObject): number {
  let t = Number.NaN;
  const consider = (v: unknown) => {
    if (typeof v !== 'string') return;
    const ms = Date.parse(v);
    if (!Number.isNaN(ms) && !(ms <= t)) t = ms;
  };
  consider(obj.metadata.creationTimestamp);
  const mf = obj.metadata.managedFields;
  if (Array.isArray(mf)) for (const e of mf) consider((e as { time?: unknown } | null)?.time);
  return t;
}
