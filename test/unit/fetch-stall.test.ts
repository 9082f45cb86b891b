/**
 * The fetch's progress rule (`functions/lib/fetch/stall.ts`): the window logic on a fake clock,
 * then the egress proxy (`egress-proxy.ts`) and the in-process http download
 * (`http-download.ts`) against a real tarpit on 127.0.0.1 that sends a byte every 200 ms (never
 * idle, far below the floor), with the window shortened to 1 s: the connection is cut, the
 * proxy records the note for the run (host only), a failed run's stderr carries it, and a fast
 * answer through the same rule still arrives whole.
 */
import { once } from 'node:events';
import { createServer, request, type Server } from 'node:http';
import { connect, type Socket } from 'node:net';
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from 'vitest';
import { exitWith, FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import {
  type EgressProxy,
  startEgressProxy,
  UNTRACKED_PROXY_USER,
  withEgressProxy,
} from '../../functions/lib/fetch/egress-proxy.js';
import { createHttpDownloader, HttpDownloadError } from '../../functions/lib/fetch/http-download.js';
import { type StallRule, stallNote, watchStall } from '../../functions/lib/fetch/stall.js';
import { UrlPolicyChecker } from '../../functions/lib/fetch/url-policy.js';

const RULE: StallRule = { windowMs: 1000, minBytes: 4096 };
const FAST_BYTES = 64 * 1024;

describe('watchStall: the window rule', () => {
  afterEach(() => {
    vi.useRealTimers();
  });

  /** Runs three windows of {@link RULE}, calling `during(w, i)` in the second half of window i. */
  function run(opts: { spareIdle?: boolean }, during: (w: ReturnType<typeof watchStall>, i: number) => void) {
    vi.useFakeTimers();
    const onStall = vi.fn();
    const w = watchStall(RULE, onStall, opts);
    for (let i = 0; i < 3; i++) {
      vi.advanceTimersByTime(RULE.windowMs * 0.6);
      during(w, i);
      vi.advanceTimersByTime(RULE.windowMs * 0.4);
    }
    w.stop();
    return onStall;
  }

  it('cuts a connection that trickles under the floor, once', () => {
    const onStall = run({}, (w) => w.received(10));
    expect(onStall).toHaveBeenCalledTimes(1);
  });

  it('keeps a connection that brings the floor in every window', () => {
    expect(run({}, (w) => w.received(RULE.minBytes)).mock.calls).toEqual([]);
  });

  it('without spareIdle, judges a silent window too (a download waited on)', () => {
    expect(run({}, () => {})).toHaveBeenCalledTimes(1);
  });

  it('spareIdle: spares a kept-alive connection at rest and a request just sent', () => {
    vi.useFakeTimers();
    const onStall = vi.fn();
    const w = watchStall(RULE, onStall, { spareIdle: true });
    // A small answer early in the window, then rest: spared.
    w.sent();
    w.received(100);
    vi.advanceTimersByTime(RULE.windowMs);
    // A request sent just before the window ends: spared (the next window judges it).
    vi.advanceTimersByTime(RULE.windowMs * 0.9);
    w.sent();
    vi.advanceTimersByTime(RULE.windowMs * 0.1);
    expect(onStall).not.toHaveBeenCalled();
    expect(w.waiting).toBe(true);
    // Still unanswered a window later: cut.
    vi.advanceTimersByTime(RULE.windowMs);
    expect(onStall).toHaveBeenCalledTimes(1);
    w.stop();
  });

  it('spareIdle: a trickle (a byte in the second half of each window) is cut', () => {
    expect(run({ spareIdle: true }, (w) => w.received(1))).toHaveBeenCalledTimes(1);
  });
});

/** Sends a byte every 200 ms after its head, forever (until the client goes). */
let tarpit: Server;
/** Answers {@link FAST_BYTES} at once. */
let fast: Server;
let tarpitPort: number;
let fastPort: number;
const trickles = new Set<NodeJS.Timeout>();

beforeAll(async () => {
  tarpit = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'application/octet-stream' });
    res.flushHeaders();
    const t = setInterval(() => res.write('x'), 200);
    trickles.add(t);
    res.once('close', () => {
      clearInterval(t);
      trickles.delete(t);
    });
  });
  fast = createServer((_req, res) => {
    res.writeHead(200, { 'content-length': FAST_BYTES }).end(Buffer.alloc(FAST_BYTES, 'a'));
  });
  for (const s of [tarpit, fast]) {
    s.listen(0, '127.0.0.1');
    await once(s, 'listening');
  }
  tarpitPort = (tarpit.address() as { port: number }).port;
  fastPort = (fast.address() as { port: number }).port;
});
afterAll(async () => {
  for (const t of trickles) clearInterval(t);
  for (const s of [tarpit, fast]) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
});

