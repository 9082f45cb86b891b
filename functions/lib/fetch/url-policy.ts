/**
 * The URL policy every fetch obeys in the cloud mode (docs/decisions.md D3): a source whose host resolves
 * to loopback, link-local (169.254.0.0/16: the instance and container credential endpoints),
 * the Lambda Runtime API (loopback), a private, shared (CGNAT), multicast or unspecified
 * address is refused before any tool runs, unless the fleet's allow-list names it. One fetch
 * function serves every cluster of a fleet, so a hostile App must not be able to turn it into
 * a proxy into the function's own network. kapp-controller has no such policy (its fetches
 * run inside the tenant's own cluster network); the embedded default keeps that behaviour
 * unless configured.
 *
 * The check covers the URL of every source kind (http, git with scp-style forms, helm
 * repositories including `oci://`, image and bundle registries). A refused source fails the
 * fetch with {@link UrlPolicyError} and no request is sent. What the tools then request (a
 * second DNS answer, a registry's redirect) is checked again by the egress proxy
 * (`./egress-proxy.ts`), with {@link UrlPolicyChecker.checkedAddresses}; kapp-lambda's own
 * requests (http downloads, registry digests) connect through
 * {@link UrlPolicyChecker.pinnedLookup}, so they too reach only an address checked in the
 * resolution they connect with.
 *
 * @module
 */
import type { LookupAddress } from 'node:dns';
import { lookup } from 'node:dns/promises';
import { BlockList, isIP, type LookupFunction } from 'node:net';
import type { AppFetch } from '../api/fetch.js';
import { SCP_LIKE_GIT_URL } from '../argv-values.js';
import { KappControllerError, outcomeOf } from '../reconcile/result.js';
import { GIT_SAFETY_CONFIG, gitConfigEnv } from './git-env.js';
import { extractImageRegistry } from './vendir.js';

/** Address ranges refused by default, each with the reason given to the user. */
const DENIED_RANGES: ReadonlyArray<readonly [string, number, 'ipv4' | 'ipv6', string]> = [
  ['0.0.0.0', 8, 'ipv4', 'an unspecified address'],
  ['127.0.0.0', 8, 'ipv4', 'a loopback address'],
  ['10.0.0.0', 8, 'ipv4', 'a private address'],
  ['172.16.0.0', 12, 'ipv4', 'a private address'],
  ['192.168.0.0', 16, 'ipv4', 'a private address'],
  ['100.64.0.0', 10, 'ipv4', 'a shared (carrier-grade NAT) address'],
  ['169.254.0.0', 16, 'ipv4', 'a link-local address (instance and container credential endpoints)'],
  ['192.0.0.0', 24, 'ipv4', 'an IETF protocol assignment address'],
  ['198.18.0.0', 15, 'ipv4', 'a benchmarking address'],
  ['224.0.0.0', 4, 'ipv4', 'a multicast address'],
  ['240.0.0.0', 4, 'ipv4', 'a reserved address'],
  ['::', 128, 'ipv6', 'an unspecified address'],
  ['::1', 128, 'ipv6', 'a loopback address'],
  // Forms that embed an IPv4 address (a translator or relay, where one exists, reaches it; the
  // embedded address could be a denied one) or deprecated ranges some networks still route
  // privately. Few public services use them; an operator allows one with a CIDR exception.
  ['::', 96, 'ipv6', 'an IPv4-compatible address (deprecated, embeds an IPv4 address)'],
  ['::ffff:0:0:0', 96, 'ipv6', 'an IPv4-translated address (embeds an IPv4 address)'],
  ['64:ff9b:1::', 48, 'ipv6', 'a local-use NAT64 address (embeds an IPv4 address)'],
  ['100::', 64, 'ipv6', 'a discard-only address'],
  ['2001::', 32, 'ipv6', 'a Teredo address (embeds an IPv4 address)'],
  ['2002::', 16, 'ipv6', 'a 6to4 address (embeds an IPv4 address)'],
  ['fec0::', 10, 'ipv6', 'a site-local address (deprecated)'],
  ['fc00::', 7, 'ipv6', 'a private (unique local) address'],
  ['fe80::', 10, 'ipv6', 'a link-local address'],
  ['ff00::', 8, 'ipv6', 'a multicast address'],
  ['64:ff9b::', 96, 'ipv6', 'a NAT64 address'],
];

