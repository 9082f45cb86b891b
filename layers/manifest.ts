/**
 * Pinned manifest of every Go-built binary kapp-lambda runs: the tools that go into the
 * per-stage Lambda layers, and the components tests and the demo run locally (control
 * plane, kwok, S3 server, Lambda runtime emulator).
 *
 * Versions are the ones the Go module proxy here serves and whose checksums the sum
 * database knows: kbld v0.47.0 and imgpkg v0.47.0 fail checksum verification, and vendir
 * v0.46.0 needs imgpkg v0.48.0, which the proxy refuses, so vendir v0.44.0 with the imgpkg
 * it requires (v0.46.1) is pinned. kapp-controller v0.53.1 (`need: 'tests'`) is
 * served by the proxy but unknown to the sum database (`noSumDb`). Upstream kapp-controller pins
 * ytt v0.50.0, kbld v0.44.0, kapp v0.63.2, vendir v0.41.0, helm v3.15.3, sops v3.9.0,
 * age v1.2.0, cue v0.9.2 (`hack/dependencies.yml`); ours are newer and flag-compatible.
 *
 * The tools the functions run take their version and layers from the tool table (`./tools.ts`):
 * this file adds how to build them, and the components only tests and the demo run.
 */

import type { PipelineStage } from '../functions/lib/api/functions.js';
import { tool } from './tools.js';

/**
 * A Lambda function (`PIPELINE_STAGES`) whose layer holds a tool. A function's layer must carry
 * every tool of its allow-list (`STAGE_TOOLS` in `functions/lib/exec/runner.ts`; both come from
 * `./tools.ts`, and the layers test checks it).
 */
export type Stage = PipelineStage;

/** One binary built from a Go module. */
export interface GoBinary {
  /** Binary file name on PATH, e.g. `ytt`. */
  readonly bin: string;
  /** Go package path of the `main` package, e.g. `carvel.dev/ytt/cmd/ytt`. */
  readonly pkg: string;
  /** Argv (after the binary) that prints the version. */
  readonly versionArgs: readonly string[];
  /** Text that `versionArgs` output must contain; defaults to the version without `v`. */
  readonly expectVersion?: string;
  /**
   * Check the version with `go version -m <binary>` (the module version in its build info)
   * instead of running the binary; for tools without a harmless version command.
   */
  readonly versionFromBuildInfo?: boolean;
}

/** One Go module at a pinned version and the binaries built from it. */
export interface GoComponent {
  /** Short name, used as the cache key with the version. */
  readonly name: string;
  /** Module path as the Go module proxy serves it. */
  readonly module: string;
  /** Exact version (`vX.Y.Z` or a pseudo-version). */
  readonly version: string;
  readonly binaries: readonly GoBinary[];
  /**
   * `-X importpath.name=value` stamps, without the `-X`. Upstream release builds set these;
   * without them several tools report `develop` or `v0.0.0-master`.
   */
  readonly stamps?: readonly string[];
  /** Go build tags. */
  readonly tags?: readonly string[];
  /**
   * Version that replaces upstream's local-path `replace` targets (k8s.io/kubernetes pins its
   * staging modules at v0.0.0 and replaces them with `./staging/...`; etcd server replaces its
   * siblings with `../api` etc.). Local replaces are dropped when this is unset.
   */
  readonly localReplaceVersion?: string;
  /** Stages whose Lambda layer carries these binaries; empty for local-only components. */
  readonly layers: readonly Stage[];
  /**
   * Which setups build it unasked ({@link ComponentNeed}; `tsx scripts/setup.ts <name>` builds
   * whatever it names, and the benchmark builds kapp-controller with `buildComponent`). Default
   * `always`.
   */
  readonly need?: ComponentNeed;
  /**
   * The Go checksum database has no entry for this module version (its lookup answers 404), so
   * the build sets `GONOSUMDB=<module>` and trusts the module proxy for this one module (its
   * dependencies are still verified). Default false.
   */
  readonly noSumDb?: boolean;
  /**
   * Build with kapp-lambda's patch of Go's `httpproxy` (see `proxyLoopbackOverlay` in
   * gobuild.ts): with `KL_PROXY_LOOPBACK=1` in its environment the binary sends requests to
   * `localhost` and loopback literals through `HTTP(S)_PROXY` too, which stock Go never does.
   * Set for every tool that makes requests while the egress proxy enforces the URL policy.
   * Default false.
   */
  readonly proxyLoopback?: boolean;
  /**
   * Build with kapp-lambda's patch of imgpkg's layer extraction (see `patchImgpkgLayerPaths` in
   * gobuild.ts): an entry whose name leaves the output directory once imgpkg reads `\` as a
   * separator (`..\x`) fails the pull, naming the entry. Set for imgpkg and for vendir, which
   * links imgpkg's extraction. Default false.
   */
  readonly imgpkgLayerPaths?: boolean;
  /**
   * `npm run demo` runs it (a tool of the demo's Apps and package, or the local control plane),
   * so `tsx scripts/setup.ts --for demo` builds it (`scripts/setup-plan.ts`); the rest only the
   * tests and the benchmark need. Not part of the build cache key. Default false.
   */
  readonly demo?: boolean;
  /** Why this component is here. */
  readonly purpose: string;
}

