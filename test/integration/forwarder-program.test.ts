/**
 * The forwarder program (`events/forwarder/main.ts`, run as its esbuild bundle with plain
 * `node`, as the container does) against the real kube-apiserver, with the read-only
 * ServiceAccount of infra/forwarder/rbac.yml, sending to the SQS-compatible test server (moto):
 * an App's event arrives on the FIFO queue; of two replicas only the Lease holder sends, and
 * when it stops (SIGTERM: exit 0, Lease released) the standby takes over and announces the same
 * change again with the same id, which the queue's deduplication drops; /healthz, /readyz and
 * /metrics answer. Also: moto's FIFO deduplication, explicit and content-based, and the SQS
 * sender's `SendMessageBatch` requests.
 */
import { type ChildProcess, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { DeleteMessageCommand, ReceiveMessageCommand, SendMessageCommand, type SQSClient } from '@aws-sdk/client-sqs';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { objectEvent, parseEvent } from '../../events/schema.js';
import { SqsEventSender } from '../../functions/lib/transport/sqs.js';
import { bundleEntry } from '../../layers/bundle.js';
import { kubectl, writeTokenKubeconfig } from '../harness/kube.js';
import { createFifoQueue, freePort, sqsClient } from '../harness/servers.js';

const kubeconfigPath = inject('kubeconfigPath');
const cluster = inject('cluster');
const { sqs } = inject('servers');
const suffix = randomBytes(3).toString('hex');
const ns = `fwdp-${suffix}`;
const k = (args: string[], input?: string) => kubectl(kubeconfigPath, args, { input, kubectl: cluster.kubectlPath });
const ROOT = fileURLToPath(new URL('../../', import.meta.url));

let tmp: string;
let bundle: string;
let saKubeconfig: string;
let queueUrl: string;
let client: SQSClient;
const children: ChildProcess[] = [];

/** A running replica: its HTTP base URL, output and exit. */
interface Replica {
  readonly base: string;
  readonly proc: ChildProcess;
  output(): string;
  readonly exited: Promise<number | null>;
}

/** Starts one replica of the bundled program with `extra` on top of the common environment. */
async function startReplica(extra: Record<string, string> = {}): Promise<Replica> {
  const port = await freePort();
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    HOME: tmp,
    AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
    // The SDK's default chain: environment credentials here, IRSA/Pod Identity in a cluster.
    AWS_ACCESS_KEY_ID: sqs.accessKeyId,
    AWS_SECRET_ACCESS_KEY: sqs.secretAccessKey,
    AWS_REGION: sqs.region,
    KAPP_LAMBDA_SQS_ENDPOINT: sqs.endpoint,
    KAPP_LAMBDA_QUEUE_URL_FETCH: queueUrl,
    KUBECONFIG: saKubeconfig,
    FORWARDER_CLUSTER_ID: 'program-it',
    FORWARDER_NAMESPACES: ns,
    FORWARDER_COALESCE_WINDOW_MS: '50',
    FORWARDER_HTTP_HOST: '127.0.0.1',
    FORWARDER_HTTP_PORT: String(port),
    FORWARDER_SHUTDOWN_TIMEOUT_SECONDS: '5',
    ...extra,
  };
  const proc = spawn(process.execPath, [bundle], { env, stdio: ['ignore', 'pipe', 'pipe'] });
  children.push(proc);
  let out = '';
  proc.stdout?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  proc.stderr?.on('data', (d: Buffer) => {
    out += d.toString();
  });
  const exited = new Promise<number | null>((resolve) => proc.on('exit', (code) => resolve(code)));
  return { base: `http://127.0.0.1:${port}`, proc, output: () => out, exited };
}

async function get(r: Replica, p: string): Promise<{ status: number; body: string }> {
  const res = await fetch(`${r.base}${p}`, { signal: AbortSignal.timeout(2000) });
  return { status: res.status, body: await res.text() };
}

