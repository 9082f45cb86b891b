/**
 * Tag → digest resolution for `image` and `imgpkgBundle` sources without vendir or imgpkg: one
 * `HEAD /v2/<repository>/manifests/<tag>` of the OCI distribution API, reading
 * `Docker-Content-Digest` (what go-containerregistry's `remote.Head` does for imgpkg). Used by
 * the fleet's source poll (`../pipeline/source-poll.ts`), so a tagged PackageRepository source
 * costs one small request per period instead of a bundle download per cluster.
 *
 * Auth: an anonymous request first; a `401` with a `Bearer` challenge gets a token from the
 * challenge's realm (`GET <realm>?service=..&scope=repository:<repo>:pull`, with basic auth when
 * credentials are given: the distribution token flow) and the request is sent again with it; a
 * `Basic` challenge is answered with the credentials. Every URL (the manifest, each redirect hop,
 * the token realm) goes through `checkUrl` (the URL policy) before it is requested, and its
 * connection through `lookupFor` (the policy's pinned lookup) when given; at most
 * {@link MAX_REDIRECTS} redirects, and `Authorization` is dropped on a redirect to another host
 * (Go's rule). Plain HTTP only for loopback registries (`localhost`, `127.0.0.0/8`, `[::1]`), as
 * go-containerregistry; everything else is HTTPS. The request and its challenge
 * ({@link registryRequest}) serve the tag list of a `tagSelection` too (`./tag-selection.ts`).
 *
 * No library: the npm registry clients (`@snyk/docker-registry-v2-client`, `docker-registry-client`)
 * follow redirects themselves, past the URL policy; the two requests needed fit in this file.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import type { LookupFunction } from 'node:net';
import { trustingFetch } from './cluster-trust.js';
import { isDomainOrSubdomain, MAX_REDIRECTS } from './http-download.js';
import { UrlPolicyError } from './url-policy.js';

/** What a manifest request accepts: OCI index and manifest, Docker v2 manifest list and manifest. */
export const MANIFEST_ACCEPT = [
  'application/vnd.oci.image.index.v1+json',
  'application/vnd.oci.image.manifest.v1+json',
  'application/vnd.docker.distribution.manifest.list.v2+json',
  'application/vnd.docker.distribution.manifest.v2+json',
].join(', ');

/** Largest manifest read when a registry answers `HEAD` without `Docker-Content-Digest`: 4 MiB. */
const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;
/** Largest token response read: 1 MiB. */
const MAX_TOKEN_BYTES = 1024 * 1024;
const DIGEST = /^sha256:[0-9a-f]{64}$/;

/** An image reference split as the distribution API needs it. */
export interface ImageTagRef {
  /** `host[:port]` of the registry (`index.docker.io` for Docker Hub). */
  registry: string;
  /** Repository path, e.g. `library/nginx`. */
  repository: string;
  /** The tag (`latest` when the reference has none). */
  tag: string;
}

/**
 * Splits `ref` (`[registry/]repository[:tag]`) as go-containerregistry's `name.ParseReference`:
 * the first component is the registry when it holds `.` or `:` or is `localhost`, otherwise Docker
 * Hub (`index.docker.io`, single names under `library/`).
 * @returns `undefined` for a reference by digest or one that is not a valid reference.
 */
export function parseImageTagRef(ref: string): ImageTagRef | undefined {
  if (ref.includes('@') || /\s/.test(ref) || ref.startsWith('-')) return undefined;
  let registry = 'index.docker.io';
  let rest = ref;
  const slash = ref.indexOf('/');
  if (slash >= 0) {
    const first = ref.slice(0, slash);
    if (first.includes('.') || first.includes(':') || first === 'localhost') {
      registry = first === 'docker.io' ? 'index.docker.io' : first;
      rest = ref.slice(slash + 1);
    }
  }
  let tag = 'latest';
  const colon = rest.lastIndexOf(':');
  if (colon > rest.lastIndexOf('/')) {
    tag = rest.slice(colon + 1);
    rest = rest.slice(0, colon);
  }
  if (registry === 'index.docker.io' && !rest.includes('/')) rest = `library/${rest}`;
  if (!/^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/.test(rest))
    return undefined;
  if (!/^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$/.test(tag)) return undefined;
  if (!/^[A-Za-z0-9.-]+(?::\d+)?$|^\[[0-9a-fA-F:]+\](?::\d+)?$/.test(registry)) return undefined;
  return { registry, repository: rest, tag };
}

