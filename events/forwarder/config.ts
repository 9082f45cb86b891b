/**
 * The forwarder's settings, parsed once from an environment map by the entry file (which is
 * the only place that reads `process.env`) and passed on as a typed object.
 *
 * The variables, their defaults and what each does are {@link FORWARDER_ENV_DOCS} (the watch)
 * and {@link FORWARDER_PROGRAM_ENV_DOCS} (the program, `main.ts`) below, the one source of the
 * forwarder's tables in `docs/configuration.md` (`npm run gen:config`); a variable read here
 * without a row there fails `test/unit/config-reference.test.ts`.
 *
 * The queue variables are the functions' own (`queueUrlEnv` of `functions/lib/api/functions.ts`).
 * Credentials are not configuration: the SQS client takes them from the AWS SDK's default chain
 * (IRSA's web identity token or EKS Pod Identity in a cluster).
 *
 * @module
 */
import * as z from 'zod';
import {
  blankToUndefined,
  commaList,
  envProblem,
  httpUrl,
  intText,
  optional,
  type SettingDoc,
} from '../../functions/lib/api/env.js';
import { type PipelineStage, queueUrlEnv } from '../../functions/lib/api/functions.js';
import {
  DNS1123_LABEL_MAX,
  DNS1123_SUBDOMAIN_MAX,
  isDns1123Label,
  isDns1123Subdomain,
} from '../../functions/lib/api/names.js';
import { EVENT_KEY_BYTES, isEventKey } from '../../functions/lib/kube/cluster-doc.js';
import { DEFAULT_CONTROLLER_CONFIG_NAMESPACE } from '../../functions/lib/reconcile/controller-config.js';
import { parseControllerSyncConfig, type TimerConfig } from '../../functions/lib/reconcile/timer.js';
import { KIND_FUNCTION } from '../schema.js';
import type { ForwarderOptions } from './forwarder.js';
import { type TimerConfigSource, type WatchedKindName, watchedKinds } from './kinds.js';
import { DEFAULT_LEASE_NAMESPACE, leaseNameFor } from './leadership.js';
import { DEFAULT_STATUS_METRICS_MAX_OBJECTS } from './status-metrics.js';

/**
 * The environment variables of the watch, read by {@link parseForwarderEnv} (in-cluster program
 * and tests); the embedded runtime's forwarders take the same values as options. The forwarder
 * table of `docs/configuration.md` is generated from it (`npm run gen:config`).
 */
export const FORWARDER_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: 'FORWARDER_CLUSTER_ID',
    default: 'required',
    meaning: 'cluster id carried by every event (DNS-1123 label)',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_KINDS',
    default: '`App`',
    meaning: 'comma list of `App`, `PackageInstall`, `PackageRepository`',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_NAMESPACES',
    default: 'all',
    meaning: 'comma list of namespaces to watch; empty: all',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_COALESCE_WINDOW_MS',
    default: '200',
    meaning: 'per-object coalescing window',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_STALL_TIMEOUT_SECONDS',
    default: '90',
    meaning: 'watchdog: restart a watch silent this long',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_WATCH_TIMEOUT_SECONDS',
    default: '300',
    meaning: 'server-side watch timeout (each watch: `[t, 2t)`)',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_PAGE_SIZE',
    default: '100',
    meaning: 'list page size of watched kinds',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_REF_PAGE_SIZE',
    default: '100',
    meaning: 'list page size of Secrets and ConfigMaps',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_BATCH_SIZE',
    default: '100',
    meaning: 'events per `Transport.send`',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_RESYNC_RETRY_SECONDS',
    default: '300',
    meaning:
      're-ask after a reconcile got no status answer; each further re-ask of the same status waits twice as long, at most 16 times this',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_APP_DEFAULT_SYNC_PERIOD',
    default: '30s',
    meaning: 'kapp-controller-config `appDefaultSyncPeriod` (Go duration)',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_APP_MINIMUM_SYNC_PERIOD',
    default: '30s',
    meaning: 'kapp-controller-config `appMinimumSyncPeriod` (Go duration)',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_SYNC_MODE',
    default: '`exception`',
    meaning:
      "kapp-controller-config `kappLambdaSyncMode`: `exception` or `periodic` (upstream's timer for every App, PackageRepository and PackageInstall)",
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_SAFETY_SYNC_PERIOD',
    default: '10m',
    meaning: 'kapp-controller-config `kappLambdaSafetySyncPeriod` (Go duration)',
    readBy: 'forwarder',
  },
  {
    name: 'FORWARDER_CONTROLLER_CONFIG_NAMESPACE',
    default: '`kapp-lambda`',
    meaning:
      "where the cluster's `kapp-controller-config` lives (the functions' `--controller-config-namespace`); its keys override `FORWARDER_APP_DEFAULT_SYNC_PERIOD`, `_MINIMUM_SYNC_PERIOD`, `FORWARDER_SYNC_MODE` and `FORWARDER_SAFETY_SYNC_PERIOD`",
    readBy: 'forwarder',
  },
];

