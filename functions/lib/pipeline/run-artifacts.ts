/**
 * A run's artifacts carried from stage to stage in process, beside its object ({@link RunCopy}
 * of `./deps.ts`): the embedded driver runs a run's stages back to back, so the template stage
 * need not read back the fetch tarball the fetch stage has just stored, nor the deploy stage the
 * manifest the template stage has just stored. Lambda has no such carry: each stage is its own
 * invocation and reads the store.
 *
 * Only artifacts are carried (`../artifact/keys.ts` fetch and template keys, and their private
 * forms of `../artifact/sealed.ts`): their key names their content (a sha256 or a MAC of it), so
 * the bytes under a key never change and a carried copy cannot be stale. A private artifact is
 * carried as stored, sealed: `privateArtifacts` still opens it with the run's cluster key and
 * checks its scope and expiry. Records and markers (`cache/…`, `inflight/…`, `state/…`) change,
 * so they are always read.
 *
 * @module
 */
import {
  FETCH_KEY_PATTERN,
  PRIVATE_FETCH_KEY_PATTERN,
  PRIVATE_TEMPLATE_KEY_PATTERN,
  TEMPLATE_KEY_PATTERN,
} from '../artifact/keys.js';
import { type GetOptions, type ObjectBody, type ObjectStore, toBuffer } from '../store/port.js';

/**
 * Largest artifact a run carries, bytes: 8 MiB. A larger one (a big chart) is read from the
 * store by the next stage, so a run holds at most one such copy between stages (its tarball
 * until its manifest is stored, then the manifest), whatever it fetched.
 */
export const MAX_CARRIED_ARTIFACT_BYTES = 8 * 1024 * 1024;

const FETCH_KEYS = [FETCH_KEY_PATTERN, PRIVATE_FETCH_KEY_PATTERN];
const TEMPLATE_KEYS = [TEMPLATE_KEY_PATTERN, PRIVATE_TEMPLATE_KEY_PATTERN];
const CARRIED = [...FETCH_KEYS, ...TEMPLATE_KEYS];

/** True when `key` names an artifact a run may carry (its content never changes under it). */
export function isCarriedArtifactKey(key: string): boolean {
  return CARRIED.some((p) => p.test(key));
}

/**
 * `store` for one run: what the run stores under an artifact key ({@link isCarriedArtifactKey},
 * at most {@link MAX_CARRIED_ARTIFACT_BYTES}) is kept in `carry`, and a later `get` or `head` of
 * that key is answered from it without a request; a `delete` drops it. Everything else goes to
 * `store` as it is.
 *
 * @param carry - the run's carried artifacts (key → stored bytes), shared by its stages.
 */
export function carryingArtifacts(store: ObjectStore, carry: Map<string, Buffer>): ObjectStore {
  const keep = (key: string, body: ObjectBody) => {
    if (!isCarriedArtifactKey(key)) return;
    // The render is stored: the run reads its tarball no more, so it is not held through the
    // deploy (kapp's whole run) beside the manifest.
    if (TEMPLATE_KEYS.some((p) => p.test(key)))
      for (const k of [...carry.keys()]) if (FETCH_KEYS.some((p) => p.test(k))) carry.delete(k);
    const bytes = toBuffer(body);
    if (bytes.length <= MAX_CARRIED_ARTIFACT_BYTES) carry.set(key, bytes);
  };
  return {
    get: async (key: string, opts?: GetOptions) => {
      const kept = carry.get(key);
      if (kept && (opts?.maxBytes === undefined || kept.length <= opts.maxBytes)) return kept;
      return await store.get(key, opts);
    },
    head: async (key) => {
      const kept = carry.get(key);
      return kept ? { size: kept.length } : await store.head(key);
    },
    putIfAbsent: async (key, body) => {
      const out = await store.putIfAbsent(key, body);
      // `exists`: the same content is stored under a content key already
      keep(key, body);
      return out;
    },
    put: async (key, body) => {
      await store.put(key, body);
      keep(key, body);
    },
    delete: async (key) => {
      carry.delete(key);
      await store.delete(key);
    },
    getVersioned: (key, opts) => store.getVersioned(key, opts),
    putIfMatch: (key, body, ifMatch) => store.putIfMatch(key, body, ifMatch),
    list: (prefix, opts) => store.list(prefix, opts),
  };
}
