/**
 * The pure parts of the benchmark's upgrade scenario (`bench/scenarios/upgrade.ts`) and its
 * counting registry proxy (`bench/lib/registry-proxy.ts`): the generated repository bundle is a
 * valid `packages/<refName>/` repository, tool runs are told apart as the fleet e2e does,
 * registry paths are classified and counted per repository and window, and the rows carry the
 * verdicts and kapp-controller's "not within N s".
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse } from 'yaml';
import { classifyRegistryPath, countRegistryRequests } from '../../bench/lib/registry-proxy.js';
import {
  classifyToolRun,
  countToolRuns,
  type FleetUpgrade,
  periodsIn,
  type TheirUpgrade,
  UPGRADE_REF_NAME,
  upgradeBundle,
  upgradeManifests,
  upgradeRows,
} from '../../bench/scenarios/upgrade.js';
import { parsePackageInstall, parsePackageRepository } from '../../functions/lib/api/parse.js';
import { filterRepositoryResources } from '../../functions/lib/packaging/repo-template.js';

describe('bench upgrade: generated content', () => {
  it('writes one PackageMetadata and one Package per version under packages/<refName>/', () => {
    const files = upgradeBundle(['1.0.0', '2.0.0']);
    expect(Object.keys(files).sort()).toEqual([
      `packages/${UPGRADE_REF_NAME}/1.0.0.yml`,
      `packages/${UPGRADE_REF_NAME}/2.0.0.yml`,
      `packages/${UPGRADE_REF_NAME}/metadata.yml`,
    ]);
    const docs = Object.values(files).map((f) => parse(f) as { kind: string; spec: { version?: string } });
    const { versions } = filterRepositoryResources(Object.values(files).join('---\n'));
    expect(versions).toEqual({ [UPGRADE_REF_NAME]: ['1.0.0', '2.0.0'] });
    expect(docs.filter((d) => d.kind === 'Package').map((d) => d.spec.version)).toEqual(['1.0.0', '2.0.0']);
  });

  it('writes a PackageRepository on the tag and a PackageInstall >=1.0.0, with or without a sync period', () => {
    const [repo, pkgi] = upgradeManifests('ns', '127.0.0.1:5000/upgrade:latest', '10m0s');
    const r = parsePackageRepository(repo);
    const p = parsePackageInstall(pkgi);
    expect(r.success && r.data.spec.fetch.imgpkgBundle?.image).toBe('127.0.0.1:5000/upgrade:latest');
    expect(p.success && p.data.spec.packageRef?.versionSelection?.constraints).toBe('>=1.0.0');
    expect(JSON.stringify(upgradeManifests('ns', 'x/y:z'))).not.toContain('syncPeriod');
  });
});

describe('bench upgrade: tool runs', () => {
  const scratch = `${path.sep}tmp${path.sep}index-repo-abc`;
  it('tells the repository fetch, the index pipeline and the Apps apart', () => {
    expect(classifyToolRun({ cmd: 'vendir', args: ['sync'], stdin: 'imgpkgBundle:\n  image: x' })).toBe('repo-fetch');
    expect(classifyToolRun({ cmd: 'vendir', args: ['sync'], stdin: 'inline: {}' })).toBe('app');
    expect(classifyToolRun({ cmd: 'ytt', args: ['-f', `${scratch}/packages`] })).toBe('repo-index');
    expect(classifyToolRun({ cmd: 'kbld', args: ['-f', '-'], cwd: scratch })).toBe('repo-index');
    expect(classifyToolRun({ cmd: 'ytt', args: ['-f', '/tmp/template-1'] })).toBe('app');
    expect(classifyToolRun({ cmd: 'kapp', args: ['deploy'], cwd: scratch })).toBe('app');
  });

  it('counts runs by kind and tool', () => {
    expect(
      countToolRuns([
        { kind: 'repo-fetch', cmd: 'vendir' },
        { kind: 'app', cmd: 'ytt' },
        { kind: 'app', cmd: 'ytt' },
      ]),
    ).toEqual({ 'repo-fetch': { vendir: 1 }, 'repo-index': {}, app: { ytt: 2 } });
  });

  it('counts the periods begun in a window, at least one', () => {
    expect(periodsIn(0, 60_000)).toBe(1);
    expect(periodsIn(60_000, 60_000)).toBe(1);
    expect(periodsIn(60_001, 60_000)).toBe(2);
  });
});

describe('bench upgrade: registry requests', () => {
  it('classifies Docker Registry v2 paths', () => {
    expect(classifyRegistryPath('/v2/')).toEqual({ kind: 'ping', repo: '' });
    expect(classifyRegistryPath('/v2/a/b/manifests/latest')).toEqual({
      kind: 'manifest',
      repo: 'a/b',
      reference: 'latest',
    });
    expect(classifyRegistryPath('/v2/a/blobs/sha256:00?x=1')).toEqual({ kind: 'blob', repo: 'a' });
    expect(classifyRegistryPath('/v2/a/tags/list')).toEqual({ kind: 'tags', repo: 'a' });
    expect(classifyRegistryPath('/metrics')).toEqual({ kind: 'other', repo: '' });
  });

  it('counts one repository in a window: tag resolutions, digests, blobs', () => {
    const reqs = [
      { at: 1, method: 'HEAD', path: '/v2/up/manifests/latest' },
      { at: 2, method: 'GET', path: '/v2/up/manifests/sha256:ab' },
      { at: 3, method: 'GET', path: '/v2/up/blobs/sha256:cd' },
      { at: 4, method: 'GET', path: '/v2/other/manifests/latest' },
      { at: 5, method: 'GET', path: '/v2/' },
      { at: 9, method: 'HEAD', path: '/v2/up/manifests/latest' },
    ];
    expect(countRegistryRequests(reqs, 'up', 0, 5)).toEqual({
      all: 3,
      manifestByTag: 1,
      manifestByTagHead: 1,
      manifestByDigest: 1,
      blobs: 1,
    });
    expect(countRegistryRequests(reqs, 'up').manifestByTag).toBe(2);
  });
});

describe('bench upgrade: rows', () => {
  const ours: FleetUpgrade = {
    clusterIds: 20,
    pollPeriodMs: 60_000,
    digests: { from: 'sha256:a', to: 'sha256:b' },
    wallMs: 50_000,
    pollWaitMs: 30_000,
    eventDrivenMs: 20_000,
    perIdMs: {},
    registry: { all: 5, manifestByTag: 1, manifestByTagHead: 1, manifestByDigest: 2, blobs: 2 },
    periods: 1,
    moves: 1,
    tools: { 'repo-fetch': { vendir: 1 }, 'repo-index': { ytt: 3, kbld: 1 }, app: { vendir: 20 } },
    metrics: {},
    setupMs: 1,
  };
  const theirs: TheirUpgrade = {
    version: 'v0.53.1',
    wallMs: null,
    boundS: 660,
    lastSyncAt: '2026-12-01T00:00:00.000Z',
    nextSyncDueAt: '2026-12-01T00:10:00.000Z',
    pushedAt: '2026-12-01T00:01:00.000Z',
    nextSyncDueAfterPushMs: 540_000,
    registry: ours.registry,
    setupMs: 1,
  };

  it('gives verdicts on the event-driven time, the polls per period and fetch/index per digest', () => {
    const rows = upgradeRows({ ours });
    expect(rows.filter((r) => r.verdict).map((r) => r.verdict)).toEqual(['met', 'met', 'met']);
    const bad = upgradeRows({
      ours: {
        ...ours,
        eventDrivenMs: 31_000,
        registry: { ...ours.registry, manifestByTag: 2 },
        tools: countToolRuns([]),
      },
    });
    expect(bad.filter((r) => r.verdict).map((r) => r.verdict)).toEqual(['missed', 'missed', 'missed']);
  });

  it("reports kapp-controller's timeout as not within the bound, with its next sync's due time", () => {
    const [row] = upgradeRows({ theirs });
    expect(row?.value).toContain('not within 660 s');
    expect(row?.value).toContain('540.0 s after the push');
    expect(upgradeRows({ ours, theirs: { ...theirs, wallMs: 500_000 } }).at(-1)?.value).toBe('0.100');
  });
});
