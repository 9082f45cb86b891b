/**
 * The fleet deployment on AWS: one stack holding the artifact bucket and its KMS key, the
 * artifact root key, and per function of `PIPELINE_STAGES` a FIFO queue with its dead-letter
 * queue, the function (its esbuild bundle and its tool layer), log group and alarms, and (the
 * default `isolation: shared`, dispatched, docs/decisions.md D15) its dispatcher, which consumes
 * the queue and invokes the function per cluster, tenant-isolated, with a session of the stage's
 * run role narrowed to that cluster: the dispatcher's role holds the queue, the sender check's
 * registry reads, the fair shares and the root key; the run role what a run may do (read access
 * to the fleet's cluster registry included); the function's own role its logs only. The
 * schedule of the fleet source poll (invoking the index-repo dispatcher) and of the fleet rollout
 * check (invoking the install dispatcher, which coordinates the rollouts: issue 28); the send-only managed policy every cluster's forwarder role
 * gets (output `ForwarderPolicyArn`: `npm run cluster -- join` creates that role, so a cluster
 * joins without a stack change); and, the way before `join` (and the only one of cells), one
 * send-only role per cluster's forwarder in the stack (context `forwarders`,
 * {@link KappLambdaStack.addClusterForwarder}). With the fleet registry, every
 * function checks who sent an event (`KAPP_LAMBDA_SENDER_CHECK=registry`): an event naming a
 * cluster is taken from that cluster's forwarder role (object events only) or a function that
 * sends to it only (`KAPP_LAMBDA_FUNCTION_SENDERS=<function>=<role id>,…`: only what that function
 * sends). A cluster access without a registry cannot check, and then no forwarder role is
 * created (the synth fails naming the conflict instead).
 *
 * Context `isolation: cell` builds that set of functions, queues, alarms, source poll and root
 * key once per cluster of `forwarders` instead ({@link KappLambdaStack.addCell}, under the
 * construct `Cell<Id>`), without dispatchers: each cell's functions consume their queues, their
 * roles read only their cluster's registry document, stage tokens and root key, they refuse
 * events naming another cluster (`KAPP_LAMBDA_CELL_CLUSTER`), and the cell's forwarder may send
 * only to its queues. The bucket, its KMS key and the layers stay shared. The default `shared`
 * keeps the construct ids of before cells (queues, roles, log groups); its stage functions are
 * replaced once by the tenant-isolated ones (`TenancyConfig` cannot change on a function).
 *
 * The stack takes its code as directories (`assets`), so it never builds anything itself: the
 * app (`./app.ts`) bundles the functions with the project's one esbuild recipe and points at
 * the layers `npm run build:layers` laid out; the infrastructure test points at the same
 * bundles and a small layer directory. Synth needs no AWS credentials and no network.
 *
 * @module
 */
