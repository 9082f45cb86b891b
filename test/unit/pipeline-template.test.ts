/**
 * The template stage over its outcomes (review R6): one row per outcome, each asserting the exact
 * status writes, the exact next event (deploy) and the stage's logged outcome. Called through
 * `dispatchEvent` with a template event. Faked at the ports: the shared fake cluster, the fake
 * runner (ytt), a memory store holding the fetch artifact.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { deployEvent, templateEvent } from '../../events/schema.js';
import type { AppStatus } from '../../functions/lib/api/index.js';
import type { StageStatusSummary } from '../../functions/lib/api/status.js';
import { fetchArtifactKey, sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import type { ScriptedResult } from '../../functions/lib/exec/fake.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import {
  type AppShape,
  type AppWorld,
  appObject,
  appWorld,
  changeApp,
  finalFailed,
  NOW,
  openStopRows,
  putFetchArtifact,
  RECONCILING,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('pipeline-template-');

const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
/** The fetch part the fetch stage handed on. */
const FETCH_PART: StageStatusSummary = { exitCode: 0, stdout: 'lock: vendir\n', startedAt: NOW, updatedAt: NOW };
const YTT_FAILED = 'Templating dir: Error (see .status.usefulErrorMessage for details)';
const NO_CM = 'Preparing template values: configmaps "vals" not found';

interface Row {
  /** The App in the cluster; `null`: none. */
  app: AppShape | null;
  /** Scripts ytt (default: prints {@link MANIFEST}). */
  ytt?: (w: AppWorld) => ScriptedResult | (() => Promise<ScriptedResult>);
  /** Runs the stage once before the row (a warm render cache, same store). */
  warm?: boolean;
  /** Leaves the fetch artifact out of the store. */
  noArtifact?: boolean;
  statuses: AppStatus[];
  /** Whether the deploy stage is handed the manifest (its event is then checked exactly). */
  next: boolean;
  outcome: string;
  tools: string[];
}

const rows: Record<string, Row> = {
  'succeeded, deferred (resync run): nothing written, both parts ride the deploy event': {
    app: { status: SUCCEEDED_BEFORE },
    statuses: [],
    next: true,
    outcome: 'succeeded',
    tools: ['ytt'],
  },
  'succeeded, immediate (Reconciling): the fetch and template parts are written now': {
    app: { status: RECONCILING },
    statuses: [{ ...RECONCILING, fetch: FETCH_PART, template: { exitCode: 0, updatedAt: NOW } } as AppStatus],
    next: true,
    outcome: 'succeeded',
    tools: ['ytt'],
  },
  'cached: the same inputs rendered before run no tool': {
    app: { status: SUCCEEDED_BEFORE },
    warm: true,
    statuses: [],
    next: true,
    outcome: 'cached',
    tools: [],
  },
  'failed: ytt exits 1, the final status is written (even when deferred)': {
    app: { status: SUCCEEDED_BEFORE },
    ytt: () => ({ stderr: 'ytt: Error: unknown key', exitCode: 1 }),
    statuses: [
      finalFailed(YTT_FAILED, 'ytt: Error: unknown key', {
        fetch: FETCH_PART,
        template: { exitCode: 1, stderr: 'ytt: Error: unknown key', error: YTT_FAILED, updatedAt: NOW },
      } as Partial<AppStatus>),
    ],
    next: false,
    outcome: 'failed',
    tools: ['ytt'],
  },
  'invalid: a values ConfigMap that does not exist fails before ytt runs': {
    app: {
      status: SUCCEEDED_BEFORE,
      spec: { template: [{ ytt: { valuesFrom: [{ configMapRef: { name: 'vals' } }] } }] },
    },
    statuses: [
      finalFailed(NO_CM, NO_CM, {
        fetch: FETCH_PART,
        template: { exitCode: -1, error: NO_CM, updatedAt: NOW },
      } as Partial<AppStatus>),
    ],
    next: false,
    outcome: 'failed',
    tools: [],
  },
  ...openStopRows({ next: false }),
  'stale at close, immediate: the spec changed while ytt ran, the write is dropped': {
    app: { status: RECONCILING },
    ytt: (w) => async () => {
      changeApp(w, 'generation');
      return { stdout: MANIFEST };
    },
    statuses: [],
    next: false,
    outcome: 'stale',
    tools: ['ytt'],
  },
};

async function templateOnce(row: Row, store: MemoryStore, fetchKey: string) {
  const w = appWorld({
    ...(row.app ? { app: appObject(row.app) } : {}),
    store,
    tmpRoot: path.join(tempDir(), 'scratch'),
  });
  const ytt = row.ytt?.(w) ?? { stdout: MANIFEST };
  w.runner.on('ytt', typeof ytt === 'function' ? () => ytt() : ytt);
  const data = { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: FETCH_PART };
  const next = await dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps);
  return { w, next, data };
}

