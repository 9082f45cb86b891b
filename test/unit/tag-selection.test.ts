/**
 * Tag selections resolved without vendir (`functions/lib/fetch/tag-selection.ts`), faked at their
 * ports: vendir's choice among tags (constraints, prereleases, a leading `v`, tags that are not
 * semver skipped, vendir's error when none is left), the registry's tag list (pages, one token
 * exchange for the list and the chosen tag's `HEAD`) and `git ls-remote --tags` (argv, peeled
 * annotated tags). The real registry and git server: `test/integration/source-resolve.test.ts`.
 */
import { describe, expect, it } from 'vitest';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { GitResolveError } from '../../functions/lib/fetch/git-ls-remote.js';
import { RegistryResolveError } from '../../functions/lib/fetch/registry-digest.js';
import { resolveSource } from '../../functions/lib/fetch/source-resolve.js';
import {
  listImageTags,
  resolveGitSelection,
  resolveImageSelection,
  SelectionResolveError,
  selectTag,
  semverSelectionOf,
} from '../../functions/lib/fetch/tag-selection.js';

const DIGEST = `sha256:${'d'.repeat(64)}`;
const A = 'a'.repeat(40);
const B = 'b'.repeat(40);
const C = 'c'.repeat(40);

describe('selectTag: vendir HighestConstrainedVersion', () => {
  const TAGS = ['latest', 'v1.0.0', '1.1.0', 'sha-0f3e', '1.2.0-rc.1', '1.2.0-beta.2', '2.0.0', '1.2'];

  it.each([
    [{}, '2.0.0'],
    [{ constraints: '<2.0.0' }, '1.1.0'],
    [{ constraints: '<1.1.0' }, 'v1.0.0'],
    // Prereleases only when asked for: all ({}), or those with a listed identifier.
    [{ constraints: '<2.0.0', prereleases: {} }, '1.2.0-rc.1'],
    [{ constraints: '<2.0.0', prereleases: { identifiers: ['beta'] } }, '1.2.0-beta.2'],
    [{ constraints: '<2.0.0', prereleases: { identifiers: ['alpha'] } }, '1.1.0'],
  ])('%j picks %s (tags that are not semver skipped, a leading v kept)', (selection, want) => {
    expect(selectTag(TAGS, selection)).toBe(want);
  });

  it("fails with vendir's message when no tag is left", () => {
    expect(() => selectTag(TAGS, { constraints: '>3.0.0' }, 'Determining tag selection: ')).toThrow(
      new SelectionResolveError(
        'Determining tag selection: Expected to find at least one version, but did not (details: all=5 -> after-prereleases-filter=3 -> after-constraints-filter=0)',
      ),
    );
  });

  it('normalizes a selection for the record key; none for a constraint that does not parse or no semver', () => {
    expect(semverSelectionOf({ semver: { constraints: '>=1.0.0', prereleases: { identifiers: [] } } })).toEqual({
      constraints: '>=1.0.0',
      prereleases: {},
    });
    expect(semverSelectionOf({ semver: { constraints: '' } })).toEqual({});
    expect(semverSelectionOf({ semver: { constraints: '>0' } })).toBeUndefined();
    expect(semverSelectionOf({ semver: { constraints: '^1.0.0' } })).toBeUndefined();
    expect(semverSelectionOf({})).toBeUndefined();
  });
});

interface Seen {
  method: string;
  url: string;
  authorization?: string;
}

/** A registry behind a Bearer challenge: tags in pages of two, one manifest per tag. */
function fakeRegistry(tags: string[], opts: { linkOrigin?: string } = {}) {
  const seen: Seen[] = [];
  const fetchImpl = (async (input: URL | string, init?: RequestInit) => {
    const url = new URL(String(input));
    const headers = init?.headers as Record<string, string>;
    seen.push({
      method: init?.method ?? 'GET',
      url: url.href,
      ...(headers.authorization ? { authorization: headers.authorization } : {}),
    });
    if (url.host === 'auth.io') return Response.json({ token: 'T0K' });
    if (headers.authorization !== 'Bearer T0K') {
      return new Response(null, {
        status: 401,
        headers: { 'www-authenticate': 'Bearer realm="https://auth.io/token",service="reg.io"' },
      });
    }
    if (url.pathname.endsWith('/tags/list')) {
      const from = Number(url.searchParams.get('last') ?? 0);
      const page = tags.slice(from, from + 2);
      const more = from + 2 < tags.length;
      const link = `<${opts.linkOrigin ?? ''}/v2/team/repo/tags/list?n=2&last=${from + 2}>; rel="next"`;
      return Response.json({ name: 'team/repo', tags: page }, { headers: more ? { link } : {} });
    }
    return new Response(null, { headers: { 'docker-content-digest': DIGEST } });
  }) as typeof fetch;
  return { fetchImpl, seen };
}

