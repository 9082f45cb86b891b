/**
 * Every real server the integration and e2e tests (and the demo) talk to, started on
 * 127.0.0.1 free ports: S3 (versitygw), SQS (moto's server), OCI registry (Debian
 * docker-registry), git (smart HTTP via `git http-backend`) and a static HTTP server, plus the
 * standard fixtures served
 * from them (DESIGN.md "Real components"). The upstream URLs in kapp-controller's examples
 * map to these:
 *
 * | upstream | here |
 * |---|---|
 * | `https://github.com/k14s/k8s-simple-app-example` (`ref: origin/develop`) | `git.repos['k8s-simple-app-example'].url` |
 * | `https://dk-shared-assets.s3.amazonaws.com/k8s-simple-app-example-master.zip` | `http.files['k8s-simple-app-example-master.zip'].url` |
 * | a helm chart repo with `podinfo` | `http.helmRepo.url` |
 * | `k8slt/kctrl-example-pkg:v1.0.0`, `:v2.0.0`, `k8slt/kc-e2e-test-repo` | `registry.bundles[...]` |
 *
 * {@link startAllServers} returns plain data (JSON-serializable, for vitest's `provide`) plus
 * `stop()`. The git and HTTP servers read their dirs on every request, so a test process may
 * add repos and files with the builders in `fixtures.ts` while another process serves them.
 */
import {
  buildHelmRepo,
  createRepo,
  fixturePath,
  type GitRepo,
  type HelmRepo,
  materialize,
  type PublishedFile,
  type PushedBundle,
  publishArchive,
  pushBundle,
} from './fixtures.js';
import { type GitServer, type GitServerInfo, startGitServer } from './servers/git.js';
import { type HttpServer, type HttpServerInfo, startHttpServer } from './servers/http.js';
import { makeTempDir, removeTempDir } from './servers/process.js';
import { type RegistryInfo, type RegistryServer, startRegistry } from './servers/registry.js';
import { type S3Info, type S3Server, startS3Server } from './servers/s3.js';
import { type SqsInfo, type SqsServer, startSqsServer } from './servers/sqs.js';

export { type GitServer, type GitServerInfo, startGitServer } from './servers/git.js';
export { type HttpServer, type HttpServerInfo, startHttpServer } from './servers/http.js';
export { freePort, LOOPBACK } from './servers/process.js';
export { type RegistryInfo, type RegistryServer, startRegistry } from './servers/registry.js';
export { createBucket, type S3Info, type S3Server, s3Client, startS3Server } from './servers/s3.js';
export {
  createFifoQueue,
  type FifoQueueOptions,
  type SqsInfo,
  type SqsServer,
  sqsClient,
  startSqsServer,
} from './servers/sqs.js';

/** Bucket created on the S3 server by {@link startAllServers}. */
export const DEFAULT_BUCKET = 'kapp-lambda';

/** Git server description plus the standard repos, by name. */
export interface GitInfo extends GitServerInfo {
  /** `k8s-simple-app-example`: the fixture on its only branch `develop`. */
  readonly repos: Readonly<Record<string, GitRepo>>;
}

/** Static server description plus what it serves. */
export interface HttpInfo extends HttpServerInfo {
  /** Helm repo at `<baseUrl>/charts` with podinfo (from `podinfo/charts/podinfo`). */
  readonly helmRepo?: HelmRepo;
  /**
   * Files by name: `k8s-simple-app-example-master.zip` (top folder
   * `k8s-simple-app-example-master/`, as GitHub's branch zips) and
   * `k8s-simple-app-example-master.tgz` (same layout).
   */
  readonly files: Readonly<Record<string, PublishedFile>>;
}

/** Registry description plus the standard bundles, by their upstream `repo:tag`. */
export interface RegistryWithBundles extends RegistryInfo {
  /**
   * `k8slt/kctrl-example-pkg:v1.0.0` (config-step-2-template at the root),
   * `k8slt/kctrl-example-pkg:v2.0.0` (the whole simple app), both with the ImagesLock of
   * kapp-controller's `kappctrl-e2e-bundle`; `k8slt/kc-e2e-test-repo:latest` (kapp-controller's
   * e2e package repository bundle, as is).
   */
  readonly bundles: Readonly<Record<string, PushedBundle>>;
}

/** Everything {@link startAllServers} started. All fields but `stop` are plain data. */
export interface AllServers {
  /** S3 server with bucket {@link DEFAULT_BUCKET}. */
  readonly s3: S3Info;
  /** SQS-compatible server (moto), no queues: tests create their own (`createFifoQueue`). */
  readonly sqs: SqsInfo;
  readonly registry: RegistryWithBundles;
  readonly git: GitInfo;
  readonly http: HttpInfo;
  /** Stops every server and removes every temp dir; never throws, idempotent. */
  stop(): Promise<void>;
}

/**
 * What crosses to test workers: {@link AllServers} without `stop` (vitest `provide('servers')`
 * in test/harness/global-setup.ts).
 */
export type ServersInfo = Omit<AllServers, 'stop'>;

/** Options of {@link startAllServers}. */
export interface StartAllOptions {
  /** Build and serve the standard fixtures (default true); false starts empty servers. */
  readonly fixtures?: boolean;
}

