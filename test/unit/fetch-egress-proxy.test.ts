/**
 * The tools' egress proxy (`functions/lib/fetch/egress-proxy.ts`) with fakes at its port
 * boundaries: a scripted resolver (one that rebinds: a public address first, loopback after)
 * and a connector that records the address the proxy dials and reaches a local server instead.
 * Clients speak to the real proxy as Go and curl do: `CONNECT host:port` (https) and
 * absolute-form requests (plain http).
 */
import { once } from 'node:events';
import { createServer, type IncomingHttpHeaders, request, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { exitWith, FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import {
  type EgressProxy,
  EgressRefusedError,
  startEgressProxy,
  UNTRACKED_PROXY_USER,
  withEgressProxy,
} from '../../functions/lib/fetch/egress-proxy.js';
import { type UrlPolicy, UrlPolicyChecker } from '../../functions/lib/fetch/url-policy.js';

/** Fixed answers; `rebind.example` answers public once, then loopback. */
function makeResolver() {
  const asked: string[] = [];
  const fixed: Record<string, string[]> = {
    'registry.example': ['93.184.216.34'],
    'metadata.example': ['169.254.169.254'],
    'corp-registry.internal': ['10.20.3.4'],
    'split.example': ['93.184.216.34', '127.0.0.1'],
  };
  const resolve = async (host: string): Promise<string[]> => {
    asked.push(host);
    if (host === 'rebind.example')
      return asked.filter((h) => h === host).length === 1 ? ['93.184.216.34'] : ['127.0.0.1'];
    const a = fixed[host];
    if (!a) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
    return a;
  };
  return { asked, resolve };
}

/** The local server every dial reaches: echoes the request it got as JSON. */
let origin: Server;
let originPort: number;
const seen: Array<{ method?: string; url?: string; headers: IncomingHttpHeaders; body: string }> = [];

beforeAll(async () => {
  origin = createServer((req, res) => {
    let body = '';
    req.on('data', (c) => {
      body += c;
    });
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, headers: req.headers, body });
      res.writeHead(200, 'OK', { 'content-type': 'application/json', 'x-origin': 'yes' });
      res.end(JSON.stringify({ url: req.url, host: req.headers.host }));
    });
  });
  origin.listen(0, '127.0.0.1');
  await once(origin, 'listening');
  originPort = (origin.address() as { port: number }).port;
});
afterAll(async () => {
  origin.closeAllConnections();
  await new Promise((r) => origin.close(r));
});

let proxy: EgressProxy | undefined;
afterEach(async () => {
  await proxy?.close();
  proxy = undefined;
  seen.length = 0;
});

async function start(policy: UrlPolicy = { mode: 'enforce', allow: [] }) {
  const dns = makeResolver();
  const dialed: string[] = [];
  proxy = await startEgressProxy({
    checker: new UrlPolicyChecker(policy, dns.resolve),
    connect: (address, port) => {
      dialed.push(`${address}:${port}`);
      return connect({ host: '127.0.0.1', port: originPort });
    },
  });
  return { dns, dialed, proxy };
}

/** Sends `CONNECT target` and returns the status line, the raw head and the socket. */
async function connectThrough(p: EgressProxy, target: string, token?: string) {
  const { port } = new URL(p.url);
  const s = connect({ host: '127.0.0.1', port: Number(port) });
  await once(s, 'connect');
  const auth = token ? `proxy-authorization: Basic ${Buffer.from(`${token}:`).toString('base64')}\r\n` : '';
  s.write(`CONNECT ${target} HTTP/1.1\r\nhost: ${target}\r\n${auth}\r\n`);
  let raw = '';
  while (!raw.includes('\r\n\r\n')) {
    const [chunk] = (await once(s, 'data')) as [Buffer];
    raw += chunk.toString('latin1');
  }
  const [head = '', rest = ''] = raw.split('\r\n\r\n');
  return { status: head.split('\r\n')[0] ?? '', head, rest, socket: s };
}

/** Reads the rest of a socket until it closes. */
async function readAll(s: Socket, already = ''): Promise<string> {
  let out = already;
  s.on('data', (c: Buffer) => {
    out += c.toString('utf8');
  });
  await once(s, 'close');
  return out;
}

/** An absolute-form request through the proxy (as Go sends plain http to a proxy). */
async function viaProxy(p: EgressProxy, url: string, headers: Record<string, string> = {}) {
  const { port } = new URL(p.url);
  const req = request({ host: '127.0.0.1', port: Number(port), method: 'GET', path: url, headers });
  req.end();
  const [res] = (await once(req, 'response')) as [import('node:http').IncomingMessage];
  let body = '';
  for await (const c of res) body += c;
  return { status: res.statusCode, message: res.statusMessage, headers: res.headers, body };
}

