import { describe, expect, it } from 'vitest';
import type { AppFetch } from '../../functions/lib/api/index.js';
import {
  fetchEndpoints,
  parseUrlPolicy,
  type UrlPolicy,
  UrlPolicyChecker,
  UrlPolicyError,
} from '../../functions/lib/fetch/url-policy.js';

/** A resolver with fixed answers: names not listed fail like an unknown host. */
const DNS: Record<string, string[]> = {
  'github.com': ['140.82.121.3'],
  'registry.example.com': ['93.184.216.34'],
  'rebind.example.com': ['93.184.216.34', '127.0.0.1'],
  'metadata.example.com': ['169.254.169.254'],
  'corp-registry.internal': ['10.20.3.4'],
  localhost: ['127.0.0.1', '::1'],
};
const resolver = async (host: string) => {
  const a = DNS[host];
  if (!a) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
  return a;
};
const ENFORCE: UrlPolicy = { mode: 'enforce', allow: [] };

async function refusal(fetch: AppFetch[], policy: UrlPolicy = ENFORCE): Promise<string | undefined> {
  try {
    await new UrlPolicyChecker(policy, resolver).checkFetch(fetch);
    return undefined;
  } catch (err) {
    expect(err).toBeInstanceOf(UrlPolicyError);
    return (err as Error).message;
  }
}

