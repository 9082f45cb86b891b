/**
 * The fleet page in a real browser (issue 28 item 5): Debian's headless Chromium
 * (`/usr/bin/chromium`, installed by `npm run setup`'s full profile), driven by playwright-core
 * (no browser download), loads the page the embedded runtime's HTTP server serves
 * (`functions/embedded/metrics-server.ts`) over a store laid out as the install function and the
 * rollouts write it (`functions/lib/fleet/view.ts`): the page shows every cluster in its wave with
 * its version and health, the rollout's waves and status, logs no console error and breaks no CSP
 * rule, and follows the store while a rollout advances (a wave released, a cluster upgraded, the
 * rollout completed). `FLEET_SCREENSHOT=<file>` also writes a screenshot (the README's).
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import type { Browser, Page } from 'playwright-core';
import { Registry } from 'prom-client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { type MetricsServer, startMetricsServer } from '../../functions/embedded/metrics-server.js';
import { buildFleetView, FLEET_INDEX_PREFIX, ROLLOUTS_PREFIX } from '../../functions/lib/fleet/view.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { launchChromium, watchedPage } from '../harness/chromium.js';
import { putReceipt } from '../harness/receipt-fixture.js';

const REF = 'hello.examples.kapp-lambda.dev';
const WAVES = { canary: ['kind-a'], early: ['kind-b', 'kind-c'], rest: ['kind-d', 'kind-e', 'kind-f'] } as const;

let dir: string;
let store: LocalDirStore;
let server: MetricsServer;
let browser: Browser;
let page: Page;
const problems: string[] = [];

/** Writes cluster `c`'s PackageInstall index entry at `version`, in wave `wave`. */
async function install(c: string, wave: string, version: string, healthy = true): Promise<void> {
  await store.put(
    `${FLEET_INDEX_PREFIX}${c}/default/hello.json`,
    JSON.stringify({
      refName: REF,
      version,
      reconcile: 'succeeded',
      health: healthy ? 'True' : 'False',
      wave,
      at: new Date().toISOString(),
    }),
  );
}

/** Writes a succeeded receipt of cluster `c`'s App (`ms` long, `usd`): its last reconcile on the page. */
async function receipt(c: string, ms: number, usd: number): Promise<void> {
  const startedAt = '2026-12-07T08:00:00.000Z';
  await putReceipt(store, { clusterId: c, namespace: 'default', name: 'hello' }, '20261207-080000-000-0000000a', {
    startedAt,
    endedAt: new Date(Date.parse(startedAt) + ms).toISOString(),
    usd,
  });
}

/** Writes the rollout of 2.0.0 with `released` waves released and `status`. */
async function rollout(released: number, status: string): Promise<void> {
  const names = Object.keys(WAVES);
  await store.put(
    `${ROLLOUTS_PREFIX}default/${REF}.json`,
    JSON.stringify({
      target: '2.0.0',
      from: '1.0.0',
      status,
      waves: names.map((name, i) => ({
        name,
        ...(i < released ? { releasedAt: new Date().toISOString() } : {}),
        ...(i < released - 1 || status === 'completed' ? { completedAt: new Date().toISOString() } : {}),
      })),
      history: names.slice(0, released).map((w) => ({ at: new Date().toISOString(), what: `wave ${w} released` })),
    }),
  );
}

/** What the page shows of each cluster: `id version health`. */
async function cells(): Promise<string[]> {
  return (
    await page.$$eval('.package[data-package] .cell', (els) =>
      els.map(
        (e) => `${e.getAttribute('data-cluster')} ${e.getAttribute('data-version')} ${e.getAttribute('data-health')}`,
      ),
    )
  ).sort();
}

beforeAll(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'fleet-page-'));
  store = new LocalDirStore(path.join(dir, 'store'));
  for (const [wave, clusters] of Object.entries(WAVES)) {
    for (const c of clusters) await install(c, wave, wave === 'canary' ? '2.0.0' : '1.0.0');
  }
  await rollout(1, 'running');
  for (const [i, c] of ['kind-a', 'kind-b', 'kind-c', 'kind-d'].entries())
    await receipt(c, 1800 + 700 * i, 0.00002 * (i + 1));
  server = await startMetricsServer(new Registry(), '127.0.0.1:0', {
    fleet: () => buildFleetView(store, { clusters: ['kind-idle'] }),
  });
  browser = await launchChromium();
  page = await watchedPage(browser, problems);
}, 120_000);

afterAll(async () => {
  await browser?.close();
  await server?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

describe('the fleet page in headless Chromium', () => {
  it('shows every cluster by wave and the rollout, then follows it as it advances, with no console error', async () => {
    await page.goto(`http://127.0.0.1:${server.address.port}/`);
    await page.waitForSelector('[data-cluster="kind-f"]');
    expect(await cells()).toEqual([
      'kind-a 2.0.0 healthy',
      'kind-b 1.0.0 healthy',
      'kind-c 1.0.0 healthy',
      'kind-d 1.0.0 healthy',
      'kind-e 1.0.0 healthy',
      'kind-f 1.0.0 healthy',
    ]);
    // The last reconcile's duration and cost, from the newest receipt.
    expect(await page.textContent('[data-cluster="kind-b"]')).toContain('2.5 s · $0.000040');
    // A cluster without a PackageInstall is on the page too.
    expect(await page.$('[data-cluster="kind-idle"]')).not.toBeNull();
    const rows = await page.$$eval('.package .row .label', (els) => els.map((e) => e.textContent));
    expect(rows).toEqual(['wave canary', 'wave early', 'wave rest']);
    expect(await page.$eval('[data-rollout]', (e) => e.getAttribute('data-status'))).toBe('running');
    expect(
      await page.$$eval('[data-wave]', (els) =>
        els.map((e) => `${e.getAttribute('data-wave')}:${e.getAttribute('data-state')}`),
      ),
    ).toEqual(['canary:released', 'early:pending', 'rest:pending']);

    // The rollout advances: wave early released, one of its clusters upgrading, one unhealthy.
    await rollout(2, 'running');
    await install('kind-b', 'early', '2.0.0');
    await install('kind-c', 'early', '2.0.0', false);
    await page.waitForSelector('[data-cluster="kind-c"][data-health="unhealthy"]', { timeout: 10_000 });
    expect(await cells()).toContain('kind-b 2.0.0 healthy');
    expect(await page.$eval('[data-wave="early"]', (e) => e.getAttribute('data-state'))).toBe('released');
    if (process.env.FLEET_SCREENSHOT) await page.screenshot({ path: process.env.FLEET_SCREENSHOT, fullPage: true });

    // Then every wave, and the rollout completes.
    await install('kind-c', 'early', '2.0.0');
    for (const c of WAVES.rest) await install(c, 'rest', '2.0.0');
    await rollout(3, 'completed');
    await page.waitForSelector('[data-rollout][data-status="completed"]', { timeout: 10_000 });
    await page.waitForFunction(
      // Evaluated in the page (its DOM), not here.
      'document.querySelectorAll(\'.package .cell[data-version="2.0.0"][data-health="healthy"]\').length === 6',
      undefined,
      { timeout: 10_000 },
    );
    expect(await page.textContent('[data-rollout]')).toContain('6 of 6 at 2.0.0');
    expect(problems).toEqual([]);
  });
});
