/**
 * The fleet page next to the cloud mode (issue 28 item 5): the page's function
 * (`functions/fleet-page/index.ts`) behind a Lambda Function URL with `AuthType: AWS_IAM`, so
 * only a signed request of a principal allowed to invoke it gets an answer (never `NONE`: the
 * page names every cluster, PackageInstall, version and rollout cause of the fleet), and a
 * customer managed policy to attach to whoever may view it (output `FleetPageViewerPolicyArn`).
 *
 * The function reads the artifact bucket and nothing else: `s3:GetObject` on the keys the fleet
 * view reads ({@link FLEET_PAGE_READS}), `s3:ListBucket` for those prefixes only (an `s3:prefix`
 * condition; a missing key then answers 403, not 404, which the view reads as absent like any
 * unreadable document), `kms:Decrypt` of the bucket's key through S3 only, and its own log group.
 * No write of any kind, no queue, no secret, no VPC (it calls S3 only), 128 MiB, arm64 (no
 * native tool). Built by the stack when the app gives it the page's bundle (`fleetPageCodeDir`;
 * context `fleetPage`, {@link fleetPageContext}).
 *
 * @module
 */
import {
  Duration,
  aws_iam as iam,
  type aws_kms as kms,
  aws_lambda as lambda,
  type aws_logs as logs,
  Stack,
  type aws_s3 as s3,
  Validations,
} from 'aws-cdk-lib';
import { Construct } from 'constructs';
import { RECEIPTS_PREFIX } from '../../functions/lib/receipt/receipt.js';
import { FLEET_PREFIX, POLICY_PREFIX, ROLLOUT_PREFIX } from '../../functions/lib/rollout/state.js';

/**
 * The key prefixes the page's function may read and list: the fleet index (`state/fleet/`), the
 * rollouts (`state/rollouts/`), the rollout policies (`state/rollout-policies/`) and the receipts
 * (`receipts/`, each PackageInstall's last reconcile). The infrastructure test holds the fleet
 * view to them (every key it lists or reads lies under one).
 */
export const FLEET_PAGE_READS: readonly string[] = Object.freeze([
  FLEET_PREFIX,
  ROLLOUT_PREFIX,
  POLICY_PREFIX,
  RECEIPTS_PREFIX,
]);

/** The page function's memory, MiB: it builds a JSON view, no tool runs. */
export const FLEET_PAGE_MEMORY_MIB = 256;

/** The page function's timeout, seconds: one view of a large fleet (lists and small reads). */
export const FLEET_PAGE_TIMEOUT_SECONDS = 30;

/**
 * Context `fleetPage`: `true` deploys the page ({@link FleetPage}); default `false`, since the
 * page is one more endpoint to authorize and `npm run fleet -- serve --store s3://…` shows the
 * same page from an operator's machine with no deployment.
 *
 * @throws Error `fleetPage: expected true or false` for any other value.
 */
export function fleetPageContext(value: unknown): boolean {
  if (value === undefined || value === false || value === 'false') return false;
  if (value === true || value === 'true') return true;
  throw new Error(`fleetPage: expected true or false, not ${JSON.stringify(value)}`);
}

/** Properties of {@link FleetPage}. */
export interface FleetPageProps {
  /** Directory holding the page function's bundle as `index.mjs` (`bundleFunctions(['fleet-page'])`). */
  readonly codeDir: string;
  /** The artifact bucket the fleet view reads. */
  readonly bucket: s3.IBucket;
  /** The bucket's KMS key (SSE-KMS): decrypted through S3 only. */
  readonly bucketKey: kms.IKey;
  /** The function's log group (the stack's retention and encryption). */
  readonly logGroup: logs.ILogGroup;
  /** The Lambda runtime (the stack's `FUNCTION_RUNTIME`). */
  readonly runtime: lambda.Runtime;
}

