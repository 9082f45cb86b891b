/**
 * The tests' copy of the kadras package repository (a third-party fixture of `../shared`, used by
 * the package-install e2e; the demo uses the project's own examples, `scripts/demo-examples.ts`), relocated to the local registry the way
 * `imgpkg copy` relocates a repository bundle for an air-gapped cluster (ghcr.io is not
 * reachable here): the metrics-server package bundle (`../shared/fixtures/kadras-package-for-metrics-server/package/config`)
 * is pushed to the local registry, and the repository bundle's `.imgpkg/images.yml` maps every
 * Package's `imgpkgBundle` image to where it now is, so the index-repo pipeline's kbld step
 * rewrites `metrics-server.packages.kadras.io.0.9.0` to the local copy (upstream's mechanism;
 * the other packages keep their ghcr.io digests and are not installed). The package's own
 * container image (`registry.k8s.io/metrics-server/metrics-server:v0.8.1`) is a one-file
 * stand-in pushed to the local registry and locked in the package bundle's images.yml, so its
 * kbld step resolves nothing remotely; the kwok nodes run no container, so it is never pulled.
 *
 * @module
 */
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { run } from '../../layers/gobuild.js';
import { fixturePath, imagesLock, materialize, pushBundle, toolBin, toolEnv } from './fixtures.js';
import { makeTempDir, removeTempDir } from './servers/process.js';
import type { RegistryInfo } from './servers/registry.js';

/** The image the metrics-server package deploys (`config/upstream/components.yaml`). */
const METRICS_SERVER_IMAGE = 'registry.k8s.io/metrics-server/metrics-server:v0.8.1';
/** The Package whose bundle the fixture holds (the latest metrics-server version of the repository). */
const METRICS_SERVER_PACKAGE = 'metrics-server.packages.kadras.io.0.9.0';

/** Every Package of the repository dir: its name and `imgpkgBundle` images. */
async function packageBundles(repoDir: string): Promise<{ name: string; images: string[] }[]> {
  const out: { name: string; images: string[] }[] = [];
  const root = path.join(repoDir, 'packages');
  for (const ref of await readdir(root)) {
    for (const file of await readdir(path.join(root, ref))) {
      for (const doc of parseAllDocuments(await readFile(path.join(root, ref, file), 'utf8'))) {
        const o = doc.toJS() as {
          kind?: string;
          metadata?: { name?: string };
          spec?: { template?: { spec?: { fetch?: { imgpkgBundle?: { image?: string } }[] } } };
        };
        if (o?.kind !== 'Package') continue;
        const images = (o.spec?.template?.spec?.fetch ?? []).flatMap((f) => f.imgpkgBundle?.image ?? []);
        out.push({ name: o.metadata?.name ?? '', images });
      }
    }
  }
  return out;
}

/**
 * Pushes the stand-in image, the metrics-server package bundle and the relocated repository
 * bundle to `registry`.
 *
 * @returns the repository bundle's digest ref (what the PackageRepository fetches).
 * @throws Error when imgpkg fails or the fixture has no metrics-server Package.
 */
export async function relocateKadras(registry: RegistryInfo): Promise<string> {
  const tmp = await makeTempDir('kadras');
  try {
    // The stand-in container image: one file, pushed as a plain image.
    const imageDir = path.join(tmp, 'image');
    await mkdir(imageDir);
    await writeFile(path.join(imageDir, 'README'), `stand-in for ${METRICS_SERVER_IMAGE} (never run)\n`);
    const ref = `${registry.host}/metrics-server/metrics-server`;
    const env = toolEnv({ home: tmp });
    await run([toolBin('imgpkg'), 'push', '--tty=false', '-i', `${ref}:v0.8.1`, '-f', imageDir], { env });
    // A plain image push writes no lock; `imgpkg tag resolve` prints `<repo>@sha256:<hex>`.
    const resolved = await run([toolBin('imgpkg'), 'tag', 'resolve', '--tty=false', '-i', `${ref}:v0.8.1`], { env });
    const image = /\S+@sha256:[0-9a-f]{64}/.exec(resolved.stdout)?.[0];
    if (!image) throw new Error(`imgpkg tag resolve ${ref}:v0.8.1: no digest ref in its output`);

    const pkgDir = path.join(tmp, 'package');
    await materialize(
      fixturePath('kadras-package-for-metrics-server', 'package', 'config'),
      path.join(pkgDir, 'config'),
    );
    const pkg = await pushBundle(registry, 'kadras-io/package-for-metrics-server:0.9.0', pkgDir, {
      imagesLock: imagesLock([{ id: METRICS_SERVER_IMAGE, image }]),
    });

    const repoDir = await materialize(fixturePath('kadras-packages', 'repo'), path.join(tmp, 'repo'));
    const packages = await packageBundles(repoDir);
    const original = packages.find((p) => p.name === METRICS_SERVER_PACKAGE)?.images[0];
    if (!original) throw new Error(`the kadras fixture has no ${METRICS_SERVER_PACKAGE}`);
    const ids = [...new Set(packages.flatMap((p) => p.images))].sort();
    await mkdir(path.join(repoDir, '.imgpkg'), { recursive: true });
    await writeFile(
      path.join(repoDir, '.imgpkg', 'images.yml'),
      imagesLock(ids.map((id) => ({ id, image: id === original ? pkg.digestRef : id }))),
    );
    return (await pushBundle(registry, 'kadras-io/kadras-packages:demo', repoDir)).digestRef;
  } finally {
    await removeTempDir(tmp);
  }
}
