/**
 * The egress proxy of the tool runs (docs/decisions.md D3): while the URL policy is enforced, the tools
 * that make network requests (vendir and the imgpkg, helm and git it runs, kbld) get
 * `HTTP_PROXY`/`HTTPS_PROXY` pointing at this small forward proxy on `127.0.0.1`, run by the
 * function itself. The up-front check of `./url-policy.ts` sees only the URLs an App writes;
 * the Go tools then resolve the host again (a rebinding DNS answer reaches `127.0.0.1` or
 * `169.254.169.254`) and follow registry redirects (a blob redirected to
 * `http://169.254.169.254/...`) on their own. Through the proxy, each `CONNECT host:port`
 * (https) and each absolute-form request (`GET http://host/...`, plain http) resolves the host
 * once, checks every address with {@link UrlPolicyChecker} (allow-list included) and connects to
 * a checked address, so no second resolution can lead elsewhere. A refused target gets a `403`
 * whose reason phrase and body are the {@link UrlPolicyError} message; the run's error then
 * carries that message ({@link withEgressProxy}). kapp, for an App's kubeconfig Secret, gets
 * the proxy as every cluster's `proxy-url` ({@link ProxiedRunner.url}). An upstream whose client
 * leaves, or that stays silent for {@link EGRESS_IDLE_TIMEOUT_MS}, is dropped. An upstream that
 * makes no progress (fewer bytes than the fleet's floor in a window, `./stall.ts`) is cut as
 * stalled, and a failed run gets a line naming its host and the rule in its stderr (so in
 * `usefulErrorMessage`). kapp-controller has no such proxy (its fetches run in the tenant's own
 * cluster network).
 *
 * `git://` and ssh git sources use no http proxy of their own: they come through this one by
 * the egress connector (`layers/native/connect.c`): `GIT_PROXY_COMMAND` for `git://`, and an
 * `ssh` wrapper ahead of the system's on `PATH` (the embedded runtime; Lambda carries no ssh)
 * that gives ssh the connector as its `ProxyCommand`. Both send `CONNECT host:port` here, so
 * the same single resolution and check applies.
 *
 * Loopback: Go's `http.ProxyFromEnvironment` (the environment variables, not kapp's
 * `proxy-url`) never proxies `localhost` or a loopback IP literal (`127.0.0.0/8`, `::1`),
 * whatever `NO_PROXY` says, so with stock binaries a redirect to `http://127.0.0.1:9001/...` (on
 * Lambda, the Runtime API) went direct. The Go tools listed here are built with a patched
 * `httpproxy` (`patchProxyLoopback` in layers/gobuild.ts) that proxies those too when
 * `KL_PROXY_LOOPBACK=1`, which {@link EgressProxy.env} sets; git (curl) proxies them anyway.
 *
 * Node built-ins only (`node:http`, `node:net`); no proxy library is in the dependencies.
 *
 * @module
 */
