/**
 * The API server address kapp gets, pinned for one run (docs/decisions.md D4). kapp (client-go) resolves a
 * kubeconfig `server`'s host itself, on every new connection, so a name whose DNS answer
 * changes while kapp runs (or between the runtime's reads and kapp's start) could point kapp's
 * API connections at another address. On the paths where kapp talks to the cluster the
 * registry names (an App's ServiceAccount, `kapp-lambda-pkgr` for a PackageRepository)
 * the runtime resolves that host once, here, and gives kapp a kubeconfig whose `server` is the
 * address literal (`https://10.0.0.7:443`, IPv6 bracketed) with `tls-server-name` set to the
 * original host, so TLS still verifies the certificate against the name (client-go sends it as
 * SNI and checks the certificate against it, `rest.TLSClientConfig.ServerName`).
 *
 * The URL policy (`../fetch/url-policy.ts`) does not apply to these addresses: the server is
 * the operator's (the cluster registry document's `endpoint` or the operator's kubeconfig),
 * never a tenant's, and is usually private (an in-VPC EKS endpoint, a `10.x` or loopback API
 * server), which the policy denies by design. What pinning adds is that the address kapp uses
 * is the one the runtime resolved, whatever the DNS answers later. An App's kubeconfig Secret
 * (a tenant's server) is not pinned here: it goes through the egress proxy, which checks and
 * pins each connection (`../pipeline/app/kubeconfig-policy.ts`).
 *
 * @module
 */
import { lookup } from 'node:dns/promises';
import { connect, isIP } from 'node:net';

/** Resolves a host name to its addresses, in the resolver's order (default: the system's, every address). */
export type HostResolver = (host: string) => Promise<string[]>;

/** Whether a TCP connection to `address:port` opens (the choice among several addresses). */
export type AddressProbe = (address: string, port: number) => Promise<boolean>;

/** How long {@link tcpProbe} waits for one address to accept, ms: 2000. */
export const PROBE_TIMEOUT_MS = 2000;

/** A server URL with its host replaced by an address. */
export interface PinnedServer {
  /** `https://<address>:<port>[<path>]` (the port always written; IPv6 bracketed), or the input unchanged. */
  server: string;
  /** The name TLS verifies: the kubeconfig's own `tls-server-name` when set, else the original host; `undefined` for `http://`. */
  tlsServerName?: string;
}

/** Options of {@link pinServer}. */
export interface PinOptions {
  /** Default: the system resolver (`getaddrinfo`, every address). */
  resolve?: HostResolver;
  /** Default {@link tcpProbe}. */
  probe?: AddressProbe;
}

const systemResolver: HostResolver = async (host) => (await lookup(host, { all: true })).map((a) => a.address);

/**
 * Opens (and closes) a TCP connection to `address:port`, giving up after {@link PROBE_TIMEOUT_MS}.
 *
 * @returns `true` when it connected; `false` on an error or the timeout
 */
export const tcpProbe: AddressProbe = (address, port) =>
  new Promise((resolve) => {
    const socket = connect({ host: address, port });
    const done = (ok: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve(ok);
    };
    const timer = setTimeout(() => done(false), PROBE_TIMEOUT_MS);
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
  });

/**
 * `server` with its host resolved once to an address literal. Unchanged: a server that is not
 * an `http(s)://` URL (client-go decides what it means), and an IP literal (nothing to
 * resolve). When the name has several addresses, the first (in the resolver's order) that
 * accepts a TCP connection is taken, as Go's dialer tries them in turn (a dual-stack name seen
 * from a network without IPv6 routes, e.g. a Lambda function in a VPC); when none accepts, the
 * first, so kapp reports its own connection error.
 *
 * @param server - a kubeconfig `server` (`https://host:port[/prefix]`)
 * @param tlsServerName - the kubeconfig's own `tls-server-name`, kept when set
 * @throws Error `resolving the API server host <host>: <code>` when the name does not resolve
 *   (an infrastructure failure: the event is retried, as any failed call to the cluster)
 */
export async function pinServer(
  server: string,
  tlsServerName: string | undefined,
  opts: PinOptions = {},
): Promise<PinnedServer> {
  const unchanged = { server, ...(tlsServerName ? { tlsServerName } : {}) };
  if (!/^https?:\/\//i.test(server)) return unchanged;
  let url: URL;
  try {
    url = new URL(server);
  } catch {
    return unchanged;
  }
  const host = url.hostname;
  if (host === '' || host.startsWith('[') || isIP(host)) return unchanged;
  let addresses: string[];
  try {
    addresses = [...new Set(await (opts.resolve ?? systemResolver)(host))];
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    throw new Error(`resolving the API server host ${host}: ${code}`, { cause: err });
  }
  if (addresses.length === 0) throw new Error(`resolving the API server host ${host}: no address`);
  const https = url.protocol === 'https:';
  const port = Number(url.port || (https ? 443 : 80));
  let chosen = addresses[0] as string;
  if (addresses.length > 1) {
    const probe = opts.probe ?? tcpProbe;
    for (const a of addresses) {
      if (await probe(a, port)) {
        chosen = a;
        break;
      }
    }
  }
  const literal = isIP(chosen) === 6 ? `[${chosen}]` : chosen;
  const path = url.pathname === '/' && !server.endsWith('/') ? '' : url.pathname;
  const name = tlsServerName || (https ? host : undefined);
  return {
    server: `${url.protocol}//${literal}:${port}${path}${url.search}`,
    ...(name ? { tlsServerName: name } : {}),
  };
}
