/**
 * The fixed template pipeline of a PackageRepository (kapp-controller
 * `pkg/pkgrepository/app_template.go`, reference §3.12 step 5):
 *
 * 1. `<root>/packages` must exist and be a directory ({@link INVALID_PACKAGE_REPOSITORY_MESSAGE});
 * 2. `ytt --ignore-unknown-comments -f <root>/packages`;
 * 3. ytt with the clean-up overlay ({@link CLEAN_UP_OVERLAY}) over that stream: only Packages
 *    and PackageMetadatas are kept, `metadata.namespace` is removed, the four annotations added;
 * 4. `FilterResources` ({@link filterRepositoryResources}, {@link filterRepositoryJson}): each
 *    document decoded with the Package/PackageMetadata schemas (unknown fields dropped) and
 *    re-encoded (as JSON, one line each); any other kind is an error. kapp-lambda also encodes
 *    each Package's name for its CRD storage (`packageObjectName`);
 * 5. the kapp `Config` whose rebase rules resolve conflicts between repositories
 *    ({@link REBASE_CONFIG}) is added to the stream;
 * 6. for an `imgpkgBundle` fetch, `kbld -f - -f <root>/.imgpkg/images.yml --build=false`;
 * 7. kapp-lambda's last check ({@link unexpectedRenderedDocument}): only Packages and
 *    PackageMetadatas without a namespace, plus the one Config. kbld's output is parsed for it;
 *    without kbld the documents of step 4 are checked as decoded, sparing a YAML parse of the
 *    whole stream.
 *
 * **How the tools run (same output as upstream's three ytt runs, fewer processes).** Steps 2
 * and 3 run as one ytt (`-f <root>/packages -f <clean-up overlay> -f <JSON check> -o json`): ytt
 * applies overlay files after every template, in the order given, so the clean-up overlay
 * meets exactly the documents upstream's first ytt prints, after the repository's own overlays.
 * The overlay names the repository in its text (`<ns>/<name>`, quoted, as upstream formats it
 * in) rather than by data value, so the repository's own data values meet nothing of ours. The
 * JSON output is parsed in a fraction of a YAML parse's time (seconds for 500 Packages). Any
 * run that does not end in filtered documents (a tool error, a filter error, a value JSON
 * cannot hold: ytt's JSON printer would drop such a document silently, so the check overlay
 * {@link JSON_CHECK_OVERLAY} fails the run instead) goes again the way upstream does, ytt over
 * `packages/` then the clean-up ytt (printing JSON where it can, else YAML), so every error and
 * its stderr are upstream's. Step 5 is done here, not by upstream's third ytt: that ytt reads the
 * filtered documents as plain YAML beside the constant Config and prints both unchanged, so
 * appending the Config gives kapp the same documents.
 *
 * The tools run through `runTemplateSteps` (`../template/execute.ts`), exactly as an App's
 * template steps: the one command runner, the scratch directory as the only writable place,
 * the tool timeout, the output bound and the cancel signal.
 *
 * A hardening that does not change the output: the stream the clean-up ytt re-reads on the
 * upstream way (the previous ytt output) is marked `type=yaml-plain`, so no text in a package can
 * ever be evaluated as a template.
 *
 * @module
 */
import { lstat, readFile, stat } from 'node:fs/promises';
import path from 'node:path';
import { parseAllDocuments } from 'yaml';
import { PackageNameError, packageObjectName, STRICT_SEMVER_REGEX } from '../api/datapackaging.js';
import { parsePackage, parsePackageMetadata } from '../api/parse.js';
import { PackageMetadataResource, PackageResource } from '../api/resources.js';
import { errorMessage, resultFromError, type StageResult } from '../reconcile/result.js';
import { runTemplateSteps, type TemplateRunDeps } from '../template/execute.js';
import { type RunStep, TEMPLATING_DIR_ERROR_PREFIX } from '../template/step.js';
import { compare, parseVersion } from './semver.js';

