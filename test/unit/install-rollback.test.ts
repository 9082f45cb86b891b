/**
 * The rollback annotations a rollout's rollback puts on a PackageInstall's App
 * (`withRollback`, `functions/lib/pipeline/install/rollback.ts`): the generation the write gives
 * it (one more when the spec changes), and a rollback to the same receipt renewed when the App
 * moved on meanwhile (a newer version came and failed), left alone when it holds.
 */
import { describe, expect, it } from 'vitest';
import type { RawApp } from '../../functions/lib/packaging/app-from-package.js';
import { rollbackReceipt, withRollback } from '../../functions/lib/pipeline/install/rollback.js';
import { receiptKey } from '../../functions/lib/receipt/receipt.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { StoreError } from '../../functions/lib/store/port.js';
import { putReceipt } from '../harness/receipt-fixture.js';

const TO = 'kapp-lambda.carvel.dev/rollback-to';
const GEN = 'kapp-lambda.carvel.dev/rollback-generation';
const app = (generation: number, config: string, annotations: Record<string, string> = {}): RawApp => ({
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  kind: 'App',
  metadata: { name: 'a', namespace: 'ns', uid: 'u', resourceVersion: '1', generation, annotations },
  spec: { fetch: [{ inline: { paths: { 'config.yml': config } } }] },
});

describe('withRollback', () => {
  it('names the receipt for the generation the write gives: one more when the spec changes, the same when not', () => {
    const failed = app(4, 'broken');
    expect(withRollback(app(4, 'good'), failed, 'r1').metadata.annotations).toEqual({ [TO]: 'r1', [GEN]: '5' });
    expect(withRollback(app(4, 'broken'), failed, 'r1').metadata.annotations).toEqual({ [TO]: 'r1', [GEN]: '4' });
  });

  it('leaves an App rolled back to that receipt for its generation; renews one the App moved on from', () => {
    const held = app(5, 'good', { [TO]: 'r1', [GEN]: '5' });
    const desired = app(5, 'good', { [TO]: 'r1', [GEN]: '5' });
    expect(withRollback(desired, held, 'r1')).toBe(desired);
    // A newer version came (generation 6) and failed: back again, to the same receipt, for generation 7.
    const movedOn = app(6, 'broken', { [TO]: 'r1', [GEN]: '5' });
    expect(withRollback(app(6, 'good', { [TO]: 'r1', [GEN]: '5' }), movedOn, 'r1').metadata.annotations).toEqual({
      [TO]: 'r1',
      [GEN]: '7',
    });
  });
});

describe('rollbackReceipt', () => {
  it('takes a sealed render (private/, which a dispatched install session cannot read) as stored; checks a shared one', async () => {
    class Session extends MemoryStore {
      override async head(key: string) {
        if (key.startsWith('private/')) throw new StoreError('Access Denied', 'head', key);
        return await super.head(key);
      }
    }
    const store = new Session();
    const owner = { clusterId: 'c1', namespace: 'ns', name: 'inst' };
    const at = '2026-12-07T08:00:00.000Z';
    const put = (id: string, render: string) =>
      putReceipt(store, owner, id, { generation: 1, startedAt: at, endedAt: at, outcome: 'succeeded', render });
    await put('20261207-000000-000-aaaaaaaa', `private/${'0'.repeat(32)}/template/sha256/${'a'.repeat(64)}.yaml`);
    expect(await rollbackReceipt(store, owner, 1)).toBe('20261207-000000-000-aaaaaaaa');
    // A newer receipt whose shared render is gone is passed over; one whose render is there is taken.
    const shared = `artifacts/template/sha256/${'b'.repeat(64)}.yaml`;
    await put('20261207-000001-000-bbbbbbbb', shared);
    expect(await rollbackReceipt(store, owner, 1)).toBe('20261207-000000-000-aaaaaaaa');
    await store.put(shared, 'kind: ConfigMap\n');
    expect(await rollbackReceipt(store, owner, 1)).toBe('20261207-000001-000-bbbbbbbb');
    // A newer receipt naming an object of the bucket that is no render (planted by a tenant run) is passed over.
    await store.put('clusters/other.json', '{}');
    await put('20261207-000002-000-cccccccc', 'clusters/other.json');
    expect(await rollbackReceipt(store, owner, 1)).toBe('20261207-000001-000-bbbbbbbb');
  });

  it("names the receipt a rollback deployed, not the rollback's own receipt: a rolled-back App keeps the receipt it names", async () => {
    // The App was rolled back to R3 (generation 3's render) as generation 7; the rollback's run
    // kept receipt R7 (rollbackOf R3, the same render). Once healthy there, the fleet entry's
    // last good generation is 7: the next run must still name R3, or it rewrites the App's
    // rollback annotation (another App run; the receipt named changes under its reader).
    const store = new MemoryStore();
    const owner = { clusterId: 'c1', namespace: 'ns', name: 'inst' };
    const at = '2026-12-07T08:00:00.000Z';
    const render = `artifacts/template/sha256/${'c'.repeat(64)}.yaml`;
    await store.put(render, 'kind: ConfigMap\n');
    const r3 = '20261207-000003-000-33333333';
    const r7 = '20261207-000007-000-77777777';
    const r9 = '20261207-000009-000-99999999';
    await putReceipt(store, owner, r3, { generation: 3, startedAt: at, endedAt: at, render });
    await putReceipt(store, owner, '20261207-000005-000-55555555', {
      generation: 5,
      startedAt: at,
      endedAt: at,
      outcome: 'failed',
    });
    await putReceipt(store, owner, r7, { generation: 7, startedAt: at, endedAt: at, render, rollbackOf: r3 });
    expect(await rollbackReceipt(store, owner, 3)).toBe(r3);
    expect(await rollbackReceipt(store, owner, 7)).toBe(r3);
    // A rollback of a rollback (kapp ran again): the chain leads to R3.
    await putReceipt(store, owner, r9, { generation: 9, startedAt: at, endedAt: at, render, rollbackOf: r7 });
    expect(await rollbackReceipt(store, owner, 9)).toBe(r3);
    // R3 pruned (the App keeps its newest receipts): the oldest left of the chain, which holds the render.
    await store.delete(receiptKey(owner, r3));
    expect(await rollbackReceipt(store, owner, 9)).toBe(r7);
    // A receipt that names another render is not the same deploy: taken as it is.
    const other = `artifacts/template/sha256/${'d'.repeat(64)}.yaml`;
    await store.put(other, 'kind: ConfigMap\n');
    await putReceipt(store, owner, '20261207-000010-000-aaaaaaaa', {
      generation: 10,
      startedAt: at,
      endedAt: at,
      render: other,
      rollbackOf: r9,
    });
    expect(await rollbackReceipt(store, owner, 10)).toBe('20261207-000010-000-aaaaaaaa');
  });
});
