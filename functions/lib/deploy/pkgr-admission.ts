/**
 * A guard before a PackageRepository's kapp runs (its deploy and delete,
 * `../pipeline/repo/index-repo.ts`): the ValidatingAdmissionPolicy that bounds its identity is
 * installed and enforced.
 *
 * That kapp runs as the ServiceAccount `kapp-lambda-pkgr` of the runtime's namespace, whose RBAC
 * grants ConfigMaps, Packages and PackageMetadatas in every namespace (RBAC cannot name "the
 * repository's namespace"); the ValidatingAdmissionPolicy `kapp-lambda-pkgr` and its binding
 * (`infra/rbac/package-repository-kapp.yml`, in the release) bound its writes to kapp's own
 * records and away from kube-*. Without them, or with a binding that only warns, a kapp a tenant
 * steered could overwrite any ConfigMap of the cluster (kube-system/aws-auth on EKS). So kapp is
 * not run then, and the repository's status says what is missing and how to install it.
 * Upstream has no such identity (kapp runs as the controller), so nothing to mirror.
 *
 * Checked by name (the release's names): the policy exists and fails closed (`failurePolicy`
 * `Fail`, the API's default); the binding exists, binds that policy, denies (`validationActions`
 * holds `Deny`) and does not narrow it (no `matchResources` selector or rule). The policy's rules
 * themselves are not compared with the release's (an admin who edits them owns the result).
 *
 * @module
 */
import { KubeApiError, type KubeObject, type KubeReader } from '../kube/port.js';

/** The name of the policy and of its binding (`infra/rbac/package-repository-kapp.yml`). */
export const PKGR_ADMISSION_POLICY = 'kapp-lambda-pkgr';

/** How long a cluster's answer is kept by {@link PkgrAdmissionCache}, ms (as `kapp-controller-config`'s). */
export const DEFAULT_PKGR_ADMISSION_TTL_MS = 10_000;

const ADMISSION_API_VERSION = 'admissionregistration.k8s.io/v1';

/** The resource of each kind, for the RBAC a 403 asks for. */
const PLURAL = {
  ValidatingAdmissionPolicy: 'validatingadmissionpolicies',
  ValidatingAdmissionPolicyBinding: 'validatingadmissionpolicybindings',
} as const;

/** What the status tells the reader to do. */
const HOW_TO_INSTALL =
  'apply the kapp-lambda release manifest (release/kapp-lambda-<version>.yml, or what `npm run cluster -- add` prints), which holds both; ValidatingAdmissionPolicy needs Kubernetes 1.30 or later';

interface LabelSelector {
  matchLabels?: Record<string, string>;
  matchExpressions?: unknown[];
}

/** The fields of a policy and a binding that decide whether the policy is enforced. */
interface AdmissionObject extends KubeObject {
  spec?: {
    failurePolicy?: string;
    policyName?: string;
    validationActions?: string[];
    matchResources?: {
      namespaceSelector?: LabelSelector;
      objectSelector?: LabelSelector;
      resourceRules?: unknown[];
      excludeResourceRules?: unknown[];
    };
  };
}

/** A selector that selects less than everything (`{}` and an absent one select all). */
function narrows(selector: LabelSelector | undefined): boolean {
  return Object.keys(selector?.matchLabels ?? {}).length > 0 || (selector?.matchExpressions ?? []).length > 0;
}

/** What keeps `binding` from enforcing the policy on every request it matches, each as a phrase. */
function bindingProblems(binding: AdmissionObject): string[] {
  const spec = binding.spec ?? {};
  const problems: string[] = [];
  if (spec.policyName !== PKGR_ADMISSION_POLICY) {
    problems.push(`ValidatingAdmissionPolicyBinding ${PKGR_ADMISSION_POLICY} binds policy '${spec.policyName ?? ''}'`);
  }
  const actions = spec.validationActions ?? [];
  if (!actions.includes('Deny')) {
    problems.push(
      `ValidatingAdmissionPolicyBinding ${PKGR_ADMISSION_POLICY} does not deny (validationActions ${JSON.stringify(actions)})`,
    );
  }
  const m = spec.matchResources;
  if (
    m &&
    (narrows(m.namespaceSelector) ||
      narrows(m.objectSelector) ||
      (m.resourceRules ?? []).length > 0 ||
      (m.excludeResourceRules ?? []).length > 0)
  ) {
    problems.push(
      `ValidatingAdmissionPolicyBinding ${PKGR_ADMISSION_POLICY} narrows what it validates (spec.matchResources)`,
    );
  }
  return problems;
}

