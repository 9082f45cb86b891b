/**
 * `npm run release`: the versioned install manifest of one cluster, `release/kapp-lambda-<version>.yml`
 * (version from package.json), applied with `kubectl apply -f` or `kapp deploy -a kapp-lambda -f`.
 *
 * ```
 * npm run release                       # writes release/kapp-lambda-<version>.yml, -runtime-<version>.yml and release/package/
 * npm run release -- --check            # exit 1 when a file is not what the sources give now
 * npm run release -- --image-repository <repo> [--forwarder-role-arn <arn>] --out <file>
 * ```
 *
 * Nothing in it is copied: every document is generated from the sources, in one stable order
 * (namespaces, then CRDs, then by kind, namespace and name; keys sorted as `gen:crds` sorts them):
 * - the five CRDs from `functions/lib/api` (`infra/crds/generate.ts`'s generator, not its files);
 * - the namespaces `kapp-lambda` and the global packaging namespace
 *   (`kapp-controller-packaging-global`, upstream's default `-packaging-global-namespace`): a
 *   cluster that does not create it lets any tenant claim it, and with it every cluster's
 *   global Packages (upstream's release creates it too). `kubectl apply` adopts one that exists,
 *   so `npm run cluster -- join` refuses a namespace that existed before and records the uid of
 *   the one created here (`./cluster-join.ts`), which the install function checks before it
 *   trusts the namespace's Packages (`functions/lib/packaging/global-trust.ts`);
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
 *   EKS access entries must not have);
 * - a NetworkPolicy admitting the forwarder's `/metrics` port only from namespaces labelled
 *   {@link METRICS_SCRAPER_LABEL}`=true` ({@link metricsNetworkPolicy}).
 *
 * The CRDs and the global packaging namespace are marked to stay on uninstall
 * ({@link KEEP_ON_UNINSTALL_LABEL}): they hold users' objects, not kapp-lambda's.
 *
 * It also writes the Carvel package of kapp-lambda, `release/package/` ({@link packageFiles}):
 * the same documents but the CRDs and namespaces as an imgpkg bundle with a ytt values schema,
 * and a PackageRepository layout holding its PackageMetadata and Package, so a fleet rolls its
 * forwarder out as one more PackageInstall.
 *
 * The in-cluster runtime (kapp-lambda without AWS: `npm start`'s embedded runtime as a
 * Deployment) is a second file, `release/kapp-lambda-runtime-<version>.yml`
 * ({@link runtimeReleaseDocuments}), applied after this one: its ServiceAccount, bindings derived
 * from the roles above ({@link runtimeBindings}), the Deployment, a metrics Service with its
 * NetworkPolicy, and a PodDisruptionBudget. A second file, not a section, because a cluster runs it or joins a cloud
 * fleet (the forwarder above), never both, and `kubectl apply -f` takes a file whole.
 *
 * `release/` is committed, as `infra/crds/` is: a user installs from a checkout or a raw URL
 * without Node, and `test/unit/release.test.ts` fails when the file is stale.
 *
 * @module
 */
