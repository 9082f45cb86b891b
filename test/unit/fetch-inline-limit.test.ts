/**
 * The cap on an App's inline fetch content (`../../functions/lib/fetch/inline-limit.ts`): through
 * the fetch stage (`runFetch`) with the shared fake cluster, whose Secret and ConfigMap reads are
 * counted at the port. Under the cap the fetch runs as before; over it (by `paths`, by `pathsFrom`
 * Secrets, by ConfigMaps' `data` or `binaryData`) it fails with the exact `Fetching` status before
 * vendir runs, and no object after the one that passed the cap is read.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { exitWith, type Responder } from '../../functions/lib/exec/fake.js';
import { DEFAULT_MAX_INLINE_BYTES } from '../../functions/lib/fetch/inline-limit.js';
import {
  appObject,
  appWorld,
  fetchAsRead,
  finalFailed,
  NOW,
  REF,
  SUCCEEDED_BEFORE,
  vendirWrites,
} from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('fetch-inline-limit-');

/** A value no status may show: the decoded bytes of every Secret below start with it. */
const SECRET_MARK = 'do-not-show-';

/** `n` bytes of Secret content, starting with {@link SECRET_MARK}. */
const secretBytes = (n: number) => Buffer.from(SECRET_MARK + 'x'.repeat(Math.max(0, n - SECRET_MARK.length)));

interface Objects {
  /** Secret name → key → value. */
  secrets?: Record<string, Record<string, Buffer>>;
  /** ConfigMap name → its `data` and `binaryData`. */
  configMaps?: Record<string, { data?: Record<string, string>; binaryData?: Record<string, Buffer> }>;
}

/**
 * Runs the fetch stage once for an App with `fetch`, the objects in its namespace, and the cap
 * `maxInlineBytes` (unset: the default); `vendir` answers each vendir run (default: it writes the
 * tree). The retries' waits are instant.
 *
 * @returns the statuses written, the objects read in order (`secret/<name>`, `configmap/<name>`),
 *   vendir's stdin (when it ran; `stdins`: every run's) and the stage's output.
 */
async function fetchWith(
  fetch: unknown[],
  objects: Objects,
  maxInlineBytes?: number,
  vendir: (w: ReturnType<typeof appWorld>) => Responder = () => vendirWrites(),
) {
  const w = appWorld({
    app: appObject({ status: SUCCEEDED_BEFORE, spec: { fetch } }),
    tmpRoot: path.join(tempDir(), 'scratch'),
    ...(maxInlineBytes === undefined ? {} : { config: { maxInlineBytes } }),
    // A fetch with a Secret is sealed for the App's namespace.
    extra: { keyring: new DerivedKeyring(Buffer.alloc(32, 7)), sleep: async () => {} },
  });
  for (const [name, data] of Object.entries(objects.secrets ?? {})) {
    w.cluster.secrets.set(`${REF.namespace}/${name}`, {
      metadata: { name, namespace: REF.namespace, uid: `uid-${name}`, resourceVersion: '1' },
      type: 'Opaque',
      data,
    });
  }
  for (const [name, cm] of Object.entries(objects.configMaps ?? {})) {
    w.cluster.configMaps.set(`${REF.namespace}/${name}`, {
      metadata: { name, namespace: REF.namespace, uid: `uid-${name}`, resourceVersion: '1' },
      data: cm.data ?? {},
      binaryData: cm.binaryData ?? {},
    });
  }
  // Every read through the port, in order: the fake cluster itself counts only object GETs.
  const reads: string[] = [];
  const getSecret = w.cluster.getSecret.bind(w.cluster);
  const getConfigMap = w.cluster.getConfigMap.bind(w.cluster);
  w.cluster.getSecret = async (ns, name) => {
    reads.push(`secret/${name}`);
    return getSecret(ns, name);
  };
  w.cluster.getConfigMap = async (ns, name) => {
    reads.push(`configmap/${name}`);
    return getConfigMap(ns, name);
  };
  w.runner.on('vendir', vendir(w));
  const out = await fetchAsRead(w);
  const stdins = w.runner.calls.filter((c) => c.cmd === 'vendir').map((c) => c.stdin ?? '');
  return { statuses: w.statuses(), reads, stdin: stdins[0], stdins, out };
}

/** The final status of a fetch refused by the cap with `message`. */
function refused(message: string) {
  return [finalFailed(message, message, { fetch: { exitCode: -1, error: message, startedAt: NOW, updatedAt: NOW } })];
}

