/**
 * e2e: reconcile receipts and the rollback (issue 12 item 4) on the local control plane with the
 * real tools and the embedded runtime's own store: an App reconciled with two inline contents
 * leaves a receipt per reconcile (`npm run receipts -- list`); `rollback` to the first deploys
 * the first render (no fetch, no template) with kapp-controller's status shape; a spec change
 * then ends the rollback.
 */
import { describe, expect, it } from 'vitest';
import { ROLLBACK_TO_ANNOTATION } from '../../functions/lib/pipeline/app/receipts.js';
import { listReceipts } from '../../functions/lib/receipt/receipt.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { main, REAL_IO } from '../../scripts/receipts.js';
import {
  type AppObject,
  apply,
  expectSucceeded,
  getApp,
  getObject,
  inlineConfigMapApp,
  kubeconfigPath,
  succeededAt,
  suffix,
  useE2ERuntime,
} from './support.js';

const ns = `e2e-receipts-${suffix()}`;
const rt = useE2ERuntime([ns]);

/** Runs `npm run receipts -- <argv>` in process against the runtime's store and the test cluster. */
async function receipts(argv: string[]): Promise<{ code: number; out: string; err: string }> {
  let out = '';
  let err = '';
  const code = await main(
    [...argv, '--store', `file://${rt.root}/store`, '--kubeconfig', kubeconfigPath],
    {},
    { ...REAL_IO, out: (t) => (out += t), err: (t) => (err += t) },
  );
  return { code, out, err };
}

/** The greeting the App's ConfigMap holds now. */
async function greeting(name: string): Promise<string | undefined> {
  return (await getObject<{ data?: { greeting?: string } }>('configmap', ns, `${name}-config`))?.data?.greeting;
}

describe('receipts and rollback', () => {
  it('lists a receipt per reconcile, rolls back to the first render, and a spec change ends the rollback', async () => {
    const name = 'receipted';
    await apply(inlineConfigMapApp(ns, name, 'one'));
    const first = await rt.waitForApp(ns, name, succeededAt(1), 'generation 1 succeeded');
    await expectSucceeded(first);
    await apply(inlineConfigMapApp(ns, name, 'two'));
    const second = await rt.waitForApp(ns, name, succeededAt(2), 'generation 2 succeeded');
    await expectSucceeded(second);
    expect(await greeting(name)).toBe('two');
    await rt.runtime.pipeline.idle();

    // one receipt per reconcile: generation 1 and 2, each with vendir, ytt and kapp
    const listed = await receipts(['list', `${ns}/${name}`]);
    expect(listed.code, listed.err).toBe(0);
    const lines = listed.out.trim().split('\n');
    expect(lines[0]).toMatch(/^RECEIPT\s+TIME\s+GEN\s+OUTCOME\s+FETCH\s+RENDER\s+TOOLS\s+DURATION\s+COST$/);
    const clusterId = rt.runtime.registry.clusterIds()[0] ?? '';
    const stored = await listReceipts(new LocalDirStore(`${rt.root}/store`), { clusterId, namespace: ns, name });
    const byGen = (g: number) => stored.filter((r) => r.generation === g && r.outcome === 'succeeded');
    const [gen1] = byGen(1);
    const [gen2] = byGen(2);
    expect(gen1, JSON.stringify(stored)).toBeDefined();
    expect(gen2).toBeDefined();
    for (const r of [gen1, gen2]) {
      expect(listed.out).toContain(r?.id);
      expect(r?.tools.map((t) => t.tool)).toEqual(['vendir', 'ytt', 'kapp']);
      expect(r?.stages.map((s) => s.stage)).toEqual(['fetch', 'template', 'deploy']);
      expect(r?.store.put).toBeGreaterThanOrEqual(1);
      expect(r?.cost.usd).toBeGreaterThan(0);
    }
    expect(gen1?.inputs.render?.key).not.toBe(gen2?.inputs.render?.key);

    // rollback to generation 1's render: the first ConfigMap again, status as kapp-controller's
    const rolled = await receipts(['rollback', `${ns}/${name}`, gen1?.id ?? '']);
    expect(rolled.code, rolled.err).toBe(0);
    const back = await waitGreeting(name, 'one');
    expect(back).toBe('one');
    const afterRollback = await rt.waitForApp(
      ns,
      name,
      (a) => succeededAt(2)(a) && (a.metadata.annotations?.[ROLLBACK_TO_ANNOTATION] ?? '') === gen1?.id,
      'rolled back and succeeded',
    );
    await expectSucceeded(afterRollback);
    expect(afterRollback.metadata.generation).toBe(2);
    await rt.runtime.pipeline.idle();
    const rollbackReceipt = (
      await listReceipts(new LocalDirStore(`${rt.root}/store`), { clusterId, namespace: ns, name })
    ).find((r) => r.rollbackOf === gen1?.id);
    expect(rollbackReceipt?.inputs.render?.key).toBe(gen1?.inputs.render?.key);
    expect(rollbackReceipt?.tools.map((t) => t.tool)).toEqual(['kapp']);
    const marked = await receipts(['list', `${ns}/${name}`]);
    expect(marked.out).toContain(`*${gen1?.id}`);

    // a spec change (generation 3) ends the rollback: the spec's render is deployed
    await apply(inlineConfigMapApp(ns, name, 'three'));
    const third: AppObject = await rt.waitForApp(ns, name, succeededAt(3), 'generation 3 succeeded');
    await expectSucceeded(third);
    expect(await greeting(name)).toBe('three');

    // clearing the (now inactive) rollback leaves the App on its spec
    const cleared = await receipts(['rollback', `${ns}/${name}`, '--clear']);
    expect(cleared.code, cleared.err).toBe(0);
    const app = await getApp(ns, name);
    expect(app?.metadata.annotations?.[ROLLBACK_TO_ANNOTATION]).toBe(''); // cleared, key kept
    await rt.runtime.pipeline.idle();
    expect(await greeting(name)).toBe('three');
  });
});

/** Waits until the App's ConfigMap holds `want`. */
async function waitGreeting(name: string, want: string): Promise<string | undefined> {
  const deadline = Date.now() + 120_000;
  for (;;) {
    const g = await greeting(name);
    if (g === want || Date.now() > deadline) return g;
    await new Promise((r) => setTimeout(r, 500));
  }
}