import { randomBytes } from 'node:crypto';
import { createServer, type IncomingMessage, type OutgoingHttpHeaders, request, type ServerResponse } from 'node:http';
import { connect as netConnect, type Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { CommandError, type CommandRunner, type RunRequest, type RunResult } from '../exec/runner.js';
import { DEFAULT_STALL_RULE, type StallRule, type StallWatch, stallNote, watchStall } from './stall.js';
import { type UrlPolicyChecker, UrlPolicyError } from './url-policy.js';

/** Opens a TCP connection to a checked address (the port boundary tests replace). */
export type EgressConnect = (address: string, port: number) => Socket;

/** Configuration of {@link startEgressProxy}. */
export interface EgressProxyOptions {
  /** The policy (and resolver) every target is checked with. */
  checker: UrlPolicyChecker;
  /** Default: `net.connect`. */
  connect?: EgressConnect;
  /**
   * Milliseconds without traffic after which an upstream connection (and its CONNECT tunnel)
   * is dropped. Default {@link EGRESS_IDLE_TIMEOUT_MS}.
   */
  idleTimeoutMs?: number;
  /**
   * The progress rule of every upstream connection (`./stall.ts`): one that brings fewer than
   * `minBytes` in a window of `windowMs` is cut as stalled. Default {@link DEFAULT_STALL_RULE}
   * (4 KiB in 60 s; the settings `KAPP_LAMBDA_FETCH_STALL_SECONDS`/`_MIN_BYTES`).
   */
  stall?: StallRule;
  /**
   * Most connections (client tunnels plus upstreams) open at once; a request beyond it gets a
   * `503`. Default {@link EGRESS_MAX_CONNECTIONS}.
   */
  maxConnections?: number;
  /**
   * Absolute path of the egress connector (`layers/native/connect.c`), given to git runs as
   * `GIT_PROXY_COMMAND`, so a `git://` source is fetched through `CONNECT` at this proxy too.
   * Without it git's own protocol connects directly (after the up-front check only).
   */
  connector?: string;
}

/**
 * Default idle timeout of the proxy's upstream connections and tunnels (60 s): on Lambda the
 * proxy lives as long as the warm instance, so a server that accepts and never answers must
 * not hold a descriptor past the tool run that opened it.
 */
export const EGRESS_IDLE_TIMEOUT_MS = 60_000;

/** Default cap of open proxy connections (well below Lambda's 1024 descriptors). */
export const EGRESS_MAX_CONNECTIONS = 256;

/** A running proxy. */
export interface EgressProxy {
  /** `http://127.0.0.1:<port>`. */
  readonly url: string;
  /**
   * The proxy environment of one tool run: `HTTP_PROXY`, `HTTPS_PROXY` and their lowercase forms
   * (curl, hence git, reads only `http_proxy` for http), each naming `token` as the proxy user so
   * that refusals are attributed to the run ({@link track}); `NO_PROXY`/`no_proxy` empty, so an
   * inherited value cannot exempt a host; `KL_PROXY_LOOPBACK=1`, so the Go tools built with
   * kapp-lambda's httpproxy patch proxy loopback targets too (see `proxyLoopbackOverlay` in
   * layers/gobuild.ts). Go sends the user with every request; git (curl with
   * `anyauth`) sends it only when challenged, which the proxy never does, so a refused git
   * request is not attributed (git's own error, `403`, is what the run reports). With a
   * {@link EgressProxyOptions.connector}, also `GIT_PROXY_COMMAND` (git://) and
   * `KL_EGRESS_PROXY` (this proxy, for the connector and its `ssh` wrapper; the connector sends
   * the token with its `CONNECT`, so its refusals are attributed).
   */
  env(token: string): Record<string, string>;
  /** Starts recording the refusals of requests that present `token` (see {@link env}). */
  track(token: string): void;
  /** Stops recording for `token` and returns its refusals (the {@link UrlPolicyError} messages). */
  untrack(token: string): string[];
  /**
   * The stall notes ({@link stallNote}) of `token`'s connections so far, one per host; read it
   * before {@link untrack}. A connection that presents no token (git's, see {@link env}) counts
   * for the one tracked token when exactly one is tracked (the fetch function runs one record
   * at a time); with several it is still watched and cut, but noted for none.
   */
  stalls(token: string): string[];
  /** Stops listening and drops every open connection. Idempotent. */
  close(): Promise<void>;
}

/** Headers that belong to one hop and are not forwarded. */
const HOP_BY_HOP = new Set([
  'connection',
  'keep-alive',
  'proxy-authenticate',
  'proxy-authorization',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
]);

/** What may travel in a status line's reason phrase (no CR/LF, printable ASCII). */
function phrase(text: string): string {
  return text.replace(/[^\x20-\x7e]/g, '?').slice(0, 1024);
}

/** The proxy user of a request (the run token), from `Proxy-Authorization: Basic`. */
function tokenOf(req: IncomingMessage): string | undefined {
  const m = /^Basic\s+(\S+)$/i.exec(req.headers['proxy-authorization'] ?? '');
  if (!m?.[1]) return undefined;
  return Buffer.from(m[1], 'base64').toString('utf8').split(':')[0];
}

function withoutHopByHop(headers: IncomingMessage['headers']): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  const listed = new Set(
    String(headers.connection ?? '')
      .split(',')
      .map((s) => s.trim().toLowerCase()),
  );
  for (const [k, v] of Object.entries(headers)) {
    if (v !== undefined && !HOP_BY_HOP.has(k) && !listed.has(k)) out[k] = v;
  }
  return out;
}

