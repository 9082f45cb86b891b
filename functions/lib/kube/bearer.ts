/**
 * Bearer tokens of the functions' cluster identities (the cluster registry's two auth kinds):
 *
 * - {@link EksTokenSource}: the function's own IAM role as aws-iam-authenticator and
 *   `aws eks get-token` make it: a presigned STS `GetCallerIdentity` URL signed with the
 *   `x-k8s-aws-id: <cluster name>` header, as `k8s-aws-v1.` + base64url (no padding). EKS
 *   accepts it for 15 minutes after signing; it is cached until shortly before that. Signing is
 *   local (SigV4 query presigning with `node:crypto`, {@link presignGetCallerIdentity}), no call
 *   to STS is made here.
 * - {@link SecretTokenSource}: a ServiceAccount token read from a {@link SecretStore}
 *   (AWS Secrets Manager, or a directory for the embedded mode and tests), cached for a TTL.
 *
 * Tokens are secrets: they are never logged and never part of an error message.
 *
 * @module
 */
import { createHash, createHmac } from 'node:crypto';
import { readFile, realpath } from 'node:fs/promises';
import path from 'node:path';
import type { SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import type { AwsCredentialIdentity, AwsCredentialIdentityProvider } from '@smithy/types';

/** A bearer token and when it stops being usable. */
export interface BearerToken {
  /** The token. Secret. */
  token: string;
  /** When it expires (or, for a token of unknown lifetime, when it must be read again). */
  expiresAt: Date;
}

/** Gives a token valid for at least `minValidityMs` more (default {@link DEFAULT_MIN_VALIDITY_MS}). */
export interface BearerSource {
  /** @throws Error naming the source (never the token) when no token can be had. */
  token(minValidityMs?: number): Promise<BearerToken>;
}

/** Default validity a token must still have when used for an API request: 60 s. */
export const DEFAULT_MIN_VALIDITY_MS = 60_000;

/** How long EKS accepts a token after its signing time: 15 minutes (aws-iam-authenticator). */
export const EKS_TOKEN_LIFETIME_MS = 15 * 60_000;

/** Prefix of an EKS bearer token (aws-iam-authenticator `v1Prefix`). */
export const EKS_TOKEN_PREFIX = 'k8s-aws-v1.';

/** Header naming the cluster in the signed request (aws-iam-authenticator `clusterIDHeader`). */
export const EKS_CLUSTER_ID_HEADER = 'x-k8s-aws-id';

/** Options of {@link EksTokenSource}. */
export interface EksTokenOptions {
  /** The EKS cluster name (`x-k8s-aws-id`). */
  clusterName: string;
  /** Region of the STS endpoint, `sts.<region>.amazonaws.com`. */
  region: string;
  /** The role's credentials (the SDK's default provider chain on Lambda). */
  credentials: AwsCredentialIdentity | AwsCredentialIdentityProvider;
  /** Clock; default `() => new Date()`. Tests fix it. */
  now?: () => Date;
}

/** Encodes as base64url without padding (aws-iam-authenticator `base64.RawURLEncoding`). */
function base64url(text: string): string {
  return Buffer.from(text, 'utf8').toString('base64url');
}

/** SigV4's hex SHA-256 of the empty payload (a GET without body). */
const EMPTY_PAYLOAD_SHA256 = createHash('sha256').update('').digest('hex');

/** RFC 3986 percent-encoding as SigV4 canonicalizes query keys and values (`encodeURIComponent` plus `!'()*`). */
function sigv4Escape(text: string): string {
  return encodeURIComponent(text).replace(/[!'()*]/g, (c) => `%${c.charCodeAt(0).toString(16).toUpperCase()}`);
}

/**
 * The query of a SigV4-presigned STS `GetCallerIdentity` GET with the `host` and
 * {@link EKS_CLUSTER_ID_HEADER} headers signed: what `SignatureV4.presign` of the AWS SDK
 * (`@smithy/signature-v4`) gives for that request, in its parameter order (`Action`, `Version`,
 * `X-Amz-Security-Token` when the credentials have a session token, `X-Amz-Algorithm`,
 * `X-Amz-Credential`, `X-Amz-Date`, `X-Amz-Expires`, `X-Amz-SignedHeaders`, `X-Amz-Signature`),
 * written with `node:crypto` so the functions do not bundle the SDK's signer (~150 KB).
 *
 * @param hostname - `sts.<region>.amazonaws.com`.
 * @param expiresInS - `X-Amz-Expires`, seconds.
 * @throws Error when the credentials lack an access key id or secret access key (never quoted).
 */
export function presignGetCallerIdentity(
  credentials: AwsCredentialIdentity,
  region: string,
  hostname: string,
  clusterName: string,
  signingDate: Date,
  expiresInS: number,
): [string, string][] {
  if (typeof credentials.accessKeyId !== 'string' || typeof credentials.secretAccessKey !== 'string') {
    throw new Error('EKS token: the credentials have no access key id or secret access key');
  }
  const longDate = signingDate
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d{3}/, '');
  const shortDate = longDate.slice(0, 8);
  const scope = `${shortDate}/${region}/sts/aws4_request`;
  const signedHeaders = `host;${EKS_CLUSTER_ID_HEADER}`;
  const query: [string, string][] = [
    ['Action', 'GetCallerIdentity'],
    ['Version', '2011-06-15'],
    ...(credentials.sessionToken ? [['X-Amz-Security-Token', credentials.sessionToken] as [string, string]] : []),
    ['X-Amz-Algorithm', 'AWS4-HMAC-SHA256'],
    ['X-Amz-Credential', `${credentials.accessKeyId}/${scope}`],
    ['X-Amz-Date', longDate],
    ['X-Amz-Expires', expiresInS.toString(10)],
    ['X-Amz-SignedHeaders', signedHeaders],
  ];
  const canonicalQuery = query
    .map(([k, v]) => [sigv4Escape(k), sigv4Escape(v)] as const)
    .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
    .map(([k, v]) => `${k}=${v}`)
    .join('&');
  const canonicalHeaders = `host:${hostname}\n${EKS_CLUSTER_ID_HEADER}:${clusterName.trim().replace(/\s+/g, ' ')}\n`;
  const canonicalRequest = ['GET', '/', canonicalQuery, canonicalHeaders, signedHeaders, EMPTY_PAYLOAD_SHA256].join(
    '\n',
  );
  const stringToSign = [
    'AWS4-HMAC-SHA256',
    longDate,
    scope,
    createHash('sha256').update(canonicalRequest).digest('hex'),
  ].join('\n');
  let key: Buffer = createHmac('sha256', `AWS4${credentials.secretAccessKey}`).update(shortDate).digest();
  for (const part of [region, 'sts', 'aws4_request']) key = createHmac('sha256', key).update(part).digest();
  query.push(['X-Amz-Signature', createHmac('sha256', key).update(stringToSign).digest('hex')]);
  return query;
}

/** A token of an IAM identity for one EKS cluster; re-signed when the cached one would expire too soon. */
export class EksTokenSource implements BearerSource {
  readonly #options: EksTokenOptions;
  #cached: BearerToken | undefined;

  /** See {@link EksTokenOptions}. */
  constructor(options: EksTokenOptions) {
    this.#options = options;
  }

  /**
   * {@inheritDoc BearerSource.token}
   * @throws Error when the credential provider fails or gives no key pair.
   */
  async token(minValidityMs = DEFAULT_MIN_VALIDITY_MS): Promise<BearerToken> {
    const now = (this.#options.now ?? (() => new Date()))();
    if (this.#cached && this.#cached.expiresAt.getTime() - now.getTime() >= minValidityMs) return this.#cached;
    const { credentials, region, clusterName } = this.#options;
    const identity = typeof credentials === 'function' ? await credentials() : credentials;
    this.#cached = signEksToken(identity, clusterName, region, now);
    return this.#cached;
  }
}

/**
 * Signs an EKS bearer token of `credentials`' identity for cluster `clusterName` (the
 * `x-k8s-aws-id` header) at `now`, as aws-iam-authenticator does: presigned for 60 s, accepted by
 * EKS for {@link EKS_TOKEN_LIFETIME_MS} after `now` (its `expiresAt`). Local, no call to STS.
 * Used by {@link EksTokenSource} and by the dispatcher, which mints each dispatched run's token
 * with its own role (docs/decisions.md D15).
 *
 * @throws Error when the credentials lack an access key id or secret access key (never quoted).
 */
export function signEksToken(
  credentials: AwsCredentialIdentity,
  clusterName: string,
  region: string,
  now: Date,
): BearerToken {
  const hostname = `sts.${region}.amazonaws.com`;
  const query = new URLSearchParams(presignGetCallerIdentity(credentials, region, hostname, clusterName, now, 60));
  const url = `https://${hostname}/?${query.toString().replaceAll('+', '%20')}`;
  return { token: EKS_TOKEN_PREFIX + base64url(url), expiresAt: new Date(now.getTime() + EKS_TOKEN_LIFETIME_MS) };
}

/** Where ServiceAccount tokens are kept, by name. */
export interface SecretStore {
  /**
   * The secret's text, trimmed.
   *
   * @throws Error `reading secret <name>: …` when it cannot be read or is empty (never its value).
   */
  read(name: string): Promise<string>;
}

/** {@link SecretStore} over AWS Secrets Manager (`GetSecretValue`, the secret's `SecretString`). */
export class SecretsManagerSecretStore implements SecretStore {
  readonly #client: Pick<SecretsManagerClient, 'send'>;

  /** @param client - a Secrets Manager client (default credentials: the function role). */
  constructor(client: Pick<SecretsManagerClient, 'send'>) {
    this.#client = client;
  }

  /** {@inheritDoc SecretStore.read} */
  async read(name: string): Promise<string> {
    let text: string | undefined;
    try {
      // The SDK is loaded on the first read, not when this module is imported (a cold start).
      const { GetSecretValueCommand } = await import('@aws-sdk/client-secrets-manager');
      text = (await this.#client.send(new GetSecretValueCommand({ SecretId: name }))).SecretString;
    } catch (cause) {
      const what = cause instanceof Error ? `${cause.name}` : 'error';
      throw new Error(`reading secret ${name}: ${what}`, { cause });
    }
    const value = text?.trim();
    if (!value) throw new Error(`reading secret ${name}: no SecretString`);
    return value;
  }
}

/**
 * {@link SecretStore} over a directory: the secret `a/b` is the file `<root>/a/b` (the embedded
 * mode and tests; e.g. a mounted Kubernetes Secret volume). A name whose real path leaves the
 * root (`..`, a symlink out) is refused.
 */
export class DirSecretStore implements SecretStore {
  readonly #root: string;

  /** @param root - absolute directory. */
  constructor(root: string) {
    if (!path.isAbsolute(root)) throw new TypeError('secret directory must be absolute');
    this.#root = root;
  }

  /** {@inheritDoc SecretStore.read} */
  async read(name: string): Promise<string> {
    let value: string;
    try {
      const root = await realpath(this.#root);
      const file = await realpath(path.join(root, name));
      if (path.relative(root, file).startsWith('..') || path.isAbsolute(path.relative(root, file))) {
        throw new Error('outside the secret directory');
      }
      value = (await readFile(file, 'utf8')).trim();
    } catch (cause) {
      throw new Error(`reading secret ${name}: ${(cause as Error).message.split(':')[0]}`, { cause });
    }
    if (!value) throw new Error(`reading secret ${name}: empty`);
    return value;
  }
}

/** Options of {@link SecretTokenSource}. */
export interface SecretTokenOptions {
  store: SecretStore;
  /** The secret holding the token. */
  name: string;
  /** How long a read token is used before it is read again, ms (rotation reaches us within it). */
  ttlMs: number;
  /** Clock; default `() => new Date()`. */
  now?: () => Date;
}

/**
 * The `exp` claim of a JWT (a ServiceAccount token) as a Date, without verifying anything (the
 * API server does): only to stop using a token that has expired. `undefined` when absent.
 */
export function jwtExpiry(token: string): Date | undefined {
  const payload = token.split('.')[1];
  if (!payload) return undefined;
  try {
    const exp = (JSON.parse(Buffer.from(payload, 'base64url').toString('utf8')) as { exp?: unknown }).exp;
    return typeof exp === 'number' && Number.isFinite(exp) ? new Date(exp * 1000) : undefined;
  } catch {
    return undefined;
  }
}

/**
 * A ServiceAccount token from a {@link SecretStore}: read again once `ttlMs` has passed since the
 * last read, or when its own `exp` is closer than the validity asked for.
 */
export class SecretTokenSource implements BearerSource {
  readonly #options: SecretTokenOptions;
  #cached: { token: BearerToken; readAt: number; exp: number | undefined } | undefined;

  /** See {@link SecretTokenOptions}. */
  constructor(options: SecretTokenOptions) {
    this.#options = options;
  }

  /**
   * {@inheritDoc BearerSource.token}
   *
   * `expiresAt` is the token's `exp`, or the end of the TTL when it has none. A token closer to
   * its `exp` than `minValidityMs` is still returned when the store has nothing newer (the API
   * server decides; rotation is the store owner's job).
   */
  async token(minValidityMs = DEFAULT_MIN_VALIDITY_MS): Promise<BearerToken> {
    const now = (this.#options.now ?? (() => new Date()))().getTime();
    const c = this.#cached;
    if (c && now - c.readAt < this.#options.ttlMs && (c.exp === undefined || c.exp - now >= minValidityMs)) {
      return c.token;
    }
    const token = await this.#options.store.read(this.#options.name);
    const exp = jwtExpiry(token)?.getTime();
    this.#cached = { token: { token, expiresAt: new Date(exp ?? now + this.#options.ttlMs) }, readAt: now, exp };
    return this.#cached.token;
  }
}
