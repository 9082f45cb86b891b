/**
 * Reconcile receipts: one JSON document per App reconcile, kept in object storage, saying what
 * went in (digests and artifact keys), what ran (tools with durations, time per stage, store
 * requests) and what it cost (an estimate at Lambda prices). kapp-controller has none; its
 * status shape is untouched (receipts live only in the store).
 *
 * Layout: `receipts/<clusterId>/<namespace>/<name>/<receipt id>.json`, one prefix per App (so
 * one App's receipts are listed, bounded and expired by prefix, never under the content keys of
 * `../artifact/keys.ts` that the fleet shares). The id sorts by time:
 * `<yyyymmdd>-<hhmmss>-<mmm>-<8 hex>` (the run's start, UTC, and the start of the sha256 of its
 * run id). At most {@link RECEIPTS_KEPT} per App: writing one removes the oldest beyond it.
 *
 * No secret material (`docs/secret-material.md`): the error is the masked text the status shows,
 * cut to {@link MAX_RECEIPT_ERROR_CHARS}; a private (sealed) artifact appears by its key only, whose
 * name is a keyed MAC, and no digest is recorded for it nor the render-input hash of a private
 * render (a digest of content made from Secrets could confirm a guessed value).
 *
 * Pure except {@link keepReceipt} and {@link readReceipt}, which take the store.
 *
 * @module
 */
import { createHash } from 'node:crypto';
import pMap from 'p-map';
import * as z from 'zod';
import { lazily } from '../api/lazy.js';
import type { Logger } from '../log.js';
import type { ObjectStore } from '../store/port.js';
import { AWS_PRICES_USD, STAGE_MEMORY_MIB } from './prices.js';

/** First segment of every receipt key (the bucket's lifecycle rule for receipts). */
export const RECEIPTS_PREFIX = 'receipts/';
/** Receipts kept per App: the newest 20 (about 10 minutes of kapp runs at the 30 s default sync period). */
export const RECEIPTS_KEPT = 20;
/** Longest error text a receipt keeps (the status keeps the whole message). */
export const MAX_RECEIPT_ERROR_CHARS = 512;
/** Most tool runs recorded per stage of one reconcile. */
export const MAX_TOOL_RUNS_PER_STAGE = 64;
/**
 * Most bytes a receipt is read with (64 KiB; a real one is a few KiB, at most about 20 with every
 * tool run of every stage). A tenant's runs may write its cluster's receipts (cloud mode): one
 * larger is not read (it is no receipt), so a planted 500 MB one costs no shared function (the
 * install function's rollback lists them, the fleet page reads the newest) its memory.
 */
export const MAX_RECEIPT_BYTES = 64 * 1024;
/** Most receipts {@link listReceipts} reads at once. */
const RECEIPT_READS = 16;

/** Matches a receipt id. */
export const RECEIPT_ID_PATTERN = /^\d{8}-\d{6}-\d{3}-[0-9a-f]{8}$/;

/** The stages a reconcile of an App runs, each its own function on Lambda. */
export const RECEIPT_STAGES = ['fetch', 'template', 'deploy'] as const;
/** One of {@link RECEIPT_STAGES}. */
export type ReceiptStage = (typeof RECEIPT_STAGES)[number];

const count = z.number().int().min(0);

/** Object-store requests of one stage (or a whole reconcile), by request class. */
export const StoreRequestsSchema = z.strictObject({
  /** `get` and `getVersioned`. */
  get: count,
  head: count,
  /** `put`, `putIfAbsent` and `putIfMatch`. */
  put: count,
  list: count,
  delete: count,
});
/** See {@link StoreRequestsSchema}. */
export type StoreRequests = z.infer<typeof StoreRequestsSchema>;

/** One tool run: the allow-listed tool, its wall time (ms) and exit code (-1: killed or not started). */
export const ToolRunSchema = z.strictObject({
  tool: z.string().min(1).max(32),
  ms: z.number().min(0),
  exitCode: z.number().int(),
});
/** See {@link ToolRunSchema}. */
export type ToolRun = z.infer<typeof ToolRunSchema>;