type Stoppable = { stop(): Promise<void> };

/**
 * Starts S3, SQS, registry, git and static HTTP servers in parallel, then publishes the standard
 * fixtures (unless `fixtures: false`). Needs the pinned versitygw, helm and imgpkg and
 * moto (`npm run setup`) and Debian `docker-registry` and `git`.
 * @throws Error from the first server or fixture that fails; whatever started is stopped
 *   first.
 */
export async function startAllServers(opts: StartAllOptions = {}): Promise<AllServers> {
  const started: Stoppable[] = [];
  const track = <T extends Stoppable>(p: Promise<T>) =>
    p.then((s) => {
      started.push(s);
      return s;
    });
  let stopped: Promise<void> | undefined;
  const stop = () => {
    stopped ??= Promise.allSettled(started.map((s) => s.stop())).then(() => undefined);
    return stopped;
  };
  try {
    const results = await Promise.allSettled([
      track<S3Server>(startS3Server({ bucket: DEFAULT_BUCKET })),
      track<SqsServer>(startSqsServer()),
      track<RegistryServer>(startRegistry()),
      track<GitServer>(startGitServer()),
      track<HttpServer>(startHttpServer()),
    ]);
    const failed = results.find((r) => r.status === 'rejected');
    if (failed) throw (failed as PromiseRejectedResult).reason;
    const [s3, sqs, registry, git, http] = results.map((r) => (r as PromiseFulfilledResult<Stoppable>).value) as [
      S3Server,
      SqsServer,
      RegistryServer,
      GitServer,
      HttpServer,
    ];
    const fx = opts.fixtures === false ? undefined : await standardFixtures(registry, git, http);
    return {
      s3: plain(s3),
      sqs: plain(sqs),
      registry: { ...plain(registry), bundles: fx?.bundles ?? {} },
      git: { ...plain(git), repos: fx?.repos ?? {} },
      http: { ...plain(http), ...(fx ? { helmRepo: fx.helmRepo } : {}), files: fx?.files ?? {} },
      stop,
    };
  } catch (e) {
    await stop();
    throw new Error('start test servers', { cause: e });
  }
}

/** Copies the data fields of a server handle, dropping `stop`. */
function plain<T extends Stoppable>(s: T): Omit<T, 'stop'> {
  const { stop: _stop, ...rest } = s;
  return rest;
}

/** The standard fixtures, see {@link AllServers}. */
async function standardFixtures(registry: RegistryInfo, git: GitServerInfo, http: HttpServerInfo) {
  const simpleApp = fixturePath('k8s-simple-app-example');
  const e2eBundle = fixturePath('kapp-controller', 'test', 'e2e', 'assets', 'kappctrl-e2e-bundle');
  const [repo, helmRepo, zip, tgz] = await Promise.all([
    createRepo(git, 'k8s-simple-app-example', simpleApp, { branch: 'develop', message: 'k8s-simple-app-example' }),
    buildHelmRepo(http, [fixturePath('podinfo', 'charts', 'podinfo')]),
    publishArchive(http, 'k8s-simple-app-example-master.zip', simpleApp, { prefix: 'k8s-simple-app-example-master' }),
    publishArchive(http, 'k8s-simple-app-example-master.tgz', simpleApp, { prefix: 'k8s-simple-app-example-master' }),
  ]);
  // bundle sources: simple app (v1: config-step-2-template at the root; v2: whole app) with
  // the e2e bundle's `.imgpkg/images.yml` (ImagesLock for docker.io/dkalinin/k8s-simple-app)
  const tmp = await makeTempDir('std-bundles');
  const bundles: Record<string, PushedBundle> = {};
  try {
    const v1 = await materialize(fixturePath('k8s-simple-app-example', 'config-step-2-template'), `${tmp}/v1`);
    await materialize(`${e2eBundle}/.imgpkg`, `${v1}/.imgpkg`);
    const v2 = await materialize(simpleApp, `${tmp}/v2`);
    await materialize(`${e2eBundle}/.imgpkg`, `${v2}/.imgpkg`);
    const list: [string, string][] = [
      ['k8slt/kctrl-example-pkg:v1.0.0', v1],
      ['k8slt/kctrl-example-pkg:v2.0.0', v2],
      ['k8slt/kc-e2e-test-repo:latest', fixturePath('kapp-controller', 'test', 'e2e', 'assets', 'kc-e2e-test-repo')],
    ];
    for (const [repoTag, dir] of list) bundles[repoTag] = await pushBundle(registry, repoTag, dir);
  } finally {
    await removeTempDir(tmp);
  }
  return {
    repos: { 'k8s-simple-app-example': repo },
    helmRepo,
    files: { 'k8s-simple-app-example-master.zip': zip, 'k8s-simple-app-example-master.tgz': tgz },
    bundles,
  };
}

/** Re-export of the fixture builders, for callers that import only this module. */
export {
  buildHelmRepo,
  createRepo,
  type GitRepo,
  type HelmRepo,
  type PublishedFile,
  type PushedBundle,
  publishArchive,
  pushBundle,
} from './fixtures.js';
