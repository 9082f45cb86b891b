/**
 * The test servers of test/harness/servers.ts are real: S3 (versitygw) stores objects and
 * honours conditional writes, the registry serves the pushed bundles, the git server speaks
 * smart HTTP and refuses pushes, the static server serves the helm repo and archives, and
 * `stop()` (or the death of the parent) leaves no process or temp dir behind.
 */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  DeleteObjectCommand,
  GetObjectCommand,
  HeadObjectCommand,
  ListObjectsV2Command,
  PutObjectCommand,
  S3ServiceException,
} from '@aws-sdk/client-s3';
import { unzipSync } from 'fflate';
import * as tar from 'tar';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { run } from '../../layers/gobuild.js';
import { createRepo, fixturePath, REPO_ROOT, readTree } from '../harness/fixtures.js';
import { isolatedGitEnv } from '../harness/servers/git.js';
import { type AllServers, DEFAULT_BUCKET, s3Client, startAllServers } from '../harness/servers.js';

const SIMPLE_APP = fixturePath('k8s-simple-app-example');
const LOOPBACK_URL = /^http:\/\/127\.0\.0\.1:\d+$/;

let servers: AllServers;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'servers-test-'));
  servers = await startAllServers();
});

afterAll(async () => {
  await servers?.stop();
  await rm(scratch, { recursive: true, force: true });
});

describe('startAllServers', () => {
  it('binds every server to 127.0.0.1 and returns plain data plus stop()', () => {
    expect(servers.s3.endpoint).toMatch(LOOPBACK_URL);
    expect(servers.registry.host).toMatch(/^127\.0\.0\.1:\d+$/);
    expect(servers.git.baseUrl).toMatch(LOOPBACK_URL);
    expect(servers.http.baseUrl).toMatch(LOOPBACK_URL);
    const { stop, ...info } = servers;
    expect(typeof stop).toBe('function');
    expect(JSON.parse(JSON.stringify(info))).toEqual(info);
    expect(servers.s3.bucket).toBe(DEFAULT_BUCKET);
    expect(servers.s3.region).toBe('us-east-1');
    expect(Object.keys(servers.registry.bundles).sort()).toEqual([
      'k8slt/kc-e2e-test-repo:latest',
      'k8slt/kctrl-example-pkg:v1.0.0',
      'k8slt/kctrl-example-pkg:v2.0.0',
    ]);
    expect(Object.keys(servers.http.files).sort()).toEqual([
      'k8s-simple-app-example-master.tgz',
      'k8s-simple-app-example-master.zip',
    ]);
  });
});

describe('S3 (versitygw)', () => {
  it('puts, lists, gets and deletes an object', async () => {
    const s3 = s3Client(servers.s3);
    try {
      const Bucket = DEFAULT_BUCKET;
      await s3.send(new PutObjectCommand({ Bucket, Key: 'dir/a.txt', Body: 'hello s3', ContentType: 'text/plain' }));
      const got = await s3.send(new GetObjectCommand({ Bucket, Key: 'dir/a.txt' }));
      expect(await got.Body?.transformToString()).toBe('hello s3');
      expect(got.ContentType).toBe('text/plain');
      const list = await s3.send(new ListObjectsV2Command({ Bucket, Prefix: 'dir/' }));
      expect(list.Contents?.map((o) => [o.Key, o.Size])).toEqual([['dir/a.txt', 8]]);
      await s3.send(new DeleteObjectCommand({ Bucket, Key: 'dir/a.txt' }));
      const err = await s3.send(new HeadObjectCommand({ Bucket, Key: 'dir/a.txt' })).catch((e: unknown) => e);
      expect((err as S3ServiceException).$metadata.httpStatusCode).toBe(404);
    } finally {
      s3.destroy();
    }
  });

  it('honours If-None-Match: * (store once): first put wins, second gets 412', async () => {
    const s3 = s3Client(servers.s3);
    try {
      const Bucket = DEFAULT_BUCKET;
      const Key = 'artifacts/sha256/abc';
      const first = await s3.send(new PutObjectCommand({ Bucket, Key, Body: 'first', IfNoneMatch: '*' }));
      expect(first.ETag).toMatch(/^"[0-9a-f]{32}"$/);
      const err = await s3
        .send(new PutObjectCommand({ Bucket, Key, Body: 'second', IfNoneMatch: '*' }))
        .catch((e: unknown) => e);
      expect(err).toBeInstanceOf(S3ServiceException);
      expect((err as S3ServiceException).name).toBe('PreconditionFailed');
      expect((err as S3ServiceException).$metadata.httpStatusCode).toBe(412);
      const got = await s3.send(new GetObjectCommand({ Bucket, Key }));
      expect(await got.Body?.transformToString()).toBe('first');
    } finally {
      s3.destroy();
    }
  });

  it('rejects a wrong secret', async () => {
    const s3 = s3Client({ ...servers.s3, secretAccessKey: 'wrong-secret' });
    try {
      const err = await s3
        .send(new PutObjectCommand({ Bucket: DEFAULT_BUCKET, Key: 'x', Body: 'x' }))
        .catch((e: unknown) => e);
      expect((err as S3ServiceException).$metadata.httpStatusCode).toBe(403);
      expect((err as S3ServiceException).name).toBe('SignatureDoesNotMatch');
    } finally {
      s3.destroy();
    }
  });
});

