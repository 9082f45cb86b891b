/**
 * Scenario 4, forwarder memory: resident set size of a forwarder-only process (bundled
 * `bench/forwarder-rss.ts`, plain `node`) after its initial list of 1,000 and of 10,000 Apps,
 * 100 Apps per namespace, on a control plane of its own (started and stopped here, so the
 * counts are exact). Each App has its inputs: a ytt `valuesFrom` Secret, an `inline.pathsFrom`
 * ConfigMap and a ServiceAccount of its own; and what it deployed: a status like a reconciled
 * App's (conditions, fetch/template/deploy parts with kapp's output, about 6 KB per object)
 * whose `deploy.kapp.associatedResources` names 20 objects over four kinds in two namespaces
 * (`lib/deployed-standin.ts`), so the forwarder runs a metadata-only list+watch per kind by
 * kapp's app label (issue 24 item 6: 200,000 watched objects' metadata at 10,000 Apps). Those
 * 200,000 objects are served by a stand-in in front of the API server with a kube-apiserver's
 * bytes (writing them would take over 20 minutes here); everything else is the real API
 * server's. `syncPeriod: 1h` (writing 10,000 Apps here takes over 10 minutes, so the first
 * thousand would fall due at 10 minutes) and the statuses written after the inputs: nothing is
 * due, the steady state of a fleet cluster.
 *
 * Each count is measured twice: with the V8 flags the forwarder is meant to run with
 * (`--max-semi-space-size=1 --max-old-space-size=64 --no-opt`, events/forwarder/README.md) and with
 * Node's defaults. The figure is RSS once every App, ref and deployed kind is listed and nothing
 * is pending ("synced") and again after 5 s idle ("settled"); the peak is sampled every 50 ms.
 *
 * @module
 */
import { spawn } from 'node:child_process';
import { stat } from 'node:fs/promises';
import path from 'node:path';
import { bundleEntry } from '../../layers/bundle.js';
import { applyCrds } from '../../scripts/local-env.js';
import { startCluster } from '../../test/harness/cluster.js';
import { type BenchContext, scratchDir } from '../lib/context.js';
import { appLabel, STANDIN_KINDS, startDeployedStandIn, workloadNamespace } from '../lib/deployed-standin.js';
import { createAll, kubectlBulk, type Manifest, restFor } from '../lib/kube.js';
import { fmtMs } from '../lib/stats.js';

/** One measurement of the child. */
export interface RssSample {
  apps: number;
  flags: string[];
  /** RSS after the initial sync, bytes. */
  rssSynced: number;
  /** RSS after 5 s idle, bytes. */
  rssSettled: number;
  peakRss: number;
  heapUsed: number;
  /** Start of the child → initial sync done. */
  syncMs: number;
  /** Events the forwarder emitted during the initial sync (Apps are not due: none expected). */
  events: number;
  /** Deployed objects' metadata the forwarder listed (Apps × 20). */
  deployedObjects: number;
}

/** Result of the forwarder-memory scenario. */
export interface ForwarderMemoryResult {
  samples: RssSample[];
  /** Bytes of the bundled child. */
  bundleBytes: number;
  /** Seconds spent creating the objects. */
  populateSeconds: number;
  /** Bytes of one App object as served (with status). */
  appObjectBytes: number;
  /** Bytes of one deployed object's metadata as served in a `PartialObjectMetadataList`, per kind. */
  deployedMetadataBytes: Record<string, number>;
}

const PER_NS = 100;
/** Refs per App: its valuesFrom Secret, pathsFrom ConfigMap and ServiceAccount. */
const REFS_PER_APP = 3;
const DEPLOYED_PER_APP = STANDIN_KINDS.reduce((n, k) => n + k.perApp, 0);

function appNamespace(i: number): string {
  return `mem-${String(Math.floor(i / PER_NS)).padStart(3, '0')}`;
}
/** Placeholder for the status times; replaced by the moment the statuses are written. */
const STATUS_TIME = '__STATUS_TIME__';
/**
 * V8 flags the forwarder runs with (events/forwarder/README.md, infra/forwarder/Containerfile):
 * small young and old generations, and no optimizing compiler (`--no-opt`: TurboFan's compile
 * zones left ~10 MB more RSS after the initial list of 10,000 Apps; the forwarder is I/O bound).
 */
export const FORWARDER_FLAGS = ['--max-semi-space-size=1', '--max-old-space-size=64', '--no-opt'];

