/**
 * The forwarder's settings, parsed once from an environment map by the entry file (which is
 * the only place that reads `process.env`) and passed on as a typed object.
 *
 * | variable | meaning | default |
 * |---|---|---|
 * | `FORWARDER_CLUSTER_ID` | cluster id carried by every event (DNS-1123 label) | required |
 * | `FORWARDER_KINDS` | comma list of `App`, `PackageInstall`, `PackageRepository` | `App` |
 * | `FORWARDER_NAMESPACES` | comma list of namespaces to watch; empty: all | all |
 * | `FORWARDER_COALESCE_WINDOW_MS` | per-object coalescing window | 200 |
 * | `FORWARDER_STALL_TIMEOUT_SECONDS` | watchdog: restart a watch silent this long | 90 |
 * | `FORWARDER_WATCH_TIMEOUT_SECONDS` | server-side watch timeout (each watch: `[t, 2t)`) | 300 |
 * | `FORWARDER_PAGE_SIZE` | list page size of watched kinds | 100 |
 * | `FORWARDER_REF_PAGE_SIZE` | list page size of Secrets and ConfigMaps | 100 |
 * | `FORWARDER_BATCH_SIZE` | events per `Transport.send` | 100 |
 * | `FORWARDER_RESYNC_RETRY_SECONDS` | re-ask after a reconcile got no status answer | 300 |
 * | `FORWARDER_APP_DEFAULT_SYNC_PERIOD` | kapp-controller-config `appDefaultSyncPeriod` (Go duration) | 30s |
 * | `FORWARDER_APP_MINIMUM_SYNC_PERIOD` | kapp-controller-config `appMinimumSyncPeriod` (Go duration) | 30s |
 *
 * @module
 */
import { z } from 'zod';
import { blankToUndefined, commaList, envProblem, intText } from '../../functions/lib/api/env.js';
import { DNS1123_LABEL_MAX, isDns1123Label } from '../../functions/lib/api/names.js';
import { parseControllerSyncConfig, type TimerConfig } from '../../functions/lib/reconcile/timer.js';
import type { ForwarderOptions } from './forwarder.js';
import { type WatchedKindName, watchedKinds } from './kinds.js';

/** Settings of one forwarder process. */
export interface ForwarderSettings {
  /** `FORWARDER_CLUSTER_ID`. */
  clusterId: string;
  /** `FORWARDER_KINDS`. */
  kinds: WatchedKindName[];
  /** `FORWARDER_NAMESPACES`; empty means all namespaces. */
  namespaces: string[];
  /** Sync periods for the App timer. */
  timer: TimerConfig;
  /** The numeric knobs, already in the units {@link ForwarderOptions} takes. */
  coalesceWindowMs: number;
  stallTimeoutMs: number;
  watchTimeoutSeconds: number;
  pageSize: number;
  refPageSize: number;
  batchSize: number;
  resyncRetryMs: number;
}

const KIND_NAMES = ['App', 'PackageInstall', 'PackageRepository'] as const;

/** An integer knob in `[min, max]`, `dflt` when unset or blank; problems quote the text. */
const int = (min: number, max: number, dflt: number) =>
  z.preprocess(blankToUndefined, intText(min, max, true).default(dflt));

const EnvSchema = z.object({
  FORWARDER_CLUSTER_ID: z
    .string({ error: 'required' })
    .refine(isDns1123Label, { error: 'expected a DNS-1123 label' })
    .max(DNS1123_LABEL_MAX),
  FORWARDER_KINDS: z
    .string()
    .optional()
    .transform((v) => (commaList(v).length ? commaList(v) : ['App']))
    .pipe(z.array(z.enum(KIND_NAMES))),
  FORWARDER_NAMESPACES: z
    .string()
    .optional()
    .transform(commaList)
    .pipe(z.array(z.string().refine(isDns1123Label, { error: 'expected DNS-1123 labels' }))),
  FORWARDER_COALESCE_WINDOW_MS: int(0, 60_000, 200),
  FORWARDER_STALL_TIMEOUT_SECONDS: int(5, 3600, 90),
  FORWARDER_WATCH_TIMEOUT_SECONDS: int(10, 3600, 300),
  FORWARDER_PAGE_SIZE: int(1, 5000, 100),
  FORWARDER_REF_PAGE_SIZE: int(1, 5000, 100),
  FORWARDER_BATCH_SIZE: int(1, 10_000, 100),
  FORWARDER_RESYNC_RETRY_SECONDS: int(10, 86_400, 300),
  FORWARDER_APP_DEFAULT_SYNC_PERIOD: z.string().optional(),
  FORWARDER_APP_MINIMUM_SYNC_PERIOD: z.string().optional(),
});

/**
 * Parses and validates the forwarder's environment variables (table in the module comment).
 *
 * @param env - The environment, e.g. `process.env` (only `FORWARDER_*` keys are read).
 * @returns The settings, defaults filled in.
 * @throws Error `invalid forwarder settings: <VAR>: <problem>; ...` naming every bad variable
 *   (values are not echoed except short invalid numbers).
 */
export function parseForwarderEnv(env: Readonly<Record<string, string | undefined>>): ForwarderSettings {
  const r = EnvSchema.safeParse(env);
  if (!r.success) {
    const problems = r.error.issues.map(envProblem);
    throw new Error(`invalid forwarder settings: ${problems.join('; ')}`);
  }
  const e = r.data;
  let timer: TimerConfig;
  try {
    timer = parseControllerSyncConfig({
      appDefaultSyncPeriod: e.FORWARDER_APP_DEFAULT_SYNC_PERIOD,
      appMinimumSyncPeriod: e.FORWARDER_APP_MINIMUM_SYNC_PERIOD,
    });
  } catch (cause) {
    throw new Error(`invalid forwarder settings: ${(cause as Error).message}`, { cause });
  }
  return {
    clusterId: e.FORWARDER_CLUSTER_ID,
    kinds: [...new Set(e.FORWARDER_KINDS)],
    namespaces: [...new Set(e.FORWARDER_NAMESPACES)],
    timer,
    coalesceWindowMs: e.FORWARDER_COALESCE_WINDOW_MS,
    stallTimeoutMs: e.FORWARDER_STALL_TIMEOUT_SECONDS * 1000,
    watchTimeoutSeconds: e.FORWARDER_WATCH_TIMEOUT_SECONDS,
    pageSize: e.FORWARDER_PAGE_SIZE,
    refPageSize: e.FORWARDER_REF_PAGE_SIZE,
    batchSize: e.FORWARDER_BATCH_SIZE,
    resyncRetryMs: e.FORWARDER_RESYNC_RETRY_SECONDS * 1000,
  };
}

/**
 * The {@link ForwarderOptions} for `settings`, minus the ports the entry file supplies
 * (watcher, transport, and optionally clock, logger).
 */
export function forwarderOptions(
  settings: ForwarderSettings,
): Omit<ForwarderOptions, 'watcher' | 'transport' | 'clock' | 'random' | 'logger' | 'buildEvent'> {
  return {
    clusterId: settings.clusterId,
    kinds: watchedKinds(settings.kinds, settings.timer),
    namespaces: settings.namespaces,
    coalesceWindowMs: settings.coalesceWindowMs,
    stallTimeoutMs: settings.stallTimeoutMs,
    watchTimeoutSeconds: settings.watchTimeoutSeconds,
    pageSize: settings.pageSize,
    refPageSize: settings.refPageSize,
    batchSize: settings.batchSize,
    resyncRetryMs: settings.resyncRetryMs,
  };
}
