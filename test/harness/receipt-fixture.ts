/**
 * A receipt document as `functions/lib/receipt/receipt.ts` writes it, for tests that read
 * receipts back (the fleet view, the page, a rollout's rollback) without running the App pipeline.
 */
import { type ReceiptOwner, receiptKey } from '../../functions/lib/receipt/receipt.js';
import type { ObjectStore } from '../../functions/lib/store/port.js';

/** What a test sets of a receipt; the rest is fixed (uid `u`, run `r`, no stage or tool). */
export interface ReceiptFixture {
  /** Default 1. */
  generation?: number;
  startedAt: string;
  endedAt: string;
  /** Default `succeeded`. */
  outcome?: 'succeeded' | 'failed';
  /** The rendered manifest's key, when the run rendered one. */
  render?: string;
  /** Default 0. */
  usd?: number;
  /** The receipt whose render the run deployed (a rollback). */
  rollbackOf?: string;
}

/** Puts receipt `id` of the App `owner` into `store`, as valid as the real ones. */
export async function putReceipt(
  store: ObjectStore,
  owner: ReceiptOwner,
  id: string,
  r: ReceiptFixture,
): Promise<void> {
  await store.put(
    receiptKey(owner, id),
    JSON.stringify({
      v: 1,
      id,
      ...owner,
      uid: 'u',
      generation: r.generation ?? 1,
      runId: 'r',
      startedAt: r.startedAt,
      endedAt: r.endedAt,
      outcome: r.outcome ?? 'succeeded',
      ...(r.rollbackOf ? { rollbackOf: r.rollbackOf } : {}),
      inputs: r.render ? { render: { key: r.render, private: false } } : {},
      stages: [],
      tools: [],
      store: { get: 0, head: 0, put: 0, list: 0, delete: 0 },
      cost: { usd: r.usd ?? 0, basis: 'test' },
    }),
  );
}
