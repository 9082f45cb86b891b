/**
 * `npm run fleet -- serve` (`scripts/fleet-serve.ts`) over a memory store: what counts as
 * loopback, the warning for another address, the read-only store it serves, and the command
 * line's usage errors. Against a real S3 server: `test/integration/fleet-serve.test.ts`.
 */
import { describe, expect, it } from 'vitest';
import type { FleetView } from '../../functions/lib/fleet/view.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import type { ListOptions } from '../../functions/lib/store/port.js';
import { main as fleetMain } from '../../scripts/fleet.js';
import { isLoopbackHost, serveFleet } from '../../scripts/fleet-serve.js';
import { FIXTURE, putFleetFixture } from '../harness/fleet-fixture.js';

describe('fleet serve', () => {
  it('takes 127.0.0.0/8, ::1 and localhost as loopback, nothing else', () => {
    for (const h of ['127.0.0.1', '127.1.2.3', '::1', 'localhost']) expect(isLoopbackHost(h), h).toBe(true);
    for (const h of ['0.0.0.0', '::', '10.0.0.1', '127.example.com', 'example.com']) {
      expect(isLoopbackHost(h), h).toBe(false);
    }
  });

  it('serves the view of the store, and warns only when it listens beyond loopback', async () => {
    const store = new MemoryStore();
    await putFleetFixture(store);
    for (const [listen, warned] of [
      ['127.0.0.1:0', false],
      ['0.0.0.0:0', true],
    ] as const) {
      const out: string[] = [];
      const err: string[] = [];
      const server = await serveFleet(store, {
        location: 's3://fleet/p/',
        listen,
        out: (t) => out.push(t),
        err: (t) => err.push(t),
      });
      try {
        expect(out.join('')).toBe(
          `fleet page of s3://fleet/p/: open http://${listen.split(':')[0]}:${server.address.port}/ (Ctrl-C stops)\n`,
        );
        expect(err.some((l) => l.startsWith('fleet: warning: listening on 0.0.0.0:0, not loopback'))).toBe(warned);
        const view = (await (await fetch(`http://127.0.0.1:${server.address.port}/api/fleet`)).json()) as FleetView;
        expect(view.clusters).toEqual([FIXTURE.clusterId]);
      } finally {
        await server.close();
      }
    }
  });

  it('says the store fails once and reads again once, a slow failing read included (requests during a build share it: test/unit/fleet-view.test.ts)', async () => {
    // A store whose listings fail while `broken`, and wait for `gate` while one is set (calling
    // `atGate` when one gets there).
    class FlakyStore extends MemoryStore {
      broken = false;
      gate: Promise<void> | undefined;
      atGate = () => {};
      override async list(prefix: string, opts?: ListOptions): Promise<string[]> {
        const broken = this.broken;
        if (this.gate) {
          this.atGate();
          await this.gate;
        }
        if (broken) throw new Error('NoSuchBucket');
        return super.list(prefix, opts);
      }
    }
    const store = new FlakyStore();
    await putFleetFixture(store);
    const err: string[] = [];
    const server = await serveFleet(store, {
      location: 's3://fleet/p/',
      listen: '127.0.0.1:0',
      out: () => {},
      err: (t) => err.push(t),
    });
    const get = () => fetch(`http://127.0.0.1:${server.address.port}/api/fleet`).then((r) => r.status);
    try {
      store.broken = true;
      expect(await get()).toBe(503);
      // A slow read starts while the store is broken and settles only after the store is back.
      let release = () => {};
      store.gate = new Promise<void>((r) => {
        release = r;
      });
      const atGate = new Promise<void>((r) => {
        store.atGate = r;
      });
      const slow = get();
      // Its listing has read the store broken and waits (not a sleep: a loaded machine may take
      // longer than any fixed one to get the request there, and the read would then succeed).
      await atGate;
      store.broken = false;
      store.gate = undefined;
      release();
      expect(await slow).toBe(503);
      expect(await get()).toBe(200);
      expect(await get()).toBe(200);
      expect(err).toEqual([
        expect.stringMatching(/^fleet: cannot read the store s3:\/\/fleet\/p\/: .*NoSuchBucket/),
        'fleet: the store s3://fleet/p/ reads again\n',
      ]);
    } finally {
      await server.close();
    }
  });

  it('is a usage error (exit 2) with a malformed --listen, a positional, -o; --listen is for serve only', async () => {
    const err: string[] = [];
    const io = {
      store: () => new MemoryStore(),
      readFile: () => Promise.reject(new Error('no file')),
      out: () => {},
      err: (t: string) => err.push(t),
      now: () => new Date(),
    };
    expect(await fleetMain(['serve', '--listen', 'nowhere'], {}, io)).toBe(2);
    expect(err.join('')).toContain('fleet: --listen "nowhere": expected host:port (e.g. 127.0.0.1:8090)');
    expect(await fleetMain(['serve', 'extra'], {}, io)).toBe(2);
    expect(await fleetMain(['serve', '-o', 'json'], {}, io)).toBe(2);
    expect(await fleetMain(['status', '--listen', '127.0.0.1:0'], {}, io)).toBe(2);
    expect(err.join('')).toContain('fleet: --listen applies to serve only');
  });

  it('serves until stopped, then exits 0', async () => {
    const out: string[] = [];
    let stop = () => {};
    const stopped = new Promise<void>((r) => {
      stop = r;
    });
    const store = new MemoryStore();
    const running = fleetMain(
      ['serve', '--store', 's3://fleet/p', '--listen', '127.0.0.1:0'],
      {},
      {
        store: () => store,
        readFile: () => Promise.reject(new Error('no file')),
        out: (t) => {
          out.push(t);
          const port = /:(\d+)\/ /.exec(t)?.[1];
          if (port) {
            void fetch(`http://127.0.0.1:${port}/api/fleet`).then((r) => {
              out.push(`status ${r.status}`);
              stop();
            });
          }
        },
        err: () => {},
        now: () => new Date(),
        untilStopped: () => stopped,
      },
    );
    expect(await running).toBe(0);
    expect(out).toContain('status 200');
  });
});