/** Polls until `probe` holds; fails with the replicas' output after `timeoutMs`. */
async function until(what: string, probe: () => Promise<boolean>, rs: Replica[], timeoutMs = 90_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await probe().catch(() => false))) {
    if (Date.now() > deadline) {
      throw new Error(`timed out waiting for ${what}:\n${rs.map((r) => r.output().slice(-3000)).join('\n---\n')}`);
    }
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** A metric's value in a Prometheus text exposition (the unlabelled series). */
function metric(text: string, name: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${name} `));
  return line === undefined ? Number.NaN : Number(line.slice(name.length + 1));
}

/** Receives (and deletes) what is on the queue now, waiting up to `waitSeconds` for the first. */
async function drainQueue(url: string, waitSeconds: number): Promise<string[]> {
  const bodies: string[] = [];
  for (;;) {
    const r = await client.send(
      new ReceiveMessageCommand({
        QueueUrl: url,
        MaxNumberOfMessages: 10,
        WaitTimeSeconds: bodies.length ? 0 : waitSeconds,
      }),
    );
    if (!r.Messages?.length) return bodies;
    for (const m of r.Messages) {
      bodies.push(m.Body ?? '');
      await client.send(new DeleteMessageCommand({ QueueUrl: url, ReceiptHandle: m.ReceiptHandle }));
    }
  }
}

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'forwarder-program-it-'));
  client = sqsClient(sqs);
  const [, queue] = await Promise.all([
    bundleEntry(path.join(ROOT, 'events/forwarder/main.ts'), path.join(tmp, 'main.mjs')),
    createFifoQueue(sqs, `fwdp-${suffix}-fetch`),
    (async () => {
      await k([
        'apply',
        '--server-side',
        '--force-conflicts',
        '-f',
        path.join(ROOT, 'infra/crds/apps.kappctrl.k14s.io.yaml'),
      ]);
      await k(['wait', '--for=condition=Established', '--timeout=60s', 'crd/apps.kappctrl.k14s.io']);
      await k(
        ['apply', '-f', '-'],
        JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'kapp-lambda' } }),
      );
      await k(['create', 'namespace', ns]);
      await k(['apply', '-f', path.join(ROOT, 'infra/forwarder/rbac.yml')]);
    })(),
  ]);
  bundle = path.join(tmp, 'main.mjs');
  queueUrl = queue.url;
  const token = (
    await k(['create', 'token', 'kapp-lambda-forwarder', '-n', 'kapp-lambda', '--duration', '1h'])
  ).stdout.trim();
  saKubeconfig = await writeTokenKubeconfig(kubeconfigPath, token, path.join(tmp, 'forwarder.kubeconfig'));
}, 120_000);

afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  client?.destroy();
  await k(['delete', 'namespace', ns, '--wait=false']).catch(() => undefined);
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('SQS-compatible server (moto)', () => {
  it('drops a FIFO copy by explicit and by content-based deduplication id', async () => {
    const explicit = (await createFifoQueue(sqs, `dedup-${suffix}`)).url;
    const content = (await createFifoQueue(sqs, `content-${suffix}`, { contentBased: true })).url;
    for (const body of ['one', 'one', 'two']) {
      await client.send(
        new SendMessageCommand({
          QueueUrl: explicit,
          MessageBody: body,
          MessageGroupId: 'g',
          MessageDeduplicationId: body,
        }),
      );
      await client.send(new SendMessageCommand({ QueueUrl: content, MessageBody: body, MessageGroupId: 'g' }));
    }
    expect(await drainQueue(explicit, 1)).toEqual(['one', 'two']);
    expect(await drainQueue(content, 1)).toEqual(['one', 'two']);
    // As on AWS: still dropped after the original was received and deleted (5-minute interval).
    await client.send(
      new SendMessageCommand({
        QueueUrl: explicit,
        MessageBody: 'one',
        MessageGroupId: 'g',
        MessageDeduplicationId: 'one',
      }),
    );
    await client.send(new SendMessageCommand({ QueueUrl: content, MessageBody: 'two', MessageGroupId: 'g' }));
    expect(await drainQueue(explicit, 1)).toEqual([]);
    expect(await drainQueue(content, 1)).toEqual([]);
  });

  it('takes 23 events as SendMessageBatch requests; a whole resend of the list is dropped as copies', async () => {
    const url = (await createFifoQueue(sqs, `batch-${suffix}`)).url;
    const sender = new SqsEventSender({ client, queueUrls: { fetch: url } });
    const events = Array.from({ length: 23 }, (_, i) =>
      objectEvent(
        {
          clusterId: 'program-it',
          kind: 'App',
          apiVersion: 'kappctrl.k14s.io/v1alpha1',
          namespace: ns,
          name: `batch-${i}`,
          uid: `00000000-0000-4000-8000-${String(i).padStart(12, '0')}`,
          generation: 1,
          resourceVersion: String(100 + i),
        },
        'resync',
        { time: new Date() },
      ),
    );
    await sender.sendMany('fetch', events);
    // A forwarder whose batch was rejected midway sends it whole again (at least once).
    await sender.sendMany('fetch', events);
    const got = (await drainQueue(url, 1)).map((b) => {
      const parsed = parseEvent(b);
      if (!parsed.ok) throw new Error(parsed.error);
      return parsed.event.id;
    });
    expect(got.sort()).toEqual(events.map((e) => e.id).sort());
  });
});

describe('forwarder program', () => {
  it('exits 2 naming a missing queue variable', async () => {
    const r = await startReplica({ KAPP_LAMBDA_QUEUE_URL_FETCH: '' });
    expect(await r.exited).toBe(2);
    expect(r.output()).toContain('KAPP_LAMBDA_QUEUE_URL_FETCH: required (App events go to it)');
  });

  it('forwards an App change once across two replicas and a hand-over, stops on SIGTERM with exit 0', async () => {
    const a = await startReplica();
    await until('replica A to lead and sync', async () => (await get(a, '/readyz')).body.includes('leading'), [a]);
    const b = await startReplica();
    await until('replica B to stand by', async () => (await get(b, '/readyz')).body.includes('standby'), [a, b]);
    expect((await get(a, '/healthz')).status).toBe(200);
    expect(metric((await get(b, '/metrics')).body, 'kapp_lambda_forwarder_leader')).toBe(0);

    await k(
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'kappctrl.k14s.io/v1alpha1',
        kind: 'App',
        metadata: { name: 'hello', namespace: ns },
        spec: {
          serviceAccountName: 'deployer',
          fetch: [{ inline: { paths: { 'cm.yml': 'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}\n' } } }],
          template: [{ ytt: {} }],
          deploy: [{ kapp: {} }],
        },
      }),
    );
    const first = await drainQueue(queueUrl, 10);
    expect(first).toHaveLength(1);
    const event = parseEvent(first[0]!);
    if (!event.ok) throw new Error(event.error);
    expect(event.event.subject).toBe(`program-it/App/${ns}/hello`);
    expect(event.event.data).toMatchObject({ reason: 'added', name: 'hello', clusterId: 'program-it' });
    const metricsA = (await get(a, '/metrics')).body;
    expect(metric(metricsA, 'kapp_lambda_forwarder_leader')).toBe(1);
    expect(metric(metricsA, 'kapp_lambda_forwarder_events_sent_total')).toBe(1);
    expect(metricsA).toContain('kapp_lambda_forwarder_events_emitted_total{reason="added"} 1');
    expect(metricsA).toContain('process_resident_memory_bytes');
    // kapp-controller's per-object series from the watched status: the leader's only.
    expect(metricsA).toContain(
      `kappctrl_app_reconcile_attempt_total{controller="app",name="hello",namespace="${ns}"} 0`,
    );
    expect(metric(metricsA, 'kapp_lambda_forwarder_reconcile_metrics_objects')).toBe(1);
    expect((await get(b, '/metrics')).body).not.toContain('name="hello"');

    // SIGTERM to the leader: drains, releases the Lease, exits 0 well within its bound.
    a.proc.kill('SIGTERM');
    expect(await a.exited).toBe(0);
    expect(a.output()).toContain('lease released');
    // The standby takes over, lists, and announces the never-reconciled App again: same id.
    await until(
      'replica B to lead and send',
      async () => metric((await get(b, '/metrics')).body, 'kapp_lambda_forwarder_events_sent_total') === 1,
      [b],
      20_000,
    );
    expect((await get(b, '/readyz')).body).toContain('leading');
    expect(await drainQueue(queueUrl, 2)).toEqual([]); // deduplicated by MessageDeduplicationId

    b.proc.kill('SIGTERM');
    expect(await b.exited).toBe(0);
  }, 90_000);

  it("takes the App timer's sync periods from the cluster's kapp-controller-config and re-reads them on change", async () => {
    const read = (r: Replica) =>
      r
        .output()
        .split('\n')
        .filter((l) => l.includes('kapp-controller-config read for the App timer') || l.includes('App timer failed'));
    await k(
      ['apply', '-f', '-'],
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: 'kapp-controller-config', namespace: ns },
        data: { appDefaultSyncPeriod: '2m' },
      }),
    );
    const r = await startReplica({ FORWARDER_CONTROLLER_CONFIG_NAMESPACE: ns });
    await until('the ConfigMap to be read', async () => read(r).some((l) => l.includes('"ConfigMap/')), [r], 30_000);
    expect(read(r).at(-1)).toContain('"keys":["appDefaultSyncPeriod"]');

    // A Secret wins over the ConfigMap (upstream's Config.Reload), read again on its creation.
    await k([
      'create',
      'secret',
      'generic',
      'kapp-controller-config',
      '-n',
      ns,
      '--from-literal=appMinimumSyncPeriod=45s',
    ]);
    await until('the Secret to be read', async () => read(r).some((l) => l.includes('"Secret/')), [r], 30_000);
    expect(read(r).at(-1)).toContain('"keys":["appMinimumSyncPeriod"]');

    // A value that does not parse keeps the previous periods, with the parse error (no value echoed).
    await k([
      'patch',
      'secret',
      'kapp-controller-config',
      '-n',
      ns,
      '-p',
      JSON.stringify({ stringData: { appMinimumSyncPeriod: 'soon' } }),
    ]);
    await until(
      'the bad value to be reported',
      async () => read(r).some((l) => l.includes('App timer failed')),
      [r],
      30_000,
    );
    expect(read(r).at(-1)).toContain('Unmarshaling appMinimumSyncPeriod as duration');

    r.proc.kill('SIGTERM');
    expect(await r.exited).toBe(0);
  }, 90_000);
});
