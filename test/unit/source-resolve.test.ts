/**
 * Tag → digest resolution without vendir, faked at its ports: the registry client's `fetch`
 * (the distribution API's token flow, basic auth, redirects under the URL check, the GET fallback)
 * and the command runner of `git ls-remote` (argv shape, refused values, ref precedence).
 * The real registry and git server: `test/integration/source-resolve.test.ts`.
 */
import { createServer, type Socket } from 'node:net';
import { describe, expect, it } from 'vitest';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { commitFromLsRemote, GitResolveError, resolveGitRef } from '../../functions/lib/fetch/git-ls-remote.js';
import {
  MANIFEST_ACCEPT,
  parseChallenge,
  parseImageTagRef,
  pinImageRef,
  RegistryResolveError,
  resolveImageDigest,
} from '../../functions/lib/fetch/registry-digest.js';
import { resolveSource } from '../../functions/lib/fetch/source-resolve.js';
import { UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';

const DIGEST = `sha256:${'d'.repeat(64)}`;

interface Seen {
  method: string;
  url: string;
  headers: Record<string, string>;
}

/** A fake `fetch` answering from `route(request)`; records every request. */
function fakeFetch(route: (req: Seen) => Response): { fetchImpl: typeof fetch; seen: Seen[] } {
  const seen: Seen[] = [];
  const fetchImpl = (async (input: URL | string, init?: RequestInit) => {
    const req = {
      method: init?.method ?? 'GET',
      url: String(input),
      headers: { ...(init?.headers as Record<string, string>) },
    };
    seen.push(req);
    return route(req);
  }) as typeof fetch;
  return { fetchImpl, seen };
}

describe('parseImageTagRef', () => {
  it.each([
    ['registry.corp.com/pkgs/repo:v1', { registry: 'registry.corp.com', repository: 'pkgs/repo', tag: 'v1' }],
    ['127.0.0.1:5000/repo', { registry: '127.0.0.1:5000', repository: 'repo', tag: 'latest' }],
    ['nginx', { registry: 'index.docker.io', repository: 'library/nginx', tag: 'latest' }],
    ['docker.io/bitnami/redis:7', { registry: 'index.docker.io', repository: 'bitnami/redis', tag: '7' }],
    ['localhost/x/y:t', { registry: 'localhost', repository: 'x/y', tag: 't' }],
  ])('%s', (ref, want) => {
    expect(parseImageTagRef(ref)).toEqual(want);
  });

  it.each(['r.io/x@sha256:abc', '-r.io/x:v1', 'r.io/UPPER:v1', 'r.io/x:-bad', 'r.io/x y:v1'])('refuses %s', (ref) => {
    expect(parseImageTagRef(ref)).toBeUndefined();
  });

  it("pins a reference by digest, keeping its tag (for the lock's `tag:`)", () => {
    expect(pinImageRef('127.0.0.1:5000/repo:v1', DIGEST)).toBe(`127.0.0.1:5000/repo:v1@${DIGEST}`);
    expect(pinImageRef('127.0.0.1:5000/repo', DIGEST)).toBe(`127.0.0.1:5000/repo@${DIGEST}`);
    expect(pinImageRef(`127.0.0.1:5000/repo:v1@sha256:${'0'.repeat(64)}`, DIGEST)).toBe(
      `127.0.0.1:5000/repo:v1@${DIGEST}`,
    );
  });

  it('parses challenges', () => {
    expect(parseChallenge('Bearer realm="https://auth.io/token",service="reg.io",scope="repository:a/b:pull"')).toEqual(
      {
        scheme: 'bearer',
        params: { realm: 'https://auth.io/token', service: 'reg.io', scope: 'repository:a/b:pull' },
      },
    );
    expect(parseChallenge('Basic realm="Registry Realm"')).toEqual({
      scheme: 'basic',
      params: { realm: 'Registry Realm' },
    });
  });
});

describe('resolveImageDigest', () => {
  it('one anonymous HEAD with the manifest media types, plain HTTP for loopback only', async () => {
    const { fetchImpl, seen } = fakeFetch(() => new Response(null, { headers: { 'docker-content-digest': DIGEST } }));
    expect(await resolveImageDigest('127.0.0.1:5000/repo:v1', { fetchImpl })).toBe(DIGEST);
    expect(await resolveImageDigest('reg.io/repo:v1', { fetchImpl })).toBe(DIGEST);
    expect(seen.map((s) => [s.method, s.url])).toEqual([
      ['HEAD', 'http://127.0.0.1:5000/v2/repo/manifests/v1'],
      ['HEAD', 'https://reg.io/v2/repo/manifests/v1'],
    ]);
    expect(seen[0]?.headers).toEqual({ accept: MANIFEST_ACCEPT });
  });

  it('follows a Bearer challenge: token from the realm with basic credentials, then the HEAD with the token', async () => {
    const { fetchImpl, seen } = fakeFetch((req) => {
      if (req.url.startsWith('https://auth.io/token')) return Response.json({ token: 'T0K' });
      if (req.headers.authorization === 'Bearer T0K') {
        return new Response(null, { headers: { 'docker-content-digest': DIGEST } });
      }
      return new Response(null, {
        status: 401,
        headers: { 'www-authenticate': 'Bearer realm="https://auth.io/token",service="reg.io"' },
      });
    });
    const basicAuth = { username: 'u', password: 'p' };
    expect(await resolveImageDigest('reg.io/team/repo:v2', { fetchImpl, basicAuth })).toBe(DIGEST);
    expect(seen.map((s) => s.url)).toEqual([
      'https://reg.io/v2/team/repo/manifests/v2',
      'https://auth.io/token?service=reg.io&scope=repository%3Ateam%2Frepo%3Apull',
      'https://reg.io/v2/team/repo/manifests/v2',
    ]);
    expect(seen[1]?.headers.authorization).toBe(`Basic ${Buffer.from('u:p').toString('base64')}`);
  });

  it('answers a Basic challenge with the credentials, and fails without them', async () => {
    const route = (req: Seen) =>
      req.headers.authorization
        ? new Response(null, { headers: { 'docker-content-digest': DIGEST } })
        : new Response(null, { status: 401, headers: { 'www-authenticate': 'Basic realm="r"' } });
    const { fetchImpl } = fakeFetch(route);
    expect(await resolveImageDigest('reg.io/repo:v1', { fetchImpl, basicAuth: { username: 'u', password: 'p' } })).toBe(
      DIGEST,
    );
    await expect(resolveImageDigest('reg.io/repo:v1', { fetchImpl })).rejects.toThrow(
      new RegistryResolveError('reg.io requires authentication (401)'),
    );
  });

  it('checks every redirect hop and drops Authorization on another host', async () => {
    const { fetchImpl, seen } = fakeFetch((req) => {
      if (req.url.startsWith('https://cdn.io/'))
        return new Response(null, { headers: { 'docker-content-digest': DIGEST } });
      if (!req.headers.authorization) {
        return new Response(null, { status: 401, headers: { 'www-authenticate': 'Basic realm="r"' } });
      }
      return new Response(null, { status: 307, headers: { location: 'https://cdn.io/m' } });
    });
    const checked: string[] = [];
    const checkUrl = async (u: string) => {
      checked.push(u);
    };
    await resolveImageDigest('reg.io/repo:v1', { fetchImpl, checkUrl, basicAuth: { username: 'u', password: 'p' } });
    expect(checked).toEqual([
      'https://reg.io/v2/repo/manifests/v1',
      'https://reg.io/v2/repo/manifests/v1',
      'https://cdn.io/m',
    ]);
    expect(seen[2]?.headers.authorization).toBeUndefined();
  });

  it('a refused hop stops before its request', async () => {
    const { fetchImpl, seen } = fakeFetch(
      () => new Response(null, { status: 302, headers: { location: 'http://169.254.169.254/latest' } }),
    );
    const checkUrl = async (u: string) => {
      if (u.includes('169.254')) throw new Error('refused by the URL policy');
    };
    await expect(resolveImageDigest('reg.io/repo:v1', { fetchImpl, checkUrl })).rejects.toThrow(
      'refused by the URL policy',
    );
    expect(seen).toHaveLength(1);
  });

  it('hashes the manifest when the HEAD has no Docker-Content-Digest', async () => {
    const manifest = '{"schemaVersion":2}';
    const { fetchImpl, seen } = fakeFetch((req) => new Response(req.method === 'GET' ? manifest : null));
    const { createHash } = await import('node:crypto');
    expect(await resolveImageDigest('reg.io/repo:v1', { fetchImpl })).toBe(
      `sha256:${createHash('sha256').update(manifest).digest('hex')}`,
    );
    expect(seen.map((s) => s.method)).toEqual(['HEAD', 'GET']);
  });
});

describe('resolveGitRef', () => {
  const A = 'a'.repeat(40);
  const B = 'b'.repeat(40);
  const C = 'c'.repeat(40);

  it('runs git ls-remote with -- before the URL and the ref patterns', async () => {
    const runner = new FakeCommandRunner().on('git', { stdout: `${A}\trefs/heads/main\n` });
    expect(await resolveGitRef(runner, 'https://git.io/r', 'main')).toBe(A);
    expect(runner.argv()).toEqual([
      [
        'git',
        '-c',
        'credential.helper=',
        'ls-remote',
        '--',
        'https://git.io/r',
        'refs/tags/main',
        'refs/tags/main^{}',
        'refs/heads/main',
      ],
    ]);
    // git follows no redirect of the remote (a hostile server could point it at a refused URL).
    expect(runner.calls[0]?.env).toMatchObject({
      GIT_CONFIG_COUNT: '1',
      GIT_CONFIG_KEY_0: 'http.followRedirects',
      GIT_CONFIG_VALUE_0: 'false',
    });
  });

  it('prefers a tag (peeled) over a branch of the same name', () => {
    const out = `${A}\trefs/heads/v1\n${B}\trefs/tags/v1\n${C}\trefs/tags/v1^{}\n`;
    expect(commitFromLsRemote(out, 'v1')).toBe(C);
    expect(commitFromLsRemote(`${A}\trefs/heads/v1\n`, 'v1')).toBe(A);
    expect(commitFromLsRemote(`${A}\trefs/heads/dev\n`, 'origin/dev')).toBe(A);
    expect(commitFromLsRemote(`${A}\trefs/heads/dev\n`, 'main')).toBeUndefined();
  });

  it.each([
    ['https://git.io/r', '--upload-pack=touch /tmp/x', 'git ref is refused'],
    ['https://git.io/r', 'a/-x', 'git ref is refused'],
    ['--upload-pack=x', 'main', 'git url is refused'],
    ['ext::sh -c x', 'main', 'git url is refused'],
  ])('refuses %s %s before running git', async (url, ref, message) => {
    const runner = new FakeCommandRunner();
    await expect(resolveGitRef(runner, url, ref)).rejects.toThrow(GitResolveError);
    await expect(resolveGitRef(runner, url, ref)).rejects.toThrow(message);
    expect(runner.calls).toEqual([]);
  });

  it('reports a failed run with its last stderr line, a URL password masked', async () => {
    const runner = new FakeCommandRunner().on('git', {
      exitCode: 128,
      stderr: "x\nfatal: repository 'https://u:s3cret@git.io/r/' not found\n",
    });
    await expect(resolveGitRef(runner, 'https://u:s3cret@git.io/r', 'main')).rejects.toThrow(
      "git ls-remote failed: fatal: repository 'https://u:***@git.io/r/' not found",
    );
  });

  it('the source resolver checks a git URL against the URL policy before git runs', async () => {
    const runner = new FakeCommandRunner();
    await expect(
      resolveSource(
        { kind: 'git', url: 'https://127.0.0.1/r', ref: 'main' },
        { runner, urlPolicy: { mode: 'enforce', allow: [] } },
      ),
    ).rejects.toBeInstanceOf(UrlPolicyError);
    expect(runner.calls).toEqual([]);
  });

  it('a registry that accepts the connection and never answers fails the resolution at its deadline', async () => {
    // Hostile registry: the poll resolves one source after the other, so a source whose server
    // holds the request must not hold the fleet's poll (undici alone waits 300 s per request).
    const sockets: Socket[] = [];
    const server = createServer((s) => void sockets.push(s));
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const { port } = server.address() as { port: number };
    try {
      await expect(
        resolveSource(
          { kind: 'image', url: `127.0.0.1:${port}/slow/repo:v1`, ref: 'v1' },
          { runner: new FakeCommandRunner(), timeoutMs: 2000 },
        ),
      ).rejects.toBeInstanceOf(RegistryResolveError);
      // The server saw the connection (its accept callback may run after the client gave up
      // on a loaded machine): the deadline cut a request that was held, not one never sent.
      for (let i = 0; i < 100 && sockets.length === 0; i++) await new Promise((r) => setTimeout(r, 50));
      expect(sockets.length).toBeGreaterThan(0);
    } finally {
      for (const s of sockets) s.destroy();
      await new Promise((r) => server.close(r));
    }
  });
});
