/**
 * DNS pinning of kapp-lambda's own requests against real servers on loopback: the fetch stage's
 * http sources (`prepareHttpSources` with the real downloader) and the registry digest lookup
 * (`resolveImageDigest`) under an enforced URL policy whose resolver is a stub (the only
 * fake: names under `.kapp-lambda.test` exist nowhere else). The allow-list admits the
 * "public" servers (`127.0.0.1/32`, `::1/128`); a second server on `127.0.0.2`, at the same
 * port, stands for a denied address (the metadata endpoint) and records every request it gets.
 * A rebinding name answers `127.0.0.1` to the policy's check and `127.0.0.2` to the connection:
 * the request must be refused with the policy's message, and reach neither server.
 */
import { once } from 'node:events';
import { mkdtemp, readFile, rm } from 'node:fs/promises';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import { connect, type LookupFunction } from 'node:net';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { Duplex } from 'node:stream';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import { refObjectsFrom } from '../../functions/lib/api/refs.js';
import { trustingFetch } from '../../functions/lib/fetch/cluster-trust.js';
import { createHttpDownloader } from '../../functions/lib/fetch/http-download.js';
import { prepareHttpSources } from '../../functions/lib/fetch/http-source.js';
import { resolveImageDigest } from '../../functions/lib/fetch/registry-digest.js';
import { type UrlPolicy, UrlPolicyChecker, UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';
import { selfSignedCert } from '../harness/fixtures.js';

const DIGEST = `sha256:${'c'.repeat(64)}`;
const TLS_NAME = 'tls.kapp-lambda.test';
const ENFORCE: UrlPolicy = { mode: 'enforce', allow: ['127.0.0.1/32', '::1/128'] };
const LOOPBACK = 'a loopback address, which this deployment does not allow';

type Hit = { server: string; method?: string; url?: string; host?: string };
const hits: Hit[] = [];

/** A server that records each request under `name` and answers by `route`. */
function recording(name: string, route: (req: IncomingMessage, res: ServerResponse) => void) {
  return (req: IncomingMessage, res: ServerResponse) => {
    hits.push({ server: name, method: req.method, url: req.url, host: req.headers.host });
    route(req, res);
  };
}

let port: number;
let tlsPort: number;
const servers: Server[] = [];
let root: string;

const serve = (req: IncomingMessage, res: ServerResponse) => {
  if (req.url === '/redirect') {
    res.writeHead(302, { location: `http://rebind.kapp-lambda.test:${port}/secret` }).end();
  } else if (req.url?.startsWith('/v2/')) {
    res.writeHead(200, { 'docker-content-digest': DIGEST }).end();
  } else {
    res.writeHead(200, { 'content-type': 'text/plain' }).end(`served by ${req.socket.localAddress}\n`);
  }
};

async function listen(s: Server, host: string, at: number): Promise<number> {
  s.listen(at, host);
  await once(s, 'listening');
  servers.push(s);
  return (s.address() as { port: number }).port;
}

let tls: { key: string; cert: string };

beforeAll(async () => {
  root = await mkdtemp(path.join(tmpdir(), 'own-download-pinning-'));
  // The public server, the denied one at the same port on 127.0.0.2, and an IPv6 one on ::1.
  port = await listen(createServer(recording('public', serve)), '127.0.0.1', 0);
  await listen(
    createServer(
      recording('denied', (_req, res) => {
        res.end('the instance credentials\n');
      }),
    ),
    '127.0.0.2',
    port,
  );
  await listen(createServer(recording('public6', serve)), '::1', port);
  tls = await selfSignedCert(root, TLS_NAME);
  tlsPort = await listen(createTlsServer(tls, recording('tls', serve)), '127.0.0.1', 0);
});

afterAll(async () => {
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  await rm(root, { recursive: true, force: true });
});

afterEach(() => {
  hits.length = 0;
});

/** A stub resolver: each name answers its listed answers in turn (the last one repeats). */
function stub(answers: Record<string, string[][]>) {
  const asked: string[] = [];
  const resolve = async (host: string): Promise<string[]> => {
    const list = answers[host];
    if (!list) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
    const n = asked.filter((h) => h === host).length;
    asked.push(host);
    return list[Math.min(n, list.length - 1)] ?? [];
  };
  return { asked, resolve };
}

/** Downloads `url` as the fetch stage does (one http entry) under `checker`. */
async function fetchHttp(url: string, checker: UrlPolicyChecker, trust?: { caCerts?: string }) {
  const dir = await mkdtemp(path.join(root, 'fetch-'));
  const out = await prepareHttpSources({
    fetch: [{ http: { url } }],
    refs: refObjectsFrom({}),
    root: dir,
    urlPolicy: checker,
    timeoutMs: 20_000,
    ...(trust ? { trust } : {}),
  });
  if ('result' in out) return { error: out.result.error };
  const file = path.join(out.dirs.get(0) ?? '', path.basename(new URL(url).pathname));
  return { body: await readFile(file, 'utf8') };
}

describe('http sources under an enforced URL policy, pinned', () => {
  it('connect to the address the policy checked, with the URL host in Host', async () => {
    const dns = stub({ 'files.kapp-lambda.test': [['127.0.0.1']] });
    const got = await fetchHttp(
      `http://files.kapp-lambda.test:${port}/config.yml`,
      new UrlPolicyChecker(ENFORCE, dns.resolve),
    );
    expect(got).toEqual({ body: 'served by 127.0.0.1\n' });
    expect(hits).toEqual([
      { server: 'public', method: 'GET', url: '/config.yml', host: `files.kapp-lambda.test:${port}` },
    ]);
    // One resolution for the check, one for the connection.
    expect(dns.asked).toEqual(['files.kapp-lambda.test', 'files.kapp-lambda.test']);
  });

  it('the denied server is live: a connection resolved without the policy reaches it', async () => {
    // The control for the refusals below: what an unpinned second resolution would reach.
    const system: LookupFunction = (_h, opts, cb) =>
      opts.all ? cb(null, [{ address: '127.0.0.2', family: 4 }]) : cb(null, '127.0.0.2', 4);
    const res = await trustingFetch({ lookupFor: () => system })(`http://rebind.kapp-lambda.test:${port}/secret`);
    expect(await res.text()).toBe('the instance credentials\n');
    expect(hits.map((h) => h.server)).toEqual(['denied']);
  });

  it.each<[string, string]>([
    ['127.0.0.2', `rebind.kapp-lambda.test resolves to 127.0.0.2, ${LOOPBACK}`],
    ['::ffff:127.0.0.2', `rebind.kapp-lambda.test resolves to ::ffff:127.0.0.2, ${LOOPBACK}`],
  ])('a rebinding answer (checked 127.0.0.1, then %s) is refused and reaches no server', async (second, why) => {
    const dns = stub({ 'rebind.kapp-lambda.test': [['127.0.0.1'], [second]] });
    const url = `http://rebind.kapp-lambda.test:${port}/secret`;
    const got = await fetchHttp(url, new UrlPolicyChecker(ENFORCE, dns.resolve));
    expect(got).toEqual({ error: `Fetching resources: URL policy refused ${url}: ${why}` });
    expect(hits).toEqual([]);
  });

  it('a redirect to a rebinding name is refused at its hop', async () => {
    const dns = stub({
      'files.kapp-lambda.test': [['127.0.0.1']],
      'rebind.kapp-lambda.test': [['127.0.0.1'], ['127.0.0.2']],
    });
    const got = await fetchHttp(
      `http://files.kapp-lambda.test:${port}/redirect`,
      new UrlPolicyChecker(ENFORCE, dns.resolve),
    );
    expect(got).toEqual({
      error: `Fetching resources: URL policy refused http://rebind.kapp-lambda.test:${port}/secret: rebind.kapp-lambda.test resolves to 127.0.0.2, ${LOOPBACK}`,
    });
    expect(hits.map((h) => `${h.server} ${h.url}`)).toEqual(['public /redirect']);
  });

  it('IPv6: an allowed ::1 is connected to; an answer mixing it with a denied address is refused', async () => {
    const dns = stub({ 'six.kapp-lambda.test': [['::1']], 'mixed.kapp-lambda.test': [['::1'], ['::1', '127.0.0.2']] });
    const checker = new UrlPolicyChecker(ENFORCE, dns.resolve);
    expect(await fetchHttp(`http://six.kapp-lambda.test:${port}/config.yml`, checker)).toEqual({
      body: 'served by ::1\n',
    });
    const mixed = `http://mixed.kapp-lambda.test:${port}/config.yml`;
    expect(await fetchHttp(mixed, checker)).toEqual({
      error: `Fetching resources: URL policy refused ${mixed}: mixed.kapp-lambda.test resolves to 127.0.0.2, ${LOOPBACK}`,
    });
    expect(hits.map((h) => h.server)).toEqual(['public6']);
  });

  it('https: TLS verifies against the host name while the connection goes to the pinned address', async () => {
    const dns = stub({ [TLS_NAME]: [['127.0.0.1']], 'other.kapp-lambda.test': [['127.0.0.1']] });
    const checker = new UrlPolicyChecker(ENFORCE, dns.resolve);
    expect(await fetchHttp(`https://${TLS_NAME}:${tlsPort}/config.yml`, checker, { caCerts: tls.cert })).toEqual({
      body: 'served by 127.0.0.1\n',
    });
    // Same address, another name: the certificate does not name it, so the handshake fails.
    const dl = createHttpDownloader();
    const other = await dl
      .download({
        url: `https://other.kapp-lambda.test:${tlsPort}/config.yml`,
        caCerts: tls.cert,
        ...checker.requestGuards(),
      })
      .catch((e: unknown) => e as Error);
    expect((other as Error).message).toContain("Hostname/IP does not match certificate's altnames");
    expect(hits.map((h) => h.server)).toEqual(['tls']);
  });

  it('while the policy is off the cluster proxy still carries the download (http and CONNECT)', async () => {
    const proxied: string[] = [];
    const tunnels: Duplex[] = [];
    onTestFinished(() => {
      for (const t of tunnels) t.destroy();
    });
    const proxy = createServer((req, res) => {
      proxied.push(`${req.method} ${req.url}`);
      res.end('from the proxy\n');
    });
    // Every tunnel leads to the TLS server, whatever name it was asked for.
    proxy.on('connect', (req: IncomingMessage, client: Duplex, head: Buffer) => {
      proxied.push(`CONNECT ${req.url}`);
      // The server's sockets are half-open: the tunnel stays until the test ends it.
      tunnels.push(client);
      const upstream = connect(tlsPort, '127.0.0.1', () => {
        client.write('HTTP/1.1 200 Connection Established\r\n\r\n');
        upstream.write(head);
        upstream.pipe(client).pipe(upstream);
      });
      upstream.on('error', () => client.destroy());
      client.on('error', () => upstream.destroy());
    });
    const proxyPort = await listen(proxy, '127.0.0.1', 0);
    const dns = stub({});
    const guards = new UrlPolicyChecker({ mode: 'off', allow: [] }, dns.resolve).requestGuards();
    const via = `http://127.0.0.1:${proxyPort}`;
    const dl = createHttpDownloader();
    const plain = await dl.download({
      url: 'http://far.kapp-lambda.test/config.yml',
      proxy: { httpProxy: via },
      ...guards,
    });
    expect(plain.body.toString()).toBe('from the proxy\n');
    const tunneled = await dl.download({
      url: `https://${TLS_NAME}:${tlsPort}/config.yml`,
      caCerts: tls.cert,
      proxy: { httpsProxy: via },
      ...guards,
    });
    expect(tunneled.body.toString()).toBe('served by 127.0.0.1\n');
    expect(proxied).toEqual(['GET http://far.kapp-lambda.test/config.yml', `CONNECT ${TLS_NAME}:${tlsPort}`]);
    expect(hits.map((h) => `${h.server} ${h.host}`)).toEqual([`tls ${TLS_NAME}:${tlsPort}`]);
    expect(dns.asked).toEqual([]);
  });
});

describe('registry digests under an enforced URL policy, pinned', () => {
  it('resolve at the checked address; a rebinding answer is refused before any request', async () => {
    const ok = stub({ localhost: [['127.0.0.1']] });
    const ref = `localhost:${port}/team/app:v1`;
    expect(await resolveImageDigest(ref, new UrlPolicyChecker(ENFORCE, ok.resolve).requestGuards())).toBe(DIGEST);
    expect(hits).toEqual([
      { server: 'public', method: 'HEAD', url: '/v2/team/app/manifests/v1', host: `localhost:${port}` },
    ]);
    hits.length = 0;

    const rebind = stub({ localhost: [['127.0.0.1'], ['127.0.0.2']] });
    const err = await resolveImageDigest(ref, new UrlPolicyChecker(ENFORCE, rebind.resolve).requestGuards()).catch(
      (e: unknown) => e,
    );
    expect(err).toBeInstanceOf(UrlPolicyError);
    expect((err as Error).message).toBe(
      `URL policy refused http://localhost:${port}/v2/team/app/manifests/v1: localhost resolves to 127.0.0.2, ${LOOPBACK}`,
    );
    expect(hits).toEqual([]);
  });
});
