/**
 * The shared mode as it ships (docs/decisions.md D15), on this machine: forwarder → SQS →
 * dispatcher → stage function in tenant isolation, for two clusters (the stack:
 * `./cloud-dispatch-support.ts`).
 *
 * - Per stage of an App's run (fetch, template, deploy), the dispatcher bundle
 *   (`functions/dispatch/index.ts`) under the Lambda Runtime Interface Emulator consumes the
 *   stage's FIFO queue through the event source mapping's stand-in (`../harness/sqs-poller.ts`).
 *   It assumes the stage's run role in moto's STS (the roles are made in moto's IAM; session
 *   name = the cluster id) and invokes the stage function through Lambda's Invoke API with the
 *   cluster as `TenantId`.
 * - That API is `../harness/tenant-router.ts`: one emulator of the stage function bundle per
 *   (function, tenant), started on the tenant's first invoke, as Lambda's tenant isolation mode
 *   does; an invoke without a tenant id is refused as Lambda refuses it.
 * - The stage functions run with `KAPP_LAMBDA_DISPATCHED=true` and no AWS credentials of their own:
 *   their S3 and SQS requests are signed with the run session's credentials each batch brings.
 *   The suite's S3 server (versitygw) would refuse credentials moto's STS issued, so this file's
 *   artifact bucket and cluster registry are in moto's S3, which (without IAM enforcement)
 *   accepts any signed request: what a run session may reach is not shown here but by
 *   `../integration/run-confinement.test.ts`, with IAM enforced.
 * - The dispatchers run the sender check (`KAPP_LAMBDA_SENDER_CHECK=registry`,
 *   `KAPP_LAMBDA_FUNCTION_SENDERS` = the run roles' ids): moto's SQS, through the suite's wrapper
 *   (`../harness/servers/moto_sqs.py`), sets a message's `SenderId` from an STS session's
 *   credentials as SQS does, `<run role id>:<cluster id>` for a stage run's hand-off. Each
 *   cluster's forwarder signs with a session of its own forwarder role (made in moto's IAM, its id
 *   in the cluster's registry document, `--forwarder-role-id`), as the stack's per-cluster role.
 * - Two cluster ids in the registry point at the suite's shared control plane, each served by
 *   a forwarder of its own limited to its namespace (`FORWARDER_NAMESPACES`), as two clusters.
 *   The emulators run without `cloud.test.ts`'s sandbox (host tool directories hidden), one
 *   instance per dispatcher: this file is about the dispatch path, that one about the layers.
 *
 * Asserted: an App of each cluster reaches ReconcileSucceeded; each stage function environment
 * served one cluster only (one per (stage, tenant), no batch refused by its holder); the events
 * a stage run sent carried `SenderId` `<run role id>:<cluster id>` and passed the next
 * dispatcher's check.
 */
import { ListObjectsV2Command } from '@aws-sdk/client-s3';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { rieLogLines } from '../harness/lambda.js';
import { s3Client } from '../harness/servers/s3.js';
import { type DispatchedStack, startDispatchedStack } from './cloud-dispatch-support.js';
import {
  type AppObject,
  expectSucceededStatus,
  inlineConfigMapApp,
  STATUS_KEYS,
  shared,
  succeededAt,
  suffix,
  waitFor,
} from './support.js';

const id = suffix();
/** The stages an App's run passes through: each has a dispatcher and a stage function here. */
const STAGES = ['fetch', 'template', 'deploy'] as const;
type Stage = (typeof STAGES)[number];
/** The two cluster ids (two registry documents, one control plane), each with its namespace. */
const CLUSTERS = [`disp-a-${id}`, `disp-b-${id}`] as const;

let stack: DispatchedStack<Stage> | undefined;

beforeAll(async () => {
  stack = await startDispatchedStack({ id, stages: STAGES, clusters: CLUSTERS, forwarderKinds: 'App' });
}, 180_000);

afterAll(async () => {
  await stack?.stop();
  // The Apps' finalizers, which no function is left to remove, then their namespaces.
  for (const ns of CLUSTERS) {
    await shared.k(
      ['-n', ns, 'patch', 'app', `app-${ns}`, '--type=merge', '-p', '{"metadata":{"finalizers":null}}'],
      undefined,
      false,
    );
  }
  await shared.deleteNamespaces([...CLUSTERS]);
});