function kappOutput(ns: string, name: string): string {
  const lines = [
    "Target cluster 'https://10.96.0.1:443' (nodes: 3)",
    '',
    'Changes',
    '',
    'Namespace  Name  Kind  Age  Op  Op st.  Wait to  Rs  Ri',
    `${ns}  ${name}-config  ConfigMap  -  create  -  reconcile  -  -`,
    '',
    'Op:      1 create, 0 delete, 0 update, 0 noop, 0 exists',
    'Wait to: 1 reconcile, 0 delete, 0 noop',
    '',
  ];
  for (let i = 0; i < 40; i++) {
    lines.push(`1:02:0${i % 10}PM: ---- applying 1 changes [0/1 done] ---- ${ns}/${name} step ${i}`);
  }
  lines.push('1:02:09PM: ---- waiting complete [1/1 done] ----', '', 'Succeeded');
  return lines.join('\n');
}

function population(
  from: number,
  to: number,
): {
  objects: Manifest[];
  statuses: { namespace: string; name: string; status: Record<string, unknown> }[];
  namespaces: Manifest[];
} {
  const objects: Manifest[] = [];
  const statuses: { namespace: string; name: string; status: Record<string, unknown> }[] = [];
  const namespaces: Manifest[] = [];
  const now = STATUS_TIME;
  for (let i = from; i < to; i++) {
    const ns = appNamespace(i);
    if (i % PER_NS === 0) namespaces.push({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: ns } });
    const name = `app-${String(i).padStart(5, '0')}`;
    objects.push(
      {
        apiVersion: 'v1',
        kind: 'Secret',
        metadata: { name: `${name}-values`, namespace: ns },
        type: 'Opaque',
        stringData: { 'secret-values.yml': `#@data/values\n---\npassword: ${'x'.repeat(64)}\n` },
      },
      { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: `${name}-sa`, namespace: ns } },
      {
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata: { name: `${name}-config-values`, namespace: ns },
        data: { 'values.yml': `#@data/values\n---\nreplicas: 2\nimage: registry.example/app:${i}\n` },
      },
      {
        apiVersion: 'kappctrl.k14s.io/v1alpha1',
        kind: 'App',
        metadata: { name, namespace: ns, labels: { team: `team-${i % 20}` } },
        spec: {
          serviceAccountName: `${name}-sa`,
          syncPeriod: '1h0m0s',
          fetch: [
            {
              inline: {
                paths: {
                  'config.yml': `#@ load("@ytt:data", "data")\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ${name}-config\ndata:\n  image: #@ data.values.image\n`,
                },
                pathsFrom: [{ configMapRef: { name: `${name}-config-values` } }],
              },
            },
          ],
          template: [{ ytt: { valuesFrom: [{ secretRef: { name: `${name}-values` } }] } }],
          deploy: [{ kapp: {} }],
        },
      },
    );
    statuses.push({
      namespace: ns,
      name,
      status: {
        observedGeneration: 1,
        conditions: [{ type: 'ReconcileSucceeded', status: 'True', message: '', reason: '' }],
        friendlyDescription: 'Reconcile succeeded',
        usefulErrorMessage: '',
        consecutiveReconcileSuccesses: 1,
        consecutiveReconcileFailures: 0,
        fetch: {
          startedAt: now,
          updatedAt: now,
          exitCode: 0,
          stdout: `apiVersion: vendir.k14s.io/v1alpha1\ndirectories:\n- contents:\n  - inline: {}\n    path: .\n  path: "0"\nkind: LockConfig\n`,
        },
        template: { updatedAt: now, exitCode: 0 },
        deploy: {
          startedAt: now,
          updatedAt: now,
          exitCode: 0,
          finished: true,
          stdout: kappOutput(ns, name),
          kapp: {
            associatedResources: {
              label: `kapp.k14s.io/app=${appLabel(i)}`,
              namespaces: [ns, workloadNamespace(i)],
              groupKinds: STANDIN_KINDS.map((k) => ({ group: k.group, kind: k.kind })),
            },
          },
        },
      },
    });
  }
  return { objects, statuses, namespaces };
}

async function runChild(
  bundle: string,
  kubeconfig: string,
  context: string,
  apps: number,
  flags: string[],
): Promise<RssSample> {
  const lines = await new Promise<string[]>((resolve, reject) => {
    const child = spawn(
      process.execPath,
      [
        ...flags,
        bundle,
        kubeconfig,
        context,
        String(apps),
        String(apps * REFS_PER_APP),
        String(apps ? STANDIN_KINDS.length : 0),
      ],
      { stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      err = (err + d.toString()).slice(-4000);
    });
    child.on('error', reject);
    child.on('close', (code) => {
      if (code === 0) resolve(out.trim().split('\n'));
      else reject(new Error(`forwarder-rss exited ${code}: ${err.trim()}`));
    });
  });
  const [synced, settled] = lines.map((l) => JSON.parse(l) as Record<string, number>);
  return {
    apps,
    flags,
    rssSynced: synced!.rss!,
    rssSettled: settled!.rss!,
    peakRss: settled!.peakRss!,
    heapUsed: settled!.heapUsed!,
    syncMs: synced!.syncMs!,
    events: synced!.events!,
    deployedObjects: apps * DEPLOYED_PER_APP,
  };
}

