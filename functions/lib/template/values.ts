/**
 * `valuesFrom[]` (shared by ytt, helmTemplate and cue): which values files a templating step gets,
 * in which order, and what must be written for them.
 *
 * Mirrors kapp-controller `pkg/template/values.go` (`Values.AsPaths`). Pure: instead of writing to
 * fresh temp directories it returns {@link PlannedFile}s under a caller-chosen scratch directory,
 * and Secrets/ConfigMaps come in through {@link RefObjects}.
 *
 * @module
 */
import { posix } from 'node:path';
import { configMapNotFoundMessage, type RefObjects, secretNotFoundMessage } from '../api/refs.js';
import type { AppTemplateValuesSource } from '../api/template.js';
import { InvalidPathError, scopedPath } from '../paths.js';
import { KappControllerError } from '../reconcile/result.js';
import { type AppMetadataLike, type ClusterInfo, downwardAPIValuesYaml } from './downward-api.js';

/** `-`: "use the stream (stdin)" wherever a path is accepted. */
export const STDIN_PATH = '-';

/** Prefix of every `valuesFrom` failure (`Values.AsPaths`). */
export const VALUES_ERROR_PREFIX = 'Preparing template values: ';

/** Upstream: the text for a `valuesFrom` entry with no source set. */
export const NO_VALUES_SOURCE_MESSAGE = 'Expected either secretRef, configMapRef or path as a source';

/** A file the I/O layer must write before running the step. */
export interface PlannedFile {
  /** Absolute path (under the step's scratch directory). */
  path: string;
  /** File content (bytes for Secret data, text otherwise). */
  content: string | Uint8Array;
  /**
   * `true` when the content came from a Secret (values, keys): never log, cache or store it.
   * Write with mode 0600, as upstream.
   */
  sensitive: boolean;
}

/** What a step needs from the outside world to resolve `valuesFrom`. */
export interface ValuesContext {
  /** Absolute template root (where `path` sources are resolved). */
  templateRoot: string;
  /** The App's metadata (downward API `fieldPath`). */
  metadata: AppMetadataLike;
  /** Secrets and ConfigMaps of the App's namespace. */
  refs: RefObjects;
  /** Live cluster values (downward API). */
  cluster: ClusterInfo;
}

/** Result of {@link planValues}. */
export interface ValuesPlan {
  /** Values file arguments in order: absolute paths, or `-` for stdin. */
  paths: string[];
  /** Files to write first. */
  files: PlannedFile[];
  /** Non-fatal findings (e.g. a dropped out-of-scope `path`). */
  warnings: string[];
}

function byteCompare(a: string, b: string): number {
  return a < b ? -1 : a > b ? 1 : 0;
}

/**
 * Plans the values files of one step. Sources are processed in order; each gets its own directory
 * `<valuesRoot>/<j>` (upstream: a fresh temp dir per source):
 * - `secretRef` / `configMapRef`: every key of `data` becomes `<dir>/<key>`; files sorted by path
 *   (so by key). Secret values are written decoded; ConfigMap `binaryData` is ignored, as upstream.
 * - `path`: `-` stays `-`; otherwise resolved under `templateRoot`. A path that escapes the root is
 *   **silently dropped**, as upstream does (reproduced for compatibility: an App that works under
 *   kapp-controller keeps working); a warning is returned so the drop can be logged.
 * - `downwardAPI`: item *k* becomes `<dir>/downwardapi_<k>.yaml`.
 *
 * @param valuesFrom - the step's `valuesFrom`
 * @param valuesRoot - absolute scratch directory for this step's values (outside the template root)
 * @param ctx - see {@link ValuesContext}
 * @returns paths, files and warnings
 * @throws {KappControllerError} `Preparing template values: <reason>`, where reason is e.g.
 *   `secrets "x" not found`, `Invalid path: <key>`, {@link NO_VALUES_SOURCE_MESSAGE} or a downward
 *   API error. Missing live cluster values throw a `TypeError` (a caller bug).
 */
export function planValues(
  valuesFrom: readonly AppTemplateValuesSource[],
  valuesRoot: string,
  ctx: ValuesContext,
): ValuesPlan {
  const plan: ValuesPlan = { paths: [], files: [], warnings: [] };
  valuesFrom.forEach((source, j) => {
    const dir = posix.join(valuesRoot, String(j));
    try {
      if (source.secretRef) {
        const name = source.secretRef.name ?? '';
        const secret = ctx.refs.secret(name);
        if (!secret) throw new Error(secretNotFoundMessage(name));
        const files = Object.keys(secret.data ?? {}).map((key) => ({
          path: scopedPath(dir, key),
          content: new Uint8Array(secret.data![key]!),
          sensitive: true,
        }));
        files.sort((a, b) => byteCompare(a.path, b.path));
        plan.files.push(...files);
        plan.paths.push(...files.map((f) => f.path));
      } else if (source.configMapRef) {
        const name = source.configMapRef.name ?? '';
        const cm = ctx.refs.configMap(name);
        if (!cm) throw new Error(configMapNotFoundMessage(name));
        const files = Object.keys(cm.data ?? {}).map((key) => ({
          path: scopedPath(dir, key),
          content: cm.data![key]!,
          sensitive: false,
        }));
        files.sort((a, b) => byteCompare(a.path, b.path));
        plan.files.push(...files);
        plan.paths.push(...files.map((f) => f.path));
      } else if (source.path) {
        if (source.path === STDIN_PATH) {
          plan.paths.push(STDIN_PATH);
        } else {
          try {
            plan.paths.push(scopedPath(ctx.templateRoot, source.path));
          } catch (err) {
            if (!(err instanceof InvalidPathError)) throw err;
            plan.warnings.push(`valuesFrom[${j}].path '${source.path}' is outside the template root and was ignored`);
          }
        }
      } else if (source.downwardAPI) {
        downwardAPIValuesYaml(source.downwardAPI.items ?? [], ctx.metadata, ctx.cluster).forEach((content, k) => {
          const path = scopedPath(dir, `downwardapi_${k}.yaml`);
          plan.files.push({ path, content, sensitive: false });
          plan.paths.push(path);
        });
      } else {
        throw new Error(NO_VALUES_SOURCE_MESSAGE);
      }
    } catch (err) {
      if (err instanceof TypeError) throw err;
      throw new KappControllerError(`${VALUES_ERROR_PREFIX}${(err as Error).message}`, { cause: err });
    }
  });
  return plan;
}
