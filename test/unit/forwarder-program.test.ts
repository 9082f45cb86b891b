/**
 * The forwarder program's per-object `kappctrl_*` series (`events/forwarder/program.ts`) across a
 * leadership loss: the leader serves them, and they go when the term ends (the Lease taken over),
 * not when a standby is next scraped, so a scrape has no side effect. Election over an in-memory
 * Lease, fake timers, the in-memory watcher; `metrics()` is what `/metrics` serves.
 */
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { silentLogger } from '../../events/forwarder/log.js';
import { type ForwarderProgram, startForwarderProgram } from '../../events/forwarder/program.js';
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