describe('egress proxy: CONNECT (https)', () => {
  it('resolves a rebinding name once and connects to the address it checked', async () => {
    const { dns, dialed, proxy: p } = await start();
    const { status, socket } = await connectThrough(p, 'rebind.example:443');
    expect(status).toBe('HTTP/1.1 200 Connection Established');
    // The tunnel reaches the origin (the fake connector's target): a request travels through it.
    socket.write('GET /v2/ HTTP/1.1\r\nhost: rebind.example\r\nconnection: close\r\n\r\n');
    expect(await readAll(socket)).toContain('"url":"/v2/"');
    expect(dns.asked).toEqual(['rebind.example']);
    expect(dialed).toEqual(['93.184.216.34:443']);
    // The tool's own second lookup would answer loopback now; the proxy never asks again.
    expect(await dns.resolve('rebind.example')).toEqual(['127.0.0.1']);
  });

  it('refuses a link-local target with a 403 whose reason phrase and body name the policy', async () => {
    const { dialed, proxy: p } = await start();
    const { status, rest, socket } = await connectThrough(p, 'metadata.example:80');
    const message =
      'URL policy refused metadata.example:80: metadata.example resolves to 169.254.169.254, a link-local address (instance and container credential endpoints), which this deployment does not allow';
    // Go's transport reports a failed CONNECT by the status text after the code.
    expect(status).toBe(`HTTP/1.1 403 ${message}`);
    expect(await readAll(socket, rest)).toBe(`${message}\n`);
    expect(dialed).toEqual([]);
  });

  it.each([
    ['169.254.169.254:80', '169.254.169.254, a link-local address'],
    ['10.1.2.3:5000', '10.1.2.3, a private address'],
    ['[::1]:9001', '::1, a loopback address'],
    ['split.example:443', 'split.example resolves to 127.0.0.1, a loopback address'],
    ['nowhere.example:443', 'host nowhere.example does not resolve (ENOTFOUND)'],
  ])('refuses %s (%s) without dialing', async (target, reason) => {
    const { dialed, proxy: p } = await start();
    const { status, socket } = await connectThrough(p, target);
    socket.destroy();
    expect(status).toMatch(/^HTTP\/1\.1 403 URL policy refused /);
    expect(status).toContain(reason);
    expect(dialed).toEqual([]);
  });

  it('lets an allow-listed host:port through (to its resolved address), not the same host on another port', async () => {
    const { dialed, proxy: p } = await start({ mode: 'enforce', allow: ['corp-registry.internal:5000'] });
    const ok = await connectThrough(p, 'corp-registry.internal:5000');
    ok.socket.destroy();
    expect(ok.status).toBe('HTTP/1.1 200 Connection Established');
    const other = await connectThrough(p, 'corp-registry.internal:6000');
    other.socket.destroy();
    expect(other.status).toContain(
      '403 URL policy refused corp-registry.internal:6000: corp-registry.internal resolves to 10.20.3.4, a private address',
    );
    expect(dialed).toEqual(['10.20.3.4:5000']);
  });

  it('answers 400 to a CONNECT without a port', async () => {
    const { dialed, proxy: p } = await start();
    const { status, socket } = await connectThrough(p, 'registry.example');
    socket.destroy();
    expect(status).toBe('HTTP/1.1 400 Bad Request');
    expect(dialed).toEqual([]);
  });
});

describe('egress proxy: absolute-form (http)', () => {
  it('forwards to the checked address with the Host header kept and no proxy credentials', async () => {
    const { dns, dialed, proxy: p } = await start();
    const res = await viaProxy(p, 'http://rebind.example:8080/v2/repo/blobs/sha256:ab?x=1', {
      'proxy-authorization': `Basic ${Buffer.from('run-token:').toString('base64')}`,
      'proxy-connection': 'keep-alive',
      accept: 'application/json',
    });
    expect(res.status).toBe(200);
    expect(res.headers['x-origin']).toBe('yes');
    expect(JSON.parse(res.body)).toEqual({ url: '/v2/repo/blobs/sha256:ab?x=1', host: 'rebind.example:8080' });
    expect(dns.asked).toEqual(['rebind.example']);
    expect(dialed).toEqual(['93.184.216.34:8080']);
    expect(seen[0]?.headers.accept).toBe('application/json');
    expect(seen[0]?.headers['proxy-authorization']).toBeUndefined();
    expect(seen[0]?.headers['proxy-connection']).toBeUndefined();
  });

  it('refuses a private target with a 403 naming scheme, host, port and reason (never the path)', async () => {
    const { dialed, proxy: p } = await start();
    const res = await viaProxy(p, 'http://metadata.example/latest/meta-data/?token=secret');
    const message =
      'URL policy refused http://metadata.example:80: metadata.example resolves to 169.254.169.254, a link-local address (instance and container credential endpoints), which this deployment does not allow';
    expect(res.status).toBe(403);
    expect(res.message).toBe(message);
    expect(res.body).toBe(`${message}\n`);
    expect(dialed).toEqual([]);
  });

  it('answers 400 to an origin-form request (the proxy is no web server)', async () => {
    const { dialed, proxy: p } = await start();
    const res = await viaProxy(p, '/v2/');
    expect(res.status).toBe(400);
    expect(dialed).toEqual([]);
  });
});