describe('template stage table', () => {
  it.each(Object.entries(rows))('%s', async (_name, row) => {
    const store = new MemoryStore();
    const fetchKey = row.noArtifact ? fetchArtifactKey('0'.repeat(64)) : await putFetchArtifact(store, tempDir());
    if (row.warm) await templateOnce(row, store, fetchKey);
    const { w, next, data } = await templateOnce(row, store, fetchKey);
    expect(w.statuses()).toEqual(row.statuses);
    const manifestKey = templateArtifactKey(sha256Hex(MANIFEST));
    expect(next).toEqual(
      row.next
        ? deployEvent(
            { ...data, artifacts: { fetchKey, manifestKey }, templateStatus: { exitCode: 0, updatedAt: NOW } },
            { time: new Date(NOW) },
          )
        : undefined,
    );
    if (row.next) expect((await store.get(manifestKey))?.toString()).toBe(MANIFEST);
    expect(w.outcomes()).toEqual([['template', row.outcome]]);
    expect(w.tools()).toEqual(row.tools);
  });

  it('a fetch artifact missing from the store: the stage throws (restart), writes nothing, runs nothing', async () => {
    const store = new MemoryStore();
    await expect(
      templateOnce(
        rows['succeeded, deferred (resync run): nothing written, both parts ride the deploy event']!,
        store,
        fetchArtifactKey('0'.repeat(64)),
      ),
    ).rejects.toThrow(`fetch artifact ${fetchArtifactKey('0'.repeat(64))} is missing from the object store`);
  });
});

describe('template stage: scratch paths in status', () => {
  it("shows a tool error's scratch path by its stable stand-in, and nothing else of the status changes", async () => {
    const store = new MemoryStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const tmpRoot = path.join(tempDir(), 'scratch');
    const w = appWorld({ app: appObject({ status: SUCCEEDED_BEFORE }), store, tmpRoot });
    let seen = '';
    w.runner.on('ytt', (req) => {
      seen = req.args[req.args.indexOf('-f') + 1] ?? '';
      return { stderr: `ytt: Error: open ${seen}/etc/passwd: no such file or directory`, exitCode: 1 };
    });
    const data = { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: FETCH_PART };
    await dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps);
    // ytt read the real scratch directory; status shows `/tmp/kapp-lambda-template/…` instead.
    expect(seen.startsWith(`${tmpRoot}/template-`)).toBe(true);
    const shown = `ytt: Error: open /tmp/kapp-lambda-template${seen.slice(seen.indexOf('/', tmpRoot.length + 1))}/etc/passwd: no such file or directory`;
    expect(w.statuses()).toEqual([
      finalFailed(YTT_FAILED, shown, {
        fetch: FETCH_PART,
        template: { exitCode: 1, stderr: shown, error: YTT_FAILED, updatedAt: NOW },
      } as Partial<AppStatus>),
    ]);
  });
});

describe('template stage: the cap on referenced Secrets and ConfigMaps', () => {
  it('valuesFrom over the cap: the status names the object that passed it, none after it is read, ytt never runs, no value shown', async () => {
    const store = new MemoryStore();
    const fetchKey = await putFetchArtifact(store, tempDir());
    const names = ['v1', 'v2', 'v3'];
    const w = appWorld({
      app: appObject({
        status: SUCCEEDED_BEFORE,
        spec: { template: [{ ytt: { valuesFrom: names.map((name) => ({ secretRef: { name } })) } }] },
      }),
      store,
      tmpRoot: path.join(tempDir(), 'scratch'),
      config: { maxInlineBytes: 150 },
    });
    const reads: string[] = [];
    for (const name of names) {
      w.cluster.secrets.set(`${REF.namespace}/${name}`, {
        metadata: { name, namespace: REF.namespace, uid: `uid-${name}`, resourceVersion: '1' },
        type: 'Opaque',
        data: { k: Buffer.from(`secret-value-${'x'.repeat(86)}`) },
      });
    }
    const getSecret = w.cluster.getSecret.bind(w.cluster);
    w.cluster.getSecret = async (ns, name) => {
      reads.push(name);
      return getSecret(ns, name);
    };
    w.runner.on('ytt', { stdout: MANIFEST });
    const data = { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: FETCH_PART };
    const next = await dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps);
    const message = `Templating: secret "v2" brings the App's referenced Secrets and ConfigMaps to 200 bytes, over the limit of 150 bytes`;
    expect(next).toBeUndefined();
    expect(w.statuses()).toEqual([
      finalFailed(message, message, {
        fetch: FETCH_PART,
        template: { exitCode: -1, error: message, updatedAt: NOW },
      } as Partial<AppStatus>),
    ]);
    expect(reads).toEqual(['v1', 'v2']);
    expect(w.tools()).toEqual([]);
    expect(JSON.stringify(w.statuses())).not.toContain('secret-value-');
  });
});
