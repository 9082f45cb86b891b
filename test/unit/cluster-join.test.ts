/**
 * `npm run cluster -- join`: its command line, the fleet outputs it reads, the forwarder role's
 * name and trust, and the plan of steps for each way of joining (no cluster, no AWS: the plan is
 * pure; the integration test runs it against a control plane and moto).
 */
import {
  AttachRolePolicyCommand,
  CreateRoleCommand,
  EntityAlreadyExistsException,
  GetRoleCommand,
  type IAMClient,
  type Role,
  UpdateAssumeRolePolicyCommand,
} from '@aws-sdk/client-iam';
import { describe, expect, it } from 'vitest';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import {
  createForwarderRole,
  type FleetOutputs,
  FORWARDER_ROLE_CLUSTER_TAG,
  forwarderRoleName,
  forwarderTrustPolicy,
  JoinRefusedError,
  joinPlan,
  joinSettings,
  parseFleetOutputs,
  writeJoinDocument,
} from '../../scripts/cluster-join.js';
import { main } from '../../scripts/cluster-registry.js';

const OUTPUTS = {
  Region: 'eu-west-1',
  ForwarderPolicyArn: 'arn:aws:iam::123456789012:policy/KappLambda-ForwarderPolicy-ABC',
  QueueUrlFetch: 'https://sqs.eu-west-1.amazonaws.com/123456789012/fetch.fifo',
  QueueUrlInstall: 'https://sqs.eu-west-1.amazonaws.com/123456789012/install.fifo',
  QueueUrlIndexRepo: 'https://sqs.eu-west-1.amazonaws.com/123456789012/index-repo.fifo',
  FunctionRoleArnDeploy: 'arn:aws:iam::123456789012:role/deploy',
  BucketName: 'b',
};
const fleet: FleetOutputs = parseFleetOutputs(JSON.stringify(OUTPUTS));
const settings = (argv: string[]) =>
  joinSettings(['join', 'ctx', '--id', 'prod-1', '--fleet', 'f.json', ...argv], async () => fleet);

describe('fleet outputs', () => {
  it('reads cdk --outputs-file, a flat object and describe-stacks Outputs alike', () => {
    const cdk = parseFleetOutputs(JSON.stringify({ KappLambda: OUTPUTS }));
    const cfn = parseFleetOutputs(
      JSON.stringify(Object.entries(OUTPUTS).map(([OutputKey, OutputValue]) => ({ OutputKey, OutputValue }))),
    );
    expect(cdk).toEqual(fleet);
    expect(cfn).toEqual(fleet);
    expect(fleet.queueUrls['index-repo']).toBe(OUTPUTS.QueueUrlIndexRepo);
    expect(fleet.functionRoles).toEqual({ deploy: OUTPUTS.FunctionRoleArnDeploy });
  });

  it('names what a stack without the join outputs lacks', () => {
    const { ForwarderPolicyArn: _, Region: __, ...old } = OUTPUTS;
    expect(() => parseFleetOutputs(JSON.stringify(old))).toThrow('lack Region, ForwarderPolicyArn');
  });
});