/** The policy of one deployment. */
export interface UrlPolicy {
  /** `enforce`: refuse denied addresses; `off`: allow everything (kapp-controller's behaviour). */
  mode: 'enforce' | 'off';
  /**
   * Exceptions, each `host`, `host:port` or a CIDR (`10.20.0.0/16`, `fd00::/8`): a source whose
   * host (or host and port) is listed, or whose every address is in a listed CIDR, is allowed.
   */
  allow: readonly string[];
}

/**
 * Environment for the `git` that vendir runs while the policy is enforced: git config
 * `protocol.<t>.allow=user` for the transports the policy lets a git source name (https, http,
 * ssh, git) and `protocol.allow=never` for every other (through `GIT_CONFIG_COUNT`, so no file
 * is read or written). A bare `protocol.allow=user` would also be the default of `ext` and
 * `file`, which git itself refuses (`never`) or limits: `ext::<command>` as the App's own URL
 * would then run a command in the fetch function, with only the URL policy's parse in the way.
 * git clones
 * submodules with `GIT_PROTOCOL_FROM_USER=0`, so under this setting every submodule transport is
 * refused (`fatal: transport 'http' not allowed`), while the repository the App names (whose URL
 * the policy checked) is fetched as before. Without it, vendir's
 * `git submodule update --init --recursive` would clone whatever URL a repository's
 * `.gitmodules` names (`http://127.0.0.1:9001/...`, the Lambda Runtime API), which the policy
 * never sees. kapp-controller clones submodules; under an enforced policy they are refused.
 * Holds `GIT_SAFETY_CONFIG` (`./git-env.ts`) too: it replaces the `GIT_CONFIG_*` variables of
 * vendir's environment, which carry that setting.
 */
export const GIT_SUBMODULE_LOCKDOWN_ENV: Readonly<Record<string, string>> = gitConfigEnv([
  ...GIT_SAFETY_CONFIG,
  ['protocol.allow', 'never'],
  ...(['https', 'http', 'ssh', 'git'] as const).map((t) => [`protocol.${t}.allow`, 'user'] as const),
]);

/** The default of the cloud mode: enforce, no exceptions. */
export const CLOUD_URL_POLICY: UrlPolicy = Object.freeze({ mode: 'enforce', allow: Object.freeze([]) });

/** A source refused by the policy; `message` names the source, the address and the reason. */
export class UrlPolicyError extends KappControllerError {
  /**
   * @param source - the URL or image reference as written in the spec
   * @param detail - why it was refused
   */
  constructor(
    readonly source: string,
    readonly detail: string,
  ) {
    super(`URL policy refused ${source}: ${detail}`);
    this.name = 'UrlPolicyError';
  }
}

/** Resolves a host name to its addresses (default: the system resolver, every address). */
export type HostResolver = (host: string) => Promise<string[]>;

const systemResolver: HostResolver = async (host) => (await lookup(host, { all: true })).map((a) => a.address);

/** One network endpoint a fetch entry will contact. */
export interface FetchEndpoint {
  /** The URL or reference as the spec wrote it. */
  source: string;
  /** Scheme (`https`, `http`, `ssh`, `git`, `oci`, `registry` for image references). */
  scheme: string;
  /** Host name or IP literal, without brackets. */
  host: string;
  /** Port, when the source names one. */
  port?: string;
}

/** Schemes a fetch may use when the policy is enforced (no `file://`, `ext::` or local paths). */
const ALLOWED_SCHEMES = new Set(['https', 'http', 'ssh', 'git', 'oci', 'registry']);

