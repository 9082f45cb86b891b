/**
 * The source poll's http and helm chart resolvers (`functions/lib/fetch/http-digest.ts`,
 * `helm-index.ts`) through `resolveSource`, against a local `node:http` server on 127.0.0.1:
 * one GET hashed, the size bound, the deadline, the URL policy before any request; the chart
 * version helm would fetch from an `index.yaml`, its digest, and an OCI chart's manifest `HEAD`.
 */
import { createHash } from 'node:crypto';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import {
  chartEntryResolved,
  chartSection,
  chartVersionOf,
  HelmIndexError,
  helmIndexUrl,
  MAX_HELM_INDEX_PARSE_BYTES,
  ociRepositoryRef,
  pickChartVersion,
  resolveHelmChart,
} from '../../functions/lib/fetch/helm-index.js';
import { resolveHttpDigest } from '../../functions/lib/fetch/http-digest.js';
import { createHttpDownloader, HttpDownloadError } from '../../functions/lib/fetch/http-download.js';
import { type PolledSource, resolveSource } from '../../functions/lib/fetch/source-resolve.js';
import { stallNote } from '../../functions/lib/fetch/stall.js';
import { CLOUD_URL_POLICY, UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';

const sha = (s: string) => createHash('sha256').update(s).digest('hex');
const D = (c: string) => c.repeat(64);

/** What the server answers: path → handler; every request is recorded. */
const routes = new Map<string, (req: IncomingMessage, res: ServerResponse) => void>();
const seen: string[] = [];
let server: Server;
let base: string;

beforeAll(async () => {
  server = createServer((req, res) => {
    seen.push(`${req.method} ${req.url}`);
    const route = routes.get(req.url ?? '');
    if (route) route(req, res);
    else res.writeHead(404).end();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

beforeEach(() => {
  routes.clear();
  seen.length = 0;
});

const body = (text: string) => (_req: IncomingMessage, res: ServerResponse) => {
  res.writeHead(200, { 'content-type': 'application/octet-stream' }).end(text);
};
const resolve = (source: PolledSource, timeoutMs?: number) =>
  resolveSource(source, { runner: new FakeCommandRunner(), ...(timeoutMs ? { timeoutMs } : {}) });

describe('http without sha256', () => {
  it("resolves to the body's hex sha256 with one GET, and follows the body when it changes", async () => {
    routes.set('/a.tgz', body('one'));
    const source: PolledSource = { kind: 'http', url: `${base}/a.tgz`, ref: '' };
    expect(await resolve(source)).toBe(sha('one'));
    expect(seen).toEqual(['GET /a.tgz']);
    routes.set('/a.tgz', body('two'));
    expect(await resolve(source)).toBe(sha('two'));
  });

  it("follows a redirect, and fails on a status other than 200 with vendir's words", async () => {
    routes.set('/old', (_q, res) => res.writeHead(302, { location: '/new' }).end());
    routes.set('/new', body('moved'));
    expect(await resolve({ kind: 'http', url: `${base}/old`, ref: '' })).toBe(sha('moved'));
    await expect(resolve({ kind: 'http', url: `${base}/gone`, ref: '' })).rejects.toThrow(
      new HttpDownloadError("Expected 200 OK, but was '404 Not Found'"),
    );
  });

  it('hashes without keeping the body (hashOnly), as the fetch stage downloads it otherwise', async () => {
    routes.set('/a.tgz', body('one'));
    const kept = await createHttpDownloader().download({ url: `${base}/a.tgz` });
    const hashed = await createHttpDownloader().download({ url: `${base}/a.tgz`, hashOnly: true });
    expect([kept.body.toString(), kept.sha256]).toEqual(['one', sha('one')]);
    expect([hashed.body.length, hashed.sha256]).toEqual([0, sha('one')]);
  });

  it('refuses a body over the bound', async () => {
    routes.set('/big', body('x'.repeat(100)));
    await expect(resolveHttpDigest(`${base}/big`, { maxBytes: 10 })).rejects.toThrow(/body exceeds 10 bytes/);
  });

  it('a server that never answers fails the resolution at its deadline', async () => {
    routes.set('/hang', () => undefined);
    await expect(resolve({ kind: 'http', url: `${base}/hang`, ref: '' }, 200)).rejects.toThrow();
  });

  it("a body trickling under the fleet's progress rule is cut by it, long before the deadline", async () => {
    const trickles: NodeJS.Timeout[] = [];
    routes.set('/tarpit', (_q, res) => {
      res.writeHead(200).flushHeaders();
      const t = setInterval(() => res.write('#'), 50);
      trickles.push(t);
      res.once('close', () => clearInterval(t));
    });
    const stall = { windowMs: 300, minBytes: 4096 };
    try {
      await expect(
        resolveSource(
          { kind: 'http', url: `${base}/tarpit`, ref: '' },
          { runner: new FakeCommandRunner(), timeoutMs: 10_000, stall },
        ),
      ).rejects.toThrow(new HttpDownloadError(stallNote(new URL(base).host, stall)));
    } finally {
      for (const t of trickles) clearInterval(t);
    }
  });

  it('an enforcing URL policy refuses the loopback server before any request', async () => {
    routes.set('/a.tgz', body('one'));
    await expect(
      resolveSource(
        { kind: 'http', url: `${base}/a.tgz`, ref: '' },
        {
          runner: new FakeCommandRunner(),
          urlPolicy: CLOUD_URL_POLICY,
        },
      ),
    ).rejects.toBeInstanceOf(UrlPolicyError);
    expect(seen).toEqual([]);
  });
});

/** An index.yaml of chart `c` (and `other`) with the given versions and digests. */
function index(versions: Array<{ version: string; digest?: string; created?: string }>): string {
  const entries = versions
    .map(
      (v) =>
        `  - name: c\n    version: "${v.version}"\n    urls: [${JSON.stringify(`c-${v.version}.tgz`)}]\n` +
        `    created: "${v.created ?? '2024-01-01T00:00:00Z'}"\n${v.digest ? `    digest: ${v.digest}\n` : ''}`,
    )
    .join('');
  return `apiVersion: v1\nentries:\n  other:\n  - name: other\n    version: 9.9.9\n    urls: [o.tgz]\n  c:\n${entries}`;
}

describe('helm chart from an HTTP chart repository', () => {
  const versions = [
    { version: '1.2.0', digest: D('a') },
    { version: '1.10.0', digest: D('b') },
    { version: '2.0.0-rc.1', digest: D('c') },
    { version: 'not-semver', digest: D('d') },
    { version: '1.9.9', digest: D('e') },
  ];

  it('resolves the latest stable version (helm skips prereleases) to <version>@sha256:<digest> with one GET', async () => {
    routes.set('/charts/index.yaml', body(index(versions)));
    const source: PolledSource = { kind: 'helmChart', url: `${base}/charts/`, ref: 'c' };
    expect(await resolve(source)).toBe(`1.10.0@sha256:${D('b')}`);
    expect(seen).toEqual(['GET /charts/index.yaml']);
  });

  it('a given version exactly (a prerelease too), or by equality as helm constrains a full version', async () => {
    routes.set('/charts/index.yaml', body(index(versions)));
    const at = (version: string) => resolve({ kind: 'helmChart', url: `${base}/charts`, ref: 'c', version });
    expect(await at('1.2.0')).toBe(`1.2.0@sha256:${D('a')}`);
    expect(await at('2.0.0-rc.1')).toBe(`2.0.0-rc.1@sha256:${D('c')}`);
    expect(await at('v1.9.9')).toBe(`1.9.9@sha256:${D('e')}`);
    await expect(at('3.0.0')).rejects.toThrow(new HelmIndexError('no chart version found for c-3.0.0'));
    await expect(resolve({ kind: 'helmChart', url: `${base}/charts`, ref: 'nope' })).rejects.toThrow(
      new HelmIndexError('index.yaml has no chart "nope"'),
    );
  });

  it('a chart republished under the same version resolves anew; without a digest its urls and created count', async () => {
    const source: PolledSource = { kind: 'helmChart', url: `${base}/charts`, ref: 'c', version: '1.2.0' };
    routes.set('/charts/index.yaml', body(index([{ version: '1.2.0', digest: D('a') }])));
    const first = await resolve(source);
    routes.set('/charts/index.yaml', body(index([{ version: '1.2.0', digest: D('f') }])));
    expect(await resolve(source)).toBe(`1.2.0@sha256:${D('f')}`);
    expect(first).not.toBe(`1.2.0@sha256:${D('f')}`);
    routes.set('/charts/index.yaml', body(index([{ version: '1.2.0' }])));
    const bare = await resolve(source);
    expect(bare).toMatch(/^1\.2\.0@index:[0-9a-f]{64}$/);
    routes.set('/charts/index.yaml', body(index([{ version: '1.2.0', created: '2025-01-01T00:00:00Z' }])));
    expect(await resolve(source)).not.toBe(bare);
    expect(chartVersionOf(bare)).toBe('1.2.0');
  });

  it('an index that does not parse or has no entries fails', () => {
    expect(() => pickChartVersion('entries: [', 'c')).toThrow(HelmIndexError);
    expect(() => pickChartVersion('apiVersion: v1\n', 'c')).toThrow(new HelmIndexError('index.yaml has no chart "c"'));
    expect(() => pickChartVersion(index([{ version: '1.0.0-rc.1' }]), 'c')).toThrow(
      new HelmIndexError('no chart version found for c-'),
    );
  });

  it('joins index.yaml to the repository path as helm does, keeping a query', () => {
    expect(helmIndexUrl('https://h.io/charts/')).toBe('https://h.io/charts/index.yaml');
    expect(helmIndexUrl('https://h.io')).toBe('https://h.io/index.yaml');
    expect(helmIndexUrl('https://h.io/x?a=b')).toBe('https://h.io/x/index.yaml?a=b');
  });
});

describe('helm chart from an OCI registry', () => {
  it('one manifest HEAD of <name>:<version> (+ as _), the digest after the version', async () => {
    const digest = `sha256:${D('9')}`;
    routes.set('/v2/charts/c/manifests/1.0.0_b', (_q, res) =>
      res.writeHead(200, { 'docker-content-digest': digest }).end(),
    );
    const host = base.replace('http://', '');
    expect(await resolve({ kind: 'helmChart', url: `oci://${host}/charts`, ref: 'c', version: '1.0.0+b' })).toBe(
      `1.0.0+b@${digest}`,
    );
    expect(seen).toEqual(['HEAD /v2/charts/c/manifests/1.0.0_b']);
    await expect(resolveHelmChart({ repository: `oci://${host}/charts`, name: 'c' })).rejects.toBeInstanceOf(
      HelmIndexError,
    );
  });

  it('asks the host the repository names, also one without a dot or port (never Docker Hub)', async () => {
    const asked: string[] = [];
    const fetchImpl = (async (url: URL | string) => {
      asked.push(String(url));
      return new Response(null, { status: 200, headers: { 'docker-content-digest': `sha256:${D('8')}` } });
    }) as typeof fetch;
    const chart = { repository: 'oci://registry/charts/', name: 'c', version: '1.0.0' };
    expect(await resolveHelmChart(chart, { fetchImpl })).toBe(`1.0.0@sha256:${D('8')}`);
    expect(asked).toEqual(['https://registry/v2/charts/c/manifests/1.0.0']);
    expect(ociRepositoryRef('oci://h.io/x')).toBe('h.io/x');
    expect(ociRepositoryRef('oci://localhost/x')).toBe('localhost/x');
    expect(ociRepositoryRef('oci://reg')).toBe('reg:443');
  });
});

describe('a hostile or huge index.yaml', () => {
  /** `n` one-line charts `k<i>` in helm's layout, about `n * 40` bytes. */
  const filler = (n: number) => Array.from({ length: n }, (_, i) => `  k${i}:\n  - version: 1.0.0\n`).join('');

  it('a chart key repeated is not an error (yaml checks duplicate keys by comparing every pair)', () => {
    // Not helm's layout (flow style), so the whole index is parsed: with yaml's unique-key check
    // a map of 20,000 keys (250 kB) took seconds and 1 MB a minute, synchronously.
    const flow = `{"apiVersion": "v1", "entries": {"x": [], "x": [], "c": [{"version": "1.0.0", "digest": "${D('a')}"}]}}`;
    expect(chartEntryResolved(pickChartVersion(flow, 'c'))).toBe(`1.0.0@sha256:${D('a')}`);
  });

  it("an index over the parse bound is read through its chart's section in helm's layout", () => {
    const big = `apiVersion: v1\nentries:\n${filler(160_000)}  c:\n  - version: 2.0.0\n    digest: ${D('b')}\n  - version: 1.0.0\n${filler(160_000).replaceAll('k', 'z')}generated: "2024-01-01T00:00:00Z"\n`;
    expect(big.length).toBeGreaterThan(MAX_HELM_INDEX_PARSE_BYTES);
    expect(chartEntryResolved(pickChartVersion(big, 'c'))).toBe(`2.0.0@sha256:${D('b')}`);
    expect(chartSection(big, 'c')).toBe(
      `entries:\n  c:\n  - version: 2.0.0\n    digest: ${D('b')}\n  - version: 1.0.0\n`,
    );
  });

  it('an index over the parse bound without such a section is refused, not parsed', () => {
    const flow = `{"entries": {${Array.from({ length: 600_000 }, (_, i) => `"k${i}": []`).join(', ')}, "c": [{"version": "1.0.0"}]}}`;
    expect(flow.length).toBeGreaterThan(MAX_HELM_INDEX_PARSE_BYTES);
    expect(() => pickChartVersion(flow, 'c')).toThrow(/larger than 8388608 bytes/);
  });

  it("the section ends at the next chart's key and never leaves entries", () => {
    const text = `apiVersion: v1\nentries:\n  a:\n  - version: 1.0.0\n    description: |\n      c:\n  c:\n    - version: 3.0.0\n      digest: ${D('c')}\n  d:\n  - version: 9.0.0\ngenerated: x\n`;
    expect(chartSection(text, 'c')).toBe(`entries:\n  c:\n    - version: 3.0.0\n      digest: ${D('c')}\n`);
    expect(chartSection(text, 'generated')).toBeUndefined();
    expect(chartSection('apiVersion: v1\nentries:\n  "c":\n  - version: 1.0.0\n', 'c')).toBe(
      'entries:\n  "c":\n  - version: 1.0.0\n',
    );
    expect(chartSection(text, 'c\n')).toBeUndefined();
  });
});
