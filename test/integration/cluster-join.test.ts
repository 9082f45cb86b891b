/**
 * `npm run cluster -- join` against a real control plane of its own (the release it applies
 * holds the forwarder Deployment and RBAC of the `kapp-lambda` namespace, which the other files
 * share on the common one) and IAM on moto's server (the harness's SQS server; moto serves IAM
 * on the same endpoint, reached through `KAPP_LAMBDA_IAM_ENDPOINT`), with a `file://` registry:
 * the command line as an operator runs it (tsx, argv), then what it left in the cluster, the
 * registry and IAM; `remove --delete-role` takes the role away again.
 */
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import {
  CreatePolicyCommand,
  GetRoleCommand,
  IAMClient,
  ListAttachedRolePoliciesCommand,
  NoSuchEntityException,
} from '@aws-sdk/client-iam';
import { KubeConfig } from '@kubernetes/client-node';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { PIPELINE_STAGES } from '../../functions/lib/api/functions.js';
import { clusterDocKey, parseClusterDoc } from '../../functions/lib/kube/cluster-doc.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { forwarderRoleName } from '../../scripts/cluster-join.js';
import { FORWARDER_FLEET_CONFIGMAP, RELEASE_NAMESPACE } from '../../scripts/release.js';
import { type Cluster, startCluster } from '../harness/cluster.js';
import { kubectl } from '../harness/kube.js';

const execFileAsync = promisify(execFile);
const moto = inject('servers').sqs;
const ID = 'joined-1';
const ROOT = path.resolve(import.meta.dirname, '../..');

let own: Cluster | undefined;
let tmp: string;
let context: string;
let policyArn: string;
let iam: IAMClient;

/** What the CLI's environment holds: moto's endpoint and throw-away credentials, the cluster's kubectl. */
const cliEnv = () => ({
  PATH: process.env.PATH,
  HOME: tmp,
  AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
  AWS_ACCESS_KEY_ID: moto.accessKeyId,
  AWS_SECRET_ACCESS_KEY: moto.secretAccessKey,
  AWS_REGION: moto.region,
  KAPP_LAMBDA_IAM_ENDPOINT: moto.endpoint,
  KUBECTL: own?.kubectlPath ?? 'kubectl',
});

/** Runs `npm run cluster -- <args>` as `tsx scripts/cluster-registry.ts`; resolves to its exit code and output. */
async function cluster(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const r = await execFileAsync(path.join(ROOT, 'node_modules/.bin/tsx'), ['scripts/cluster-registry.ts', ...args], {
      cwd: ROOT,
      env: cliEnv(),
    });
    return { code: 0, ...r };
  } catch (e) {
    const err = e as { code: number; stdout: string; stderr: string };
    return { code: err.code, stdout: err.stdout, stderr: err.stderr };
  }
}

const k = (args: string[]) => kubectl(own!.kubeconfigPath, args, { kubectl: own!.kubectlPath });

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'kapp-lambda-join-'));
  own = await startCluster({ nodes: 1, log: (m) => process.stderr.write(`[cluster-join] ${m}\n`) });
  const kc = new KubeConfig();
  kc.loadFromFile(own.kubeconfigPath);
  context = kc.getCurrentContext();
  iam = new IAMClient({
    endpoint: moto.endpoint,
    region: moto.region,
    credentials: { accessKeyId: moto.accessKeyId, secretAccessKey: moto.secretAccessKey },
  });
  // What the stack's ForwarderPolicy is (its document does not matter to join: it attaches the ARN).
  const policy = await iam.send(
    new CreatePolicyCommand({
      PolicyName: `kapp-lambda-forwarders-${path.basename(tmp)}`,
      PolicyDocument: JSON.stringify({
        Version: '2012-10-17',
        Statement: [{ Effect: 'Allow', Action: 'sqs:SendMessage', Resource: 'arn:aws:sqs:us-east-1:123456789012:q' }],
      }),
    }),
  );
  policyArn = policy.Policy?.Arn as string;
  const queue = (n: string) => `${moto.endpoint}/123456789012/kapp-lambda-${n}.fifo`;
  // As `cdk deploy --outputs-file` writes them.
  await writeFile(
    path.join(tmp, 'outputs.json'),
    JSON.stringify({
      KappLambda: {
        Region: moto.region,
        ForwarderPolicyArn: policyArn,
        QueueUrlFetch: queue('fetch'),
        QueueUrlInstall: queue('install'),
        QueueUrlIndexRepo: queue('index-repo'),
        FunctionRoleArnDeploy: 'arn:aws:iam::123456789012:role/kapp-lambda-deploy',
      },
    }),
  );
}, 300_000);

afterAll(async () => {
  await own?.stop();
  if (tmp) await rm(tmp, { recursive: true, force: true });
});

