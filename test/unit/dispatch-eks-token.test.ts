/**
 * The EKS tokens of the dispatched mode (docs/decisions.md D15): the dispatcher signs an `eks`
 * cluster's run token with its own role for that cluster's EKS name, and none for a `token`
 * cluster; the stage uses the batch's token for its cluster and never signs one (an `eks`
 * cluster without a token fails clearly), until shortly before the token expires, whatever
 * validity the registry asks. STS is never called (signing is local); the stage is a fake.
 */
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { describe, expect, it } from 'vitest';
import { parseLambdaEnv } from '../../functions/lib/entry/config.js';
import { type DispatchedBatch, makeDispatcher, type RunCredentials } from '../../functions/lib/entry/dispatch.js';
import { eksTokenMinter } from '../../functions/lib/entry/dispatch-entry.js';
import { EKS_TOKEN_EXPIRY_MARGIN_MS, RunCredentialHolder } from '../../functions/lib/entry/dispatched.js';
import { createLambdaDeps, fleetClusterRegistry, lazyAwsClients } from '../../functions/lib/entry/lambda.js';
import { EKS_TOKEN_LIFETIME_MS, EKS_TOKEN_PREFIX } from '../../functions/lib/kube/bearer.js';
import { StoreClusterRegistry } from '../../functions/lib/kube/fleet-registry.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { clusterDocJson } from './support/cluster-doc.js';
import { clusterTemplateRecord } from './support/cluster-records.js';
import { batchOf, DISPATCH_KEYRING, DISPATCHED_ENV } from './support/dispatched-batch.js';
import { decodeEksToken, signedFor } from './support/eks-token.js';

/** Cluster `alpha` (EKS name `eks-alpha`) authenticates with `eks`, cluster `beta` with a token secret. */
const doc = (id: string) =>
  clusterDocJson(
    id,
    id === 'alpha'
      ? { kind: 'eks', clusterName: 'eks-alpha', region: 'eu-west-1' }
      : { kind: 'token', secrets: { template: `kapp-lambda/${id}/template` } },
  );

const DISPATCHER = { accessKeyId: 'AKIADISPATCHER', secretAccessKey: 'd-secret', sessionToken: 'd-session' };
const NOW = new Date('2026-12-07T06:00:00Z');
const rec = (clusterId: string, name: string) => clusterTemplateRecord(clusterId, name, 1, `${clusterId}-${name}`);