/** What one stage of a reconcile did: its function time (ms), tool runs and store requests. */
export const StageMeasureSchema = z.strictObject({
  stage: z.enum(RECEIPT_STAGES),
  ms: z.number().min(0),
  tools: z.array(ToolRunSchema).max(MAX_TOOL_RUNS_PER_STAGE),
  store: StoreRequestsSchema,
});
/** See {@link StageMeasureSchema}. */
export type StageMeasure = z.infer<typeof StageMeasureSchema>;

/**
 * What the stages of a run measured so far, carried by the hand-off events (`receipt` of the
 * template and deploy stage data) to the stage that writes the receipt: every stage's
 * {@link StageMeasure} (a deploy continuation adds one per invocation) and the render-input
 * hash of a shared render, and the receipt a rollback deploys.
 */
export const ReceiptTrailSchema = z.strictObject({
  stages: z.array(StageMeasureSchema).max(16),
  renderInputHash: z
    .string()
    .regex(/^[0-9a-f]{64}$/)
    .optional(),
  /** The receipt whose render the run deploys (a rollback). */
  rollbackOf: z.string().regex(RECEIPT_ID_PATTERN).optional(),
});
/** See {@link ReceiptTrailSchema}. */
export type ReceiptTrail = z.infer<typeof ReceiptTrailSchema>;

/**
 * Builds the schema of the receipt document (`v: 1`): only a receipt read back from the store is
 * parsed with it ({@link readReceipt}), so it is built then ({@link receiptSchema}), not at every
 * cold start.
 */
function buildReceiptSchema() {
  const artifactRef = z.strictObject({
    key: z.string().min(1).max(900),
    /** sha256 of the content (shared artifacts only). */
    digest: z
      .string()
      .regex(/^[0-9a-f]{64}$/)
      .optional(),
    /** Sealed for the App's cluster and namespace (`../artifact/sealed.ts`): expires 7 days after its last write. */
    private: z.boolean(),
  });

  return z.strictObject({
    v: z.literal(1),
    id: z.string().regex(RECEIPT_ID_PATTERN),
    clusterId: z.string().min(1),
    namespace: z.string().min(1),
    name: z.string().min(1),
    uid: z.string().min(1),
    generation: z.number().int().min(0),
    runId: z.string().min(1),
    startedAt: z.string(),
    endedAt: z.string(),
    outcome: z.enum(['succeeded', 'failed']),
    error: z.string().max(MAX_RECEIPT_ERROR_CHARS).optional(),
    /** The receipt whose render this run deployed (a rollback), when it was one. */
    rollbackOf: z.string().regex(RECEIPT_ID_PATTERN).optional(),
    inputs: z.strictObject({
      fetch: artifactRef.optional(),
      renderInputHash: z
        .string()
        .regex(/^[0-9a-f]{64}$/)
        .optional(),
      render: artifactRef.optional(),
    }),
    stages: z.array(z.strictObject({ stage: z.enum(RECEIPT_STAGES), ms: z.number().min(0) })),
    tools: z.array(ToolRunSchema.extend({ stage: z.enum(RECEIPT_STAGES) })),
    store: StoreRequestsSchema,
    cost: z.strictObject({ usd: z.number().min(0), basis: z.string() }),
  });
}

/** The schema of the receipt document (`v: 1`), built on first use (see {@link buildReceiptSchema}). */
export const receiptSchema = lazily(buildReceiptSchema);

/** See {@link receiptSchema}. */
export type Receipt = z.infer<ReturnType<typeof buildReceiptSchema>>;

/** The App a receipt is for. */
export interface ReceiptOwner {
  readonly clusterId: string;
  readonly namespace: string;
  readonly name: string;
}

/** Prefix of the App's receipts: `receipts/<clusterId>/<namespace>/<name>/`. */
export function receiptPrefix(owner: ReceiptOwner): string {
  return `${RECEIPTS_PREFIX}${owner.clusterId}/${owner.namespace}/${owner.name}/`;
}

/**
 * Key of one receipt.
 * @throws TypeError when `id` is not a receipt id (so a command line value never names another key).
 */
export function receiptKey(owner: ReceiptOwner, id: string): string {
  if (!RECEIPT_ID_PATTERN.test(id)) throw new TypeError(`invalid receipt id "${id}"`);
  return `${receiptPrefix(owner)}${id}.json`;
}

