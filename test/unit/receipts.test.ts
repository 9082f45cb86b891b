import { describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { appRollbackChangeKey } from '../../events/forwarder/kinds.js';
import { templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import type { CommandRunner, RunRequest, RunResult } from '../../functions/lib/exec/runner.js';
import type { RestRequest, RestResponse } from '../../functions/lib/kube/transport.js';
import { memoryLogger } from '../../functions/lib/log.js';
import {
  activeRollback,
  ROLLBACK_GENERATION_ANNOTATION,
  ROLLBACK_TO_ANNOTATION,
  receiptOnEnd,
  trailWith,
} from '../../functions/lib/pipeline/app/receipts.js';
import type { PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import { StageMeter } from '../../functions/lib/receipt/meter.js';
import { AWS_PRICES_USD } from '../../functions/lib/receipt/prices.js';
import {
  buildReceipt,
  estimateCostUsd,
  keepReceipt,
  listReceipts,
  MAX_RECEIPT_BYTES,
  noRequests,
  RECEIPTS_KEPT,
  type Receipt,
  type ReceiptTrail,
  readReceipt,
  receiptId,
  receiptKey,
  receiptPrefix,
  receiptSchema,
} from '../../functions/lib/receipt/receipt.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { formatReceipts, main, type ReceiptsIo, rollbackPatch } from '../../scripts/receipts.js';

const OWNER = { clusterId: 'home', namespace: 'team-a', name: 'web' };
const RENDER = templateArtifactKey('b'.repeat(64));
const FETCH = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;
const PRIVATE_RENDER = `private/${'1'.repeat(32)}/${'2'.repeat(32)}/template/${'3'.repeat(64)}.yaml`;

const TRAIL: ReceiptTrail = {
  stages: [
    {
      stage: 'fetch',
      ms: 1200,
      tools: [{ tool: 'vendir', ms: 800, exitCode: 0 }],
      store: { ...noRequests(), get: 1, put: 2 },
    },
    {
      stage: 'template',
      ms: 900,
      tools: [{ tool: 'ytt', ms: 400, exitCode: 0 }],
      store: { ...noRequests(), get: 2, put: 2, head: 1 },
    },
    {
      stage: 'deploy',
      ms: 1500,
      tools: [{ tool: 'kapp', ms: 1300, exitCode: 0 }],
      store: { ...noRequests(), get: 1 },
    },
  ],
  renderInputHash: 'c'.repeat(64),
};

function receiptAt(ms: number, overrides: Partial<Parameters<typeof buildReceipt>[0]> = {}): Receipt {
  return buildReceipt({
    owner: OWNER,
    uid: 'uid-1',
    generation: 1,
    runId: `run-${ms}`,
    startedAt: new Date(Date.UTC(2026, 11, 2, 9, 0, 0) + ms),
    endedAt: new Date(Date.UTC(2026, 11, 2, 9, 0, 4) + ms),
    trail: TRAIL,
    fetch: { key: FETCH, digest: 'a'.repeat(64), private: false },
    render: { key: RENDER, digest: 'b'.repeat(64), private: false },
    ...overrides,
  });
}

describe('receipt keys', () => {
  it('are under receipts/<cluster>/<namespace>/<name>/ and sort by the run start', () => {
    const early = receiptId(new Date('2026-12-02T09:05:01.002Z'), 'r1');
    const late = receiptId(new Date('2026-12-02T10:00:00.000Z'), 'r0');
    expect(early).toMatch(/^20261202-090501-002-[0-9a-f]{8}$/);
    expect(early < late).toBe(true);
    expect(receiptKey(OWNER, early)).toBe(`receipts/home/team-a/web/${early}.json`);
    expect(receiptPrefix(OWNER)).toBe('receipts/home/team-a/web/');
  });

  it('refuse an id that is not a receipt id (a command line value never names another key)', () => {
    expect(() => receiptKey(OWNER, '../../artifacts/x')).toThrow(TypeError);
    expect(() => receiptKey(OWNER, '20261202-090501-002-ABCDEF12')).toThrow(TypeError);
  });
});

describe('buildReceipt', () => {
  it('records the App, inputs, tools per stage, time per stage, store requests and a cost', () => {
    const r = receiptAt(0);
    expect(receiptSchema().parse(r)).toEqual(r);
    expect(r).toMatchObject({
      clusterId: 'home',
      namespace: 'team-a',
      name: 'web',
      uid: 'uid-1',
      generation: 1,
      outcome: 'succeeded',
      startedAt: '2026-12-02T09:00:00.000Z',
      endedAt: '2026-12-02T09:00:04.000Z',
      inputs: {
        fetch: { key: FETCH, digest: 'a'.repeat(64), private: false },
        renderInputHash: 'c'.repeat(64),
        render: { key: RENDER, digest: 'b'.repeat(64), private: false },
      },
      stages: [
        { stage: 'fetch', ms: 1200 },
        { stage: 'template', ms: 900 },
        { stage: 'deploy', ms: 1500 },
      ],
      tools: [
        { stage: 'fetch', tool: 'vendir', ms: 800, exitCode: 0 },
        { stage: 'template', tool: 'ytt', ms: 400, exitCode: 0 },
        { stage: 'deploy', tool: 'kapp', ms: 1300, exitCode: 0 },
      ],
      // the stages' requests plus the receipt's own PUT and LIST
      store: { get: 4, head: 1, put: 5, list: 1, delete: 0 },
    });
    expect(r).not.toHaveProperty('error');
    expect(r.cost.usd).toBeGreaterThan(0);
    expect(r.cost.usd).toBe(estimateCostUsd(TRAIL.stages, r.store, 'arm64'));
  });

  it('prices each stage at its memory, one queue message per stage, and the store requests', () => {
    const p = AWS_PRICES_USD;
    const usd = estimateCostUsd(
      [{ stage: 'template', ms: 1000, tools: [], store: noRequests() }],
      { get: 10, head: 0, put: 2, list: 1, delete: 3 },
      'arm64',
    );
    // template: 2048 MiB = 2 GB for 1 s
    const expected = p.lambdaRequest + 2 * p.lambdaGbSecond.arm64 + 3 * p.sqsFifoRequest + 3 * p.s3Put + 10 * p.s3Get;
    expect(usd).toBeCloseTo(expected, 15);
  });

  it('keeps a short error, and no digest of a sealed render nor its render-input hash', () => {
    const r = receiptAt(0, {
      error: `Deploying: ${'x'.repeat(2000)}\n`,
      render: { key: PRIVATE_RENDER, digest: 'd'.repeat(64), private: true },
    });
    expect(r.outcome).toBe('failed');
    expect(r.error?.length).toBe(512);
    expect(r.inputs.render).toEqual({ key: PRIVATE_RENDER, private: true });
    expect(r.inputs).not.toHaveProperty('renderInputHash');
    expect(JSON.stringify(r)).not.toContain('d'.repeat(64));
  });
});

describe('keepReceipt', () => {
  it(`keeps the newest ${RECEIPTS_KEPT} receipts of an App, one PUT and one LIST each`, async () => {
    const store = new MemoryStore();
    const other = { ...OWNER, name: 'web-other' };
    await keepReceipt(store, { ...receiptAt(0), ...other, id: receiptId(new Date(0), 'x') }, memoryLogger());
    for (let i = 1; i <= RECEIPTS_KEPT + 5; i++) {
      const before = store.writes;
      await keepReceipt(store, receiptAt(i * 1000), memoryLogger());
      expect(store.writes - before).toBe(1);
    }
    const kept = await listReceipts(store, OWNER);
    expect(kept).toHaveLength(RECEIPTS_KEPT);
    expect(kept[0]?.startedAt).toBe(receiptAt(6000).startedAt);
    expect(kept.at(-1)?.startedAt).toBe(receiptAt((RECEIPTS_KEPT + 5) * 1000).startedAt);
    // another App's receipts (a name sharing the prefix) are untouched
    expect(await listReceipts(store, other)).toHaveLength(1);
  });

  it('never throws: a store failure is logged and the reconcile stands', async () => {
    const store = new MemoryStore();
    store.put = async () => {
      throw new Error('no network');
    };
    const log = memoryLogger();
    await expect(keepReceipt(store, receiptAt(0), log)).resolves.toBeUndefined();
    expect(log.records.some((l) => l.msg === 'receipt not kept')).toBe(true);
  });

  it('reads a receipt only from its own App', async () => {
    const store = new MemoryStore();
    const r = receiptAt(0);
    await keepReceipt(store, r, memoryLogger());
    expect(await readReceipt(store, OWNER, r.id)).toEqual(r);
    expect(await readReceipt(store, { ...OWNER, namespace: 'team-b' }, r.id)).toBeUndefined();
  });

  it('a receipt over the read bound (planted by a tenant run) is no receipt, and no more than the bound of it is read', async () => {
    const store = new MemoryStore();
    const good = receiptAt(0);
    await keepReceipt(store, good, memoryLogger());
    // Valid receipts but for their size: a uid of 2 MiB.
    const planted = [1000, 2000, 3000].map((ms) => ({ ...receiptAt(ms), uid: 'u'.repeat(2 * 1024 * 1024) }));
    for (const r of planted) await store.put(receiptKey(OWNER, r.id), JSON.stringify(r));
    let bytes = 0;
    const get = store.get.bind(store);
    store.get = async (key, opts) => {
      const body = await get(key, opts);
      bytes += body?.length ?? 0;
      return body;
    };
    expect(await readReceipt(store, OWNER, planted[0]!.id)).toBeUndefined();
    expect(await listReceipts(store, OWNER)).toEqual([good]);
    expect(bytes).toBeLessThanOrEqual(MAX_RECEIPT_BYTES);
  });
});

describe('StageMeter', () => {
  it('counts store requests by class and records tool runs', async () => {
    let t = 100;
    const meter = new StageMeter(() => t);
    const store = meter.store(new MemoryStore());
    await store.put('a/b', 'x');
    await store.putIfAbsent('a/c', 'x');
    await store.get('a/b');
    await store.head('a/b');
    await store.list('a/');
    await store.delete('a/b');
    const runner: CommandRunner = {
      run: async (req: RunRequest): Promise<RunResult> =>
        ({ stdout: '', stderr: '', exitCode: req.cmd === 'ytt' ? 1 : 0, durationMs: 42 }) as unknown as RunResult,
    };
    await meter.runner(runner).run({ cmd: 'ytt', args: [] });
    t = 350;
    expect(meter.measure('template')).toEqual({
      stage: 'template',
      ms: 250,
      tools: [{ tool: 'ytt', ms: 42, exitCode: 1 }],
      store: { get: 1, head: 1, put: 2, list: 1, delete: 1 },
    });
  });
});

describe('receiptOnEnd', () => {
  function depsWith(store: MemoryStore, meter: StageMeter): PipelineDeps {
    return {
      store,
      meter,
      log: memoryLogger(),
      now: () => new Date('2026-12-02T09:00:05Z'),
    } as unknown as PipelineDeps;
  }
  const object = {
    clusterId: 'home',
    kind: 'App' as const,
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    namespace: 'team-a',
    name: 'web',
    uid: 'uid-1',
    generation: 2,
    resourceVersion: '7',
  };
  const run = { generation: 2, runId: 'run-a', startedAt: '2026-12-02T09:00:00Z' };

  it('a no-op resync (success, no tool in any stage) keeps no receipt: no store request', async () => {
    const store = new MemoryStore();
    const meter = new StageMeter();
    const deps = depsWith(store, meter);
    const trail = trailWith(deps, undefined, 'fetch');
    await receiptOnEnd(deps, { object, run, stage: 'deploy', ...(trail ? { trail } : {}), manifestKey: RENDER })({});
    expect(store.writes).toBe(0);
    expect(await store.list('')).toEqual([]);
  });

  it('a failed run without tools keeps one, with the error; a run that ran a tool keeps one', async () => {
    const store = new MemoryStore();
    const deps = depsWith(store, new StageMeter());
    await receiptOnEnd(deps, { object, run, stage: 'fetch' })({ error: 'Rolling back: receipt "x" not found' });
    const [failed] = await listReceipts(store, object);
    expect(failed).toMatchObject({ outcome: 'failed', error: 'Rolling back: receipt "x" not found', generation: 2 });
    const trail = {
      stages: [
        { stage: 'fetch' as const, ms: 5, tools: [{ tool: 'vendir', ms: 3, exitCode: 0 }], store: noRequests() },
      ],
      rollbackOf: failed?.id,
    };
    await receiptOnEnd(deps, { object, run: { ...run, runId: 'run-b' }, stage: 'deploy', trail, manifestKey: RENDER })(
      {},
    );
    const all = await listReceipts(store, object);
    expect(all).toHaveLength(2);
    expect(all.find((r) => r.runId === 'run-b')).toMatchObject({
      outcome: 'succeeded',
      rollbackOf: failed?.id,
      inputs: { render: { key: RENDER, digest: 'b'.repeat(64), private: false } },
    });
  });
});

describe('rollback annotations', () => {
  const app = (annotations: Record<string, string> | undefined, generation = 3) => ({
    apiVersion: 'kappctrl.k14s.io/v1alpha1',
    kind: 'App',
    metadata: {
      name: 'web',
      namespace: 'team-a',
      uid: 'u',
      resourceVersion: '1',
      generation,
      ...(annotations ? { annotations } : {}),
    },
  });

  it('are active only for the generation they were set at', () => {
    const set = { [ROLLBACK_TO_ANNOTATION]: '20261202-090000-000-0123abcd', [ROLLBACK_GENERATION_ANNOTATION]: '3' };
    expect(activeRollback(app(set))).toBe('20261202-090000-000-0123abcd');
    expect(activeRollback(app(set, 4))).toBeUndefined();
    expect(activeRollback(app(undefined))).toBeUndefined();
  });

  it('are the App change key of the forwarder (set, changed and cleared are each a change)', () => {
    const a = appRollbackChangeKey(app({ [ROLLBACK_TO_ANNOTATION]: 'r1', [ROLLBACK_GENERATION_ANNOTATION]: '3' }));
    const b = appRollbackChangeKey(app({ [ROLLBACK_TO_ANNOTATION]: 'r2', [ROLLBACK_GENERATION_ANNOTATION]: '3' }));
    expect(a).toBeDefined();
    expect(a).not.toBe(b);
    expect(appRollbackChangeKey(app({ other: 'x' }))).toBeUndefined();
  });
});

describe('npm run receipts', () => {
  function io(
    store: MemoryStore,
    app: { generation: number; resourceVersion: string; annotations?: Record<string, string> },
  ) {
    const sent: RestRequest[] = [];
    const out: string[] = [];
    const err: string[] = [];
    const rest = {
      send: async (req: RestRequest): Promise<RestResponse> => {
        sent.push(req);
        return { statusCode: 200, body: { metadata: app } };
      },
    };
    const io: ReceiptsIo = {
      store: () => store,
      kube: () => ({ rest, context: 'home' }),
      // The default store is a directory that may not exist on this machine: not this test's subject.
      missingDir: async () => false,
      out: (t) => out.push(t),
      err: (t) => err.push(t),
    };
    return { io, sent, out, err };
  }

  it('a file:/// store no runtime wrote is named as such (exit 1), not listed as empty', async () => {
    const t = io(new MemoryStore(), { generation: 1, resourceVersion: '1' });
    t.io.missingDir = async (location) => location === 'file:///nowhere';
    expect(await main(['list', 'team-a/web', '--store', 'file:///nowhere'], {}, t.io)).toBe(1);
    expect(t.err).toEqual([
      'receipts: --store file:///nowhere: no such directory (no runtime has written it: npm start keeps its store there; the demo removes its own when it ends)\n',
    ]);
    expect(t.sent).toEqual([]);
  });

  it('list prints a table of the App receipts, newest first, in the default cluster of the kubeconfig', async () => {
    const store = new MemoryStore();
    const first = receiptAt(0);
    const second = receiptAt(60_000, { generation: 2, error: 'Deploying: kapp: Error: boom\nmore' });
    await keepReceipt(store, first, memoryLogger());
    await keepReceipt(store, second, memoryLogger());
    const t = io(store, { generation: 2, resourceVersion: '9' });
    expect(await main(['list', 'team-a/web'], {}, t.io)).toBe(0);
    const [header, row1, row2] = (t.out[0] ?? '').split('\n');
    expect(header).toMatch(/^RECEIPT\s+TIME\s+GEN\s+OUTCOME\s+FETCH\s+RENDER\s+TOOLS\s+DURATION\s+COST$/);
    expect(row1).toContain(second.id);
    expect(row1).toMatch(/\s2\s+failed\s+aaaaaaaaaaaa\s+bbbbbbbbbbbb\s+vendir,ytt,kapp\s+4\.0s\s+\$0\.\d{7}$/);
    expect(row2).toContain(first.id);
    expect(t.out[0]).toContain(`${second.id}: Deploying: kapp: Error: boom`);
  });

  it('rollback checks the receipt and its render, then annotates the App fenced on its resourceVersion', async () => {
    const store = new MemoryStore();
    const r = receiptAt(0);
    await keepReceipt(store, r, memoryLogger());
    const t = io(store, { generation: 5, resourceVersion: '42' });
    // the render is not stored: refused, the App untouched
    expect(await main(['rollback', 'team-a/web', r.id, '--cluster', 'home'], {}, t.io)).toBe(1);
    expect(t.sent.filter((s) => s.method === 'PATCH')).toEqual([]);
    await store.put(RENDER, 'kind: ConfigMap\n');
    expect(await main(['rollback', 'team-a/web', r.id, '--cluster', 'home'], {}, t.io)).toBe(0);
    const patch = t.sent.find((s) => s.method === 'PATCH');
    expect(patch?.contentType).toBe('application/merge-patch+json');
    expect(patch?.body).toEqual(rollbackPatch({ generation: 5, resourceVersion: '42' }, r.id));
    expect(patch?.body).toEqual({
      metadata: {
        resourceVersion: '42',
        annotations: { [ROLLBACK_TO_ANNOTATION]: r.id, [ROLLBACK_GENERATION_ANNOTATION]: '5' },
      },
    });
    expect(await main(['rollback', 'team-a/web', '--clear'], {}, t.io)).toBe(0);
    expect(t.sent.filter((s) => s.method === 'PATCH').at(-1)?.body).toEqual({
      metadata: {
        resourceVersion: '42',
        // "" (kept): the reconcile step runs `modified` at once only for Apps carrying the key
        annotations: { [ROLLBACK_TO_ANNOTATION]: '', [ROLLBACK_GENERATION_ANNOTATION]: null },
      },
    });
  });

  it('refuses an unknown receipt and a malformed command line', async () => {
    const t = io(new MemoryStore(), { generation: 1, resourceVersion: '1' });
    expect(await main(['rollback', 'team-a/web', '20261202-090000-000-00000000'], {}, t.io)).toBe(1);
    expect(t.err.join('')).toContain('not found');
    expect(await main(['rollback', 'team-a/web'], {}, t.io)).toBe(2);
    expect(await main(['list', 'web'], {}, t.io)).toBe(2);
    // An unknown option: the usage with the reason, not a stack of parseArgs.
    expect(await main(['list', 'team-a/web', '--nope'], {}, t.io)).toBe(2);
    // Node's advice to put the option after '--' is cut (it reads as nonsense after npm run's own '--').
    expect(t.err.at(-1)).toMatch(/^receipts: Unknown option '--nope'\nusage:/);
  });

  it('list -o json|yaml prints the receipts as data (--json is -o json); -o elsewhere or another format is a usage error', async () => {
    const store = new MemoryStore();
    const r = receiptAt(0);
    await keepReceipt(store, r, memoryLogger());
    const cases: [string[], (text: string) => unknown][] = [
      [['-o', 'json'], (t) => JSON.parse(t)],
      [['--output=yaml'], (t) => parseYaml(t)],
      [['--json'], (t) => JSON.parse(t)],
    ];
    for (const [flags, parse] of cases) {
      const t = io(store, { generation: 1, resourceVersion: '1' });
      expect(await main(['list', 'team-a/web', '--cluster', 'home', ...flags], {}, t.io)).toBe(0);
      expect(parse(t.out.join(''))).toEqual([JSON.parse(JSON.stringify(r))]);
    }
    const t = io(store, { generation: 1, resourceVersion: '1' });
    expect(await main(['list', 'team-a/web', '-o', 'xml'], {}, t.io)).toBe(2);
    expect(t.err.at(-1)).toMatch(/^receipts: -o expects json or yaml, not "xml"\nusage:/);
    expect(await main(['rollback', 'team-a/web', '--clear', '-o', 'json'], {}, t.io)).toBe(2);
    expect(t.err.at(-1)).toMatch(/^receipts: -o applies to list, not rollback\n/);
    expect(await main(['show', 'team-a/web'], {}, t.io)).toBe(2);
    expect(t.err.at(-1)).toMatch(/^receipts: unknown command "show"\n/);
    expect(t.out).toEqual([]);
    expect(t.sent.filter((s) => s.method === 'PATCH')).toEqual([]);
  });

  it('--help and -h print the usage and exit 0', async () => {
    for (const flag of ['--help', '-h']) {
      const t = io(new MemoryStore(), { generation: 1, resourceVersion: '1' });
      expect(await main([flag], {}, t.io)).toBe(0);
      expect(t.out.join('')).toMatch(/^usage:\n {2}npm run receipts -- list/);
    }
  });

  it('marks the receipt the App is rolled back to', () => {
    const r = receiptAt(0);
    expect(formatReceipts([r], r.id).split('\n')[1]).toMatch(new RegExp(`^\\*${r.id}`));
  });
});
