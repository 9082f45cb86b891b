/**
 * Hostile sources tried against the URL policy (issue 7 §4), as an App author would write them.
 * Each case is a form that reaches a denied address through a tool (git, helm, imgpkg), so the
 * policy must refuse it before any tool runs. The resolver is faked with fixed answers; numeric
 * host spellings that only getaddrinfo understands (`0x7f.1`, `2130706433` in non-special URLs)
 * are answered here as the system resolver answers them.
 */
import { describe, expect, it } from 'vitest';
import type { AppFetch } from '../../functions/lib/api/index.js';
import { type UrlPolicy, UrlPolicyChecker, UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';

const DNS: Record<string, string[]> = {
  'public.example': ['93.184.216.34'],
  'index.docker.io': ['54.1.2.3'],
  // getaddrinfo's inet_aton spellings of 127.0.0.1
  '0x7f.1': ['127.0.0.1'],
  '127.1': ['127.0.0.1'],
  '2130706433': ['127.0.0.1'],
  localhost: ['127.0.0.1', '::1'],
};
const resolver = async (host: string) => {
  const a = DNS[host];
  if (!a) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
  return a;
};
const ENFORCE: UrlPolicy = { mode: 'enforce', allow: [] };

async function refusal(entry: AppFetch): Promise<string | undefined> {
  try {
    await new UrlPolicyChecker(ENFORCE, resolver).checkFetch([entry]);
    return undefined;
  } catch (err) {
    expect(err).toBeInstanceOf(UrlPolicyError);
    return (err as Error).message;
  }
}

describe('URL policy attacks that held before this change', () => {
  it.each<[string, AppFetch]>([
    ['decimal IPv4 (http)', { http: { url: 'http://2130706433/x' } }],
    ['hex IPv4 (http)', { http: { url: 'http://0x7f.1/x' } }],
    ['short IPv4 (http)', { http: { url: 'http://127.1/x' } }],
    ['trailing dot (http)', { http: { url: 'http://127.0.0.1./x' } }],
    ['IPv4-mapped IPv6, dotted', { http: { url: 'http://[::ffff:127.0.0.1]/x' } }],
    ['IPv4-mapped IPv6, hex', { http: { url: 'http://[::ffff:7f00:1]/x' } }],
    ['userinfo naming a public host', { http: { url: 'http://public.example@127.0.0.1/x' } }],
    ['userinfo with a port-like part', { git: { url: 'https://public.example:443@127.0.0.1/r', ref: 'origin/main' } }],
    ['ssh URL with hex IPv4', { git: { url: 'ssh://0x7f.1/r', ref: 'origin/main' } }],
    ['git:// with decimal IPv4', { git: { url: 'git://2130706433/r', ref: 'origin/main' } }],
    ['scp-style with bracketed host', { git: { url: 'git@[127.0.0.1]:r', ref: 'origin/main' } }],
    ['scp-style with bracketed user@host', { git: { url: '[git@127.0.0.1]:r', ref: 'origin/main' } }],
    ['scp-style with short IPv4', { git: { url: 'git@127.1:r', ref: 'origin/main' } }],
    ['git remote helper', { git: { url: 'git::https://public.example/r', ref: 'origin/main' } }],
    ['file remote helper', { git: { url: 'file::/etc', ref: 'origin/main' } }],
    ['file URL', { git: { url: 'file:///var/task', ref: 'origin/main' } }],
    ['local path', { git: { url: '/var/task', ref: 'origin/main' } }],
    ['helm repository on loopback', { helmChart: { name: 'x', repository: { url: 'http://127.1:9001/' } } }],
    ['helm OCI repository on loopback', { helmChart: { name: 'x', repository: { url: 'oci://[::1]:5000/c' } } }],
    [
      'helm OCI repository, mapped IPv6',
      { helmChart: { name: 'x', repository: { url: 'oci://[::ffff:127.0.0.1]/c' } } },
    ],
    ['image on a loopback registry with port', { image: { url: '127.0.0.1:5000/app:1' } }],
    ['image on an IPv6 loopback registry', { image: { url: '[::1]:5000/app:1' } }],
    ['bundle on a hex IPv4 registry', { imgpkgBundle: { image: '0x7f.1:5000/b:1' } }],
  ])('%s is refused', async (_name, entry) => {
    expect(await refusal(entry)).toMatch(/^URL policy refused /);
  });
});

describe('URL policy attacks that broke before this change', () => {
  it('a backslash in a git URL authority: WHATWG sees the public host, git (curl) connects to loopback', async () => {
    // `git ls-remote 'http://public.example\@127.0.0.1:18777/r'` requests
    // http://127.0.0.1:18777/r/info/refs (tried with git 2.39 and curl 7.88).
    expect(new URL('https://public.example\\@127.0.0.1/r').hostname).toBe('public.example');
    expect(await refusal({ git: { url: 'https://public.example\\@127.0.0.1/r', ref: 'origin/main' } })).toBe(
      'URL policy refused https://public.example\\@127.0.0.1/r: a "\\" before the path is not allowed (URL parsers disagree on which host it names)',
    );
    expect(await refusal({ http: { url: 'http://public.example\\@127.0.0.1:9001/x' } })).toMatch(/a "\\" before/);
    expect(
      await refusal({ helmChart: { name: 'x', repository: { url: 'https://public.example\\@127.0.0.1/' } } }),
    ).toMatch(/a "\\" before/);
  });

  it('a helm chart name that is a URL: helm pulls it directly, so its host is checked', async () => {
    // vendir runs `helm pull <name>`; with name http://127.0.0.1:18777/c.tgz and no repository
    // helm requested GET /c.tgz from the loopback server (vendir 0.44, helm 3.22).
    expect(await refusal({ helmChart: { name: 'http://127.0.0.1:9001/2018-06-01/runtime/invocation/next' } })).toBe(
      'URL policy refused http://127.0.0.1:9001/2018-06-01/runtime/invocation/next: 127.0.0.1, a loopback address, which this deployment does not allow',
    );
    expect(await refusal({ helmChart: { name: 'oci://127.1:5000/chart' } })).toBe(
      'URL policy refused oci://127.1:5000/chart: 127.1 resolves to 127.0.0.1, a loopback address, which this deployment does not allow',
    );
    expect(await refusal({ helmChart: { name: 'file:///var/task/chart.tgz' } })).toBe(
      'URL policy refused file:///var/task/chart.tgz: scheme file is not allowed',
    );
    expect(await refusal({ helmChart: { name: 'https://public.example/c.tgz' } })).toBeUndefined();
    expect(
      await refusal({ helmChart: { name: 'stable/redis', repository: { url: 'https://public.example/' } } }),
    ).toBeUndefined();
  });
});

describe('URL policy attacks that held (checked against the real tool)', () => {
  it('an image "localhost/app" goes to Docker Hub, as the policy assumes', async () => {
    // imgpkg 0.46.1 `pull -i localhost/app:1` contacts https://index.docker.io/v2/ (go-containerregistry
    // has no "localhost" exception, unlike Docker's reference parser).
    expect(await refusal({ image: { url: 'localhost/app:1' } })).toBeUndefined();
    expect(await refusal({ image: { url: 'localhost:5000/app:1' } })).toMatch(/localhost resolves to 127\.0\.0\.1/);
  });
});
