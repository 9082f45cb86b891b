/**
 * `npm run fleet -- serve` against the suite's real S3-compatible server (versitygw), run as an
 * operator runs it (`tsx scripts/fleet.ts`, argv, the AWS variables of the environment): it
 * serves the page and `/api/fleet` of a cloud fleet's bucket (a fleet index entry with its
 * receipt, a rollout record), the page loads in headless Chromium with no console error or CSP
 * violation and shows the cluster, nothing in the bucket changes, a bucket that goes away while
 * served answers 503 and the command says so once (and again when it reads), a store that
 * cannot be read refuses to start with exit 1 naming it (no credential in the message), and
 * SIGTERM stops it with exit 0.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { CreateBucketCommand, DeleteBucketCommand, type S3Client } from '@aws-sdk/client-s3';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { FLEET_UNAVAILABLE } from '../../functions/lib/fleet/http.js';
import { fleetPageCsp } from '../../functions/lib/fleet/page.js';
import type { FleetView } from '../../functions/lib/fleet/view.js';
import { S3Store } from '../../functions/lib/store/s3.js';
import { launchChromium, watchedPage } from '../harness/chromium.js';
import { FIXTURE, putFleetFixture } from '../harness/fleet-fixture.js';
import { createBucket, s3Client } from '../harness/servers.js';

const ROOT = path.resolve(import.meta.dirname, '../..');
const TSX = path.join(ROOT, 'node_modules/.bin/tsx');
const s3 = inject('servers').s3;
const BUCKET = `fleet-serve-${randomBytes(4).toString('hex')}`;
const PREFIX = 'kapp-lambda';

let tmp: string;
let client: S3Client;
/** The bucket as the cloud fleet's functions see it (under {@link PREFIX}). */
let store: S3Store;

/** The CLI's environment: the S3 server's endpoint and credentials, nothing of this process's. */
const cliEnv = (over: Record<string, string> = {}) => ({
  PATH: process.env.PATH,
  HOME: tmp,
  AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
  AWS_ACCESS_KEY_ID: s3.accessKeyId,
  AWS_SECRET_ACCESS_KEY: s3.secretAccessKey,
  AWS_REGION: s3.region,
  KAPP_LAMBDA_S3_ENDPOINT: s3.endpoint,
  ...over,
});

/** Runs `npm run fleet -- <args>` to its end; resolves to its exit code and output. */
async function fleet(args: string[], env = cliEnv()): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await promisify(execFile)(TSX, ['scripts/fleet.ts', ...args], { cwd: ROOT, env });
    return { code: 0, ...r };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

/** A running `fleet serve`: its base URL, its output so far, and its exit. */
interface Served {
  base: string;
  proc: ChildProcess;
  stderr: () => string;
  exited: Promise<number | null>;
}

/** Starts `npm run fleet -- serve <args>` and resolves once it prints its URL. */
function serve(args: string[]): Promise<Served> {
  // Node itself with tsx's loader, not the tsx CLI: that relays a SIGTERM and kills its child
  // outright when the child does not answer within 30 ms (a loaded machine), exiting 143.
  const proc = spawn(process.execPath, ['--import', 'tsx', 'scripts/fleet.ts', 'serve', ...args], {
    cwd: ROOT,
    env: cliEnv(),
  });
  let out = '';
  let err = '';
  proc.stderr?.on('data', (d: Buffer) => {
    err += d.toString();
  });
  const exited = new Promise<number | null>((resolve) => proc.once('exit', (code) => resolve(code)));
  return new Promise((resolve, reject) => {
    proc.stdout?.on('data', (d: Buffer) => {
      out += d.toString();
      const m = /open (http:\/\/127\.0\.0\.1:\d+)\//.exec(out);
      if (m) resolve({ base: m[1] as string, proc, stderr: () => err, exited });
    });
    void exited.then((code) => reject(new Error(`fleet serve exited ${code} before serving: ${err}`)));
  });
}

/** Every object of the bucket, key → body. */
async function snapshot(): Promise<Record<string, string>> {
  const root = new S3Store({ client, bucket: BUCKET });
  const out: Record<string, string> = {};
  for (const k of await root.list('')) out[k] = (await root.get(k))?.toString('utf8') ?? '';
  return out;
}

/** Polls `f` until it holds (each attempt 200 ms apart), up to 20 s. */
async function until(f: () => Promise<boolean>, what: string): Promise<void> {
  for (let i = 0; i < 100; i++) {
    if (await f()) return;
    await new Promise((r) => setTimeout(r, 200));
  }
  throw new Error(`timed out waiting for ${what}`);
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-fleet-serve-'));
  await createBucket(s3, BUCKET);
  client = s3Client(s3);
  store = new S3Store({ client, bucket: BUCKET, prefix: PREFIX });
  await putFleetFixture(store);
});