/**
 * The port a scheme connects to when its URL names none, so an allow-list entry `host:443`
 * matches `https://host/...` and the image `host/app` (the URL parser drops a default port).
 */
const DEFAULT_PORTS: Readonly<Record<string, string>> = {
  https: '443',
  http: '80',
  ssh: '22',
  git: '9418',
  oci: '443',
  registry: '443',
  socks5: '1080',
};

/**
 * The raw authority of `scheme://authority...` as curl (git over http), Go's `net/url` (helm) and
 * ssh read it: everything up to the first `/`, `?` or `#`. The WHATWG parser used here instead
 * also ends a special URL's authority at `\`, so `https://public.example\@127.0.0.1/r` has host
 * `public.example` for us but `127.0.0.1` for git: such URLs are refused rather than judged.
 */
const RAW_AUTHORITY = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/([^/?#]*)/;

function fromUrl(source: string): FetchEndpoint {
  const raw = RAW_AUTHORITY.exec(source)?.[1];
  if (raw?.includes('\\')) {
    throw new UrlPolicyError(
      source,
      'a "\\" before the path is not allowed (URL parsers disagree on which host it names)',
    );
  }
  let u: URL;
  try {
    u = new URL(source);
  } catch {
    throw new UrlPolicyError(source, 'not a URL');
  }
  const scheme = u.protocol.replace(/:$/, '').toLowerCase();
  const host = u.hostname.replace(/^\[|\]$/g, '');
  return { source, scheme, host, ...(u.port ? { port: u.port } : {}) };
}

/** Endpoint of a git URL: a URL with a scheme, or scp-style `[user@]host:path`. */
function gitEndpoint(source: string): FetchEndpoint {
  if (/^[A-Za-z][A-Za-z0-9+.-]*:\/\//.test(source)) return fromUrl(source);
  const local =
    'not a network URL (local paths and git transports other than https, http, ssh and git are not allowed)';
  // `<transport>::<address>` runs a git remote helper (`ext::` runs a command).
  if (/^[A-Za-z][A-Za-z0-9+.-]*::/.test(source)) throw new UrlPolicyError(source, local);
  const scp = SCP_LIKE_GIT_URL.exec(source);
  if (scp?.[1]) return { source, scheme: 'ssh', host: scp[1].replace(/^\[|\]$/g, '') };
  throw new UrlPolicyError(
    source,
    'not a network URL (local paths and git transports other than https, http, ssh and git are not allowed)',
  );
}

/** Endpoint of an image reference: its registry (`index.docker.io` when none is written). */
function registryEndpoint(source: string): FetchEndpoint {
  const registry = extractImageRegistry(source);
  const m = /^(\[[^\]]+\]|[^:]+)(?::(\d+))?$/.exec(registry);
  const host = (m?.[1] ?? registry).replace(/^\[|\]$/g, '');
  return { source, scheme: 'registry', host, ...(m?.[2] ? { port: m[2] } : {}) };
}

/**
 * The endpoints a `spec.fetch` will contact, in order. Inline sources contact none.
 *
 * @param fetch - `spec.fetch` (of an App, or the single fetch of a PackageRepository)
 * @throws {UrlPolicyError} for a git source that is not a network URL
 */
export function fetchEndpoints(fetch: readonly AppFetch[]): FetchEndpoint[] {
  const out: FetchEndpoint[] = [];
  for (const entry of fetch) {
    if (entry.http?.url) out.push(fromUrl(entry.http.url));
    if (entry.git?.url) out.push(gitEndpoint(entry.git.url));
    const repo = entry.helmChart?.repository?.url;
    if (repo) out.push(fromUrl(repo));
    // `helm pull <chart URL>`: a chart name with a scheme is downloaded from that URL directly.
    const chart = entry.helmChart?.name;
    if (chart && /^[A-Za-z][A-Za-z0-9+.-]*:/.test(chart)) out.push(fromUrl(chart));
    if (entry.image?.url) out.push(registryEndpoint(entry.image.url));
    if (entry.imgpkgBundle?.image) out.push(registryEndpoint(entry.imgpkgBundle.image));
  }
  return out;
}

function family(address: string): 'ipv4' | 'ipv6' {
  return isIP(address) === 6 ? 'ipv6' : 'ipv4';
}

/** An IPv4 address written as IPv6 (`::ffff:127.0.0.1`) is judged as IPv4. */
function unmap(address: string): string {
  const m = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(address);
  return m?.[1] ?? address;
}

/** `node:dns`'s lookup `family` option as 0 (any), 4 or 6. */
function familyNumber(f: number | 'IPv4' | 'IPv6' | undefined): 0 | 4 | 6 {
  return f === 4 || f === 'IPv4' ? 4 : f === 6 || f === 'IPv6' ? 6 : 0;
}

/** Compiled form of a {@link UrlPolicy}. */
export class UrlPolicyChecker {
  private readonly denied: Array<{ list: BlockList; reason: string }> = [];
  private readonly allowedCidrs = new BlockList();
  private readonly allowedHosts = new Set<string>();

  /**
   * @param policy - mode and allow-list
   * @param resolve - host resolver (tests pass a fake; default the system resolver)
   * @throws Error for an allow-list entry that is not a host, `host:port` or CIDR
   */
  constructor(
    readonly policy: UrlPolicy,
    private readonly resolve: HostResolver = systemResolver,
  ) {
    for (const [net, prefix, fam, reason] of DENIED_RANGES) {
      const list = new BlockList();
      list.addSubnet(net, prefix, fam);
      this.denied.push({ list, reason });
    }
    for (const raw of policy.allow) {
      const entry = raw.trim().toLowerCase();
      if (entry === '') continue;
      const cidr = /^(.+)\/(\d{1,3})$/.exec(entry);
      if (cidr?.[1] && isIP(cidr[1])) {
        this.allowedCidrs.addSubnet(cidr[1], Number(cidr[2]), family(cidr[1]));
      } else if (/^[a-z0-9.\-[\]:]+$/.test(entry)) {
        this.allowedHosts.add(entry.replace(/^\[|\]$/g, ''));
      } else {
        throw new Error(`URL policy: invalid allow-list entry ${JSON.stringify(raw)}`);
      }
    }
  }

  /** Why `address` is denied, or `undefined` when it is allowed. */
  deniedReason(address: string): string | undefined {
    const a = unmap(address);
    const fam = family(a);
    if (this.allowedCidrs.check(a, fam)) return undefined;
    return this.denied.find((d) => d.list.check(a, fam))?.reason;
  }

  /**
   * Checks one endpoint: its scheme, then every address its host resolves to.
   *
   * @throws {UrlPolicyError} when the policy refuses it
   */
  async check(ep: FetchEndpoint): Promise<void> {
    if (this.policy.mode === 'off') return;
    if (!ALLOWED_SCHEMES.has(ep.scheme)) throw new UrlPolicyError(ep.source, `scheme ${ep.scheme} is not allowed`);
    if (this.allowedByName(ep)) return;
    await this.checkedAddresses(ep);
  }

  /**
   * Resolves the endpoint's host once and checks every address (an allow-listed host or
   * `host:port` is not checked), as {@link check} does, and returns the addresses: a caller that
   * connects to one of them (the egress proxy, `./egress-proxy.ts`) cannot be led elsewhere by a
   * second, rebinding DNS answer. The scheme is not checked (the caller speaks one protocol).
   *
   * @returns the addresses, in the resolver's order (at least one)
   * @throws {UrlPolicyError} when the host does not resolve or the policy refuses an address
   */
  async checkedAddresses(ep: FetchEndpoint): Promise<string[]> {
    const host = ep.host.toLowerCase();
    let addresses: string[];
    if (isIP(host)) addresses = [host];
    else {
      try {
        addresses = await this.resolve(host);
      } catch (err) {
        throw new UrlPolicyError(
          ep.source,
          `host ${host} does not resolve (${(err as NodeJS.ErrnoException).code ?? 'error'})`,
        );
      }
      if (addresses.length === 0) throw new UrlPolicyError(ep.source, `host ${host} does not resolve`);
    }
    if (this.policy.mode === 'off' || this.allowedByName(ep)) return addresses;
    for (const address of addresses) {
      const reason = this.deniedReason(address);
      if (reason) {
        const via = address === host ? host : `${host} resolves to ${address}`;
        throw new UrlPolicyError(ep.source, `${via}, ${reason}, which this deployment does not allow`);
      }
    }
    return addresses;
  }

  /**
   * Whether the allow-list names the endpoint's host, or its host and port (the scheme's default
   * port when the URL names none, so `registry.corp:443` matches `https://registry.corp`).
   */
  private allowedByName(ep: FetchEndpoint): boolean {
    const host = ep.host.toLowerCase();
    const port = ep.port || DEFAULT_PORTS[ep.scheme];
    return this.allowedHosts.has(host) || (port !== undefined && this.allowedHosts.has(`${host}:${port}`));
  }

  /**
   * Checks one http(s) URL: each hop of a download (redirects included) goes through here.
   *
   * @throws {UrlPolicyError} when the policy refuses it
   */
  async checkUrl(url: string): Promise<void> {
    if (this.policy.mode === 'off') return;
    await this.check(fromUrl(url));
  }

  /**
   * The DNS lookup (`node:net`'s `lookup` option, which `node:http` and `node:https` pass on) of
   * a connection to `url`'s host while the policy is enforced: it resolves the host once, checks
   * every address as {@link checkedAddresses} does (allow-list included) and hands the socket
   * only those checked addresses, so a DNS answer that changes after {@link checkUrl} (rebinding
   * to `169.254.169.254` or loopback) is refused rather than connected to. Node connects to an IP
   * literal without a lookup; {@link checkUrl} judges those (they cannot change). TLS still
   * verifies against the host name (the request's `servername`), not the address.
   *
   * @param url - the absolute URL the connection serves (its port and scheme pick the allow-list
   *   `host:port` entries; the refusal names it as {@link checkUrl} does)
   * @returns `undefined` when the policy is off (the system lookup applies, as upstream)
   * @throws {UrlPolicyError} when `url` is not a URL; the lookup itself passes the
   *   {@link UrlPolicyError} of a refused or unresolvable host to its callback, so the request
   *   fails with it and never connects
   */
  pinnedLookup(url: string): LookupFunction | undefined {
    if (this.policy.mode === 'off') return undefined;
    const ep = fromUrl(url);
    return (hostname, options, callback) => {
      const host = hostname.replace(/^\[|\]$/g, '');
      const wanted = familyNumber(options.family);
      this.checkedAddresses({ ...ep, host }).then(
        (addresses) => {
          const list: LookupAddress[] = addresses
            .map((address) => ({ address, family: isIP(address) }))
            .filter((a) => wanted === 0 || a.family === wanted);
          const first = list[0];
          if (!first) {
            // What Node's own lookup reports when the family asked for has no address.
            const err = Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), {
              code: 'ENOTFOUND',
              hostname: host,
            });
            callback(err, '', 0);
          } else if (options.all) callback(null, list);
          else callback(null, first.address, first.family);
        },
        (err: NodeJS.ErrnoException) => callback(err, '', 0),
      );
    };
  }

  /**
   * The two guards kapp-lambda's own requests take (the options `checkUrl` and `lookupFor` of
   * the http downloader, `./http-download.ts`, and of the registry digest lookup,
   * `./registry-digest.ts`): {@link checkUrl} before each URL (the first and every redirect
   * target) and {@link pinnedLookup} for its connection.
   */
  requestGuards(): { checkUrl: (url: string) => Promise<void>; lookupFor: (url: URL) => LookupFunction | undefined } {
    return { checkUrl: (url) => this.checkUrl(url), lookupFor: (url) => this.pinnedLookup(url.href) };
  }

  /**
   * Checks a URL that a tool other than the fetchers will contact (kapp's API server and proxy,
   * from an App's kubeconfig Secret), with its own schemes and its own name in the message: the
   * refusal names `label` and the URL's scheme, host and port only (never its user info, path or
   * query, which may hold credentials), or `label` alone when it is not a URL.
   *
   * @param url - the absolute URL
   * @param label - what the message calls it (e.g. `kubeconfig clusters[0].cluster.server`)
   * @param schemes - the schemes it may use (lower case)
   * @throws {UrlPolicyError} when the policy refuses it
   */
  async checkUrlAs(url: string, label: string, schemes: readonly string[]): Promise<void> {
    if (this.policy.mode === 'off') return;
    let ep: FetchEndpoint;
    try {
      ep = fromUrl(url);
    } catch (err) {
      if (!(err instanceof UrlPolicyError)) throw err;
      throw new UrlPolicyError(label, err.detail);
    }
    const shownHost = isIP(ep.host) === 6 ? `[${ep.host}]` : ep.host;
    const source = `${label} ${ep.scheme}://${shownHost}${ep.port ? `:${ep.port}` : ''}`;
    if (!schemes.includes(ep.scheme)) throw new UrlPolicyError(source, `scheme ${ep.scheme} is not allowed`);
    const named = { ...ep, source };
    if (this.allowedByName(named)) return;
    await this.checkedAddresses(named);
  }

  /**
   * Checks every endpoint of a `spec.fetch`, in order.
   *
   * @throws {UrlPolicyError} for the first refused source
   */
  async checkFetch(fetch: readonly AppFetch[]): Promise<void> {
    if (this.policy.mode === 'off') return;
    for (const ep of fetchEndpoints(fetch)) await this.check(ep);
  }
}

