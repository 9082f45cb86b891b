import { describe, expect, it } from 'vitest';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/api/functions.js';
import { SOURCE_POLL_PREFIX } from '../../functions/lib/pipeline/source-poll.js';
import {
  type PolicyDocument,
  type RunPolicyTarget,
  runSessionPolicy,
  SESSION_POLICY_MAX_CHARS,
  sessionReadsKey,
} from '../../infra/aws/run-policy.js';
import { runRoleObjects, STAGE_OBJECTS } from '../../infra/aws/stages.js';

/** An IAM policy variable, `${aws:username}` (spelt apart: it is the literal under test, not a template). */
const VARIABLE = ['$', '{aws:username}'].join('');
const TAG_A = 'a'.repeat(32);
const TAG_B = 'b'.repeat(32);
const TARGET: RunPolicyTarget = {
  partition: 'aws',
  region: 'eu-west-1',
  account: '123456789012',
  bucket: 'fleet-artifacts',
  registry: { bucket: 'fleet-artifacts', prefix: 'registry/' },
};

/** IAM's reading of a resource pattern: `*` any run of characters (`/` included), `?` one character. */
function iamMatches(pattern: string, value: string): boolean {
  const re = pattern
    .split('')
    .map((c) => (c === '*' ? '.*' : c === '?' ? '.' : c.replace(/[.+^${}()|[\]\\]/g, '\\$&')))
    .join('');
  return new RegExp(`^${re}$`).test(value);
}

/** Whether any statement of `doc` allows `action` on `resource` (conditions aside). */
function allows(doc: PolicyDocument, action: string, resource: string): boolean {
  return doc.Statement.some((s) => s.Action.includes(action) && s.Resource.some((r) => iamMatches(r, resource)));
}

const obj = (key: string) => `arn:aws:s3:::fleet-artifacts/${key}`;
const secret = (id: string, stage: PipelineStage) =>
  `arn:aws:secretsmanager:eu-west-1:123456789012:secret:kapp-lambda/${id}/${stage}-AbCdEf`;

/** Keys of one cluster: each per-cluster prefix and a sealed key of every kind. */
function clusterKeys(id: string, tag: string): string[] {
  return [
    `state/leases/${id}/ns/app.json`,
    `receipts/${id}/ns/app/0001.json`,
    `state/package-repositories/${id}/ns/repo.json`,
    `state/fleet/${id}/ns/pkgi.json`,
    ...['fetch/m.tgz', 'template/m.yaml', 'cache/render/m.json', 'cache/fetch/m.json', 'state/deploy/m.json'].map(
      (k) => `private/${tag}/${'c'.repeat(32)}/${k}`,
    ),
  ];
}

/** {@link TARGET} with the runs' claims in each cluster's sharing domain (D17). */
const CLUSTER_SHARING: RunPolicyTarget = { ...TARGET, sharing: 'cluster' };

/** One claim of each kind the stages write (in `fleet` sharing; `d/<tag>/` + it in `cluster`). */
const CLAIMS = [
  'cache/render/sha256/m.json',
  'cache/fetch/sha256/m.json',
  'cache/index/sha256/m.json',
  `${SOURCE_POLL_PREFIX}m.json`,
  'inflight/cache/render/sha256/m.json',
  'inflight/cache/fetch/sha256/m.json',
  'artifacts/index/sha256/m.yaml',
];

