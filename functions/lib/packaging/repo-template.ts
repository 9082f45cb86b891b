/**
 * The fixed PackageRepository template pipeline (kapp-controller §3.12 step 5,
 * `pkg/pkgrepository/app_template.go`). PLACEHOLDER: the real implementation is written on
 * branch s9-tpl; this file only fixes the contract so that `index-repo` can call it.
 */
import type { StageResult } from '../reconcile/result.js';
import type { TemplateRunDeps } from '../template/execute.js';

/** Input of the fixed PackageRepository template pipeline (kapp-controller §3.12 step 5). */
export interface RepoTemplateInput {
  /** The fetched repository root (vendir's directory `0`), which must contain `packages/`. */
  root: string;
  /** PackageRepository name and namespace (the package-repository-ref annotation `<ns>/<name>`). */
  name: string;
  namespace: string;
  /** True when the fetch was an `imgpkgBundle` (then kbld runs with `<root>/.imgpkg/images.yml`). */
  bundle: boolean;
  /** A scratch directory the run may write to (removed by the caller). */
  scratch: string;
  /** Cancels the tools (App/PackageRepository deleted, function deadline). */
  signal?: AbortSignal;
}

/**
 * Result: the status.template part (stdout/stderr/exitCode/error/updatedAt as for Apps) and, on
 * success, the manifest kapp deploys (Package/PackageMetadata documents with the clean-up
 * annotations, plus the rebase-rule kapp Config), and the packages it holds.
 */
export interface RepoTemplateOutput {
  result: StageResult;
  manifest?: string;
  /** Per refName, the versions the repository holds (exact spec.version strings), sorted as semver ascending or as listed. */
  versions?: Record<string, string[]>;
}

/**
 * Templates a fetched repository. Placeholder until s9-tpl lands.
 *
 * @throws Error `templateRepository: not built yet` always.
 */
export async function templateRepository(
  _input: RepoTemplateInput,
  _deps: TemplateRunDeps,
): Promise<RepoTemplateOutput> {
  throw new Error('templateRepository: not built yet');
}