/**
 * Parses the policy settings (`KAPP_LAMBDA_URL_POLICY`, `KAPP_LAMBDA_URL_ALLOW`).
 *
 * @param mode - `enforce`, `off`, or empty for `dflt`
 * @param allow - comma-separated allow-list entries
 * @param dflt - the runtime's default mode (cloud: `enforce`; embedded: `off`)
 * @throws Error for an unknown mode
 */
export function parseUrlPolicy(
  mode: string | undefined,
  allow: string | undefined,
  dflt: UrlPolicy['mode'],
): UrlPolicy {
  const m = (mode ?? '').trim() || dflt;
  if (m !== 'enforce' && m !== 'off') throw new Error(`expected enforce or off, got ${JSON.stringify(mode)}`);
  const list = (allow ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter(Boolean);
  return { mode: m, allow: list };
}

/**
 * Whether every source of `fetch` passes this runtime's URL policy (`true` without a policy).
 * A cached artifact (pinned fetch record, repository index) is served only when it does: the
 * cache is shared by the fleet, and a cluster with a stricter policy must not reuse content
 * another cluster was allowed to fetch. A refused source then runs the real fetch, which fails
 * with the policy's message. Here, not in `./run.ts`: the deploy function's delete path reaches
 * it (`pipeline/source-poll.ts`) and must not load the fetch stage's tarball code.
 *
 * @throws what the policy check throws for reasons other than a refusal (infrastructure)
 */
export async function fetchPassesUrlPolicy(
  fetch: readonly AppFetch[],
  deps: { config: { urlPolicy?: UrlPolicy } },
): Promise<boolean> {
  if (!deps.config.urlPolicy) return true;
  try {
    await new UrlPolicyChecker(deps.config.urlPolicy).checkFetch(fetch);
    return true;
  } catch (err) {
    if (outcomeOf(err) !== 'user') throw err;
    return false;
  }
}
