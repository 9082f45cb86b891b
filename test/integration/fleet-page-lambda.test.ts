/**
 * The fleet page's Lambda function as it ships: its esbuild bundle (`bundleFunctions`, the
 * project's one recipe, the AWS SDK from the runtime's `NODE_PATH`) as its own bootstrap under the
 * Runtime Interface Emulator, invoked with Function URL events (payload format 2.0), reading a
 * cloud fleet's bucket on the suite's S3-compatible server (versitygw). The page comes with a CSP
 * whose hashes are those of the page it carries; the view is the bucket's; any other path is 404;
 * a bucket it cannot read answers 503 with the fixed text, the cause in the function's log only.
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, inject, it, vi } from 'vitest';
import type { FunctionUrlResult } from '../../functions/fleet-page/index.js';
import { FLEET_UNAVAILABLE } from '../../functions/lib/fleet/http.js';
import { FLEET_PAGE_HTML, fleetPageCsp } from '../../functions/lib/fleet/page.js';
import type { FleetView } from '../../functions/lib/fleet/view.js';
import { S3Store } from '../../functions/lib/store/s3.js';
import { bundleFunctions } from '../../layers/bundle.js';
import { FIXTURE, putFleetFixture } from '../harness/fleet-fixture.js';
import { invokeRie, type Rie, rieLogLines, startRie } from '../harness/lambda.js';
import { createBucket, s3Client } from '../harness/servers.js';

const s3 = inject('servers').s3;
const BUCKET = `fleet-page-${randomBytes(4).toString('hex')}`;

let tmp: string;
let bundle: string;
let rie: Rie;
let missing: Rie;

/** The function's environment on Lambda, pointed at the S3 server. */
const functionEnv = (bucket: string) => ({
  KAPP_LAMBDA_BUCKET: bucket,
  KAPP_LAMBDA_S3_ENDPOINT: s3.endpoint,
  AWS_REGION: s3.region,
  AWS_ACCESS_KEY_ID: s3.accessKeyId,
  AWS_SECRET_ACCESS_KEY: s3.secretAccessKey,
  AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
});

/** A Function URL event of `method path`, as Lambda sends it (payload format 2.0, the fields used). */
const urlEvent = (rawPath: string, method = 'GET') => ({
  version: '2.0',
  routeKey: '$default',
  rawPath,
  rawQueryString: '',
  headers: { host: 'abc.lambda-url.eu-west-1.on.aws' },
  requestContext: { http: { method, path: rawPath, protocol: 'HTTP/1.1', sourceIp: '127.0.0.1' } },
  isBase64Encoded: false,
});

async function invoke(target: Rie, rawPath: string, method?: string): Promise<FunctionUrlResult> {
  const r = await invokeRie(target, urlEvent(rawPath, method));
  expect(r.status).toBe(200);
  return r.body as FunctionUrlResult;
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-fleet-page-'));
  await createBucket(s3, BUCKET);
  const client = s3Client(s3);
  await putFleetFixture(new S3Store({ client, bucket: BUCKET }));
  client.destroy();
  const { 'fleet-page': dir } = await bundleFunctions(['fleet-page'], path.join(tmp, 'bundles'));
  bundle = path.join(dir, 'index.mjs');
  rie = await startRie({ bundle, env: functionEnv(BUCKET), cwd: tmp });
  missing = await startRie({ bundle, env: functionEnv(`${BUCKET}-gone`), cwd: tmp });
}, 120_000);

afterAll(async () => {
  await rie?.proc.stop();
  await missing?.proc.stop();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('the fleet page function under the Runtime Interface Emulator', () => {
  it("serves the page under a CSP whose hashes are the served page's", async () => {
    const r = await invoke(rie, '/');
    expect(r.statusCode).toBe(200);
    expect(r.headers['content-type']).toBe('text/html; charset=utf-8');
    expect(r.body).toBe(FLEET_PAGE_HTML);
    expect(r.headers['content-security-policy']).toBe(fleetPageCsp());
    const script = /<script>([\s\S]*?)<\/script>/.exec(r.body)?.[1] ?? '';
    expect(r.headers['content-security-policy']).toContain(
      `script-src 'sha256-${createHash('sha256').update(script).digest('base64')}'`,
    );
  });

  it("answers /api/fleet with the bucket's view, 404 elsewhere, 405 for another method", async () => {
    const r = await invoke(rie, '/api/fleet');
    expect(r.statusCode).toBe(200);
    expect(r.headers['content-type']).toBe('application/json');
    const view = JSON.parse(r.body) as FleetView;
    expect(view.clusters).toEqual([FIXTURE.clusterId]);
    expect(view.installs[0]).toMatchObject({ version: '2.0.0', lastReconcile: { durationMs: 2500 } });
    expect(view.rollouts[0]).toMatchObject({ refName: FIXTURE.refName, target: '2.0.0', status: 'running' });
    expect((await invoke(rie, '/metrics')).statusCode).toBe(404);
    expect((await invoke(rie, '/api/fleet', 'POST')).statusCode).toBe(405);
  });

  it('answers 503 with the fixed text when the bucket cannot be read, and logs why', async () => {
    const r = await invoke(missing, '/api/fleet');
    expect(r.statusCode).toBe(503);
    expect(r.body).toBe(FLEET_UNAVAILABLE);
    expect(JSON.stringify(r)).not.toContain(`${BUCKET}-gone`);
    const logged = () => rieLogLines(missing).filter((l) => l.msg === 'fleet page: cannot read the store');
    // The line goes through the emulator's output pipe, the answer over HTTP: it may come after.
    await vi.waitFor(() => expect(logged()).not.toEqual([]), { timeout: 10_000 });
    const lines = logged();
    expect(lines).toEqual([
      expect.objectContaining({
        level: 50,
        function: 'fleet-page',
        error: expect.stringMatching(/^StoreError: /),
        cause: expect.stringMatching(/NoSuchBucket/),
      }),
    ]);
    expect(JSON.stringify(lines)).not.toContain(s3.secretAccessKey);
    // The page itself still loads.
    expect((await invoke(missing, '/')).statusCode).toBe(200);
  });
});
