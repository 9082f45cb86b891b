/**
 * ATTACK (review of kube/http.ts sendRepeatingDrops in kube/plain.ts): the plain transport's bound
 * covers each attempt's exchange but not the backoff between attempts: sendRepeatingDrops gets no
 * signal there, so a server that drops the connection just before the bound gets the request again
 * after the bound has passed (over a kept-alive socket, the repeat is written before the 0 ms timer
 * fires). An App's server (restTransportForKubeconfig) can so receive a request the client has
 * already given up on.
 */
import http from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { PlainRestTransport } from '../../functions/lib/kube/plain.js';

let server: http.Server | undefined;
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise<void>((r) => (server ? server.close(() => r()) : r()));
});

describe('ATTACK plain transport: no attempt starts after the request bound', () => {
  it('a GET dropped just before its bound is not sent again after it', async () => {
    const BOUND_MS = 400;
    const arrivals: Array<{ path: string; at: number }> = [];
    let t0 = 0;
    server = http.createServer((req, res) => {
      arrivals.push({ path: req.url ?? '', at: Date.now() - t0 });
      if (req.url?.startsWith('/prime')) {
        res.writeHead(200, { 'Content-Type': 'application/json' });
        res.end('{}');
        return;
      }
      // The hostile server: hold the request until just before the bound, then reset: the
      // shortest backoff (50 ms) then ends past the bound, so an unguarded replay always lands late.
      setTimeout(() => (req.socket as Socket).destroy(), BOUND_MS - 30);
    });
    await new Promise<void>((r) => server?.listen(0, '127.0.0.1', () => r()));
    const port = (server.address() as AddressInfo).port;
    const transport = new PlainRestTransport({ server: `http://127.0.0.1:${port}` }, BOUND_MS);
    try {
      // Two kept-alive sockets in the pool (what any earlier reads of the same App leave).
      await Promise.all([
        transport.send({ method: 'GET', path: '/prime/1' }),
        transport.send({ method: 'GET', path: '/prime/2' }),
      ]);
      t0 = Date.now();
      const started = Date.now();
      await expect(transport.send({ method: 'GET', path: '/api/v1/namespaces/x/secrets' })).rejects.toThrow();
      const took = Date.now() - started;
      await new Promise((r) => setTimeout(r, 100));
      // Arrivals are timed from just before send() takes its deadline, so allow what lies
      // between the two clocks; an unguarded replay lands at least 20 ms past the bound.
      const late = arrivals.filter((a) => a.path.startsWith('/api/') && a.at > BOUND_MS + 15);
      expect(
        late,
        `attempts reached the server after the ${BOUND_MS} ms bound (call took ${took} ms): ${JSON.stringify(arrivals)}`,
      ).toEqual([]);
    } finally {
      transport.close();
    }
  });
});