/** Reads one of the two objects; `'forbidden'` when this identity may not (a role older than the release's). */
async function readAdmission(
  kube: Pick<KubeReader, 'getObject'>,
  kind: 'ValidatingAdmissionPolicy' | 'ValidatingAdmissionPolicyBinding',
): Promise<AdmissionObject | undefined | 'forbidden'> {
  try {
    return await kube.getObject<AdmissionObject>({
      apiVersion: ADMISSION_API_VERSION,
      kind,
      name: PKGR_ADMISSION_POLICY,
    });
  } catch (err) {
    if (err instanceof KubeApiError && err.statusCode === 403) return 'forbidden';
    throw err;
  }
}

/**
 * Why a PackageRepository's kapp must not run on this cluster, or `undefined` when the policy
 * bounding `kapp-lambda-pkgr` is installed and enforced (see the module comment). Two GETs.
 *
 * @returns the refusal, `kapp-lambda-pkgr, the identity a PackageRepository's kapp runs as, is not
 *   bounded: <what is wrong>; kapp does not run for PackageRepositories until ...: <how to install>`
 * @throws KubeApiError when an object cannot be read for another reason than 403 (retried)
 */
export async function pkgrAdmissionProblem(kube: Pick<KubeReader, 'getObject'>): Promise<string | undefined> {
  const [policy, binding] = await Promise.all([
    readAdmission(kube, 'ValidatingAdmissionPolicy'),
    readAdmission(kube, 'ValidatingAdmissionPolicyBinding'),
  ]);
  const problems: string[] = [];
  for (const [kind, object] of [
    ['ValidatingAdmissionPolicy', policy],
    ['ValidatingAdmissionPolicyBinding', binding],
  ] as const) {
    if (object === 'forbidden') {
      problems.push(
        `${kind} ${PKGR_ADMISSION_POLICY} cannot be read by this runtime (403: its role lacks get on ${PLURAL[kind]})`,
      );
    } else if (object === undefined) {
      problems.push(`${kind} ${PKGR_ADMISSION_POLICY} not found`);
    }
  }
  if (typeof policy === 'object' && policy.spec?.failurePolicy !== undefined && policy.spec.failurePolicy !== 'Fail') {
    problems.push(
      `ValidatingAdmissionPolicy ${PKGR_ADMISSION_POLICY} does not fail closed (failurePolicy ${policy.spec.failurePolicy})`,
    );
  }
  if (typeof binding === 'object') problems.push(...bindingProblems(binding));
  if (problems.length === 0) return undefined;
  return `kapp-lambda-pkgr, the identity a PackageRepository's kapp runs as, is not bounded: ${problems.join('; ')}; kapp does not run for PackageRepositories until the ValidatingAdmissionPolicy ${PKGR_ADMISSION_POLICY} (failurePolicy Fail) and its ValidatingAdmissionPolicyBinding ${PKGR_ADMISSION_POLICY} (validationActions [Deny]) are installed: ${HOW_TO_INSTALL}`;
}

/** Options of {@link PkgrAdmissionCache}. */
export interface PkgrAdmissionCacheOptions {
  /** Life of a cluster's answer, ms. Default {@link DEFAULT_PKGR_ADMISSION_TTL_MS}. */
  ttlMs?: number;
  /** Clock, ms. Default `Date.now`. */
  now?: () => number;
}

/**
 * {@link pkgrAdmissionProblem} per cluster, the answer (either way) kept `ttlMs`, so the API
 * server is not read on every repository run: an admin who installs the policy sees kapp run
 * within that, a policy removed stops kapp within it. Concurrent checks of a cluster share one
 * read; a read that throws is not kept.
 */
export class PkgrAdmissionCache {
  private readonly entries = new Map<string, { problem: string | undefined; readAt: number }>();
  private readonly pending = new Map<string, Promise<string | undefined>>();
  private readonly ttlMs: number;
  private readonly now: () => number;

  constructor(opts: PkgrAdmissionCacheOptions = {}) {
    this.ttlMs = opts.ttlMs ?? DEFAULT_PKGR_ADMISSION_TTL_MS;
    this.now = opts.now ?? Date.now;
  }

  /**
   * The answer for `clusterId`, read through `kube` (that cluster's view) when none is fresh.
   * @throws what {@link pkgrAdmissionProblem} throws
   */
  async check(clusterId: string, kube: Pick<KubeReader, 'getObject'>): Promise<string | undefined> {
    const now = this.now();
    const hit = this.entries.get(clusterId);
    if (hit && now - hit.readAt < this.ttlMs) return hit.problem;
    let p = this.pending.get(clusterId);
    if (!p) {
      p = pkgrAdmissionProblem(kube).then((problem) => {
        this.entries.set(clusterId, { problem, readAt: now });
        return problem;
      });
      const settled = p.finally(() => this.pending.delete(clusterId));
      settled.catch(() => {});
      this.pending.set(clusterId, p);
    }
    return await p;
  }
}