/**
 * Starts the proxy on `127.0.0.1` at a random port. Its server does not keep the process alive.
 *
 * @param opts - policy checker and connector
 * @returns the running proxy
 * @throws the listen error
 */
export async function startEgressProxy(opts: EgressProxyOptions): Promise<EgressProxy> {
  const connectTo = opts.connect ?? ((address, port) => netConnect({ host: address, port }));
  const tracked = new Map<string, { refused: string[]; stalled: string[] }>();
  const rule = opts.stall ?? DEFAULT_STALL_RULE;
  const open = new Set<Duplex>();
  const idleMs = opts.idleTimeoutMs ?? EGRESS_IDLE_TIMEOUT_MS;
  const maxOpen = opts.maxConnections ?? EGRESS_MAX_CONNECTIONS;

  /**
   * The records of the tool run that made `req` (see {@link EgressProxy.stalls}): by its token;
   * a request with no token (git's connections carry none) counts for the one tracked run when
   * there is exactly one. A request naming a token not tracked (the kubeconfigs' `proxy-url`,
   * {@link ProxiedRunner.url}: kapp's connections to an API server, quiet while it waits) counts
   * for none, so it is never cut as a stalled fetch.
   */
  const recordsOf = (req: IncomingMessage) => {
    const token = tokenOf(req);
    if (token !== undefined) return tracked.get(token);
    return tracked.size === 1 ? [...tracked.values()][0] : undefined;
  };

  /**
   * Counts the upstream `s` as open until it closes and drops it after `idleMs` without traffic.
   * A connection of a tracked tool run (`recordsOf`) is also cut as stalled when it makes no
   * progress ({@link watchStall}, the proxy's rule; the server's bytes count, the client's mark
   * it as waiting; silent for `idleMs` on a request it never answered is a stall too): the note
   * naming `host` goes to the run's records and to `onStall` before the socket is destroyed.
   * Other connections (kapp's, with the proxy as a kubeconfig's `proxy-url`: a wait on the API
   * server is quiet by nature) keep the idle timeout only.
   *
   * @returns the watch to report the client's traffic to, or `undefined` for a connection not watched
   */
  const hold = (s: Socket, req: IncomingMessage, host: string, onStall?: (note: string) => void) => {
    open.add(s);
    s.once('close', () => open.delete(s));
    const records = recordsOf(req);
    // A connection with no token while several runs are tracked is one of theirs (only git's carry
    // none; kapp's name UNTRACKED_PROXY_USER): watched still, so a tarpit cannot escape the rule
    // by a second fetch running beside it, but its note goes to no run (it may be another
    // tenant's).
    const unattributed = !records && tokenOf(req) === undefined && tracked.size > 1;
    if (!records && !unattributed) {
      s.setTimeout(idleMs, () => s.destroy());
      return undefined;
    }
    const cut = () => {
      watch.stop();
      const note = stallNote(host, rule);
      if (records && records.stalled.length < 16 && !records.stalled.includes(note)) records.stalled.push(note);
      onStall?.(note);
      s.destroy();
    };
    const watch: StallWatch = watchStall(rule, cut, { spareIdle: true });
    s.on('data', (chunk: Buffer) => watch.received(chunk.length));
    s.once('close', () => watch.stop());
    s.setTimeout(idleMs, () => (watch.waiting ? cut() : s.destroy()));
    return watch;
  };

  /**
   * Resolves once, checks, and connects to the first checked address that answers. The refusal
   * names `scheme://host:port` (absolute-form) or `host:port` (CONNECT), never a path or query
   * (a redirect's query may carry a signed token).
   */
  const dial = async (host: string, port: number, scheme?: string): Promise<Socket> => {
    const authority = host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
    const addresses = await opts.checker.checkedAddresses({
      source: scheme ? `${scheme}://${authority}` : authority,
      scheme: 'https',
      host,
      port: String(port),
    });
    let last: unknown;
    for (const address of addresses) {
      try {
        return await new Promise<Socket>((resolve, reject) => {
          const s = connectTo(address, port);
          s.once('connect', () => {
            s.off('error', reject);
            resolve(s);
          });
          s.once('error', reject);
        });
      } catch (err) {
        last = err;
      }
    }
    throw last;
  };

  const refused = (req: IncomingMessage, err: UrlPolicyError): string => {
    const list = tracked.get(tokenOf(req) ?? '')?.refused;
    if (list && list.length < 16) list.push(err.message);
    return err.message;
  };

  const onRequest = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    let url: URL;
    try {
      url = new URL(req.url ?? '');
      if (url.protocol !== 'http:') throw new Error('not http');
    } catch {
      res.writeHead(400, { 'content-type': 'text/plain' }).end('egress proxy: expected an absolute http URL\n');
      return;
    }
    if (open.size >= maxOpen) {
      res.writeHead(503, { 'content-type': 'text/plain' }).end('egress proxy: too many open connections\n');
      return;
    }
    const port = Number(url.port || 80);
    // A tool that goes away (killed at its timeout) drops the upstream connection too, also
    // when it leaves while the dial is still resolving or connecting.
    let gone = false;
    res.once('close', () => {
      gone = true;
    });
    let upstream: Socket;
    try {
      upstream = await dial(url.hostname.replace(/^\[|\]$/g, ''), port, 'http');
    } catch (err) {
      if (err instanceof UrlPolicyError) {
        const message = refused(req, err);
        res.writeHead(403, phrase(message), { 'content-type': 'text/plain' }).end(`${message}\n`);
      } else {
        res.writeHead(502, { 'content-type': 'text/plain' }).end(`egress proxy: ${(err as Error).message}\n`);
      }
      return;
    }
    if (gone || res.closed || req.socket.destroyed) {
      upstream.destroy();
      return;
    }
    let cutNote: string | undefined;
    const watch = hold(upstream, req, url.host, (note) => {
      cutNote = note;
    });
    watch?.sent();
    req.on('data', () => watch?.sent());
    res.once('close', () => upstream.destroy());
    const out = request({
      method: req.method ?? 'GET',
      path: `${url.pathname}${url.search}`,
      headers: { ...withoutHopByHop(req.headers), host: url.host },
      createConnection: () => upstream,
    });
    out.on('response', (r) => {
      res.writeHead(r.statusCode ?? 502, r.statusMessage, withoutHopByHop(r.headers));
      // An upstream cut mid-body (stalled, idle) cuts the client's answer too, so the tool sees
      // a short read at once instead of waiting on a body that never ends.
      r.once('close', () => {
        if (!r.complete) res.destroy();
      });
      r.on('error', () => res.destroy());
      r.pipe(res);
    });
    out.on('error', (e) => {
      const why = cutNote ?? e.message;
      if (!res.headersSent)
        res.writeHead(502, phrase(why), { 'content-type': 'text/plain' }).end(`egress proxy: ${why}\n`);
      else res.destroy();
    });
    req.pipe(out);
  };

  const onConnect = async (req: IncomingMessage, client: Duplex, head: Buffer): Promise<void> => {
    open.add(client);
    client.once('close', () => open.delete(client));
    client.on('error', () => client.destroy());
    let gone = false;
    client.once('close', () => {
      gone = true;
    });
    const m = /^\[?([^\]]+?)\]?:(\d{1,5})$/.exec(req.url ?? '');
    const answer = (status: string, body: string) =>
      client.end(
        `HTTP/1.1 ${status}\r\ncontent-type: text/plain\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body}`,
      );
    if (!m?.[1]) {
      answer('400 Bad Request', 'egress proxy: expected CONNECT host:port\n');
      return;
    }
    if (open.size > maxOpen) {
      answer('503 Service Unavailable', 'egress proxy: too many open connections\n');
      return;
    }
    let upstream: Socket;
    try {
      upstream = await dial(m[1], Number(m[2]));
    } catch (err) {
      if (err instanceof UrlPolicyError) answer(`403 ${phrase(refused(req, err))}`, `${err.message}\n`);
      else answer('502 Bad Gateway', `egress proxy: ${(err as Error).message}\n`);
      return;
    }
    if (gone || client.destroyed) {
      upstream.destroy();
      return;
    }
    const port = Number(m[2]);
    const host = m[1].includes(':') ? `[${m[1]}]` : m[1];
    const watch = hold(upstream, req, port === 443 ? host : `${host}:${port}`);
    client.on('data', () => watch?.sent());
    if (head.length > 0) watch?.sent();
    upstream.on('error', () => client.destroy());
    client.on('close', () => upstream.destroy());
    upstream.on('close', () => client.destroy());
    client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
    if (head.length > 0) upstream.write(head);
    upstream.pipe(client);
    client.pipe(upstream);
  };

  const server = createServer((req, res) => void onRequest(req, res));
  server.on('connect', (req, socket, head) => void onConnect(req, socket, head));
  server.on('clientError', (_err, socket) => socket.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.unref();
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  const url = `http://127.0.0.1:${port}`;
  let closed: Promise<void> | undefined;
  return {
    url,
    env(token) {
      // A password too: git asks for the proxy password of a URL that names only a user (and
      // fails without a terminal); the proxy itself requires no credentials.
      const proxy = `http://${token}:x@127.0.0.1:${port}`;
      return {
        HTTP_PROXY: proxy,
        HTTPS_PROXY: proxy,
        http_proxy: proxy,
        https_proxy: proxy,
        NO_PROXY: '',
        no_proxy: '',
        // Our Go tools are built with a patched httpproxy (layers/gobuild.ts) that, with this
        // set, proxies `localhost` and loopback literals too, which Go otherwise always sends
        // direct (a redirect to http://127.0.0.1:9001/ would reach the Lambda Runtime API).
        KL_PROXY_LOOPBACK: '1',
        ...(opts.connector ? { GIT_PROXY_COMMAND: opts.connector, KL_EGRESS_PROXY: proxy } : {}),
      };
    },
    track(token) {
      tracked.set(token, { refused: [], stalled: [] });
    },
    untrack(token) {
      const list = tracked.get(token)?.refused ?? [];
      tracked.delete(token);
      return list;
    },
    stalls(token) {
      return [...(tracked.get(token)?.stalled ?? [])];
    },
    close() {
      closed ??= new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
        for (const s of open) s.destroy();
      });
      return closed;
    },
  };
}

