/**
 * The fleet page's Lambda function (`functions/fleet-page/index.ts`) answering Function URL events
 * over a memory store: the page under a CSP whose hashes match the page it serves, the view as
 * JSON, 404 and 405, a store that fails answering 503 with a fixed text (the cause in the log
 * only), and no write to the store whatever is asked. Also `readOnlyStore` and `fleetResponse`'s
 * shared answers.
 */
import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { type FunctionUrlEvent, makeFleetPageHandler, storeFromEnv } from '../../functions/fleet-page/index.js';
import { FLEET_UNAVAILABLE } from '../../functions/lib/fleet/http.js';
import { FLEET_PAGE_HTML } from '../../functions/lib/fleet/page.js';
import type { FleetView } from '../../functions/lib/fleet/view.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { type ObjectStore, StoreError } from '../../functions/lib/store/port.js';
import { readOnlyStore } from '../../functions/lib/store/read-only.js';
import { S3Store } from '../../functions/lib/store/s3.js';
import { FIXTURE, putFleetFixture } from '../harness/fleet-fixture.js';

const get = (rawPath: string, method = 'GET'): FunctionUrlEvent => ({ rawPath, requestContext: { http: { method } } });

/** A store that counts writes (and makes none). */
function countingStore(inner: ObjectStore): ObjectStore & { writes: string[] } {
  const writes: string[] = [];
  const write = (op: string) => (key: string) => {
    writes.push(`${op} ${key}`);
    return Promise.resolve() as never;
  };
  return {
    writes,
    get: (k, o) => inner.get(k, o),
    head: (k) => inner.head(k),
    getVersioned: (k, o) => inner.getVersioned(k, o),
    list: (p, o) => inner.list(p, o),
    put: write('put'),
    putIfAbsent: write('putIfAbsent'),
    putIfMatch: write('putIfMatch'),
    delete: write('delete'),
  };
}