describe('image tag selection', () => {
  it('lists every page, picks the highest match and HEADs it, with one token exchange', async () => {
    const { fetchImpl, seen } = fakeRegistry(['1.0.0', 'latest', '1.3.0', '2.0.0', 'v1.2.0']);
    const resolved = await resolveImageSelection('reg.io/team/repo', { constraints: '<2.0.0' }, { fetchImpl });
    expect(resolved).toBe(`1.3.0@${DIGEST}`);
    expect(seen.map((s) => `${s.method} ${s.url}`)).toEqual([
      'GET https://reg.io/v2/team/repo/tags/list',
      'GET https://auth.io/token?service=reg.io&scope=repository%3Ateam%2Frepo%3Apull',
      'GET https://reg.io/v2/team/repo/tags/list',
      'GET https://reg.io/v2/team/repo/tags/list?n=2&last=2',
      'GET https://reg.io/v2/team/repo/tags/list?n=2&last=4',
      'HEAD https://reg.io/v2/team/repo/manifests/1.3.0',
    ]);
  });

  it('refuses a next page on another origin, and a URL that names a tag', async () => {
    const { fetchImpl } = fakeRegistry(['1.0.0', '1.1.0', '1.2.0'], { linkOrigin: 'https://evil.io' });
    await expect(listImageTags('reg.io/team/repo', { fetchImpl })).rejects.toThrow(
      new RegistryResolveError('tag list links to another origin'),
    );
    await expect(listImageTags('reg.io/team/repo:v1', { fetchImpl })).rejects.toBeInstanceOf(RegistryResolveError);
  });

  it("reports vendir's message when no tag matches", async () => {
    const { fetchImpl } = fakeRegistry(['1.0.0']);
    await expect(resolveImageSelection('reg.io/team/repo', { constraints: '>1.0.0' }, { fetchImpl })).rejects.toThrow(
      'Determining tag selection: Expected to find at least one version',
    );
  });
});

describe('git ref selection', () => {
  const out = [
    `${A}\trefs/tags/v1.0.0`,
    `${B}\trefs/tags/v1.1.0`,
    `${C}\trefs/tags/v1.1.0^{}`,
    `${A}\trefs/tags/v2.0.0-rc.1`,
    `${A}\trefs/tags/release`,
  ].join('\n');

  it('one git ls-remote --tags, options before --; the highest tag, an annotated one peeled', async () => {
    const runner = new FakeCommandRunner().on('git', { stdout: out });
    expect(await resolveGitSelection(runner, 'https://git.io/r', {})).toBe(C);
    expect(runner.argv()).toEqual([
      ['git', '-c', 'credential.helper=', 'ls-remote', '--tags', '--', 'https://git.io/r'],
    ]);
    expect(await resolveGitSelection(runner, 'https://git.io/r', { constraints: '<1.1.0' })).toBe(A);
    expect(await resolveGitSelection(runner, 'https://git.io/r', { prereleases: {} })).toBe(A);
    await expect(resolveGitSelection(runner, 'https://git.io/r', { constraints: '>3.0.0' })).rejects.toThrow(
      new SelectionResolveError(
        'Expected to find at least one version, but did not (details: all=3 -> after-prereleases-filter=2 -> after-constraints-filter=0)',
      ),
    );
  });

  it('refuses a URL before git runs', async () => {
    const runner = new FakeCommandRunner();
    await expect(resolveGitSelection(runner, '--upload-pack=x', {})).rejects.toBeInstanceOf(GitResolveError);
    expect(runner.calls).toEqual([]);
  });

  it('resolveSource resolves a selection source by its selection', async () => {
    const runner = new FakeCommandRunner().on('git', { stdout: out });
    const source = { kind: 'git', url: 'https://git.io/r', ref: 'semver <1.1.0', selection: { constraints: '<1.1.0' } };
    expect(await resolveSource(source as never, { runner })).toBe(A);
  });
});
