import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import {
  deleteEvent,
  deployEvent,
  EVENT_TYPES,
  EventValidationError,
  type FunctionName,
  isRolloutCheckEvent,
  isSourcePollEvent,
  type KappEvent,
  MAX_EVENT_BYTES,
  type ObjectRef,
  objectEvent,
  objectEventId,
  objectRefOf,
  orderingKey,
  parseEvent,
  REASON_RANK,
  REASONS,
  ROLLOUT_CHECK_EVENT_TYPE,
  repoIndexedEvent,
  SOURCE_POLL_EVENT_TYPE,
  serializeEvent,
  strongerReason,
  subjectOf,
  targetFunction,
  templateEvent,
} from '../../events/index.js';

const SAMPLES = fileURLToPath(new URL('../../events/samples/', import.meta.url));
const sampleFiles = readdirSync(SAMPLES).filter((f) => f.endsWith('.json'));
const readSample = (f: string) => readFileSync(`${SAMPLES}${f}`, 'utf8');

const app: ObjectRef = {
  clusterId: 'prod-eu-1',
  kind: 'App',
  apiVersion: 'kappctrl.k14s.io/v1alpha1',
  namespace: 'default',
  name: 'simple-app',
  uid: '6f1c2a7e-3b7d-4c7e-9a55-0d1f7b1d2c11',
  generation: 3,
  resourceVersion: '48213',
};
const pkgRepo: ObjectRef = {
  ...app,
  kind: 'PackageRepository',
  apiVersion: 'packaging.carvel.dev/v1alpha1',
  name: 'tanzu-standard',
};
const run = { generation: 3, runId: 'r-1', startedAt: '2025-01-02T03:04:05.120Z' };
const hex = (c: string) => c.repeat(64);
const fetchKey = `artifacts/fetch/sha256/${hex('a')}.tgz`;
const manifestKey = `artifacts/template/sha256/${hex('b')}.yaml`;
const time = '2025-01-02T03:04:05.000Z';

/**
 * A deep copy of `event` with fields set by dotted path (`data.generation`); `undefined`
 * deletes the field. Lets tests break one field at a time without casts to any.
 */
function withFields(event: object, fields: Record<string, unknown>): Record<string, unknown> {
  const copy = structuredClone(event) as Record<string, unknown>;
  for (const [path, value] of Object.entries(fields)) {
    const parts = path.split('.');
    const last = parts.pop() as string;
    let node = copy;
    for (const p of parts) node = node[p] as Record<string, unknown>;
    if (value === undefined) delete node[last];
    else node[last] = value;
  }
  return copy;
}

function mustParse(input: unknown): KappEvent {
  const r = parseEvent(input);
  if (!r.ok) throw new Error(r.error);
  return r.event;
}

function errorOf(input: unknown): string {
  const r = parseEvent(input);
  if (r.ok) throw new Error('expected a parse failure');
  return r.error;
}

describe('sample events', () => {
  const valid = sampleFiles.filter((f) => !f.startsWith('invalid.'));
  const invalid = sampleFiles.filter((f) => f.startsWith('invalid.'));

  it('has a valid sample for every function', () => {
    const fns = new Set(valid.map((f) => f.split('.')[0]));
    expect([...fns].sort()).toEqual(['deploy', 'fetch', 'index-repo', 'install', 'template']);
  });

  it.each(valid)('%s parses and routes to the function its name starts with', (f) => {
    const event = mustParse(readSample(f));
    expect(targetFunction(event)).toBe(f.split('.')[0] as FunctionName);
    // Round trip: serializing a parsed event gives an event that parses to the same value.
    expect(mustParse(JSON.parse(serializeEvent(event)))).toEqual(event);
  });

  const expectedErrors: Record<string, string> = {
    'invalid.generation-string.json': 'data.generation: expected number, received string',
    'invalid.template-missing-fetch-key.json': 'data.artifacts.fetchKey: expected string, received undefined',
    'invalid.unknown-type.json':
      'type: expected one of "dev.kapp-lambda.object.v1" | "dev.kapp-lambda.stage.template.v1" | "dev.kapp-lambda.stage.deploy.v1" | "dev.kapp-lambda.stage.delete.v1" | "dev.kapp-lambda.repo.indexed.v1" | "dev.kapp-lambda.health.v1", received "dev.kapp-lambda.object.v2"',
    'invalid.deploy-not-an-app.json': 'data.object.kind: expected "App", received "PackageInstall"',
    'invalid.delete-not-an-app.json':
      'time: expected an RFC 3339 timestamp; data.object.kind: expected "App", received "PackageInstall"',
    'invalid.reason-and-name.json':
      'data.name: expected a DNS-1123 subdomain; data.reason: expected one of "added" | "modified" | "deleted" | "resync" | "ref-changed", received "updated"',
  };

  it('lists an expected error for every invalid sample', () => {
    expect(invalid.sort()).toEqual(Object.keys(expectedErrors).sort());
  });

  it.each(invalid)('%s fails with the path of the bad field', (f) => {
    expect(errorOf(readSample(f))).toBe(expectedErrors[f]);
    expect(errorOf(JSON.parse(readSample(f)))).toBe(expectedErrors[f]);
  });
});