describe('the fleet page function', () => {
  it('answers GET / with the page under a CSP that allows exactly its inline style and script', async () => {
    const handler = makeFleetPageHandler({ store: new MemoryStore(), log: memoryLogger() });
    const r = await handler(get('/'));
    expect(r.statusCode).toBe(200);
    expect(r.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(r.headers['x-content-type-options']).toBe('nosniff');
    expect(r.body).toBe(FLEET_PAGE_HTML);
    // The hashes are of what this answer carries, so the browser runs the page's code and nothing else.
    const csp = r.headers['content-security-policy'] as string;
    const sha = (tag: string) => {
      const inline = new RegExp(`<${tag}>([\\s\\S]*?)</${tag}>`).exec(r.body)?.[1] ?? '';
      return `'sha256-${createHash('sha256').update(inline).digest('base64')}'`;
    };
    expect(csp).toContain(`script-src ${sha('script')};`);
    expect(csp).toContain(`style-src ${sha('style')};`);
    expect(csp).toContain("default-src 'none'");
    expect(csp).toContain("connect-src 'self'");
    expect(r.body.match(/<script/g)).toHaveLength(1);
  });

  it('answers GET /api/fleet with the view of the store as JSON', async () => {
    const store = new MemoryStore();
    await putFleetFixture(store);
    const handler = makeFleetPageHandler({ store, log: memoryLogger() });
    const r = await handler(get('/api/fleet'));
    expect(r.statusCode).toBe(200);
    expect(r.headers['content-type']).toBe('application/json');
    expect(r.headers['cache-control']).toBe('no-store');
    const view = JSON.parse(r.body) as FleetView;
    expect(view.clusters).toEqual([FIXTURE.clusterId]);
    expect(view.installs).toEqual([
      expect.objectContaining({
        clusterId: FIXTURE.clusterId,
        version: '2.0.0',
        healthy: true,
        wave: 'canary',
        lastReconcile: {
          outcome: 'succeeded',
          endedAt: '2026-12-07T09:59:02.500Z',
          durationMs: 2500,
          costUsd: 0.000125,
        },
      }),
    ]);
    expect(view.rollouts).toEqual([
      expect.objectContaining({ policy: 'default', refName: FIXTURE.refName, target: '2.0.0', status: 'running' }),
    ]);
  });

  it('answers 404 for any other path and 405 for another method on its paths', async () => {
    const handler = makeFleetPageHandler({ store: new MemoryStore(), log: memoryLogger() });
    for (const p of ['/metrics', '/api/fleet/', '/index.html', '/api', '/favicon.ico']) {
      const r = await handler(get(p));
      expect(r.statusCode, p).toBe(404);
      expect(r.body).toBe('not found\n');
    }
    for (const m of ['POST', 'PUT', 'DELETE']) {
      const r = await handler(get('/api/fleet', m));
      expect(r.statusCode, m).toBe(405);
      expect(r.headers.allow).toBe('GET');
    }
    // An event without its path and method is a GET of the page (a test invoke from the console).
    expect((await handler({})).statusCode).toBe(200);
  });

  it('answers 503 with a fixed text when the store fails; the cause goes to the log, never to the client', async () => {
    // What S3 says of a refused list: it names the account, the role and the action.
    const denied = 'User: arn:aws:sts::123456789012:assumed-role/page/x is not authorized to perform: s3:ListBucket';
    const failing = new MemoryStore();
    failing.list = () =>
      Promise.reject(
        new StoreError('failed to list objects under "state/fleet/"', 'list', 'state/fleet/', {
          cause: Object.assign(new Error(denied), { name: 'AccessDenied' }),
        }),
      );
    const log = memoryLogger();
    const handler = makeFleetPageHandler({ store: failing, log });
    const r = await handler(get('/api/fleet'));
    expect(r.statusCode).toBe(503);
    expect(r.headers['content-type']).toBe('text/plain; charset=utf-8');
    expect(r.body).toBe(FLEET_UNAVAILABLE);
    // Nothing of the store's error reaches the client: no account, role, bucket, key or stack.
    for (const leak of ['arn:aws', '123456789012', 'state/fleet', 'StoreError'])
      expect(JSON.stringify(r)).not.toContain(leak);
    expect(JSON.stringify(r)).not.toMatch(/\bat .*\.(ts|js):\d+/);
    expect(log.records).toEqual([
      {
        level: 'error',
        obj: {
          error: 'StoreError: failed to list objects under "state/fleet/"',
          cause: `AccessDenied: ${denied}`,
        },
        msg: 'fleet page: cannot read the store',
      },
    ]);
    // No stack in the log either.
    expect(JSON.stringify(log.records)).not.toContain('    at ');
    // The page itself is still served: it shows the failure and polls again.
    expect((await handler(get('/'))).statusCode).toBe(200);
  });

  it('without KAPP_LAMBDA_BUCKET answers 503 and logs why', async () => {
    expect(storeFromEnv({})).toBeUndefined();
    expect(storeFromEnv({ KAPP_LAMBDA_BUCKET: 'b' })).toBeInstanceOf(S3Store);
    const log = memoryLogger();
    const r = await makeFleetPageHandler({ store: undefined, log })(get('/api/fleet'));
    expect(r.statusCode).toBe(503);
    expect(log.records[0]?.obj.error).toBe('Error: KAPP_LAMBDA_BUCKET is not set: no store to read');
  });

  it('never writes to the store', async () => {
    const inner = new MemoryStore();
    await putFleetFixture(inner);
    const store = countingStore(inner);
    const handler = makeFleetPageHandler({ store, log: memoryLogger() });
    for (const [p, m] of [
      ['/', 'GET'],
      ['/api/fleet', 'GET'],
      ['/api/fleet', 'GET'],
      ['/api/fleet', 'POST'],
    ] as const) {
      await handler(get(p, m));
    }
    expect(store.writes).toEqual([]);
  });
});

describe('readOnlyStore', () => {
  it('passes reads through and refuses every write without touching the store', async () => {
    const inner = new MemoryStore();
    await inner.put('a/b', 'x');
    const ro = readOnlyStore(inner);
    expect((await ro.get('a/b'))?.toString()).toBe('x');
    expect(await ro.head('a/b')).toMatchObject({ size: 1 });
    expect((await ro.getVersioned('a/b'))?.body.toString()).toBe('x');
    expect(await ro.list('a/')).toEqual(['a/b']);
    await expect(ro.put('a/b', 'y')).rejects.toThrow('read-only store: put a/b refused');
    await expect(ro.putIfAbsent('a/c', 'y')).rejects.toThrow(StoreError);
    await expect(ro.putIfMatch('a/b', 'y', undefined)).rejects.toThrow('read-only store: putIfMatch a/b refused');
    await expect(ro.delete('a/b')).rejects.toThrow('read-only store: delete a/b refused');
    expect(await inner.list('')).toEqual(['a/b']);
    expect((await inner.get('a/b'))?.toString()).toBe('x');
  });
});