import { mkdir, readdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { parseAllDocuments } from 'yaml';
import { DEFAULT_PACKAGING_GLOBAL_NAMESPACE } from '../functions/lib/api/constants.js';
import { SERVICE_ACCOUNT_DIR } from '../functions/lib/kube/kubeconfig-auth.js';
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

/** The forwarder's Deployment in {@link RELEASE_NAMESPACE}: what a re-join that made a new event key restarts. */
export const FORWARDER_DEPLOYMENT = 'kapp-lambda-forwarder';
/**
 * The ConfigMap (namespace {@link RELEASE_NAMESPACE}) holding the forwarder's settings that name
 * a fleet ({@link isFleetSetting}): not in the release, created when the cluster joins a fleet.
 */
export const FORWARDER_FLEET_CONFIGMAP = 'kapp-lambda-forwarder-fleet';

/**
 * The Secret holding the forwarder's `FORWARDER_EVENT_KEY` (the cluster's event key, the registry
 * document's `eventKey`): written by `npm run cluster -- join` before the fleet ConfigMap, so the
 * forwarder's first start has it; optional in the Deployment (a forwarder without it sends the
 * event ids as deduplication ids, as before).
 */
export const FORWARDER_EVENT_KEY_SECRET = 'kapp-lambda-forwarder-event-key';

/**
 * The label on what an uninstall leaves in place (the CRDs and the global packaging namespace):
 * `kubectl delete -f <release> -l 'kapp-lambda.carvel.dev/uninstall!=keep'` skips them, as
 * `kapp delete -a kapp-lambda` does by their {@link KAPP_DELETE_STRATEGY} annotation. Deleting a
 * CRD deletes every object of its kind (every App, PackageInstall, PackageRepository, Package),
 * and deleting the global namespace every global Package: users' objects, not kapp-lambda's.
 */
export const KEEP_ON_UNINSTALL_LABEL = 'kapp-lambda.carvel.dev/uninstall';

/** kapp's per-object delete strategy annotation; `orphan` leaves the object when its app is deleted. */
export const KAPP_DELETE_STRATEGY = 'kapp.k14s.io/delete-strategy';

/** Whether the release keeps `d` on uninstall ({@link KEEP_ON_UNINSTALL_LABEL}). */
export function keptOnUninstall(d: Pick<ReleaseDocument, 'kind' | 'metadata'>): boolean {
  return (
    d.kind === 'CustomResourceDefinition' ||
    (d.kind === 'Namespace' && d.metadata.name === DEFAULT_PACKAGING_GLOBAL_NAMESPACE)
  );
}

/** `d` marked to stay on uninstall: label {@link KEEP_ON_UNINSTALL_LABEL} `keep`, kapp's `orphan` strategy. */
function markKept(d: ReleaseDocument): ReleaseDocument {
  const { metadata } = d;
  return {
    ...d,
    metadata: {
      ...metadata,
      labels: { ...metadata.labels, [KEEP_ON_UNINSTALL_LABEL]: 'keep' },
      annotations: { ...metadata.annotations, [KAPP_DELETE_STRATEGY]: 'orphan' },
    },
  };
}

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
    c.envFrom = [
      ...(c.envFrom ?? []),
      { configMapRef: { name: FORWARDER_FLEET_CONFIGMAP } },
      { secretRef: { name: FORWARDER_EVENT_KEY_SECRET, optional: true } },
    ];
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

/**
 * Kinds in the order a client must create them (`kubectl apply -f` creates in file order): what
 * others live in or refer to first (Namespaces and CRDs, then the identities and configuration a
 * Pod or binding names, roles before their bindings, the admission policy before its binding,
 * workloads last). The release sorts its documents by this rank; a kind not listed goes last.
 */
export const KIND_ORDER: readonly string[] = [
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
  'Service',
  'NetworkPolicy',
  'Deployment',
  'PodDisruptionBudget',
];

/**
 * The namespace label that admits its Pods (a Prometheus) to kapp-lambda's `/metrics`
 * ({@link metricsNetworkPolicy}): `kubectl label namespace <monitoring> <label>=true`.
 */
export const METRICS_SCRAPER_LABEL = 'kapp-lambda.carvel.dev/metrics-scraper';

/** Port of the forwarder's `/healthz`, `/readyz` and `/metrics` (`infra/forwarder/deployment.yml`). */
export const FORWARDER_METRICS_PORT = 8080;

/**
 * A NetworkPolicy admitting ingress to the Pods labelled `app.kubernetes.io/name: <name>` on
 * `port` only from Pods of namespaces labelled {@link METRICS_SCRAPER_LABEL}`=true`. Their
 * `/metrics` names every App of the cluster, and a scrape is tens of MB at 50,000 objects: any Pod
 * of the cluster could read it or hold the forwarder's few scrape slots. The kubelet's probes come
 * from the node, which the common CNIs admit whatever the policy; a cluster whose CNI enforces no
 * NetworkPolicy ignores it. Deleting it (or a policy of the operator's own admitting more) opens the
 * port again.
 */
export function metricsNetworkPolicy(name: string, port: number): ReleaseDocument {
  const labels = { 'app.kubernetes.io/name': name };
  return {
    apiVersion: 'networking.k8s.io/v1',
    kind: 'NetworkPolicy',
    metadata: { name: `${name}-metrics`, namespace: RELEASE_NAMESPACE, labels },
    spec: {
      podSelector: { matchLabels: labels },
      policyTypes: ['Ingress'],
      ingress: [
        {
          from: [{ namespaceSelector: { matchLabels: { [METRICS_SCRAPER_LABEL]: 'true' } } }],
          ports: [{ protocol: 'TCP', port }],
        },
      ],
    },
  };
}

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
    metricsNetworkPolicy('kapp-lambda-forwarder', FORWARDER_METRICS_PORT),
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
  // The forwarder's folder asks restricted; the release's namespace also holds the in-cluster
  // runtime, which needs baseline (RELEASE_NAMESPACE_POD_SECURITY).
  const own = byId.get(identity(namespace(RELEASE_NAMESPACE))) as ReleaseDocument;
  own.metadata.labels = {
    ...own.metadata.labels,
    'pod-security.kubernetes.io/enforce': RELEASE_NAMESPACE_POD_SECURITY,
    'pod-security.kubernetes.io/audit': 'restricted',
  };
  return inReleaseOrder([...byId.values()].map((d) => (keptOnUninstall(d) ? markKept(d) : d)));
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

/** The generated manifests of a release: the main one, the in-cluster runtime's and the package's config. */
export type ReleaseManifest = 'release' | 'runtime' | 'package';

/**
 * The comment opening a generated manifest: its version and what it holds, where it comes from,
 * and for a file applied by hand how to apply it (and remove the main release), one `# ` line each.
 *
 * @param manifest - which file: the main release (default), {@link runtimeReleaseFileName}'s, or
 *   the package's config ({@link packageFiles}).
 */
export function releaseHeader(version: string, manifest: ReleaseManifest = 'release'): string {
  const generated = 'Generated by scripts/release.ts (npm run release)';
  const file = releaseFileName(version);
  const lines: Record<ReleaseManifest, () => string[]> = {
    release: () => [
      `kapp-lambda ${version}: CRDs, namespaces, forwarder, RBAC and admission policy of one cluster.`,
      `${generated} from functions/lib/api, infra/forwarder and`,
      'infra/rbac; do not edit.',
      `Install:   kubectl apply -f ${file}   (or: kapp deploy -a kapp-lambda -f ${file})`,
      `The forwarder starts once the cluster joins a fleet (ConfigMap ${RELEASE_NAMESPACE}/${FORWARDER_FLEET_CONFIGMAP}).`,
      `Uninstall: kapp delete -a kapp-lambda   (or: kubectl delete -f ${file} -l '${KEEP_ON_UNINSTALL_LABEL}!=keep')`,
      'leaves the CRDs and the global packaging namespace (so every App, PackageInstall, Package and',
      'what they deployed) in place; deleting the CRDs deletes every App: README.md "Uninstall".',
      `Metrics:   scraped only from namespaces labelled ${METRICS_SCRAPER_LABEL}=true (a NetworkPolicy).`,
    ],
    runtime: () => [
      `kapp-lambda ${version}: the in-cluster runtime (no AWS): ServiceAccount, RBAC, Deployment, metrics Service, PodDisruptionBudget.`,
      `${generated}; do not edit.`,
      `Install:   kubectl apply -f ${file} && kubectl apply -f ${runtimeReleaseFileName(version)}`,
      'Not with a fleet: a cluster runs this runtime or the forwarder of a cloud fleet, not both.',
      `Pod Security: baseline in ${RELEASE_NAMESPACE} (the main file's label), not restricted: the runtime runs as root with`,
      `${RUNTIME_CAPABILITIES.join(', ')} only, so each tool run gets a uid of its own and cannot read the`,
      'ServiceAccount token (projected root-only, mode 0400). docs/security.md "Known gaps".',
      `Metrics:   scraped only from namespaces labelled ${METRICS_SCRAPER_LABEL}=true (a NetworkPolicy).`,
    ],
    package: () => [
      `kapp-lambda ${version}, the Carvel package's config: the release without its CRDs and namespaces.`,
      `${generated}; do not edit.`,
    ],
  };
  return lines[manifest]()
    .map((l) => `# ${l}\n`)
    .join('');
}

/** A manifest's text: its {@link releaseHeader}, then each document, separated by `---`. */
export function renderManifest(version: string, manifest: ReleaseManifest, docs: readonly ReleaseDocument[]): string {
  return releaseHeader(version, manifest) + docs.map(renderYaml).join('---\n');
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
 * Whether the committed release of the current version (the manifest and the package) is what
 * the sources give now.
 *
 * @returns the path of the first file missing or stale, `undefined` when all are up to date
 */
export async function staleRelease(dir: string = RELEASE_DIR): Promise<string | undefined> {
  for (const [name, text] of await releaseFiles(await packageVersion())) {
    const file = path.join(dir, name);
    if ((await readFile(file, 'utf8').catch(() => undefined)) !== text) return file;
  }
  return undefined;
}

// ---------------------------------------------------------------- the Carvel package of kapp-lambda

/** The package's refName: kapp-lambda's own PackageMetadata name. */
export const PACKAGE_REF_NAME = 'kapp-lambda.carvel.dev';

/** Where the package's imgpkg bundle is pushed by default (tag: the version). */
export const DEFAULT_PACKAGE_BUNDLE_REPOSITORY = 'ghcr.io/kapp-lambda/package';

/** The package under {@link RELEASE_DIR}: `bundle/` and `repository/`, each an imgpkg bundle (what `imgpkg push -b` pushes). */
export const PACKAGE_DIR = 'package';

/**
 * The release's documents a PackageInstall of kapp-lambda deploys: all but the CRDs and the
 * namespaces. The PackageInstall is itself an object of one of those CRDs, reconciled by the
 * controller they serve, so the package cannot be what brings them, and deleting it (or an
 * upgrade's kapp dropping a document) must never take them away: a CRD's deletion deletes every
 * App of the cluster, the PackageInstall's own App first. The namespaces hold that PackageInstall
 * (when it lives in `kapp-lambda`), `kapp-controller-config` and the global Packages. Both come
 * from the release, applied once when a cluster is set up (they change with kapp-lambda's API,
 * not with each forwarder roll-out).
 */
export function packagedDocuments(docs: readonly ReleaseDocument[]): ReleaseDocument[] {
  return docs.filter((d) => d.kind !== 'CustomResourceDefinition' && d.kind !== 'Namespace');
}

/** One value an operator sets on the PackageInstall: its ytt schema default and its description. */
interface PackageValue {
  readonly path: readonly string[];
  readonly default: string | number;
  readonly description: string;
}

/** The package's values (`config/values-schema.yml` and the Package's `valuesSchema`), in order. */
function packageValues(version: string): PackageValue[] {
  const q = (name: string) =>
    `Queue URL of the fleet's ${name} queue (the forwarder's KAPP_LAMBDA_QUEUE_URL_${name.toUpperCase().replace('-', '_')}).`;
  return [
    {
      path: ['forwarder', 'image'],
      default: `${DEFAULT_FORWARDER_IMAGE_REPOSITORY}:${version}`,
      description: "The forwarder's image (repository:tag or repository@digest).",
    },
    {
      path: ['forwarder', 'replicas'],
      default: 2,
      description: 'Forwarder replicas: one leads (Lease), the others stand by.',
    },
    {
      path: ['forwarder', 'roleArn'],
      default: '',
      description: "IAM role ARN for IRSA on the forwarder's ServiceAccount; empty: none (EKS Pod Identity).",
    },
    {
      path: ['fleet', 'clusterId'],
      default: '',
      description: `The cluster's id in the fleet. Set: the package writes the ConfigMap ${RELEASE_NAMESPACE}/${FORWARDER_FLEET_CONFIGMAP} from the fleet values; empty: joining the fleet writes it.`,
    },
    { path: ['fleet', 'region'], default: '', description: "The fleet's AWS region (the forwarder's AWS_REGION)." },
    { path: ['fleet', 'queueUrls', 'fetch'], default: '', description: q('fetch') },
    { path: ['fleet', 'queueUrls', 'install'], default: '', description: q('install') },
    { path: ['fleet', 'queueUrls', 'indexRepo'], default: '', description: q('index-repo') },
  ];
}

/** The ytt values schema: one `#@schema/desc` per leaf, maps nested as the paths say. */
function valuesSchemaYaml(values: readonly PackageValue[]): string {
  const lines = ['#@data/values-schema', '---'];
  const open: string[] = [];
  for (const v of values) {
    let depth = 0;
    while (depth < open.length && open[depth] === v.path[depth]) depth++;
    open.length = depth;
    for (; depth < v.path.length - 1; depth++) {
      lines.push(`${'  '.repeat(depth)}${v.path[depth]}:`);
      open.push(v.path[depth]!);
    }
    const indent = '  '.repeat(depth);
    lines.push(`${indent}#@schema/desc ${JSON.stringify(v.description)}`);
    lines.push(`${indent}${v.path[depth]}: ${JSON.stringify(v.default)}`);
  }
  return `${lines.join('\n')}\n`;
}

/** The Package's `valuesSchema.openAPIv3`: the same values as the ytt schema, as upstream's `kctrl package release` writes it. */
function valuesOpenApi(values: readonly PackageValue[]): Record<string, unknown> {
  const root: Record<string, unknown> = { type: 'object', additionalProperties: false, properties: {} };
  for (const v of values) {
    let node = root;
    for (const key of v.path.slice(0, -1)) {
      const props = node.properties as Record<string, Record<string, unknown>>;
      props[key] ??= { type: 'object', additionalProperties: false, properties: {} };
      node = props[key]!;
    }
    (node.properties as Record<string, unknown>)[v.path.at(-1)!] = {
      type: typeof v.default === 'number' ? 'integer' : 'string',
      default: v.default,
      description: v.description,
    };
  }
  return root;
}

/**
 * The ytt overlay applying the values to the release's documents (the forwarder's image,
 * replicas and IRSA annotation; {@link KAPP_NO_LABEL_SCOPING} on its Deployment) and the fleet ConfigMap written when `fleet.clusterId` is set,
 * with only the settings given (the release's ConfigMap keeps the others).
 */
function valuesOverlayYaml(): string {
  const fleet: Array<[string, string]> = [
    ['FORWARDER_CLUSTER_ID', 'clusterId'],
    ['AWS_REGION', 'region'],
    ['KAPP_LAMBDA_QUEUE_URL_FETCH', 'queueUrls.fetch'],
    ['KAPP_LAMBDA_QUEUE_URL_INSTALL', 'queueUrls.install'],
    ['KAPP_LAMBDA_QUEUE_URL_INDEX_REPO', 'queueUrls.indexRepo'],
  ];
  return [
    '#! The package values applied to the release (values-schema.yml). Generated by scripts/release.ts; do not edit.',
    '#@ load("@ytt:data", "data")',
    '#@ load("@ytt:overlay", "overlay")',
    `#@overlay/match by=overlay.subset({"kind": "Deployment", "metadata": {"name": "kapp-lambda-forwarder"}})`,
    '---',
    'metadata:',
    '  #@overlay/match missing_ok=True',
    '  annotations:',
    "    #! A Deployment's selector is immutable: without this kapp adds its app label to it, and the",
    '    #! package could not take over the forwarder of a cluster installed with kubectl apply.',
    `    ${KAPP_NO_LABEL_SCOPING}: ""`,
    'spec:',
    '  replicas: #@ data.values.forwarder.replicas',
    '  template:',
    '    spec:',
    '      containers:',
    '      #@overlay/match by="name"',
    '      - name: forwarder',
    '        image: #@ data.values.forwarder.image',
    '#@ if data.values.forwarder.roleArn:',
    `#@overlay/match by=overlay.subset({"kind": "ServiceAccount", "metadata": {"name": "kapp-lambda-forwarder"}})`,
    '---',
    'metadata:',
    '  #@overlay/match missing_ok=True',
    '  annotations:',
    `    ${IRSA_ANNOTATION}: #@ data.values.forwarder.roleArn`,
    '#@ end',
    '#@ if data.values.fleet.clusterId:',
    '---',
    'apiVersion: v1',
    'kind: ConfigMap',
    'metadata:',
    `  name: ${FORWARDER_FLEET_CONFIGMAP}`,
    `  namespace: ${RELEASE_NAMESPACE}`,
    'data:',
    ...fleet.flatMap(([key, value]) => [
      `  #@ if data.values.fleet.${value}:`,
      `  ${key}: #@ data.values.fleet.${value}`,
      '  #@ end',
    ]),
    '#@ end',
    '',
  ].join('\n');
}

/**
 * kapp's annotation that keeps its app label out of a Deployment's (immutable) `spec.selector`:
 * set on the package's forwarder, which takes over the Deployment `kubectl apply -f <release>`
 * created, whose selector has no such label.
 */
const KAPP_NO_LABEL_SCOPING = 'kapp.k14s.io/disable-default-label-scoping-rules';

/** Empty ImagesLock, as imgpkg writes one (`images` omitted when empty). */
const EMPTY_IMAGES_LOCK = '---\napiVersion: imgpkg.carvel.dev/v1alpha1\nkind: ImagesLock\n';

/**
 * An image reference in digest form, as go-containerregistry's `name.NewDigest` takes it
 * (`<repository>[:<tag>]@sha256:<64 hex>`): the only form an imgpkg ImagesLock may hold.
 */
const DIGEST_REFERENCE = /^[^@\s]+@sha256:[0-9a-f]{64}$/;

/**
 * The repository bundle's `.imgpkg/images.yml`. Without it `imgpkg push -b` refuses the directory
 * (imgpkg's `bundle.Contents.validate`: exactly one `.imgpkg/` holding `images.yml`, a direct
 * child of a pushed path), and a PackageRepository fetches the repository as an `imgpkgBundle`.
 * kapp-controller's own repositories list their packages' bundles in it (what
 * `kbld -f packages/ --imgpkg-lock-output .imgpkg/images.yml` writes, each by digest with its
 * `kbld.carvel.dev/id` the reference the Package names): the PackageRepository's kbld step then
 * pins the Package to that digest, and `imgpkg copy` of the repository carries the package's bundle
 * along. An ImagesLock holds only digests (imgpkg's `ImagesLock.Validate`), and a tag's digest is
 * known only once the bundle is pushed: `bundleImage` is listed when it is a digest reference;
 * a tag gives an empty lock (kbld then resolves the tag when the repository reconciles; to pin it,
 * run that kbld command after pushing the package's bundle).
 */
export function repositoryImagesLock(bundleImage: string): string {
  if (!DIGEST_REFERENCE.test(bundleImage)) return EMPTY_IMAGES_LOCK;
  const lock = {
    apiVersion: 'imgpkg.carvel.dev/v1alpha1',
    kind: 'ImagesLock',
    images: [{ image: bundleImage, annotations: { 'kbld.carvel.dev/id': bundleImage } }],
  };
  return `---\n${renderYaml(lock)}`;
}

/**
 * The Package `kapp-lambda.carvel.dev.<version>`: fetch the bundle `bundleImage`, ytt over its
 * `config/`, kapp deploy. No kbld step: the bundle's ImagesLock is empty until the forwarder
 * image is published by digest, and kbld would otherwise resolve the tag over the network.
 */
export function packageDocument(version: string, bundleImage: string): ReleaseDocument {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'Package',
    metadata: { name: `${PACKAGE_REF_NAME}.${version}` },
    spec: {
      refName: PACKAGE_REF_NAME,
      version,
      releaseNotes: `kapp-lambda ${version}: CHANGELOG.md`,
      valuesSchema: { openAPIv3: valuesOpenApi(packageValues(version)) },
      template: {
        spec: {
          fetch: [{ imgpkgBundle: { image: bundleImage } }],
          template: [{ ytt: { paths: ['config/'] } }],
          deploy: [{ kapp: {} }],
        },
      },
    },
  };
}

/** The PackageMetadata of {@link PACKAGE_REF_NAME}. */
export function packageMetadataDocument(): ReleaseDocument {
  return {
    apiVersion: 'data.packaging.carvel.dev/v1alpha1',
    kind: 'PackageMetadata',
    metadata: { name: PACKAGE_REF_NAME },
    spec: {
      displayName: 'kapp-lambda',
      shortDescription: "kapp-lambda's forwarder and RBAC of one cluster of a fleet",
      longDescription:
        "The forwarder Deployment, the RBAC of the functions' identities and of a PackageRepository's kapp, and the admission policy bounding it: the release of kapp-lambda without its CRDs and namespaces, which the release installs once per cluster.",
      providerName: 'kapp-lambda',
      categories: ['package management', 'continuous delivery'],
    },
  };
}

/**
 * The package's files, path under {@link RELEASE_DIR} → content:
 * - `package/bundle/config/kapp-lambda.yml` ({@link packagedDocuments}), `values-schema.yml`,
 *   `values.yml` (the overlay) and `.imgpkg/images.yml` (empty: see {@link packageDocument}):
 *   `imgpkg push -b <repository>:<version> -f release/package/bundle`;
 * - `package/repository/packages/kapp-lambda.carvel.dev/{metadata.yml,<version>.yml}`, a
 *   PackageRepository's layout whose Package names `bundleImage` (default
 *   `{@link DEFAULT_PACKAGE_BUNDLE_REPOSITORY}:<version>`), and its
 *   `package/repository/.imgpkg/images.yml` ({@link repositoryImagesLock}), so the repository is
 *   an imgpkg bundle too: `imgpkg push -b <repository>:<version> -f release/package/repository`.
 *
 * @param main - the main release's documents when already computed ({@link releaseFiles});
 *   default: {@link releaseDocuments} of `version`.
 */
export async function packageFiles(
  version: string,
  bundleImage = `${DEFAULT_PACKAGE_BUNDLE_REPOSITORY}:${version}`,
  main?: readonly ReleaseDocument[],
): Promise<Map<string, string>> {
  const docs = packagedDocuments(main ?? (await releaseDocuments({ version })));
  const bundle = `${PACKAGE_DIR}/bundle`;
  const packages = `${PACKAGE_DIR}/repository/packages/${PACKAGE_REF_NAME}`;
  const values = packageValues(version);
  return new Map([
    [`${bundle}/.imgpkg/images.yml`, EMPTY_IMAGES_LOCK],
    [`${bundle}/config/kapp-lambda.yml`, renderManifest(version, 'package', docs)],
    [`${bundle}/config/values-schema.yml`, valuesSchemaYaml(values)],
    [`${bundle}/config/values.yml`, valuesOverlayYaml()],
    [`${PACKAGE_DIR}/repository/.imgpkg/images.yml`, repositoryImagesLock(bundleImage)],
    [`${packages}/metadata.yml`, renderYaml(packageMetadataDocument())],
    [`${packages}/${version}.yml`, renderYaml(packageDocument(version, bundleImage))],
  ]);
}

/** Every file `npm run release` writes, path under {@link RELEASE_DIR} → content. */
export async function releaseFiles(version: string): Promise<Map<string, string>> {
  const main = await releaseDocuments({ version });
  return new Map([
    [releaseFileName(version), renderManifest(version, 'release', main)],
    [runtimeReleaseFileName(version), renderManifest(version, 'runtime', runtimeReleaseDocuments({ version }, main))],
    ...(await packageFiles(version, undefined, main)),
  ]);
}

// ---------------------------------------------------------------- the in-cluster runtime

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
 * The capabilities the in-cluster runtime keeps (all others dropped) so that each tool run gets
 * a uid of its own from the pool (`functions/lib/exec/sandbox.ts`), as `npm start` does as root:
 * SETUID and SETGID to spawn a run under its uid (libuv's setgroups, setgid, setuid), CHOWN to
 * hand the run its directories (`handOver`), DAC_OVERRIDE and FOWNER to read what a run wrote,
 * change its modes and remove its directories (0700, owned by the run's uid), KILL to end a run's
 * process group and what it left behind under its uid (`uid-leases.ts`). Each is one the
 * baseline Pod Security Standard admits; none lets a tool (which runs with none of them) read the
 * root-only token.
 */
export const RUNTIME_CAPABILITIES: readonly string[] = ['CHOWN', 'DAC_OVERRIDE', 'FOWNER', 'KILL', 'SETGID', 'SETUID'];

/**
 * The Pod Security level the `kapp-lambda` namespace enforces in the release: baseline, as the
 * in-cluster runtime runs as root with the capabilities of {@link RUNTIME_CAPABILITIES}, which
 * restricted refuses (a uid per tool run needs root). The forwarder itself meets restricted, and
 * the namespace audits at that level (the API server's audit log names what would not).
 */
export const RELEASE_NAMESPACE_POD_SECURITY = 'baseline';

/**
 * The in-cluster runtime's Deployment: two replicas, one leading per the Lease (the other takes
 * over within ~15 s of a crash, at once on a clean stop), metrics on {@link RUNTIME_METRICS_PORT}.
 * It runs as root with only {@link RUNTIME_CAPABILITIES}, no privilege escalation, a read-only
 * root filesystem (emptyDirs for scratch and the artifact key) and RuntimeDefault seccomp, so
 * tool runs get uids of their own: the tools of tenants' Apps (helm, ytt, kapp, vendir …) then
 * cannot read the runtime's token (a cluster-admin equivalent), its artifact key or another run's
 * files. The token is not automounted: a projected volume of the same token, CA and namespace
 * with mode 0400, root's alone (the automount's files are 0644, readable by every uid).
 * Baseline Pod Security ({@link RELEASE_NAMESPACE_POD_SECURITY}), not restricted.
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
          // The token comes from the projected volume below (0400), never the automount (0644).
          automountServiceAccountToken: false,
          // SIGTERM: running stages end, then the Lease is released (scripts/start.ts).
          terminationGracePeriodSeconds: 60,
          // Root, so each tool run gets a uid of its own (no fsGroup: the token stays root's).
          securityContext: {
            runAsNonRoot: false,
            runAsUser: 0,
            runAsGroup: 0,
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
                runAsNonRoot: false,
                capabilities: { drop: ['ALL'], add: [...RUNTIME_CAPABILITIES] },
                seccompProfile: { type: 'RuntimeDefault' },
              },
              volumeMounts: [
                { name: 'scratch', mountPath: RUNTIME_SCRATCH_DIR },
                { name: 'keys', mountPath: `${RUNTIME_CACHE_DIR}/keys` },
                { name: 'service-account', mountPath: SERVICE_ACCOUNT_DIR, readOnly: true },
              ],
            },
          ],
          volumes: [
            { name: 'scratch', emptyDir: { sizeLimit: '4Gi' } },
            { name: 'keys', emptyDir: { medium: 'Memory', sizeLimit: '1Mi' } },
            {
              // What the automount gives (kubelet rotates the token; start.ts re-reads it every
              // 60 s), root-only.
              name: 'service-account',
              projected: {
                defaultMode: 0o400,
                sources: [
                  { serviceAccountToken: { path: 'token', expirationSeconds: 3607 } },
                  { configMap: { name: 'kube-root-ca.crt', items: [{ key: 'ca.crt', path: 'ca.crt' }] } },
                  {
                    downwardAPI: {
                      items: [{ path: 'namespace', fieldRef: { apiVersion: 'v1', fieldPath: 'metadata.namespace' } }],
                    },
                  },
                ],
              },
            },
          ],
        },
      },
    },
  };
}

/**
 * Every document of the in-cluster runtime release, in the release's order: its ServiceAccount,
 * the bindings of {@link runtimeBindings} (to the roles of the main release, which must be
 * applied first), the Deployment, the metrics Service, its NetworkPolicy
 * ({@link metricsNetworkPolicy}) and a PodDisruptionBudget keeping one replica through a drain. A separate file from the main release because a cluster runs either
 * this runtime or the forwarder of a cloud fleet, never both.
 *
 * @param main - the main release's documents ({@link releaseDocuments}), whose roles it binds:
 *   computed once by {@link releaseFiles} for every file.
 */
export function runtimeReleaseDocuments(
  inputs: RuntimeReleaseInputs,
  main: readonly ReleaseDocument[],
): ReleaseDocument[] {
  const labels = { 'app.kubernetes.io/name': RUNTIME_NAME };
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
    metricsNetworkPolicy(RUNTIME_NAME, RUNTIME_METRICS_PORT),
    {
      apiVersion: 'policy/v1',
      kind: 'PodDisruptionBudget',
      metadata: { name: RUNTIME_NAME, namespace: RELEASE_NAMESPACE, labels },
      spec: { minAvailable: 1, selector: { matchLabels: labels } },
    },
  ]);
}

const USAGE = `usage:
  npm run release                 writes release/kapp-lambda-<version>.yml, the in-cluster runtime
                                  release/kapp-lambda-runtime-<version>.yml (version from package.json)
                                  and the Carvel package of kapp-lambda, release/package/
  npm run release -- --check      exits 1 when one of those files is missing or stale
  npm run release -- [--image-repository <repo>] [--forwarder-role-arn <arn>] --out <file>
      a release with other inputs (default image repository ${DEFAULT_FORWARDER_IMAGE_REPOSITORY}; no IRSA annotation)
  npm run release -- --package-bundle <registry>/<repo>:<tag> --out-dir <dir>
      kapp-lambda's package under <dir>/package/ with its Package naming that bundle (where you push
      <dir>/package/bundle), so the repository needs no edit (default ${DEFAULT_PACKAGE_BUNDLE_REPOSITORY}:<version>)
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
  if (v['package-bundle'] !== undefined || v['out-dir'] !== undefined) {
    if (!v['package-bundle'] || !v['out-dir'] || v.out) {
      return usageFailure('release', USAGE, '--package-bundle and --out-dir go together (and without --out)', err);
    }
    const version = await packageVersion();
    const dir = path.resolve(v['out-dir']);
    for (const [name, text] of await packageFiles(version, v['package-bundle'])) {
      const file = path.join(dir, name);
      await mkdir(path.dirname(file), { recursive: true });
      await writeFile(file, text);
      process.stdout.write(`${file}\n`);
    }
    err(`release ${version}: wrote the package to ${path.join(dir, PACKAGE_DIR)} (bundle ${v['package-bundle']})\n`);
    return EXIT.ok;
  }
  const custom = v['image-repository'] !== undefined || v['forwarder-role-arn'] !== undefined;
  if (custom && !v.out) {
    return usageFailure('release', USAGE, 'other inputs need --out (release/ holds the default release)', err);
  }
  const version = await packageVersion();
  if (!v.out) {
    for (const [name, text] of await releaseFiles(version)) {
      const file = path.join(RELEASE_DIR, name);
      await mkdir(path.dirname(file), { recursive: true });
      await writeFile(file, text);
      process.stdout.write(`${path.relative(process.cwd(), file)}\n`);
    }
    err(`release ${version}: wrote ${RELEASE_DIR} (the manifest, the in-cluster runtime and the package)\n`);
    return EXIT.ok;
  }
  const file = path.resolve(v.out);
  const docs = await releaseDocuments({
    version,
    ...(v['image-repository'] ? { imageRepository: v['image-repository'] } : {}),
    ...(v['forwarder-role-arn'] ? { forwarderRoleArn: v['forwarder-role-arn'] } : {}),
  });
  const text = renderManifest(version, 'release', docs);
  await writeFile(file, text);
  process.stdout.write(`${path.relative(process.cwd(), file)}\n`);
  err(`release ${version}: wrote ${file} (${Math.round(text.length / 1024)} KiB)\n`);
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
      'package-bundle': { type: 'string' },
      'out-dir': { type: 'string' },
      help: { type: 'boolean', short: 'h' },
    },
  });
}

runIfEntry(import.meta.filename, 'release', (argv) => main(argv));