afterAll(async () => {
  client?.destroy();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('npm run fleet -- serve', () => {
  it("serves the page and the view of a cloud fleet's bucket, read-only, in a real browser; 503 while the bucket is gone; stops on SIGTERM", async () => {
    const before = await snapshot();
    const served = await serve(['--store', `s3://${BUCKET}/${PREFIX}`, '--listen', '127.0.0.1:0']);
    try {
      const page = await fetch(`${served.base}/`);
      expect(page.status).toBe(200);
      expect(page.headers.get('content-security-policy')).toBe(fleetPageCsp());
      const api = await fetch(`${served.base}/api/fleet`);
      expect(api.status).toBe(200);
      const view = (await api.json()) as FleetView;
      expect(view.clusters).toEqual([FIXTURE.clusterId]);
      expect(view.installs[0]).toMatchObject({
        clusterId: FIXTURE.clusterId,
        namespace: FIXTURE.namespace,
        name: FIXTURE.name,
        version: '2.0.0',
        healthy: true,
        lastReconcile: { durationMs: 2500, costUsd: 0.000125 },
      });
      expect(view.rollouts).toEqual([
        expect.objectContaining({
          policy: FIXTURE.policy,
          refName: FIXTURE.refName,
          target: '2.0.0',
          status: 'running',
        }),
      ]);
      expect((await fetch(`${served.base}/metrics`)).status).toBe(404);
      expect((await fetch(`${served.base}/api/fleet`, { method: 'POST' })).status).toBe(405);

      // The page in headless Chromium: the cluster's cell, its wave, the rollout; no console error.
      const problems: string[] = [];
      const browser = await launchChromium();
      try {
        const tab = await watchedPage(browser, problems);
        await tab.goto(`${served.base}/`);
        const cell = await tab.waitForSelector(`[data-cluster="${FIXTURE.clusterId}"][data-version="2.0.0"]`);
        expect(await cell.getAttribute('data-health')).toBe('healthy');
        expect(await cell.textContent()).toContain('2.5 s · $0.000125');
        expect(await tab.$eval('[data-rollout]', (e) => e.getAttribute('data-status'))).toBe('running');
        expect(problems).toEqual([]);
        expect(await snapshot()).toEqual(before);

        // The bucket goes away: the view answers 503, the page says so, the command says why, once.
        const root = new S3Store({ client, bucket: BUCKET });
        for (const k of await root.list('')) await root.delete(k);
        await client.send(new DeleteBucketCommand({ Bucket: BUCKET }));
        // The view the page built within the last second is served until it is a second old.
        await until(async () => (await fetch(`${served.base}/api/fleet`)).status === 503, 'the view to fail');
        for (let i = 0; i < 3; i++) {
          const gone = await fetch(`${served.base}/api/fleet`);
          expect(gone.status).toBe(503);
          expect(await gone.text()).toBe(FLEET_UNAVAILABLE);
        }
        await tab.waitForSelector('#status.error', { timeout: 10_000 });
        expect(await tab.textContent('#status')).toBe(`cannot read the fleet: ${FLEET_UNAVAILABLE.trim()} (HTTP 503)`);
      } finally {
        await browser.close();
      }
      // The page's failed polls are console errors of the browser's own (a 503 resource); nothing else.
      expect(problems.filter((p) => !p.includes('status of 503'))).toEqual([]);
      // Back: the view answers again, and the command says so.
      await client.send(new CreateBucketCommand({ Bucket: BUCKET }));
      await putFleetFixture(store);
      await until(async () => (await fetch(`${served.base}/api/fleet`)).status === 200, 'the view again');
      await until(async () => served.stderr().includes('reads again'), 'the command to say the store reads again');
      // Its stderr is one pipe, in order: one line for the three failed polls, one for the recovery.
      expect(
        served
          .stderr()
          .split('\n')
          .filter((l) => l.startsWith('fleet: ')),
      ).toEqual([
        expect.stringMatching(
          new RegExp(`^fleet: cannot read the store s3://${BUCKET}/${PREFIX}: StoreError: .*NoSuchBucket`),
        ),
        `fleet: the store s3://${BUCKET}/${PREFIX} reads again`,
      ]);
      expect(served.stderr()).not.toContain(s3.secretAccessKey);
    } finally {
      served.proc.kill('SIGTERM');
    }
    expect(await served.exited).toBe(0);
  });

  it('refuses a store it cannot read with exit 1, naming it and why, before listening', async () => {
    const missing = await fleet(['serve', '--store', 's3://no-such-bucket-c28/p', '--listen', '127.0.0.1:0']);
    expect(missing.code).toBe(1);
    expect(missing.stdout).toBe('');
    expect(missing.stderr).toMatch(
      /^fleet: cannot read the store s3:\/\/no-such-bucket-c28\/p: StoreError: .*NoSuchBucket/m,
    );

    const refused = await fleet(
      ['serve', '--store', `s3://${BUCKET}/${PREFIX}`, '--listen', '127.0.0.1:0'],
      cliEnv({ AWS_SECRET_ACCESS_KEY: 'not-the-secret' }),
    );
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(
      new RegExp(`^fleet: cannot read the store s3://${BUCKET}/${PREFIX}: StoreError: `, 'm'),
    );
    expect(refused.stderr).not.toContain('not-the-secret');
    expect(refused.stderr).not.toContain(s3.secretAccessKey);

    const dir = await fleet(['serve', '--store', `file://${path.join(tmp, 'nowhere')}`]);
    expect(dir.code).toBe(1);
    expect(dir.stderr).toBe(`fleet: --store file://${path.join(tmp, 'nowhere')}: no such directory\n`);

    const listen = await fleet(['serve', '--listen', 'everywhere']);
    expect(listen.code).toBe(2);
    expect(listen.stderr).toContain('fleet: --listen "everywhere": expected host:port (e.g. 127.0.0.1:8090)');
  });
});
