/**
 * The forwarder program's per-object `kappctrl_*` series (`events/forwarder/program.ts`) across a
 * leadership loss: the leader serves them, and they go when the term ends (the Lease taken over),
 * not when a standby is next scraped, so a scrape has no side effect. Election over an in-memory
 * Lease, fake timers, the in-memory watcher; `metrics()` is what `/metrics` serves. And the
 * bound of one `/metrics` response against a client that reads a trickle.
 */
import { Readable, Writable } from 'node:stream';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { silentLogger } from '../../events/forwarder/log.js';
import {
  boundScrape,
  type ForwarderProgram,
  SCRAPE_DEADLINE_MS,
  SCRAPE_TIMEOUT_MS,
  startForwarderProgram,
} from '../../events/forwarder/program.js';
import { FakeObjectWatcher } from '../../events/forwarder/testing.js';
import { testProgramSettings } from './support/forwarder-program.js';
import { OneLease } from './support/one-lease.js';

const T0 = Date.parse('2025-03-01T10:00:00.000Z');
const SERIES = 'kappctrl_app_reconcile_attempt_total{controller="app",name="a",namespace="default"} 0';

describe('forwarder program metrics', () => {
  let lease: OneLease;
  let program: ForwarderProgram;

  beforeEach(async () => {
    vi.useFakeTimers({ now: T0, toFake: ['setTimeout', 'clearTimeout', 'setInterval', 'clearInterval', 'Date'] });
    lease = new OneLease();
    const watcher = new FakeObjectWatcher();
    watcher.apply({
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name: 'a', namespace: 'default', uid: 'uid-a', resourceVersion: '', generation: 1 },
      spec: { fetch: [{ inline: {} }], template: [{ ytt: {} }], deploy: [{ kapp: {} }] },
    });
    const settings = testProgramSettings();
    program = await startForwarderProgram(settings, {
      watcher,
      lease: lease.view,
      transport: { send: async () => {} },
      identity: 'me',
      logger: silentLogger,
    });
  });

  afterEach(async () => {
    await program.stop();
    vi.useRealTimers();
  });

  it('drops the per-object series when the Lease is lost, before any scrape', async () => {
    await vi.advanceTimersByTimeAsync(5_000);
    expect(program.isLeader()).toBe(true);
    expect(await program.metrics()).toContain(SERIES);

    // Another replica takes the Lease: the next renewal conflicts and the term ends.
    const other = () => lease.put({ holderIdentity: 'other', leaseDurationSeconds: 15 });
    other();
    const keep = setInterval(other, 2_000);
    await vi.advanceTimersByTimeAsync(5_000);
    clearInterval(keep);
    expect(program.isLeader()).toBe(false);
    const standby = await program.metrics();
    expect(standby).not.toContain('name="a"');
    expect(standby).toContain('kapp_lambda_forwarder_reconcile_metrics_objects 0');
  });
});

describe('a /metrics response', () => {
  afterEach(() => vi.useRealTimers());

  it('is cut at the deadline even while its client keeps reading a trickle', async () => {
    vi.useFakeTimers({ toFake: ['setTimeout', 'clearTimeout'] });
    // A slow client: takes one chunk a second, so the response is never idle SCRAPE_TIMEOUT_MS.
    let next: (() => void) | undefined;
    let read = 0;
    const client = Object.assign(
      new Writable({
        highWaterMark: 1,
        write(_chunk, _encoding, done) {
          read++;
          next = done;
        },
      }),
      { setTimeout: () => client },
    );
    const closed = new Promise<void>((resolve) => client.once('close', () => resolve()));
    boundScrape(client as never);
    Readable.from(
      (function* () {
        for (;;) yield 'kappctrl_app_reconcile_attempt_total 0\n';
      })(),
    ).pipe(client);

    const second = async () => {
      await vi.advanceTimersByTimeAsync(1_000);
      next?.();
    };
    for (let s = 1; s < SCRAPE_DEADLINE_MS / 1_000; s++) await second();
    // Reading steadily, past the idle timeout: still served just before the deadline.
    expect(SCRAPE_DEADLINE_MS).toBeGreaterThan(SCRAPE_TIMEOUT_MS);
    expect(read).toBeGreaterThanOrEqual(SCRAPE_DEADLINE_MS / 1_000 - 1);
    expect(client.destroyed).toBe(false);
    await vi.advanceTimersByTimeAsync(1_000);
    expect(client.destroyed).toBe(true);
    await closed;
  });
});