/** Every name is public to the policy; every dial reaches 127.0.0.1 on the port asked. */
const checker = new UrlPolicyChecker({ mode: 'enforce', allow: [] }, async () => ['93.184.216.34']);
const proxyOpts = {
  checker,
  stall: RULE,
  connect: (_address: string, port: number) => connect({ host: '127.0.0.1', port }),
};

/** `CONNECT target` (with the token as proxy user), then a GET inside the tunnel; resolves with what came back once the tunnel closes. */
async function getThroughTunnel(proxyUrl: string, target: string, token?: string): Promise<string> {
  const { port } = new URL(proxyUrl);
  const s: Socket = connect({ host: '127.0.0.1', port: Number(port) });
  await once(s, 'connect');
  const auth = token ? `proxy-authorization: Basic ${Buffer.from(`${token}:x`).toString('base64')}\r\n` : '';
  s.write(`CONNECT ${target} HTTP/1.1\r\nhost: ${target}\r\n${auth}\r\n`);
  let raw = '';
  s.on('data', (c: Buffer) => {
    raw += c.toString('latin1');
    if (raw.startsWith('HTTP/1.1 200') && raw.endsWith('\r\n\r\n') && !raw.includes('GET')) {
      raw += 'GET / ';
      s.write(`GET / HTTP/1.1\r\nhost: ${target}\r\nconnection: close\r\n\r\n`);
    }
  });
  await once(s, 'close');
  return raw;
}