/**
 * Tools whose runs go through the proxy: those that fetch (vendir, and the imgpkg, helm and git
 * it starts, which inherit its environment) and kbld, which resolves image tags at registries.
 * ytt and age make no requests; sops could (a remote master key), but the template step refuses
 * such files and gives it an unreachable proxy (`../template/sops.ts`); cue would (a module's `deps`) but runs with no module
 * registry (`CUE_REGISTRY=none`, `../template/cue.ts`); kustomize could (remote bases), but the
 * template step refuses remote references before it runs and gives it no `git` and an
 * unreachable proxy (`../template/kustomize.ts`). kapp is not listed: the ServiceAccount path talks to
 * the cluster's own API server, which the proxy must not judge; an App's kubeconfig Secret gets
 * the proxy as every cluster's `proxy-url` instead (`../pipeline/app/kubeconfig-policy.ts`).
 */
export const PROXIED_TOOLS: readonly string[] = ['vendir', 'imgpkg', 'helm', 'kbld', 'git'];

/** The run failed and the egress proxy refused a request of it; `message` is the policy's. */
export class EgressRefusedError extends CommandError {
  /**
   * @param cmd - the tool
   * @param exitCode - its exit code (or -1)
   * @param message - the first refusal ({@link UrlPolicyError} message)
   * @param cause - the run's own error
   */
  constructor(cmd: string, exitCode: number, message: string, cause: unknown) {
    super(message, cmd, exitCode, { cause });
    this.name = 'EgressRefusedError';
  }
}

