/**
 * ATTACK (review of lease/gate.ts): a lease an optimistic run takes back through
 * `OptimisticRun.verify` (its status write, `own` → `#retake` → `RunLeases.acquire`) is never
 * known to the `RunGate`: `gate.end()` finds `#lease` unset and ends nothing, nothing renews it.
 * The App's lease stays held by a finished run for the TTL; every object event meanwhile is
 * coalesced into a pending follow-up that nobody sends.
 *
 * Sequence: optimistic deploy (drift) claims the lease and fails (infra) → freed with last=run;
 * the drift is reverted; the SQS retry of the same record is idle, writes only its status.
 */
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { deployEvent, type KappEvent, objectEvent, type StageRun, serializeEvent } from '../../events/schema.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { fetchArtifactKey } from '../../functions/lib/artifact/keys.js';
import { makeSqsHandler } from '../../functions/lib/entry/handler.js';
import { ABSENT_LEASE, leaseKey, parseLease, RunLeases } from '../../functions/lib/lease/index.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { MemoryEventSender } from '../../functions/lib/transport/index.js';
import {
  appObject,
  appWorld,
  FETCH_PART,
  MANIFEST,
  MANIFEST_KEY,
  NOW,
  REF,
  RUN,
  SUCCEEDED_BEFORE,
  TEMPLATE_PART,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('attack-lease-retake-');
const KEY = leaseKey(REF);
const LIVE = {
  metadata: {
    name: 'cm',
    namespace: REF.namespace,
    uid: 'cm-uid',
    resourceVersion: '5',
    managedFields: [{ manager: 'kapp', operation: 'Update', time: '2024-12-31T00:00:00Z' }],
  },
  data: { a: '1' },
};
const DRIFTED = { ...LIVE, metadata: { ...LIVE.metadata, resourceVersion: '7' }, data: { a: 'hand' } };
const CM_LIST = `/api/v1/namespaces/${REF.namespace}/configmaps`;
const record = (event: KappEvent, messageId: string, receiveCount: number) => ({
  Records: [{ messageId, body: serializeEvent(event), attributes: { ApproximateReceiveCount: String(receiveCount) } }],
});
const deployOf = (run: StageRun) =>
  deployEvent(
    {
      object: REF,
      run,
      artifacts: { fetchKey: fetchArtifactKey('f'.repeat(64)), manifestKey: MANIFEST_KEY },
      fetchStatus: FETCH_PART,
      templateStatus: TEMPLATE_PART,
    },
    { time: NOW },
  );

describe('ATTACK run gate: a lease retaken by verify() is never ended', () => {
  it('an idle retry after its own failed claim leaves the lease held; the next App change is parked', async () => {
    let live: unknown[] = [LIVE];
    const w = appWorld({
      app: appObject({ status: SUCCEEDED_BEFORE }),
      tmpRoot: path.join(tempDir(), 'scratch'),
      extra: {
        keyring: new DerivedKeyring(Buffer.alloc(32, 7)),
        appReader: () => ({
          send: async (req) =>
            req.path === '/api/v1'
              ? { statusCode: 200, body: { resources: [{ name: 'configmaps', kind: 'ConfigMap', namespaced: true }] } }
              : req.path === CM_LIST
                ? { statusCode: 200, body: { items: live } }
                : { statusCode: 404, body: {} },
        }),
      },
    });
    let failKapp = false;
    w.runner.on('kapp', async (req) => {
      if (failKapp) {
        failKapp = false;
        throw new Error('kapp could not start');
      }
      const file = req.args[req.args.indexOf('--app-metadata-file-output') + 1] as string;
      await writeFile(
        file,
        `labelKey: kapp.k14s.io/app\nlabelValue: "123"\nlastChange: {namespaces: [${REF.namespace}]}\nusedGKs: [{Group: "", Kind: ConfigMap}]\n`,
      );
      return { stdout: 'Succeeded' };
    });
    await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
    await dispatchEvent(deployOf(RUN), w.deps); // first deploy: the record the resyncs reuse
    const leases = new RunLeases({ store: w.store, now: () => new Date(NOW) });
    const sender = new MemoryEventSender();
    const deps = { pipeline: w.deps, sender, log: w.log, leases };
    const deployFn = makeSqsHandler('deploy', () => deps);
    const fetchFn = makeSqsHandler('fetch', () => deps);

    // Attempt 1: drift → claim → kapp fails → record retried, lease freed (last = the run).
    live = [DRIFTED];
    failKapp = true;
    const event = deployOf({ ...RUN, lease: ABSENT_LEASE });
    expect(await deployFn(record(event, 'a1', 1))).toEqual({ batchItemFailures: [{ itemIdentifier: 'a1' }] });
    expect(parseLease(await w.store.get(KEY))).toMatchObject({ last: `run:${RUN.runId}` });

    // The drift is gone; attempt 2 is idle: only its status write (verify → own → retake).
    live = [LIVE];
    expect(await deployFn(record(event, 'a1', 2))).toEqual({ batchItemFailures: [] });
    expect(w.outcomes().at(-1)).toEqual(['deploy', 'cached']);

    // The record is done: the lease must be free.
    const after = parseLease(await w.store.get(KEY));
    expect.soft(after.holder, `lease left held: ${JSON.stringify(after)}`).toBeUndefined();

    // And a user's change to the App must run, not be parked behind a finished run.
    const edit = objectEvent({ ...REF, resourceVersion: '9' }, 'added', { time: NOW });
    await fetchFn(record(edit, 'e1', 1)); // runs (or fails on its own fetch): anything but coalesced
    expect(
      parseLease(await w.store.get(KEY)).pending?.id,
      'the edit was parked as a follow-up of the finished run',
    ).toBeUndefined();
  });
});