describe('the dispatcher mints the eks clusters’ run tokens', () => {
  async function dispatchBoth() {
    const store = new MemoryStore();
    for (const id of ['alpha', 'beta']) await store.put(`clusters/${id}.json`, doc(id));
    // As the dispatcher's (`createDispatcherDeps`): documents only, any identity through it refused.
    const refuse = async (): Promise<never> => {
      throw new Error('refused');
    };
    const registry = new StoreClusterRegistry({
      store,
      stage: 'template',
      credentials: refuse,
      secrets: { read: refuse },
    });
    let signed = 0;
    const minter = eksTokenMinter(
      registry,
      async () => {
        signed++;
        return DISPATCHER;
      },
      () => NOW,
    );
    const credentials: RunCredentials = {
      forRun: async (_s, clusterId) => ({
        accessKeyId: `AKIA-RUN-${clusterId}`,
        secretAccessKey: 'run-secret',
        sessionToken: 'run-session',
        expiration: new Date('2030-01-01T00:00:00Z'),
      }),
    };
    const payloads: DispatchedBatch[] = [];
    const dispatch = makeDispatcher('template', {
      credentials,
      invoker: {
        invoke: async (_s, _t, payload) => {
          payloads.push(payload);
          return { batchItemFailures: [] };
        },
      },
      keyring: DISPATCH_KEYRING,
      log: memoryLogger(),
      eksTokens: minter,
    });
    expect(await dispatch({ Records: [rec('alpha', 'x'), rec('beta', 'y')] })).toEqual({ batchItemFailures: [] });
    return { byCluster: new Map(payloads.map((p) => [p.clusterId, p])), signed };
  }

  it("signs one for an eks cluster's batch with the dispatcher's role, for that cluster's EKS name, valid 15 minutes", async () => {
    const { byCluster, signed } = await dispatchBoth();
    const eks = byCluster.get('alpha')?.eksToken;
    expect(eks?.token.startsWith(EKS_TOKEN_PREFIX)).toBe(true);
    expect(eks?.expiresAt).toBe(new Date(NOW.getTime() + EKS_TOKEN_LIFETIME_MS).toISOString());
    const url = decodeEksToken(eks?.token ?? '');
    expect(url.hostname).toBe('sts.eu-west-1.amazonaws.com');
    expect(url.searchParams.get('X-Amz-Credential')).toMatch(/^AKIADISPATCHER\//);
    expect(url.searchParams.get('X-Amz-SignedHeaders')).toBe('host;x-k8s-aws-id');
    expect(signedFor(url, 'eks-alpha', DISPATCHER)).toBe(true);
    expect(signedFor(url, 'beta', DISPATCHER)).toBe(false);
    expect(signed).toBe(1);
  });

  it('signs none for a token cluster', async () => {
    const { byCluster } = await dispatchBoth();
    expect(byCluster.get('beta')).toBeDefined();
    expect(byCluster.get('beta')?.eksToken).toBeUndefined();
  });
});

describe('the stage uses the batch’s token and never signs one', () => {
  const minted = { token: `${EKS_TOKEN_PREFIX}dispatcher-minted`, expiresAt: NOW.getTime() + EKS_TOKEN_LIFETIME_MS };
  const withToken = async (token = minted): Promise<DispatchedBatch> => ({
    ...(await batchOf('alpha', 'a', [rec('alpha', 'x')])),
    eksToken: { token: token.token, expiresAt: new Date(token.expiresAt).toISOString() },
  });

  /** A dispatched stage's registry over a directory holding alpha's (eks) document, and a run-session provider counting its asks. */
  async function stage(now: () => Date) {
    const root = await mkdtemp(join(tmpdir(), 'kapp-lambda-eks-'));
    await mkdir(join(root, 'clusters'));
    await writeFile(join(root, 'clusters', 'alpha.json'), doc('alpha'));
    const holder = new RunCredentialHolder(now);
    let asked = 0;
    const run = async () => {
      asked++;
      return { accessKeyId: 'AKIA-RUN', secretAccessKey: 'run-secret', sessionToken: 'run-session' };
    };
    const { KAPP_LAMBDA_KUBECONFIG: _, ...env } = DISPATCHED_ENV;
    const config = parseLambdaEnv('template', { ...env, KAPP_LAMBDA_CLUSTER_REGISTRY: pathToFileURL(root).href });
    const clients = lazyAwsClients(config, run);
    return { root, holder, config, clients, asked: () => asked };
  }

  it("hands the stage's requests the batch's token, not one signed with the run session", async () => {
    const s = await stage(() => new Date(NOW.getTime() + 1_000));
    try {
      s.holder.accept(await withToken());
      const registry = fleetClusterRegistry(
        { ...s.config, clusterRegistry: s.config.clusterRegistry! },
        s.clients,
        s.holder.eksToken,
      );
      await registry.prepare('alpha');
      const kubeconfig = JSON.parse(registry.runtimeKubeconfig('alpha'));
      expect(kubeconfig.users[0].user.token).toBe(minted.token);
      expect(s.asked()).toBe(0);
    } finally {
      await rm(s.root, { recursive: true, force: true });
    }
  });

  it('fails an eks cluster clearly when its batch carries no token', async () => {
    const s = await stage(() => NOW);
    try {
      const deps = createLambdaDeps(s.config, s.clients, { log: memoryLogger(), tenant: s.holder });
      s.holder.accept(await batchOf('alpha', 'a', [rec('alpha', 'x')]));
      await expect(deps.prepare?.('alpha')).rejects.toThrow(
        /no EKS token for cluster alpha: behind the dispatcher an eks cluster's token comes in its batch, and the stage signs none/,
      );
      expect(s.asked()).toBe(0);
      // With one, the same composition prepares the cluster (and signs nothing).
      s.holder.accept(await withToken());
      await expect(deps.prepare?.('alpha')).resolves.toBeUndefined();
      expect(s.asked()).toBe(0);
    } finally {
      await rm(s.root, { recursive: true, force: true });
    }
  });

  it('uses the token to within seconds of its expiry whatever validity is asked, then refuses it', async () => {
    let now = new Date(NOW.getTime() + 870_000);
    const holder = new RunCredentialHolder(() => now);
    holder.accept(await withToken());
    // 870 s into the run: 30 s left, less than the registry's 10 minutes or a request's 60 s.
    expect((await holder.eksToken.token(10 * 60_000)).token).toBe(minted.token);
    now = new Date(minted.expiresAt - EKS_TOKEN_EXPIRY_MARGIN_MS + 1);
    await expect(holder.eksToken.token()).rejects.toThrow("the dispatcher's EKS token for cluster alpha has expired");
  });

  it('refuses a batch whose token is malformed, and forgets a token the next batch does not carry', async () => {
    const holder = new RunCredentialHolder(() => NOW);
    await expect(
      (async () => holder.accept(await withToken({ token: 'Bearer x', expiresAt: minted.expiresAt })))(),
    ).rejects.toThrow('refused a dispatched batch: malformed EKS token');
    holder.accept(await withToken());
    holder.accept(await batchOf('alpha', 'b', [rec('alpha', 'y')]));
    await expect(holder.eksToken.token()).rejects.toThrow(/no EKS token for cluster alpha/);
  });
});