/** Whether go-containerregistry would talk plain HTTP to `registry` (loopback only). */
export function isLoopbackRegistry(registry: string): boolean {
  const host = registry.replace(/:\d+$/, '');
  return host === 'localhost' || /^127\.\d+\.\d+\.\d+$/.test(host) || host === '[::1]';
}

/** Options of {@link resolveImageDigest}. */
export interface ResolveImageOptions {
  /** Credentials (the source's `secretRef` `username`/`password`), for basic auth and the token request. */
  basicAuth?: { username: string; password: string };
  /** Called with every URL before it is requested; its error propagates and nothing is sent. */
  checkUrl?: (url: string) => Promise<void>;
  /**
   * The DNS lookup of the connection to each URL: the URL policy's `pinnedLookup` while it is
   * enforced, so each request connects to an address checked in the resolution it connects
   * with (a DNS answer that changes after `checkUrl` is refused). When it returns a lookup the
   * request goes over `trustingFetch` (`./cluster-trust.ts`) instead of `fetchImpl`, and its
   * `UrlPolicyError` propagates as is.
   */
  lookupFor?: (url: URL) => LookupFunction | undefined;
  /** The `fetch` to use (default Node's). */
  fetchImpl?: typeof fetch;
  /** Aborts the requests. */
  signal?: AbortSignal;
  /**
   * Holds the `Authorization` that answered the registry's challenge, reused by the next
   * request with these options (one token exchange for a tag list and its `HEAD`). Never logged.
   */
  session?: { authorization?: string };
}

/** The registry did not give a digest; `message` says why (no credentials or tokens in it). */
export class RegistryResolveError extends Error {
  override readonly name = 'RegistryResolveError';
}

function basic(auth: { username: string; password: string }): string {
  return `Basic ${Buffer.from(`${auth.username}:${auth.password}`, 'utf8').toString('base64')}`;
}

/** The parameters of a `WWW-Authenticate` challenge: `{ scheme, params }` (scheme lowercased). */
export function parseChallenge(header: string): { scheme: string; params: Record<string, string> } {
  const m = /^\s*([A-Za-z]+)\s*(.*)$/.exec(header);
  const params: Record<string, string> = {};
  if (!m) return { scheme: '', params };
  const re = /([A-Za-z_]+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^,\s]*))/g;
  for (let p = re.exec(m[2] ?? ''); p; p = re.exec(m[2] ?? '')) {
    params[(p[1] ?? '').toLowerCase()] = (p[2] ?? p[3] ?? '').replace(/\\(.)/g, '$1');
  }
  return { scheme: (m[1] ?? '').toLowerCase(), params };
}

/** The body of `res`, at most `max` bytes. @throws RegistryResolveError past `max` */
export async function readBounded(res: Response, max: number, what: string): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of res.body ?? []) {
    const b = Buffer.from(chunk as Uint8Array);
    total += b.length;
    if (total > max) {
      await res.body?.cancel().catch(() => undefined);
      throw new RegistryResolveError(`${what} exceeds ${max} bytes`);
    }
    chunks.push(b);
  }
  return Buffer.concat(chunks);
}

/**
 * One request with manual redirects under `checkUrl`; `Authorization` travels only to the first
 * host or its subdomains.
 */