describe('egress proxy: the stall cut', () => {
  let proxy: EgressProxy | undefined;
  afterEach(async () => {
    await proxy?.close();
    proxy = undefined;
  });

  it('cuts a CONNECT tunnel to a tarpit and records the note, host only, for the run', async () => {
    proxy = await startEgressProxy(proxyOpts);
    proxy.track('run1');
    const got = await getThroughTunnel(proxy.url, `tarpit.example:${tarpitPort}`, 'run1');
    expect(got).toContain('HTTP/1.1 200 OK');
    expect(proxy.stalls('run1')).toEqual([stallNote(`tarpit.example:${tarpitPort}`, RULE)]);
    expect(proxy.stalls('run1')[0]).toBe(
      `fetch from tarpit.example:${tarpitPort} made no progress (under 4096 bytes in 1 s); cut by the fleet's stall limit (KAPP_LAMBDA_FETCH_STALL_SECONDS)`,
    );
  }, 10_000);

  it("leaves kapp's connection (the proxy-url user) to the idle timeout, even beside one tracked run", async () => {
    proxy = await startEgressProxy(proxyOpts);
    // One fetch runs meanwhile: a connection with no token would count for it.
    proxy.track('fetch-run');
    const { port } = new URL(proxy.url);
    const s = connect({ host: '127.0.0.1', port: Number(port) });
    await once(s, 'connect');
    const auth = Buffer.from(`${UNTRACKED_PROXY_USER}:x`).toString('base64');
    s.write(
      `CONNECT tarpit.example:${tarpitPort} HTTP/1.1\r\nhost: tarpit.example\r\nproxy-authorization: Basic ${auth}\r\n\r\n`,
    );
    await once(s, 'data');
    s.write(`GET / HTTP/1.1\r\nhost: tarpit.example\r\n\r\n`);
    let got = 0;
    s.on('data', (c: Buffer) => {
      got += c.length;
    });
    // Three windows of the trickle: a watched connection would have been cut after the first.
    await new Promise((r) => setTimeout(r, RULE.windowMs * 3));
    expect(s.destroyed).toBe(false);
    expect(got).toBeGreaterThan(0);
    expect(proxy.stalls('fetch-run')).toEqual([]);
    s.destroy();
  }, 10_000);

  it('lets a fast answer through whole, with no note', async () => {
    proxy = await startEgressProxy(proxyOpts);
    proxy.track('run1');
    const got = await getThroughTunnel(proxy.url, `fast.example:${fastPort}`, 'run1');
    expect(got.length).toBeGreaterThan(FAST_BYTES);
    expect(proxy.stalls('run1')).toEqual([]);
  }, 10_000);

  it('cuts a plain http request to a tarpit; a connection without a token counts for the one tracked run', async () => {
    proxy = await startEgressProxy(proxyOpts);
    proxy.track('git-run');
    const { port } = new URL(proxy.url);
    const target = `http://user:secret@tarpit.example:${tarpitPort}/repo.git/info/refs?sig=abc`;
    const req = request({ host: '127.0.0.1', port: Number(port), method: 'GET', path: target });
    req.end();
    const [res] = (await once(req, 'response')) as [import('node:http').IncomingMessage];
    res.on('error', () => {}); // `aborted`: the cut reaches the client as a short read
    res.resume();
    await new Promise((r) => res.once('close', r));
    expect(res.complete).toBe(false);
    const notes = proxy.stalls('git-run');
    expect(notes).toEqual([stallNote(`tarpit.example:${tarpitPort}`, RULE)]);
    expect(notes[0]).not.toMatch(/secret|sig=|user@/);
  }, 10_000);

  it('cuts a connection without a token to a tarpit while two runs are tracked too, noting it for neither', async () => {
    proxy = await startEgressProxy(proxyOpts);
    // Two fetches at once (the embedded runtime, or KAPP_LAMBDA_RECORD_CONCURRENCY > 1): git's
    // connection cannot be told apart, yet it is a fetch's, so the rule still holds.
    proxy.track('run-a');
    proxy.track('run-b');
    const { port } = new URL(proxy.url);
    const req = request({
      host: '127.0.0.1',
      port: Number(port),
      method: 'GET',
      path: `http://tarpit.example:${tarpitPort}/repo.git/info/refs`,
    });
    req.end();
    const [res] = (await once(req, 'response')) as [import('node:http').IncomingMessage];
    res.on('error', () => {});
    res.resume();
    await new Promise((r) => res.once('close', r));
    expect(res.complete).toBe(false);
    // Not attributed: another tenant's run must not carry this host in its status.
    expect(proxy.stalls('run-a')).toEqual([]);
    expect(proxy.stalls('run-b')).toEqual([]);
  }, 10_000);

  it("adds the note to a failed run's stderr (usefulErrorMessage), not to a run that succeeded", async () => {
    const fake = new FakeCommandRunner();
    fake.on('vendir', async (req) => {
      const proxyUrl = new URL(req.env?.HTTPS_PROXY ?? '');
      await getThroughTunnel(`http://${proxyUrl.host}`, `tarpit.example:${tarpitPort}`, proxyUrl.username);
      return exitWith(1, 'vendir: Error: Syncing directory: unexpected EOF\n');
    });
    fake.on('imgpkg', async (req) => {
      const proxyUrl = new URL(req.env?.HTTPS_PROXY ?? '');
      await getThroughTunnel(`http://${proxyUrl.host}`, `fast.example:${fastPort}`, proxyUrl.username);
      return exitWith(0);
    });
    const runner = withEgressProxy(fake, proxyOpts);
    try {
      const stalled = await runner.run({ cmd: 'vendir', args: ['sync'] });
      expect(stalled.error?.message).toBe('exit status 1');
      expect(stalled.stderr).toBe(
        `vendir: Error: Syncing directory: unexpected EOF\nkapp-lambda: ${stallNote(`tarpit.example:${tarpitPort}`, RULE)}\n`,
      );
      const ok = await runner.run({ cmd: 'imgpkg', args: ['pull'] });
      expect(ok.error).toBeUndefined();
      expect(ok.stderr).not.toContain('kapp-lambda:');
    } finally {
      await runner.close();
    }
  }, 10_000);
});

describe('http download: the stall cut', () => {
  it('cuts a download from a tarpit with the note naming its host only', async () => {
    const download = createHttpDownloader().download({
      url: `http://user:secret@127.0.0.1:${tarpitPort}/app.tgz?X-Amz-Signature=abc`,
      stall: RULE,
    });
    const err = await download.catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HttpDownloadError);
    expect((err as Error).message).toBe(stallNote(`127.0.0.1:${tarpitPort}`, RULE));
  }, 10_000);

  it('a fast download under the same rule completes', async () => {
    const got = await createHttpDownloader().download({ url: `http://127.0.0.1:${fastPort}/app.tgz`, stall: RULE });
    expect(got.body.length).toBe(FAST_BYTES);
  }, 10_000);
});
