/**
 * The fleet settings of the CDK app, read once from CDK context (`cdk deploy -c key=value`, or
 * `context` in `infra/cdk.json`) and validated with zod. Values given on the command line
 * arrive as strings; numbers and JSON are parsed here.
 *
 * | context key | meaning | default |
 * |---|---|---|
 * | `clusters` | comma list of cluster ids (kubeconfig contexts) the functions serve (`KAPP_LAMBDA_CLUSTERS`) | every context |
 * | `concurrency` | most concurrent invocations per function (the event source mapping's `maxConcurrency`, 2..1000): a number for every function, or JSON `{"deploy": 20}` per function | `STAGE_SIZING` (10; 5 for index-repo and install) |
 * | `kubeconfigPath` | where the functions read the clusters' kubeconfig (`KAPP_LAMBDA_KUBECONFIG`) | `/opt/kapp-lambda/kubeconfig` |
 * | `clusterLayerArn` | a Lambda layer version (ARN) holding that kubeconfig, added to every function | none |
 * | `logRetentionDays` | retention of the functions' log groups (a CloudWatch Logs retention value) | 30 |
 * | `artifactRetentionDays` | expiry of `artifacts/` and `cache/` objects, days after their last write | 30 |
 * | `alarmTopicArn` | SNS topic notified by every alarm | none (alarms only change state) |
 *
 * The kubeconfig pair is the interim cluster source (the one the functions read today,
 * `kubeconfigClusterRegistry`). The fleet's cluster registry replaces it through the stack's
 * `clusterAccess` prop ({@link ClusterAccess}), not through more context here.
 *
 * @module
 */
import type { IFunction } from 'aws-cdk-lib/aws-lambda';
import { z } from 'zod';
import { PIPELINE_STAGES, type PipelineStage } from '../../functions/lib/transport/port.js';
import { DEFAULT_ARTIFACT_RETENTION_DAYS, STAGE_SIZING } from './stages.js';

/** CloudWatch Logs retention values, in days (the API refuses others). */
export const LOG_RETENTION_DAYS = [
  1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653,
] as const;

/** Default of `kubeconfigPath`: a file in a layer (`clusterLayerArn`), which Lambda mounts at `/opt`. */
export const DEFAULT_KUBECONFIG_PATH = '/opt/kapp-lambda/kubeconfig';

/** Default of `logRetentionDays`. */
export const DEFAULT_LOG_RETENTION_DAYS = 30;

/** The validated settings; see the module comment for each. */
export interface FleetSettings {
  clusters?: string[];
  /** Per function, filled from `STAGE_SIZING` where the context names none. */
  concurrency: Record<PipelineStage, number>;
  kubeconfigPath: string;
  clusterLayerArn?: string;
  logRetentionDays: (typeof LOG_RETENTION_DAYS)[number];
  artifactRetentionDays: number;
  alarmTopicArn?: string;
}

/** A context value was invalid; `problems` holds one `<key>: <problem>` each. */
export class FleetContextError extends Error {
  override readonly name = 'FleetContextError';
  constructor(readonly problems: readonly string[]) {
    super(`invalid CDK context: ${problems.join('; ')}`);
  }
}

