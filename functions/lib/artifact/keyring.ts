/**
 * Per-cluster keys for secret material in object storage (see `./sealed.ts`).
 *
 * A {@link ClusterKeyring} gives each cluster of a fleet its own keys: an encryption key
 * (AES-256-GCM), a MAC key (HMAC-SHA256, names private artifacts so their keys cannot be
 * guessed from their content) and a tag (the cluster's segment of private keys, so key paths
 * do not spell cluster ids). One cluster's runs ask only for their own cluster's keys, so an
 * artifact written for cluster A cannot be opened by a run for cluster B.
 *
 * The implementation here, {@link DerivedKeyring}, derives every cluster's keys from one root
 * key with HKDF-SHA256 (RFC 5869, `node:crypto`). Root key sources: a local file created 0600
 * on first use ({@link loadOrCreateRootKey}, the embedded runtime), or a base64 secret the Lambda
 * functions read from AWS Secrets Manager at cold start ({@link rootKeyFromBase64}, loaded once
 * per process by {@link lazyKeyring}; never a plaintext variable of the function). The
 * production design for the cloud is a
 * KMS data key per cluster (`GenerateDataKey` under a per-fleet CMK, the wrapped key stored
 * beside the cluster's registry entry) behind this same port; that adapter is not written yet.
 *
 * @module
 */
import { hkdfSync, randomBytes } from 'node:crypto';
import { link, mkdir, open, readFile, unlink } from 'node:fs/promises';
import path from 'node:path';

/** Size of a root key, bytes (256 bits). */
export const ROOT_KEY_BYTES = 32;

/** One cluster's keys. Never logged, never stored. */
export interface ClusterKeys {
  /** 32 lowercase hex characters naming the cluster in private keys (not reversible to the id). */
  readonly tag: string;
  /** AES-256-GCM key of the cluster's sealed artifacts (32 bytes). */
  readonly encKey: Buffer;
  /** HMAC-SHA256 key naming the cluster's private artifacts (32 bytes). */
  readonly macKey: Buffer;
}

/** Source of per-cluster keys: the port the pipeline uses to seal and open secret material. */
export interface ClusterKeyring {
  /**
   * The keys of one cluster; the same cluster id always gives the same keys.
   * @throws when the keys cannot be obtained (the stage fails and is retried).
   */
  keysFor(clusterId: string): Promise<ClusterKeys>;
}

const SALT = Buffer.from('kapp-lambda/artifact-keys/v1', 'utf8');

function derive(root: Buffer, clusterId: string, purpose: string, bytes: number): Buffer {
  return Buffer.from(hkdfSync('sha256', root, SALT, `cluster\0${clusterId}\0${purpose}`, bytes));
}

/**
 * Derives each cluster's keys from one root key: HKDF-SHA256 with info
 * `cluster\0<id>\0{enc,mac,tag}`. Keys are cached per cluster id for the process's life.
 */
export class DerivedKeyring implements ClusterKeyring {
  private readonly root: Buffer;
  private readonly cache = new Map<string, ClusterKeys>();

  /**
   * @param root - the root key, at least {@link ROOT_KEY_BYTES} bytes (copied).
   * @throws RangeError when the root key is shorter.
   */
  constructor(root: Buffer) {
    if (root.length < ROOT_KEY_BYTES)
      throw new RangeError(`artifact root key must be at least ${ROOT_KEY_BYTES} bytes`);
    this.root = Buffer.from(root);
  }

  /** {@inheritDoc ClusterKeyring.keysFor} */
  async keysFor(clusterId: string): Promise<ClusterKeys> {
    let k = this.cache.get(clusterId);
    if (!k) {
      k = {
        tag: derive(this.root, clusterId, 'tag', 16).toString('hex'),
        encKey: derive(this.root, clusterId, 'enc', 32),
        macKey: derive(this.root, clusterId, 'mac', 32),
      };
      this.cache.set(clusterId, k);
    }
    return k;
  }
}

/**
 * Decodes a base64 root key (the Lambda functions' secret, `KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET`).
 * @throws RangeError naming `what` (never quoting the value) when it is not base64 of at least
 *   {@link ROOT_KEY_BYTES} bytes.
 */
export function rootKeyFromBase64(text: string | undefined, what: string): Buffer {
  const trimmed = (text ?? '').trim();
  const key = /^[A-Za-z0-9+/]+={0,2}$/.test(trimmed) ? Buffer.from(trimmed, 'base64') : Buffer.alloc(0);
  if (key.length < ROOT_KEY_BYTES) {
    throw new RangeError(`${what}: expected base64 of at least ${ROOT_KEY_BYTES} random bytes`);
  }
  return key;
}

/**
 * Reads the root key file, creating it (mode 0600, parent directories 0700, 32 random bytes)
 * when absent. Creation is atomic (a temp file hard-linked into place), so concurrent
 * first starts agree on one key.
 *
 * @param file - absolute path, e.g. `~/.cache/kapp-lambda/keys/artifact-root.key`.
 * @throws Error when the file exists with the wrong size, or cannot be read or created.
 */
export async function loadOrCreateRootKey(file: string): Promise<Buffer> {
  const read = async (): Promise<Buffer | undefined> => {
    try {
      return await readFile(file);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
      throw err;
    }
  };
  let key = await read();
  if (!key) {
    await mkdir(path.dirname(file), { recursive: true, mode: 0o700 });
    const tmp = `${file}.~tmp-${randomBytes(8).toString('hex')}`;
    const fh = await open(tmp, 'wx', 0o600);
    try {
      await fh.writeFile(randomBytes(ROOT_KEY_BYTES));
      await fh.sync();
    } finally {
      await fh.close();
    }
    try {
      await link(tmp, file);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
    } finally {
      await unlink(tmp).catch(() => undefined);
    }
    key = await read();
  }
  if (!key || key.length !== ROOT_KEY_BYTES) {
    throw new Error(`artifact root key ${file} must hold exactly ${ROOT_KEY_BYTES} bytes`);
  }
  return key;
}

/** A {@link ClusterKeyring} whose root key is loaded once; see {@link lazyKeyring}. */
export interface LazyKeyring extends ClusterKeyring {
  /**
   * Starts loading the root key now (a cold start), without waiting; a failure is kept from
   * the caller and shows on the next {@link ClusterKeyring.keysFor}, which loads again.
   */
  warm(): void;
}

/**
 * A {@link DerivedKeyring} over the root key `load` gives, loaded on first use (or on
 * {@link LazyKeyring.warm}) and kept for the process's life; a failed load is not kept, so
 * the next use tries again (the stage that needed it fails and is retried meanwhile).
 *
 * @param load - reads the root key (a file, a secret store); its errors never quote the key.
 */
export function lazyKeyring(load: () => Promise<Buffer>): LazyKeyring {
  let ring: Promise<DerivedKeyring> | undefined;
  const loaded = (): Promise<DerivedKeyring> => {
    ring ??= load().then((root) => new DerivedKeyring(root));
    const p = ring;
    p.catch(() => {
      if (ring === p) ring = undefined;
    });
    return p;
  };
  return {
    keysFor: async (clusterId) => await (await loaded()).keysFor(clusterId),
    warm: () => void loaded(),
  };
}

/**
 * A {@link DerivedKeyring} over the root key file `file`, loaded (or created, see
 * {@link loadOrCreateRootKey}) on first use: the embedded runtime's keyring.
 */
export function fileKeyring(file: string): ClusterKeyring {
  return lazyKeyring(() => loadOrCreateRootKey(file));
}