import {
  ArnFormat,
  CfnOutput,
  aws_cloudwatch as cloudwatch,
  aws_cloudwatch_actions as cwActions,
  Duration,
  aws_ec2 as ec2,
  Fn,
  aws_iam as iam,
  aws_kms as kms,
  aws_lambda as lambda,
  aws_lambda_event_sources as lambdaEvents,
  aws_logs as logs,
  Size,
  Stack,
  type StackProps,
  aws_s3 as s3,
  aws_scheduler as scheduler,
  aws_scheduler_targets as schedulerTargets,
  aws_secretsmanager as secretsmanager,
  aws_sns as sns,
  aws_sqs as sqs,
  Token,
  Validations,
} from 'aws-cdk-lib';
import { Construct } from 'constructs';
import { ROLLOUT_CHECK_EVENT_TYPE, SOURCE_POLL_EVENT_TYPE } from '../../events/schema.js';
import { PIPELINE_STAGES, type PipelineStage, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { INFLIGHT_PREFIX } from '../../functions/lib/artifact/keys.js';
import { NEXT_STAGES } from '../../functions/lib/entry/config.js';
import { ARTIFACT_ROOT_KEY_SECRET_ENV, usesArtifactKey } from '../../functions/lib/entry/lambda.js';
import { STAGE_TOOLS } from '../../functions/lib/exec/runner.js';
import { CLUSTER_DOC_PREFIX, CLUSTER_ID_PATTERN, clusterDocKey } from '../../functions/lib/kube/cluster-doc.js';
import { LEASE_PREFIX } from '../../functions/lib/lease/index.js';
import { DEFAULT_MAX_ATTEMPTS } from '../../functions/lib/pipeline/retry-bound.js';
import { layerToolVersions } from '../../layers/build.js';
import {
  type ClusterAccess,
  type FleetSettings,
  type FleetVpc,
  type IsolationMode,
  URL_POLICY_STAGES,
} from './fleet.js';
import { FleetPage } from './fleet-page.js';
import {
  cellObjectGrants,
  DISPATCHER_MEMORY_MIB,
  dispatcherObjects,
  dispatcherTimeoutSeconds,
  EXPIRING_PREFIXES,
  FORWARDER_SERVICE_ACCOUNT,
  FORWARDER_STAGES,
  INFLIGHT_EXPIRY_DAYS,
  LEASE_EXPIRY_DAYS,
  type ObjectGrant,
  PRIVATE_EXPIRY_DAYS,
  podIdentityTrust,
  runRoleObjects,
  STAGE_OBJECTS,
  STAGE_SIZING,
  stageTimeoutSeconds,
  tokenSecretPattern,
  toolTimeoutMs,
  VISIBILITY_MARGIN_SECONDS,
} from './stages.js';

/** The Lambda runtime of every function: the newest Node managed runtime (the bundles target Node 20). */
export const FUNCTION_RUNTIME = lambda.Runtime.NODEJS_24_X;

/**
 * Period of the fleet rollout check (`isolation: shared`), minutes: 1, EventBridge Scheduler's
 * shortest rate. Bounds how late a paused, resumed or aborted rollout is acted on, and a wave
 * whose soak ended with no event after it is released (the forwarder's due time usually does it
 * first); 43,200 short invocations of the install dispatcher a month.
 */
export const ROLLOUT_CHECK_MINUTES = 1;

/** The code of one function. */
export interface StageAssets {
  /** Directory holding the function's bundle as `index.mjs` (handler `index.handler`). */
  readonly codeDir: string;
  /** Directory laid out as the function's layer: `bin/<tool>`, `lib/<addon>` (mounted at `/opt`). */
  readonly layerDir: string;
}

/** Properties of {@link KappLambdaStack}. */
export interface KappLambdaStackProps extends StackProps {
  /** Code and layer directory of every function. */
  readonly assets: Readonly<Record<PipelineStage, StageAssets>>;
  /**
   * Directory holding the dispatchers' bundle as `index.mjs` (`functions/dispatch/index.ts`, one
   * bundle for the five; no layer): used by `isolation: shared` only.
   */
  readonly dispatcherCodeDir: string;
  /** The instruction set the layers' tools were built for (the build host's). */
  readonly architecture: lambda.Architecture;
  /** Validated context values (`fleetSettings`). */
  readonly fleet: FleetSettings;
  /**
   * Default {@link registryClusterAccess} of the registry the fleet settings name. Another one
   * keeps the sender check only if its variables locate a registry (`KAPP_LAMBDA_CLUSTER_REGISTRY`,
   * where each cluster's forwarder is named): without one the stack creates no forwarder role
   * ({@link KappLambdaStack.senderCheck}).
   */
  readonly clusterAccess?: ClusterAccess;
  /**
   * Directory holding the fleet page's bundle as `index.mjs` (`functions/fleet-page/index.ts`):
   * when given, the stack adds the page behind a Function URL with `AuthType: AWS_IAM`
   * (`FleetPage`, `./fleet-page.ts`; the app gives it under context `fleetPage`). Default none.
   */
  readonly fleetPageCodeDir?: string;
}

/** The sender check's variables: the stack's alone, a {@link ClusterAccess} may not set them. */
const SENDER_CHECK_VARS = ['KAPP_LAMBDA_SENDER_CHECK', 'KAPP_LAMBDA_FUNCTION_SENDERS'] as const;

/** Where the fleet's cluster registry is: documents `<prefix>clusters/<id>.json` in `bucket`. */
export interface ClusterRegistryLocation {
  readonly bucket: s3.IBucket;
  /** `''` (the bucket root) or ending in `/`. */
  readonly prefix: string;
}

/**
 * What Lambda needs of a function's own role to place it in a VPC: the statements of AWS's
 * `AWSLambdaVPCAccessExecutionRole`, inline (a role the stack passes gets no managed policy from
 * Lambda, and the stack attaches none). EC2 names no network interface before it exists, and
 * its Describe calls take no resource: `*`, acknowledged.
 */
function grantVpcNetworking(role: iam.Role, stage: PipelineStage): void {
  role.addToPolicy(
    new iam.PolicyStatement({
      actions: [
        'ec2:CreateNetworkInterface',
        'ec2:DescribeNetworkInterfaces',
        'ec2:DescribeSubnets',
        'ec2:DeleteNetworkInterface',
        'ec2:AssignPrivateIpAddresses',
        'ec2:UnassignPrivateIpAddresses',
      ],
      resources: ['*'],
    }),
  );
  Validations.of(role).acknowledge({
    id: 'AwsSolutions-IAM5[Resource::*]',
    reason: `${stage} function in the fleet's VPC: Lambda creates and deletes its network interfaces, which have no name before they exist (AWSLambdaVPCAccessExecutionRole's statements).`,
  });
}

/**
 * The key policy statement CloudWatch Logs needs to encrypt this account's log groups with the
 * artifact key (context `logEncryption`): the service principal of the region, limited by the
 * encryption context to this stack's log groups (CloudFormation names them `<stack>-<id>-<suffix>`),
 * so no other log group of the account can use the key. Printed for an imported key's owner
 * (docs/aws.md).
 */
export function logsKeyStatement(
  partition: string,
  region: string,
  account: string,
  stackName: string,
): iam.PolicyStatement {
  return new iam.PolicyStatement({
    principals: [new iam.ServicePrincipal(`logs.${region}.amazonaws.com`)],
    actions: ['kms:Encrypt*', 'kms:Decrypt*', 'kms:ReEncrypt*', 'kms:GenerateDataKey*', 'kms:Describe*'],
    resources: ['*'],
    conditions: {
      ArnLike: {
        'kms:EncryptionContext:aws:logs:arn': `arn:${partition}:logs:${region}:${account}:log-group:${stackName}-*`,
      },
    },
  });
}

/**
 * The cluster source of the stack's functions: the fleet's cluster registry
 * (`functions/lib/kube/fleet-registry.ts`). Every function gets `KAPP_LAMBDA_CLUSTER_REGISTRY`
 * (`s3://<bucket>/<prefix>`), `s3:GetObject` on `<prefix>clusters/*` only (no list: the
 * functions read a cluster's document by its id), and `secretsmanager:GetSecretValue` on the
 * secrets of its own stage only ({@link tokenSecretPattern}, plus the 6 characters Secrets
 * Manager appends to a secret's ARN), for `token` clusters. An `eks` cluster needs no grant here:
 * its access entry maps the function's role (output `FunctionRoleArn<Stage>`: in
 * `isolation: shared` the dispatcher's role, which signs each run's token) to the group `kapp-lambda:<stage>`. Dispatched, the grant goes to the run
 * role (`role` is then no function's own). A cell's function (`clusterId` given) gets its cluster's document
 * (`<prefix>clusters/<id>.json`) and token secrets (`kapp-lambda/<id>/<stage>`) only.
 */
export function registryClusterAccess(stack: Stack, registry: ClusterRegistryLocation): ClusterAccess {
  return {
    environment: { KAPP_LAMBDA_CLUSTER_REGISTRY: `s3://${registry.bucket.bucketName}/${registry.prefix}` },
    grant(role, stage, clusterId) {
      const docs = `${registry.prefix}${clusterId === undefined ? `${CLUSTER_DOC_PREFIX}*` : clusterDocKey(clusterId)}`;
      role.addToPolicy(
        new iam.PolicyStatement({ actions: ['s3:GetObject'], resources: [registry.bucket.arnForObjects(docs)] }),
      );
      role.addToPolicy(
        new iam.PolicyStatement({
          actions: ['secretsmanager:GetSecretValue'],
          resources: [
            stack.formatArn({
              service: 'secretsmanager',
              resource: 'secret',
              resourceName: `${tokenSecretPattern(stage, clusterId)}-??????`,
              arnFormat: ArnFormat.COLON_RESOURCE_NAME,
            }),
          ],
        }),
      );
      // A cell's names no wildcard (`?` is none to cdk-nag): nothing to acknowledge.
      if (clusterId !== undefined) return;
      Validations.of(role).acknowledge({
        id: `AwsSolutions-IAM5[Resource::${bucketNagRef(stack, registry.bucket)}/${docs}]`,
        reason: `${stage} function: reads a cluster's registry document by its id; the ids are the fleet's clusters, registered after the deployment.`,
      });
      // cdk-nag spells an unresolved part as its pseudo parameter and a known one as itself: a
      // stack with an account and region (every `cdk deploy`) has them in the ARN.
      const nag = (v: string, pseudo: string) => (Token.isUnresolved(v) ? `<${pseudo}>` : v);
      const secretArn = `arn:${nag(stack.partition, 'AWS::Partition')}:secretsmanager:${nag(stack.region, 'AWS::Region')}:${nag(stack.account, 'AWS::AccountId')}`;
      Validations.of(role).acknowledge({
        id: `AwsSolutions-IAM5[Resource::${secretArn}:secret:${tokenSecretPattern(stage)}-??????]`,
        reason: `${stage} function: its own ServiceAccount token in each token cluster (kapp-lambda/<cluster id>/${stage}); the ids are registered after the deployment.`,
      });
    },
  };
}

/** The resources of one function, for tests and for other stacks to reference. */
export interface StageResources {
  readonly queue: sqs.Queue;
  readonly deadLetterQueue: sqs.Queue;
  readonly fn: lambda.Function;
  /**
   * The stage function's execution role: in a cell what the stage may do; dispatched (`isolation:
   * shared`) CloudWatch Logs only, since every run works with its {@link runRole}'s session.
   */
  readonly role: iam.Role;
  /** The dispatcher consuming {@link queue} (`isolation: shared`; docs/decisions.md D15). */
  readonly dispatcher?: lambda.Function;
  /** The dispatcher's execution role (`isolation: shared`). */
  readonly dispatcherRole?: iam.Role;
  /**
   * What a run of the stage may do, for any cluster (`isolation: shared`): assumable by
   * {@link dispatcherRole} only, which narrows each session to one cluster (`runSessionPolicy`).
   */
  readonly runRole?: iam.Role;
}

/**
 * One set of stage functions and what they alone use: the fleet's one set (`isolation: shared`)
 * or one cluster's cell (`isolation: cell`).
 */
export interface StageSet {
  /** Per function: its queue, dead-letter queue, function and role. */
  readonly stages: Readonly<Record<PipelineStage, StageResources>>;
  /** The artifact root key's secret the set's functions seal and open private artifacts with. */
  readonly rootKey: secretsmanager.Secret;
  /** Invokes the set's index-repo function with the source poll event every `sourcePollMinutes`. */
  readonly sourcePoll: scheduler.Schedule;
  /** The queues object events go to (`FORWARDER_STAGES`): what a forwarder may send to. */
  readonly entryQueues: readonly sqs.IQueue[];
}

/**
 * One cluster's cell (`isolation: cell`, {@link KappLambdaStack.addCell}): a {@link StageSet} whose
 * functions are told the cluster (`KAPP_LAMBDA_CELL_CLUSTER`) and whose roles read only its
 * registry document, its stage tokens and the cell's own root key.
 */
export interface Cell extends StageSet {
  readonly clusterId: string;
}

/** The kapp-lambda fleet deployment (see the module comment). */
export class KappLambdaStack extends Stack {
  /** Artifacts, render cache, repository indexes and state; SSE-KMS under {@link artifactKey}. */
  readonly bucket: s3.Bucket;
  /** Encrypts the bucket, the root-key secrets and the functions' variables. */
  readonly artifactKey: kms.IKey;
  /**
   * Whether the functions check who sent an event (`KAPP_LAMBDA_SENDER_CHECK=registry`,
   * docs/decisions.md D6): whenever their clusters come from a registry (the default cluster access always),
   * since the registry names each cluster's forwarder role. A cluster access without one (a
   * kubeconfig) cannot check: such a stack refuses every forwarder role
   * ({@link addClusterForwarder} throws), so no forwarder can send unchecked.
   */
  readonly senderCheck: boolean;
  /**
   * The fleet's send-only policy for forwarders (`sqs:SendMessage` on the entry queues, output
   * `ForwarderPolicyArn`): `npm run cluster -- join` attaches it to the role it creates per
   * cluster, so joining a cluster changes no template. Only in `isolation: shared` with the
   * sender check on (a cell's forwarder sends to its own queues: context `forwarders`).
   */
  readonly forwarderPolicy: iam.ManagedPolicy | undefined;
  /** Per cluster id, its forwarder's send-only role ({@link addClusterForwarder}; the way before `cluster join`). */
  readonly forwarderRoles: Record<string, iam.Role> = {};
  /** Where the functions read the fleet's cluster documents. */
  readonly clusterRegistry: ClusterRegistryLocation;
  /** Context `isolation`: one set of functions for the fleet, or one cell per cluster. */
  readonly isolation: IsolationMode;
  /** Per cluster id, its cell (`isolation: cell` only; {@link addCell}). */
  readonly cells: Record<string, Cell> = {};
  /** The fleet page behind its Function URL, when the props give its bundle (`fleetPageCodeDir`). */
  readonly fleetPage: FleetPage | undefined;
  /** The fleet's one set of functions (`isolation: shared` only). */
  readonly #shared: StageSet | undefined;
  /** The fleet's rollout check schedule (`isolation: shared` only). */
  readonly #rolloutCheck: scheduler.Schedule | undefined;
  /** One layer per function, mounted by every set's function of that stage (one upload). */
  readonly #layers: Record<PipelineStage, lambda.LayerVersion>;
  readonly #props: KappLambdaStackProps;
  readonly #clusterAccess: ClusterAccess;
  readonly #alarmAction: cwActions.SnsAction | undefined;
  /** Where every function runs (context `vpcId`), or `undefined`: outside any VPC. */
  readonly #vpc: Pick<lambda.FunctionProps, 'vpc' | 'vpcSubnets' | 'securityGroups'> | undefined;

  constructor(scope: Construct, id: string, props: KappLambdaStackProps) {
    super(scope, id, props);
    const { fleet } = props;
    this.#props = props;
    this.isolation = fleet.isolation;

    this.artifactKey = fleet.kmsKeyArn
      ? kms.Key.fromKeyArn(this, 'ArtifactKey', fleet.kmsKeyArn)
      : new kms.Key(this, 'ArtifactKey', {
          description: 'kapp-lambda: artifact bucket, artifact root key secret, function variables, log groups',
          enableKeyRotation: true,
        });
    if (fleet.logEncryption) {
      // CloudWatch Logs encrypts with the key itself, for this account's log groups only. An
      // imported key (`kmsKeyArn`) keeps its own policy: its owner adds this statement.
      this.artifactKey.addToResourcePolicy(logsKeyStatement(this.partition, this.region, this.account, this.stackName));
    }
    this.#vpc = fleet.vpc ? this.functionVpc(fleet.vpc) : undefined;

    this.bucket = new s3.Bucket(this, 'ArtifactBucket', {
      encryption: s3.BucketEncryption.KMS,
      encryptionKey: this.artifactKey,
      // One data key per bucket instead of a KMS call per object.
      bucketKeyEnabled: true,
      // No object under a customer's own key (SSE-C): a run could plant a shared blob's key with
      // one, and every other reader would be answered 400, not the object.
      blockedEncryptionTypes: [s3.BlockedEncryptionType.SSE_C],
      blockPublicAccess: s3.BlockPublicAccess.BLOCK_ALL,
      objectOwnership: s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
      enforceSSL: true,
      minimumTLSVersion: 1.2,
      // Counted from an object's last write (S3 has no "last read" rule). Safe to expire: every
      // stage treats a missing artifact or cache record as a miss (fetch and template `head` the
      // artifact a record names), which costs a re-fetch or re-render, never a wrong result. A
      // sealed object is written again on each use, so `private/` goes a day after its own TTL.
      // Receipts (`receipts/`) go with the artifacts they name (at most 20 per App are kept anyway).
      // Run leases (`state/leases/`) go 30 days after their last write: a held lease is renewed
      // every 100 s, so one that old is free (`LEASE_EXPIRY_DAYS`). In-flight markers
      // (`inflight/`) live seconds; a leftover goes after a day (`INFLIGHT_EXPIRY_DAYS`); a sharing
      // domain's (`d/<tag>/inflight/`) goes with `d/` (`EXPIRING_PREFIXES`: a lifecycle filter is a
      // literal prefix, and the tags are not known at synth). The rest of `state/` (a
      // repository's deployed versions) and the cluster registry are never expired
      // (`fleetSettings` refuses a registry prefix under an expiring one).
      lifecycleRules: [
        ...EXPIRING_PREFIXES.map((prefix) => ({
          id: `expire-${prefix.slice(0, -1)}`,
          prefix,
          expiration: Duration.days(prefix === 'private/' ? PRIVATE_EXPIRY_DAYS : fleet.artifactRetentionDays),
        })),
        { id: 'expire-leases', prefix: LEASE_PREFIX, expiration: Duration.days(LEASE_EXPIRY_DAYS) },
        { id: 'expire-inflight', prefix: INFLIGHT_PREFIX, expiration: Duration.days(INFLIGHT_EXPIRY_DAYS) },
        { id: 'abort-incomplete-uploads', abortIncompleteMultipartUploadAfter: Duration.days(1) },
      ],
    });
    Validations.of(this.bucket).acknowledge({
      id: 'AwsSolutions-S1',
      reason:
        'Server access logs would need a second bucket per deployment; the functions are its only writers ' +
        '(each role scoped to its prefixes) and CloudTrail S3 data events are the audit trail where one is wanted.',
    });

    this.clusterRegistry = {
      bucket: fleet.clusterRegistryBucket
        ? s3.Bucket.fromBucketName(this, 'ClusterRegistryBucket', fleet.clusterRegistryBucket)
        : this.bucket,
      prefix: fleet.clusterRegistryPrefix,
    };
    const clusterAccess = props.clusterAccess ?? registryClusterAccess(this, this.clusterRegistry);
    for (const v of SENDER_CHECK_VARS) {
      if (v in clusterAccess.environment) {
        throw new Error(
          `clusterAccess: ${v} is the stack's to set (the sender check is on whenever the functions read a cluster registry); remove it from the cluster access's environment`,
        );
      }
    }
    this.#clusterAccess = clusterAccess;
    this.senderCheck = Boolean(clusterAccess.environment.KAPP_LAMBDA_CLUSTER_REGISTRY);
    if (this.isolation === 'cell' && !this.senderCheck) {
      throw new Error(
        "isolation: cell: the stack's clusterAccess locates no cluster registry (no KAPP_LAMBDA_CLUSTER_REGISTRY), so a cell's functions cannot check that an event names their cluster (KAPP_LAMBDA_CELL_CLUSTER is part of KAPP_LAMBDA_SENDER_CHECK=registry)",
      );
    }

    this.#alarmAction = fleet.alarmTopicArn
      ? new cwActions.SnsAction(sns.Topic.fromTopicArn(this, 'AlarmTopic', fleet.alarmTopicArn))
      : undefined;
    this.#layers = Object.fromEntries(
      PIPELINE_STAGES.map((stage) => [
        stage,
        new lambda.LayerVersion(this, `${pascal(stage)}Layer`, {
          code: lambda.Code.fromAsset(props.assets[stage].layerDir),
          compatibleRuntimes: [FUNCTION_RUNTIME],
          compatibleArchitectures: [props.architecture],
          description: `kapp-lambda ${stage} tools`,
        }),
      ]),
    ) as Record<PipelineStage, lambda.LayerVersion>;

    if (this.isolation === 'shared') {
      this.#shared = this.stageSet(this, this.rootKeySecret(this));
      const installDispatcher = this.#shared.stages.install.dispatcher;
      if (installDispatcher) this.#rolloutCheck = this.rolloutCheckSchedule(installDispatcher);
      for (const stage of PIPELINE_STAGES) {
        new CfnOutput(this, `QueueUrl${pascal(stage)}`, {
          value: this.#shared.stages[stage].queue.queueUrl,
          description: `${queueUrlEnv(stage)} of the forwarders and functions`,
        });
        new CfnOutput(this, `FunctionRoleArn${pascal(stage)}`, {
          // The dispatcher's role: it signs each run's EKS token for the run's cluster only (D15).
          // Not the run role: a run session of one cluster could sign a token for any cluster
          // mapping that role.
          value: (this.#shared.stages[stage].dispatcherRole ?? this.#shared.stages[stage].role).roleArn,
          description: `the ${stage} stage's EKS identity (its dispatcher's role, which signs each run's token): an EKS access entry maps it to the group kapp-lambda:${stage}`,
        });
      }
    }
    if (this.#shared && this.senderCheck) {
      // Joining a cluster is a data change (`npm run cluster -- join`): the cluster's own role is
      // made outside the stack with this policy attached, so the template does not grow with the
      // fleet (CloudFormation: 500 resources, 200 outputs per stack).
      this.forwarderPolicy = new iam.ManagedPolicy(this, 'ForwarderPolicy', {
        description:
          'kapp-lambda forwarders: send object events to the entry queues (attached to each cluster forwarder role npm run cluster -- join creates)',
        statements: [
          new iam.PolicyStatement({
            actions: ['sqs:SendMessage'],
            resources: this.#shared.entryQueues.map((q) => q.queueArn),
          }),
        ],
      });
      new CfnOutput(this, 'ForwarderPolicyArn', {
        value: this.forwarderPolicy.managedPolicyArn,
        description:
          'the send-only policy npm run cluster -- join attaches to the forwarder role it creates per cluster',
      });
      new CfnOutput(this, 'Region', {
        value: this.region,
        description: "the fleet's region (the forwarders' AWS_REGION)",
      });
    }
    for (const [clusterId, f] of Object.entries(fleet.forwarders)) {
      if (this.isolation === 'cell') this.addCell(clusterId);
      this.addClusterForwarder(clusterId, podIdentityForwarder(this, f.eksClusterArn));
    }

    if (props.fleetPageCodeDir) {
      this.fleetPage = new FleetPage(this, 'FleetPage', {
        codeDir: props.fleetPageCodeDir,
        bucket: this.bucket,
        bucketKey: this.artifactKey,
        logGroup: this.functionLogs(this, 'FleetPageLogs'),
        runtime: FUNCTION_RUNTIME,
      });
      new CfnOutput(this, 'FleetPageUrl', {
        value: this.fleetPage.url.url,
        description: 'the fleet page (AuthType AWS_IAM: requests signed for the lambda service; docs/aws.md)',
      });
      new CfnOutput(this, 'FleetPageViewerPolicyArn', {
        value: this.fleetPage.viewerPolicy.managedPolicyArn,
        description: 'attach to whoever may view the fleet page (invokes its function through the URL only)',
      });
    }

    new CfnOutput(this, 'BucketName', { value: this.bucket.bucketName });
    new CfnOutput(this, 'ClusterRegistry', {
      value: `s3://${this.clusterRegistry.bucket.bucketName}/${this.clusterRegistry.prefix}`,
      description: 'the --registry of npm run cluster (KAPP_LAMBDA_CLUSTER_REGISTRY of the functions)',
    });
  }

  /**
   * The fleet's functions (`isolation: shared`): per function its queue, dead-letter queue,
   * function and role.
   * @throws Error in `isolation: cell`, which has one set per cluster ({@link cells}).
   */
  get stages(): Readonly<Record<PipelineStage, StageResources>> {
    return this.sharedSet().stages;
  }

  /**
   * The fleet source poll's schedule (`isolation: shared`).
   * @throws Error in `isolation: cell`, where each cell has its own ({@link cells}).
   */
  get sourcePoll(): scheduler.Schedule {
    return this.sharedSet().sourcePoll;
  }

  /**
   * The fleet rollout check's schedule (`isolation: shared`): invokes the install dispatcher with
   * the rollout check event every {@link ROLLOUT_CHECK_MINUTES}.
   * @throws Error in `isolation: cell`, which has none (a cell's installs are not gated).
   */
  get rolloutCheck(): scheduler.Schedule {
    if (!this.#rolloutCheck) throw new Error("isolation: cell: no rollout check (a cell's installs are not gated)");
    return this.#rolloutCheck;
  }

  private sharedSet(): StageSet {
    if (!this.#shared) throw new Error('isolation: cell: the stack has one set of functions per cluster (cells)');
    return this.#shared;
  }

  /**
   * Adds one cluster's cell (`isolation: cell`; context `forwarders` adds one per key): under the
   * construct `Cell<Id>` its own artifact root key secret and a {@link StageSet} whose functions
   * get `KAPP_LAMBDA_CELL_CLUSTER=<clusterId>` and whose roles read only that cluster's registry
   * document and stage tokens (`kapp-lambda/<clusterId>/<stage>`), the cell's root key, and of
   * the per-cluster prefixes of the bucket (`PER_CLUSTER_PREFIXES` of `./stages.ts`) that cluster's only.
   * The bucket, its KMS key and the layers stay the stack's. Outputs `QueueUrl<Stage><Id>` and
   * `FunctionRoleArn<Stage><Id>` (what `npm run cluster -- add <clusterId> --function-role` takes).
   *
   * @throws Error when the stack's isolation is not `cell`, the id is not a DNS-1123 label, or
   *   it already has a cell.
   */
  addCell(clusterId: string): Cell {
    if (this.isolation !== 'cell') throw new Error(`cell: ${clusterId}: the stack's isolation is shared`);
    if (!CLUSTER_ID_PATTERN.test(clusterId)) throw new Error(`cell: ${clusterId} is not a DNS-1123 label`);
    if (this.cells[clusterId]) throw new Error(`cell: ${clusterId} already has one`);
    const id = pascal(clusterId);
    const scope = new Construct(this, `Cell${id}`);
    const cell: Cell = { clusterId, ...this.stageSet(scope, this.rootKeySecret(scope, clusterId), clusterId) };
    this.cells[clusterId] = cell;
    for (const stage of PIPELINE_STAGES) {
      new CfnOutput(this, `QueueUrl${pascal(stage)}${id}`, {
        value: cell.stages[stage].queue.queueUrl,
        description: `${queueUrlEnv(stage)} of cluster ${clusterId}'s forwarder and cell`,
      });
      new CfnOutput(this, `FunctionRoleArn${pascal(stage)}${id}`, {
        value: cell.stages[stage].role.roleArn,
        description: `the ${stage} function's identity in cluster ${clusterId} (npm run cluster -- add ${clusterId} --function-role ${stage}=<this>)`,
      });
    }
    return cell;
  }

  /**
   * The VPC placement of every function (context `vpcId`, `subnetIds`, `securityGroupIds`),
   * imported by id: synth makes no lookup. Without security groups, one with all egress (API
   * servers, sources, AWS endpoints) and no ingress (nothing calls a function over the network).
   */
  private functionVpc(v: FleetVpc): Pick<lambda.FunctionProps, 'vpc' | 'vpcSubnets' | 'securityGroups'> {
    const vpc = ec2.Vpc.fromVpcAttributes(this, 'FunctionVpc', { vpcId: v.vpcId, availabilityZones: Fn.getAzs() });
    const securityGroups =
      v.securityGroupIds.length > 0
        ? v.securityGroupIds.map((id, i) =>
            ec2.SecurityGroup.fromSecurityGroupId(this, `FunctionSecurityGroup${i}`, id),
          )
        : [
            new ec2.SecurityGroup(this, 'FunctionSecurityGroup', {
              vpc,
              description: 'kapp-lambda functions: egress to API servers, sources and AWS endpoints; no ingress',
              allowAllOutbound: true,
            }),
          ];
    return {
      vpc,
      vpcSubnets: { subnets: v.subnetIds.map((id, i) => ec2.Subnet.fromSubnetId(this, `FunctionSubnet${i}`, id)) },
      securityGroups,
    };
  }

  /** The artifact root key's secret of the fleet (`clusterId` unset) or of one cluster's cell. */
  private rootKeySecret(scope: Construct, clusterId?: string): secretsmanager.Secret {
    const rootKey = new secretsmanager.Secret(scope, 'ArtifactRootKey', {
      description:
        clusterId === undefined
          ? 'kapp-lambda artifact root key: root of the per-cluster keys sealing private artifacts'
          : `kapp-lambda artifact root key of cluster ${clusterId}'s cell: root of the keys sealing its private artifacts`,
      encryptionKey: this.artifactKey,
      // 64 characters of [A-Za-z0-9] are valid base64 of 48 bytes (about 381 bits of entropy),
      // what `rootKeyFromBase64` accepts (at least 32 bytes).
      generateSecretString: { passwordLength: 64, excludePunctuation: true, includeSpace: false },
    });
    Validations.of(rootKey).acknowledge({
      id: 'AwsSolutions-SMG4',
      reason:
        'Rotating the artifact root key would make every sealed artifact unreadable at once (they are ' +
        'rebuilt on the next miss, but all at the same time); the keyring has no key versions yet.',
    });
    return rootKey;
  }

  /**
   * One set of stage functions under `scope` (the stack: the fleet's, with the construct ids of
   * before cells existed; a cell's construct): queues, roles, functions, alarms, source poll.
   * The fleet's set (no `clusterId`) is dispatched (docs/decisions.md D15): per stage a
   * dispatcher consumes the queue and invokes the stage function per cluster with a session of
   * the stage's run role; a cell's functions consume their queues themselves.
   */
  private stageSet(scope: Construct, rootKey: secretsmanager.Secret, clusterId?: string): StageSet {
    const dispatched = clusterId === undefined;
    const queues = Object.fromEntries(
      PIPELINE_STAGES.map((stage) => [stage, this.stageQueues(scope, stage, dispatched)]),
    ) as Record<PipelineStage, { queue: sqs.Queue; deadLetterQueue: sqs.Queue }>;
    const lambdaRole = (id: string, description: string) =>
      // An own role instead of the default one: the default attaches AWSLambdaBasicExecutionRole,
      // whose log statements name every log group of the account.
      new iam.Role(scope, id, { assumedBy: new iam.ServicePrincipal('lambda.amazonaws.com'), description });
    const perStage = <T>(f: (stage: PipelineStage) => T) =>
      Object.fromEntries(PIPELINE_STAGES.map((stage) => [stage, f(stage)])) as Record<PipelineStage, T>;
    // Every role before any function: a function's variables name the roles that send to it.
    const roles = perStage((stage) =>
      lambdaRole(
        `${pascal(stage)}Role`,
        `kapp-lambda ${stage} function${ofCell(clusterId)}${dispatched ? ': logs only, each run works with a session of its run role' : ''}`,
      ),
    );
    const dispatch = dispatched
      ? perStage((stage) => {
          const dispatcherRole = lambdaRole(
            `${pascal(stage)}DispatcherRole`,
            `kapp-lambda ${stage} dispatcher: consumes the ${stage} queue, invokes the ${stage} function per cluster`,
          );
          const runRole = new iam.Role(scope, `${pascal(stage)}RunRole`, {
            assumedBy: dispatcherRole,
            // A session outlives the longest stage run (the dispatcher keeps one per cluster until
            // 20 minutes before it expires, `RUN_SESSION_REFRESH_MS`).
            maxSessionDuration: Duration.hours(1),
            description: `kapp-lambda ${stage} runs: what a ${stage} run may do for any cluster; each session (named by its cluster id) is narrowed to one cluster`,
          });
          return { dispatcherRole, runRole };
        })
      : undefined;
    const stages = {} as Record<PipelineStage, StageResources>;
    for (const stage of PIPELINE_STAGES) {
      const { fn, role } = this.stageFunction(scope, stage, { rootKey, queues, roles, dispatch }, clusterId);
      stages[stage] = {
        ...queues[stage],
        fn,
        role,
        ...(dispatch
          ? {
              ...dispatch[stage],
              dispatcher: this.dispatcherFunction(scope, stage, fn, { rootKey, queues, dispatch }),
            }
          : {}),
      };
      for (const alarm of this.stageAlarms(scope, stage, stages[stage], clusterId)) {
        if (this.#alarmAction) alarm.addAlarmAction(this.#alarmAction);
      }
    }
    return {
      stages,
      rootKey,
      sourcePoll: this.sourcePollSchedule(
        scope,
        stages['index-repo'].dispatcher ?? stages['index-repo'].fn,
        this.#props.fleet.sourcePollMinutes,
        clusterId,
      ),
      entryQueues: FORWARDER_STAGES.map((st) => queues[st].queue),
    };
  }
  /**
   * The fleet source poll (`functions/lib/pipeline/source-poll.ts`): an EventBridge Scheduler
   * schedule invoking the index-repo dispatcher (a cell's: its index-repo function) with `{"type":"dev.kapp-lambda.source.poll.v1"}`
   * every `minutes` ({@link invokeSchedule}). A cell's function pokes its own cluster's members only.
   */
  private sourcePollSchedule(
    scope: Construct,
    fn: lambda.Function,
    minutes: number,
    clusterId?: string,
  ): scheduler.Schedule {
    return this.invokeSchedule(scope, {
      id: 'SourcePoll',
      name: 'source poll',
      fn,
      target: `${pollTarget(clusterId)}${ofCell(clusterId)}`,
      minutes,
      type: SOURCE_POLL_EVENT_TYPE,
    });
  }

  /**
   * The fleet rollout check (issue 28, `isolation: shared` only): an EventBridge Scheduler
   * schedule invoking the install dispatcher with `{"type":"dev.kapp-lambda.rollout.check.v1"}`
   * every {@link ROLLOUT_CHECK_MINUTES} ({@link invokeSchedule}): it evaluates the moving rollouts
   * and pokes their PackageInstalls, for what no install run reports (a pause, resume or abort
   * written by the CLI; a soak that ended with no event after it). Cells have none: their
   * installs are not gated by rollouts.
   */
  private rolloutCheckSchedule(installDispatcher: lambda.Function): scheduler.Schedule {
    return this.invokeSchedule(this, {
      id: 'RolloutCheck',
      name: 'rollout check',
      fn: installDispatcher,
      target: 'install dispatcher',
      minutes: ROLLOUT_CHECK_MINUTES,
      type: ROLLOUT_CHECK_EVENT_TYPE,
    });
  }

  /**
   * An EventBridge Scheduler schedule `<id>Schedule` invoking `fn` with the constant input
   * `{"type": <type>}` every `minutes`, through a role `<id>Role` that the scheduler of this
   * account assumes and that may invoke that function only. No retry: a failed invocation is the
   * next period's (a retry would land beside it); the function's own asynchronous retries are
   * off for the same reason (`configureAsyncInvoke`, once per function: one schedule each).
   */
  private invokeSchedule(
    scope: Construct,
    s: {
      readonly id: string;
      /** What it runs, in descriptions: `source poll`. */
      readonly name: string;
      readonly fn: lambda.Function;
      /** The function, in descriptions: `index-repo dispatcher`. */
      readonly target: string;
      readonly minutes: number;
      readonly type: string;
    },
  ): scheduler.Schedule {
    const { fn, minutes } = s;
    fn.configureAsyncInvoke({ retryAttempts: 0, maxEventAge: Duration.minutes(Math.max(minutes, 1)) });
    // The scheduler of this account, for schedules of its default group (this one's).
    const role = new iam.Role(scope, `${s.id}Role`, {
      description: `kapp-lambda ${s.name} schedule: invokes the ${s.target}`,
      assumedBy: new iam.ServicePrincipal('scheduler.amazonaws.com', {
        conditions: {
          StringEquals: {
            'aws:SourceAccount': this.account,
            'aws:SourceArn': this.formatArn({
              service: 'scheduler',
              resource: 'schedule-group',
              resourceName: 'default',
            }),
          },
        },
      }),
    });
    // `LambdaInvoke` grants through `grantInvoke`: the function and its versions and aliases.
    Validations.of(role).acknowledge({
      id: `AwsSolutions-IAM5[Resource::<${this.resolve(this.getLogicalId(fn.node.defaultChild as lambda.CfnFunction))}.Arn>:*]`,
      reason: `The ${s.target} and its versions and aliases (what grantInvoke names); no other function, no other action.`,
    });
    return new scheduler.Schedule(scope, `${s.id}Schedule`, {
      description: `kapp-lambda: the fleet ${s.name} (${s.target})`,
      schedule: scheduler.ScheduleExpression.rate(Duration.minutes(minutes)),
      target: new schedulerTargets.LambdaInvoke(fn, {
        input: scheduler.ScheduleTargetInput.fromObject({ type: s.type }),
        role,
        retryAttempts: 0,
        maxEventAge: Duration.minutes(Math.max(minutes, 1)),
      }),
    });
  }

  /**
   * The FIFO queue of a function and its FIFO dead-letter queue. The visibility timeout is its
   * consumer's timeout (the stage's dispatcher when `dispatched`) and a margin: Lambda refuses an
   * event source mapping whose queue would show a record again before its function times out.
   */
  private stageQueues(
    scope: Construct,
    stage: PipelineStage,
    dispatched: boolean,
  ): { queue: sqs.Queue; deadLetterQueue: sqs.Queue } {
    const id = pascal(stage);
    const deadLetterQueue = new sqs.Queue(scope, `${id}DeadLetterQueue`, {
      fifo: true,
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      retentionPeriod: Duration.days(14),
    });
    const queue = new sqs.Queue(scope, `${id}Queue`, {
      fifo: true,
      // The senders set MessageDeduplicationId (the event id) and MessageGroupId (the object).
      contentBasedDeduplication: false,
      // High-throughput FIFO: the fleet's objects are many groups, each ordered on its own.
      deduplicationScope: sqs.DeduplicationScope.MESSAGE_GROUP,
      fifoThroughputLimit: sqs.FifoThroughputLimit.PER_MESSAGE_GROUP_ID,
      // Events are references, not secrets: SSE-SQS, so senders need no KMS grant.
      encryption: sqs.QueueEncryption.SQS_MANAGED,
      enforceSSL: true,
      visibilityTimeout: Duration.seconds(
        (dispatched ? dispatcherTimeoutSeconds(stage) : STAGE_SIZING[stage].timeoutSeconds) + VISIBILITY_MARGIN_SECONDS,
      ),
      // The last receive is the one that writes the final failed status (`retry-bound.ts`), so
      // the redrive count and `KAPP_LAMBDA_MAX_RECEIVE_COUNT` are the same number.
      deadLetterQueue: { queue: deadLetterQueue, maxReceiveCount: DEFAULT_MAX_ATTEMPTS },
    });
    return { queue, deadLetterQueue };
  }

  /**
   * A function, its role (least privilege), its log group and its event source mapping; in a
   * cell (`clusterId`) told its cluster (`KAPP_LAMBDA_CELL_CLUSTER`) and granted that one's only.
   * Dispatched (`set.dispatch`, the shared mode): no event source mapping, tenant isolation per
   * cluster (`TenancyConfig.PER_TENANT`, the dispatcher's `TenantId` is the cluster id),
   * `KAPP_LAMBDA_DISPATCHED=true`, none of the edge's variables (sender check, shares, the root
   * key), and a role with logs only: what the stage may do is its run role's, granted here.
   */
  private stageFunction(
    scope: Construct,
    stage: PipelineStage,
    set: {
      rootKey: secretsmanager.Secret;
      queues: Record<PipelineStage, { queue: sqs.Queue }>;
      roles: Record<PipelineStage, iam.Role>;
      dispatch: Record<PipelineStage, { dispatcherRole: iam.Role; runRole: iam.Role }> | undefined;
    },
    clusterId?: string,
  ): { fn: lambda.Function; role: iam.Role } {
    const { rootKey, queues, roles, dispatch } = set;
    const dispatched = dispatch !== undefined;
    const props = this.#props;
    const id = pascal(stage);
    const sizing = STAGE_SIZING[stage];
    const logGroup = this.functionLogs(scope, `${id}Logs`);
    const role = roles[stage];
    logGroup.grantWrite(role);
    // The role that acts for the stage: its run role when dispatched, else the function's own.
    const actor = dispatch?.[stage].runRole ?? role;
    // The queues a run sends to: dispatched, the hand-offs and follow-ups only (the dispatcher
    // sends the postponed copies to its own queue, `requeue` of the stage's answer).
    const runQueues = dispatched ? [...(NEXT_STAGES[stage] ?? [])] : sendQueues(stage);

    const timeout = toolTimeoutMs(stage, dispatched);
    const fn = new lambda.Function(scope, `${id}Function`, {
      description: `kapp-lambda ${stage}${ofCell(clusterId)}${dispatched ? ' (invoked by its dispatcher, one tenant per cluster)' : ''}`,
      runtime: FUNCTION_RUNTIME,
      architecture: props.architecture,
      handler: 'index.handler',
      code: lambda.Code.fromAsset(props.assets[stage].codeDir),
      layers: [this.#layers[stage]],
      role,
      logGroup,
      memorySize: sizing.memoryMiB,
      ephemeralStorageSize: Size.mebibytes(sizing.ephemeralMiB),
      timeout: Duration.seconds(stageTimeoutSeconds(stage, dispatched)),
      // One cluster per execution environment: what a run leaves behind (memory, /tmp, a process)
      // is never seen by another cluster's run (docs/decisions.md D15). Replaces the function.
      ...(dispatched ? { tenancyConfig: lambda.TenancyConfig.PER_TENANT } : {}),
      ...(props.fleet.reservedConcurrency[stage] === undefined
        ? {}
        : { reservedConcurrentExecutions: props.fleet.reservedConcurrency[stage] }),
      ...this.#vpc,
      environmentEncryption: this.artifactKey,
      environment: {
        KAPP_LAMBDA_BUCKET: this.bucket.bucketName,
        // The queues it sends to, in a cell its own among them: it deletes the records it handled
        // while others of the batch still run (the mapping's consume grant holds `sqs:DeleteMessage`).
        ...Object.fromEntries(runQueues.map((q) => [queueUrlEnv(q), queues[q].queue.queueUrl])),
        KAPP_LAMBDA_RECORD_CONCURRENCY: String(sizing.recordConcurrency),
        // Install runs no tool: nothing for tool versions to key (`parseLambdaEnv` allows none).
        ...(STAGE_TOOLS[stage].length === 0
          ? {}
          : { KAPP_LAMBDA_TOOL_VERSIONS: JSON.stringify(layerToolVersions(stage)) }),
        ...(timeout === undefined ? {} : { KAPP_LAMBDA_TOOL_TIMEOUT_MS: String(timeout) }),
        KAPP_LAMBDA_MAX_RECEIVE_COUNT: String(DEFAULT_MAX_ATTEMPTS),
        ...this.#clusterAccess.environment,
        ...(dispatched
          ? { KAPP_LAMBDA_DISPATCHED: 'true', ...this.sharingEnvironment() }
          : this.edgeEnvironment(stage, rootKey, functionSenders(stage), roles)),
        // The fleet's cut of an App's long or unlimited deploy wait.
        ...(stage === 'deploy'
          ? { KAPP_LAMBDA_MAX_DEPLOY_WAIT_SECONDS: String(props.fleet.maxDeployWaitMinutes * 60) }
          : {}),
        // A cell's one cluster: the sender check refuses an event naming any other.
        ...(clusterId === undefined ? {} : { KAPP_LAMBDA_CELL_CLUSTER: clusterId }),
        // The fleet's URL policy exceptions, where the policy checks something (validated at synth).
        ...((URL_POLICY_STAGES as readonly PipelineStage[]).includes(stage) && props.fleet.urlAllow.length > 0
          ? { KAPP_LAMBDA_URL_ALLOW: props.fleet.urlAllow.join(',') }
          : {}),
      },
    });
    if (dispatched) {
      // Logs, and Lambda's decryption of the function's own variables (`environmentEncryption`).
      this.grantKeyVia(role, ['lambda']);
    } else {
      this.grantRootKey(stage, role, rootKey);
      fn.addEventSource(
        new lambdaEvents.SqsEventSource(queues[stage].queue, {
          batchSize: sizing.batchSize,
          reportBatchItemFailures: true,
          maxConcurrency: props.fleet.concurrency[stage],
        }),
      );
    }
    for (const next of runQueues) {
      actor.addToPolicy(
        new iam.PolicyStatement({ actions: ['sqs:SendMessage'], resources: [queues[next].queue.queueArn] }),
      );
    }
    const grants = dispatched
      ? runRoleObjects(stage, props.fleet.sharing)
      : clusterId === undefined
        ? STAGE_OBJECTS[stage]
        : cellObjectGrants(stage, clusterId);
    // The run role is no function's execution role: no key through Lambda nor the root key's secret.
    this.grantObjects(
      `${stage} ${dispatched ? 'run role' : 'function'}`,
      actor,
      grants,
      dispatched ? [] : ['lambda', ...(usesArtifactKey(stage) ? ['secretsmanager'] : [])],
    );
    this.#clusterAccess.grant(actor, stage, clusterId);
    if (this.#vpc) grantVpcNetworking(role, stage);

    return { fn, role };
  }

  /**
   * What the edge of a queue needs, the function that consumes it (a cell's stage function, or
   * a stage's dispatcher): its fair shares, the sender check (`KAPP_LAMBDA_FUNCTION_SENDERS`:
   * `<function>=<role id>` of each of `senders`, by `senderRoles`: an event naming any cluster is
   * taken from those roles, each only for what its function sends, `EMITS` of
   * functions/lib/entry/sender.ts; every other sender must be the cluster's forwarder), and the
   * artifact root key's secret (its ARN, never its value, readable with
   * lambda:GetFunctionConfiguration; read at cold start) for the stages that seal or open private
   * artifacts (not install).
   */
  private edgeEnvironment(
    stage: PipelineStage,
    rootKey: secretsmanager.Secret,
    senders: readonly PipelineStage[],
    senderRoles: Record<PipelineStage, iam.Role>,
  ): Record<string, string> {
    const fleet = this.#props.fleet;
    const ids = senders.flatMap((s, i) => [`${i === 0 ? '' : ','}${s}=`, senderRoles[s].roleId]);
    return {
      // Its fair shares of its slots per cluster and namespace (context clusterShare, namespaceShare).
      KAPP_LAMBDA_CLUSTER_SHARE: String(fleet.clusterShare[stage]),
      KAPP_LAMBDA_NAMESPACE_SHARE: String(fleet.namespaceShare[stage]),
      ...(this.senderCheck ? { KAPP_LAMBDA_SENDER_CHECK: 'registry' } : {}),
      ...(this.senderCheck && ids.length > 0 ? { KAPP_LAMBDA_FUNCTION_SENDERS: Fn.join('', ids) } : {}),
      ...this.unkeyedGroupsEnvironment(),
      ...(usesArtifactKey(stage) ? { [ARTIFACT_ROOT_KEY_SECRET_ENV]: rootKey.secretArn } : {}),
    };
  }

  /**
   * `KAPP_LAMBDA_SHARING=cluster` under context `sharing` `cluster` (docs/decisions.md D17), for a
   * dispatched stage function (its store keeps the claims under `d/<tag>/`) and its dispatcher (the
   * run sessions grant that domain); nothing under `fleet`, the functions' default.
   */
  private sharingEnvironment(): Record<string, string> {
    return this.#props.fleet.sharing === 'cluster' ? { KAPP_LAMBDA_SHARING: 'cluster' } : {};
  }

  /** `KAPP_LAMBDA_UNKEYED_GROUPS=accept` under context `unkeyedGroups` `accept` (an upgrade's window), for whoever checks records. */
  private unkeyedGroupsEnvironment(): Record<string, string> {
    return this.#props.fleet.unkeyedGroups === 'accept' ? { KAPP_LAMBDA_UNKEYED_GROUPS: 'accept' } : {};
  }

  /** `secretsmanager:GetSecretValue` on the artifact root key's secret, for the stages that {@link usesArtifactKey}. */
  private grantRootKey(stage: PipelineStage, role: iam.Role, rootKey: secretsmanager.Secret): void {
    // That one secret (its CMK, the artifact key, through Secrets Manager: `grantObjects`).
    if (usesArtifactKey(stage)) {
      role.addToPolicy(
        new iam.PolicyStatement({ actions: ['secretsmanager:GetSecretValue'], resources: [rootKey.secretArn] }),
      );
    }
  }

  /** A function's log group (retention and encryption of the fleet settings). */
  private functionLogs(scope: Construct, id: string): logs.LogGroup {
    const fleet = this.#props.fleet;
    return new logs.LogGroup(scope, id, {
      retention: fleet.logRetentionDays as logs.RetentionDays,
      ...(fleet.logEncryption ? { encryptionKey: this.artifactKey } : {}),
    });
  }

  /**
   * The dispatcher of one stage (`isolation: shared`, docs/decisions.md D15;
   * `functions/dispatch/index.ts`): consumes the stage's queue (the event source mapping the
   * stage function had), does the edge's work per record (record proof, sender check, fair
   * share, early deletes, the requeue of what the stage held at its deadline) and invokes the
   * stage function per cluster with a session of the stage's run role narrowed to that cluster,
   * named by its id. Runs no tool (no layer), outside the fleet's VPC (it calls AWS APIs only);
   * 128 MiB, arm64, its stage's timeout + 30 s (`dispatcherTimeoutSeconds`). Its role: its queue
   * (receive, delete, change visibility, send to itself), the registry's documents (read), the
   * keys of `dispatcherObjects` (its stage's fair shares; index-repo's source poll records, read;
   * fetch's and index-repo's poll members of cluster sharing, `state/poll-members/`),
   * the artifact root key's secret (stages that seal; it derives the run's keys),
   * `sts:AssumeRole` on the run role and `lambda:InvokeFunction` on the stage function, nothing else.
   */
  private dispatcherFunction(
    scope: Construct,
    stage: PipelineStage,
    stageFn: lambda.Function,
    set: {
      rootKey: secretsmanager.Secret;
      queues: Record<PipelineStage, { queue: sqs.Queue }>;
      dispatch: Record<PipelineStage, { dispatcherRole: iam.Role; runRole: iam.Role }>;
    },
  ): lambda.Function {
    const { rootKey, queues, dispatch } = set;
    const props = this.#props;
    const id = `${pascal(stage)}Dispatcher`;
    const { dispatcherRole: role, runRole } = dispatch[stage];
    const queue = queues[stage].queue;
    const logGroup = this.functionLogs(scope, `${id}Logs`);
    logGroup.grantWrite(role);
    const runRoles = Object.fromEntries(PIPELINE_STAGES.map((s) => [s, dispatch[s].runRole])) as Record<
      PipelineStage,
      iam.Role
    >;
    const fn = new lambda.Function(scope, id, {
      description: `kapp-lambda ${stage} dispatcher: the ${stage} queue's edge checks, then the ${stage} function per cluster`,
      runtime: FUNCTION_RUNTIME,
      architecture: lambda.Architecture.ARM_64,
      handler: 'index.handler',
      code: lambda.Code.fromAsset(props.dispatcherCodeDir),
      role,
      logGroup,
      memorySize: DISPATCHER_MEMORY_MIB,
      timeout: Duration.seconds(dispatcherTimeoutSeconds(stage)),
      environmentEncryption: this.artifactKey,
      environment: {
        KAPP_LAMBDA_DISPATCH_STAGE: stage,
        KAPP_LAMBDA_RUN_ROLE_ARN: runRole.roleArn,
        KAPP_LAMBDA_STAGE_FUNCTION: stageFn.functionArn,
        // Its own role: the sender of the copies it sends back to its queue (the sender check's receiver).
        KAPP_LAMBDA_RECEIVER_ROLE_ID: role.roleId,
        KAPP_LAMBDA_BUCKET: this.bucket.bucketName,
        [queueUrlEnv(stage)]: queue.queueUrl,
        KAPP_LAMBDA_MAX_RECEIVE_COUNT: String(DEFAULT_MAX_ATTEMPTS),
        ...this.#clusterAccess.environment,
        // The runs that send to this queue: a stage run's SenderId is `<run role id>:<cluster id>`.
        ...this.edgeEnvironment(stage, rootKey, runSenders(stage), runRoles),
        // Its run sessions grant each cluster its sharing domain (`runSessionPolicy`).
        ...this.sharingEnvironment(),
        ...this.unkeyedGroupsEnvironment(),
      },
    });
    fn.addEventSource(
      new lambdaEvents.SqsEventSource(queue, {
        batchSize: STAGE_SIZING[stage].batchSize,
        reportBatchItemFailures: true,
        maxConcurrency: props.fleet.concurrency[stage],
      }),
    );
    role.addToPolicy(new iam.PolicyStatement({ actions: ['sqs:SendMessage'], resources: [queue.queueArn] }));
    role.addToPolicy(new iam.PolicyStatement({ actions: ['sts:AssumeRole'], resources: [runRole.roleArn] }));
    role.addToPolicy(new iam.PolicyStatement({ actions: ['lambda:InvokeFunction'], resources: [stageFn.functionArn] }));
    this.grantRootKey(stage, role, rootKey);
    // The registry's documents: the sender check reads a cluster's forwarder there.
    if (this.senderCheck) {
      const registry = this.clusterRegistry;
      const docs = `${registry.prefix}${CLUSTER_DOC_PREFIX}*`;
      role.addToPolicy(
        new iam.PolicyStatement({ actions: ['s3:GetObject'], resources: [registry.bucket.arnForObjects(docs)] }),
      );
      Validations.of(role).acknowledge({
        id: `AwsSolutions-IAM5[Resource::${bucketNagRef(this, registry.bucket)}/${docs}]`,
        reason: `${stage} dispatcher: reads a cluster's registry document by its id (its forwarder, for the sender check); the ids are registered after the deployment.`,
      });
    }
    this.grantObjects(`${stage} dispatcher`, role, dispatcherObjects(stage), [
      'lambda',
      ...(usesArtifactKey(stage) ? ['secretsmanager'] : []),
    ]);
    return fn;
  }

  /**
   * `kms:Decrypt` of the artifact key through `services` only (`lambda`: the function's own
   * variables; `secretsmanager`: the artifact root key's secret; `s3`: the bucket's objects).
   */
  private grantKeyVia(role: iam.Role, services: readonly string[]): void {
    role.addToPolicy(
      new iam.PolicyStatement({
        actions: ['kms:Decrypt'],
        resources: [this.artifactKey.keyArn],
        conditions: { StringEquals: { 'kms:ViaService': services.map((s) => `${s}.${this.region}.amazonaws.com`) } },
      }),
    );
  }

  /**
   * The artifact bucket for one stage's `grants` (`STAGE_OBJECTS`, a cell's `cellObjectGrants`,
   * a run role's `runRoleObjects`, a dispatcher's `dispatcherObjects`), `s3:ListBucket` (without
   * it S3 answers 403 rather than 404 for a missing key, and every cache miss would fail as an
   * access error), and the artifact key through S3 and the `keyVia` services (`lambda` for a
   * function's variables, `secretsmanager` for the artifact root key's secret). No grant gets
   * neither, but the key through S3 when the cluster registry is in this bucket (its documents
   * are encrypted with it too).
   */
  private grantObjects(who: string, role: iam.Role, grants: readonly ObjectGrant[], keyVia: readonly string[]): void {
    const bucketId = this.resolve(this.getLogicalId(this.bucket.node.defaultChild as s3.CfnBucket));
    if (grants.length > 0) {
      for (const g of grants) {
        const resources = [this.bucket.arnForObjects(g.keys)];
        // Create-only keys: PutObject only with If-None-Match (AWS's documented form), no overwrite.
        const put = g.createOnly && g.actions.includes('s3:PutObject');
        const rest = put ? g.actions.filter((a) => a !== 's3:PutObject') : g.actions;
        if (rest.length > 0) role.addToPolicy(new iam.PolicyStatement({ actions: [...rest], resources }));
        if (put) {
          role.addToPolicy(
            new iam.PolicyStatement({
              actions: ['s3:PutObject'],
              resources,
              conditions: { Null: { 's3:if-none-match': 'false' } },
            }),
          );
        }
        // cdk-nag reports each object ARN ending in a wildcard; the wildcard is the prefix's keys
        // (content digests, per-cluster tags), the actions are named: acknowledged one by one.
        Validations.of(role).acknowledge({
          id: `AwsSolutions-IAM5[Resource::<${bucketId}.Arn>/${g.keys}]`,
          reason: `${who}, ${g.why}: the keys under the prefix are digests and per-cluster tags, not known in advance.`,
        });
      }
      role.addToPolicy(new iam.PolicyStatement({ actions: ['s3:ListBucket'], resources: [this.bucket.bucketArn] }));
    }
    const writes = grants.some((g) => g.actions.includes('s3:PutObject'));
    const viaS3 = grants.length > 0 || this.clusterRegistry.bucket === this.bucket;
    const services = [...(viaS3 ? ['s3'] : []), ...keyVia];
    if (services.length > 0) this.grantKeyVia(role, services);
    if (writes) {
      role.addToPolicy(
        new iam.PolicyStatement({
          actions: ['kms:GenerateDataKey'],
          resources: [this.artifactKey.keyArn],
          conditions: { StringEquals: { 'kms:ViaService': `s3.${this.region}.amazonaws.com` } },
        }),
      );
    }
  }

  /** Alarms: a message in the dead-letter queue, and any function (or dispatcher) error, over 5 minutes. */
  private stageAlarms(
    scope: Construct,
    stage: PipelineStage,
    r: StageResources,
    clusterId?: string,
  ): cloudwatch.Alarm[] {
    const id = pascal(stage);
    const common = {
      threshold: 1,
      evaluationPeriods: 1,
      comparisonOperator: cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
      treatMissingData: cloudwatch.TreatMissingData.NOT_BREACHING,
    };
    return [
      new cloudwatch.Alarm(scope, `${id}DeadLetterAlarm`, {
        ...common,
        alarmDescription: `kapp-lambda ${stage}${ofCell(clusterId)}: an event reached the dead-letter queue (its object's status says why)`,
        metric: r.deadLetterQueue.metricApproximateNumberOfMessagesVisible({
          period: Duration.minutes(5),
          statistic: cloudwatch.Stats.MAXIMUM,
        }),
      }),
      new cloudwatch.Alarm(scope, `${id}ErrorAlarm`, {
        ...common,
        alarmDescription: `kapp-lambda ${stage}${ofCell(clusterId)}: the function failed an invocation (crash, timeout or bad configuration)`,
        metric: r.fn.metricErrors({ period: Duration.minutes(5), statistic: cloudwatch.Stats.SUM }),
      }),
      ...(r.dispatcher
        ? [
            new cloudwatch.Alarm(scope, `${id}DispatcherErrorAlarm`, {
              ...common,
              alarmDescription: `kapp-lambda ${stage} dispatcher: it failed an invocation (crash, timeout or bad configuration); its records come back after the queue's visibility timeout`,
              metric: r.dispatcher.metricErrors({ period: Duration.minutes(5), statistic: cloudwatch.Stats.SUM }),
            }),
          ]
        : []),
    ];
  }

  /**
   * Adds the send-only role of one cluster's forwarder: `sqs:SendMessage` on the queues object
   * events go to (`FORWARDER_STAGES`) and nothing else (no receive, no bucket, no key), assumable
   * by `principal` only. Outputs `ForwarderRoleArn<Id>` (for the forwarder's identity) and
   * `ForwarderRoleId<Id>` (for `npm run cluster -- add <id> --forwarder-role-id`: the functions
   * take an event naming the cluster only when SQS says this role sent it, `sender.ts`). Context
   * `forwarders` adds one per EKS cluster ({@link podIdentityForwarder}); call this for other
   * trust (IRSA of a cluster's OIDC provider, a role of another account).
   *
   * @param clusterId - the cluster's id in the registry (a DNS-1123 label).
   * @param principal - who may assume the role (keep it to that one cluster's forwarder).
   * @throws Error when the id is not a DNS-1123 label or already has a forwarder, or when the
   *   functions do not check senders ({@link senderCheck}: the stack's cluster access has no
   *   registry), which would let this role send events naming any cluster.
   */
  addClusterForwarder(clusterId: string, principal: iam.IPrincipal): iam.Role {
    if (!CLUSTER_ID_PATTERN.test(clusterId)) throw new Error(`forwarder: ${clusterId} is not a DNS-1123 label`);
    if (this.forwarderRoles[clusterId]) throw new Error(`forwarder: ${clusterId} already has one`);
    if (!this.senderCheck) {
      throw new Error(
        `forwarder: ${clusterId}: the stack's clusterAccess locates no cluster registry (no KAPP_LAMBDA_CLUSTER_REGISTRY), so the functions cannot check that an event naming ${clusterId} came from its forwarder role (KAPP_LAMBDA_SENDER_CHECK=registry reads the role ids there) and this role could send for any cluster; give the cluster access a registry, or create no forwarder role (context forwarders)`,
      );
    }
    const cell = this.cells[clusterId];
    if (this.isolation === 'cell' && !cell) throw new Error(`forwarder: ${clusterId} has no cell (addCell first)`);
    const id = pascal(clusterId);
    const role = new iam.Role(this, `Forwarder${id}Role`, {
      description: `kapp-lambda forwarder of cluster ${clusterId}: sends its object events to the entry queues${cell ? ' of its cell' : ''}`,
      assumedBy: principal,
    });
    const entryQueues = (cell ?? this.sharedSet()).entryQueues;
    role.addToPolicy(
      new iam.PolicyStatement({ actions: ['sqs:SendMessage'], resources: entryQueues.map((q) => q.queueArn) }),
    );
    this.forwarderRoles[clusterId] = role;
    new CfnOutput(this, `ForwarderRoleArn${id}`, {
      value: role.roleArn,
      description: `the forwarder identity of cluster ${clusterId} (EKS Pod Identity association, or IRSA)`,
    });
    new CfnOutput(this, `ForwarderRoleId${id}`, {
      value: role.roleId,
      description: `npm run cluster -- add ${clusterId} … --forwarder-role-id <this>`,
    });
    return role;
  }
}

export { FORWARDER_SERVICE_ACCOUNT };

/**
 * Who may assume a cluster's forwarder role on EKS: {@link podIdentityTrust} of this stack's
 * account (Pod Identity, for the forwarder's ServiceAccount ({@link FORWARDER_SERVICE_ACCOUNT})
 * in that one cluster only; conditions on the session tags Pod Identity sets, so an association
 * of another cluster or another ServiceAccount with this role gets no credentials).
 * `SessionTagsPrincipal` adds `sts:TagSession` to the service principal's `sts:AssumeRole`,
 * the trust's `actions`; the infrastructure test holds the template to the CLI's policy.
 */
export function podIdentityForwarder(stack: Stack, eksClusterArn: string): iam.IPrincipal {
  const trust = podIdentityTrust(stack.account, eksClusterArn);
  return new iam.SessionTagsPrincipal(new iam.ServicePrincipal(trust.service).withConditions(trust.conditions));
}

/**
 * The queues `stage`'s function sends to (its queue URLs and `sqs:SendMessage` grants):
 * `NEXT_STAGES[stage]`, and its own queue, for the copies of the records it postpones at its
 * deadline (`SqsMessageRequeuer`, functions/lib/transport/sqs.ts), last when `NEXT_STAGES` does not
 * name it.
 */
export function sendQueues(stage: PipelineStage): PipelineStage[] {
  return [...new Set([...(NEXT_STAGES[stage] ?? []), stage])];
}

/** The functions that send to `stage`'s queue ({@link sendQueues} inverted), in `PIPELINE_STAGES` order. */
export function functionSenders(stage: PipelineStage): PipelineStage[] {
  return PIPELINE_STAGES.filter((s) => sendQueues(s).includes(stage));
}

/**
 * The stages whose runs send to `stage`'s queue in the dispatched mode (`NEXT_STAGES` inverted,
 * in `PIPELINE_STAGES` order): their run roles are the queue's function senders. A postponed copy
 * comes from the queue's own dispatcher instead (`KAPP_LAMBDA_RECEIVER_ROLE_ID`).
 */
export function runSenders(stage: PipelineStage): PipelineStage[] {
  return PIPELINE_STAGES.filter((s) => (NEXT_STAGES[s] ?? []).includes(stage));
}

/** What the source poll invokes: the index-repo dispatcher (shared), a cell's index-repo function. */
function pollTarget(clusterId: string | undefined): string {
  return clusterId === undefined ? 'index-repo dispatcher' : 'index-repo function';
}

/** How cdk-nag spells a bucket's ARN in its finding: a bucket of `stack` by its logical id. */
function bucketNagRef(stack: Stack, bucket: s3.IBucket): string {
  return bucket instanceof s3.Bucket
    ? `<${stack.resolve(stack.getLogicalId(bucket.node.defaultChild as s3.CfnBucket))}.Arn>`
    : `arn:<AWS::Partition>:s3:::${bucket.bucketName}`;
}

/** `''` for the fleet's functions, ` (cluster <id>)` for a cell's: descriptions. */
function ofCell(clusterId: string | undefined): string {
  return clusterId === undefined ? '' : ` (cluster ${clusterId})`;
}

/** `index-repo` → `IndexRepo`: construct ids. */
function pascal(stage: string): string {
  return stage.replace(/(^|-)([a-z])/g, (_, __, c: string) => c.toUpperCase());
}