const fromText = (v: unknown): unknown => {
  if (typeof v !== 'string') return v;
  const t = v.trim();
  if (t === '') return undefined;
  if (/^[[{0-9]/.test(t)) {
    try {
      return JSON.parse(t);
    } catch {
      return t;
    }
  }
  return t;
};

const CONCURRENCY_ERROR = 'expected an integer from 2 to 1000, or a JSON object of function → integer';
const concurrencyValue = z
  .number({ error: CONCURRENCY_ERROR })
  .int({ error: CONCURRENCY_ERROR })
  .min(2, { error: CONCURRENCY_ERROR })
  .max(1000, { error: CONCURRENCY_ERROR });
const arn = (service: string) =>
  z.string().regex(new RegExp(`^arn:aws[a-z-]*:${service}:[a-z0-9-]+:\\d{12}:.+$`), {
    error: `expected an ${service} ARN`,
  });

const ContextSchema = z.object({
  clusters: z.preprocess(
    (v) =>
      typeof v === 'string'
        ? v
            .split(',')
            .map((s) => s.trim())
            .filter(Boolean)
        : v,
    z
      .array(z.string().regex(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/, { error: 'expected DNS-1123 labels' }))
      .min(1)
      .optional(),
  ),
  concurrency: z.preprocess(
    fromText,
    z.union([concurrencyValue, z.partialRecord(z.enum(PIPELINE_STAGES), concurrencyValue)]).optional(),
  ),
  kubeconfigPath: z.preprocess(
    fromText,
    z.string().startsWith('/', { error: 'expected an absolute path' }).default(DEFAULT_KUBECONFIG_PATH),
  ),
  clusterLayerArn: z.preprocess(fromText, arn('lambda').optional()),
  logRetentionDays: z.preprocess(
    fromText,
    z
      .number()
      .refine((d) => (LOG_RETENTION_DAYS as readonly number[]).includes(d), {
        error: `expected one of ${LOG_RETENTION_DAYS.join(', ')}`,
      })
      .default(DEFAULT_LOG_RETENTION_DAYS),
  ),
  artifactRetentionDays: z.preprocess(
    fromText,
    z.number().int().min(1).max(3650).default(DEFAULT_ARTIFACT_RETENTION_DAYS),
  ),
  alarmTopicArn: z.preprocess(fromText, arn('sns').optional()),
});

/** The context keys of {@link FleetSettings}. */
export const FLEET_CONTEXT_KEYS = Object.keys(ContextSchema.shape) as (keyof z.infer<typeof ContextSchema>)[];

/**
 * Reads the fleet settings.
 * @param context - looks up one context key (e.g. `(k) => app.node.tryGetContext(k)`).
 * @throws FleetContextError naming every invalid key.
 */
export function fleetSettings(context: (key: string) => unknown): FleetSettings {
  const raw = Object.fromEntries(FLEET_CONTEXT_KEYS.map((k) => [k, context(k)]));
  const r = ContextSchema.safeParse(raw);
  if (!r.success) {
    throw new FleetContextError(r.error.issues.map((i) => `${i.path.map(String).join('.')}: ${i.message}`));
  }
  const c = r.data;
  const concurrency = Object.fromEntries(
    PIPELINE_STAGES.map((s) => [
      s,
      typeof c.concurrency === 'number' ? c.concurrency : (c.concurrency?.[s] ?? STAGE_SIZING[s].concurrency),
    ]),
  ) as Record<PipelineStage, number>;
  return {
    ...(c.clusters ? { clusters: c.clusters } : {}),
    concurrency,
    kubeconfigPath: c.kubeconfigPath,
    ...(c.clusterLayerArn ? { clusterLayerArn: c.clusterLayerArn } : {}),
    logRetentionDays: c.logRetentionDays as FleetSettings['logRetentionDays'],
    artifactRetentionDays: c.artifactRetentionDays,
    ...(c.alarmTopicArn ? { alarmTopicArn: c.alarmTopicArn } : {}),
  };
}

/**
 * How the functions find the clusters they serve: THE hook of the fleet's cluster registry
 * (issue 11 item 4). Today {@link kubeconfigClusterAccess}: a kubeconfig file at a path, from a
 * layer. A registry replaces it with the variables that locate the registry, any layer it needs,
 * and a `grant` giving each function read access to the registry entries its stage may use.
 */
export interface ClusterAccess {
  /** Variables every function gets (e.g. `KAPP_LAMBDA_KUBECONFIG`). */
  readonly environment: Readonly<Record<string, string>>;
  /** Layer version ARNs added to every function (after its tool layer). */
  readonly layerArns: readonly string[];
  /** Grants one function what reading its clusters needs; called once per function. */
  grant?(fn: IFunction, stage: PipelineStage): void;
}

/**
 * The interim cluster source the functions read today (`kubeconfigClusterRegistry`): the
 * kubeconfig at `fleet.kubeconfigPath`, optionally from the layer `fleet.clusterLayerArn`, serving
 * `fleet.clusters` (all contexts when unset). No IAM grant: the file is in the function's layer.
 */
export function kubeconfigClusterAccess(
  fleet: Pick<FleetSettings, 'kubeconfigPath' | 'clusterLayerArn' | 'clusters'>,
): ClusterAccess {
  return {
    environment: {
      KAPP_LAMBDA_KUBECONFIG: fleet.kubeconfigPath,
      ...(fleet.clusters ? { KAPP_LAMBDA_CLUSTERS: fleet.clusters.join(',') } : {}),
    },
    layerArns: fleet.clusterLayerArn ? [fleet.clusterLayerArn] : [],
  };
}
