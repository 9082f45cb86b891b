/**
 * Secret material in object storage (issue 7 item 6): content made from Secrets is sealed per
 * cluster, stored under HMAC keys in the private prefix, never shared through the fleet cache,
 * and expires; public renders stay shared. Faked at the ports (kube, runner, store).
 */
import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { GetSecretValueCommand, type SecretsManagerClient } from '@aws-sdk/client-secrets-manager';
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import type { ObjectRef as EventObjectRef, TemplateStageData } from '../../events/schema.js';
import { DeployStageDataSchema, TemplateStageDataSchema } from '../../events/schema.js';
import { type App, fetchIsPrivate, templateIsPrivate } from '../../functions/lib/api/index.js';
import {
  DerivedKeyring,
  fileKeyring,
  loadOrCreateRootKey,
  rootKeyFromBase64,
} from '../../functions/lib/artifact/keyring.js';
import { fetchArtifactKey, sha256Hex } from '../../functions/lib/artifact/keys.js';
import {
  DEFAULT_PRIVATE_TTL_MS,
  isPrivateKey,
  openArtifact,
  PrivateArtifacts,
  SealError,
  sealArtifact,
} from '../../functions/lib/artifact/sealed.js';
import { packDir } from '../../functions/lib/artifact/tarball.js';
import { ConfigError } from '../../functions/lib/entry/config.js';
import { artifactKeyringFromEnv } from '../../functions/lib/entry/lambda.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import type { KubeSecret } from '../../functions/lib/kube/port.js';
import { memoryLogger } from '../../functions/lib/log.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { runTemplate } from '../../functions/lib/pipeline/app/template.js';
import { manifestHasSecret, readArtifact } from '../../functions/lib/pipeline/artifacts.js';
import type { PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { appObject, REF } from './support/app-world.js';
import { FakeCluster } from './support/fake-cluster.js';

const SECRET_VALUE = 'hunter2-very-secret-value';
const ROOT = Buffer.alloc(32, 9);
const T0 = new Date('2025-01-01T00:00:00Z');

let tmp: string;
beforeEach(async () => {
  tmp = await mkdtemp(join(tmpdir(), 'private-artifacts-'));
});
afterEach(async () => {
  await rm(tmp, { recursive: true, force: true });
});

/** The table App in cluster `clusterId`, as events refer to it. */
const refOf = (clusterId: string): EventObjectRef => ({ ...REF, clusterId });

/** The table App fetching one inline file, changed by `spec`. */
const appWith = (spec: Record<string, unknown>): App =>
  appObject({ spec: { fetch: [{ inline: { paths: { 'c.yml': 'a: 1\n' } } }], ...spec } });

/** One cluster: the App and the Secrets `vals` and `creds` holding {@link SECRET_VALUE}. */
function clusterOf(app: App): FakeCluster {
  const cluster = new FakeCluster().put(app as never);
  const data = {
    'values.yml': Buffer.from(`password: ${SECRET_VALUE}\n`),
    username: Buffer.from('u'),
    password: Buffer.from(SECRET_VALUE),
  };
  for (const name of ['vals', 'creds'])
    cluster.secrets.set(`ns/${name}`, { type: 'Opaque', data } as unknown as KubeSecret);
  return cluster;
}

interface Fleet {
  store: MemoryStore;
  runner: FakeCommandRunner;
  clock: { now: Date };
  deps: PipelineDeps;
}

/** Two clusters (c1, c2) served by one store, one runner and one fleet root key. */
function fleet(app: App, manifest: string): Fleet {
  const store = new MemoryStore();
  const clock = { now: T0 };
  const runner = new FakeCommandRunner()
    .on('ytt', async () => ({ stdout: manifest }))
    .on('vendir', async (req) => {
      await mkdir(join(req.cwd ?? '', '0'), { recursive: true });
      await writeFile(join(req.cwd ?? '', '0', 'private.yml'), `token: ${SECRET_VALUE}\n`);
      return { stdout: 'kind: LockConfig\n' };
    });
  const kubes = new Map(['c1', 'c2'].map((c) => [c, clusterOf(app)]));
  const deps: PipelineDeps = {
    clusters: { fetchView: (id: string) => kubes.get(id) } as unknown as PipelineDeps['clusters'],
    store,
    keyring: new DerivedKeyring(ROOT),
    runner,
    now: () => clock.now,
    log: memoryLogger(),
    config: { tmpRoot: tmp, toolVersions: { ytt: '0.55.3', vendir: '0.44.0' }, controllerVersion: '0.1.0' },
  };
  return { store, runner, clock, deps };
}

async function putFetchArtifact(store: MemoryStore): Promise<string> {
  const dir = join(tmp, 'src');
  await mkdir(dir, { recursive: true });
  await writeFile(join(dir, 'c.yml'), 'a: 1\n');
  const packed = await packDir(dir);
  const key = fetchArtifactKey(packed.sha256);
  await store.putIfAbsent(key, packed.tgz);
  return key;
}

function templateEvent(clusterId: string, fetchKey: string): TemplateStageData {
  return {
    object: refOf(clusterId),
    run: { generation: 1, runId: `r-${clusterId}`, startedAt: T0.toISOString() },
    artifacts: { fetchKey },
  };
}

/** Every stored object's bytes, concatenated (what anyone with bucket read access sees). */
async function allStoredBytes(store: MemoryStore): Promise<{ keys: string[]; bytes: string }> {
  const keys = await store.list('');
  const bodies = await Promise.all(keys.map((k) => store.get(k)));
  return { keys, bytes: Buffer.concat(bodies.filter((b): b is Buffer => !!b)).toString('latin1') };
}

const SECRET_VALUES_APP = appWith({ template: [{ ytt: { valuesFrom: [{ secretRef: { name: 'vals' } }] } }] });
const SECRET_MANIFEST = `apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  p: ${SECRET_VALUE}\n`;
const PUBLIC_MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  p: public\n';

describe('keyring and sealing', () => {
  it('derives different keys per cluster and the same keys for the same cluster', async () => {
    const ring = new DerivedKeyring(ROOT);
    const a = await ring.keysFor('c1');
    const b = await ring.keysFor('c2');
    expect(a.tag).toMatch(/^[0-9a-f]{32}$/);
    expect(a.tag).not.toBe(b.tag);
    expect(a.encKey.equals(b.encKey)).toBe(false);
    expect((await new DerivedKeyring(ROOT).keysFor('c1')).encKey.equals(a.encKey)).toBe(true);
    // Another fleet root gives other keys for the same cluster id.
    expect((await new DerivedKeyring(Buffer.alloc(32, 1)).keysFor('c1')).tag).not.toBe(a.tag);
  });

  it('refuses short or malformed root keys without quoting them', () => {
    expect(() => new DerivedKeyring(Buffer.alloc(16))).toThrow(RangeError);
    for (const bad of [undefined, '', 'not base64!!', Buffer.alloc(31).toString('base64')]) {
      expect(() => rootKeyFromBase64(bad, 'KAPP_LAMBDA_ARTIFACT_ROOT_KEY')).toThrow(
        'KAPP_LAMBDA_ARTIFACT_ROOT_KEY: expected base64 of at least 32 random bytes',
      );
    }
    expect(rootKeyFromBase64(ROOT.toString('base64'), 'x').equals(ROOT)).toBe(true);
  });

  it('creates the local root key file once, mode 0600, and keeps it', async () => {
    const file = join(tmp, 'keys', 'artifact-root.key');
    const [k1, k2] = await Promise.all([loadOrCreateRootKey(file), loadOrCreateRootKey(file)]);
    expect(k1.length).toBe(32);
    expect(k1.equals(k2)).toBe(true);
    expect((await stat(file)).mode & 0o777).toBe(0o600);
    expect((await loadOrCreateRootKey(file)).equals(await readFile(file))).toBe(true);
    const ring = fileKeyring(file);
    expect((await ring.keysFor('c1')).tag).toBe((await new DerivedKeyring(k1).keysFor('c1')).tag);
    await writeFile(file, 'short');
    await expect(loadOrCreateRootKey(file)).rejects.toThrow('must hold exactly 32 bytes');
  });

  it('opens only with the same cluster key, for the same object key, with the expiry untouched', async () => {
    const ring = new DerivedKeyring(ROOT);
    const c1 = await ring.keysFor('c1');
    const c2 = await ring.keysFor('c2');
    const exp = new Date(T0.getTime() + 1000);
    const sealed = sealArtifact(c1.encKey, 'private/k', Buffer.from(SECRET_VALUE), exp);
    expect(sealed.toString('latin1')).not.toContain(SECRET_VALUE);
    expect(openArtifact(c1.encKey, 'private/k', sealed)).toEqual({
      plaintext: Buffer.from(SECRET_VALUE),
      expiresAt: exp,
    });
    expect(() => openArtifact(c2.encKey, 'private/k', sealed)).toThrow(SealError);
    // Moved to another key (e.g. a cache record pointed elsewhere): refused.
    expect(() => openArtifact(c1.encKey, 'private/other', sealed)).toThrow(SealError);
    // Expiry pushed into the future by someone with write access: refused.
    const forged = Buffer.from(sealed);
    forged.writeBigUInt64BE(BigInt(exp.getTime() + DEFAULT_PRIVATE_TTL_MS), 4);
    expect(() => openArtifact(c1.encKey, 'private/k', forged)).toThrow(SealError);
    expect(() => openArtifact(c1.encKey, 'private/k', Buffer.from('plain text, not sealed'))).toThrow(
      'is not a sealed artifact',
    );
  });

  it('names private objects by HMAC per cluster and namespace, never by the bare content sha256', async () => {
    const p = new PrivateArtifacts(new MemoryStore(), new DerivedKeyring(ROOT), { now: () => T0 });
    const sha = sha256Hex('content');
    const k1 = await p.keyFor({ clusterId: 'prod-eu-1', namespace: 'ns' }, 'template', sha);
    const k2 = await p.keyFor({ clusterId: 'prod-us-2', namespace: 'ns' }, 'template', sha);
    const k3 = await p.keyFor({ clusterId: 'prod-eu-1', namespace: 'other' }, 'template', sha);
    for (const k of [k1, k2, k3]) {
      expect(isPrivateKey(k)).toBe(true);
      expect(k).not.toContain(sha);
      expect(k).not.toContain('prod-eu-1');
      expect(k).not.toContain('ns/');
    }
    expect(new Set([k1, k2, k3]).size).toBe(3);
    expect(k1).toBe(await p.keyFor({ clusterId: 'prod-eu-1', namespace: 'ns' }, 'template', sha));
  });

  it('refuses a key of another cluster or namespace, and does not serve or keep expired objects', async () => {
    const store = new MemoryStore();
    const clock = { now: T0 };
    const p = new PrivateArtifacts(store, new DerivedKeyring(ROOT), { now: () => clock.now, ttlMs: 60_000 });
    const s1 = { clusterId: 'c1', namespace: 'ns' };
    const key = await p.keyFor(s1, 'template', sha256Hex('x'));
    await p.put(s1, key, SECRET_VALUE);
    await expect(p.get({ clusterId: 'c2', namespace: 'ns' }, key)).rejects.toThrow(SealError);
    await expect(p.get({ clusterId: 'c1', namespace: 'other' }, key)).rejects.toThrow(SealError);
    await expect(p.put(s1, 'artifacts/template/sha256/x.yaml', 'x')).rejects.toThrow(SealError);
    expect((await p.get(s1, key))?.toString()).toBe(SECRET_VALUE);
    clock.now = new Date(T0.getTime() + 30_000);
    expect(await p.get(s1, key, 40_000)).toBeUndefined(); // too little life left to reuse
    expect(await store.head(key)).toBeDefined();
    clock.now = new Date(T0.getTime() + 60_000);
    expect(await p.get(s1, key)).toBeUndefined();
    expect(await store.head(key)).toBeUndefined(); // swept on read
  });
});

describe('classification', () => {
  it.each([
    [[{ git: { url: 'https://g/x', ref: 'main', secretRef: { name: 'creds' } } }], true],
    [[{ helmChart: { name: 'c', repository: { url: 'https://h', secretRef: { name: 'creds' } } } }], true],
    [[{ inline: { pathsFrom: [{ secretRef: { name: 's' } }] } }], true],
    [[{ inline: { pathsFrom: [{ configMapRef: { name: 'cm' } }] } }], false],
    [[{ git: { url: 'https://g/x', ref: 'main' } }], false],
  ])('fetch %j private: %s', (fetch, want) => {
    expect(fetchIsPrivate(fetch as never)).toBe(want);
  });

  it.each([
    [[{ ytt: { valuesFrom: [{ secretRef: { name: 's' } }] } }], true],
    [[{ helmTemplate: { valuesFrom: [{ secretRef: { name: 's' } }] } }], true],
    [[{ ytt: { inline: { pathsFrom: [{ secretRef: { name: 's' } }] } } }], true],
    [[{ sops: { age: { privateKeysSecretRef: { name: 'k' } } } }, { ytt: {} }], true],
    [[{ ytt: { valuesFrom: [{ configMapRef: { name: 'c' } }, { downwardAPI: { items: [] } }] } }], false],
  ])('template %j private: %s', (templates, want) => {
    expect(templateIsPrivate(templates as never)).toBe(want);
  });

  it.each([
    ['apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n', true],
    ['---\nkind: "Secret"\n', true],
    ['kind: List\nitems:\n- kind: Secret\n', true],
    ['{"apiVersion":"v1","kind": "Secret"}', true],
    ['kind: ConfigMap\ndata:\n  kind: SecretStore\n', false],
    [PUBLIC_MANIFEST, false],
  ])('manifest %j has a Secret: %s', (m, want) => {
    expect(manifestHasSecret(m)).toBe(want);
  });
});

describe('runTemplate with Secret inputs', () => {
  it('stores a render with a Secret valuesFrom sealed, under the private prefix, and does not reuse it for another cluster', async () => {
    const f = fleet(SECRET_VALUES_APP, SECRET_MANIFEST);
    const fetchKey = await putFetchArtifact(f.store);
    const out1 = await runTemplate(templateEvent('c1', fetchKey), f.deps, async () => ({}));
    const key1 = out1.deploy?.artifacts.manifestKey ?? '';
    expect(isPrivateKey(key1)).toBe(true);
    expect(key1).not.toContain(sha256Hex(SECRET_MANIFEST));
    const stored = await allStoredBytes(f.store);
    expect(stored.bytes).not.toContain(SECRET_VALUE);
    expect(stored.keys.filter((k) => k.startsWith('cache/render/') || k.startsWith('artifacts/template/'))).toEqual([]);
    // The hand-off event carrying the private key is valid.
    expect(DeployStageDataSchema.safeParse(out1.deploy).success).toBe(true);

    // The other cluster, same inputs: renders itself, gets its own key.
    const out2 = await runTemplate(templateEvent('c2', fetchKey), f.deps, async () => ({}));
    expect(f.runner.calls.filter((c) => c.cmd === 'ytt')).toHaveLength(2);
    const key2 = out2.deploy?.artifacts.manifestKey ?? '';
    expect(isPrivateKey(key2)).toBe(true);
    expect(key2).not.toBe(key1);

    // The same cluster again: its own private cache hit.
    const out3 = await runTemplate(templateEvent('c1', fetchKey), f.deps, async () => ({}));
    expect(f.runner.calls.filter((c) => c.cmd === 'ytt')).toHaveLength(2);
    expect(out3.deploy?.artifacts.manifestKey).toBe(key1);

    // What deploy reads: the manifest opens for c1, and c1's key is refused to a c2 run.
    const scope = (c: string) => ({ clusterId: c, namespace: 'ns' });
    expect((await readArtifact(f.deps, scope('c1'), key1))?.toString()).toBe(SECRET_MANIFEST);
    await expect(readArtifact(f.deps, scope('c2'), key1)).rejects.toThrow(SealError);
    // Even copied under c2's name, c1's sealed bytes do not open with c2's key.
    await f.store.put(key2, (await f.store.get(key1)) as Buffer);
    await expect(readArtifact(f.deps, scope('c2'), key2)).rejects.toThrow(SealError);
  });

  it('re-renders once the private render expired, and never serves the expired manifest', async () => {
    const f = fleet(SECRET_VALUES_APP, SECRET_MANIFEST);
    const fetchKey = await putFetchArtifact(f.store);
    const out1 = await runTemplate(templateEvent('c1', fetchKey), f.deps, async () => ({}));
    const key1 = out1.deploy?.artifacts.manifestKey ?? '';
    f.clock.now = new Date(T0.getTime() + DEFAULT_PRIVATE_TTL_MS + 1);
    expect(await readArtifact(f.deps, { clusterId: 'c1', namespace: 'ns' }, key1)).toBeUndefined();
    expect(await f.store.head(key1)).toBeUndefined();
    await runTemplate(templateEvent('c1', fetchKey), f.deps, async () => ({}));
    expect(f.runner.calls.filter((c) => c.cmd === 'ytt')).toHaveLength(2);
  });

  it('fails closed without a keyring: nothing is stored in the clear', async () => {
    const f = fleet(SECRET_VALUES_APP, SECRET_MANIFEST);
    const fetchKey = await putFetchArtifact(f.store);
    const deps = { ...f.deps, keyring: undefined };
    await expect(runTemplate(templateEvent('c1', fetchKey), deps, async () => ({}))).rejects.toThrow(
      'no artifact keyring is configured',
    );
    expect((await allStoredBytes(f.store)).bytes).not.toContain(SECRET_VALUE);
  });

  it('keeps a render with a Secret object private even when no input was a Secret', async () => {
    const manifest = `apiVersion: v1\nkind: Secret\nmetadata:\n  name: gen\nstringData:\n  p: ${SECRET_VALUE}\n`;
    const f = fleet(appWith({}), manifest);
    const fetchKey = await putFetchArtifact(f.store);
    const out1 = await runTemplate(templateEvent('c1', fetchKey), f.deps, async () => ({}));
    expect(isPrivateKey(out1.deploy?.artifacts.manifestKey ?? '')).toBe(true);
    expect((await allStoredBytes(f.store)).bytes).not.toContain(SECRET_VALUE);
    await runTemplate(templateEvent('c2', fetchKey), f.deps, async () => ({}));
    expect(f.runner.calls.filter((c) => c.cmd === 'ytt')).toHaveLength(2);
    await runTemplate(templateEvent('c1', fetchKey), f.deps, async () => ({}));
    expect(f.runner.calls.filter((c) => c.cmd === 'ytt')).toHaveLength(2);
  });
});

describe('runTemplate with public inputs', () => {
  it('shares one render between two clusters under the content-addressed key', async () => {
    const f = fleet(appWith({}), PUBLIC_MANIFEST);
    const fetchKey = await putFetchArtifact(f.store);
    const out1 = await runTemplate(templateEvent('c1', fetchKey), f.deps, async () => ({}));
    const out2 = await runTemplate(templateEvent('c2', fetchKey), f.deps, async () => ({}));
    expect(f.runner.calls.filter((c) => c.cmd === 'ytt')).toHaveLength(1);
    expect(out1.deploy?.artifacts.manifestKey).toBe(`artifacts/template/sha256/${sha256Hex(PUBLIC_MANIFEST)}.yaml`);
    expect(out2.deploy?.artifacts.manifestKey).toBe(out1.deploy?.artifacts.manifestKey);
    expect((await f.store.list('private/')).length).toBe(0);
  });
});

describe('runFetch with a secretRef source', () => {
  const COMMIT = 'a'.repeat(40);
  const APP = appWith({ fetch: [{ git: { url: 'https://g.example/x', ref: COMMIT, secretRef: { name: 'creds' } } }] });
  const ctx = (c: string) => ({
    clusterId: c,
    ref: refOf(c),
    run: { generation: 1, runId: `r-${c}`, startedAt: T0.toISOString() },
  });

  it('seals the fetched content and the pinned record per cluster; another cluster fetches itself', async () => {
    const f = fleet(APP, PUBLIC_MANIFEST);
    const out1 = await runFetch(ctx('c1'), { raw: APP as never, app: APP }, f.deps);
    const key1 = out1.template?.artifacts.fetchKey ?? '';
    expect(isPrivateKey(key1)).toBe(true);
    expect(TemplateStageDataSchema.safeParse(out1.template).success).toBe(true);
    const stored = await allStoredBytes(f.store);
    expect(stored.keys.every((k) => k.startsWith('private/'))).toBe(true);
    expect(stored.keys).toHaveLength(2); // artifact + pinned record
    expect(stored.bytes).not.toContain(SECRET_VALUE);
    // Pinned: the same cluster reuses its own artifact without vendir.
    const again = await runFetch(ctx('c1'), { raw: APP as never, app: APP }, f.deps);
    expect(again.template?.artifacts.fetchKey).toBe(key1);
    expect(f.runner.calls.filter((c) => c.cmd === 'vendir')).toHaveLength(1);
    // Another cluster with the same source and the same credentials: fetched again, own key.
    const out2 = await runFetch(ctx('c2'), { raw: APP as never, app: APP }, f.deps);
    expect(f.runner.calls.filter((c) => c.cmd === 'vendir')).toHaveLength(2);
    expect(out2.template?.artifacts.fetchKey).not.toBe(key1);
    // The template stage opens the artifact only with its own cluster's key.
    const tgz = await readArtifact(f.deps, { clusterId: 'c1', namespace: 'ns' }, key1);
    expect(tgz?.length).toBeGreaterThan(0);
    await expect(readArtifact(f.deps, { clusterId: 'c2', namespace: 'ns' }, key1)).rejects.toThrow(SealError);
  });
});

describe('the Lambda functions key source', () => {
  const ARN = 'arn:aws:secretsmanager:eu-west-1:123456789012:secret:ArtifactRootKey-AbCdEf';

  /** A Secrets Manager client at the port: answers GetSecretValue from `answer`, records ids. */
  function fakeSecretsManager(answer: (id: string) => Promise<string>) {
    const reads: string[] = [];
    const client = {
      send: async (cmd: unknown) => {
        expect(cmd).toBeInstanceOf(GetSecretValueCommand);
        const id = String((cmd as GetSecretValueCommand).input.SecretId);
        reads.push(id);
        return { SecretString: await answer(id) };
      },
    };
    return { client: client as unknown as SecretsManagerClient, reads };
  }

  it('requires the secret variable, and refuses a key in the variables without quoting it', () => {
    const { client, reads } = fakeSecretsManager(async () => ROOT.toString('base64'));
    expect(() => artifactKeyringFromEnv('template', {}, client)).toThrow(
      'invalid configuration of the template function: KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: required: a Secrets Manager secret ARN or name, or file:///absolute/path',
    );
    for (const bad of ['not a name!', 'file://relative/key', 's3://bucket/key']) {
      expect(() => artifactKeyringFromEnv('fetch', { KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: bad }, client)).toThrow(
        'KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: expected a Secrets Manager secret ARN or name, or file:///absolute/path',
      );
    }
    const plaintext = ROOT.toString('base64');
    let thrown: unknown;
    try {
      artifactKeyringFromEnv(
        'deploy',
        { KAPP_LAMBDA_ARTIFACT_ROOT_KEY: plaintext, KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: ARN },
        client,
      );
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(ConfigError);
    expect((thrown as Error).message).toBe(
      "invalid configuration of the deploy function: KAPP_LAMBDA_ARTIFACT_ROOT_KEY: a key in the function's variables is no longer read; put it in a secret and set KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET",
    );
    expect(reads).toEqual([]);
  });

  it('reads the secret once per process, from the cold start, and derives the same cluster keys in every function', async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((r) => {
      release = r;
    });
    const { client, reads } = fakeSecretsManager(async () => {
      await gate;
      return `${ROOT.toString('base64')}\n`;
    });
    const fetchRing = artifactKeyringFromEnv('fetch', { KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: ARN }, client);
    expect(reads).toEqual([]); // nothing read until the entry warms it
    fetchRing.warm();
    // Started at once (its first await is loading the Secrets Manager store module).
    await vi.waitFor(() => expect(reads).toEqual([ARN]));
    const pending = Promise.all([fetchRing.keysFor('c1'), fetchRing.keysFor('c2')]);
    release();
    const [c1, c2] = await pending;
    expect(await fetchRing.keysFor('c1')).toBe(c1);
    expect(reads).toEqual([ARN]);
    const expected = new DerivedKeyring(ROOT);
    expect(c1.encKey.equals((await expected.keysFor('c1')).encKey)).toBe(true);
    expect(c2.tag).toBe((await expected.keysFor('c2')).tag);
    // The deploy function, another process with the same secret, derives the same keys.
    const byName = fakeSecretsManager(async () => ROOT.toString('base64'));
    const deployRing = artifactKeyringFromEnv(
      'deploy',
      { KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: 'kapp-lambda/artifact-root-key' },
      byName.client,
    );
    expect((await deployRing.keysFor('c1')).macKey.equals(c1.macKey)).toBe(true);
    expect(byName.reads).toEqual(['kapp-lambda/artifact-root-key']);
  });

  it('a failed read fails the stage that needs a key (naming the secret, not a value) and is read again next time', async () => {
    let fail = true;
    const { client, reads } = fakeSecretsManager(async () => {
      if (fail) throw Object.assign(new Error('User is not authorized'), { name: 'AccessDeniedException' });
      return ROOT.toString('base64');
    });
    const ring = artifactKeyringFromEnv('template', { KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: ARN }, client);
    ring.warm(); // a failed cold-start read is not an unhandled rejection
    await expect(ring.keysFor('c1')).rejects.toThrow(`reading secret ${ARN}: AccessDeniedException`);
    fail = false;
    expect((await ring.keysFor('c1')).tag).toBe((await new DerivedKeyring(ROOT).keysFor('c1')).tag);
    expect(reads.length).toBeGreaterThanOrEqual(2);
    expect(reads.every((id) => id === ARN)).toBe(true);
  });

  it('refuses a secret that is not base64 of 32+ bytes without quoting it', async () => {
    const { client } = fakeSecretsManager(async () => 'c2hvcnQ=');
    const ring = artifactKeyringFromEnv('fetch', { KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: ARN }, client);
    const err = await ring.keysFor('c1').then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message).toBe(
      `KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET (${ARN}): expected base64 of at least 32 random bytes`,
    );
  });

  it('reads a file:// secret (local setups), never Secrets Manager', async () => {
    const file = join(tmp, 'root-key.b64');
    await writeFile(file, ROOT.toString('base64'), { mode: 0o600 });
    const { client, reads } = fakeSecretsManager(async () => 'unused');
    const ring = artifactKeyringFromEnv('fetch', { KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: `file://${file}` }, client);
    expect((await ring.keysFor('c1')).tag).toBe((await new DerivedKeyring(ROOT).keysFor('c1')).tag);
    expect(reads).toEqual([]);
  });
});