/**
 * The environment variables of the forwarder program (`main.ts`) besides {@link FORWARDER_ENV_DOCS}:
 * read by {@link parseForwarderProgramEnv} and by `main.ts` itself (`FORWARDER_LOG_LEVEL` before
 * the rest, `HOSTNAME`). The forwarder program table of `docs/configuration.md` is generated from it.
 */
export const FORWARDER_PROGRAM_ENV_DOCS: readonly SettingDoc[] = [
  {
    name: 'AWS_REGION',
    default: 'required',
    meaning: 'region of the SQS client',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'KAPP_LAMBDA_SQS_ENDPOINT',
    default: 'AWS',
    meaning: 'SQS-compatible endpoint (`http(s)://…`)',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'FORWARDER_EVENT_KEY',
    default: 'none',
    meaning:
      "base64 of the cluster's 32-byte event key (the registry document's `eventKey`, from the Secret `kapp-lambda-forwarder-event-key` that `npm run cluster -- join` writes): the key of the SQS message groups and deduplication ids of the events sent (`messageGroupId`, `dedupId`), so no other cluster's sender can name one; it must be the registry document's (the functions refuse events in any other group); none: the object's ordering key and the event id, for a cluster whose document has no key",
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'KAPP_LAMBDA_QUEUE_URL_FETCH',
    default: 'required when App is watched',
    meaning: "FIFO queue of App events (the fetch function's)",
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'KAPP_LAMBDA_QUEUE_URL_INSTALL',
    default: 'required when PackageInstall is watched',
    meaning: 'FIFO queue of PackageInstall events',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'KAPP_LAMBDA_QUEUE_URL_INDEX_REPO',
    default: 'required when PackageRepository is watched',
    meaning: 'FIFO queue of PackageRepository events',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'FORWARDER_LEASE_NAMESPACE',
    default: '`kapp-lambda`',
    meaning: 'namespace of the leader-election Lease',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'FORWARDER_LEASE_NAME',
    default: '`kapp-lambda-forwarder[-<hash of FORWARDER_NAMESPACES>]`',
    meaning: 'name of the Lease',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'FORWARDER_HTTP_HOST',
    default: '`0.0.0.0`',
    meaning: 'address of `/healthz`, `/readyz`, `/metrics`',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'FORWARDER_HTTP_PORT',
    default: '8080',
    meaning: 'port of the same',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'FORWARDER_RECONCILE_METRICS_MAX_OBJECTS',
    default: '50000',
    meaning:
      "most objects with kapp-controller's per-object `kappctrl_*` series on `/metrics`, derived from their status (`status-metrics.ts`; 0: none)",
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'FORWARDER_SHUTDOWN_TIMEOUT_SECONDS',
    default: '10',
    meaning: 'on SIGTERM: bound of sending what is waiting',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'FORWARDER_LOG_LEVEL',
    default: '`info`',
    meaning: '`debug`, `info`, `warn` or `error`',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'KUBECONFIG',
    default: 'in-cluster',
    meaning: 'kubeconfig file (its current context); unset: the in-cluster ServiceAccount',
    readBy: 'forwarder program (`main.ts`)',
  },
  {
    name: 'HOSTNAME',
    default: '`os.hostname()`',
    meaning: 'first half of the Lease holder identity, `<hostname>_<8 random hex>`',
    readBy: 'forwarder program (`main.ts`)',
  },
];