async function send(
  url: URL,
  init: { method: 'GET' | 'HEAD'; headers: Record<string, string> },
  opts: ResolveImageOptions,
): Promise<Response> {
  const fetchImpl = opts.fetchImpl ?? fetch;
  const firstHost = url.hostname;
  let current = url;
  for (let hop = 0; ; hop++) {
    await opts.checkUrl?.(current.href);
    const headers = { ...init.headers };
    if (!isDomainOrSubdomain(current.hostname, firstHost)) delete headers.authorization;
    let res: Response;
    try {
      const f = opts.lookupFor?.(current) ? trustingFetch({ lookupFor: opts.lookupFor }) : fetchImpl;
      res = await f(current, { method: init.method, headers, redirect: 'manual', signal: opts.signal });
    } catch (err) {
      if (err instanceof UrlPolicyError) throw err;
      const cause = (err as { cause?: { message?: string } }).cause?.message;
      throw new RegistryResolveError(
        `${init.method} ${current.origin}${current.pathname}: ${cause ?? (err as Error).message}`,
      );
    }
    const location = res.headers.get('location');
    if (![301, 302, 303, 307, 308].includes(res.status) || !location) return res;
    await res.body?.cancel().catch(() => undefined);
    if (hop + 1 > MAX_REDIRECTS) throw new RegistryResolveError(`stopped after ${MAX_REDIRECTS} redirects`);
    current = new URL(location, current);
    if (current.protocol !== 'http:' && current.protocol !== 'https:') {
      throw new RegistryResolveError(`redirect to unsupported scheme ${current.protocol}`);
    }
  }
}

/** Gets a bearer token for `challenge` (the distribution token flow). */
async function bearerToken(
  params: Record<string, string>,
  ref: ImageTagRef,
  opts: ResolveImageOptions,
): Promise<string> {
  const realm = params.realm;
  if (!realm) throw new RegistryResolveError('Bearer challenge without a realm');
  let url: URL;
  try {
    url = new URL(realm);
  } catch {
    throw new RegistryResolveError('Bearer challenge with an invalid realm');
  }
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && isLoopbackRegistry(url.host))) {
    throw new RegistryResolveError(`token realm scheme ${url.protocol} is not allowed`);
  }
  if (params.service) url.searchParams.set('service', params.service);
  url.searchParams.set('scope', params.scope ?? `repository:${ref.repository}:pull`);
  const headers: Record<string, string> = { accept: 'application/json' };
  if (opts.basicAuth) headers.authorization = basic(opts.basicAuth);
  const res = await send(url, { method: 'GET', headers }, opts);
  if (res.status !== 200) {
    await res.body?.cancel().catch(() => undefined);
    throw new RegistryResolveError(`token request answered ${res.status}`);
  }
  let body: { token?: unknown; access_token?: unknown };
  try {
    body = JSON.parse((await readBounded(res, MAX_TOKEN_BYTES, 'token response')).toString('utf8'));
  } catch (err) {
    if (err instanceof RegistryResolveError) throw err;
    throw new RegistryResolveError('token response is not JSON');
  }
  const token = typeof body.token === 'string' ? body.token : body.access_token;
  if (typeof token !== 'string' || token === '') throw new RegistryResolveError('token response has no token');
  return token;
}

/**
 * Resolves `ref` (`[registry/]repository[:tag]`) to the digest of the manifest (or index) its tag
 * names now.
 *
 * @returns `sha256:<64 hex>`: from `Docker-Content-Digest` of the `HEAD`, or, when a registry
 *   omits that header, the sha256 of the manifest a `GET` returns.
 * @throws RegistryResolveError when the reference is not a tag reference, the registry refuses
 *   (status other than 200 after auth), or a response is malformed; what `checkUrl` throws
 *   (e.g. `UrlPolicyError`).
 */