describe('OCI registry (docker-registry)', () => {
  it('lists the standard bundles and serves their manifests by the pushed digests', async () => {
    const base = `http://${servers.registry.host}/v2`;
    const catalog = (await (await fetch(`${base}/_catalog`)).json()) as { repositories: string[] };
    expect(catalog.repositories).toEqual(['k8slt/kc-e2e-test-repo', 'k8slt/kctrl-example-pkg']);
    const tags = (await (await fetch(`${base}/k8slt/kctrl-example-pkg/tags/list`)).json()) as { tags: string[] };
    // imgpkg also tags each bundle's locations image as sha256-<hex>.imgpkg
    const locations = ['v1.0.0', 'v2.0.0'].map(
      (v) => `${servers.registry.bundles[`k8slt/kctrl-example-pkg:${v}`]?.digest.replace(':', '-')}.imgpkg`,
    );
    expect(tags.tags.sort()).toEqual([...locations.sort(), 'v1.0.0', 'v2.0.0']);
    for (const [repoTag, bundle] of Object.entries(servers.registry.bundles)) {
      const [repo, tag] = repoTag.split(':') as [string, string];
      expect(bundle.ref).toBe(`${servers.registry.host}/${repoTag}`);
      expect(bundle.digestRef).toBe(`${servers.registry.host}/${repo}@${bundle.digest}`);
      const res = await fetch(`${base}/${repo}/manifests/${tag}`, {
        headers: { accept: 'application/vnd.docker.distribution.manifest.v2+json' },
      });
      await res.arrayBuffer();
      expect(res.status).toBe(200);
      expect(res.headers.get('docker-content-digest')).toBe(bundle.digest);
    }
  });
});

