/**
 * DNS pinning of kapp-lambda's own requests (`UrlPolicyChecker.pinnedLookup`,
 * `functions/lib/fetch/url-policy.ts`): the lookup a connection of the http downloader or the
 * registry digest lookup resolves its host with. The port boundary is the resolver, scripted
 * here to rebind (a public answer for the policy's `checkUrl`, a denied one for the connection's
 * own resolution): the connection must be handed only addresses checked in the resolution it
 * connects with, and nothing when that resolution is refused.
 */
import type { LookupAddress } from 'node:dns';
import type { LookupFunction } from 'node:net';
import { describe, expect, it } from 'vitest';
import { createHttpDownloader } from '../../functions/lib/fetch/http-download.js';
import { resolveImageDigest } from '../../functions/lib/fetch/registry-digest.js';
import { type UrlPolicy, UrlPolicyChecker, UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';

const ENFORCE: UrlPolicy = { mode: 'enforce', allow: [] };
const LINK_LOCAL = 'a link-local address (instance and container credential endpoints)';

/** A resolver whose n-th answer for any host is `answers[n]` (the last one repeats). */
function scripted(...answers: string[][]) {
  const asked: string[] = [];
  const resolve = async (host: string): Promise<string[]> => {
    asked.push(host);
    const a = answers[Math.min(asked.length - 1, answers.length - 1)] ?? [];
    if (a.length === 0) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
    return a;
  };
  return { asked, resolve };
}

type Outcome = { error?: NodeJS.ErrnoException; address?: string | LookupAddress[]; family?: number };

/** Runs one lookup as `node:net` does and returns what it handed the socket. */
function run(lookup: LookupFunction, host: string, options: Parameters<LookupFunction>[1]): Promise<Outcome> {
  return new Promise((resolve) =>
    lookup(host, options, (error, address, family) =>
      resolve(error ? { error } : { address, ...(family !== undefined ? { family } : {}) }),
    ),
  );
}

function pinned(policy: UrlPolicy, resolve: (host: string) => Promise<string[]>, url: string): LookupFunction {
  const lookup = new UrlPolicyChecker(policy, resolve).pinnedLookup(url);
  if (!lookup) throw new Error('expected a lookup');
  return lookup;
}

describe('pinnedLookup', () => {
  it('is absent while the policy is off (the system lookup, as upstream)', () => {
    expect(new UrlPolicyChecker({ mode: 'off', allow: [] }).pinnedLookup('https://x.example/')).toBeUndefined();
  });

  it('refuses a rebinding answer: public for checkUrl, 169.254.169.254 for the connection', async () => {
    const dns = scripted(['93.184.216.34'], ['169.254.169.254']);
    const checker = new UrlPolicyChecker(ENFORCE, dns.resolve);
    const url = 'https://files.example/app.tgz';
    await checker.checkUrl(url);
    const got = await run(checker.pinnedLookup(url) as LookupFunction, 'files.example', { all: true });
    expect(got.address).toBeUndefined();
    expect(got.error).toBeInstanceOf(UrlPolicyError);
    expect(got.error?.message).toBe(
      `URL policy refused ${url}: files.example resolves to 169.254.169.254, ${LINK_LOCAL}, which this deployment does not allow`,
    );
    expect(dns.asked).toEqual(['files.example', 'files.example']);
  });

  it.each<[string, string, string]>([
    ['the IPv6 instance metadata endpoint', 'fd00:ec2::254', 'a private (unique local) address'],
    ['IPv6 loopback', '::1', 'a loopback address'],
    ['an IPv4-mapped link-local address', '::ffff:169.254.169.254', LINK_LOCAL],
    ['an IPv4-mapped loopback address', '::ffff:127.0.0.1', 'a loopback address'],
  ])('refuses an IPv6 rebinding answer: %s', async (_name, denied, reason) => {
    const dns = scripted(['2606:4700:4700::1111'], [denied]);
    const lookup = pinned(ENFORCE, dns.resolve, 'https://files.example/app.tgz');
    expect((await run(lookup, 'files.example', { all: true })).address).toEqual([
      { address: '2606:4700:4700::1111', family: 6 },
    ]);
    const got = await run(lookup, 'files.example', { all: true });
    expect(got.address).toBeUndefined();
    expect(got.error?.message).toContain(`files.example resolves to ${denied}, ${reason}`);
  });

  it('refuses an answer with one denied address among public ones (no address is handed over)', async () => {
    const dns = scripted(['93.184.216.34', '2606:4700:4700::1111', '127.0.0.1']);
    const got = await run(pinned(ENFORCE, dns.resolve, 'http://files.example/'), 'files.example', { all: true });
    expect(got.address).toBeUndefined();
    expect(got.error?.message).toContain('files.example resolves to 127.0.0.1, a loopback address');
  });

  it('hands over the checked addresses of both families, filtered by the family asked for', async () => {
    const dns = scripted(['93.184.216.34', '2606:4700:4700::1111']);
    const lookup = pinned(ENFORCE, dns.resolve, 'https://files.example/');
    expect(await run(lookup, 'files.example', { all: true })).toEqual({
      address: [
        { address: '93.184.216.34', family: 4 },
        { address: '2606:4700:4700::1111', family: 6 },
      ],
    });
    expect(await run(lookup, 'files.example', {})).toEqual({ address: '93.184.216.34', family: 4 });
    expect(await run(lookup, 'files.example', { family: 6 })).toEqual({ address: '2606:4700:4700::1111', family: 6 });
    expect(await run(lookup, 'files.example', { family: 'IPv4', all: true })).toEqual({
      address: [{ address: '93.184.216.34', family: 4 }],
    });
    // One resolution per connection.
    expect(dns.asked).toHaveLength(4);
    const v4only = pinned(ENFORCE, scripted(['93.184.216.34']).resolve, 'https://files.example/');
    const none = await run(v4only, 'files.example', { family: 6 });
    expect(none.error).not.toBeInstanceOf(UrlPolicyError);
    expect(none.error?.code).toBe('ENOTFOUND');
  });

  it('refuses a host that does not resolve with the policy message', async () => {
    const got = await run(pinned(ENFORCE, scripted([]).resolve, 'https://gone.example/x'), 'gone.example', {});
    expect(got.error).toBeInstanceOf(UrlPolicyError);
    expect(got.error?.message).toBe(
      'URL policy refused https://gone.example/x: host gone.example does not resolve (ENOTFOUND)',
    );
  });

  it('honours the allow-list: a host, a host:port (default port included) and a CIDR', async () => {
    const internal = scripted(['10.20.3.4']).resolve;
    const ok = { address: [{ address: '10.20.3.4', family: 4 }] };
    const byHost = pinned({ mode: 'enforce', allow: ['files.internal'] }, internal, 'https://files.internal/a');
    expect(await run(byHost, 'files.internal', { all: true })).toEqual(ok);
    const byPort = { mode: 'enforce' as const, allow: ['files.internal:8443', 'files.internal:80'] };
    expect(
      await run(pinned(byPort, internal, 'https://files.internal:8443/a'), 'files.internal', { all: true }),
    ).toEqual(ok);
    expect(await run(pinned(byPort, internal, 'http://files.internal/a'), 'files.internal', { all: true })).toEqual(ok);
    const otherPort = await run(pinned(byPort, internal, 'https://files.internal/a'), 'files.internal', { all: true });
    expect(otherPort.error?.message).toContain('files.internal resolves to 10.20.3.4, a private address');
    const cidr = { mode: 'enforce' as const, allow: ['10.20.0.0/16'] };
    expect(await run(pinned(cidr, internal, 'https://files.internal/a'), 'files.internal', { all: true })).toEqual(ok);
    // The CIDR covers its own range only: another private address in the same answer is refused.
    const mixed = scripted(['10.20.3.4', '10.30.0.1']).resolve;
    const outside = await run(pinned(cidr, mixed, 'https://files.internal/a'), 'files.internal', { all: true });
    expect(outside.error?.message).toContain('files.internal resolves to 10.30.0.1, a private address');
  });

  it('requestGuards check each URL and pin each connection with the same policy', async () => {
    const dns = scripted(['93.184.216.34'], ['169.254.169.254']);
    const guards = new UrlPolicyChecker(ENFORCE, dns.resolve).requestGuards();
    await guards.checkUrl('https://files.example/a');
    const got = await run(guards.lookupFor(new URL('https://files.example/a')) as LookupFunction, 'files.example', {});
    expect(got.error).toBeInstanceOf(UrlPolicyError);
    const off = new UrlPolicyChecker({ mode: 'off', allow: [] }, dns.resolve).requestGuards();
    expect(off.lookupFor(new URL('https://files.example/a'))).toBeUndefined();
  });
});

/**
 * The guards of a rebinding resolver, with the lookup wrapped to record what each connection was
 * handed (`refused` or the addresses), and a `fetch` that must not be used.
 */
function rebindingGuards() {
  const dns = scripted(['93.184.216.34'], ['169.254.169.254']);
  const guards = new UrlPolicyChecker(ENFORCE, dns.resolve).requestGuards();
  const handed: string[] = [];
  const lookupFor = (url: URL): LookupFunction | undefined => {
    const inner = guards.lookupFor(url);
    if (!inner) return undefined;
    return (host, options, callback) =>
      inner(host, options, (err, address, family) => {
        handed.push(err ? 'refused' : JSON.stringify(address));
        callback(err, address, family);
      });
  };
  let fetched = 0;
  const fetchImpl = (async () => {
    fetched++;
    return new Response('unreachable');
  }) as typeof fetch;
  return { dns, handed, checkUrl: guards.checkUrl, lookupFor, fetchImpl, fetched: () => fetched };
}

describe("kapp-lambda's own requests under a rebinding answer", () => {
  it('the http downloader fails with the policy message and connects nowhere', async () => {
    const g = rebindingGuards();
    const err = await createHttpDownloader(g.fetchImpl)
      .download({ url: 'http://files.example/app.tgz', checkUrl: g.checkUrl, lookupFor: g.lookupFor })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UrlPolicyError);
    expect((err as Error).message).toBe(
      `URL policy refused http://files.example/app.tgz: files.example resolves to 169.254.169.254, ${LINK_LOCAL}, which this deployment does not allow`,
    );
    expect(g.handed).toEqual(['refused']);
    expect(g.fetched()).toBe(0);
  });

  it('the registry digest lookup fails with the policy message and connects nowhere', async () => {
    const g = rebindingGuards();
    const err = await resolveImageDigest('registry.example/team/app:v1', {
      checkUrl: g.checkUrl,
      lookupFor: g.lookupFor,
      fetchImpl: g.fetchImpl,
    }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UrlPolicyError);
    expect((err as Error).message).toContain('registry.example resolves to 169.254.169.254');
    expect(g.handed).toEqual(['refused']);
    expect(g.fetched()).toBe(0);
  });

  it('while the policy is off both keep their fetch and resolve nothing themselves', async () => {
    const dns = scripted(['169.254.169.254']);
    const guards = new UrlPolicyChecker({ mode: 'off', allow: [] }, dns.resolve).requestGuards();
    let fetched = 0;
    const fetchImpl = (async () => {
      fetched++;
      return new Response('ok', { headers: { 'docker-content-digest': `sha256:${'a'.repeat(64)}` } });
    }) as typeof fetch;
    await createHttpDownloader(fetchImpl).download({ url: 'http://files.example/app.tgz', ...guards });
    await resolveImageDigest('registry.example/app:v1', { ...guards, fetchImpl });
    expect(fetched).toBe(2);
    expect(dns.asked).toEqual([]);
  });
});
