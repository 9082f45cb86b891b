/**
 * `npm run release`: the versioned install manifest of one cluster, `release/kapp-lambda-<version>.yml`
 * (version from package.json), applied with `kubectl apply -f` or `kapp deploy -a kapp-lambda -f`.
 *
 * ```
 * npm run release                       # writes release/kapp-lambda-<version>.yml and -runtime-<version>.yml
 * npm run release -- --check            # exit 1 when either file is not what the sources give now
 * npm run release -- --image-repository <repo> [--forwarder-role-arn <arn>] --out <file>
 * ```
 *
 * Nothing in it is copied: every document is generated from the sources, in one stable order
 * (namespaces, then CRDs, then by kind, namespace and name; keys sorted as `gen:crds` sorts them):
 * - the five CRDs from `functions/lib/api` (`infra/crds/generate.ts`'s generator, not its files);
 * - the namespaces `kapp-lambda` and the global packaging namespace
 *   (`kapp-controller-packaging-global`, upstream's default `-packaging-global-namespace`): a
 *   cluster that does not create it lets any tenant claim it, and with it every cluster's
 *   global Packages (upstream's release creates it too);
 * - the forwarder (`infra/forwarder/*.yml`) with its three hand edits turned into inputs: the
 *   image is `<image repository>:<version>`; the ServiceAccount's IRSA annotation is left out
 *   (EKS Pod Identity needs none) unless `--forwarder-role-arn` is given; and the settings that
 *   name a fleet (`FORWARDER_CLUSTER_ID`, `AWS_REGION`, `KAPP_LAMBDA_QUEUE_URL_*`) move out of
 *   its ConfigMap into {@link FORWARDER_FLEET_CONFIGMAP}, which the Deployment also reads and
 *   which joining the cluster to a fleet creates (until then its Pods wait, in
 *   `CreateContainerConfigError`, naming that ConfigMap);
 * - the RBAC of the functions' identities and of a PackageRepository's kapp, with the
 *   ValidatingAdmissionPolicy bounding `kapp-lambda-pkgr`: what `npm run cluster -- add` prints
 *   (`rbacManifests` of `./cluster-registry.ts`) with the default namespaces and without the
 *   token identities of `--auth token` (a fleet's choice: non-expiring token Secrets a fleet with
 *   EKS access entries must not have).
 *
 * The in-cluster runtime (kapp-lambda without AWS: `npm start`'s embedded runtime as a
 * Deployment) is a second file, `release/kapp-lambda-runtime-<version>.yml`
 * ({@link runtimeReleaseDocuments}), applied after this one: its ServiceAccount, bindings derived
 * from the roles above ({@link runtimeBindings}), the Deployment, a metrics Service and a
 * PodDisruptionBudget. A second file, not a section, because a cluster runs it or joins a cloud
 * fleet (the forwarder above), never both, and `kubectl apply -f` takes a file whole.
 *
 * `release/` is committed, as `infra/crds/` is: a user installs from a checkout or a raw URL
 * without Node, and `test/unit/release.test.ts` fails when the file is stale.
 *
 * @module
 */
import { readdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { parseAllDocuments } from 'yaml';
import { DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../functions/lib/api/constants.js';
import { generateCrdDocuments, renderYaml } from '../infra/crds/generate.js';
import { EXIT, exitCodesHelp, isUsageError, runIfEntry, usageFailure } from './cli.js';
import { rbacManifests } from './cluster-registry.js';

const ROOT = path.resolve(import.meta.dirname, '..');

/** Directory of the committed releases, one file per version. */
export const RELEASE_DIR = path.join(ROOT, 'release');

/** Directory of the forwarder's manifests (the source of its documents). */
export const FORWARDER_DIR = path.join(ROOT, 'infra', 'forwarder');

/** The namespace of the forwarder, the functions' identities and `kapp-controller-config`. */
export const RELEASE_NAMESPACE = 'kapp-lambda';

/**
 * Where the forwarder image is pulled from by default; `--image-repository` names another. The
 * tag is the release's version.
 */
export const DEFAULT_FORWARDER_IMAGE_REPOSITORY = 'ghcr.io/kapp-lambda/forwarder';

/**
 * The ConfigMap (namespace {@link RELEASE_NAMESPACE}) holding the forwarder's settings that name
 * a fleet ({@link isFleetSetting}): not in the release, created when the cluster joins a fleet.
 */
export const FORWARDER_FLEET_CONFIGMAP = 'kapp-lambda-forwarder-fleet';

/** The forwarder ServiceAccount's IRSA annotation. */
const IRSA_ANNOTATION = 'eks.amazonaws.com/role-arn';

/** Inputs of a release; every one but the version has a default. */
export interface ReleaseInputs {
  /** The version (package.json's), in the file name, the header and the image tag. */
  version: string;
  /** Repository of the forwarder image. Default {@link DEFAULT_FORWARDER_IMAGE_REPOSITORY}. */
  imageRepository?: string;
  /** IAM role ARN for IRSA on the forwarder's ServiceAccount. Default none (EKS Pod Identity). */
  forwarderRoleArn?: string;
}

/** A Kubernetes object as the release handles it. */
export type ReleaseDocument = {
  apiVersion: string;
  kind: string;
  metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> };
  [field: string]: unknown;
};

/** Whether a forwarder setting names a fleet (its cluster id, region and queues). */
export function isFleetSetting(key: string): boolean {
  return key === 'FORWARDER_CLUSTER_ID' || key === 'AWS_REGION' || key.startsWith('KAPP_LAMBDA_QUEUE_URL_');
}

/** `kapp-lambda-<version>.yml`. */
export function releaseFileName(version: string): string {
  return `kapp-lambda-${version}.yml`;
}

/** The version in package.json. */
export async function packageVersion(): Promise<string> {
  const pkg = JSON.parse(await readFile(path.join(ROOT, 'package.json'), 'utf8')) as { version: string };
  return pkg.version;
}

/** Every document of the YAML files of `dir`, files in name order. */
async function documentsOf(dir: string): Promise<ReleaseDocument[]> {
  const out: ReleaseDocument[] = [];
  for (const file of (await readdir(dir)).filter((f) => f.endsWith('.yml')).sort()) {
    for (const doc of parseAllDocuments(await readFile(path.join(dir, file), 'utf8'))) {
      if (doc.errors.length > 0) throw new Error(`parsing ${file}: ${doc.errors[0]?.message}`);
      out.push(doc.toJS() as ReleaseDocument);
    }
  }
  return out;
}

/** The one document of `kind` in `docs`; throws when the forwarder's files and this script disagree. */
function only(docs: readonly ReleaseDocument[], kind: string): ReleaseDocument {
  const found = docs.filter((d) => d.kind === kind);
  if (found.length !== 1) throw new Error(`${FORWARDER_DIR}: expected one ${kind}, found ${found.length}`);
  return found[0]!;
}

/**
 * The forwarder's documents (`infra/forwarder/*.yml`) with the release's inputs in place of the
 * hand edits (module comment).
 *
 * @throws Error when a file cannot be parsed or lacks the Deployment, ConfigMap or ServiceAccount.
 */
export async function forwarderDocuments(inputs: ReleaseInputs): Promise<ReleaseDocument[]> {
  const docs = await documentsOf(FORWARDER_DIR);
  const deployment = only(docs, 'Deployment') as ReleaseDocument & {
    spec: { template: { spec: { containers: Array<{ image: string; envFrom?: unknown[] }> } } };
  };
  for (const c of deployment.spec.template.spec.containers) {
    c.image = `${inputs.imageRepository ?? DEFAULT_FORWARDER_IMAGE_REPOSITORY}:${inputs.version}`;
    c.envFrom = [...(c.envFrom ?? []), { configMapRef: { name: FORWARDER_FLEET_CONFIGMAP } }];
  }
  const config = only(docs, 'ConfigMap') as ReleaseDocument & { data: Record<string, string> };
  config.data = Object.fromEntries(Object.entries(config.data).filter(([k]) => !isFleetSetting(k)));
  const account = only(docs, 'ServiceAccount');
  const { [IRSA_ANNOTATION]: _placeholder, ...annotations } = account.metadata.annotations ?? {};
  if (inputs.forwarderRoleArn) annotations[IRSA_ANNOTATION] = inputs.forwarderRoleArn;
  if (Object.keys(annotations).length > 0) account.metadata.annotations = annotations;
  else delete account.metadata.annotations;
  return docs;
}

/** Kinds in the order a client must create them: what others live in or refer to first. */
const KIND_ORDER = [
  'Namespace',
  'CustomResourceDefinition',
  'ServiceAccount',
  'Secret',
  'ConfigMap',
  'ClusterRole',
  'ClusterRoleBinding',
  'Role',
  'RoleBinding',
  'ValidatingAdmissionPolicy',
  'ValidatingAdmissionPolicyBinding',
  'Deployment',
  'Service',
  'PodDisruptionBudget',
];

/** Rank of a kind in {@link KIND_ORDER}; kinds not listed go last. */
function kindRank(kind: string): number {
  const i = KIND_ORDER.indexOf(kind);
  return i < 0 ? KIND_ORDER.length : i;
}

/** `kind/namespace/name`, the identity two sources may both declare. */
function identity(d: ReleaseDocument): string {
  return `${d.kind}/${d.metadata.namespace ?? ''}/${d.metadata.name}`;
}

/**
 * Every document of the release, deduplicated (a Namespace several sources declare is listed
 * once, their labels merged) and in the release's order.
 *
 * @throws Error when two sources declare the same object other than a Namespace, or a source
 *   cannot be read.
 */
export async function releaseDocuments(inputs: ReleaseInputs): Promise<ReleaseDocument[]> {
  const namespace = (name: string): ReleaseDocument => ({ apiVersion: 'v1', kind: 'Namespace', metadata: { name } });
  const sources: ReleaseDocument[] = [
    namespace(RELEASE_NAMESPACE),
    namespace(DEFAULT_PACKAGING_GLOBAL_NAMESPACE),
    ...(generateCrdDocuments() as unknown as ReleaseDocument[]),
    ...(await forwarderDocuments(inputs)),
    ...((await rbacManifests()) as ReleaseDocument[]),
  ];
  const byId = new Map<string, ReleaseDocument>();
  for (const d of sources) {
    const seen = byId.get(identity(d));
    if (!seen) byId.set(identity(d), structuredClone(d));
    else if (d.kind === 'Namespace') {
      if (d.metadata.labels) seen.metadata.labels = { ...seen.metadata.labels, ...d.metadata.labels };
    } else throw new Error(`two sources declare ${identity(d)}`);
  }
  return inReleaseOrder([...byId.values()]);
}

/** `docs` sorted in the release's order: by kind ({@link KIND_ORDER}), namespace and name. */
function inReleaseOrder(docs: ReleaseDocument[]): ReleaseDocument[] {
  return docs.sort(
    (a, b) =>
      kindRank(a.kind) - kindRank(b.kind) ||
      a.kind.localeCompare(b.kind) ||
      (a.metadata.namespace ?? '').localeCompare(b.metadata.namespace ?? '') ||
      a.metadata.name.localeCompare(b.metadata.name),
  );
}

/** The comment opening a release: its version, where it comes from, how to apply and remove it. */
export function releaseHeader(version: string): string {
  const file = releaseFileName(version);
  return [
    `# kapp-lambda ${version}: CRDs, namespaces, forwarder, RBAC and admission policy of one cluster.`,
    '# Generated by scripts/release.ts (npm run release) from functions/lib/api, infra/forwarder and',
    '# infra/rbac; do not edit.',
    `# Install:   kubectl apply -f ${file}   (or: kapp deploy -a kapp-lambda -f ${file})`,
    `# The forwarder starts once the cluster joins a fleet (ConfigMap ${RELEASE_NAMESPACE}/${FORWARDER_FLEET_CONFIGMAP}).`,
    '# Uninstall: README.md "Install": stop the forwarder first; deleting the CRDs deletes every App.',
    '',
  ].join('\n');
}

/** The release's text: {@link releaseHeader}, then each document, separated by `---`. */
export async function renderRelease(inputs: ReleaseInputs): Promise<string> {
  const docs = await releaseDocuments(inputs);
  return releaseHeader(inputs.version) + docs.map(renderYaml).join('---\n');
}

/** `kapp-lambda-runtime-<version>.yml`: the in-cluster runtime, applied after {@link releaseFileName}'s file. */
export function runtimeReleaseFileName(version: string): string {
  return `kapp-lambda-runtime-${version}.yml`;
}

/** Name of the in-cluster runtime's ServiceAccount, Deployment, Service and PodDisruptionBudget. */
export const RUNTIME_NAME = 'kapp-lambda-runtime';

/** Where the runtime image (`infra/runtime/Containerfile`) is pulled from by default; the tag is the version. */
export const DEFAULT_RUNTIME_IMAGE_REPOSITORY = 'ghcr.io/kapp-lambda/runtime';

/** Port of the runtime's `GET /metrics` (`KAPP_LAMBDA_METRICS_ADDRESS`) and its Service. */
export const RUNTIME_METRICS_PORT = 8080;

/**
 * The tool cache inside the runtime image (`KAPP_LAMBDA_CACHE`): the pinned tools built into it by
 * `infra/runtime/Containerfile`. Read-only in the Pod but for its `keys/` (an emptyDir: the
 * private artifacts' root key is created on first use).
 */
export const RUNTIME_CACHE_DIR = '/opt/kapp-lambda/cache';

/** The runtime Pod's writable scratch (an emptyDir): `TMPDIR` and `HOME`, the object store in `store/`. */
export const RUNTIME_SCRATCH_DIR = '/scratch';

/** A subject of a binding. */
type Subject = { kind: string; name: string; namespace?: string; apiGroup?: string };

/**
 * Whether a binding grants what the in-cluster runtime does: the embedded runtime is the
 * forwarder and every function at once, so it needs every role bound to the forwarder's
 * ServiceAccount or to a function identity's group (`kapp-lambda:<function>`), and no other (the
 * PackageRepository kapp's `kapp-lambda:pkgr` stays that ServiceAccount's: the runtime only mints
 * its token).
 */
function grantsRuntime(binding: ReleaseDocument): boolean {
  const subjects = (binding.subjects ?? []) as Subject[];
  return subjects.some(
    (s) =>
      (s.kind === 'Group' && s.name.startsWith(`${RELEASE_NAMESPACE}:`)) ||
      (s.kind === 'ServiceAccount' && s.name === 'kapp-lambda-forwarder' && s.namespace === RELEASE_NAMESPACE),
  );
}

/**
 * The runtime's bindings: one per binding of the main release that {@link grantsRuntime}, to the
 * same role, with the runtime's ServiceAccount as the only subject, named
 * `kapp-lambda-runtime:<role without its kapp-lambda prefix>`. Derived, never written by hand, so
 * a rule added to a function's role reaches the runtime with the next release.
 */
export function runtimeBindings(mainDocs: readonly ReleaseDocument[]): ReleaseDocument[] {
  return mainDocs
    .filter((d) => (d.kind === 'ClusterRoleBinding' || d.kind === 'RoleBinding') && grantsRuntime(d))
    .map((d) => {
      const roleRef = d.roleRef as { apiGroup: string; kind: string; name: string };
      return {
        apiVersion: d.apiVersion,
        kind: d.kind,
        metadata: {
          name: `${RUNTIME_NAME}:${roleRef.name.replace(/^kapp-lambda[:-]/, '')}`,
          ...(d.metadata.namespace ? { namespace: d.metadata.namespace } : {}),
        },
        roleRef,
        subjects: [{ kind: 'ServiceAccount', name: RUNTIME_NAME, namespace: RELEASE_NAMESPACE }],
      };
    });
}

/** Inputs of the runtime release. */
export interface RuntimeReleaseInputs {
  /** The version (package.json's), in the file name, the header and the image tag. */
  version: string;
  /** Repository of the runtime image. Default {@link DEFAULT_RUNTIME_IMAGE_REPOSITORY}. */
  imageRepository?: string;
}

/**
 * The in-cluster runtime's Deployment: two replicas, one leading per the Lease (the other takes
 * over within ~15 s of a crash, at once on a clean stop), restricted Pod Security (non-root,
 * read-only root filesystem with emptyDirs for scratch and the artifact key, no capabilities,
 * RuntimeDefault seccomp), metrics on {@link RUNTIME_METRICS_PORT}.
 */
function runtimeDeployment(image: string): ReleaseDocument {
  const labels = { 'app.kubernetes.io/name': RUNTIME_NAME };
  return {
    apiVersion: 'apps/v1',
    kind: 'Deployment',
    metadata: { name: RUNTIME_NAME, namespace: RELEASE_NAMESPACE, labels },
    spec: {
      replicas: 2,
      selector: { matchLabels: labels },
      strategy: { type: 'RollingUpdate', rollingUpdate: { maxUnavailable: 1, maxSurge: 1 } },
      template: {
        metadata: {
          labels,
          annotations: {
            'prometheus.io/scrape': 'true',
            'prometheus.io/port': String(RUNTIME_METRICS_PORT),
            'prometheus.io/path': '/metrics',
          },
        },
        spec: {
          serviceAccountName: RUNTIME_NAME,
          // SIGTERM: running stages end, then the Lease is released (scripts/start.ts).
          terminationGracePeriodSeconds: 60,
          securityContext: {
            runAsNonRoot: true,
            runAsUser: 65532,
            runAsGroup: 65532,
            fsGroup: 65532,
            seccompProfile: { type: 'RuntimeDefault' },
          },
          affinity: {
            podAntiAffinity: {
              preferredDuringSchedulingIgnoredDuringExecution: [
                {
                  weight: 100,
                  podAffinityTerm: { topologyKey: 'kubernetes.io/hostname', labelSelector: { matchLabels: labels } },
                },
              ],
            },
          },
          containers: [
            {
              name: 'runtime',
              image,
              imagePullPolicy: 'IfNotPresent',
              env: [
                { name: 'KAPP_LAMBDA_METRICS_ADDRESS', value: `0.0.0.0:${RUNTIME_METRICS_PORT}` },
                { name: 'KAPP_LAMBDA_CACHE', value: RUNTIME_CACHE_DIR },
                { name: 'KAPP_LAMBDA_STORE', value: `${RUNTIME_SCRATCH_DIR}/store` },
                // Directories that exist in the emptyDir as mounted: mkdtemp needs its parent.
                { name: 'TMPDIR', value: RUNTIME_SCRATCH_DIR },
                { name: 'HOME', value: RUNTIME_SCRATCH_DIR },
              ],
              ports: [{ name: 'metrics', containerPort: RUNTIME_METRICS_PORT, protocol: 'TCP' }],
              livenessProbe: { httpGet: { path: '/metrics', port: 'metrics' }, periodSeconds: 20, timeoutSeconds: 5 },
              resources: {
                requests: { cpu: '250m', memory: '512Mi', 'ephemeral-storage': '1Gi' },
                limits: { memory: '2Gi', 'ephemeral-storage': '4Gi' },
              },
              securityContext: {
                allowPrivilegeEscalation: false,
                readOnlyRootFilesystem: true,
                runAsNonRoot: true,
                capabilities: { drop: ['ALL'] },
                seccompProfile: { type: 'RuntimeDefault' },
              },
              volumeMounts: [
                { name: 'scratch', mountPath: RUNTIME_SCRATCH_DIR },
                { name: 'keys', mountPath: `${RUNTIME_CACHE_DIR}/keys` },
              ],
            },
          ],
          volumes: [
            { name: 'scratch', emptyDir: { sizeLimit: '4Gi' } },
            { name: 'keys', emptyDir: { medium: 'Memory', sizeLimit: '1Mi' } },
          ],
        },
      },
    },
  };
}

/**
 * Every document of the in-cluster runtime release, in the release's order: its ServiceAccount,
 * the bindings of {@link runtimeBindings} (to the roles of the main release, which must be
 * applied first), the Deployment, the metrics Service and a PodDisruptionBudget keeping one
 * replica through a drain. A separate file from the main release because a cluster runs either
 * this runtime or the forwarder of a cloud fleet, never both.
 */
export async function runtimeReleaseDocuments(inputs: RuntimeReleaseInputs): Promise<ReleaseDocument[]> {
  const labels = { 'app.kubernetes.io/name': RUNTIME_NAME };
  const main = await releaseDocuments({ version: inputs.version });
  return inReleaseOrder([
    { apiVersion: 'v1', kind: 'ServiceAccount', metadata: { name: RUNTIME_NAME, namespace: RELEASE_NAMESPACE } },
    ...runtimeBindings(main),
    runtimeDeployment(`${inputs.imageRepository ?? DEFAULT_RUNTIME_IMAGE_REPOSITORY}:${inputs.version}`),
    {
      apiVersion: 'v1',
      kind: 'Service',
      metadata: { name: `${RUNTIME_NAME}-metrics`, namespace: RELEASE_NAMESPACE, labels },
      spec: {
        selector: labels,
        ports: [{ name: 'metrics', port: RUNTIME_METRICS_PORT, targetPort: 'metrics', protocol: 'TCP' }],
      },
    },
    {
      apiVersion: 'policy/v1',
      kind: 'PodDisruptionBudget',
      metadata: { name: RUNTIME_NAME, namespace: RELEASE_NAMESPACE, labels },
      spec: { minAvailable: 1, selector: { matchLabels: labels } },
    },
  ]);
}

/** The comment opening the runtime release. */
export function runtimeReleaseHeader(version: string): string {
  return [
    `# kapp-lambda ${version}: the in-cluster runtime (no AWS): ServiceAccount, RBAC, Deployment, metrics Service, PodDisruptionBudget.`,
    '# Generated by scripts/release.ts (npm run release); do not edit.',
    `# Install:   kubectl apply -f ${releaseFileName(version)} && kubectl apply -f ${runtimeReleaseFileName(version)}`,
    '# Not with a fleet: a cluster runs this runtime or the forwarder of a cloud fleet, not both.',
    '',
  ].join('\n');
}

/** The runtime release's text: {@link runtimeReleaseHeader}, then each document. */
export async function renderRuntimeRelease(inputs: RuntimeReleaseInputs): Promise<string> {
  const docs = await runtimeReleaseDocuments(inputs);
  return runtimeReleaseHeader(inputs.version) + docs.map(renderYaml).join('---\n');
}

/**
 * Whether the committed releases of the current version (the main one and the runtime's) are
 * what the sources give now.
 *
 * @returns the path of the first file missing or stale, `undefined` when both are up to date
 */
export async function staleRelease(dir: string = RELEASE_DIR): Promise<string | undefined> {
  const version = await packageVersion();
  for (const [name, render] of [
    [releaseFileName(version), renderRelease],
    [runtimeReleaseFileName(version), renderRuntimeRelease],
  ] as const) {
    const file = path.join(dir, name);
    const current = await readFile(file, 'utf8').catch(() => undefined);
    if (current !== (await render({ version }))) return file;
  }
  return undefined;
}

const USAGE = `usage:
  npm run release                 writes release/kapp-lambda-<version>.yml and
                                  release/kapp-lambda-runtime-<version>.yml (version from package.json)
  npm run release -- --check      exits 1 when either file is missing or stale
  npm run release -- [--image-repository <repo>] [--forwarder-role-arn <arn>] --out <file>
      a release with other inputs (default image repository ${DEFAULT_FORWARDER_IMAGE_REPOSITORY}; no IRSA annotation)
  (-h, --help: this text)
${exitCodesHelp('the committed release is stale (--check), a source cannot be read')}`;

/**
 * Runs the command line.
 *
 * @returns the exit code: 0, 1 when `--check` finds the file stale, 2 for a usage error (other
 *   inputs without `--out`, which would overwrite the committed release)
 */
export async function main(argv: string[]): Promise<number> {
  const err = (t: string) => process.stderr.write(t);
  let v: ReturnType<typeof parseReleaseArgs>['values'];
  try {
    v = parseReleaseArgs(argv).values;
  } catch (e) {
    if (!isUsageError(e)) throw e;
    return usageFailure('release', USAGE, e.message, err);
  }
  if (v.help) {
    process.stdout.write(USAGE);
    return EXIT.ok;
  }
  if (v.check) {
    const stale = await staleRelease();
    if (stale) err(`release: ${path.relative(process.cwd(), stale)} is stale; run npm run release\n`);
    return stale ? EXIT.failure : EXIT.ok;
  }
  const custom = v['image-repository'] !== undefined || v['forwarder-role-arn'] !== undefined;
  if (custom && !v.out) {
    return usageFailure('release', USAGE, 'other inputs need --out (release/ holds the default release)', err);
  }
  const version = await packageVersion();
  const file = v.out ? path.resolve(v.out) : path.join(RELEASE_DIR, releaseFileName(version));
  const text = await renderRelease({
    version,
    ...(v['image-repository'] ? { imageRepository: v['image-repository'] } : {}),
    ...(v['forwarder-role-arn'] ? { forwarderRoleArn: v['forwarder-role-arn'] } : {}),
  });
  const written: Array<[string, string]> = [[file, text]];
  // The runtime release has inputs of its own (its image); a custom main release comes alone.
  if (!v.out) {
    written.push([path.join(RELEASE_DIR, runtimeReleaseFileName(version)), await renderRuntimeRelease({ version })]);
  }
  for (const [f, t] of written) {
    await writeFile(f, t);
    process.stdout.write(`${path.relative(process.cwd(), f)}\n`);
    err(`release ${version}: wrote ${f} (${Math.round(t.length / 1024)} KiB)\n`);
  }
  return EXIT.ok;
}

/** The command line's options (`node:util` `parseArgs`, strict: an unknown option throws). */
function parseReleaseArgs(argv: string[]) {
  return parseArgs({
    args: argv,
    strict: true,
    options: {
      check: { type: 'boolean' },
      'image-repository': { type: 'string' },
      'forwarder-role-arn': { type: 'string' },
      out: { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

runIfEntry(import.meta.filename, 'release', (argv) => main(argv));