/**
 * Runs the forwarder-memory scenario (its own control plane; about 15 minutes on a shared
 * 2-core machine, most of it writing 50,000 objects: Apps, their three refs, statuses).
 * @throws Error when the cluster cannot start, an object cannot be created, or the child fails.
 */
export async function forwarderMemory(
  ctx: BenchContext,
  counts: readonly number[] = [1000, 10_000],
): Promise<ForwarderMemoryResult> {
  const dir = await scratchDir(ctx, 'forwarder-memory');
  const bundle = path.join(dir, 'forwarder-rss.mjs');
  await bundleEntry(path.join(import.meta.dirname, '..', 'forwarder-rss.ts'), bundle);
  ctx.say('forwarder-memory: starting a control plane of its own');
  const cluster = await startCluster({ log: ctx.say });
  const context = `kwok-${cluster.name}`;
  const standIn = await startDeployedStandIn({
    kubeconfigPath: cluster.kubeconfigPath,
    context,
    childKubeconfigPath: path.join(dir, 'standin.kubeconfig'),
    appNamespace,
  }).catch(async (err: unknown) => {
    await cluster.stop();
    throw err;
  });
  try {
    await applyCrds(cluster.kubeconfigPath);
    const rest = restFor(cluster.kubeconfigPath);
    const samples: RssSample[] = [];
    let have = 0;
    let populateMs = 0;
    for (const n of counts) {
      const t0 = performance.now();
      const p = population(have, n);
      await createAll(rest, p.namespaces, 8);
      await kubectlBulk(cluster.kubeconfigPath, ['create'], p.objects);
      // "Reconciled" after its Secret and ConfigMap were written (status times have second
      // precision and a ref written in the same second counts as changed), so nothing is due.
      await new Promise((r) => setTimeout(r, 1100));
      const reconciledAt = new Date().toISOString().replace(/\.\d+Z$/, 'Z');
      await kubectlBulk(
        cluster.kubeconfigPath,
        [
          'apply',
          '--server-side',
          '--subresource=status',
          '--field-manager=bench',
          '--force-conflicts',
          '--validate=false',
        ],
        p.statuses.map((x) =>
          JSON.parse(
            JSON.stringify({
              apiVersion: 'kappctrl.k14s.io/v1alpha1',
              kind: 'App',
              metadata: { name: x.name, namespace: x.namespace },
              status: x.status,
            }).replaceAll(STATUS_TIME, reconciledAt),
          ),
        ),
      );
      populateMs += performance.now() - t0;
      ctx.say(
        `forwarder-memory: ${n} Apps (+${(n - have) * REFS_PER_APP} Secrets/ConfigMaps/ServiceAccounts, ${n * DEPLOYED_PER_APP} deployed objects served) present after ${fmtMs(populateMs)}`,
      );
      have = n;
      standIn.apps = n;
      for (const flags of [FORWARDER_FLAGS, []]) {
        const s = await runChild(bundle, standIn.kubeconfigPath, context, n, flags);
        ctx.say(
          `forwarder-memory: ${n} Apps ${flags.length ? 'with' : 'without'} V8 flags: RSS ${(s.rssSynced / 1048576).toFixed(1)} MiB synced, ${(s.rssSettled / 1048576).toFixed(1)} MiB settled, peak ${(s.peakRss / 1048576).toFixed(1)} MiB, sync ${fmtMs(s.syncMs)}`,
        );
        samples.push(s);
      }
    }
    const one = await rest.send({
      method: 'GET',
      path: '/apis/kappctrl.k14s.io/v1alpha1/namespaces/mem-000/apps/app-00000',
    });
    const deployedMetadataBytes: Record<string, number> = {};
    standIn.apps = Math.max(1, standIn.apps);
    for (const k of STANDIN_KINDS) {
      const res = await fetch(
        `${standIn.url}/${k.group ? `apis/${k.group}` : 'api'}/${k.version}/${k.resource}?labelSelector=kapp.k14s.io%2Fapp&limit=1`,
      );
      const list = (await res.json()) as { items: unknown[] };
      deployedMetadataBytes[k.kind] = JSON.stringify(list.items[0]).length;
    }
    return {
      samples,
      bundleBytes: (await stat(bundle)).size,
      populateSeconds: populateMs / 1000,
      appObjectBytes: JSON.stringify(one.body).length,
      deployedMetadataBytes,
    };
  } finally {
    await standIn.close();
    await cluster.stop();
  }
}