describe('forwarder role', () => {
  it('is named after the cluster, within IAM 64 characters, one name per id', () => {
    expect(forwarderRoleName('prod-1')).toBe('kapp-lambda-forwarder-prod-1');
    const long = 'a'.repeat(63);
    expect(forwarderRoleName(long).length).toBeLessThanOrEqual(64);
    expect(forwarderRoleName(long)).not.toBe(forwarderRoleName(`${'a'.repeat(62)}b`));
  });

  it("a hashed name is never another, shorter id's plain name", () => {
    const hashed = forwarderRoleName('prod-eu-west-1-payments-cluster-blue-00000000000001');
    const short = hashed.slice('kapp-lambda-forwarder-'.length);
    expect(short).not.toMatch(/^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/); // no cluster id (a DNS label)
  });

  /** IAM as the SDK sees it, in memory: roles by name. */
  const memoryIam = () => {
    const roles = new Map<string, Role>();
    const iam = {
      send: async (cmd: unknown) => {
        if (cmd instanceof CreateRoleCommand) {
          const i = cmd.input;
          if (roles.has(i.RoleName as string)) {
            throw new EntityAlreadyExistsException({ message: 'exists', $metadata: {} });
          }
          const role = {
            RoleName: i.RoleName,
            RoleId: `AROA${roles.size + 1}`,
            Arn: `arn:aws:iam::123456789012:role${i.Path}${i.RoleName}`,
            Path: i.Path,
            Tags: i.Tags,
            AssumeRolePolicyDocument: i.AssumeRolePolicyDocument,
          } as Role;
          roles.set(i.RoleName as string, role);
          return { Role: role };
        }
        if (cmd instanceof GetRoleCommand) return { Role: roles.get(cmd.input.RoleName as string) };
        if (cmd instanceof UpdateAssumeRolePolicyCommand) {
          (roles.get(cmd.input.RoleName as string) as Role).AssumeRolePolicyDocument = cmd.input.PolicyDocument;
          return {};
        }
        if (cmd instanceof AttachRolePolicyCommand) return {};
        throw new Error(`unexpected ${String(cmd)}`);
      },
    } as unknown as IAMClient;
    return { iam, roles };
  };
  const POLICY = 'arn:aws:iam::123456789012:policy/fwd';
  const trustOf = (cluster: string) =>
    forwarderTrustPolicy('123456789012', `arn:aws:eks:eu-west-1:123456789012:cluster/${cluster}`);

  it('--replace reuses (and retrusts) only a role tagged with the same cluster id', async () => {
    const { iam, roles } = memoryIam();
    const made = await createForwarderRole(iam, 'prod-1', trustOf('prod'), POLICY);
    expect(roles.get(forwarderRoleName('prod-1'))?.Tags).toEqual([
      { Key: FORWARDER_ROLE_CLUSTER_TAG, Value: 'prod-1' },
    ]);
    expect((await createForwarderRole(iam, 'prod-1', trustOf('prod-2'), POLICY, true)).roleId).toBe(made.roleId);

    // A role of that name made for another id (or untagged) is left alone, its trust unchanged.
    const role = roles.get(forwarderRoleName('prod-1')) as Role;
    for (const Tags of [[{ Key: FORWARDER_ROLE_CLUSTER_TAG, Value: 'other' }], undefined]) {
      role.Tags = Tags;
      await expect(createForwarderRole(iam, 'prod-1', trustOf('attacker'), POLICY, true)).rejects.toThrow(
        /not prod-1: left in place/,
      );
      expect(role.AssumeRolePolicyDocument).toContain('cluster/prod-2');
    }
  });

  it("is assumable by Pod Identity for that one cluster's forwarder ServiceAccount only", () => {
    const arn = 'arn:aws:eks:eu-west-1:123456789012:cluster/prod';
    expect(forwarderTrustPolicy('123456789012', arn).Statement).toEqual([
      expect.objectContaining({
        Principal: { Service: 'pods.eks.amazonaws.com' },
        Action: ['sts:AssumeRole', 'sts:TagSession'],
        Condition: {
          StringEquals: {
            'aws:SourceAccount': '123456789012',
            'aws:RequestTag/eks-cluster-arn': arn,
            'aws:RequestTag/kubernetes-namespace': 'kapp-lambda',
            'aws:RequestTag/kubernetes-service-account': 'kapp-lambda-forwarder',
          },
        },
      }),
    ]);
  });
});

describe('join command line', () => {
  it('refuses what it cannot run, naming why', async () => {
    expect(await joinSettings(['join'], async () => fleet)).toEqual({ problem: expect.stringContaining('context') });
    expect(await settings(['--auth', 'eks'])).toEqual({ problem: '--auth eks needs --eks-cluster-name' });
    expect(await settings(['--auth', 'x'])).toEqual({ problem: '--auth must be eks or token' });
    expect(await settings(['--auth', 'token', '--forwarder-role-id', 'nope'])).toEqual({
      problem: expect.stringContaining('--forwarder-role-id expects'),
    });
    expect(
      await joinSettings(['join', 'ctx', '--id', 'Bad_Id', '--fleet', 'f', '--auth', 'token'], async () => fleet),
    ).toEqual({ problem: expect.stringContaining('--id') });
    await expect(settings(['--nope'])).rejects.toMatchObject({ code: 'ERR_PARSE_ARGS_UNKNOWN_OPTION' });
  });

  it("takes an eks cluster's region from the fleet", async () => {
    const r = await settings(['--auth', 'eks', '--eks-cluster-name', 'prod']);
    expect(r).toMatchObject({ settings: { auth: { kind: 'eks', clusterName: 'prod', region: 'eu-west-1' } } });
  });
});