/**
 * A {@link CommandRunner} whose network tools use an egress proxy; `url` starts the proxy (if
 * not yet) and returns its address (`http://127.0.0.1:<port>`, for a kubeconfig's `proxy-url`);
 * `close` stops the proxy.
 */
/**
 * The proxy user of {@link ProxiedRunner.url} (the kubeconfigs' `proxy-url`): never a tracked
 * run's token (those are 24 hex digits), so the stall rule leaves kapp's connections alone.
 */
export const UNTRACKED_PROXY_USER = 'kubeconfig';

export type ProxiedRunner = CommandRunner & { url(): Promise<string>; close(): Promise<void> };

/**
 * Wraps `runner` so that each run of a {@link PROXIED_TOOLS} tool gets the proxy environment
 * (the proxy is started at the first such run and shared by every later one; one runner per
 * process, so one proxy per process). When such a run fails and the proxy refused one of its
 * requests, its error becomes an {@link EgressRefusedError} with the policy's message (e.g.
 * `URL policy refused metadata.example:80: metadata.example resolves to 169.254.169.254, a
 * link-local address ...`), so status names the refusal rather than the tool's generic exit;
 * the tool's own output (stderr) is kept. When such a run fails and the proxy cut one of its
 * connections as stalled (`./stall.ts`), its stderr (so `usefulErrorMessage`) gains a line per
 * host, `kapp-lambda: fetch from <host> made no progress (under <n> bytes in <s> s); cut by the
 * fleet's stall limit (KAPP_LAMBDA_FETCH_STALL_SECONDS)`, as the deploy's note of a cut wait
 * (`fleetWaitCutNote`): the tool's own words are only `unexpected EOF` or a reset. The variables
 * are set last, over the request's `env`.
 *
 * @param runner - the runner to wrap
 * @param opts - the proxy's options (policy checker, connector)
 * @returns the wrapped runner
 */