describe('URL policy (enforced)', () => {
  it.each<[string, AppFetch, string]>([
    [
      'the Lambda Runtime API',
      { http: { url: 'http://127.0.0.1:9001/2018-06-01/runtime/invocation/next' } },
      'URL policy refused http://127.0.0.1:9001/2018-06-01/runtime/invocation/next: 127.0.0.1, a loopback address, which this deployment does not allow',
    ],
    [
      'the instance metadata endpoint',
      { http: { url: 'http://169.254.169.254/latest/meta-data/iam/security-credentials/' } },
      'URL policy refused http://169.254.169.254/latest/meta-data/iam/security-credentials/: 169.254.169.254, a link-local address (instance and container credential endpoints), which this deployment does not allow',
    ],
    [
      'the ECS/Lambda container credential endpoint',
      { http: { url: 'http://169.254.170.2/v2/credentials/x' } },
      'URL policy refused http://169.254.170.2/v2/credentials/x: 169.254.170.2, a link-local address (instance and container credential endpoints), which this deployment does not allow',
    ],
    [
      'a name resolving to link-local',
      { git: { url: 'https://metadata.example.com/r.git', ref: 'origin/main' } },
      'URL policy refused https://metadata.example.com/r.git: metadata.example.com resolves to 169.254.169.254, a link-local address (instance and container credential endpoints), which this deployment does not allow',
    ],
    [
      'a name with one public and one loopback address',
      { helmChart: { name: 'c', repository: { url: 'https://rebind.example.com/charts' } } },
      'URL policy refused https://rebind.example.com/charts: rebind.example.com resolves to 127.0.0.1, a loopback address, which this deployment does not allow',
    ],
    [
      'localhost',
      { http: { url: 'http://localhost:8080/x.tgz' } },
      'URL policy refused http://localhost:8080/x.tgz: localhost resolves to 127.0.0.1, a loopback address, which this deployment does not allow',
    ],
    [
      'IPv6 loopback',
      { http: { url: 'http://[::1]:9001/x' } },
      'URL policy refused http://[::1]:9001/x: ::1, a loopback address, which this deployment does not allow',
    ],
    [
      'IPv4-mapped IPv6 loopback',
      { http: { url: 'http://[::ffff:127.0.0.1]/x' } },
      'URL policy refused http://[::ffff:127.0.0.1]/x: ::ffff:7f00:1, a loopback address, which this deployment does not allow',
    ],
    [
      'a private registry (image)',
      { image: { url: '10.0.0.5:5000/app@sha256:abc' } },
      'URL policy refused 10.0.0.5:5000/app@sha256:abc: 10.0.0.5, a private address, which this deployment does not allow',
    ],
    [
      'a private registry (bundle)',
      { imgpkgBundle: { image: '192.168.1.10/pkg:1.0' } },
      'URL policy refused 192.168.1.10/pkg:1.0: 192.168.1.10, a private address, which this deployment does not allow',
    ],
    [
      'an oci:// helm repository on loopback',
      { helmChart: { name: 'c', repository: { url: 'oci://127.0.0.1:5000/charts' } } },
      'URL policy refused oci://127.0.0.1:5000/charts: 127.0.0.1, a loopback address, which this deployment does not allow',
    ],
    [
      'scp-style git on a private host',
      { git: { url: 'git@172.16.0.9:org/repo.git', ref: 'origin/main' } },
      'URL policy refused git@172.16.0.9:org/repo.git: 172.16.0.9, a private address, which this deployment does not allow',
    ],
    [
      'git over file://',
      { git: { url: 'file:///root/.aws', ref: 'origin/main' } },
      'URL policy refused file:///root/.aws: scheme file is not allowed',
    ],
    [
      'git from a local path',
      { git: { url: '/var/task', ref: 'origin/main' } },
      'URL policy refused /var/task: not a network URL (local paths and git transports other than https, http, ssh and git are not allowed)',
    ],
    [
      "git's ext:: transport",
      { git: { url: 'ext::sh -c touch% /tmp/pwned', ref: 'origin/main' } },
      'URL policy refused ext::sh -c touch% /tmp/pwned: not a network URL (local paths and git transports other than https, http, ssh and git are not allowed)',
    ],
    [
      'an unresolvable host',
      { http: { url: 'https://nowhere.invalid/x' } },
      'URL policy refused https://nowhere.invalid/x: host nowhere.invalid does not resolve (ENOTFOUND)',
    ],
    [
      'CGNAT',
      { http: { url: 'http://100.100.100.200/x' } },
      'URL policy refused http://100.100.100.200/x: 100.100.100.200, a shared (carrier-grade NAT) address, which this deployment does not allow',
    ],
    [
      'the unspecified address',
      { http: { url: 'http://0.0.0.0:9001/x' } },
      'URL policy refused http://0.0.0.0:9001/x: 0.0.0.0, an unspecified address, which this deployment does not allow',
    ],
  ])('refuses %s', async (_name, entry, want) => {
    expect(await refusal([entry])).toBe(want);
  });

  it('allows public sources of every kind, and inline sources contact nothing', async () => {
    expect(
      await refusal([
        { http: { url: 'https://github.com/x.tgz' } },
        { git: { url: 'git@github.com:org/repo.git', ref: 'origin/main' } },
        { git: { url: 'ssh://git@github.com/org/repo.git', ref: 'origin/main' } },
        { helmChart: { name: 'c', repository: { url: 'oci://registry.example.com/charts' } } },
        { image: { url: 'registry.example.com/app:1' } },
        { imgpkgBundle: { image: 'registry.example.com/pkg@sha256:abc' } },
        { inline: { paths: { 'a.yml': 'a: 1' } } },
      ]),
    ).toBeUndefined();
  });

  it('checks an image without a registry against Docker Hub, as upstream resolves it', () => {
    expect(fetchEndpoints([{ image: { url: 'localhost/app' } }])).toEqual([
      { source: 'localhost/app', scheme: 'registry', host: 'index.docker.io' },
    ]);
  });

  it('lets the allow-list name a host, a host:port or a CIDR', async () => {
    const policy = parseUrlPolicy('enforce', 'corp-registry.internal, 127.0.0.1:5000, 192.168.0.0/16', 'off');
    expect(await refusal([{ image: { url: 'corp-registry.internal/app:1' } }], policy)).toBeUndefined();
    expect(await refusal([{ imgpkgBundle: { image: '127.0.0.1:5000/pkg:1' } }], policy)).toBeUndefined();
    expect(await refusal([{ http: { url: 'http://192.168.7.7/x' } }], policy)).toBeUndefined();
    // Same host, another port: still refused (the Runtime API beside an allowed local registry).
    expect(await refusal([{ http: { url: 'http://127.0.0.1:9001/x' } }], policy)).toContain('a loopback address');
  });

  it('matches an allow-list host:port entry against the default port of the scheme', async () => {
    const policy = parseUrlPolicy('enforce', 'corp-registry.internal:443', 'off');
    expect(await refusal([{ image: { url: 'corp-registry.internal/app:1' } }], policy)).toBeUndefined();
    expect(await refusal([{ http: { url: 'https://corp-registry.internal/x.tgz' } }], policy)).toBeUndefined();
    expect(await refusal([{ http: { url: 'http://corp-registry.internal/x.tgz' } }], policy)).toContain(
      'a private address',
    );
  });

  it('allows everything when off (the embedded default, as kapp-controller)', async () => {
    expect(await refusal([{ http: { url: 'http://127.0.0.1:9001/x' } }], { mode: 'off', allow: [] })).toBeUndefined();
  });

  it('rejects malformed allow-list entries and modes', () => {
    expect(() => new UrlPolicyChecker(parseUrlPolicy('enforce', 'http://x/y', 'off'))).toThrow(
      'URL policy: invalid allow-list entry "http://x/y"',
    );
    expect(() => parseUrlPolicy('audit', '', 'off')).toThrow('expected enforce or off, got "audit"');
    expect(parseUrlPolicy(undefined, undefined, 'enforce')).toEqual({ mode: 'enforce', allow: [] });
  });
});