/** The page's function, its Function URL (`AWS_IAM`) and its viewers' policy (see the module comment). */
export class FleetPage extends Construct {
  /** The page's function (`functions/fleet-page/index.ts`). */
  readonly fn: lambda.Function;
  /** Its execution role: reads of {@link FLEET_PAGE_READS}, its logs. */
  readonly role: iam.Role;
  /** The Function URL, `AuthType: AWS_IAM`. */
  readonly url: lambda.FunctionUrl;
  /** What a viewer's principal needs: invoke this function through its URL, nothing else. */
  readonly viewerPolicy: iam.ManagedPolicy;

  constructor(scope: Construct, id: string, props: FleetPageProps) {
    super(scope, id);
    const stack = Stack.of(this);
    this.role = new iam.Role(this, 'Role', {
      assumedBy: new iam.ServicePrincipal('lambda.amazonaws.com'),
      description: 'kapp-lambda fleet page: reads the fleet index, rollouts, rollout policies and receipts',
    });
    props.logGroup.grantWrite(this.role);
    this.role.addToPolicy(
      new iam.PolicyStatement({
        actions: ['s3:GetObject'],
        resources: FLEET_PAGE_READS.map((p) => props.bucket.arnForObjects(`${p}*`)),
      }),
    );
    this.role.addToPolicy(
      new iam.PolicyStatement({
        actions: ['s3:ListBucket'],
        resources: [props.bucket.bucketArn],
        conditions: { StringLike: { 's3:prefix': FLEET_PAGE_READS.map((p) => `${p}*`) } },
      }),
    );
    this.role.addToPolicy(
      new iam.PolicyStatement({
        actions: ['kms:Decrypt'],
        resources: [props.bucketKey.keyArn],
        conditions: { StringEquals: { 'kms:ViaService': `s3.${stack.region}.amazonaws.com` } },
      }),
    );
    const bucketRef = bucketNagRef(stack, props.bucket);
    for (const p of FLEET_PAGE_READS) {
      Validations.of(this.role).acknowledge({
        id: `AwsSolutions-IAM5[Resource::${bucketRef}/${p}*]`,
        reason: `fleet page: reads the documents under ${p} (keys named by cluster, namespace and name, not known at deployment); no write.`,
      });
    }
    this.fn = new lambda.Function(this, 'Function', {
      description: 'kapp-lambda fleet page: GET / and /api/fleet through its Function URL (AWS_IAM), read-only',
      runtime: props.runtime,
      architecture: lambda.Architecture.ARM_64,
      handler: 'index.handler',
      code: lambda.Code.fromAsset(props.codeDir),
      role: this.role,
      logGroup: props.logGroup,
      memorySize: FLEET_PAGE_MEMORY_MIB,
      timeout: Duration.seconds(FLEET_PAGE_TIMEOUT_SECONDS),
      environment: { KAPP_LAMBDA_BUCKET: props.bucket.bucketName },
    });
    this.url = this.fn.addFunctionUrl({ authType: lambda.FunctionUrlAuthType.AWS_IAM });
    this.viewerPolicy = new iam.ManagedPolicy(this, 'ViewerPolicy', {
      description: 'kapp-lambda fleet page viewers: invoke the fleet page function through its Function URL (AWS_IAM)',
      statements: [
        // Since October 2025 a Function URL needs both actions of its caller.
        new iam.PolicyStatement({
          actions: ['lambda:InvokeFunctionUrl'],
          resources: [this.fn.functionArn],
          conditions: { StringEquals: { 'lambda:FunctionUrlAuthType': 'AWS_IAM' } },
        }),
        new iam.PolicyStatement({ actions: ['lambda:InvokeFunction'], resources: [this.fn.functionArn] }),
      ],
    });
  }
}

/** How cdk-nag spells a bucket's ARN in its findings: a bucket of `stack` by its logical id. */
function bucketNagRef(stack: Stack, bucket: s3.IBucket): string {
  const cfn = bucket.node.defaultChild;
  return cfn
    ? `<${stack.resolve(stack.getLogicalId(cfn as s3.CfnBucket))}.Arn>`
    : `arn:<AWS::Partition>:s3:::${bucket.bucketName}`;
}
