/**
 * Regression (s19 attack): a client that goes away while the proxy is still resolving/dialing
 * must not leave the upstream connection open (on Lambda the proxy lives as long as the warm
 * instance that serves every tenant), and a silent upstream is dropped after the idle timeout.
 * Hostile setup: slow DNS of the attacker's domain, a server that accepts and never answers.
 */
import { once } from 'node:events';
import { connect, createServer, type Socket as NetSocket, type Server } from 'node:net';
import { afterAll, beforeAll, beforeEach, expect, it, vi } from 'vitest';
import { startEgressProxy } from '../../functions/lib/fetch/egress-proxy.js';
import { UrlPolicyChecker } from '../../functions/lib/fetch/url-policy.js';

let silent: Server;
let silentPort: number;
const held = new Set<NetSocket>();
let accepted = 0;
beforeAll(async () => {
  silent = createServer((s) => {
    accepted++;
    held.add(s);
    s.on('close', () => held.delete(s));
    s.on('error', () => s.destroy());
    s.resume(); // reads what it is sent (so it sees the proxy's FIN) but never answers
  });
  silent.listen(0, '127.0.0.1');
  await once(silent, 'listening');
  silentPort = (silent.address() as { port: number }).port;
});
beforeEach(() => {
  accepted = 0;
});
afterAll(async () => {
  for (const s of held) s.destroy();
  await new Promise((r) => silent.close(r));
});

/** A proxy whose resolver answers only once `release` is called (the slow attacker DNS). */
async function proxyWithSlowDns(idleTimeoutMs?: number) {
  let release = () => {};
  const answered = new Promise<void>((r) => {
    release = r;
  });
  let asked = () => {};
  const resolving = new Promise<void>((r) => {
    asked = r;
  });
  const proxy = await startEgressProxy({
    checker: new UrlPolicyChecker({ mode: 'enforce', allow: [] }, async () => {
      asked();
      await answered;
      return ['93.184.216.34'];
    }),
    connect: () => connect({ host: '127.0.0.1', port: silentPort }),
    ...(idleTimeoutMs !== undefined ? { idleTimeoutMs } : {}),
  });
  return { proxy, release, resolving };
}

it.each([
  ['GET http://slow.example/x HTTP/1.1\r\nHost: slow.example\r\n\r\n'],
  ['CONNECT slow.example:443 HTTP/1.1\r\nHost: slow.example:443\r\n\r\n'],
] as const)('a client that left during the dial leaves no upstream connection open: %s', async (wire) => {
  const { proxy, release, resolving } = await proxyWithSlowDns();
  try {
    const c = connect({ host: '127.0.0.1', port: Number(new URL(proxy.url).port) });
    await once(c, 'connect');
    c.write(wire);
    await resolving;
    c.destroy(); // the tool gives up (its timeout) before the proxy has dialed
    await once(c, 'close');
    // The slow DNS answers only after the proxy has seen the client leave (its FIN).
    await new Promise((r) => setTimeout(r, 200));
    release();
    // The dial still completes (the server accepts), and the proxy then drops it.
    await vi.waitFor(() => expect(accepted).toBe(1), { timeout: 5_000 });
    await vi.waitFor(() => expect(held.size).toBe(0), { timeout: 5_000 });
  } finally {
    await proxy.close();
    for (const s of held) s.destroy();
  }
});

it.each([
  ['GET http://slow.example/x HTTP/1.1\r\nHost: slow.example\r\n\r\n'],
  ['CONNECT slow.example:443 HTTP/1.1\r\nHost: slow.example:443\r\n\r\n'],
] as const)('a silent upstream is dropped after the idle timeout: %s', async (wire) => {
  const { proxy, release } = await proxyWithSlowDns(100);
  release();
  try {
    const c = connect({ host: '127.0.0.1', port: Number(new URL(proxy.url).port) });
    c.on('data', () => {});
    await once(c, 'connect');
    c.write(wire);
    await vi.waitFor(() => expect(accepted).toBe(1), { timeout: 5_000 });
    // The client stays; the upstream never answers: the proxy drops it.
    await vi.waitFor(() => expect(held.size).toBe(0), { timeout: 5_000 });
    c.destroy();
  } finally {
    await proxy.close();
    for (const s of held) s.destroy();
  }
});

it('refuses a connection beyond the cap with 503', async () => {
  const { proxy } = await startEgressProxyCapped();
  try {
    const port = Number(new URL(proxy.url).port);
    const first = connect({ host: '127.0.0.1', port });
    first.on('data', () => {});
    await once(first, 'connect');
    first.write('CONNECT open.example:443 HTTP/1.1\r\nHost: open.example:443\r\n\r\n');
    await vi.waitFor(() => expect(accepted).toBe(1), { timeout: 5_000 });
    const second = connect({ host: '127.0.0.1', port });
    let answer = '';
    second.on('data', (d) => {
      answer += d;
    });
    await once(second, 'connect');
    second.write('CONNECT open.example:443 HTTP/1.1\r\nHost: open.example:443\r\n\r\n');
    await once(second, 'close');
    expect(answer).toMatch(/^HTTP\/1\.1 503 /);
    expect(accepted).toBe(1);
    first.destroy();
  } finally {
    await proxy.close();
    for (const s of held) s.destroy();
  }
});

async function startEgressProxyCapped() {
  const proxy = await startEgressProxy({
    checker: new UrlPolicyChecker({ mode: 'enforce', allow: [] }, async () => ['93.184.216.34']),
    connect: () => connect({ host: '127.0.0.1', port: silentPort }),
    maxConnections: 2,
  });
  return { proxy };
}