/**
 * The version and layers of a tool of `./tools.ts`, for its component here. (The fields stay
 * in their places in each component: {@link COMPONENTS}' key order is part of the build cache key.)
 * @throws Error when the table has no such tool, or none with a pinned version (git).
 */
function pinnedTool(name: string): Pick<GoComponent, 'version' | 'layers'> {
  const t = tool(name);
  if (t.version === undefined) throw new Error(`tool ${name} has no pinned version`);
  return { version: t.version, layers: t.stages };
}

/** A version without its leading `v`, as most stamps want it. */
const bare = (version: string) => version.replace(/^v/, '');

const ytt = pinnedTool('ytt');
const kbld = pinnedTool('kbld');
const kapp = pinnedTool('kapp');
const vendir = pinnedTool('vendir');
const imgpkg = pinnedTool('imgpkg');
const helm = pinnedTool('helm');
const sops = pinnedTool('sops');
const age = pinnedTool('age');
const cue = pinnedTool('cue');
const kustomize = pinnedTool('kustomize');

const K8S = 'v1.34.4';
const K8S_STAGING = 'v0.34.4';
const k8sStamps = (pkg: string) => [
  `${pkg}.gitVersion=${K8S}`,
  `${pkg}.gitMajor=1`,
  `${pkg}.gitMinor=34`,
  `${pkg}.gitTreeState=clean`,
  `${pkg}.gitCommit=0000000000000000000000000000000000000000`,
  `${pkg}.buildDate=1970-01-01T00:00:00Z`,
];