describe('parseEvent', () => {
  const good = objectEvent(app, 'modified', { time });

  it.each<[string, unknown, string]>([
    ['null', null, '(root): expected object, received null'],
    ['a number', 42, '(root): expected object, received number'],
    ['an array', [], '(root): expected object, received array'],
    ['undefined', undefined, '(root): expected object, received undefined'],
    ['a function', () => 1, '(root): expected object, received function'],
    ['a symbol', Symbol('x'), '(root): expected object, received symbol'],
    ['a bigint', 10n, '(root): expected object, received bigint'],
    ['invalid JSON text', '{"specversion":', '(root): not valid JSON'],
    ['JSON text of a string', '"hello"', '(root): expected object, received string'],
    [
      'an empty object',
      {},
      `type: expected one of ${Object.values(EVENT_TYPES)
        .map((t) => `"${t}"`)
        .join(' | ')}, received undefined`,
    ],
  ])('rejects %s', (_name, input, error) => {
    expect(parseEvent(input)).toEqual({ ok: false, error });
  });

  it('rejects strings and buffers above the size limit without parsing them', () => {
    const huge = `{"a":"${'x'.repeat(MAX_EVENT_BYTES)}"}`;
    expect(parseEvent(huge)).toEqual({ ok: false, error: '(root): event exceeds 262144 bytes' });
    expect(parseEvent(Buffer.from(huge))).toEqual({ ok: false, error: '(root): event exceeds 262144 bytes' });
    // Multi-byte characters count as bytes, not characters.
    const wide = `{"a":"${'é'.repeat(MAX_EVENT_BYTES / 2 + 1)}"}`;
    expect(parseEvent(wide)).toEqual({ ok: false, error: '(root): event exceeds 262144 bytes' });
  });

  it('accepts the serialized form as a string, Buffer or Uint8Array', () => {
    const body = serializeEvent(good);
    expect(mustParse(body)).toEqual(good);
    expect(mustParse(Buffer.from(body))).toEqual(good);
    expect(mustParse(new TextEncoder().encode(body))).toEqual(good);
  });

  it('never throws on circular or hostile inputs', () => {
    const circular: Record<string, unknown> = { ...good };
    circular.data = circular;
    expect(errorOf(circular)).toMatch(/^data\.clusterId: expected string, received undefined; /);

    const throwing = Object.defineProperty({ ...good }, 'data', {
      enumerable: true,
      get() {
        throw new Error('boom');
      },
    });
    expect(parseEvent(throwing)).toEqual({ ok: false, error: '(root): could not be read (Error)' });

    const revoked = Proxy.revocable({}, {});
    revoked.revoke();
    expect(parseEvent(revoked.proxy)).toEqual({ ok: false, error: '(root): could not be read (TypeError)' });

    const deep = `${'['.repeat(100_000)}${']'.repeat(100_000)}`;
    expect(parseEvent(deep)).toEqual({ ok: false, error: '(root): expected object, received array' });
  });

  it.each<[string, Record<string, unknown>, string]>([
    ['a wrong specversion', { specversion: '0.3' }, 'specversion: expected "1.0", received "0.3"'],
    [
      'a wrong datacontenttype',
      { datacontenttype: 'text/plain' },
      'datacontenttype: expected "application/json", received "text/plain"',
    ],
    ['a bad time', { time: 'yesterday' }, 'time: expected an RFC 3339 timestamp'],
    ['an id with spaces', { id: 'a b' }, 'id: expected letters, digits and ._:- only'],
    ['a fractional generation', { 'data.generation': 1.5 }, 'data.generation: expected integer, received number'],
    ['a negative generation', { 'data.generation': -1 }, 'data.generation: expected >= 0, received -1'],
    ['a missing uid', { 'data.uid': undefined }, 'data.uid: expected string, received undefined'],
    [
      'an unknown kind',
      { 'data.kind': 'Deployment' },
      'data.kind: expected one of "App" | "PackageInstall" | "PackageRepository", received "Deployment"',
    ],
    [
      'an apiVersion that does not match the kind',
      { 'data.apiVersion': 'kappctrl.k14s.io/v1' },
      'data.apiVersion: expected "kappctrl.k14s.io/v1alpha1" for kind App, received "kappctrl.k14s.io/v1"',
    ],
    [
      'a subject that is not the object',
      { subject: 'prod-eu-1/App/default/other' },
      'subject: expected "prod-eu-1/App/default/simple-app" (cluster/kind/namespace/name of the object)',
    ],
    ['an upper-case cluster id', { 'data.clusterId': 'Prod' }, 'data.clusterId: expected a DNS-1123 label'],
    ['a long namespace', { 'data.namespace': 'n'.repeat(64) }, 'data.namespace: expected at most 63 characters'],
    ['an unknown data field', { 'data.spec': {} }, 'data.spec: unrecognized key'],
    ['a badly named extension', { Trace_Parent: 'x' }, 'Trace_Parent: unrecognized key'],
    [
      'an extension holding an object',
      { traceparent: {} },
      'traceparent: expected string | number | boolean, received object',
    ],
  ])('rejects an object event with %s', (_name, fields, error) => {
    expect(errorOf(withFields(good, fields))).toBe(error);
  });

  it('accepts CloudEvents extension attributes and dataschema', () => {
    const e = { ...good, traceparent: '00-abc-def-01', attempt: 2, replay: false, dataschema: 'https://example.com/s' };
    expect(mustParse(e)).toEqual(e);
  });

  it('reports at most five problems, then how many more', () => {
    const fields = ['clusterId', 'namespace', 'name', 'uid', 'resourceVersion', 'apiVersion', 'kind'];
    const e = withFields(good, Object.fromEntries(fields.map((k) => [`data.${k}`, 7])));
    expect(errorOf(e)).toBe(
      [
        'data.clusterId: expected string, received number',
        'data.kind: expected one of "App" | "PackageInstall" | "PackageRepository", received number',
        'data.apiVersion: expected string, received number',
        'data.namespace: expected string, received number',
        'data.name: expected string, received number',
        '(+2 more)',
      ].join('; '),
    );
  });

  it('checks stage events: required keys, key formats, kind, summaries', () => {
    const t = templateEvent({ object: app, run, artifacts: { fetchKey } }, { time });
    const bad = withFields(t, {
      'data.artifacts.fetchKey': 'artifacts/fetch/sha256/abc.tgz',
      'data.run.runId': '',
      'data.fetchStatus': { updatedAt: time, exitCode: 'ok', stderr: 'e'.repeat(16 * 1024 + 1) },
    });
    expect(errorOf(bad)).toBe(
      [
        'data.run.runId: expected at least 1 character',
        'data.artifacts.fetchKey: expected artifacts/fetch/sha256/<hex>.tgz or a private fetch key',
        'data.fetchStatus.exitCode: expected number, received string',
        'data.fetchStatus.stderr: expected at most 16384 characters',
      ].join('; '),
    );

    const d = deployEvent({ object: app, run, artifacts: { manifestKey } }, { time });
    const noManifest = withFields(d, { 'data.artifacts': { fetchKey } });
    expect(errorOf(noManifest)).toBe(
      'data: expected artifacts.manifestKey (a deploy) or afterFailure (an inspect after a failed stage), not both',
    );
    // An inspect after a failed stage names no manifest, and never continues.
    const inspect = deployEvent({ object: app, run, artifacts: {}, afterFailure: 'fetch' }, { time });
    expect(parseEvent(inspect).ok).toBe(true);
    expect(errorOf(withFields(inspect, { 'data.afterFailure': 'deploy' }))).toMatch(/^data\.afterFailure: /);
    expect(errorOf(withFields(inspect, { 'data.artifacts': { manifestKey } }))).toBe(
      'data: expected artifacts.manifestKey (a deploy) or afterFailure (an inspect after a failed stage), not both',
    );
    expect(
      errorOf(withFields(inspect, { 'data.continuation': { count: 1, deployStartedAt: '2024-01-01T00:00:00Z' } })),
    ).toBe('data: an inspect after a failed stage has no continuation');

    const r = repoIndexedEvent(
      { object: pkgRepo, run, artifacts: { indexKey: `artifacts/index/sha256/${hex('c')}.json` } },
      { time },
    );
    const appRepo = withFields(r, { 'data.object': { ...app }, subject: subjectOf(app) });
    expect(errorOf(appRepo)).toBe('data.object.kind: expected "PackageRepository", received "App"');
  });

  it('checks the delete hand-off with the same envelope and cross-checks as the others', () => {
    const del = deleteEvent({ object: app, run }, { time });
    const bad = withFields(del, { 'data.run.generation': -1, 'data.object.uid': undefined });
    expect(errorOf(bad)).toBe(
      'data.object.uid: expected string, received undefined; data.run.generation: expected >= 0, received -1',
    );
    const loose = withFields(del, { id: 'a b', time: 'now', subject: 'prod-eu-1/App/default/other' });
    expect(errorOf(loose)).toBe(
      [
        'id: expected letters, digits and ._:- only',
        'time: expected an RFC 3339 timestamp',
        'subject: expected "prod-eu-1/App/default/simple-app" (cluster/kind/namespace/name of the object)',
      ].join('; '),
    );
    const repoDel = withFields(del, { 'data.object': { ...pkgRepo }, subject: subjectOf(pkgRepo) });
    expect(errorOf(repoDel)).toBe('data.object.kind: expected "App", received "PackageRepository"');
    expect(errorOf(withFields(del, { 'data.artifacts': { fetchKey } }))).toBe('data.artifacts: unrecognized key');
  });

  it('parses every queue body by its type alone, the delete hand-off included', () => {
    const events: KappEvent[] = [
      objectEvent(app, 'modified', { time }),
      templateEvent({ object: app, run, artifacts: { fetchKey } }, { time }),
      deployEvent({ object: app, run, artifacts: { fetchKey, manifestKey } }, { time }),
      deleteEvent({ object: app, run }, { time }),
    ];
    for (const e of events) expect(parseEvent(serializeEvent(e))).toEqual({ ok: true, event: e });
    // No body sniffing: a body that merely mentions the delete type is judged by its own type.
    expect(parseEvent(JSON.stringify({ type: 'x', note: EVENT_TYPES.delete }))).toEqual(parseEvent('{"type":"x"}'));
    expect(parseEvent(`[${JSON.stringify(EVENT_TYPES.delete)}]`).ok).toBe(false);
    expect(parseEvent(`{"type":"${EVENT_TYPES.delete}"`)).toEqual({ ok: false, error: '(root): not valid JSON' });
    const big = JSON.stringify({ type: EVENT_TYPES.delete, pad: 'x'.repeat(256 * 1024) });
    expect(parseEvent(big)).toEqual({ ok: false, error: '(root): event exceeds 262144 bytes' });
  });
});