/** Settings of one forwarder process. */
export interface ForwarderSettings {
  /** `FORWARDER_CLUSTER_ID`. */
  clusterId: string;
  /** `FORWARDER_KINDS`. */
  kinds: WatchedKindName[];
  /** `FORWARDER_NAMESPACES`; empty means all namespaces. */
  namespaces: string[];
  /** Sync periods for the App timer (the cluster's `kapp-controller-config` overrides them). */
  timer: TimerConfig;
  /** `FORWARDER_CONTROLLER_CONFIG_NAMESPACE`. */
  controllerConfigNamespace: string;
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
  FORWARDER_SYNC_MODE: z.string().optional(),
  FORWARDER_SAFETY_SYNC_PERIOD: z.string().optional(),
  FORWARDER_CONTROLLER_CONFIG_NAMESPACE: z.preprocess(
    blankToUndefined,
    z
      .string()
      .default(DEFAULT_CONTROLLER_CONFIG_NAMESPACE)
      .refine(isDns1123Label, { error: 'expected a DNS-1123 label' }),
  ),
});

/**
 * Parses and validates the forwarder's environment variables ({@link FORWARDER_ENV_DOCS}).
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
      kappLambdaSyncMode: e.FORWARDER_SYNC_MODE,
      kappLambdaSafetySyncPeriod: e.FORWARDER_SAFETY_SYNC_PERIOD,
    });
  } catch (cause) {
    throw new Error(`invalid forwarder settings: ${(cause as Error).message}`, { cause });
  }
  return {
    clusterId: e.FORWARDER_CLUSTER_ID,
    kinds: [...new Set(e.FORWARDER_KINDS)],
    namespaces: [...new Set(e.FORWARDER_NAMESPACES)],
    timer,
    controllerConfigNamespace: e.FORWARDER_CONTROLLER_CONFIG_NAMESPACE,
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
 *
 * @param timer - The App timer's sync periods, read when a due time is computed; default
 *   `settings.timer` (the program passes the cluster's `kapp-controller-config` over it).
 */