/** Input of the fixed PackageRepository template pipeline (kapp-controller §3.12 step 5). */
export interface RepoTemplateInput {
  /**
   * The fetched repository root (vendir's directory `0`), which must contain `packages/`. It must
   * lie inside `scratch`: with uid isolation the tools can reach only the scratch handed to them.
   */
  root: string;
  /** PackageRepository name and namespace (the package-repository-ref annotation `<ns>/<name>`). */
  name: string;
  namespace: string;
  /** True when the fetch was an `imgpkgBundle` (then kbld runs with `<root>/.imgpkg/images.yml`). */
  bundle: boolean;
  /**
   * A scratch directory the run may write to (removed by the caller). Handed to the tools' uid,
   * so its parents must be traversable: a stage scratch (`makeScratch`), not a directory inside one.
   */
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

/** Upstream's error when the fetched content has no `packages/` directory (`errInvalidPackageRepo`). */
export const INVALID_PACKAGE_REPOSITORY_MESSAGE =
  "Invalid package repository content: must contain 'packages/' directory but did not";

/** `<namespace>/<name>` of a repository: both parts are DNS names the API server validated. */
const REPOSITORY_REF = /^[a-z0-9]([-a-z0-9.]*[a-z0-9])?\/[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;

/**
 * Upstream's `kapp-controller-clean-up.yml` (`yttTemplateCleanRs`) for the repository `ref`
 * (`<namespace>/<name>`), formatted into the text as upstream does, but quoted.
 *
 * @throws {Error} when `ref` is not two DNS names (never for an object the API server holds)
 */
export function cleanUpOverlay(ref: string): string {
  if (!REPOSITORY_REF.test(ref))
    throw new Error(`not a <namespace>/<name> of a PackageRepository: ${JSON.stringify(ref)}`);
  return `
#@ load("@ytt:overlay", "overlay")

#@ pkg = overlay.subset({"apiVersion":"data.packaging.carvel.dev/v1alpha1", "kind": "Package"})
#@ pkgm = overlay.subset({"apiVersion":"data.packaging.carvel.dev/v1alpha1", "kind": "PackageMetadata"})

#@overlay/match by=overlay.not_op(overlay.or_op(pkg, pkgm)),expects="0+"
#@overlay/remove
---

#@overlay/match by=overlay.all,expects="0+"
---
metadata:
  #! Ensure that all resources do not set some random namespace
  #! so that all resource end in the PackageRepository's namespace
  #@overlay/match missing_ok=True
  #@overlay/remove
  namespace:

  #@overlay/match missing_ok=True
  annotations:
    #@overlay/match missing_ok=True
    kapp.k14s.io/disable-original: ""

    #@overlay/match missing_ok=True
    kapp.k14s.io/disable-wait: ""

    #@overlay/match missing_ok=True
    packaging.carvel.dev/package-repository-ref: ${JSON.stringify(ref)}

    #@overlay/match missing_ok=True
    kapp.k14s.io/create-strategy: "fallback-on-update-or-noop"`;
}

/** {@link cleanUpOverlay} of a placeholder repository: the text the repository index hashes. */
export const CLEAN_UP_OVERLAY = cleanUpOverlay('namespace/name');

/**
 * Fails the one-pass ytt run (see the module comment) when a document it would print holds a
 * value JSON cannot (`.inf`, `.nan`, a map key that is not a string): ytt's JSON printer would
 * leave such a document out, silently and with exit code 0. Applied last, to the documents the
 * clean-up overlay kept; it matches nothing, so it changes no document.
 */
export const JSON_CHECK_OVERLAY = `
#@ load("@ytt:overlay", "overlay")
#@ load("@ytt:json", "json")

#@ def printable_as_json(index, left, right):
#@   json.encode(left)
#@   return False
#@ end

#@overlay/match by=printable_as_json,expects="0+"
---
`;

/**
 * Upstream's `yttRebasePackageRelatedRsByRevision` (`yttTemplateAddIdenticalRsRebase`), verbatim:
 * the ytt overlay kapp applies to an existing Package or PackageMetadata owned by another
 * repository (identical → noop, higher `packaging.carvel.dev/revision` wins, else
 * `Conflicting resources`; reference §3.12 "Conflict resolution").
 */
const REBASE_OVERLAY = `
        #@ load("@ytt:data", "data")
        #@ load("@ytt:json", "json")
        #@ load("@ytt:overlay", "overlay")
        #@ load("@ytt:struct", "struct")

        #@ def get_rev(annotations):
        #@   if hasattr(annotations, "packaging.carvel.dev/revision"):
        #@     return [int(x) for x in annotations["packaging.carvel.dev/revision"].split('.')]
        #@   else:
        #@     return [-1]
        #@   end
        #@ end

        #! return 0 iff eq, 1 (or more) iff r1 > r2, -1 (or less) iff r1 < r2
        #@ def cmp_rev(r1, r2):
        #@   size = min(len(r1), len(r2))
        #@   for i in range(size):
        #@     if r1[i] > r2[i]:
        #@        return 1
        #@     elif r1[i] < r2[i]:
        #@        return -1
        #@     end
        #@   end
        #@   return len(r1) - len(r2)
        #@ end

        #@ def filter(kvs, exclude_keys):
        #@   return {k: v for k, v in kvs.items() if not k in exclude_keys}
        #@ end

        #! TODO: next person who adds an annotation to the set of all kapp-controller annotations is gonna have a bad time.
        #@ def annotations_are_identical(existing_anns, new_anns):
        #@   carvel_anns = set(["kapp.k14s.io/disable-original",
        #@                      "kapp.k14s.io/disable-wait",
        #@                      "packaging.carvel.dev/package-repository-ref",
        #@                      "kapp.k14s.io/identity",
        #@                      "kapp.k14s.io/create-strategy"])
        #@   return filter(existing_anns, carvel_anns) == filter(new_anns, carvel_anns)
        #@ end

        #@ def labels_are_identical(existing_labels, new_labels):
        #@   carvel_labels = set(["kapp.k14s.io/app", "kapp.k14s.io/association"])
        #@   return filter(existing_labels, carvel_labels) == filter(new_labels, carvel_labels)
        #@ end

        #@ def specs_are_identical(existing_spec, new_spec):
        #@   if json.encode(new_spec) == json.encode(existing_spec):
        #@     return True, ""
        #@   end
        #@
        #@   # the rest of this method is to help make a better error message
        #@   ex = existing_spec
        #@   nw = new_spec
        #@
        #@   for attr in nw.keys():
        #@     if not attr in ex:
        #@       return False, "adding spec."+attr
        #@     end
        #@   end
        #@
        #@   for attr in ex.keys():
        #@     if not attr in nw:
        #@       return False, "missing spec." + attr
        #@     end
        #@     if str(nw[attr]) != str(ex[attr]):
        #@       return False, "mismatch in spec." + attr
        #@     end
        #@   end
        #@   return False, "mismatch in unknown location"
        #@ end

        #@ def is_identical(existing, new):
        #@   eq, reason = specs_are_identical(struct.decode(existing.spec), struct.decode(new.spec))
        #@   if not eq:
        #@     return False, reason
        #@   end
        #@   if not labels_are_identical(struct.decode(existing.metadata.labels), struct.decode(new.metadata.labels)):
        #@     return False, "mismatch in metadata.labels"
        #@   end
        #@   if not annotations_are_identical(struct.decode(existing.metadata.annotations), struct.decode(new.metadata.annotations)):
        #@     return False, "mismatch in metadata.annotations"
        #@   end
        #@   return True, ""
        #@ end

        #! if the pkgr-ref annotation is missing (and the packages are identical)
        #! then assume ownership - covers upgrade case from old kcs

        #@ pkg_repo_ann = "packaging.carvel.dev/package-repository-ref"
        #@ new_owner = data.values.new.metadata.annotations[pkg_repo_ann]
        #@
        #@ existing_owner = new_owner
        #@
        #@ if hasattr(data.values.existing.metadata, "annotations"):
        #@   if pkg_repo_ann in data.values.existing.metadata.annotations:
        #@     existing_owner = data.values.existing.metadata.annotations[pkg_repo_ann]
        #@   end
        #@ end
        #@
        #@ if new_owner != existing_owner:
        #@   identical, reason = is_identical(data.values.existing, data.values.new)
        #@   if identical:

        #@overlay/match by=overlay.all
        ---
        metadata:
          #@overlay/match missing_ok=True
          annotations:
            #@overlay/match missing_ok=True
            kapp.k14s.io/noop: ""

        #@ elif cmp_rev(get_rev(data.values.existing.metadata.annotations), get_rev(data.values.new.metadata.annotations)) > 0:

        #@overlay/match by=overlay.all
        ---
        metadata:
          #@overlay/match missing_ok=True
          annotations:
            #@overlay/match missing_ok=True
            kapp.k14s.io/noop: ""

        #@   elif cmp_rev(get_rev(data.values.existing.metadata.annotations), get_rev(data.values.new.metadata.annotations)) < 0:
        #@     # replacing existing older rev with newer rev
        #@   else:
        #@     fail("Error: Conflicting resources: " + data.values.existing.kind + "/" + data.values.existing.metadata.name + " is already present but not identical (" + reason +")")
        #@   end
        #@ end
`;

/**
 * Upstream's `noop-on-identical-packages.yml`, verbatim: the kapp `Config` carrying
 * {@link REBASE_OVERLAY} as a rebase rule (ytt overlay contract v1) for every Package and
 * PackageMetadata. Plain YAML for ytt (the overlay is a block string kapp evaluates later).
 */
export const REBASE_CONFIG = `
---
apiVersion: kapp.k14s.io/v1alpha1
kind: Config
rebaseRules:
- ytt:
    overlayContractV1:
      overlay.yml: |
${REBASE_OVERLAY}
  resourceMatchers:
  - apiVersionKindMatcher: {apiVersion: data.packaging.carvel.dev/v1alpha1, kind: Package}
  - apiVersionKindMatcher: {apiVersion: data.packaging.carvel.dev/v1alpha1, kind: PackageMetadata}
`;

/** The package documents of a repository after {@link filterRepositoryResources}. */
export interface FilteredResources {
  /** The re-encoded documents, separated by `---`. */
  manifest: string;
  /** Per refName, its Packages' `spec.version`s ({@link sortVersions}). */
  versions: Record<string, string[]>;
}

const [PACKAGING_GROUP, PACKAGING_VERSION] = PackageResource.apiVersion.split('/') as [string, string];

/**
 * Upstream's `FilterResources` plus kapp-lambda's name encoding: decodes each document of the
 * cleaned-up stream as a Package or PackageMetadata (unknown fields dropped, as Go's decode and
 * re-encode does, so newer repository fields do not break the rebase rule's identity check) and
 * re-encodes it. A Package whose `metadata.name` is `<refName>.<version>` is renamed to
 * {@link packageObjectName} (its `+` written `--`); a Package named otherwise keeps its name, so
 * the API server refuses it with upstream's `must be <spec.refName> + '.' + <spec.version>`.
 * Empty documents are skipped.
 *
 * @param stream - the clean-up overlay's output (multi-document YAML)
 * @returns the manifest and the versions per refName
 * @throws {Error} with upstream's texts: `Parsing stream of resources: ...`,
 *   `Expected group 'data.packaging.carvel.dev' but was '<g>'`, `Expected version 'v1alpha1' but
 *   was '<v>'`, `Expected kind to be 'Package' or 'PackageMetadata' but was '<k>'`,
 *   `Deserializing resource: <schema error>`; and `Encoding name of Package '<name>': <reason>`
 *   for a version no CRD object name can hold (uppercase letters, `--`, `-+`, `+-`)
 */
export function filterRepositoryResources(stream: string): FilteredResources {
  const { manifest, versions } = filterDecoded(yamlStreamValues(stream));
  return { manifest, versions };
}

/** The documents of a YAML stream, or `Parsing stream of resources: ...` thrown. */
function yamlStreamValues(stream: string): unknown[] {
  const values: unknown[] = [];
  for (const doc of parseAllDocuments(stream)) {
    if (doc.errors.length > 0) throw new Error(`Parsing stream of resources: ${doc.errors[0]?.message}`);
    values.push(doc.toJS());
  }
  return values;
}

/**
 * {@link filterRepositoryResources} over ytt's `-o json` output: one JSON object per document,
 * concatenated without separators (ytt prints no document that is empty). Parsing that with
 * `JSON.parse` takes a small fraction of the time a YAML parse of the same stream takes (500
 * Packages: ~1.5 MB).
 *
 * @param stream - concatenated JSON objects or arrays
 * @returns as {@link filterRepositoryResources}; `undefined` when the stream is not such a
 *   sequence (a top-level scalar), so the caller falls back to the YAML stream
 * @throws {Error} as {@link filterRepositoryResources}, except `Parsing stream of resources`
 */
export function filterRepositoryJson(stream: string): FilteredResources | undefined {
  const values = splitJsonValues(stream);
  if (!values) return undefined;
  const { manifest, versions } = filterDecoded(values);
  return { manifest, versions };
}

/**
 * Splits concatenated top-level JSON objects/arrays (`{..}{..}[..]`) and parses each.
 *
 * @returns the values, or `undefined` when a top-level value is not an object or array or the
 *   stream does not parse
 */
function splitJsonValues(stream: string): unknown[] | undefined {
  const values: unknown[] = [];
  let depth = 0;
  let start = 0;
  let inString = false;
  for (let i = 0; i < stream.length; i++) {
    const c = stream.charCodeAt(i);
    if (inString) {
      if (c === 0x5c)
        i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22 && depth > 0) inString = true;
    else if (c === 0x7b || c === 0x5b) {
      if (depth++ === 0) start = i;
    } else if (c === 0x7d || c === 0x5d) {
      if (--depth === 0) {
        try {
          values.push(JSON.parse(stream.slice(start, i + 1)));
        } catch {
          return undefined;
        }
      }
    } else if (depth === 0 && c !== 0x0a && c !== 0x20 && c !== 0x0d && c !== 0x09) return undefined;
  }
  return depth === 0 && !inString ? values : undefined;
}

/**
 * The checks and re-encoding of {@link filterRepositoryResources} over decoded documents. Each
 * document is written as one line of JSON (valid YAML, read by the next ytt as plain YAML):
 * every string stays quoted, so none can be re-read as another type (a YAML emitter writes `yes`
 * unquoted, which ytt reads as a boolean).
 */
function filterDecoded(values: readonly unknown[]): FilteredResources & { documents: unknown[] } {
  const out: string[] = [];
  const documents: unknown[] = [];
  const versions: Record<string, string[]> = {};
  for (const value of values) {
    if (value === null || value === undefined) continue;
    const { apiVersion, kind } = (typeof value === 'object' ? value : {}) as { apiVersion?: unknown; kind?: unknown };
    const [group, version] =
      typeof apiVersion === 'string' && apiVersion.includes('/') ? apiVersion.split('/') : ['', apiVersion];
    if (group !== PACKAGING_GROUP) throw new Error(`Expected group '${PACKAGING_GROUP}' but was '${group}'`);
    if (version !== PACKAGING_VERSION) throw new Error(`Expected version '${PACKAGING_VERSION}' but was '${version}'`);
    if (kind === PackageMetadataResource.kind) {
      const parsed = parsePackageMetadata(value);
      if (!parsed.success) throw new Error(`Deserializing resource: ${parsed.error.message}`);
      out.push(`${JSON.stringify(parsed.data)}\n`);
      documents.push(parsed.data);
      continue;
    }
    if (kind !== PackageResource.kind) {
      throw new Error(`Expected kind to be 'Package' or 'PackageMetadata' but was '${String(kind ?? '')}'`);
    }
    const parsed = parsePackage(value);
    if (!parsed.success) throw new Error(`Deserializing resource: ${parsed.error.message}`);
    const pkg = parsed.data;
    const { refName, version: pkgVersion } = pkg.spec;
    if (refName !== undefined && pkgVersion !== undefined) {
      if (pkg.metadata.name === `${refName}.${pkgVersion}`) pkg.metadata.name = encodedName(refName, pkgVersion);
      versions[refName] = [...(versions[refName] ?? []), pkgVersion];
    }
    out.push(`${JSON.stringify(pkg)}\n`);
    documents.push(pkg);
  }
  for (const list of Object.values(versions)) sortVersions(list);
  return { manifest: out.join('---\n'), documents, versions };
}

/** {@link packageObjectName}, its refusal worded as a template error naming the Package. */
function encodedName(refName: string, version: string): string {
  try {
    return packageObjectName(refName, version);
  } catch (err) {
    if (!(err instanceof PackageNameError)) throw err;
    throw new Error(`Encoding name of Package '${refName}.${version}': ${err.message}`);
  }
}

/**
 * Sorts versions in place, ascending by semver precedence (semver 2.0.0 §11); versions equal in
 * precedence (differing in build metadata only) and versions that are not strict semver (the API
 * server refuses those) keep their listed order, the latter after all semver ones.
 *
 * @param versions - `spec.version` strings
 * @returns the same array
 */
export function sortVersions(versions: string[]): string[] {
  // Precedence only: `compare` of the fork also orders build metadata, which semver 2.0.0 does not.
  const precedence = (v: string) => {
    try {
      return STRICT_SEMVER_REGEX.test(v) ? { ...parseVersion(v), build: [] } : undefined;
    } catch {
      return undefined; // a number beyond uint64: not a version blang can hold
    }
  };
  const parsed = new Map(versions.map((v) => [v, precedence(v)]));
  return versions.sort((a, b) => {
    const pa = parsed.get(a);
    const pb = parsed.get(b);
    if (!pa || !pb) return (pa ? 0 : 1) - (pb ? 0 : 1);
    return compare(pa, pb);
  });
}

/** A ytt or kbld step of the pipeline (the `RunStep` of `../template/step.ts`). */
function toolStep(
  index: number,
  bin: 'ytt' | 'kbld',
  args: string[],
  stdin: RunStep['stdin'],
  files: RunStep['files'] = [],
): RunStep {
  return {
    kind: 'run',
    index,
    templater: bin,
    bin,
    args,
    env: {},
    stdin,
    files,
    dirs: [],
    errorPrefix: TEMPLATING_DIR_ERROR_PREFIX,
  };
}

/**
 * `.inf`/`.nan` in any spelling YAML reads as a float: ytt's `-o json` leaves out, silently and
 * with exit code 0, every document holding such a value (JSON has none), so a stream that may
 * hold one takes the YAML path.
 */
const NON_FINITE_FLOAT = /\.(inf|nan)/i;

/** `--file-mark=<file>:type=yaml-plain`: ytt reads `<file>` as plain YAML, never as a template. */
const plainYaml = (file: string): string => `--file-mark=${file}:type=yaml-plain`;

/** The filtered documents of a repository (step 4 of the module comment). */
type Filtered = ReturnType<typeof filterDecoded>;

/** A successful tool result with nothing printed on stderr: upstream's third ytt's, as it ends. */
const QUIET_SUCCESS: StageResult = { stdout: '', stderr: '', exitCode: 0, finished: true };

/**
 * Steps 2 and 3 as one ytt run (see the module comment): the filtered documents, or `undefined`
 * when the run does not end in them (then the caller goes the upstream way, which reports why).
 */
async function onePass(
  packagesDir: string,
  input: RepoTemplateInput,
  deps: TemplateRunDeps,
): Promise<{ filtered: Filtered } | { failed: StageResult }> {
  const dir = path.join(input.scratch, 'one-pass');
  const cleanUp = path.join(dir, 'kapp-controller-clean-up.yml');
  const check = path.join(dir, 'kapp-lambda-json-check.yml');
  const run = await runTemplateSteps(
    [
      toolStep(
        0,
        'ytt',
        ['--ignore-unknown-comments', '-f', packagesDir, '-f', cleanUp, '-f', check, '-o', 'json'],
        'none',
        [
          { path: cleanUp, content: cleanUpOverlay(`${input.namespace}/${input.name}`), sensitive: false },
          { path: check, content: JSON_CHECK_OVERLAY, sensitive: false },
        ],
      ),
    ],
    deps,
    input.scratch,
    input.signal,
  );
  const values = run.result.error ? undefined : splitJsonValues(run.manifest);
  if (!values) return { failed: run.result };
  try {
    return { filtered: filterDecoded(values) };
  } catch {
    return { failed: run.result };
  }
}

/**
 * Steps 2 to 4 upstream's way: ytt over `packages/`, then the clean-up ytt over its output
 * (printing JSON unless the stream may hold a value JSON cannot, or ytt fails to print JSON;
 * then YAML, as upstream), then the filter. Every failure is upstream's result.
 */
async function upstreamPasses(
  packagesDir: string,
  input: RepoTemplateInput,
  deps: TemplateRunDeps,
): Promise<{ filtered: Filtered } | { result: StageResult }> {
  const listed = await runTemplateSteps(
    [toolStep(0, 'ytt', ['--ignore-unknown-comments', '-f', packagesDir], 'none')],
    deps,
    input.scratch,
    input.signal,
  );
  if (listed.result.error) return { result: listed.result };

  const cleanUpDir = path.join(input.scratch, 'clean-up');
  const cleanUpRun = (json: boolean) =>
    runTemplateSteps(
      [
        toolStep(
          1,
          'ytt',
          ['-f', '-', plainYaml('stdin.yml'), '-f', cleanUpDir, ...(json ? ['-o', 'json'] : [])],
          'previous',
          [
            {
              path: path.join(cleanUpDir, 'kapp-controller-clean-up.yml'),
              content: cleanUpOverlay(`${input.namespace}/${input.name}`),
              sensitive: false,
            },
          ],
        ),
      ],
      deps,
      input.scratch,
      input.signal,
      listed.manifest,
    );

  if (!NON_FINITE_FLOAT.test(listed.manifest)) {
    const cleanUp = await cleanUpRun(true);
    try {
      const values = cleanUp.result.error ? undefined : splitJsonValues(cleanUp.manifest);
      if (values) return { filtered: filterDecoded(values) };
    } catch (err) {
      return { result: { ...cleanUp.result, error: errorMessage(err) } };
    }
  }
  // The YAML stream upstream reads: the exact result (and error) wherever JSON cannot stand in.
  const cleanUp = await cleanUpRun(false);
  if (cleanUp.result.error) return { result: cleanUp.result };
  try {
    return { filtered: filterDecoded(yamlStreamValues(cleanUp.manifest)) };
  } catch (err) {
    return { result: { ...cleanUp.result, error: errorMessage(err) } };
  }
}

/**
 * Runs the fixed PackageRepository template pipeline (upstream `App.template` of
 * `pkg/pkgrepository/app_template.go`; see the module comment for the steps and how the tools
 * run).
 *
 * Failures are results, as upstream's `CmdRunResult`: no `packages/` directory is
 * {@link INVALID_PACKAGE_REPOSITORY_MESSAGE} (exit code -1); a tool failure is
 * `Templating dir: <error>` with its stderr and exit code; a {@link filterRepositoryResources}
 * error is set on the clean-up ytt result (its stderr and exit code 0 kept, as upstream sets
 * `result.Error` on it). A success without kbld has upstream's third ytt's result: exit code 0,
 * nothing on stderr.
 *
 * @param input - root, repository name and namespace, bundle flag, scratch directory, signal
 * @param deps - the command runner and tool timeout/output bound (`TemplateRunDeps`)
 * @returns the template result; on success also the manifest and the versions per refName
 * @throws only on I/O errors writing the scratch files
 */
export async function templateRepository(input: RepoTemplateInput, deps: TemplateRunDeps): Promise<RepoTemplateOutput> {
  const packagesDir = path.join(input.root, 'packages');
  try {
    if (!(await lstat(packagesDir)).isDirectory())
      return { result: resultFromError(INVALID_PACKAGE_REPOSITORY_MESSAGE) };
  } catch (err) {
    const missing = (err as NodeJS.ErrnoException).code === 'ENOENT';
    return { result: resultFromError(missing ? INVALID_PACKAGE_REPOSITORY_MESSAGE : errorMessage(err)) };
  }

  const fast = await onePass(packagesDir, input, deps);
  // Canceled (the repository was deleted): no second try.
  if ('failed' in fast && input.signal?.aborted) return { result: fast.failed };
  const passes = 'filtered' in fast ? fast : await upstreamPasses(packagesDir, input, deps);
  if ('result' in passes) return { result: passes.result };
  const { filtered } = passes;
  const stream = `${filtered.manifest}${REBASE_CONFIG}`;

  if (!input.bundle) {
    // The stream is exactly the documents as decoded plus the Config: checked without a parse
    // (`yaml` reads ~0.5 MB/s on a busy host: seconds for 500 Packages).
    const unexpected = unexpectedDocuments(filtered.documents);
    if (unexpected) return { result: { ...QUIET_SUCCESS, error: `${TEMPLATING_DIR_ERROR_PREFIX}${unexpected}` } };
    return { result: QUIET_SUCCESS, manifest: stream, versions: filtered.versions };
  }
  const images = path.join(input.root, '.imgpkg', 'images.yml');
  const problem = await imagesLockProblem(images);
  if (problem) return { result: resultFromError(problem, TEMPLATING_DIR_ERROR_PREFIX) };
  const final = await runTemplateSteps(
    [toolStep(3, 'kbld', ['-f', '-', '-f', images, '--build=false'], 'previous')],
    deps,
    input.scratch,
    input.signal,
    stream,
  );
  if (final.result.error) return { result: final.result };
  // kbld's output is parsed and checked: it passes through whatever images.yml adds.
  const unexpected = unexpectedRenderedDocument(final.manifest);
  if (unexpected) return { result: { ...final.result, error: `${TEMPLATING_DIR_ERROR_PREFIX}${unexpected}` } };
  return { result: final.result, manifest: final.manifest, versions: filtered.versions };
}

/**
 * The non-empty documents of a YAML stream as plain values, or `Parsing <what>: <reason>` (a
 * syntax error, or an alias bomb `yaml` refuses beyond its alias count) instead of a throw.
 */
function yamlValues(text: string, what: string): unknown[] | string {
  const out: unknown[] = [];
  try {
    for (const doc of parseAllDocuments(text)) {
      if (doc.errors.length > 0) return `Parsing ${what}: ${doc.errors[0]?.message}`;
      const value: unknown = doc.toJS();
      if (value !== null && value !== undefined) out.push(value);
    }
  } catch (err) {
    return `Parsing ${what}: ${errorMessage(err)}`;
  }
  return out;
}

/** `<apiVersion> <kind>` of a parsed document, for error messages. */
function kindOf(value: unknown): string {
  const { apiVersion, kind } = (value !== null && typeof value === 'object' ? value : {}) as Record<string, unknown>;
  return `${String(apiVersion ?? '')} ${String(kind ?? '')}`.trim() || JSON.stringify(value);
}

/**
 * Why `.imgpkg/images.yml` is refused, or `undefined` when it holds only imgpkg `ImagesLock`
 * documents (or is missing: kbld then reports it as upstream).
 *
 * **Differs from upstream**, which hands the file to `kbld -f` as it is: kbld passes every
 * document that is not one of its own configuration kinds through to its output, so a bundle's
 * `images.yml` could add any object (a ClusterRoleBinding, a Package in another namespace, a kapp
 * Config) to what kapp deploys with the controller's identity, past the clean-up overlay and
 * `FilterResources`. A real bundle's file (written by `imgpkg push`) is one `ImagesLock`.
 */
export async function imagesLockProblem(file: string): Promise<string | undefined> {
  let text: string;
  try {
    if ((await stat(file)).isDirectory()) return 'Expected .imgpkg/images.yml to be a file but it is a directory';
    text = await readFile(file, 'utf8');
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return undefined;
    throw err;
  }
  const values = yamlValues(text, '.imgpkg/images.yml');
  if (typeof values === 'string') return values;
  for (const value of values) {
    const { apiVersion, kind } = (typeof value === 'object' ? value : {}) as Record<string, unknown>;
    if (apiVersion !== IMAGES_LOCK_API_VERSION || kind !== 'ImagesLock') {
      return `Expected .imgpkg/images.yml to hold only ${IMAGES_LOCK_API_VERSION} ImagesLock documents but found '${kindOf(value)}'`;
    }
  }
  return undefined;
}

/** The apiVersion of imgpkg's `ImagesLock`. */
const IMAGES_LOCK_API_VERSION = 'imgpkg.carvel.dev/v1alpha1';

/**
 * The last guard before kapp deploys a repository with the controller's identity: every document
 * of the rendered stream is a Package or PackageMetadata without `metadata.namespace`, or the one
 * kapp `Config` of {@link REBASE_CONFIG}. Returns the refusal, or `undefined`.
 */
export function unexpectedRenderedDocument(manifest: string): string | undefined {
  const values = yamlValues(manifest, 'rendered repository');
  return typeof values === 'string' ? values : unexpectedDocuments(values);
}

/** {@link unexpectedRenderedDocument} over documents already decoded. */
function unexpectedDocuments(values: readonly unknown[]): string | undefined {
  let configs = 0;
  for (const value of values) {
    const obj = (typeof value === 'object' ? value : {}) as {
      apiVersion?: unknown;
      kind?: unknown;
      metadata?: unknown;
    };
    if (obj.apiVersion === 'kapp.k14s.io/v1alpha1' && obj.kind === 'Config' && ++configs === 1) continue;
    const packaging =
      obj.apiVersion === PackageResource.apiVersion &&
      (obj.kind === PackageResource.kind || obj.kind === PackageMetadataResource.kind);
    const namespace = (obj.metadata as { namespace?: unknown } | undefined)?.namespace;
    if (!packaging || namespace !== undefined) {
      const where = namespace === undefined ? '' : ` in namespace '${String(namespace)}'`;
      return `Expected only Packages and PackageMetadatas of the repository's namespace but found '${kindOf(value)}'${where}`;
    }
  }
  return undefined;
}