/** Every pinned component, in build order (small tools first, the control plane last). */
export const COMPONENTS: readonly GoComponent[] = [
  {
    name: 'ytt',
    demo: true,
    module: 'carvel.dev/ytt',
    version: ytt.version,
    stamps: [`carvel.dev/ytt/pkg/version.Version=${bare(ytt.version)}`],
    binaries: [{ bin: 'ytt', pkg: 'carvel.dev/ytt/cmd/ytt', versionArgs: ['version'] }],
    layers: ytt.layers,
    purpose: 'template: ytt',
  },
  {
    name: 'kbld',
    demo: true,
    proxyLoopback: true,
    module: 'carvel.dev/kbld',
    version: kbld.version,
    stamps: [`carvel.dev/kbld/pkg/kbld/version.Version=${bare(kbld.version)}`],
    binaries: [{ bin: 'kbld', pkg: 'carvel.dev/kbld/cmd/kbld', versionArgs: ['version'] }],
    layers: kbld.layers,
    purpose: 'template: kbld image resolution (--build=false)',
  },
  {
    name: 'kapp',
    demo: true,
    module: 'carvel.dev/kapp',
    version: kapp.version,
    stamps: [`carvel.dev/kapp/pkg/kapp/version.Version=${bare(kapp.version)}`],
    binaries: [{ bin: 'kapp', pkg: 'carvel.dev/kapp/cmd/kapp', versionArgs: ['version'] }],
    layers: kapp.layers,
    purpose: 'deploy: kapp deploy/inspect/delete; index-repo: kapp deploy/delete of <name>.pkgr',
  },
  {
    name: 'vendir',
    demo: true,
    proxyLoopback: true,
    imgpkgLayerPaths: true,
    module: 'carvel.dev/vendir',
    version: vendir.version,
    stamps: [`carvel.dev/vendir/pkg/vendir/version.Version=${bare(vendir.version)}`],
    binaries: [{ bin: 'vendir', pkg: 'carvel.dev/vendir/cmd/vendir', versionArgs: ['version'] }],
    layers: vendir.layers,
    purpose: 'fetch: vendir sync',
  },
  {
    name: 'imgpkg',
    demo: true,
    proxyLoopback: true,
    imgpkgLayerPaths: true,
    module: 'carvel.dev/imgpkg',
    version: imgpkg.version,
    stamps: [`carvel.dev/imgpkg/pkg/imgpkg/cmd.Version=${bare(imgpkg.version)}`],
    binaries: [{ bin: 'imgpkg', pkg: 'carvel.dev/imgpkg/cmd/imgpkg', versionArgs: ['version'] }],
    layers: imgpkg.layers,
    purpose: 'fetch: imgpkg bundles (vendir calls it); tests push bundles with it',
  },
  {
    name: 'helm',
    demo: true,
    proxyLoopback: true,
    module: 'helm.sh/helm/v3',
    version: helm.version,
    stamps: [
      `helm.sh/helm/v3/internal/version.version=${helm.version}`,
      'helm.sh/helm/v3/internal/version.gitTreeState=clean',
      'helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1',
      'helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=34',
      'helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1',
      'helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=34',
    ],
    binaries: [{ bin: 'helm', pkg: 'helm.sh/helm/v3/cmd/helm', versionArgs: ['version', '--short'] }],
    layers: helm.layers,
    purpose: 'fetch: helmChart (vendir calls helm); template: helm template',
  },
  {
    name: 'sops',
    // its dead proxy (functions/lib/template/sops.ts) then catches loopback key services too
    proxyLoopback: true,
    module: 'github.com/getsops/sops/v3',
    version: sops.version,
    binaries: [
      {
        bin: 'sops',
        pkg: 'github.com/getsops/sops/v3/cmd/sops',
        versionArgs: ['--version', '--disable-version-check'],
      },
    ],
    layers: sops.layers,
    purpose: 'template: sops decryption',
  },
  {
    name: 'age',
    module: 'filippo.io/age',
    version: age.version,
    binaries: [
      { bin: 'age', pkg: 'filippo.io/age/cmd/age', versionArgs: ['--version'] },
      { bin: 'age-keygen', pkg: 'filippo.io/age/cmd/age-keygen', versionArgs: ['--version'] },
    ],
    layers: age.layers,
    purpose: 'template: age keys for sops',
  },
  {
    name: 'cue',
    module: 'cuelang.org/go',
    version: cue.version,
    binaries: [{ bin: 'cue', pkg: 'cuelang.org/go/cmd/cue', versionArgs: ['version'] }],
    layers: cue.layers,
    purpose: 'template: cue export',
  },
  {
    name: 'kustomize',
    // its dead proxy (functions/lib/template/kustomize.ts) then catches loopback URLs too
    proxyLoopback: true,
    module: 'sigs.k8s.io/kustomize/kustomize/v5',
    // v5.8.3 needs go 1.27; v5.8.2 and its api/kyaml/cmd-config v0.21.2 need go 1.26.0
    version: kustomize.version,
    // its release build (releasing/cloudbuild.sh) stamps these; `kustomize version` prints `v5.8.2`
    stamps: [
      `sigs.k8s.io/kustomize/api/provenance.version=kustomize/${kustomize.version}`,
      'sigs.k8s.io/kustomize/api/provenance.buildDate=1970-01-01T00:00:00Z',
    ],
    binaries: [{ bin: 'kustomize', pkg: 'sigs.k8s.io/kustomize/kustomize/v5', versionArgs: ['version'] }],
    layers: kustomize.layers,
    purpose: 'template: kustomize build (a step kapp-controller lacks)',
  },
  {
    name: 'versitygw',
    module: 'github.com/versity/versitygw',
    version: 'v1.8.0',
    // its Makefile stamps these; unstamped it reports `Version  : git`
    stamps: ['main.Version=v1.8.0', 'main.Build=v1.8.0', 'main.BuildTime=1970-01-01T00:00:00Z'],
    binaries: [
      {
        bin: 'versitygw',
        pkg: 'github.com/versity/versitygw/cmd/versitygw',
        versionArgs: ['--version'],
      },
    ],
    layers: [],
    purpose: 'tests: S3-compatible object storage server',
  },
  {
    name: 'kwok',
    demo: true,
    module: 'sigs.k8s.io/kwok',
    version: 'v0.8.0',
    stamps: ['sigs.k8s.io/kwok/pkg/consts.Version=v0.8.0'],
    binaries: [
      { bin: 'kwok', pkg: 'sigs.k8s.io/kwok/cmd/kwok', versionArgs: ['--version'] },
      { bin: 'kwokctl', pkg: 'sigs.k8s.io/kwok/cmd/kwokctl', versionArgs: ['--version'] },
    ],
    layers: [],
    purpose: 'local cluster: kwokctl binary runtime and fake nodes',
  },
  {
    name: 'etcd',
    demo: true,
    module: 'go.etcd.io/etcd/server/v3',
    version: 'v3.6.16',
    localReplaceVersion: 'v3.6.16',
    binaries: [{ bin: 'etcd', pkg: 'go.etcd.io/etcd/server/v3', versionArgs: ['--version'] }],
    layers: [],
    purpose: 'local cluster: etcd',
  },
  {
    name: 'kubernetes',
    demo: true,
    module: 'k8s.io/kubernetes',
    version: K8S,
    localReplaceVersion: K8S_STAGING,
    tags: ['selinux', 'notest'],
    stamps: [...k8sStamps('k8s.io/component-base/version'), ...k8sStamps('k8s.io/client-go/pkg/version')],
    binaries: [
      { bin: 'kube-apiserver', pkg: 'k8s.io/kubernetes/cmd/kube-apiserver', versionArgs: ['--version'] },
      {
        bin: 'kube-controller-manager',
        pkg: 'k8s.io/kubernetes/cmd/kube-controller-manager',
        versionArgs: ['--version'],
      },
      { bin: 'kube-scheduler', pkg: 'k8s.io/kubernetes/cmd/kube-scheduler', versionArgs: ['--version'] },
      { bin: 'kubectl', pkg: 'k8s.io/kubernetes/cmd/kubectl', versionArgs: ['version', '--client'] },
    ],
    layers: [],
    purpose: 'local cluster: control plane and kubectl',
  },
  {
    name: 'aws-lambda-rie',
    module: 'github.com/aws/aws-lambda-runtime-interface-emulator',
    version: 'v0.0.0-20261030222936-bef5c4ba774d',
    binaries: [
      {
        bin: 'aws-lambda-rie',
        pkg: 'github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie',
        // It has no version flag (every argument is taken as the handler to run, and it then
        // binds 0.0.0.0:8080), so its version is read from the Go build info instead.
        versionArgs: [],
        versionFromBuildInfo: true,
      },
    ],
    layers: [],
    purpose: 'cloud runtime tests: Lambda Runtime Interface Emulator',
  },
  {
    name: 'kapp-controller',
    module: 'carvel.dev/kapp-controller',
    version: 'v0.53.1',
    // hack/build.sh builds ./cmd/controller; release builds stamp main.Version (logged at start)
    stamps: ['main.Version=v0.53.1'],
    binaries: [
      {
        bin: 'kapp-controller',
        pkg: 'carvel.dev/kapp-controller/cmd/controller',
        // no version flag: `-help` lists the flags (the stamp is checked in its start-up log)
        versionArgs: ['-help'],
        expectVersion: 'start-api-server',
      },
    ],
    layers: [],
    need: 'tests',
    noSumDb: true,
    purpose:
      'benchmark and the migration e2e: upstream kapp-controller run out of cluster, side by side (bench/README.md, docs/migrating.md)',
  },
];

/**
 * Who needs a component, so which setup profiles (`scripts/setup-plan.ts`) build it:
 * - `always`: every profile that runs it (`full`; `demo` when the demo runs it; `start` when a
 *   function's layer carries it);
 * - `tests`: only `full` (`npm test`, CI), for what a test runs but no user does (kapp-controller:
 *   the migration e2e); the demo and `npm start` never build it;
 * - `named`: no profile; built when named or by its user.
 *
 * The build's cache key (`componentKey`) sees only whether it is `always` (the former `optional`
 * flag, so the keys of builds made before stay valid): moving a component between `tests` and
 * `named` rebuilds nothing.
 */
export type ComponentNeed = 'always' | 'tests' | 'named';

/** Looks up a component by name. @throws Error when the name is not in {@link COMPONENTS}. */
export function component(name: string): GoComponent {
  const c = COMPONENTS.find((x) => x.name === name);
  if (!c) throw new Error(`unknown component ${name}`);
  return c;
}