describe('join plan', () => {
  const plan = async (argv: string[]) => {
    const r = await settings(argv);
    if (!('settings' in r)) throw new Error(JSON.stringify(r));
    return joinPlan(r.settings);
  };
  const actions = (steps: { action: string }[]) => steps.map((s) => s.action);

  it('eks: applies, creates the role, writes the document, prints the Pod Identity association', async () => {
    const steps = await plan(['--auth', 'eks', '--eks-cluster-name', 'prod']);
    expect(actions(steps)).toEqual(['release', 'rbac', 'fleet-config', 'create-role', 'document', 'print']);
    expect(steps.at(-1)?.text).toBe(
      'aws eks create-pod-identity-association --region eu-west-1 --cluster-name prod --namespace kapp-lambda --service-account kapp-lambda-forwarder --role-arn arn:aws:iam::123456789012:role/kapp-lambda/kapp-lambda-forwarder-prod-1',
    );
  });

  it('--print-only: the IAM commands instead, and no document without the role id', async () => {
    const steps = await plan(['--auth', 'eks', '--eks-cluster-name', 'prod', '--print-only']);
    expect(actions(steps)).toEqual(['release', 'rbac', 'fleet-config', 'print', 'print', 'print', 'print']);
    expect(steps[3]?.text).toMatch(
      /^aws iam create-role --role-name kapp-lambda-forwarder-prod-1 --path \/kapp-lambda\/ --assume-role-policy-document '\{"Version"/,
    );
    expect(steps[4]?.text).toBe(
      `aws iam attach-role-policy --role-name kapp-lambda-forwarder-prod-1 --policy-arn ${OUTPUTS.ForwarderPolicyArn}`,
    );
    const given = await plan([
      '--auth',
      'eks',
      '--eks-cluster-name',
      'prod',
      '--print-only',
      '--forwarder-role-id',
      'AROAEXAMPLE12345',
    ]);
    expect(actions(given)).toEqual(['release', 'rbac', 'fleet-config', 'document', 'print']);
  });

  it('token: never creates a role; registers with a given role id or --no-sender-check', async () => {
    expect(actions(await plan(['--auth', 'token']))).toEqual([
      'release',
      'rbac',
      'fleet-config',
      'print',
      'print',
      'print',
      'print',
    ]);
    expect(actions(await plan(['--auth', 'token', '--no-sender-check']))).toEqual([
      'release',
      'rbac',
      'fleet-config',
      'document',
    ]);
    expect(actions(await plan(['--auth', 'token', '--forwarder-role-id', 'AROAEXAMPLE12345']))).toEqual([
      'release',
      'rbac',
      'fleet-config',
      'document',
    ]);
  });
});

describe('the document join writes', () => {
  const CA = '-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n';
  const input = (id: string, forwarderRoleId: string) => ({
    id,
    endpoint: `https://${id}.example.com`,
    caPem: CA,
    auth: { kind: 'eks' as const, clusterName: id, region: 'eu-west-1' },
    forwarderRoleId,
  });

  it('refuses an id already registered (1) unless replace, and a role another cluster names (2)', async () => {
    const store = new MemoryStore();
    await writeJoinDocument(store, input('a', 'AROAEXAMPLE00001'));
    await expect(writeJoinDocument(store, input('a', 'AROAEXAMPLE00002'))).rejects.toEqual(
      new JoinRefusedError('"a" is already registered; add --replace to overwrite it', 1),
    );
    await expect(writeJoinDocument(store, input('a', 'AROAEXAMPLE00002'), { replace: true })).resolves.toMatchObject({
      doc: { forwarder: { roleId: 'AROAEXAMPLE00002' } },
    });
    await expect(writeJoinDocument(store, input('b', 'AROAEXAMPLE00002'))).rejects.toMatchObject({ code: 2 });
  });

  it('--delete-role belongs to remove only', async () => {
    expect(await main(['list', '--delete-role', '--registry', 'file:///nonexistent'])).toBe(2);
  });
});