describe('builders', () => {
  it('builds an object event with a derived id and the forwarder as source', () => {
    const e = objectEvent(app, 'modified', { time: new Date('2025-01-02T03:04:05Z') });
    expect(e).toEqual({
      specversion: '1.0',
      id: e.id,
      source: '/kapp-lambda/clusters/prod-eu-1/forwarder',
      type: 'dev.kapp-lambda.object.v1',
      time: '2025-01-02T03:04:05.000Z',
      datacontenttype: 'application/json',
      subject: 'prod-eu-1/App/default/simple-app',
      data: { ...app, reason: 'modified' },
    });
    expect(e.id).toMatch(/^[0-9a-f]{32}$/);
    // Same object change, same id, whenever it is announced (a second forwarder replica or a
    // restart: the FIFO queue drops the copy); another reason, version or cause gives another id.
    expect(objectEvent(app, 'modified', { time }).id).toBe(e.id);
    expect(objectEvent(app, 'modified', { time: '2025-01-02T03:14:05.000Z' }).id).toBe(e.id);
    expect(objectEventId(app, 'modified')).toBe(e.id);
    expect(objectEvent(app, 'resync', { time }).id).not.toBe(e.id);
    expect(objectEvent({ ...app, resourceVersion: '48214' }, 'modified', { time }).id).not.toBe(e.id);
    expect(objectEvent({ ...app, uid: 'other-uid' }, 'modified', { time }).id).not.toBe(e.id);
    const byCause = objectEvent(app, 'modified', { time, cause: 'Secret/creds@7' }).id;
    expect(byCause).not.toBe(e.id);
    expect(objectEvent(app, 'modified', { time, cause: 'Secret/creds@8' }).id).not.toBe(byCause);
    expect(objectEventId(app, 'modified', 'Secret/creds@7')).toBe(byCause);
  });

  it('honours id, source and extensions, and copies only ObjectRef fields', () => {
    const wide = { ...app, reason: 'added', extra: 'ignored' } as unknown as ObjectRef;
    const e = objectEvent(wide, 'added', {
      time,
      id: 'evt-1',
      source: '/custom',
      extensions: { traceparent: '00-1-2-01' },
    });
    expect(e.id).toBe('evt-1');
    expect(e.source).toBe('/custom');
    expect((e as unknown as Record<string, unknown>).traceparent).toBe('00-1-2-01');
    expect(e.data).toEqual({ ...app, reason: 'added' });
  });

  it('builds stage events that carry only the ref, run and artifact keys', () => {
    const t = templateEvent({ object: app, run, artifacts: { fetchKey } }, { time });
    expect(t.type).toBe('dev.kapp-lambda.stage.template.v1');
    expect(t.source).toBe('/kapp-lambda/functions/fetch');
    expect(t.data).toEqual({ object: app, run, artifacts: { fetchKey } });
    const d = deployEvent({ object: app, run, artifacts: { fetchKey, manifestKey } }, { time });
    expect(d.source).toBe('/kapp-lambda/functions/template');
    expect(targetFunction(d)).toBe('deploy');
    expect(objectRefOf(d)).toEqual(app);
    expect(objectRefOf(objectEvent(app, 'deleted', { time }))).toEqual(app);
  });

  it('builds the delete hand-off: fetch as source, routed to deploy, same id as before it joined the schema', () => {
    const e = deleteEvent({ object: { ...app, reason: 'deleted' } as unknown as ObjectRef, run }, { time });
    expect(e).toEqual({
      specversion: '1.0',
      id: e.id,
      source: '/kapp-lambda/functions/fetch',
      type: 'dev.kapp-lambda.stage.delete.v1',
      time,
      datacontenttype: 'application/json',
      subject: 'prod-eu-1/App/default/simple-app',
      data: { object: app, run },
    });
    // The id scheme of the former functions/lib/pipeline/delete-event.ts, so a hand-off re-sent
    // across an upgrade is still deduplicated by the FIFO queue.
    const legacyId = createHash('sha256')
      .update(JSON.stringify([EVENT_TYPES.delete, subjectOf(app), time, run.runId]))
      .digest('hex')
      .slice(0, 32);
    expect(e.id).toBe(legacyId);
    expect(targetFunction(e)).toBe('deploy');
    expect(objectRefOf(e)).toEqual(app);
    expect(() => deleteEvent({ object: pkgRepo, run }, { time })).toThrow(
      new EventValidationError('data.object.kind: expected "App", received "PackageRepository"'),
    );
  });

  it('throws EventValidationError with the formatted path for bad input', () => {
    expect(() => objectEvent({ ...app, generation: -2 }, 'modified', { time })).toThrow(
      new EventValidationError('data.generation: expected >= 0, received -2'),
    );
    expect(() => templateEvent({ object: pkgRepo, run, artifacts: { fetchKey } }, { time })).toThrow(
      'data.object.kind: expected "App", received "PackageRepository"',
    );
    expect(() => objectEvent(app, 'modified', { time: 'now' })).toThrow('time: expected an RFC 3339 timestamp');
  });

  it('routes object events by kind', () => {
    const route = (kind: ObjectRef['kind'], apiVersion: string) =>
      targetFunction(objectEvent({ ...app, kind, apiVersion }, 'added', { time }));
    expect(route('App', 'kappctrl.k14s.io/v1alpha1')).toBe('fetch');
    expect(route('PackageInstall', 'packaging.carvel.dev/v1alpha1')).toBe('install');
    expect(route('PackageRepository', 'packaging.carvel.dev/v1alpha1')).toBe('index-repo');
  });

  it('refuses to serialize an event above the size limit', () => {
    const e: KappEvent = objectEvent({ ...app, uid: 'u' }, 'added', { time, extensions: { big: 'x'.repeat(1000) } });
    const huge = { ...e, big: 'x'.repeat(MAX_EVENT_BYTES) };
    expect(() => serializeEvent(huge)).toThrow(
      new EventValidationError(`(root): event exceeds 262144 bytes (${JSON.stringify(huge).length})`),
    );
  });
});