/** The error naming the source that passed the cap. */
const over = (i: number, source: string, total: number, max: number) =>
  `Fetching (${i}): inline ${source} brings the App's inline content to ${total} bytes, over the limit of ${max} bytes`;

const fromSecrets = (...names: string[]) => names.map((name) => ({ secretRef: { name } }));

describe('inline fetch content cap', () => {
  it('defaults to 64 MiB', () => {
    expect(DEFAULT_MAX_INLINE_BYTES).toBe(64 * 1024 * 1024);
  });

  it('under the cap (exactly at it included): vendir runs with every object, each read once', async () => {
    // paths: 5 + 5 bytes; s1: 2 + 100; s2 (twice): 2 × (2 + 50); cm: 1 + 4 + 2 + 20.
    const r = await fetchWith(
      [
        { inline: { paths: { 'a.yml': 'a: 1\n' }, pathsFrom: fromSecrets('s1', 's2') } },
        { inline: { pathsFrom: [...fromSecrets('s2'), { configMapRef: { name: 'cm' } }] } },
      ],
      {
        secrets: { s1: { k1: secretBytes(100) }, s2: { k2: secretBytes(50) } },
        configMaps: { cm: { data: { c: 'c: 1' }, binaryData: { bb: Buffer.alloc(20) } } },
      },
      10 + 102 + 104 + 27,
    );
    expect(r.statuses).toEqual([]);
    expect(r.reads).toEqual(['secret/s1', 'secret/s2', 'configmap/cm']);
    expect(r.out.template?.artifacts.fetchKey).toBeDefined();
    // vendir is given the objects as before: one document each.
    expect(r.stdin?.match(/^kind: (Secret|ConfigMap)$/gm)).toEqual(['kind: Secret', 'kind: Secret', 'kind: ConfigMap']);
  });

  it('over the cap by paths: fails before reading any object', async () => {
    const r = await fetchWith(
      [
        { inline: { paths: { 'a.yml': 'a: 1\n' }, pathsFrom: fromSecrets('s1') } },
        { inline: { paths: { 'b.yml': 'b'.repeat(100) } } },
      ],
      { secrets: { s1: { k: secretBytes(10) } } },
      100,
    );
    expect(r.statuses).toEqual(refused(over(1, 'paths', 10 + 105, 100)));
    expect(r.reads).toEqual([]);
    expect(r.stdin).toBeUndefined();
  });

  it('over the cap by pathsFrom Secrets: names the Secret, reads none after it, shows none of its bytes', async () => {
    const r = await fetchWith(
      [
        { inline: { pathsFrom: fromSecrets('s1', 's2') } },
        { inline: { pathsFrom: fromSecrets('s3', 's4') } },
        // A credentials Secret of another source: read first, for the fetch's cache key.
        { image: { url: 'registry.example/x:1', secretRef: { name: 'creds' } } },
      ],
      {
        secrets: {
          s1: { k: secretBytes(99) },
          s2: { k: secretBytes(99) },
          s3: { k: secretBytes(99) },
          s4: { k: secretBytes(99) },
          creds: { k: secretBytes(10) },
        },
      },
      250,
    );
    expect(r.statuses).toEqual(refused(over(1, 'pathsFrom secret "s3"', 300, 250)));
    expect(r.reads).toEqual(['secret/creds', 'secret/s1', 'secret/s2', 'secret/s3']);
    expect(r.stdin).toBeUndefined();
    const written = JSON.stringify(r.statuses);
    expect(written).not.toContain(SECRET_MARK);
    expect(written).not.toContain(secretBytes(99).toString('base64').slice(0, 12));
  });

  it('over the cap by a Secret named twice: each reference counts, the Secret is read once', async () => {
    const r = await fetchWith(
      [
        {
          inline: { pathsFrom: [{ secretRef: { name: 's1' } }, { secretRef: { name: 's1', directoryPath: 'again' } }] },
        },
      ],
      { secrets: { s1: { k: secretBytes(99) } } },
      150,
    );
    expect(r.statuses).toEqual(refused(over(0, 'pathsFrom secret "s1"', 200, 150)));
    expect(r.reads).toEqual(['secret/s1']);
  });

  it('over the cap by pathsFrom ConfigMaps, binaryData counted decoded: reads none after the one that passed it', async () => {
    const r = await fetchWith(
      [
        {
          inline: {
            pathsFrom: [
              { configMapRef: { name: 'c1' } },
              { configMapRef: { name: 'c2' } },
              { configMapRef: { name: 'c3' } },
            ],
          },
        },
      ],
      {
        configMaps: {
          c1: { data: { a: 'x'.repeat(59) } },
          c2: { binaryData: { b: Buffer.alloc(59) } },
          c3: { data: { c: 'small' } },
        },
      },
      100,
    );
    expect(r.statuses).toEqual(refused(over(0, 'pathsFrom configmap "c2"', 120, 100)));
    expect(r.reads).toEqual(['configmap/c1', 'configmap/c2']);
  });

  it('counts a ConfigMap data value in UTF-8 bytes, not characters', async () => {
    const r = await fetchWith(
      [{ inline: { pathsFrom: [{ configMapRef: { name: 'c1' } }] } }],
      { configMaps: { c1: { data: { a: 'é'.repeat(30) } } } },
      60,
    );
    expect(r.statuses).toEqual(refused(over(0, 'pathsFrom configmap "c1"', 61, 60)));
  });

  it('over the cap by credentials Secrets (one per source): names the one that passed it, reads none after it, runs no vendir', async () => {
    const sources = ['c1', 'c2', 'c3'].map((name, i) => ({
      image: { url: `registry.example/x${i}:1`, secretRef: { name } },
    }));
    const r = await fetchWith(
      sources,
      { secrets: { c1: { k: secretBytes(99) }, c2: { k: secretBytes(99) }, c3: { k: secretBytes(99) } } },
      150,
    );
    const message = `Fetching: secret "c2" brings the App's referenced Secrets and ConfigMaps to 200 bytes, over the limit of 150 bytes`;
    expect(r.statuses).toEqual(refused(message));
    expect(r.reads).toEqual(['secret/c1', 'secret/c2']);
    expect(r.stdin).toBeUndefined();
    expect(JSON.stringify(r.statuses)).not.toContain(SECRET_MARK);
  });

  it('a missing object still fails as upstream, with the not-found text', async () => {
    const r = await fetchWith([{ inline: { pathsFrom: fromSecrets('gone') } }], {}, 100);
    expect(r.statuses).toEqual(refused('Fetching: secrets "gone" not found'));
    expect(r.reads).toEqual(['secret/gone']);
  });
});

