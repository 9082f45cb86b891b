/**
 * Which `kapp` flags an App may pass through `rawOptions`, and the strict `--name=value` format
 * they must use. Mirrors kapp-controller `pkg/deploy/kapp_restrict.go` and `pkg/exec/flag.go`.
 *
 * @module
 */
import { KappControllerError } from '../reconcile/errors.js';

/** Flags allowed for deploy, delete and inspect. */
export const KAPP_ALLOWED_SHARED_OPTS: readonly string[] = Object.freeze([
  '--column',
  '--debug',
  '--json',
  '--tty',
  '--dangerous-ignore-failing-api-services',
  '--dangerous-scope-to-fallback-allowed-namespaces',
  '--filter',
  '--filter-age',
  '--filter-kind',
  '--filter-kind-name',
  '--filter-kind-ns',
  '--filter-kind-ns-name',
  '--filter-name',
  '--filter-ns',
  '--kube-api-qps',
  '--kube-api-burst',
]);

/** Flags allowed for deploy and delete (diffing, applying, waiting). */
export const KAPP_ALLOWED_CHANGE_OPTS: readonly string[] = Object.freeze([
  '--diff-changes',
  '--diff-against-last-applied',
  '--diff-context',
  '--diff-line-numbers',
  '--diff-mask',
  '--diff-run',
  '--diff-summary',
  '--diff-anchored',
  '--apply-check-interval',
  '--apply-concurrency',
  '--apply-default-update-strategy',
  '--apply-ignored',
  '--apply-timeout',
  '--exit-early-on-apply-error',
  '--wait',
  '--wait-check-interval',
  '--wait-concurrency',
  '--wait-ignored',
  '--wait-timeout',
  '--exit-early-on-wait-error',
]);

/** Flags allowed for deploy only. */
export const KAPP_ALLOWED_DEPLOY_ONLY_OPTS: readonly string[] = Object.freeze([
  '--dangerous-allow-empty-list-of-resources',
  '--existing-non-labeled-resources-check',
  '--existing-non-labeled-resources-check-concurrency',
  '--dangerous-override-ownership-of-existing-resources',
  '--into-ns',
  '--map-ns',
  '--logs',
  '--logs-all',
  '--app-changes-max-to-keep',
  '--labels',
  '--patch',
]);

/** Flags allowed for inspect only. */
export const KAPP_ALLOWED_INSPECT_ONLY_OPTS: readonly string[] = Object.freeze(['--raw', '--status', '--tree']);

/** The deploy allow-list (also used for the controller-wide `kappDeployRawOptions`). */
export const KAPP_ALLOWED_DEPLOY_FLAGS: ReadonlySet<string> = new Set([
  ...KAPP_ALLOWED_SHARED_OPTS,
  ...KAPP_ALLOWED_CHANGE_OPTS,
  ...KAPP_ALLOWED_DEPLOY_ONLY_OPTS,
]);

/** The inspect allow-list. */
export const KAPP_ALLOWED_INSPECT_FLAGS: ReadonlySet<string> = new Set([
  ...KAPP_ALLOWED_SHARED_OPTS,
  ...KAPP_ALLOWED_INSPECT_ONLY_OPTS,
]);

/** The delete allow-list. */
export const KAPP_ALLOWED_DELETE_FLAGS: ReadonlySet<string> = new Set([
  ...KAPP_ALLOWED_SHARED_OPTS,
  ...KAPP_ALLOWED_CHANGE_OPTS,
]);

/** Upstream's flag regex: `\A(\-\-[a-z]+(\-[a-z]+)*)=(.+)\z` (Go's `.` excludes only `\n`). */
const FULL_FLAG = /^(--[a-z]+(?:-[a-z]+)*)=([^\n]+)$/;

/** A parsed `--name=value` flag. */
export interface RawFlag {
  /** Flag name including `--`. */
  name: string;
  /** Value after the first `=`. */
  value: string;
}

/**
 * Parses a raw option in the strict `--name=value` form.
 *
 * @param option - e.g. `--wait-timeout=5m`
 * @throws {KappControllerError} `Expected flag '<option>' to be in '--name=val' format`
 */
export function parseRawFlag(option: string): RawFlag {
  const m = FULL_FLAG.exec(option);
  if (!m) throw new KappControllerError(`Expected flag '${option}' to be in '--name=val' format`);
  return { name: m[1]!, value: m[2]! };
}

/**
 * Validates raw options against an allow-list, in order, failing on the first bad one.
 *
 * Upstream returns these errors from `Deploy`/`Delete`/`Inspect` unprefixed (they are not wrapped
 * in `Preparing kapp: `, which only wraps credential errors), so the texts here are bare too.
 *
 * @param options - raw options, e.g. `['--wait-timeout=5m']`
 * @param allowed - one of the allow-lists above
 * @returns the options, unchanged, ready to append to argv
 * @throws {KappControllerError} {@link parseRawFlag}'s error, or
 *   `Unexpected flag '<name>' specified (either forbidden or unknown)`
 */
export function validateRawOptions(options: readonly string[] | undefined, allowed: ReadonlySet<string>): string[] {
  const out: string[] = [];
  for (const option of options ?? []) {
    const flag = parseRawFlag(option);
    if (!allowed.has(flag.name)) {
      throw new KappControllerError(`Unexpected flag '${flag.name}' specified (either forbidden or unknown)`);
    }
    out.push(option);
  }
  return out;
}