describe('reason rank', () => {
  it('ranks every reason, deleted > added > ref-changed > modified > resync', () => {
    expect(Object.keys(REASON_RANK).sort()).toEqual([...REASONS].sort());
    expect([...REASONS].sort((a, b) => REASON_RANK[b] - REASON_RANK[a])).toEqual([
      'deleted',
      'added',
      'ref-changed',
      'modified',
      'resync',
    ]);
  });

  it('keeps the higher-ranked reason, the newer one on a tie; deleted always survives', () => {
    for (const a of REASONS) {
      for (const b of REASONS) {
        const want = REASON_RANK[a] > REASON_RANK[b] ? a : b;
        expect(strongerReason(a, b)).toBe(want);
      }
      expect(strongerReason(a, 'deleted')).toBe('deleted');
      expect(strongerReason('deleted', a)).toBe('deleted');
    }
    expect(strongerReason('ref-changed', 'modified')).toBe('ref-changed');
    expect(strongerReason('modified', 'ref-changed')).toBe('ref-changed');
  });
});

describe('ordering key', () => {
  it('is cluster/kind/namespace/name', () => {
    expect(orderingKey(app)).toBe('prod-eu-1/App/default/simple-app');
    expect(orderingKey(app)).toBe(subjectOf(app));
  });

  it('is the same for every event about one object, whatever the generation or reason', () => {
    const e1 = objectEvent(app, 'added', { time });
    const e2 = deployEvent({ object: { ...app, generation: 9 }, run, artifacts: { manifestKey } }, { time });
    expect(orderingKey(objectRefOf(e1))).toBe(orderingKey(objectRefOf(e2)));
    expect(orderingKey({ ...app, clusterId: 'prod-us-1' })).not.toBe(orderingKey(app));
  });

  it('hashes keys longer than 128 characters (SQS MessageGroupId limit)', () => {
    const long = { ...app, name: `${'a'.repeat(120)}.example` };
    const key = orderingKey(long);
    expect(key).toMatch(/^sha256-[0-9a-f]{64}$/);
    const newer: ObjectRef = { ...long, generation: 7 };
    expect(orderingKey(newer)).toBe(key);
    expect(orderingKey({ ...long, namespace: 'other' })).not.toBe(key);
    expect(orderingKey({ ...app, name: 'a'.repeat(128 - 'prod-eu-1/App/default/'.length) })).toHaveLength(128);
  });
});

describe('schedule inputs', () => {
  it("tells the rollout check from the source poll and from an SQS batch naming either's type", () => {
    const check = { type: ROLLOUT_CHECK_EVENT_TYPE };
    const poll = { type: SOURCE_POLL_EVENT_TYPE };
    expect(ROLLOUT_CHECK_EVENT_TYPE).toBe('dev.kapp-lambda.rollout.check.v1');
    expect([isRolloutCheckEvent(check), isSourcePollEvent(check)]).toEqual([true, false]);
    expect([isRolloutCheckEvent(poll), isSourcePollEvent(poll)]).toEqual([false, true]);
    for (const other of [{ ...check, Records: [] }, { ...poll, Records: [] }, { Records: [] }, null, 'x', {}]) {
      expect([isRolloutCheckEvent(other), isSourcePollEvent(other)], JSON.stringify(other)).toEqual([false, false]);
    }
  });
});