describe('the shared mode: forwarder → SQS → dispatcher → stage function per tenant, under the emulators', () => {
  it('reconciles an App of each of two clusters, each cluster in stage environments of its own, the hand-offs sent as its run session', {
    timeout: 120_000,
  }, async () => {
    await Promise.all(CLUSTERS.map((ns) => shared.createTenant(ns)));
    await shared.apply(...CLUSTERS.map((ns) => inlineConfigMapApp(ns, `app-${ns}`, `hello ${ns}`)));
    const {
      router: r,
      dispatchers,
      fleet,
      runRoleIds,
      forwarderRoleIds,
      stageFunctionName,
    } = stack as DispatchedStack<Stage>;
    const apps = await Promise.all(
      CLUSTERS.map(async (ns) => {
        let last: AppObject | undefined;
        return await waitFor(
          `App ${ns}/app-${ns}`,
          async () => {
            last = await shared.getApp(ns, `app-${ns}`);
            return last && succeededAt(1)(last) ? last : undefined;
          },
          {
            timeoutMs: 90_000,
            intervalMs: 500,
            describe: () => `${JSON.stringify(last?.status ?? null, null, 1)}\n${stack?.describe()}`,
          },
        );
      }),
    );
    for (const app of apps) expectSucceededStatus(app, STATUS_KEYS);
    for (const ns of CLUSTERS) {
      const cm = await shared.getObject<{ data?: Record<string, string> }>('configmap', ns, `app-${ns}-config`);
      expect(cm?.data).toEqual({ greeting: `hello ${ns}` });
    }

    // One environment per (stage function, cluster), each started for its tenant only.
    expect(r.environments.map((e) => `${e.functionName} ${e.tenantId}`).sort()).toEqual(
      STAGES.flatMap((st) => CLUSTERS.map((c) => `${stageFunctionName(st)} ${c}`)).sort(),
    );
    // Every invoke named its tenant and ran; no holder refused a batch (a batch of another cluster).
    expect(r.invokes.filter((i) => i.tenantId === undefined || i.status !== 200 || i.functionError)).toEqual([]);
    for (const e of r.environments) {
      const refused = rieLogLines(e.rie).filter((l) => l.outcome === 'refused');
      expect(refused, `${e.functionName} ${e.tenantId}`).toEqual([]);
    }

    // The hand-offs (fetch → template → deploy) were sent as the sending stage's run session of
    // the App's cluster, and the receiving dispatcher's sender check took them.
    const previous: Record<Exclude<Stage, 'fetch'>, Stage> = { template: 'fetch', deploy: 'template' };
    for (const d of dispatchers) {
      // Every sender (forwarder and run sessions) keyed the groups under the cluster's event key.
      const unkeyed = d.records.filter(
        (rec) => !/^[a-z0-9-]+\/[0-9a-f]{64}$/.test(rec.attributes.MessageGroupId ?? ''),
      );
      expect(unkeyed.map((rec) => rec.attributes.MessageGroupId)).toEqual([]);
      if (d.stage === 'fetch') {
        // The fetch queue's events: the cluster's forwarder (a session of its own role), and the
        // run's follow-ups (a stage's run session of that cluster); the first came from the forwarder.
        for (const cluster of CLUSTERS) {
          const senders = d.records
            .filter((rec) => rec.attributes.MessageGroupId?.startsWith(`${cluster}/`))
            .map((rec) => rec.attributes.SenderId);
          expect(senders[0], `the first fetch record of ${cluster}`).toBe(`${forwarderRoleIds.get(cluster)}:forwarder`);
          const runs = STAGES.map((st) => `${runRoleIds.get(st)}:${cluster}`);
          expect(senders.filter((id) => id !== senders[0] && !runs.includes(id ?? ''))).toEqual([]);
        }
        continue;
      }
      const from = previous[d.stage];
      for (const cluster of CLUSTERS) {
        const mine = d.records.filter((rec) => rec.attributes.MessageGroupId?.startsWith(`${cluster}/`));
        expect(mine.length, `${d.stage} records of ${cluster}`).toBeGreaterThan(0);
        expect(new Set(mine.map((rec) => rec.attributes.SenderId))).toEqual(
          new Set([`${runRoleIds.get(from)}:${cluster}`]),
        );
      }
      expect(
        rieLogLines(d.rie).filter((l) => l.outcome === 'refused'),
        `${d.stage} dispatcher`,
      ).toEqual([]);
      expect(d.mapping.invocations.filter((i) => i.outcome !== 'ok' || i.failed.length > 0)).toEqual([]);
    }
    // Cluster sharing (docs/decisions.md D17): the runs' claims (the render cache records, the
    // in-flight markers) are under each cluster's domain `d/<tag>/`, two domains for two clusters,
    // and none under the fleet's `cache/` or `inflight/`; the content-addressed manifests are shared.
    const keys: string[] = [];
    const listed = s3Client(fleet.s3);
    for (let token: string | undefined; ; ) {
      const page = await listed.send(
        new ListObjectsV2Command({ Bucket: fleet.bucket, ...(token ? { ContinuationToken: token } : {}) }),
      );
      keys.push(...(page.Contents ?? []).map((o) => o.Key ?? ''));
      token = page.NextContinuationToken;
      if (!token) break;
    }
    listed.destroy();
    const domains = new Set(
      keys.filter((k) => /^d\/[0-9a-f]{32}\/cache\/render\//.test(k)).map((k) => k.split('/')[1]),
    );
    expect(domains.size, keys.join('\n')).toBe(CLUSTERS.length);
    expect(keys.filter((k) => k.startsWith('cache/') || k.startsWith('inflight/'))).toEqual([]);
    expect(keys.some((k) => k.startsWith('artifacts/template/sha256/'))).toBe(true);
    // A stage function refuses an invoke without a tenant, as Lambda does for a tenant-isolated function.
    const untenanted = await fetch(`${r.endpoint}/2015-03-31/functions/${stageFunctionName('fetch')}/invocations`, {
      method: 'POST',
      body: '{}',
    });
    expect([untenanted.status, untenanted.headers.get('x-amzn-errortype')]).toEqual([
      400,
      'InvalidParameterValueException',
    ]);
  });
});
