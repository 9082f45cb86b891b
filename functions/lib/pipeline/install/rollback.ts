/**
 * A PackageInstall's rollback to its last good version after a rollout stopped under
 * `onFailure: rollback` (issue 28 item 4; `../../rollout/gate.ts` `rollbackOf`): the gate caps
 * the selection at that version, and the App it writes carries the App pipeline's own rollback
 * annotations (`../app/receipts.ts`) naming the receipt of the last good reconcile, so what is
 * deployed is that receipt's render, as it ran before, not a new render of the old version.
 *
 * @module
 */
import { isDeepStrictEqual } from 'node:util';
import { ROLLBACK_GENERATION_ANNOTATION, ROLLBACK_TO_ANNOTATION } from '../../api/constants.js';
import { TEMPLATE_KEY_PATTERN } from '../../artifact/keys.js';
import { PRIVATE_PREFIX } from '../../artifact/sealed.js';
import type { RawApp } from '../../packaging/app-from-package.js';
import { listReceipts, type Receipt } from '../../receipt/receipt.js';
import type { ObjectStore } from '../../store/port.js';

/**
 * The receipt to roll the App `owner` back to: its newest succeeded one of `appGeneration` or
 * before (the App's generation when the PackageInstall was last healthy) whose render is still
 * stored (a sealed one is taken as stored). `undefined` without a generation (an entry written before it was recorded: the newest
 * success might be the failed version's, if it reconciled and then turned unhealthy) or when none
 * qualifies; the old version is then rendered again.
 *
 * @throws StoreError when the receipts cannot be listed or a render cannot be checked
 */
export async function rollbackReceipt(
  store: ObjectStore,
  owner: { clusterId: string; namespace: string; name: string },
  appGeneration: number | undefined,
): Promise<string | undefined> {
  if (appGeneration === undefined) return undefined;
  const receipts = await listReceipts(store, owner);
  for (const r of [...receipts].reverse()) {
    if (r.outcome !== 'succeeded' || !r.inputs.render || r.generation > appGeneration) continue;
    // A receipt is its cluster's to write (a tenant's run may plant one): a render key that is no
    // shared manifest's nor sealed is no render (the App's rollback run would refuse it).
    const key = r.inputs.render.key;
    if (!TEMPLATE_KEY_PATTERN.test(key) && !key.startsWith(PRIVATE_PREFIX)) continue;
    // A sealed render is its cluster's (`private/<tag>/`), which a dispatched install run's session
    // cannot read: taken as there. The App's fetch stage checks it again (`../app/rollback.ts`) and
    // renders the old version anew when it is gone.
    if (r.inputs.render.key.startsWith(PRIVATE_PREFIX) || (await store.head(r.inputs.render.key))) {
      return rolledBackFrom(receipts, r).id;
    }
  }
  return undefined;
}

/**
 * The receipt a rollback's own receipt `r` deployed again, followed while it is kept and holds the
 * same render: `r` itself when it is no rollback. Once rolled back, the App's last good generation
 * is the rollback's, whose receipt (`rollbackOf` set) is the newest of it; naming that one would
 * rewrite the App's rollback annotation on every later run (an App run for the same render, and
 * the receipt the PackageInstall's Rollout condition names changing under its reader). The first
 * receipt of the chain names the same render and stays named.
 */
function rolledBackFrom(receipts: readonly Receipt[], r: Receipt): Receipt {
  const byId = new Map(receipts.map((x) => [x.id, x]));
  const seen = new Set<string>();
  let at = r;
  while (at.rollbackOf && !seen.has(at.id)) {
    seen.add(at.id);
    const from = byId.get(at.rollbackOf);
    if (from?.outcome !== 'succeeded' || from.inputs.render?.key !== at.inputs.render?.key) break;
    at = from;
  }
  return at;
}

/**
 * `desired` (the App of the old version, as `newApp` made it from `existing`) with the rollback
 * annotations naming `receipt` for the generation the write will give it: `existing`'s, plus one
 * when the spec changes (the API server counts spec changes only). An App already rolled back to
 * `receipt` for that generation is left as it is.
 */
export function withRollback(desired: RawApp, existing: RawApp, receipt: string): RawApp {
  const specChanged = !isDeepStrictEqual(
    JSON.parse(JSON.stringify(desired.spec ?? {})),
    JSON.parse(JSON.stringify(existing.spec ?? {})),
  );
  const generation = (existing.metadata.generation ?? 0) + (specChanged ? 1 : 0);
  // Already rolled back to it, for the generation it keeps: nothing to write. (The same receipt
  // named for an older generation, a rollback before a newer version came and failed, is renewed.)
  const annotations = existing.metadata.annotations ?? {};
  if (
    annotations[ROLLBACK_TO_ANNOTATION] === receipt &&
    annotations[ROLLBACK_GENERATION_ANNOTATION] === String(generation)
  ) {
    return desired;
  }
  return {
    ...desired,
    metadata: {
      ...desired.metadata,
      annotations: {
        ...desired.metadata.annotations,
        [ROLLBACK_TO_ANNOTATION]: receipt,
        [ROLLBACK_GENERATION_ANNOTATION]: String(generation),
      },
    },
  };
}
