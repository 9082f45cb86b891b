/**
 * The URL policy refuses the IPv6 forms that embed or reach an IPv4 address, or are deprecated
 * private ranges (s19): IPv4-compatible ::/96, IPv4-translated ::ffff:0:0:0/96, NAT64 local-use
 * 64:ff9b:1::/48, 6to4 2002::/16, Teredo 2001::/32, site-local fec0::/10, discard 100::/64;
 * global unicast addresses still pass, and a CIDR exception still allows a listed range.
 */
import { expect, it } from 'vitest';
import { CLOUD_URL_POLICY, UrlPolicyChecker } from '../../functions/lib/fetch/url-policy.js';

const checker = new UrlPolicyChecker(CLOUD_URL_POLICY);
const ep = (host: string) => ({ source: host, scheme: 'https', host, port: '443' });

it.each([
  ['::ffff:127.0.0.1', /loopback/],
  ['::ffff:7f00:1', /loopback/],
  ['0:0:0:0:0:ffff:a9fe:a9fe', /link-local/],
  ['::1', /a loopback address/],
  ['::', /an unspecified address/],
  ['::7f00:1', /IPv4-compatible/],
  ['::a9fe:a9fe', /IPv4-compatible/],
  ['64:ff9b:1::a9fe:a9fe', /local-use NAT64/],
  ['2002:a9fe:a9fe::', /6to4/],
  ['2002:7f00:1::', /6to4/],
  ['2001:0:4136:e378:8000:63bf:80ff:fffe', /Teredo/],
  ['fec0::1', /site-local/],
  ['::ffff:0:a9fe:a9fe', /IPv4-translated/],
  ['100::1', /discard-only/],
])('%s is refused (%s)', async (h, reason) => {
  await expect(checker.checkedAddresses(ep(h))).rejects.toThrow(/URL policy refused/);
  await expect(checker.checkedAddresses(ep(h))).rejects.toThrow(reason);
});

it.each(['2606:4700:4700::1111', '2001:4860:4860::8888', '2a00:1450:4001::200e'])(
  '%s (global unicast) passes',
  async (h) => {
    await expect(checker.checkedAddresses(ep(h))).resolves.toEqual([h]);
  },
);

it('a CIDR exception allows a listed 6to4 range', async () => {
  const allowing = new UrlPolicyChecker({ mode: 'enforce', allow: ['2002:c000:200::/48'] });
  await expect(allowing.checkedAddresses(ep('2002:c000:200::1'))).resolves.toEqual(['2002:c000:200::1']);
  await expect(allowing.checkedAddresses(ep('2002:7f00:1::'))).rejects.toThrow(/6to4/);
});
