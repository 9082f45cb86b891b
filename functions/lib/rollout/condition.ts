/**
 * Reading the Rollout condition back (`./evaluate.ts` `rolloutCondition` writes it): kept apart,
 * with no dependency but the constants, so the forwarder (`events/forwarder/kinds.ts`) can take
 * a PackageInstall's soak end as its due time without bundling the rollout code.
 *
 * @module
 */
import { KappLambdaConditionType } from '../api/constants.js';

/**
 * The end of the soak a PackageInstall's Rollout condition announces (epoch ms), when its reason
 * is `Soaking`: the forwarder's due time for the run that releases the next wave.
 */
export function soakingUntil(
  conditions: readonly { type: string; status?: string; reason?: string; message?: string }[] | undefined,
): number | undefined {
  const c = conditions?.find((x) => x.type === KappLambdaConditionType.Rollout);
  if (c?.reason !== 'Soaking') return undefined;
  const m = / until (\S+)$/.exec(c.message ?? '');
  const t = m ? Date.parse(m[1] ?? '') : Number.NaN;
  return Number.isNaN(t) ? undefined : t;
}