describe('npm run cluster -- join', () => {
  const registry = () => `file://${path.join(tmp, 'registry')}`;
  const join = (extra: string[] = []) =>
    cluster([
      'join',
      context,
      '--id',
      ID,
      '--fleet',
      path.join(tmp, 'outputs.json'),
      '--registry',
      registry(),
      '--kubeconfig',
      own!.kubeconfigPath,
      '--auth',
      'eks',
      '--eks-cluster-name',
      'joined-eks',
      ...extra,
    ]);

  it('installs the cluster side, creates the forwarder role, registers the cluster and prints the EKS steps', async () => {
    const r = await join();
    expect(r.stderr).toContain(`wrote ${clusterDocKey(ID)}`);
    expect(r.code).toBe(0);

    // Cluster side: namespaces, the forwarder, its fleet ConfigMap, the functions' RBAC.
    const ns = await k(['get', 'namespaces', '-o', 'name']);
    expect(ns.stdout).toContain('namespace/kapp-lambda\n');
    expect(ns.stdout).toContain('namespace/kapp-controller-packaging-global');
    await k(['-n', RELEASE_NAMESPACE, 'get', 'deployment', 'kapp-lambda-forwarder']);
    const cm = JSON.parse(
      (await k(['-n', RELEASE_NAMESPACE, 'get', 'configmap', FORWARDER_FLEET_CONFIGMAP, '-o', 'json'])).stdout,
    );
    expect(cm.data).toEqual({
      FORWARDER_CLUSTER_ID: ID,
      AWS_REGION: moto.region,
      KAPP_LAMBDA_QUEUE_URL_FETCH: `${moto.endpoint}/123456789012/kapp-lambda-fetch.fifo`,
      KAPP_LAMBDA_QUEUE_URL_INSTALL: `${moto.endpoint}/123456789012/kapp-lambda-install.fifo`,
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: `${moto.endpoint}/123456789012/kapp-lambda-index-repo.fifo`,
    });
    const bindings = JSON.parse((await k(['get', 'clusterrolebindings', '-o', 'json'])).stdout) as {
      items: { subjects?: { kind: string; name: string }[] }[];
    };
    const groups = new Set(
      bindings.items.flatMap((b) => (b.subjects ?? []).filter((x) => x.kind === 'Group').map((x) => x.name)),
    );
    for (const s of PIPELINE_STAGES) expect(groups.has(`kapp-lambda:${s}`), s).toBe(true);
    // What the fetch group may do is what infra/rbac/fetch.yml grants: read an App.
    const can = await k([
      'auth',
      'can-i',
      'get',
      'apps.kappctrl.k14s.io',
      '-A',
      '--as',
      'x',
      '--as-group',
      'kapp-lambda:fetch',
    ]);
    expect(can.stdout.trim()).toBe('yes');

    // IAM: the role, its trust limited to this cluster's forwarder ServiceAccount, the policy.
    const role = (await iam.send(new GetRoleCommand({ RoleName: forwarderRoleName(ID) }))).Role!;
    expect(role.Path).toBe('/kapp-lambda/');
    const trust = JSON.parse(decodeURIComponent(role.AssumeRolePolicyDocument as unknown as string));
    expect(trust.Statement[0].Principal).toEqual({ Service: 'pods.eks.amazonaws.com' });
    expect(trust.Statement[0].Condition.StringEquals).toEqual({
      'aws:SourceAccount': '123456789012',
      'aws:RequestTag/eks-cluster-arn': `arn:aws:eks:${moto.region}:123456789012:cluster/joined-eks`,
      'aws:RequestTag/kubernetes-namespace': 'kapp-lambda',
      'aws:RequestTag/kubernetes-service-account': 'kapp-lambda-forwarder',
    });
    const attached = await iam.send(new ListAttachedRolePoliciesCommand({ RoleName: forwarderRoleName(ID) }));
    expect(attached.AttachedPolicies?.map((p) => p.PolicyArn)).toEqual([policyArn]);

    // Registry: the document with the context's endpoint and CA and the created role's id.
    const body = await new LocalDirStore(path.join(tmp, 'registry')).get(clusterDocKey(ID));
    const doc = parseClusterDoc(clusterDocKey(ID), body!.toString());
    expect(doc.endpoint).toBe(own!.server);
    expect(doc.forwarder?.roleId).toBe(role.RoleId);
    expect(doc.auth).toEqual({ kind: 'eks', clusterName: 'joined-eks', region: moto.region });

    // Printed: the access entries (the role output given, placeholders for the others) and the association.
    expect(r.stdout).toContain(
      `aws eks create-access-entry --region ${moto.region} --cluster-name joined-eks --type STANDARD --principal-arn arn:aws:iam::123456789012:role/kapp-lambda-deploy --kubernetes-groups kapp-lambda:deploy`,
    );
    expect(r.stdout).toContain(`--role-arn ${role.Arn}`);
  });

  it('refuses an id already registered, then --replace keeps the same role', async () => {
    const again = await join();
    expect(again.code).toBe(1);
    expect(again.stderr).toContain('already registered');
    const before = (await iam.send(new GetRoleCommand({ RoleName: forwarderRoleName(ID) }))).Role!.RoleId;
    const replaced = await join(['--replace']);
    expect(replaced.code).toBe(0);
    const body = await new LocalDirStore(path.join(tmp, 'registry')).get(clusterDocKey(ID));
    expect(parseClusterDoc(clusterDocKey(ID), body!.toString()).forwarder?.roleId).toBe(before);
  });

  it('remove --delete-role deletes the document and the role', async () => {
    const r = await cluster(['remove', ID, '--delete-role', '--registry', registry()]);
    expect(r.stderr).toContain(`deleted forwarder role ${forwarderRoleName(ID)}`);
    expect(r.code).toBe(0);
    await expect(iam.send(new GetRoleCommand({ RoleName: forwarderRoleName(ID) }))).rejects.toBeInstanceOf(
      NoSuchEntityException,
    );
    expect(await new LocalDirStore(path.join(tmp, 'registry')).head(clusterDocKey(ID))).toBeFalsy();
  });
});