/** The receipt id of a run: its start (UTC, ms) and 8 hex of the sha256 of its run id. */
export function receiptId(startedAt: Date, runId: string): string {
  const iso = startedAt.toISOString(); // 2026-12-02T09:34:43.123Z
  const stamp = `${iso.slice(0, 4)}${iso.slice(5, 7)}${iso.slice(8, 10)}-${iso.slice(11, 13)}${iso.slice(14, 16)}${iso.slice(17, 19)}-${iso.slice(20, 23)}`;
  return `${stamp}-${createHash('sha256').update(runId).digest('hex').slice(0, 8)}`;
}

/** No requests. */
export function noRequests(): StoreRequests {
  return { get: 0, head: 0, put: 0, list: 0, delete: 0 };
}

/** The sum of store request counts. */
export function addRequests(a: StoreRequests, b: StoreRequests): StoreRequests {
  return {
    get: a.get + b.get,
    head: a.head + b.head,
    put: a.put + b.put,
    list: a.list + b.list,
    delete: a.delete + b.delete,
  };
}

/** What {@link buildReceipt} takes besides the trail. */
export interface ReceiptInput {
  owner: ReceiptOwner;
  uid: string;
  generation: number;
  runId: string;
  /** The run's start (`run.startedAt`). */
  startedAt: Date;
  endedAt: Date;
  /** The masked error of a failed run (as the status says it); absent: succeeded. */
  error?: string;
  /** Every stage's measure, the final stage's included. */
  trail: ReceiptTrail;
  fetch?: { key: string; digest?: string; private: boolean };
  render?: { key: string; digest?: string; private: boolean };
  rollbackOf?: string;
  /** The Lambda architecture the cost is estimated for. Default `arm64`. */
  architecture?: 'x86_64' | 'arm64';
}

/**
 * The receipt of a run. Store requests include the receipt's own PUT and LIST (see
 * {@link keepReceipt}), so the count and the cost are the reconcile's whole.
 */
export function buildReceipt(input: ReceiptInput): Receipt {
  const stages = input.trail.stages;
  const store = addRequests(
    stages.reduce((a, s) => addRequests(a, s.store), noRequests()),
    { ...noRequests(), put: 1, list: 1 },
  );
  const architecture = input.architecture ?? 'arm64';
  const error = input.error?.trim();
  return {
    v: 1,
    id: receiptId(input.startedAt, input.runId),
    clusterId: input.owner.clusterId,
    namespace: input.owner.namespace,
    name: input.owner.name,
    uid: input.uid,
    generation: input.generation,
    runId: input.runId,
    startedAt: input.startedAt.toISOString(),
    endedAt: input.endedAt.toISOString(),
    outcome: input.error === undefined ? 'succeeded' : 'failed',
    ...(error !== undefined ? { error: error.slice(0, MAX_RECEIPT_ERROR_CHARS) } : {}),
    ...(input.rollbackOf ? { rollbackOf: input.rollbackOf } : {}),
    inputs: {
      ...(input.fetch ? { fetch: artifactOf(input.fetch) } : {}),
      ...(input.trail.renderInputHash && !input.render?.private
        ? { renderInputHash: input.trail.renderInputHash }
        : {}),
      ...(input.render ? { render: artifactOf(input.render) } : {}),
    },
    stages: stages.map((s) => ({ stage: s.stage, ms: Math.round(s.ms) })),
    tools: stages.flatMap((s) => s.tools.map((t) => ({ stage: s.stage, ...t, ms: Math.round(t.ms) }))),
    store,
    cost: {
      usd: estimateCostUsd(stages, store, architecture),
      basis: `AWS Lambda ${architecture} + SQS FIFO + S3 Standard, us-east-1 list prices; stage memory as the cloud stack sizes it`,
    },
  };
}

function artifactOf(a: { key: string; digest?: string; private: boolean }) {
  return { key: a.key, ...(a.digest && !a.private ? { digest: a.digest } : {}), private: a.private };
}

/** Requests per SQS FIFO message: send, receive and delete. */
const SQS_REQUESTS_PER_MESSAGE = 3;

/**
 * What the reconcile would cost on Lambda, US dollars: one invocation and its GB-seconds per
 * stage measure (at the stage's memory, {@link STAGE_MEMORY_MIB}), one queue message per stage
 * (its event), and the store requests. The embedded runtime's receipts carry the same estimate,
 * for comparison. Free tiers are left out.
 */
