/**
 * `npm run cluster -- join`: its command line, the fleet outputs it reads, the forwarder role's
 * name and trust, and the plan of steps for each way of joining (no cluster, no AWS: the plan is
 * pure; the integration test runs it against a control plane and moto).
 */

import { chmod, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  AttachRolePolicyCommand,
  CreateRoleCommand,
  EntityAlreadyExistsException,
  GetRoleCommand,
  type IAMClient,
  type Role,
  UpdateAssumeRolePolicyCommand,
} from '@aws-sdk/client-iam';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { clusterDocKey } from '../../functions/lib/kube/cluster-doc.js';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import {
  createForwarderRole,
  type FleetOutputs,
  FORWARDER_ROLE_CLUSTER_TAG,
  forwarderRoleName,
  forwarderTrustPolicy,
  globalNamespaceRefusal,
  JoinRefusedError,
  joinMain,
  joinPlan,
  joinSettings,
  parseFleetOutputs,
  writeJoinDocument,
} from '../../scripts/cluster-join.js';
import { main } from '../../scripts/cluster-registry.js';
import { captured } from './support/captured.js';

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

describe('the packaging global namespace join applies the release onto', () => {
  const GLOBAL = 'kapp-controller-packaging-global';
  const TENANTS = '0b7e9f0a-1111-4222-8333-444455556666';
  const CREATED = 'cccccccc-0000-4000-8000-000000000001';

  it('is accepted absent, as recorded, or adopted; refused otherwise, naming the flag', () => {
    expect(globalNamespaceRefusal(undefined, undefined, false)).toBeUndefined();
    expect(globalNamespaceRefusal(TENANTS, TENANTS.toUpperCase(), false)).toBeUndefined();
    expect(globalNamespaceRefusal(TENANTS, undefined, true)).toBeUndefined();
    expect(globalNamespaceRefusal(TENANTS, undefined, false)).toBe(
      `namespace ${GLOBAL} exists already (uid ${TENANTS}) and is not the one the release created for this cluster: whoever created it may write the Packages every PackageInstall of the cluster can select. Check who did and who may write it (kubectl get rolebindings,roles -n ${GLOBAL}; kubectl get namespace ${GLOBAL} -o yaml), then re-run with --adopt-global-namespace to record it as the cluster's own, or delete it so that the release creates it`,
    );
    expect(globalNamespaceRefusal(TENANTS, CREATED, false)).toMatch(
      new RegExp(
        `^namespace ${GLOBAL} exists already \\(uid ${TENANTS}\\) and is not the one this cluster's document records \\(uid ${CREATED}\\): `,
      ),
    );
  });

  // A fake kubectl (argv as kubectl's; its state in the file STATE names): `get namespace` prints the state's uid; `apply` logs its
  // stdin's kinds and, when the release holds the global namespace and none exists, creates it.
  const FAKE_KUBECTL = `#!/usr/bin/env node
const fs = require('node:fs');
const file = STATE;
const state = JSON.parse(fs.readFileSync(file, 'utf8'));
const args = process.argv.slice(2);
if (args.includes('get') && args.includes('namespace')) process.stdout.write(state.uid ?? '');
else if (args.includes('get') && args.includes('secret')) process.stdout.write(state.secret ?? '');
else if (args.includes('get')) process.stdout.write(state.deployed ? 'deployment.apps/kapp-lambda-forwarder' : '');
else if (args.includes('apply')) {
  const input = fs.readFileSync(0, 'utf8');
  state.applied.push(input.includes('name: ${GLOBAL}') ? 'release' : 'other');
  if (input.includes('name: ${GLOBAL}') && !state.uid) state.uid = '${CREATED}';
  if (input.includes('name: ${GLOBAL}')) state.deployed = true;
  const key = /FORWARDER_EVENT_KEY: ([A-Za-z0-9+/=]+)/.exec(input);
  if (key) state.secret = Buffer.from(key[1]).toString('base64');
  fs.writeFileSync(file, JSON.stringify(state));
} else if (args.includes('rollout')) {
  state.applied.push(args.slice(args.indexOf('-n')).join(' '));
  fs.writeFileSync(file, JSON.stringify(state));
}
`;
  let dir: string;
  let statePath: string;
  beforeEach(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'cluster-join-unit-'));
    statePath = path.join(dir, 'state.json');
    await writeFile(path.join(dir, 'kubectl'), FAKE_KUBECTL.replace('STATE', JSON.stringify(statePath)));
    await chmod(path.join(dir, 'kubectl'), 0o755);
    await writeFile(path.join(dir, 'fleet.json'), JSON.stringify(OUTPUTS));
    await writeFile(path.join(dir, 'release.yml'), `apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ${GLOBAL}\n`);
    const ca = Buffer.from('-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n').toString('base64');
    await writeFile(
      path.join(dir, 'kubeconfig'),
      JSON.stringify({
        apiVersion: 'v1',
        kind: 'Config',
        clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:6443', 'certificate-authority-data': ca } }],
        users: [{ name: 'u', user: { token: 't' } }],
        contexts: [{ name: 'ctx', context: { cluster: 'c', user: 'u' } }],
        'current-context': 'ctx',
      }),
    );
  });
  afterEach(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  /** Joins cluster prod-1 with the fake kubectl, the namespace's uid before being `uid`. */
  const join = async (
    uid: string | undefined,
    extra: string[] = [],
    cluster: { secret?: string; deployed?: boolean } = {},
  ) => {
    const before = JSON.parse(await readFile(statePath, 'utf8').catch(() => '{}')) as {
      secret?: string;
      deployed?: boolean;
    };
    // The cluster keeps its Secret and Deployment from one join to the next, unless told otherwise.
    await writeFile(
      statePath,
      JSON.stringify({
        ...(uid ? { uid } : {}),
        applied: [],
        secret: before.secret,
        deployed: before.deployed,
        ...cluster,
      }),
    );
    const argv = ['join', 'ctx', '--id', 'prod-1', '--fleet', path.join(dir, 'fleet.json'), '--auth', 'token'];
    argv.push(
      '--no-sender-check',
      '--registry',
      `file://${dir}/registry`,
      '--kubeconfig',
      path.join(dir, 'kubeconfig'),
    );
    argv.push('--kubectl', path.join(dir, 'kubectl'), '--release', path.join(dir, 'release.yml'), ...extra);
    const r = await captured(() => joinMain(argv, {}));
    const state = JSON.parse(await readFile(statePath, 'utf8')) as { applied: string[] };
    const doc = await new LocalDirStore(path.join(dir, 'registry')).get(clusterDocKey('prod-1'));
    const recorded = doc
      ? (JSON.parse(doc.toString('utf8')) as { packagingGlobalNamespaceUid?: string; eventKey?: string })
      : undefined;
    return {
      ...r,
      applied: state.applied,
      eventKey: recorded?.eventKey,
      recorded: recorded?.packagingGlobalNamespaceUid ?? (doc ? null : 'no document'),
    };
  };

  it('absent: the release creates it and the document records its uid', async () => {
    const r = await join(undefined);
    expect({ code: r.code, applied: r.applied, recorded: r.recorded }).toEqual({
      code: 0,
      applied: ['release', 'other', 'other'],
      recorded: CREATED,
    });
  });

  it('existing and not recorded: refused before anything is applied; --adopt-global-namespace records it', async () => {
    const refused = await join(TENANTS);
    expect({ code: refused.code, applied: refused.applied, recorded: refused.recorded }).toEqual({
      code: 1,
      applied: [],
      recorded: 'no document',
    });
    expect(refused.err).toBe(`cluster: ${globalNamespaceRefusal(TENANTS, undefined, false)}\n`);
    const adopted = await join(TENANTS, ['--adopt-global-namespace']);
    expect({ code: adopted.code, recorded: adopted.recorded }).toEqual({ code: 0, recorded: TENANTS });
  });

  it("keeps the document's event key, else the Secret's; restarts a running forwarder only when its key changes, after the document", async () => {
    const key = /^[A-Za-z0-9+/]{43}=$/;
    const first = await join(undefined);
    expect(first.eventKey).toMatch(key);
    // A first join: the forwarder did not run before the release, so nothing to restart.
    expect(first.applied).toEqual(['release', 'other', 'other']);
    const again = await join(CREATED, ['--replace']);
    expect({ code: again.code, eventKey: again.eventKey, applied: again.applied }).toEqual({
      code: 0,
      eventKey: first.eventKey,
      applied: ['release', 'other', 'other'],
    });
    // A document without a key (written by add --replace): the Secret's key, which the forwarder holds.
    const registry = new LocalDirStore(path.join(dir, 'registry'));
    const dropKey = async () => {
      const doc = JSON.parse(((await registry.get(clusterDocKey('prod-1'))) as Buffer).toString('utf8'));
      delete doc.eventKey;
      await registry.put(clusterDocKey('prod-1'), JSON.stringify(doc));
    };
    await dropKey();
    const fromSecret = await join(CREATED, ['--replace']);
    expect({ eventKey: fromSecret.eventKey, applied: fromSecret.applied }).toEqual({
      eventKey: first.eventKey,
      applied: ['release', 'other', 'other'],
    });
    // A cluster joined before keys: no Secret, a forwarder running. A new key, and the forwarder
    // restarts after the document names it (the restart is the last step).
    await dropKey();
    const keyed = await join(CREATED, ['--replace'], { secret: '' });
    expect(keyed.code).toBe(0);
    expect(keyed.eventKey).toMatch(key);
    expect(keyed.eventKey).not.toBe(first.eventKey);
    expect(keyed.applied).toEqual([
      'release',
      'other',
      'other',
      '-n kapp-lambda rollout restart deployment/kapp-lambda-forwarder',
    ]);
    expect(keyed.err.indexOf('wrote clusters/prod-1.json')).toBeLessThan(keyed.err.indexOf('restart deployment'));
    // A join that failed before its document (or a cluster removed): the Secret's key is kept.
    await registry.delete(clusterDocKey('prod-1'));
    const retried = await join(CREATED, ['--adopt-global-namespace']);
    expect({ eventKey: retried.eventKey, applied: retried.applied }).toEqual({
      eventKey: keyed.eventKey,
      applied: ['release', 'other', 'other'],
    });
  });

  it('--replace: the namespace its document records is accepted; one created again is refused', async () => {
    expect((await join(undefined)).recorded).toBe(CREATED);
    const again = await join(CREATED, ['--replace']);
    expect({ code: again.code, recorded: again.recorded }).toEqual({ code: 0, recorded: CREATED });
    const recreated = await join(TENANTS, ['--replace']);
    expect({ code: recreated.code, applied: recreated.applied, recorded: recreated.recorded }).toEqual({
      code: 1,
      applied: [],
      recorded: CREATED,
    });
  });
});