export async function resolveImageDigest(ref: string, options: ResolveImageOptions = {}): Promise<string> {
  // The GET after a HEAD without a digest reuses the HEAD's authorization.
  const opts = options.session ? options : { ...options, session: {} };
  const parsed = parseImageTagRef(ref);
  if (!parsed) throw new RegistryResolveError('not an image reference by tag');
  const url = registryUrl(parsed, `manifests/${parsed.tag}`);
  const res = await registryRequest(url, parsed, 'HEAD', MANIFEST_ACCEPT, opts);
  if (res.status !== 200) {
    await res.body?.cancel().catch(() => undefined);
    throw new RegistryResolveError(`HEAD manifest ${parsed.repository}:${parsed.tag} answered ${res.status}`);
  }
  await res.body?.cancel().catch(() => undefined);
  const digest = res.headers.get('docker-content-digest')?.trim();
  if (digest && DIGEST.test(digest)) return digest;
  if (digest)
    throw new RegistryResolveError(`unsupported Docker-Content-Digest ${JSON.stringify(digest.slice(0, 80))}`);
  const got = await registryRequest(url, parsed, 'GET', MANIFEST_ACCEPT, opts);
  if (got.status !== 200) {
    await got.body?.cancel().catch(() => undefined);
    throw new RegistryResolveError(`GET manifest ${parsed.repository}:${parsed.tag} answered ${got.status}`);
  }
  const body = await readBounded(got, MAX_MANIFEST_BYTES, 'manifest');
  return `sha256:${createHash('sha256').update(body).digest('hex')}`;
}

/**
 * `<scheme>://<registry>/v2/<repository>/<path>`: plain HTTP for loopback registries only (as
 * go-containerregistry), HTTPS otherwise.
 */
export function registryUrl(ref: Pick<ImageTagRef, 'registry' | 'repository'>, path: string): URL {
  const scheme = isLoopbackRegistry(ref.registry) ? 'http' : 'https';
  return new URL(`${scheme}://${ref.registry}/v2/${ref.repository}/${path}`);
}

/**
 * One distribution API request for `ref`'s repository: with the `Authorization` an earlier
 * request of these `opts` earned (`opts.session`), else anonymous; a `401` is answered by the
 * token flow (`Bearer`) or the credentials (`Basic`) and the request sent again, and the
 * `Authorization` that worked is kept in `opts.session` for the next request (a tag list's
 * pages, then the chosen tag's `HEAD`). The caller reads or cancels the body.
 * @throws RegistryResolveError on a challenge it cannot answer; what `send` throws
 */
export async function registryRequest(
  url: URL,
  ref: ImageTagRef,
  method: 'GET' | 'HEAD',
  accept: string,
  opts: ResolveImageOptions,
): Promise<Response> {
  const request = async (authorization?: string) =>
    await send(url, { method, headers: { accept, ...(authorization ? { authorization } : {}) } }, opts);
  let res = await request(opts.session?.authorization);
  if (res.status !== 401) return res;
  await res.body?.cancel().catch(() => undefined);
  const { scheme: authScheme, params } = parseChallenge(res.headers.get('www-authenticate') ?? '');
  let authorization: string;
  if (authScheme === 'bearer') authorization = `Bearer ${await bearerToken(params, ref, opts)}`;
  else if (authScheme === 'basic' && opts.basicAuth) authorization = basic(opts.basicAuth);
  else throw new RegistryResolveError(`${ref.registry} requires authentication (401)`);
  res = await request(authorization);
  if (opts.session) opts.session.authorization = authorization;
  return res;
}

/**
 * `ref` pinned to `digest`, keeping the tag the user wrote (`registry/repo:tag` →
 * `registry/repo:tag@sha256:…`; `registry/repo` → `registry/repo@sha256:…`; a digest already
 * there is replaced). imgpkg and vendir pull the digest and ignore the tag, and vendir's lock
 * (`status.fetch.stdout`) then keeps `tag:` under the entry as upstream's lock of the tagged
 * reference does; without the tag the pinned fetch's lock dropped it.
 */
export function pinImageRef(ref: string, digest: string): string {
  const at = ref.indexOf('@');
  return `${at >= 0 ? ref.slice(0, at) : ref}@${digest}`;
}
