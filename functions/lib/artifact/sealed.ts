/**
 * Private artifacts: content that came from Secrets, stored encrypted per cluster, under
 * unguessable keys, with an expiry.
 *
 * An artifact is *private* when any Secret went into it (a fetch with a `secretRef`
 * credential or an inline `pathsFrom` Secret; a render with a Secret `valuesFrom`/`pathsFrom`,
 * a sops step, a private fetch as input, or a manifest that holds a `Secret` object). Private
 * artifacts never enter the fleet-wide content-addressed keys (`./keys.ts`); they live under
 *
 * | what | key |
 * |---|---|
 * | fetched content | `private/<cluster tag>/<namespace tag>/fetch/<mac>.tgz` |
 * | rendered manifest | `private/<cluster tag>/<namespace tag>/template/<mac>.yaml` |
 * | render cache entry | `private/<cluster tag>/<namespace tag>/cache/render/<mac>.json` |
 * | pinned-fetch record | `private/<cluster tag>/<namespace tag>/cache/fetch/<mac>.json` |
 * | deploy record (an App's last successful deploy, `../deploy/live-record.ts`) | `private/<cluster tag>/<namespace tag>/state/deploy/<mac>.json` |
 *
 * where the cluster tag comes from the {@link ClusterKeyring}, the namespace tag and `<mac>`
 * are HMAC-SHA256 under the cluster's MAC key (of the namespace, and of kind + namespace +
 * content digest or input hash). So a key reveals neither the cluster, the namespace nor the
 * content, is not shared with another cluster or namespace holding the same bytes, and cannot
 * be computed without the cluster's key.
 *
 * Every private object is sealed ({@link sealArtifact}): AES-256-GCM under the cluster's
 * encryption key, a fresh 96-bit IV, and the object key plus the expiry as additional
 * authenticated data, so a sealed body opens only under its own key, for its own cluster,
 * with its expiry untouched. Expiry: {@link DEFAULT_PRIVATE_TTL_MS} (7 days) after each write;
 * an expired object is never served and is deleted when read. In S3 the bucket's lifecycle
 * rule must expire the `private/` prefix a day after the TTL (8 days), so what is never read
 * again is removed too.
 *
 * @module
 */
import { createCipheriv, createDecipheriv, createHmac, randomBytes } from 'node:crypto';
import type { ObjectStore } from '../store/port.js';
import type { ClusterKeyring, ClusterKeys } from './keyring.js';

/** First segment of every private key (the S3 lifecycle rule's prefix). */
export const PRIVATE_PREFIX = 'private/';
/** Default life of a private artifact after its last write: 7 days, in ms. */
export const DEFAULT_PRIVATE_TTL_MS = 7 * 24 * 60 * 60 * 1000;

/** Kinds of private object, with their key segment and extension. */
const KINDS = {
  fetch: { dir: 'fetch', ext: 'tgz' },
  template: { dir: 'template', ext: 'yaml' },
  'render-cache': { dir: 'cache/render', ext: 'json' },
  'fetch-cache': { dir: 'cache/fetch', ext: 'json' },
  'deploy-record': { dir: 'state/deploy', ext: 'json' },
} as const;

/** Kind of a private object (see the table in the module comment). */
export type PrivateKind = keyof typeof KINDS;

/** Matches any private key; groups: cluster tag, namespace tag, kind directory, mac, extension. */
export const PRIVATE_KEY_PATTERN =
  /^private\/([0-9a-f]{32})\/([0-9a-f]{32})\/(fetch|template|cache\/render|cache\/fetch|state\/deploy)\/([0-9a-f]{64})\.(tgz|yaml|json)$/;

/** True when `key` names a private object (any kind). */
export function isPrivateKey(key: string): boolean {
  return PRIVATE_KEY_PATTERN.test(key);
}

/** Where a private artifact belongs: the cluster and the namespace of the object it was made for. */
export interface ArtifactScope {
  readonly clusterId: string;
  readonly namespace: string;
}

