/**
 * The real imgpkg (pinned in layers/manifest.ts) pushes bundles to and pulls them from the
 * local docker-registry over plain HTTP: content survives the round trip byte for byte, the
 * digest is the registry's manifest digest, and the same content gives the same digest.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { run } from '../../layers/gobuild.js';
import { fixturePath, pushBundle, readTree, toolBin, toolEnv } from '../harness/fixtures.js';
import { type RegistryServer, startRegistry } from '../harness/servers.js';

const E2E_BUNDLE = fixturePath('kapp-controller', 'test', 'e2e', 'assets', 'kappctrl-e2e-bundle');
const MANIFEST_TYPES =
  'application/vnd.oci.image.manifest.v1+json,application/vnd.docker.distribution.manifest.v2+json';

let registry: RegistryServer;
let scratch: string;

beforeAll(async () => {
  scratch = await mkdtemp(path.join(tmpdir(), 'imgpkg-test-'));
  registry = await startRegistry();
});

afterAll(async () => {
  await registry?.stop();
  await rm(scratch, { recursive: true, force: true });
});

/** Runs imgpkg with an isolated HOME. */
async function imgpkg(args: string[]) {
  return await run([toolBin('imgpkg'), ...args, '--tty=false'], { env: toolEnv({ home: scratch }) });
}

describe('imgpkg against docker-registry', () => {
  it('pushes kappctrl-e2e-bundle and pulls back the same files', async () => {
    const pushed = await pushBundle(registry, 'kc/kappctrl-e2e-bundle:v1', E2E_BUNDLE);
    expect(pushed.ref).toBe(`${registry.host}/kc/kappctrl-e2e-bundle:v1`);
    expect(pushed.digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(pushed.digestRef).toBe(`${registry.host}/kc/kappctrl-e2e-bundle@${pushed.digest}`);

    const byTag = path.join(scratch, 'pull-tag');
    await imgpkg(['pull', '-b', pushed.ref, '-o', byTag]);
    const fixture = await readTree(E2E_BUNDLE);
    expect(Object.keys(fixture)).toEqual(['.imgpkg/bundle.yml', '.imgpkg/images.yml', 'config.yml']);
    expect(await readTree(byTag)).toEqual(fixture);

    const byDigest = path.join(scratch, 'pull-digest');
    await imgpkg(['pull', '-b', pushed.digestRef, '-o', byDigest]);
    expect(await readTree(byDigest)).toEqual(fixture);
  });

  it('records the registry manifest digest, marked as a bundle, reproducibly', async () => {
    const a = await pushBundle(registry, 'kc/repro-a:v1', E2E_BUNDLE);
    const b = await pushBundle(registry, 'kc/repro-b:v9', E2E_BUNDLE);
    expect(b.digest).toBe(a.digest);

    const base = `http://${registry.host}/v2/kc/repro-a`;
    const res = await fetch(`${base}/manifests/v1`, { headers: { accept: MANIFEST_TYPES } });
    expect(res.status).toBe(200);
    expect(res.headers.get('docker-content-digest')).toBe(a.digest);
    const manifest = (await res.json()) as { config: { digest: string }; layers: unknown[] };
    expect(manifest.layers).toHaveLength(1);
    const config = (await (await fetch(`${base}/blobs/${manifest.config.digest}`)).json()) as {
      config: { Labels: Record<string, string> };
    };
    expect(config.config.Labels).toEqual({ 'dev.carvel.imgpkg.bundle': 'true' });

    const changed = await pushBundle(registry, 'kc/repro-c:v1', {
      ...(await readTree(E2E_BUNDLE)),
      'extra.yml': 'a: 1\n',
    });
    expect(changed.digest).not.toBe(a.digest);
  });

  it('adds an empty ImagesLock when the source has none', async () => {
    const pushed = await pushBundle(registry, 'kc/inline:v1', { 'app/config.yml': 'kind: Namespace\n' });
    const out = path.join(scratch, 'pull-inline');
    await imgpkg(['pull', '-b', pushed.ref, '-o', out]);
    expect(await readTree(out)).toEqual({
      '.imgpkg/images.yml': '---\napiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\n',
      'app/config.yml': 'kind: Namespace\n',
    });
  });

  it('fails to pull a tag that was never pushed', async () => {
    await expect(
      imgpkg(['pull', '-b', `${registry.host}/kc/kappctrl-e2e-bundle:nope`, '-o', path.join(scratch, 'x')]),
    ).rejects.toThrow(/MANIFEST_UNKNOWN|not found/i);
  });
});
