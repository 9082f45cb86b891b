import { describe, expect, it } from 'vitest';
import type { AppFetch } from '../../functions/lib/api/index.js';
import { fetchSourceIdentity, pinnedFetchIdentity } from '../../functions/lib/fetch/pinned.js';

const SHA1 = 'b3619f0a83392ac5e10e298f1f4df980683d8328';
const DIGEST = `sha256:${'a'.repeat(64)}`;

describe('fetchSourceIdentity', () => {
  it.each([
    [{ git: { url: 'u', ref: SHA1 } }, true],
    [{ git: { url: 'u', ref: SHA1.toUpperCase() } }, true],
    [{ git: { url: 'u', ref: 'f'.repeat(64) } }, true],
    [{ git: { url: 'u', ref: SHA1.slice(0, 12) } }, false],
    [{ git: { url: 'u', ref: 'origin/develop' } }, false],
    [{ git: { url: 'u', ref: 'v1.0.0' } }, false],
    [{ git: { url: 'u', ref: SHA1, refSelection: { semver: {} } } }, false],
    [{ image: { url: `reg.io/app@${DIGEST}` } }, true],
    [{ image: { url: 'reg.io/app:1.0' } }, false],
    [{ image: { url: `reg.io/app@${DIGEST}`, tagSelection: { semver: {} } } }, false],
    [{ imgpkgBundle: { image: `reg.io/b:1.0@${DIGEST}` } }, true],
    [{ imgpkgBundle: { image: 'reg.io/b:1.0' } }, false],
    [{ http: { url: 'https://x/a.tgz', sha256: 'b'.repeat(64) } }, true],
    [{ http: { url: 'https://x/a.tgz', sha256: 'short' } }, false],
    [{ http: { url: 'https://x/a.tgz' } }, false],
    [{ helmChart: { name: 'redis', version: '17.3.17', repository: { url: 'https://charts' } } }, false],
    [{ inline: { paths: { 'a.yml': 'a' } } }, false],
  ] as Array<[AppFetch, boolean]>)('%j pinned=%s', (entry, pinned) => {
    const id = fetchSourceIdentity(entry)!;
    expect(id.pinned).toBe(pinned);
    expect(id.cacheKey).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(id.reason).not.toBe('');
  });

  it('is undefined for an entry without a source', () => {
    expect(fetchSourceIdentity({ path: 'x' })).toBeUndefined();
  });

  it('keys on content only: credentials, TLS, depth, basic auth and path do not change the key', () => {
    const base = fetchSourceIdentity({ git: { url: 'u', ref: SHA1, subPath: 's' } })!.cacheKey;
    const same = fetchSourceIdentity({
      git: { url: 'u', ref: SHA1, subPath: 's', secretRef: { name: 'x' }, depth: 0, forceHTTPBasicAuth: true },
      path: 'dest',
    })!.cacheKey;
    expect(same).toBe(base);
  });

  it('changes the key when content-defining fields change', () => {
    const keys = new Set(
      [
        { git: { url: 'u', ref: SHA1 } },
        { git: { url: 'u2', ref: SHA1 } },
        { git: { url: 'u', ref: SHA1, subPath: 's' } },
        { git: { url: 'u', ref: SHA1, lfsSkipSmudge: true } },
        { image: { url: `r/a@${DIGEST}` } },
        { image: { url: `r/a@${DIGEST}`, subPath: 'x' } },
        { http: { url: 'https://x/a.tgz', sha256: 'b'.repeat(64) } },
        { http: { url: 'https://x/b.tgz', sha256: 'b'.repeat(64) } },
      ].map((e) => fetchSourceIdentity(e as AppFetch)!.cacheKey),
    );
    expect(keys.size).toBe(8);
  });

  it('is stable across runs and field order', () => {
    const a = fetchSourceIdentity({ git: { url: 'u', ref: SHA1, subPath: 's' } })!.cacheKey;
    const b = fetchSourceIdentity({ git: { subPath: 's', ref: SHA1, url: 'u' } })!.cacheKey;
    expect(a).toBe(b);
    // sha256 of the canonical JSON {"ref":...,"source":"git","subPath":"s","url":"u","v":1}
    expect(a).toBe('sha256:e81f2ec6450fee50ed18ace312a6b9b4b9852013bc261dac6b3d99e115e4252b');
  });
});

describe('a helm chart pinned by the source poll', () => {
  const chart: AppFetch = { helmChart: { name: 'redis', version: '17.3.17', repository: { url: 'https://charts' } } };
  const at = (hex: string) => `17.3.17@sha256:${hex.repeat(64)}`;

  it('is pinned only with a resolution of its own version, which joins the key', () => {
    expect(fetchSourceIdentity(chart, at('a'))?.pinned).toBe(true);
    // A resolution of another version is not this entry's pin.
    expect(fetchSourceIdentity(chart, `17.3.18@sha256:${'a'.repeat(64)}`)?.pinned).toBe(false);
    expect(
      fetchSourceIdentity({ helmChart: { name: 'redis', repository: { url: 'https://charts' } } }, at('a'))?.pinned,
    ).toBe(false);
    expect(fetchSourceIdentity(chart, at('a'))?.cacheKey).not.toBe(fetchSourceIdentity(chart, at('b'))?.cacheKey);
  });

  it('the whole fetch: Apps on one version and digest share a key, a republished version gets another', () => {
    const key = (resolved?: string) =>
      pinnedFetchIdentity([chart], 'v0.44', {}, '', resolved ? new Map([[chart, resolved]]) : new Map());
    expect(key()).toBeUndefined();
    expect(key(at('a'))).toMatch(/^[0-9a-f]{64}$/);
    expect(key(at('a'))).toBe(key(at('a')));
    expect(key(at('b'))).not.toBe(key(at('a')));
  });
});
