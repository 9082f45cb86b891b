/**
 * Publishes the demo's sources, all written by the project under `examples/sources/`, to the
 * local servers, and returns the placeholders of the example manifests (examples/README.md):
 *
 * - `hello-app/` (ytt config) as the git repository `examples/hello-app` (branch `main`), the
 *   zip `examples/hello-app.zip` (top folder `hello-app/`) and the imgpkg bundle
 *   `examples/hello-app:1.0.0`;
 * - `hello-chart/` as the helm repository `<http>/examples/charts`;
 * - the package `hello.examples.kapp-lambda.dev` 1.0.0 (its bundle holds `hello-app/` as
 *   `config/`) and `package-repository/` as a repository bundle whose `.imgpkg/images.yml` maps
 *   the Package's published name (`example.invalid/...`) to the local copy, as `imgpkg copy`
 *   relocates a repository for an air-gapped cluster.
 *
 * The app's container image is a one-file stand-in pushed to the registry and locked in the
 * bundles' images.yml, so kbld resolves nothing remotely; the kwok nodes never pull it.
 * Nothing here reads the third-party test fixtures (`test/unit/demo-sources.test.ts` checks).
 *
 * @module
 */
import path from 'node:path';
import {
  buildHelmRepo,
  createRepo,
  imagesLock,
  materialize,
  publishArchive,
  pushBundle,
  pushImage,
} from '../test/harness/fixtures.js';
import type { GitServerInfo } from '../test/harness/servers/git.js';
import type { HttpServerInfo } from '../test/harness/servers/http.js';
import { makeTempDir, removeTempDir } from '../test/harness/servers/process.js';
import type { RegistryInfo } from '../test/harness/servers/registry.js';
import { REPO_ROOT } from './local-env.js';

/** The servers the examples are published to (the demo's own, or the test servers). */
export interface ExampleServers {
  readonly registry: RegistryInfo;
  readonly git: GitServerInfo;
  readonly http: HttpServerInfo;
}

/** Absolute path of a source under `examples/sources/`. */
export function exampleSource(name: string): string {
  return path.join(REPO_ROOT, 'examples', 'sources', name);
}

/** The image the hello app's Deployment names (`examples/sources/hello-app/config.yml`). */
const HELLO_IMAGE = 'example.invalid/kapp-lambda/hello:1.0.0';
/** The name the Package fetches its bundle by (`examples/sources/package-repository`). */
const HELLO_PACKAGE_BUNDLE = 'example.invalid/kapp-lambda/packages/hello:1.0.0';

/**
 * Publishes every example source (see the module comment).
 * @returns placeholder → value for `renderExample` (`__GIT_URL__`, `__HTTP_URL__`,
 *   `__HELM_REPO_URL__`, `__REGISTRY__`, `__PACKAGE_REPO_BUNDLE__`).
 * @throws Error when git, helm or imgpkg fails.
 */
export async function publishExamples(s: ExampleServers): Promise<Record<string, string>> {
  const app = exampleSource('hello-app');
  const tmp = await makeTempDir('demo-examples');
  try {
    const [, , helmRepo, image] = await Promise.all([
      createRepo(s.git, 'examples/hello-app', app, { branch: 'main', message: 'hello-app' }),
      publishArchive(s.http, 'examples/hello-app.zip', app, { prefix: 'hello-app' }),
      buildHelmRepo(s.http, [exampleSource('hello-chart')], { repoPath: 'examples/charts' }),
      pushImage(s.registry, 'examples/hello:1.0.0', { README: `stand-in for ${HELLO_IMAGE} (never run)\n` }),
    ]);
    const appLock = imagesLock([{ id: HELLO_IMAGE, image: image.digestRef }]);
    await pushBundle(s.registry, 'examples/hello-app:1.0.0', app, { imagesLock: appLock });
    const pkgDir = await materialize(app, path.join(tmp, 'package', 'config'));
    const pkg = await pushBundle(s.registry, 'examples/packages/hello:1.0.0', path.dirname(pkgDir), {
      imagesLock: appLock,
    });
    const repo = await pushBundle(s.registry, 'examples/packages:1.0.0', exampleSource('package-repository'), {
      imagesLock: imagesLock([{ id: HELLO_PACKAGE_BUNDLE, image: pkg.digestRef }]),
    });
    return {
      __GIT_URL__: s.git.baseUrl,
      __HTTP_URL__: s.http.baseUrl,
      __HELM_REPO_URL__: helmRepo.url,
      __REGISTRY__: s.registry.host,
      __PACKAGE_REPO_BUNDLE__: repo.digestRef,
    };
  } finally {
    await removeTempDir(tmp);
  }
}