export function forwarderOptions(
  settings: ForwarderSettings,
  timer: TimerConfigSource = settings.timer,
): Omit<ForwarderOptions, 'watcher' | 'transport' | 'clock' | 'random' | 'logger' | 'buildEvent'> {
  return {
    clusterId: settings.clusterId,
    kinds: watchedKinds(settings.kinds, timer),
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

/** Log levels of the program. */
export const FORWARDER_LOG_LEVELS = ['debug', 'info', 'warn', 'error'] as const;

/** Settings of the forwarder program (`main.ts`): the forwarder's plus its surroundings. */
export interface ForwarderProgramSettings {
  /** The forwarder's own ({@link parseForwarderEnv}). */
  forwarder: ForwarderSettings;
  /** `AWS_REGION`. */
  region: string;
  /** `KAPP_LAMBDA_SQS_ENDPOINT`, when set. */
  sqsEndpoint?: string;
  /** Queue URL of the function each watched kind goes to (exactly those). */
  queueUrls: Partial<Record<PipelineStage, string>>;
  /** `FORWARDER_LEASE_NAMESPACE` / `FORWARDER_LEASE_NAME`. */
  lease: { namespace: string; name: string };
  /** `FORWARDER_HTTP_HOST` / `FORWARDER_HTTP_PORT` (0: any free port, for tests). */
  http: { host: string; port: number };
  /**
   * `FORWARDER_RECONCILE_METRICS_MAX_OBJECTS`: most objects with `kappctrl_*` series (0: the
   * series are off). Absent: `DEFAULT_STATUS_METRICS_MAX_OBJECTS` (50,000).
   */
  reconcileMetricsMaxObjects?: number;
  /** `FORWARDER_SHUTDOWN_TIMEOUT_SECONDS`, in ms. */
  shutdownTimeoutMs: number;
  /** `FORWARDER_LOG_LEVEL`. */
  logLevel: (typeof FORWARDER_LOG_LEVELS)[number];
  /** `KUBECONFIG`, when set (else in-cluster). Only a single path is supported. */
  kubeconfig?: string;
  /**
   * `FORWARDER_EVENT_KEY`'s bytes, when set: the key of the SQS deduplication ids (`dedupId` of
   * `functions/lib/transport/sqs.ts`). A secret: never logged.
   */
  eventKey?: Uint8Array;
}

const ProgramEnvSchema = z.object({
  AWS_REGION: z
    .preprocess(blankToUndefined, z.string({ error: 'required' }))
    .pipe(z.string().regex(/^[a-z0-9-]+$/, { error: 'expected a region name' })),
  KAPP_LAMBDA_SQS_ENDPOINT: optional(httpUrl),
  FORWARDER_LEASE_NAMESPACE: z.preprocess(
    blankToUndefined,
    z.string().default(DEFAULT_LEASE_NAMESPACE).refine(isDns1123Label, { error: 'expected a DNS-1123 label' }),
  ),
  FORWARDER_LEASE_NAME: optional(
    z.string().max(DNS1123_SUBDOMAIN_MAX).refine(isDns1123Subdomain, { error: 'expected a DNS-1123 subdomain' }),
  ),
  FORWARDER_HTTP_HOST: z.preprocess(blankToUndefined, z.string().default('0.0.0.0')),
  FORWARDER_HTTP_PORT: int(0, 65_535, 8080),
  FORWARDER_RECONCILE_METRICS_MAX_OBJECTS: int(0, 1_000_000, DEFAULT_STATUS_METRICS_MAX_OBJECTS),
  FORWARDER_SHUTDOWN_TIMEOUT_SECONDS: int(1, 300, 10),
  FORWARDER_LOG_LEVEL: z.preprocess(blankToUndefined, z.enum(FORWARDER_LOG_LEVELS).default('info')),
  KUBECONFIG: optional(z.string().refine((v) => !v.includes(':'), { error: 'expected one path (no list)' })),
  FORWARDER_EVENT_KEY: optional(
    z.string().refine(isEventKey, { error: `expected base64 of ${EVENT_KEY_BYTES} bytes` }),
  ),
});

/**
 * Parses the forwarder program's environment: {@link parseForwarderEnv} plus the variables of
 * {@link FORWARDER_PROGRAM_ENV_DOCS}. A queue URL is required for every watched kind (a kind
 * whose queue is missing would stall its batches forever) and only those are kept.
 *
 * @param env - The environment, e.g. `process.env`.
 * @throws Error `invalid forwarder settings: <VAR>: <problem>; ...` naming every bad variable
 *   (URLs and paths are not echoed).
 */
export function parseForwarderProgramEnv(env: Readonly<Record<string, string | undefined>>): ForwarderProgramSettings {
  const problems: string[] = [];
  let forwarder: ForwarderSettings | undefined;
  try {
    forwarder = parseForwarderEnv(env);
  } catch (e) {
    problems.push((e as Error).message.replace(/^invalid forwarder settings: /, ''));
  }
  const r = ProgramEnvSchema.safeParse(env);
  if (!r.success) problems.push(...r.error.issues.map(envProblem));
  const queueUrls: Partial<Record<PipelineStage, string>> = {};
  for (const kind of forwarder?.kinds ?? []) {
    const stage = KIND_FUNCTION[kind] as PipelineStage;
    const name = queueUrlEnv(stage);
    const url = httpUrl.safeParse(blankToUndefined(env[name]));
    if (url.success) queueUrls[stage] = url.data;
    else
      problems.push(
        `${name}: ${env[name]?.trim() ? 'expected an http:// or https:// URL' : `required (${kind} events go to it)`}`,
      );
  }
  if (!forwarder || !r.success || problems.length > 0) {
    throw new Error(`invalid forwarder settings: ${problems.join('; ')}`);
  }
  const e = r.data;
  return {
    forwarder,
    region: e.AWS_REGION,
    ...(e.KAPP_LAMBDA_SQS_ENDPOINT ? { sqsEndpoint: e.KAPP_LAMBDA_SQS_ENDPOINT } : {}),
    queueUrls,
    lease: {
      namespace: e.FORWARDER_LEASE_NAMESPACE,
      name: e.FORWARDER_LEASE_NAME ?? leaseNameFor(forwarder.namespaces),
    },
    http: { host: e.FORWARDER_HTTP_HOST, port: e.FORWARDER_HTTP_PORT },
    reconcileMetricsMaxObjects: e.FORWARDER_RECONCILE_METRICS_MAX_OBJECTS,
    shutdownTimeoutMs: e.FORWARDER_SHUTDOWN_TIMEOUT_SECONDS * 1000,
    logLevel: e.FORWARDER_LOG_LEVEL,
    ...(e.KUBECONFIG ? { kubeconfig: e.KUBECONFIG } : {}),
    ...(e.FORWARDER_EVENT_KEY ? { eventKey: Buffer.from(e.FORWARDER_EVENT_KEY, 'base64') } : {}),
  };
}