describe('git server (smart HTTP)', () => {
  it('serves k8s-simple-app-example with develop as its only branch', async () => {
    const repo = servers.git.repos['k8s-simple-app-example'];
    expect(repo?.url).toBe(`${servers.git.baseUrl}/k8s-simple-app-example`);
    const { stdout } = await run(['git', 'ls-remote', repo?.url ?? ''], { env: isolatedGitEnv() });
    expect(stdout).toBe(`${repo?.commitSha}\tHEAD\n${repo?.commitSha}\trefs/heads/develop\n`);
  });

  it('advertises git-upload-pack over smart HTTP, and refuses receive-pack', async () => {
    const url = `${servers.git.baseUrl}/k8s-simple-app-example`;
    const up = await fetch(`${url}/info/refs?service=git-upload-pack`);
    expect(up.status).toBe(200);
    expect(up.headers.get('content-type')).toBe('application/x-git-upload-pack-advertisement');
    expect(await up.text()).toMatch(/^001e# service=git-upload-pack\n/);
    const rp = await fetch(`${url}/info/refs?service=git-receive-pack`);
    await rp.arrayBuffer();
    expect(rp.status).toBe(403);
    const missing = await fetch(`${servers.git.baseUrl}/no-such-repo/info/refs?service=git-upload-pack`);
    await missing.arrayBuffer();
    expect(missing.status).toBe(404);
  });

  it('clones exactly the fixture tree', async () => {
    const repo = servers.git.repos['k8s-simple-app-example'];
    const dest = path.join(scratch, 'clone');
    await run(['git', 'clone', '--quiet', '--branch', 'develop', repo?.url ?? '', dest], { env: isolatedGitEnv() });
    expect(await readTree(dest)).toEqual(await readTree(SIMPLE_APP));
    const head = await run(['git', '-C', dest, 'log', '-1', '--format=%H %an <%ae> %aI %s'], { env: isolatedGitEnv() });
    expect(head.stdout.trim()).toBe(
      `${repo?.commitSha} kapp-lambda fixtures <fixtures@kapp-lambda.invalid> 2021-01-29T00:00:00+00:00 k8s-simple-app-example`,
    );
  });

  it('builds repos deterministically and moves a branch on a second commit', async () => {
    const again = await createRepo(servers.git, 'copies/simple-app', SIMPLE_APP, {
      branch: 'develop',
      message: 'k8s-simple-app-example',
    });
    expect(again.commitSha).toBe(servers.git.repos['k8s-simple-app-example']?.commitSha);
    const next = await createRepo(
      servers.git,
      'copies/simple-app',
      { 'a.txt': 'v2\n' },
      { branch: 'develop', tags: ['v2.0.0'] },
    );
    expect(next.commitSha).not.toBe(again.commitSha);
    const { stdout } = await run(['git', 'ls-remote', next.url], { env: isolatedGitEnv() });
    expect(stdout).toBe(
      `${next.commitSha}\tHEAD\n${next.commitSha}\trefs/heads/develop\n${next.commitSha}\trefs/tags/v2.0.0\n`,
    );
  });
});

describe('static HTTP server', () => {
  it('serves a helm repo index with podinfo pointing at itself', async () => {
    const helmRepo = servers.http.helmRepo;
    expect(helmRepo?.url).toBe(`${servers.http.baseUrl}/charts`);
    const chartYaml = parseYaml(await readFile(fixturePath('podinfo', 'charts', 'podinfo', 'Chart.yaml'), 'utf8')) as {
      version: string;
    };
    const index = parseYaml(await (await fetch(`${helmRepo?.url}/index.yaml`)).text()) as {
      apiVersion: string;
      entries: Record<string, { version: string; urls: string[]; digest: string }[]>;
    };
    expect(index.apiVersion).toBe('v1');
    expect(Object.keys(index.entries)).toEqual(['podinfo']);
    const entry = index.entries.podinfo?.[0];
    expect(entry?.version).toBe(chartYaml.version);
    expect(entry?.urls).toEqual([`${helmRepo?.url}/podinfo-${chartYaml.version}.tgz`]);
    const tgz = await fetch(entry?.urls[0] ?? '');
    expect(tgz.headers.get('content-type')).toBe('application/gzip');
    const bytes = Buffer.from(await tgz.arrayBuffer());
    expect(createHash('sha256').update(bytes).digest('hex')).toBe(entry?.digest);
  });

  it('serves k8s-simple-app-example-master.zip with the fixture under its top folder', async () => {
    const file = servers.http.files['k8s-simple-app-example-master.zip'];
    expect(file?.url).toBe(`${servers.http.baseUrl}/k8s-simple-app-example-master.zip`);
    const res = await fetch(file?.url ?? '');
    expect(res.headers.get('content-type')).toBe('application/zip');
    const entries = unzipSync(new Uint8Array(await res.arrayBuffer()));
    const files = Object.fromEntries(
      Object.entries(entries)
        .filter(([name]) => !name.endsWith('/'))
        .map(([name, data]) => [name, Buffer.from(data).toString()]),
    );
    const expected = Object.fromEntries(
      Object.entries(await readTree(SIMPLE_APP)).map(([rel, text]) => [`k8s-simple-app-example-master/${rel}`, text]),
    );
    expect(files).toEqual(expected);
    expect(Object.keys(entries)).toContain('k8s-simple-app-example-master/config-step-2-template/');
  });

  it('serves the same tree as a tgz', async () => {
    const file = servers.http.files['k8s-simple-app-example-master.tgz'];
    const res = await fetch(file?.url ?? '');
    const dest = path.join(scratch, 'untar');
    await mkdir(dest);
    const tgzPath = path.join(scratch, 'a.tgz');
    await writeFile(tgzPath, Buffer.from(await res.arrayBuffer()));
    await tar.x({ file: tgzPath, cwd: dest });
    expect(await readTree(path.join(dest, 'k8s-simple-app-example-master'))).toEqual(await readTree(SIMPLE_APP));
  });

  it('answers 404 for missing files and never leaves its root', async () => {
    for (const p of ['/nope.zip', '/../../etc/passwd', '/%2e%2e/%2e%2e/etc/passwd', '/charts']) {
      const res = await fetch(`${servers.http.baseUrl}${p}`);
      await res.arrayBuffer();
      expect([p, res.status]).toEqual([p, 404]);
    }
  });
});

describe('cleanup', () => {
  /** Starts `test/harness/servers/main.ts <what>` and reads its JSON line. */
  async function startChild(what: string) {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', path.join(REPO_ROOT, 'test/harness/servers/main.ts'), what],
      { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let out = '';
    let err = '';
    child.stderr.on('data', (d: Buffer) => {
      err += d.toString();
    });
    const line = await new Promise<string>((resolve, reject) => {
      child.stdout.on('data', (d: Buffer) => {
        out += d.toString();
        if (out.includes('\n')) resolve(out.slice(0, out.indexOf('\n')));
      });
      child.on('exit', (code) => reject(new Error(`main.ts ${what} exited ${code}: ${err}`)));
    });
    return { child, info: JSON.parse(line) as Record<string, unknown> & { pid: number } };
  }

  const alive = (pid: number) => {
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  };

  async function eventually(check: () => boolean | Promise<boolean>, ms = 10_000) {
    const end = Date.now() + ms;
    while (!(await check())) {
      if (Date.now() > end) throw new Error('condition not met in time');
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  it('stop() of startAllServers closes every server and removes every temp dir', async () => {
    const all = await startAllServers({ fixtures: false });
    const dirs = [all.s3.dir, all.registry.dir, all.git.root, all.http.root];
    for (const d of dirs) expect(existsSync(d)).toBe(true);
    const urls = [
      `${all.s3.endpoint}/healthz`,
      `${all.sqs.endpoint}/moto-api/`,
      `http://${all.registry.host}/v2/`,
      all.git.baseUrl,
      all.http.baseUrl,
    ];
    for (const url of urls) expect((await fetch(url)).status).toBeLessThan(500);
    await all.stop();
    for (const d of dirs) expect(existsSync(d)).toBe(false);
    for (const url of urls) await expect(fetch(url)).rejects.toThrow();
    await all.stop();
  });

  it('removes the registry process and its temp dir when the parent is SIGKILLed', async () => {
    const { child, info } = await startChild('registry');
    const host = info.host as string;
    const dir = info.dir as string;
    expect((await fetch(`http://${host}/v2/`)).status).toBe(200);
    expect(existsSync(dir)).toBe(true);
    child.kill('SIGKILL');
    await eventually(
      async () =>
        !existsSync(dir) &&
        !(await fetch(`http://${host}/v2/`).then(
          () => true,
          () => false,
        )),
    );
  });

  it('removes versitygw and its data when the parent is SIGKILLed', async () => {
    const { child, info } = await startChild('s3');
    const endpoint = info.endpoint as string;
    const dir = info.dir as string;
    expect(existsSync(path.join(dir, 'data', DEFAULT_BUCKET))).toBe(true);
    child.kill('SIGKILL');
    await eventually(
      async () =>
        !existsSync(dir) &&
        !(await fetch(`${endpoint}/healthz`).then(
          () => true,
          () => false,
        )),
    );
  });

  it('stop() on SIGTERM stops servers and removes temp dirs', async () => {
    const { child, info } = await startChild('git');
    const root = info.root as string;
    expect(existsSync(root)).toBe(true);
    child.kill('SIGTERM');
    await eventually(() => !alive(info.pid) && !existsSync(root));
  });
});