/** A sealed object could not be opened: wrong cluster, wrong key, tampered, or not sealed. */
export class SealError extends Error {
  override readonly name = 'SealError';
}

const MAGIC = Buffer.from('KLS1', 'ascii');
const HEADER_BYTES = MAGIC.length + 8;
const IV_BYTES = 12;
const TAG_BYTES = 16;

function aad(header: Buffer, key: string): Buffer {
  return Buffer.concat([header, Buffer.from(key, 'utf8')]);
}

/**
 * Seals `plaintext` for `key`: `KLS1 | expiresAt (u64 BE, ms since epoch) | iv (12) | tag (16) |
 * ciphertext`, AES-256-GCM with AAD = header + key.
 */
export function sealArtifact(encKey: Buffer, key: string, plaintext: Buffer, expiresAt: Date): Buffer {
  const header = Buffer.alloc(HEADER_BYTES);
  MAGIC.copy(header, 0);
  header.writeBigUInt64BE(BigInt(Math.max(0, Math.floor(expiresAt.getTime()))), MAGIC.length);
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv('aes-256-gcm', encKey, iv);
  cipher.setAAD(aad(header, key));
  const ct = Buffer.concat([cipher.update(plaintext), cipher.final()]);
  return Buffer.concat([header, iv, cipher.getAuthTag(), ct]);
}

/**
 * Opens a body sealed by {@link sealArtifact} for `key`.
 * @returns the plaintext and its expiry (the caller decides what expired means).
 * @throws SealError when the body is not sealed, was sealed for another key, under another
 *   cluster's key, or was modified.
 */
export function openArtifact(encKey: Buffer, key: string, sealed: Buffer): { plaintext: Buffer; expiresAt: Date } {
  if (sealed.length < HEADER_BYTES + IV_BYTES + TAG_BYTES || !sealed.subarray(0, MAGIC.length).equals(MAGIC)) {
    throw new SealError(`object "${key}" is not a sealed artifact`);
  }
  const header = sealed.subarray(0, HEADER_BYTES);
  const iv = sealed.subarray(HEADER_BYTES, HEADER_BYTES + IV_BYTES);
  const tag = sealed.subarray(HEADER_BYTES + IV_BYTES, HEADER_BYTES + IV_BYTES + TAG_BYTES);
  const decipher = createDecipheriv('aes-256-gcm', encKey, iv);
  decipher.setAAD(aad(header, key));
  decipher.setAuthTag(tag);
  try {
    const plaintext = Buffer.concat([
      decipher.update(sealed.subarray(HEADER_BYTES + IV_BYTES + TAG_BYTES)),
      decipher.final(),
    ]);
    return { plaintext, expiresAt: new Date(Number(header.readBigUInt64BE(MAGIC.length))) };
  } catch (cause) {
    throw new SealError(`object "${key}" does not open with this cluster's key`, { cause });
  }
}

function hmacHex(keys: ClusterKeys, ...parts: string[]): string {
  return createHmac('sha256', keys.macKey).update(parts.join('\0')).digest('hex');
}

/** Options of {@link PrivateArtifacts}. */
export interface PrivateArtifactsOptions {
  /** Wall clock (expiry). */
  readonly now: () => Date;
  /** Life of an object after each write, ms. Default {@link DEFAULT_PRIVATE_TTL_MS}. */
  readonly ttlMs?: number;
}

/**
 * Reads and writes private artifacts of one store with one keyring (see the module comment).
 * Every method takes the {@link ArtifactScope} of the run; a key of another scope is refused.
 */
export class PrivateArtifacts {
  private readonly ttlMs: number;

  constructor(
    private readonly store: ObjectStore,
    private readonly keyring: ClusterKeyring,
    private readonly opts: PrivateArtifactsOptions,
  ) {
    this.ttlMs = opts.ttlMs ?? DEFAULT_PRIVATE_TTL_MS;
  }