export function estimateCostUsd(
  stages: readonly StageMeasure[],
  store: StoreRequests,
  architecture: 'x86_64' | 'arm64',
): number {
  const p = AWS_PRICES_USD;
  let usd = 0;
  for (const s of stages) {
    const gbSeconds = (STAGE_MEMORY_MIB[s.stage] / 1024) * (Math.ceil(s.ms) / 1000);
    usd += p.lambdaRequest + gbSeconds * p.lambdaGbSecond[architecture] + SQS_REQUESTS_PER_MESSAGE * p.sqsFifoRequest;
  }
  usd += (store.put + store.list) * p.s3Put + (store.get + store.head) * p.s3Get;
  return usd;
}

/**
 * Keeps a receipt: one PUT, and, concurrently, one LIST of the App's prefix that deletes the
 * oldest receipts beyond {@link RECEIPTS_KEPT} (the new one counted, whether the LIST saw it
 * or not). Never throws: a receipt is a record, not part of the reconcile, so a store failure
 * is logged and the reconcile's outcome stands.
 */
export async function keepReceipt(store: ObjectStore, receipt: Receipt, log: Logger): Promise<void> {
  const owner = receipt;
  const key = receiptKey(owner, receipt.id);
  const prune = async () => {
    const keys = (await store.list(receiptPrefix(owner))).filter((k) => k !== key && isReceiptKey(owner, k));
    const excess = keys.length - (RECEIPTS_KEPT - 1);
    if (excess > 0) await Promise.all(keys.slice(0, excess).map((k) => store.delete(k)));
  };
  const results = await Promise.allSettled([store.put(key, `${JSON.stringify(receipt)}\n`), prune()]);
  for (const r of results) {
    if (r.status === 'rejected') {
      log.warn({ receipt: key, err: (r.reason as Error)?.message }, 'receipt not kept');
    }
  }
}

/** True when `key` is a receipt key of `owner`. */
function isReceiptKey(owner: ReceiptOwner, key: string): boolean {
  const prefix = receiptPrefix(owner);
  return key.startsWith(prefix) && RECEIPT_ID_PATTERN.test(key.slice(prefix.length).replace(/\.json$/, ''));
}

/**
 * Reads one receipt of the App.
 * @returns the receipt, or `undefined` when there is none with that id (or it is not a receipt of
 *   this App, or is over {@link MAX_RECEIPT_BYTES}).
 * @throws TypeError for an invalid id; StoreError on store failures.
 */
export async function readReceipt(store: ObjectStore, owner: ReceiptOwner, id: string): Promise<Receipt | undefined> {
  const key = receiptKey(owner, id);
  const body = await store.get(key, { maxBytes: MAX_RECEIPT_BYTES }).catch((err: unknown) => {
    // By name: the in-cluster forwarder imports this module and must not load the store's code
    // (test/unit/event-contract.test.ts), so `ObjectTooLargeError` is not imported as a value.
    if (err instanceof Error && err.name === 'ObjectTooLargeError') return undefined;
    throw err;
  });
  if (!body) return undefined;
  const parsed = receiptSchema().safeParse(JSON.parse(body.toString('utf8')));
  if (!parsed.success) return undefined;
  const r = parsed.data;
  return r.clusterId === owner.clusterId && r.namespace === owner.namespace && r.name === owner.name ? r : undefined;
}

/**
 * The App's receipts, oldest first (at most the 1000 the first page lists; {@link keepReceipt}
 * keeps {@link RECEIPTS_KEPT}), {@link RECEIPT_READS} read at once. Unreadable documents, and
 * ones over {@link MAX_RECEIPT_BYTES}, are skipped.
 * @throws StoreError on store failures.
 */
export async function listReceipts(store: ObjectStore, owner: ReceiptOwner): Promise<Receipt[]> {
  const keys = (await store.list(receiptPrefix(owner))).filter((k) => isReceiptKey(owner, k));
  const prefix = receiptPrefix(owner);
  const out = await pMap(
    keys,
    (k) => readReceipt(store, owner, k.slice(prefix.length, -'.json'.length)).catch(() => undefined),
    { concurrency: RECEIPT_READS },
  );
  return out.filter((r): r is Receipt => r !== undefined);
}
