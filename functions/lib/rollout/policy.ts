/**
 * The fleet's rollout policy (issue 28, docs/decisions.md D18): a YAML file kept in
 * git and applied with `npm run fleet -- rollout apply -f FILE`, stored as JSON in the object
 * store (`./state.ts`). A policy spans clusters, so no one cluster's API server is its home, and
 * the functions read the store with no cluster access.
 *
 * ```yaml
 * apiVersion: kapp-lambda/v1
 * kind: RolloutPolicy
 * metadata: { name: default }
 * spec:
 *   packages: [hello.examples.kapp-lambda.dev]   # refNames gated ("*": every refName)
 *   onFailure: stop                              # stop | rollback (stop, then the failed go back to their last good version)
 *   waves:
 *     - { name: canary, clusters: [real-a, real-b], soak: 30s, maxUnavailable: 0 }
 *     - { name: rest }                           # no clusters: every other cluster (the catch-all)
 * ```
 *
 * Waves name clusters by explicit id lists only (the embedded runtime has no cluster labels;
 * label selectors come later). Upstream analogues: Rancher Fleet partitions with
 * `maxUnavailable`, Argo CD ApplicationSet RollingSync steps.
 *
 * @module
 */
import { parse as parseYaml } from 'yaml';
import * as z from 'zod';
import { invalidDurationMessage, isGoDuration, parseGoDuration } from '../api/duration.js';
import { CLUSTER_ID_PATTERN } from '../kube/cluster-doc.js';

/** `apiVersion` of a rollout policy. */
export const ROLLOUT_POLICY_API_VERSION = 'kapp-lambda/v1';
/** `spec.packages` entry that gates every refName. */
export const ANY_PACKAGE = '*';

/** A DNS-1123 label (policy and wave names become store key parts). */
const dnsLabel = z.string().regex(CLUSTER_ID_PATTERN, { error: 'expected a DNS-1123 label' });
/** A Package refName: a DNS-1123 subdomain, as `Package.spec.refName`, or `*`. */
const refName = z
  .string()
  .regex(/^(\*|[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*)$/, {
    error: 'expected a Package refName (a DNS-1123 subdomain) or "*"',
  })
  .max(253);

const waveSchema = z.strictObject({
  name: dnsLabel,
  /** Cluster ids of the wave; absent: the catch-all wave (every cluster no other wave lists). */
  clusters: z.array(z.string().regex(CLUSTER_ID_PATTERN, { error: 'expected a cluster id' })).optional(),
  /** How long the wave stays healthy before the next one starts (Go duration); default `0s`. */
  soak: z
    .string()
    .refine(isGoDuration, { error: (i) => invalidDurationMessage(i.input) })
    .default('0s'),
  /** Members of the wave that may fail before the rollout stops; default 0. */
  maxUnavailable: z.int().min(0).default(0),
});

/**
 * The shape of a policy without the checks across waves: what a policy narrowed to one cluster
 * still is (`ClusterRolloutView` of `./access.ts`, where a wave may list no cluster).
 */
export const rolloutPolicyShape = z.strictObject({
  apiVersion: z.literal(ROLLOUT_POLICY_API_VERSION),
  kind: z.literal('RolloutPolicy'),
  metadata: z.strictObject({ name: dnsLabel }),
  spec: z.strictObject({
    packages: z.array(refName).min(1),
    /**
     * `stop`: a failure stops the rollout. `rollback`: stop, then each failed cluster goes back
     * to the version it was last healthy at, deploying that receipt's render (`../pipeline/install/rollback.ts`).
     */
    onFailure: z.enum(['stop', 'rollback']).default('stop'),
    waves: z.array(waveSchema).min(1),
  }),
});

/** The schema of a policy file (strict: an unknown field is refused, so a typo is not ignored). */
export const rolloutPolicySchema = rolloutPolicyShape.superRefine((p, ctx) => {
  const names = new Set<string>();
  const listed = new Map<string, string>();
  let catchAll = 0;
  p.spec.waves.forEach((w, i) => {
    if (names.has(w.name)) ctx.addIssue({ code: 'custom', path: ['spec', 'waves', i, 'name'], message: 'duplicate' });
    names.add(w.name);
    if (!w.clusters) catchAll++;
    // An empty list is a wave of no cluster (not the catch-all): a slip, refused.
    if (w.clusters?.length === 0) {
      ctx.addIssue({
        code: 'custom',
        path: ['spec', 'waves', i, 'clusters'],
        message: 'empty: list cluster ids, or leave clusters out for the wave of every other cluster',
      });
    }
    // A cluster in two waves would silently go with the first.
    w.clusters?.forEach((c, j) => {
      const first = listed.get(c);
      if (first !== undefined) {
        ctx.addIssue({
          code: 'custom',
          path: ['spec', 'waves', i, 'clusters', j],
          message: `cluster ${c} is already in wave ${first}`,
        });
      }
      listed.set(c, first ?? w.name);
    });
  });
  if (catchAll > 1)
    ctx.addIssue({ code: 'custom', path: ['spec', 'waves'], message: 'at most one wave without clusters' });
});

/** A validated policy (defaults filled in). */
export type RolloutPolicy = z.infer<typeof rolloutPolicySchema>;
/** One wave of a {@link RolloutPolicy}. */
export type RolloutWave = RolloutPolicy['spec']['waves'][number];

/** A policy file or stored policy that does not validate; the message lists each issue with its path. */
export class RolloutPolicyError extends Error {
  override readonly name = 'RolloutPolicyError';
}

/**
 * Validates a policy (a parsed YAML or JSON document).
 *
 * @throws RolloutPolicyError `invalid rollout policy: <path>: <issue>; …`
 */
export function validateRolloutPolicy(doc: unknown): RolloutPolicy {
  const r = rolloutPolicySchema.safeParse(doc);
  if (r.success) return r.data;
  const issues = r.error.issues.map((i) => `${i.path.join('.') || '(root)'}: ${i.message}`);
  throw new RolloutPolicyError(`invalid rollout policy: ${issues.join('; ')}`);
}

/**
 * Parses a policy file's text (YAML, one document).
 *
 * @throws RolloutPolicyError when the text is not YAML or does not validate
 */
export function parseRolloutPolicy(text: string): RolloutPolicy {
  let doc: unknown;
  try {
    doc = parseYaml(text);
  } catch (err) {
    throw new RolloutPolicyError(`invalid rollout policy: ${err instanceof Error ? err.message : String(err)}`, {
      cause: err,
    });
  }
  return validateRolloutPolicy(doc);
}

/** Whether `policy` gates Packages of `refName` (listed, or `*`). */
export function policyCovers(policy: RolloutPolicy, ref: string): boolean {
  return policy.spec.packages.includes(ref) || policy.spec.packages.includes(ANY_PACKAGE);
}

/**
 * The index of the wave `clusterId` belongs to: the first wave listing it, else the catch-all
 * wave (the one without `clusters`), else `undefined`: the cluster is not gated by this policy.
 */
export function waveOf(policy: RolloutPolicy, clusterId: string): number | undefined {
  const waves = policy.spec.waves;
  const listed = waves.findIndex((w) => w.clusters?.includes(clusterId));
  if (listed >= 0) return listed;
  const catchAll = waves.findIndex((w) => !w.clusters);
  return catchAll >= 0 ? catchAll : undefined;
}

/** The wave's soak time, in milliseconds. */
export function soakMs(wave: RolloutWave): number {
  return parseGoDuration(wave.soak);
}