describe('runSessionPolicy: one stage run of one cluster', () => {
  for (const [stage, target] of PIPELINE_STAGES.flatMap((s) => [TARGET, CLUSTER_SHARING].map((t) => [s, t] as const))) {
    it(`${stage}, ${target.sharing ?? 'fleet'} sharing: reaches cluster a's keys, registry document and token, none of cluster b's`, () => {
      const doc = runSessionPolicy(stage, 'a', TAG_A, target);
      for (const key of clusterKeys('b', TAG_B)) {
        for (const action of ['s3:GetObject', 's3:PutObject', 's3:DeleteObject']) {
          expect(allows(doc, action, obj(key)), `${action} ${key}`).toBe(false);
        }
      }
      // A namespace named like a per-cluster prefix cannot carry cluster b's keys into a's fence.
      expect(allows(doc, 's3:GetObject', obj('receipts/b/receipts/a/x.json'))).toBe(false);
      expect(allows(doc, 's3:GetObject', obj('registry/clusters/b.json'))).toBe(false);
      expect(allows(doc, 's3:GetObject', obj('registry/clusters/a.json'))).toBe(true);
      expect(allows(doc, 'secretsmanager:GetSecretValue', secret('b', stage))).toBe(false);
      expect(allows(doc, 'secretsmanager:GetSecretValue', secret('a', stage))).toBe(true);
      // Another stage's token of the same cluster stays out, and so does the root key's secret.
      const other = PIPELINE_STAGES.find((s) => s !== stage) as PipelineStage;
      expect(allows(doc, 'secretsmanager:GetSecretValue', secret('a', other))).toBe(false);
      const secrets = doc.Statement.filter((s) => s.Action.includes('secretsmanager:GetSecretValue'));
      expect(secrets.flatMap((s) => s.Resource)).toEqual([
        `arn:aws:secretsmanager:eu-west-1:123456789012:secret:kapp-lambda/a/${stage}-??????`,
      ]);
      // Every key of cluster a the stage's own grants name stays reachable.
      for (const key of clusterKeys('a', TAG_A)) {
        const granted = STAGE_OBJECTS[stage].find((g) =>
          iamMatches(g.keys, key.replace(`private/${TAG_A}/`, 'private/x/')),
        );
        if (granted) expect(allows(doc, granted.actions[0] as string, obj(key)), key).toBe(true);
      }
    });
  }

  for (const stage of PIPELINE_STAGES) {
    it(`${stage}, cluster sharing: reaches its claims under d/<its tag>/ only, never the fleet's nor another domain's`, () => {
      const doc = runSessionPolicy(stage, 'a', TAG_A, CLUSTER_SHARING);
      const fleetDoc = runSessionPolicy(stage, 'a', TAG_A, TARGET);
      // What the run may do: the intersection of its session and its run role's policy.
      const role = runRoleObjects(stage, 'cluster');
      const may = (action: string, key: string) =>
        allows(doc, action, obj(key)) &&
        role.some((g) => g.actions.includes(action as never) && iamMatches(g.keys, key));
      for (const claim of CLAIMS) {
        const granted = STAGE_OBJECTS[stage].find((g) => iamMatches(g.keys, claim));
        for (const action of ['s3:GetObject', 's3:PutObject', 's3:DeleteObject']) {
          expect(may(action, claim), `${action} ${claim}`).toBe(false);
          // The session alone fences other domains (every run role holds d/*).
          expect(allows(doc, action, obj(`d/${TAG_B}/${claim}`)), `${action} d/<b>/${claim}`).toBe(false);
          // A tag spelt into a deeper segment is no way into another domain.
          expect(allows(doc, action, obj(`d/${TAG_B}/d/${TAG_A}/${claim}`))).toBe(false);
          // The fleet mode's session has no domain at all.
          expect(allows(fleetDoc, action, obj(`d/${TAG_A}/${claim}`))).toBe(false);
        }
        // The session is the fence; the run role keeps the exact keys and actions (its own claims).
        if (granted) expect(may(granted.actions[0] as string, `d/${TAG_A}/${claim}`), claim).toBe(true);
      }
      const listing = doc.Statement.find((s) => s.Action.includes('s3:ListBucket'));
      for (const p of listing?.Condition?.StringLike?.['s3:prefix'] ?? []) {
        expect(iamMatches(p, 'cache/') || iamMatches(p, 'inflight/') || iamMatches(p, `d/${TAG_B}/cache/`), p).toBe(
          false,
        );
      }
    });
  }

  it("fences the listing to the run's keys; of the fleet's claims, the source poll records only (the others name every cluster's blobs)", () => {
    const doc = runSessionPolicy('fetch', 'a', TAG_A, TARGET);
    expect(doc.Statement.find((s) => s.Action.includes('s3:ListBucket'))).toEqual({
      Effect: 'Allow',
      Action: ['s3:ListBucket'],
      Resource: ['arn:aws:s3:::fleet-artifacts'],
      Condition: {
        StringLike: {
          's3:prefix': ['cache/source-poll/*', `private/${TAG_A}/*`, 'state/leases/a/*', 'receipts/a/*'],
        },
      },
    });
  });

  it("in cluster sharing, fences the listing to the run's keys and its domain", () => {
    const doc = runSessionPolicy('fetch', 'a', TAG_A, CLUSTER_SHARING);
    expect(doc.Statement.find((s) => s.Action.includes('s3:ListBucket'))?.Condition).toEqual({
      StringLike: {
        's3:prefix': [`d/${TAG_A}/*`, `private/${TAG_A}/*`, 'state/leases/a/*', 'receipts/a/*'],
      },
    });
  });

  it("lists no shared blob (other clusters' unsealed content by digest), reads them, and reads a denied key it may read as absent", () => {
    for (const stage of ['fetch', 'template', 'deploy', 'index-repo'] as const) {
      for (const target of [TARGET, CLUSTER_SHARING]) {
        const doc = runSessionPolicy(stage, 'a', TAG_A, target);
        const prefixes = doc.Statement.find((s) => s.Action.includes('s3:ListBucket'))?.Condition?.StringLike?.[
          's3:prefix'
        ];
        for (const p of prefixes ?? []) {
          for (const blob of [
            'artifacts/',
            'artifacts/fetch/sha256/',
            `artifacts/template/sha256/${'b'.repeat(64)}`,
            // The fleet's records that name blobs (fleet sharing), and its in-flight markers.
            'cache/',
            'cache/fetch/',
            'cache/render/',
            'inflight/',
          ]) {
            expect(iamMatches(p, blob), `${stage} lists ${blob} by ${p}`).toBe(false);
          }
        }
      }
    }
    const fetchBlob = `artifacts/fetch/sha256/${'a'.repeat(64)}.tgz`;
    expect(allows(runSessionPolicy('template', 'a', TAG_A, CLUSTER_SHARING), 's3:GetObject', obj(fetchBlob))).toBe(
      true,
    );
    const reads = sessionReadsKey('template', 'a', TAG_A, 'cluster');
    expect([fetchBlob, `private/${TAG_A}/x`, `d/${TAG_A}/cache/render/x.json`].map(reads)).toEqual([true, true, true]);
    expect(
      [`private/${TAG_B}/x`, `d/${TAG_B}/cache/render/x.json`, 'cache/render/x.json', 'state/shares/x'].map(reads),
    ).toEqual([false, false, false, false]);
  });

  it("index-repo, cluster sharing: the poll records are its domain's", () => {
    const doc = runSessionPolicy('index-repo', 'a', TAG_A, CLUSTER_SHARING);
    const record = `${SOURCE_POLL_PREFIX}${'e'.repeat(64)}.json`;
    expect(allows(doc, 's3:PutObject', obj(`d/${TAG_A}/${record}`))).toBe(true);
    expect(allows(doc, 's3:GetObject', obj(record))).toBe(false);
    const listing = doc.Statement.find((s) => s.Action.includes('s3:ListBucket'));
    expect(
      listing?.Condition?.StringLike?.['s3:prefix']?.some((p) => iamMatches(p, `d/${TAG_A}/${SOURCE_POLL_PREFIX}`)),
    ).toBe(true);
  });

  it("index-repo: a dispatched source poll of cluster a lists, reads and claims the fleet's poll records, and pokes", () => {
    // What `pollSources` does in a run session (functions/lib/pipeline/source-poll.ts): list the
    // records, read them, write each under compare-and-swap, and send `ref-changed` to its own
    // cluster's PackageRepositories (index-repo) and Apps (fetch); the run role holds the same.
    const doc = runSessionPolicy('index-repo', 'a', TAG_A, TARGET);
    const record = obj(`${SOURCE_POLL_PREFIX}${'e'.repeat(64)}.json`);
    expect(allows(doc, 's3:GetObject', record)).toBe(true);
    expect(allows(doc, 's3:PutObject', record)).toBe(true);
    const listing = doc.Statement.find((s) => s.Action.includes('s3:ListBucket'));
    expect(listing?.Condition?.StringLike?.['s3:prefix']?.some((p) => iamMatches(p, SOURCE_POLL_PREFIX))).toBe(true);
    expect(allows(doc, 'sqs:SendMessage', 'arn:aws:sqs:eu-west-1:123456789012:kapp-lambda-fetch.fifo')).toBe(true);
    const role = runRoleObjects('index-repo').find((g) => iamMatches(g.keys, `${SOURCE_POLL_PREFIX}x.json`));
    expect(role?.actions).toEqual(['s3:GetObject', 's3:PutObject']);
    // Its listing names no other cluster's keys (their deployed versions name namespaces and repositories).
    expect(
      listing?.Condition?.StringLike?.['s3:prefix']?.some((p) => iamMatches(p, 'state/package-repositories/b/')),
    ).toBe(false);
  });

  it("install: its cluster's fleet index entries (read, write, delete) and receipts (read, list), the shared renders (read), no other cluster's and none of the fleet's rollouts", () => {
    for (const target of [TARGET, CLUSTER_SHARING]) {
      const doc = runSessionPolicy('install', 'a', TAG_A, target);
      // What the run may do: the intersection of its session and its run role's policy.
      const role = runRoleObjects('install', target.sharing);
      const may = (action: string, key: string) =>
        allows(doc, action, obj(key)) &&
        role.some((g) => g.actions.includes(action as never) && iamMatches(g.keys, key));
      const entry = 'state/fleet/a/ns/pkgi.json';
      const receipt = 'receipts/a/ns/pkgi/20261207-103500-000-0123abcd.json';
      const render = `artifacts/template/sha256/${'d'.repeat(64)}.yaml`;
      const actions = (key: string) =>
        ['s3:GetObject', 's3:PutObject', 's3:DeleteObject'].filter((action) => may(action, key));
      expect(actions(entry)).toEqual(['s3:GetObject', 's3:PutObject', 's3:DeleteObject']);
      expect(actions(receipt)).toEqual(['s3:GetObject']);
      expect(actions(render)).toEqual(['s3:GetObject']);
      // Another cluster's, by the session alone (the run role holds every cluster's), and the
      // fleet's rollout policies and records, which only the install dispatcher holds.
      for (const key of [
        'state/fleet/b/ns/pkgi.json',
        'state/fleet/ab/ns/pkgi.json',
        'state/fleet/b/state/fleet/a/x.json',
        'receipts/b/ns/pkgi/x.json',
        'state/rollouts/default/hello.json',
        'state/rollout-policies/default.json',
        'state/leases/a/ns/pkgi.json',
        `private/${TAG_A}/template/m.yaml`,
      ]) {
        expect(actions(key), key).toEqual([]);
      }
      // Lists its own entries and receipts (the rollback walks the App's), nothing else.
      expect(doc.Statement.find((s) => s.Action.includes('s3:ListBucket'))).toEqual({
        Effect: 'Allow',
        Action: ['s3:ListBucket'],
        Resource: ['arn:aws:s3:::fleet-artifacts'],
        Condition: { StringLike: { 's3:prefix': ['state/fleet/a/*', 'receipts/a/*'] } },
      });
      // A denied read of its own keys is a missing key; of another's, an error.
      const reads = sessionReadsKey('install', 'a', TAG_A, target.sharing);
      expect([entry, receipt, render].map(reads)).toEqual([true, true, true]);
      expect(['state/fleet/b/ns/pkgi.json', 'receipts/b/x.json', 'state/rollouts/p/r.json'].map(reads)).toEqual([
        false,
        false,
        false,
      ]);
      // It writes (its entries): the key for S3's data keys too.
      expect(allows(doc, 'kms:GenerateDataKey', 'arn:aws:kms:eu-west-1:123456789012:key/k')).toBe(true);
    }
  });

  for (const id of ['*', 'a*', 'a?', VARIABLE, 'a/b', 'A', '-a', 'a'.repeat(64), '']) {
    it(`refuses the cluster id ${JSON.stringify(id)}`, () => {
      expect(() => runSessionPolicy('fetch', id, TAG_A, TARGET)).toThrow(TypeError);
    });
  }

  for (const [what, target] of [
    ['a bucket with a wildcard', { ...TARGET, bucket: 'fleet-*' }],
    [
      'a registry prefix with a variable',
      { ...TARGET, registry: { bucket: 'fleet-artifacts', prefix: `${VARIABLE}/` } },
    ],
    ['a registry prefix with a wildcard', { ...TARGET, registry: { bucket: 'fleet-artifacts', prefix: 'r*/' } }],
    ['an account with a wildcard', { ...TARGET, account: '12345678901?' }],
    ['a sharing that is neither fleet nor cluster', { ...TARGET, sharing: 'group' as 'fleet' }],
  ] as const) {
    it(`refuses ${what}`, () => {
      expect(() => runSessionPolicy('fetch', 'a', TAG_A, target)).toThrow(TypeError);
    });
  }

  it('refuses a cluster tag that is not 32 hex characters', () => {
    expect(() => runSessionPolicy('fetch', 'a', '*', TARGET)).toThrow(TypeError);
    expect(() => runSessionPolicy('fetch', 'a', 'A'.repeat(32), TARGET)).toThrow(TypeError);
  });

  it(`fits STS's ${SESSION_POLICY_MAX_CHARS} characters at the longest id, bucket names and partition`, () => {
    const longest: RunPolicyTarget = {
      partition: 'aws-us-gov',
      region: 'us-gov-west-1',
      account: '123456789012',
      bucket: 'b'.repeat(63),
      registry: { bucket: 'r'.repeat(63), prefix: 'kapp-lambda/registry/' },
    };
    for (const sharing of ['fleet', 'cluster'] as const) {
      const sizes = PIPELINE_STAGES.map(
        (s) => JSON.stringify(runSessionPolicy(s, 'c'.repeat(63), TAG_A, { ...longest, sharing })).length,
      );
      expect(Math.max(...sizes), sharing).toBeLessThanOrEqual(SESSION_POLICY_MAX_CHARS);
    }
  });
});

describe('runRoleObjects under cluster sharing', () => {
  for (const stage of PIPELINE_STAGES) {
    it(`${stage}: holds its claims under d/*/ with the actions it holds on the fleet's, and no fleet claim`, () => {
      const fleet = runRoleObjects(stage);
      const cluster = runRoleObjects(stage, 'cluster');
      const scoped = (keys: string) => ['cache/', 'inflight/', 'artifacts/index/'].some((p) => keys.startsWith(p));
      expect(cluster.filter((g) => scoped(g.keys))).toEqual([]);
      expect(cluster.map((g) => [g.keys, g.actions])).toEqual(
        fleet.map((g) => [scoped(g.keys) ? `d/*/${g.keys}` : g.keys, g.actions]),
      );
    });
  }
});
