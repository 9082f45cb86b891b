/**
 * The sharing domain of a stage's store (`KAPP_LAMBDA_SHARING=cluster`, docs/decisions.md D17):
 * the claims a run writes and trusts (cache records, in-flight markers, repository indexes keyed
 * by an input digest) live under `d/<domain tag>/`, a prefix the run's session alone may write,
 * so a run taken over in one cluster can no longer plant them for another. Content-addressed
 * blobs (`artifacts/fetch/`, `artifacts/template/`) stay fleet-wide: they are verified on read.
 *
 * @module
 */
import {
  type GetOptions,
  InvalidKeyError,
  type ListOptions,
  listLimit,
  type ObjectBody,
  type ObjectStore,
  validateKey,
  validatePrefix,
} from './port.js';

/**
 * The key areas a sharing domain scopes, each with its trailing `/`: the cache records
 * (`cache/render/`, `cache/fetch/`, `cache/index/`, `cache/source-poll/`), the single-flight
 * markers (`inflight/`) and the repository indexes (`artifacts/index/`, keyed by an input digest,
 * so a claim too).
 */
export const DOMAIN_SCOPED_PREFIXES: readonly string[] = Object.freeze(['artifacts/index/', 'cache/', 'inflight/']);

/**
 * Who shares a stage's claims (`KAPP_LAMBDA_SHARING`, CDK context `sharing`): `fleet`, every
 * cluster (under `cache/`, `inflight/`, `artifacts/index/`); `cluster`, the cluster alone (under
 * `d/<its keyring tag>/`, {@link domainScopedStore}).
 */
export type Sharing = 'fleet' | 'cluster';

/** The values of {@link Sharing}. */
export const SHARING_MODES: readonly Sharing[] = Object.freeze(['fleet', 'cluster']);

/** Where every sharing domain's keys live: `d/<domain tag>/<key>`. */
export const DOMAIN_ROOT = 'd/';

const TAG = /^[A-Za-z0-9_-]{1,64}$/;

/** The area of {@link DOMAIN_SCOPED_PREFIXES} `key` (or a list prefix) lies in, if any. */
function areaOf(key: string): string | undefined {
  return DOMAIN_SCOPED_PREFIXES.find((p) => key.startsWith(p));
}

/**
 * `key` as the domain `tag` stores it: `d/<tag>/<key>` for a key under a
 * {@link DOMAIN_SCOPED_PREFIXES} area, any other key unchanged.
 * @throws InvalidKeyError when `tag` is not 1..64 of `[A-Za-z0-9_-]` (a key segment).
 */
export function domainKey(tag: string, key: string): string {
  return areaOf(key) === undefined ? key : domainRoot(tag) + key;
}

/** `d/<tag>/`; throws InvalidKeyError as {@link domainKey}. */
function domainRoot(tag: string): string {
  if (typeof tag !== 'string' || !TAG.test(tag)) {
    throw new InvalidKeyError('invalid sharing domain tag', 'get', String(tag));
  }
  return `${DOMAIN_ROOT}${tag}/`;
}

/**
 * `store` seen through the sharing domain `tag()`: every operation on a key under `cache/`,
 * `inflight/` or `artifacts/index/` ({@link DOMAIN_SCOPED_PREFIXES}) reaches `d/<tag>/<key>`
 * instead (reads, writes, deletes, compare-and-swap, and `list`, whose prefix and `startAfter`
 * are mapped there and whose keys are mapped back); every other key reaches `store` unchanged.
 *
 * `tag` is read on each operation, since behind the dispatcher the cluster (and its keyring tag)
 * is known only from the first batch; when it throws, the operation rejects with its error.
 * Keys are checked before they are mapped, so a bad key rejects as it would on `store`.
 *
 * A `list` prefix that spans a scoped area and other keys (`''`, `cache`, `artifacts/`, …) rejects
 * with {@link InvalidKeyError}: its keys would come from two places (and a domain's session may
 * not list the other), and no caller needs it.
 */
export function domainScopedStore(store: ObjectStore, tag: () => string): ObjectStore {
  // The tag is read only for a scoped key: shared keys work before the cluster is known.
  const map = (key: string): string => (areaOf(key) === undefined ? key : domainRoot(tag()) + key);
  const keyed =
    <A extends unknown[], T>(op: Parameters<typeof validateKey>[1], fn: (key: string, ...rest: A) => Promise<T>) =>
    async (key: string, ...rest: A): Promise<T> => {
      validateKey(key, op);
      return await fn(map(key), ...rest);
    };
  return {
    get: keyed('get', (key, opts?: GetOptions) => store.get(key, opts)),
    getVersioned: keyed('get', (key, opts?: GetOptions) => store.getVersioned(key, opts)),
    head: keyed('head', (key) => store.head(key)),
    putIfAbsent: keyed('putIfAbsent', (key, body: ObjectBody) => store.putIfAbsent(key, body)),
    putIfMatch: keyed('putIfMatch', (key, body: ObjectBody, ifMatch: string | undefined) =>
      store.putIfMatch(key, body, ifMatch),
    ),
    put: keyed('put', (key, body: ObjectBody) => store.put(key, body)),
    delete: keyed('delete', (key) => store.delete(key)),
    list: async (prefix: string, opts?: ListOptions): Promise<string[]> => {
      validatePrefix(prefix);
      listLimit(opts);
      const area = areaOf(prefix);
      if (area === undefined) {
        if (DOMAIN_SCOPED_PREFIXES.some((p) => p.startsWith(prefix))) {
          throw new InvalidKeyError(
            'invalid list prefix: it spans sharing-domain keys and shared keys; list under one of them',
            'list',
            prefix,
          );
        }
        return await store.list(prefix, opts);
      }
      const root = domainRoot(tag());
      // Keys of the area all start with `area`: a `startAfter` outside it sorts before all or after all of them.
      const after = opts?.startAfter;
      let startAfter: string | undefined;
      if (after !== undefined) {
        if (after.startsWith(area)) startAfter = root + after;
        else if (after > area) return [];
      }
      const keys = await store.list(root + prefix, {
        ...(opts?.limit === undefined ? {} : { limit: opts.limit }),
        ...(startAfter === undefined ? {} : { startAfter }),
      });
      return keys.map((k) => k.slice(root.length));
    },
  };
}