export function withEgressProxy(runner: CommandRunner, opts: EgressProxyOptions): ProxiedRunner {
  let started: Promise<EgressProxy> | undefined;
  return {
    async run(req: RunRequest): Promise<RunResult> {
      if (!PROXIED_TOOLS.includes(req.cmd)) return await runner.run(req);
      started ??= startEgressProxy(opts);
      const proxy = await started;
      const token = randomBytes(12).toString('hex');
      proxy.track(token);
      let result: RunResult;
      try {
        result = await runner.run({ ...req, env: { ...req.env, ...proxy.env(token) } });
      } catch (err) {
        proxy.untrack(token);
        throw err;
      }
      const stalls = proxy.stalls(token);
      const first = proxy.untrack(token)[0];
      if (result.error && first !== undefined) {
        result.error = new EgressRefusedError(req.cmd, result.exitCode, first, result.error);
      }
      if (result.error && stalls.length > 0) {
        const notes = stalls.map((n) => `kapp-lambda: ${n}\n`).join('');
        result.stderr = `${result.stderr.replace(/\n?$/, '\n')}${notes}`;
      }
      return result;
    },
    async url() {
      started ??= startEgressProxy(opts);
      // A user no run is tracked by: kapp's connections are never taken for a fetch's.
      const u = new URL((await started).url);
      u.username = UNTRACKED_PROXY_USER;
      u.password = 'x';
      return u.toString().replace(/\/$/, '');
    },
    async close() {
      const p = started;
      started = undefined;
      if (p) await (await p).close();
    },
  };
}