describe('egress proxy: refusals per run', () => {
  it('records the refusals of a tracked token only, until untracked', async () => {
    const { proxy: p } = await start();
    p.track('run-a');
    (await connectThrough(p, '169.254.169.254:443', 'run-a')).socket.destroy();
    (await connectThrough(p, '10.0.0.1:443', 'run-b')).socket.destroy();
    await viaProxy(p, 'http://10.0.0.2/', {
      'proxy-authorization': `Basic ${Buffer.from('run-a:').toString('base64')}`,
    });
    expect(p.untrack('run-a')).toEqual([
      'URL policy refused 169.254.169.254:443: 169.254.169.254, a link-local address (instance and container credential endpoints), which this deployment does not allow',
      'URL policy refused http://10.0.0.2:80: 10.0.0.2, a private address, which this deployment does not allow',
    ]);
    expect(p.untrack('run-a')).toEqual([]);
    expect(p.untrack('run-b')).toEqual([]);
  });
});

describe('withEgressProxy', () => {
  const policy = new UrlPolicyChecker({ mode: 'enforce', allow: [] }, makeResolver().resolve);

  it('gives network tools the proxy environment (empty NO_PROXY), and others none', async () => {
    const fake = new FakeCommandRunner({ fallback: {} });
    const runner = withEgressProxy(fake, { checker: policy });
    try {
      for (const cmd of ['vendir', 'imgpkg', 'helm', 'kbld', 'git', 'ytt', 'kapp', 'cue', 'sops'])
        await runner.run({ cmd, args: [], env: { NO_PROXY: '*', KEEP: '1' } });
      const proxied = fake.calls.filter((c) => c.env?.HTTPS_PROXY).map((c) => c.cmd);
      expect(proxied).toEqual(['vendir', 'imgpkg', 'helm', 'kbld', 'git']);
      const env = fake.calls[0]?.env ?? {};
      expect(env.HTTPS_PROXY).toMatch(/^http:\/\/[0-9a-f]{24}:x@127\.0\.0\.1:\d+$/);
      expect(env).toMatchObject({
        HTTP_PROXY: env.HTTPS_PROXY,
        http_proxy: env.HTTPS_PROXY,
        https_proxy: env.HTTPS_PROXY,
        NO_PROXY: '',
        no_proxy: '',
        // the Go tools' patched httpproxy then proxies loopback targets too
        KL_PROXY_LOOPBACK: '1',
        KEEP: '1',
      });
      // One proxy for the process, a fresh token per run.
      const urls = fake.calls.slice(0, 5).map((c) => c.env?.HTTPS_PROXY ?? '');
      expect(new Set(urls.map((u) => u.replace(/\/\/[0-9a-f]+:x@/, '//'))).size).toBe(1);
      expect(new Set(urls).size).toBe(5);
      expect(fake.calls.find((c) => c.cmd === 'kapp')?.env).toEqual({ NO_PROXY: '*', KEEP: '1' });
    } finally {
      await runner.close();
    }
  });

  it('url() names the one proxy the tool runs use (the proxy-url kapp gets for a kubeconfig Secret)', async () => {
    const fake = new FakeCommandRunner({ fallback: {} });
    const runner = withEgressProxy(fake, { checker: policy });
    try {
      const url = await runner.url();
      // A user no run is tracked by, so the stall rule leaves kapp's connections alone.
      expect(url).toMatch(new RegExp(`^http://${UNTRACKED_PROXY_USER}:x@127\\.0\\.0\\.1:\\d+$`));
      await runner.run({ cmd: 'vendir', args: [] });
      expect(fake.calls[0]?.env?.HTTPS_PROXY?.replace(/\/\/[0-9a-f]+:x@/, '//')).toBe(url.replace(/\/\/[^@]+@/, '//'));
      expect(await runner.url()).toBe(url);
    } finally {
      await runner.close();
    }
  });

  it("turns a failed run's error into the policy's message when the proxy refused one of its requests", async () => {
    const fake = new FakeCommandRunner();
    // The "tool": a CONNECT to the instance metadata endpoint through the proxy it was given.
    fake.on('vendir', async (req) => {
      const url = new URL(req.env?.HTTPS_PROXY ?? '');
      const p = { url: `http://${url.host}` } as EgressProxy;
      (await connectThrough(p, '169.254.169.254:80', url.username)).socket.destroy();
      return exitWith(1, 'vendir: Error: Syncing directory: ... 169.254.169.254:80: URL policy refused ...');
    });
    fake.on('helm', async () => exitWith(1, 'Error: chart not found'));
    const runner = withEgressProxy(fake, { checker: policy });
    try {
      const refused = await runner.run({ cmd: 'vendir', args: ['sync'] });
      expect(refused.error).toBeInstanceOf(EgressRefusedError);
      expect(refused.error?.message).toBe(
        'URL policy refused 169.254.169.254:80: 169.254.169.254, a link-local address (instance and container credential endpoints), which this deployment does not allow',
      );
      expect(refused.exitCode).toBe(1);
      expect(refused.stderr).toContain('vendir: Error: Syncing directory');
      // A failure the proxy had no part in keeps its own error.
      const other = await runner.run({ cmd: 'helm', args: ['pull'] });
      expect(other.error?.message).toBe('exit status 1');
    } finally {
      await runner.close();
    }
  });
});