  /**
   * The key of a private object of `scope`.
   * @param id - the content's sha256 (fetch, template) or the input hash / pinned identity (caches).
   */
  async keyFor(scope: ArtifactScope, kind: PrivateKind, id: string): Promise<string> {
    const keys = await this.keyring.keysFor(scope.clusterId);
    const { dir, ext } = KINDS[kind];
    return `${this.prefixOf(keys, scope)}${dir}/${hmacHex(keys, kind, scope.namespace, id)}.${ext}`;
  }

  /** `private/<cluster tag>/<namespace tag>/`: every private key of `scope` starts with it. */
  async prefix(scope: ArtifactScope): Promise<string> {
    return this.prefixOf(await this.keyring.keysFor(scope.clusterId), scope);
  }

  private prefixOf(keys: ClusterKeys, scope: ArtifactScope): string {
    return `${PRIVATE_PREFIX}${keys.tag}/${hmacHex(keys, 'namespace', scope.namespace).slice(0, 32)}/`;
  }

  private async checked(scope: ArtifactScope, key: string): Promise<ClusterKeys> {
    const keys = await this.keyring.keysFor(scope.clusterId);
    if (!isPrivateKey(key) || !key.startsWith(this.prefixOf(keys, scope))) {
      throw new SealError(`object "${key}" is not a private artifact of this cluster and namespace`);
    }
    return keys;
  }

  /**
   * Seals and writes (replacing) a private object; each write restarts its expiry.
   * @returns when the object expires.
   * @throws SealError when `key` is not a private key of `scope`; store errors as the store throws them.
   */
  async put(scope: ArtifactScope, key: string, plaintext: Buffer | string): Promise<Date> {
    const keys = await this.checked(scope, key);
    const expiresAt = new Date(this.opts.now().getTime() + this.ttlMs);
    const body = typeof plaintext === 'string' ? Buffer.from(plaintext, 'utf8') : plaintext;
    await this.store.put(key, sealArtifact(keys.encKey, key, body, expiresAt));
    return expiresAt;
  }

  /**
   * Reads and opens a private object.
   * @param minRemainingMs - also treat as absent an object expiring within this many ms (a
   *   cache hit must leave the next stage time to read what it points to). Default 0.
   * @returns the plaintext; `undefined` when absent or expired (an expired object is deleted).
   * @throws SealError when `key` is not a private key of `scope` or does not open with its
   *   cluster's key (tampered or foreign); store errors as the store throws them.
   */
  async get(scope: ArtifactScope, key: string, minRemainingMs = 0): Promise<Buffer | undefined> {
    const keys = await this.checked(scope, key);
    const sealed = await this.store.get(key);
    if (!sealed) return undefined;
    const { plaintext, expiresAt } = openArtifact(keys.encKey, key, sealed);
    const now = this.opts.now().getTime();
    if (expiresAt.getTime() <= now) {
      await this.store.delete(key);
      return undefined;
    }
    if (expiresAt.getTime() - now < minRemainingMs) return undefined;
    return plaintext;
  }
}

/** What {@link privateArtifacts} reads of a stage's dependencies (a `PipelineDeps` fits). */
export interface PrivateArtifactsDeps {
  /** The artifact store. */
  store: ObjectStore;
  /** Per-cluster sealing keys; absent: {@link privateArtifacts} throws. */
  keyring?: ClusterKeyring;
  /** Wall clock (expiry). */
  now: () => Date;
  config: {
    /** Life of a private artifact after each write, ms. Default {@link DEFAULT_PRIVATE_TTL_MS}. */
    privateArtifactTtlMs?: number;
  };
}

/**
 * The private artifact store of `deps`.
 * @throws Error when no keyring is configured: secret material is never stored unsealed or
 *   shared instead (fail closed).
 */
export function privateArtifacts(deps: PrivateArtifactsDeps): PrivateArtifacts {
  if (!deps.keyring) throw new Error('no artifact keyring is configured: cannot store content made from Secrets');
  return new PrivateArtifacts(deps.store, deps.keyring, {
    now: deps.now,
    ...(deps.config.privateArtifactTtlMs ? { ttlMs: deps.config.privateArtifactTtlMs } : {}),
  });
}
