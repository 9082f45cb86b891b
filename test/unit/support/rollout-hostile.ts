/**
 * Fixtures of `test/unit/rollout-hostile.test.ts` (issue 28 attacker pass): a two-wave policy,
 * fleet entries, a coordinator over a store with its pokes captured (its first sends may fail),
 * a store with some calls replaced, and an S3 bucket faked at the SDK boundary so the real
 * `S3Store` lists keys as S3 does (any key a session may PUT, not only the characters `S3Store`
 * writes).
 */
import { createHash } from 'node:crypto';
import type { S3Client } from '@aws-sdk/client-s3';
import { RolloutCoordinator } from '../../../functions/lib/entry/dispatch-rollouts.js';
import { memoryLogger } from '../../../functions/lib/log.js';
import { newRollout } from '../../../functions/lib/rollout/evaluate.js';
import { parseRolloutPolicy, type RolloutPolicy } from '../../../functions/lib/rollout/policy.js';
import { type FleetEntry, fleetKey, type RolloutRecord } from '../../../functions/lib/rollout/state.js';
import type { ObjectStore } from '../../../functions/lib/store/port.js';

/** The refName the tests roll out. */
export const REF = 'pkg.test.carvel.dev';
/** The tests' clock. */
export const T0 = new Date('2026-12-07T08:00:00.000Z');

/** Policy `name` of `packages`: wave `canary` lists `first` (soak 0s), `rest` is the catch-all. */
export function twoWavePolicy(packages = REF, name = 'default', first = 'alpha'): RolloutPolicy {
  return parseRolloutPolicy(`
apiVersion: kapp-lambda/v1
kind: RolloutPolicy
metadata: { name: ${name} }
spec:
  packages: [${JSON.stringify(packages)}]
  waves:
    - { name: canary, clusters: [${first}], soak: 0s }
    - { name: rest }
`);
}

/** The rollout of 2.0.0 (from 1.0.0) under {@link twoWavePolicy}: canary done at T0, rest released at T0. */
export function restReleased(policy: RolloutPolicy): RolloutRecord {
  const at = T0.toISOString();
  const r = newRollout(policy, REF, '2.0.0', '1.0.0', T0);
  r.waves[0] = { name: 'canary', releasedAt: at, healthyAt: at, soakEndsAt: at, completedAt: at };
  r.waves[1] = { name: 'rest', releasedAt: at };
  return r;
}

/** A reconciled fleet entry of `clusterId`'s `ns/<name>` at `version`. */
export function entry(clusterId: string, version: string, name = 'inst', more: Partial<FleetEntry> = {}): FleetEntry {
  return {
    clusterId,
    namespace: 'ns',
    name,
    refName: REF,
    uid: `uid-${clusterId}-${name}`,
    version,
    reconcile: 'succeeded',
    at: T0.toISOString(),
    ...more,
  };
}

/** Writes `e` at its own key (what a cluster's run may write under its prefix). */
export async function putEntry(store: ObjectStore, e: FleetEntry): Promise<void> {
  await store.put(fleetKey(e.clusterId, e.namespace, e.name), JSON.stringify(e));
}

/**
 * A coordinator over `store` at T0, its pokes as `<subject> <cause>` lines per send; the first
 * `failedSends` sends throw (an SQS that does not answer).
 */
export function coordinatorOver(store: ObjectStore, failedSends = 0, now: () => Date = () => T0) {
  const poked: string[][] = [];
  const log = memoryLogger();
  let sends = 0;
  const coordinator = new RolloutCoordinator({
    store,
    log,
    now,
    poke: async (events) => {
      if (++sends <= failedSends) throw new Error('SQS did not answer');
      poked.push(events.map((e) => `${e.subject} ${(e.data as { cause?: string }).cause}`));
    },
  });
  return { coordinator, poked, log };
}

/** `store` with the calls `over` names replaced (the port, unchanged otherwise). */
export function storeWith(store: ObjectStore, over: Partial<ObjectStore>): ObjectStore {
  return Object.assign(Object.create(store) as ObjectStore, over);
}

/**
 * An S3 bucket at the SDK boundary: `ListObjectsV2` (Prefix, StartAfter, MaxKeys,
 * ContinuationToken, byte order), `GetObject`, `HeadObject`, `PutObject` (If-Match,
 * If-None-Match) over `objects`, whose keys may hold any character S3 takes.
 */
export function fakeBucket(objects: Map<string, string>): S3Client {
  const etag = (k: string) =>
    `"${createHash('sha256')
      .update(objects.get(k) ?? '')
      .digest('hex')}"`;
  const err = (name: string, status: number) =>
    Object.assign(new Error(name), { name, $metadata: { httpStatusCode: status } });
  const client = {
    async send(cmd: { input: Record<string, unknown> }) {
      const input = cmd.input;
      const key = input.Key as string;
      switch (cmd.constructor.name) {
        case 'ListObjectsV2Command': {
          const prefix = (input.Prefix as string) ?? '';
          const all = [...objects.keys()].filter((k) => k.startsWith(prefix)).sort();
          const from = input.ContinuationToken
            ? Number(input.ContinuationToken)
            : input.StartAfter !== undefined
              ? all.findIndex((k) => k > (input.StartAfter as string))
              : 0;
          const start = from < 0 ? all.length : from;
          const max = Math.min((input.MaxKeys as number) ?? 1000, 1000);
          const page = all.slice(start, start + max);
          const truncated = start + max < all.length;
          return {
            Contents: page.map((Key) => ({ Key })),
            IsTruncated: truncated,
            ...(truncated ? { NextContinuationToken: String(start + max) } : {}),
          };
        }
        case 'GetObjectCommand': {
          const body = objects.get(key);
          if (body === undefined) throw err('NoSuchKey', 404);
          const bytes = Buffer.from(body);
          return {
            ContentLength: bytes.length,
            ETag: etag(key),
            Body: {
              async *[Symbol.asyncIterator]() {
                yield new Uint8Array(bytes);
              },
              destroy() {},
            },
          };
        }
        case 'HeadObjectCommand': {
          const body = objects.get(key);
          if (body === undefined) throw err('NotFound', 404);
          return { ContentLength: body.length, LastModified: T0, ETag: etag(key) };
        }
        case 'PutObjectCommand': {
          if (input.IfNoneMatch === '*' && objects.has(key)) throw err('PreconditionFailed', 412);
          if (input.IfMatch !== undefined && (!objects.has(key) || etag(key) !== input.IfMatch)) {
            throw err('PreconditionFailed', 412);
          }
          const b = input.Body;
          objects.set(key, typeof b === 'string' ? b : Buffer.from(b as Uint8Array).toString('utf8'));
          return { ETag: etag(key) };
        }
        default:
          throw new Error(`fake bucket: ${cmd.constructor.name} not faked`);
      }
    },
  } as unknown as S3Client;
  return client;
}
