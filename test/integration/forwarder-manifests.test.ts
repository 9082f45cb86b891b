/**
 * The forwarder's Kubernetes manifests (infra/forwarder/*.yml) deployed with the real kapp to
 * the local control plane: they apply and the Deployment becomes available (kwok runs its Pods)
 * under the `restricted` Pod Security Standard of their Namespace, and the ServiceAccount gets
 * exactly the read-only access plus its Lease. So as not to touch the shared `kapp-lambda`
 * namespace other tests use, the documents are deployed into a fresh namespace, with the
 * cluster-scoped names suffixed; nothing else is changed.
 */
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { parseAllDocuments, stringify } from 'yaml';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { kubectl } from '../harness/kube.js';

const kubeconfigPath = inject('kubeconfigPath');
const cluster = inject('cluster');
const suffix = randomBytes(3).toString('hex');
const ns = `fwdm-${suffix}`;
const APP = `kapp-lambda-forwarder-${suffix}`;
const DIR = fileURLToPath(new URL('../../infra/forwarder/', import.meta.url));
const SA = `system:serviceaccount:${ns}:kapp-lambda-forwarder`;
const k = (args: string[]) => kubectl(kubeconfigPath, args, { kubectl: cluster.kubectlPath });

let tmp: string;

type Doc = {
  kind: string;
  metadata: { name: string; namespace?: string; annotations?: Record<string, string> };
  [k: string]: unknown;
};

/** The manifests with namespace `kapp-lambda` → {@link ns} and cluster-scoped names suffixed. */
function relocate(docs: Doc[]): Doc[] {
  const json = JSON.stringify(docs).replaceAll('"kapp-lambda"', JSON.stringify(ns));
  const out = JSON.parse(json) as Doc[];
  for (const d of out) {
    if (d.kind === 'ClusterRole' || d.kind === 'ClusterRoleBinding') d.metadata.name += `-${suffix}`;
    if (d.kind === 'ClusterRoleBinding') (d.roleRef as { name: string }).name += `-${suffix}`;
  }
  return out;
}

/** Runs the pinned kapp with argv (no shell) against the test cluster. */
function kapp(args: string[]): Promise<{ code: number | null; output: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(binPath(component('kapp'), 'kapp'), args, {
      env: { PATH: process.env.PATH, HOME: tmp, KUBECONFIG: kubeconfigPath },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (d: Buffer) => {
      output += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      output += d.toString();
    });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, output }));
  });
}

let docs: Doc[];

beforeAll(async () => {
  tmp = await mkdtemp(path.join(tmpdir(), 'forwarder-manifests-it-'));
  const files = (await readdir(DIR)).filter((f) => f.endsWith('.yml')).sort();
  docs = [];
  for (const f of files) {
    for (const d of parseAllDocuments(await readFile(path.join(DIR, f), 'utf8'))) docs.push(d.toJS() as Doc);
  }
  await writeFile(
    path.join(tmp, 'forwarder.yml'),
    relocate(docs)
      .map((d) => stringify(d))
      .join('---\n'),
  );
  // The App CRD, so that `can-i` answers about a served resource.
  const crd = fileURLToPath(new URL('../../infra/crds/apps.kappctrl.k14s.io.yaml', import.meta.url));
  await k(['apply', '--server-side', '--force-conflicts', '-f', crd]);
  await k(['wait', '--for=condition=Established', '--timeout=60s', 'crd/apps.kappctrl.k14s.io']);
});

afterAll(async () => {
  if (tmp) {
    await kapp(['delete', '-a', APP, '-y']);
    await rm(tmp, { recursive: true, force: true });
  }
});

describe('infra/forwarder manifests', () => {
  it('hold every object the forwarder needs, the AWS identity only as a documented placeholder', () => {
    expect(docs.map((d) => `${d.kind}/${d.metadata.name}`).sort()).toEqual([
      'ClusterRole/kapp-lambda-forwarder',
      'ClusterRoleBinding/kapp-lambda-forwarder',
      'ConfigMap/kapp-lambda-forwarder',
      'Deployment/kapp-lambda-forwarder',
      'Namespace/kapp-lambda',
      'Role/kapp-lambda-forwarder-leader-election',
      'RoleBinding/kapp-lambda-forwarder-leader-election',
      'Service/kapp-lambda-forwarder-metrics',
      'ServiceAccount/kapp-lambda-forwarder',
    ]);
    const sa = docs.find((d) => d.kind === 'ServiceAccount')!;
    expect(sa.metadata.annotations?.['eks.amazonaws.com/role-arn']).toMatch(/^arn:aws:iam::\d{12}:role\//);
    // No static AWS keys anywhere.
    expect(JSON.stringify(docs)).not.toMatch(/AWS_ACCESS_KEY_ID|AWS_SECRET_ACCESS_KEY|AKIA[0-9A-Z]{16}/);
  });

  it('deploy with kapp: the Deployment becomes available under the restricted Pod Security Standard', async () => {
    const r = await kapp(['deploy', '-a', APP, '-f', path.join(tmp, 'forwarder.yml'), '-y', '--wait-timeout', '90s']);
    expect(r.output).toContain('Succeeded');
    expect(r.code).toBe(0);
    const dep = JSON.parse(
      (await k(['get', 'deployment', 'kapp-lambda-forwarder', '-n', ns, '-o', 'json'])).stdout,
    ) as {
      status: { availableReplicas?: number };
      spec: { template: { spec: Record<string, unknown> } };
    };
    expect(dep.status.availableReplicas).toBe(2);
    const pod = dep.spec.template.spec as {
      securityContext: Record<string, unknown>;
      containers: Array<{
        securityContext: Record<string, unknown>;
        livenessProbe: unknown;
        readinessProbe: unknown;
        resources: unknown;
      }>;
    };
    expect(pod.securityContext).toMatchObject({ runAsNonRoot: true, seccompProfile: { type: 'RuntimeDefault' } });
    expect(pod.containers[0]!.securityContext).toEqual({
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ['ALL'] },
    });
    expect(pod.containers[0]!.livenessProbe).toMatchObject({ httpGet: { path: '/healthz' } });
    expect(pod.containers[0]!.readinessProbe).toMatchObject({ httpGet: { path: '/readyz' } });
  }, 120_000);

  it.each([
    ['list', 'apps.kappctrl.k14s.io', [], 'yes'],
    ['watch', 'secrets', [], 'yes'],
    ['patch', 'apps.kappctrl.k14s.io', [], 'no'],
    ['update', 'apps.kappctrl.k14s.io/status', [], 'no'],
    ['update', 'leases.coordination.k8s.io', ['-n', ns], 'yes'],
    ['update', 'leases.coordination.k8s.io', ['-n', 'kube-system'], 'no'],
    ['create', 'pods', ['-n', ns], 'no'],
  ])('the ServiceAccount may %s %s %j: %s', async (verb, resource, where, answer) => {
    const r = await kubectl(kubeconfigPath, ['auth', 'can-i', verb, resource, ...where, '--as', SA], {
      kubectl: cluster.kubectlPath,
      check: false,
    });
    expect(r.stdout.trim()).toBe(answer);
  });
});