const refusedBy = (name: string, total: number, max: number) =>
  `Fetching: secret "${name}" brings the App's referenced Secrets and ConfigMaps to ${total} bytes, over the limit of ${max} bytes`;

describe('fetch: referenced cap bypasses', () => {
  it('a source naming two kinds: the Secret vendir is given (the image one) is the one counted', async () => {
    // fetchSecretName picked git before image, vendir's config (fetchSourceKind) image first: the
    // cap counted "tiny" three times over, vendir was given b1, b2 and b3 (300 bytes, cap 150).
    const sources = ['b1', 'b2', 'b3'].map((name, i) => ({
      image: { url: `registry.example/x${i}:1`, secretRef: { name } },
      git: { url: `https://git.example/x${i}`, ref: 'origin/main', secretRef: { name: 'tiny' } },
    }));
    const big = { k: secretBytes(99) };
    const r = await fetchWith(sources, { secrets: { tiny: { k: secretBytes(5) }, b1: big, b2: big, b3: big } }, 150);
    const message = refusedBy('b2', 200, 150);
    expect(r.statuses).toEqual(refused(message));
    expect(r.reads).toEqual(['secret/b1', 'secret/b2']);
    expect(r.stdin).toBeUndefined();
  });

  it('the retry reads the credentials Secrets again: grown meanwhile, they are counted', async () => {
    const sources = ['c1', 'c2', 'c3'].map((name, i) => ({
      image: { url: `registry.example/x${i}:1`, secretRef: { name } },
    }));
    const small = { k: secretBytes(20) };
    const r = await fetchWith(sources, { secrets: { c1: small, c2: small, c3: small } }, 150, (w) => (_req) => {
      // The tenant grows its Secrets while vendir fails (image pull denied): the retry re-plans.
      for (const name of ['c1', 'c2', 'c3']) {
        const s = w.cluster.secrets.get(`${REF.namespace}/${name}`);
        if (s) w.cluster.secrets.set(`${REF.namespace}/${name}`, { ...s, data: { k: secretBytes(99) } });
      }
      return exitWith(1, 'Error: pulling image: denied');
    });
    // Before: the retry read c1..c3 (297 bytes, cap 150) past the memo, uncounted, and ran vendir
    // with all three.
    expect(r.stdins.length).toBe(1);
    expect(r.statuses.at(-1)?.fetch?.error).toBe(refusedBy('c2', 200, 150));
    expect(JSON.stringify(r.statuses)).not.toContain(SECRET_MARK);
  });
});
