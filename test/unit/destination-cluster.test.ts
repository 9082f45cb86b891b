/**
 * The cluster an App's templates read (helm `--kube-version`/`--api-versions`, downward API):
 * its own for a ServiceAccount, the cluster of its kubeconfig Secret otherwise
 * (`pkg/componentinfo/component_info.go`, issue 12). `destinationKubeconfig` over a fake
 * Secret reader, `policedKubeconfig` under the URL policy, `clusterInfoSource` over a fake
 * registry and fake REST transports, and the template stage handing the Secret's kubeconfig
 * to its cluster-info source (faked at the ports: the fake cluster and runner).
 */
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { parse, stringify } from 'yaml';
import { templateEvent } from '../../events/schema.js';
import type { App } from '../../functions/lib/api/index.js';
import { destinationKubeconfig } from '../../functions/lib/deploy/run.js';
import { UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';
import type { ClusterRegistry, KubeSecret } from '../../functions/lib/kube/port.js';
import type { RestRequest, RestResponse, RestTransport } from '../../functions/lib/kube/transport.js';
import { policedKubeconfig } from '../../functions/lib/pipeline/app/kubeconfig-policy.js';
import {
  clusterInfoSource,
  KUBERNETES_APIS_ERROR_PREFIX,
  KUBERNETES_VERSION_ERROR_PREFIX,
} from '../../functions/lib/pipeline/compose.js';
import type { ClusterInfoSource } from '../../functions/lib/pipeline/deps.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { KappControllerError } from '../../functions/lib/reconcile/result.js';
import { SecretMask } from '../../functions/lib/reconcile/secret-mask.js';
import { appObject, appWorld, NOW, putFetchArtifact, REF, RUN } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('destination-cluster-');

const KUBECONFIG = stringify({
  apiVersion: 'v1',
  kind: 'Config',
  clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:6443' } }],
  users: [{ name: 'u', user: { token: 'destination-token-1234', exec: { command: '/bin/steal' } } }],
  contexts: [{ name: 'x', context: { cluster: 'c', user: 'u', namespace: 'kc-ns' } }],
  'current-context': 'x',
});

function secret(data: Record<string, string>): KubeSecret {
  return {
    metadata: { name: 'kc', namespace: 'ns' },
    type: 'Opaque',
    data: Object.fromEntries(Object.entries(data).map(([k, v]) => [k, Buffer.from(v)])),
  } as unknown as KubeSecret;
}

/** A Secret reader holding `secrets` of namespace `ns`, recording what was read. */
function reader(secrets: Record<string, KubeSecret> = {}) {
  const reads: string[] = [];
  return {
    reads,
    getSecret: async (namespace: string, name: string) => {
      reads.push(`${namespace}/${name}`);
      return namespace === 'ns' ? secrets[name] : undefined;
    },
  };
}

const app = (spec: Record<string, unknown>) => ({ metadata: { name: 'a', namespace: 'ns' }, spec }) as unknown as App;

describe('destinationKubeconfig (ComponentInfo.KubernetesVersion / ClusterAccess)', () => {
  it('a ServiceAccount: the App’s own cluster, no Secret read (it wins over cluster)', async () => {
    const r = reader({ kc: secret({ value: KUBECONFIG }) });
    const spec = { serviceAccountName: 'sa', cluster: { kubeconfigSecretRef: { name: 'kc' } } };
    await expect(destinationKubeconfig(app(spec), r)).resolves.toBeUndefined();
    expect(r.reads).toEqual([]);
  });

  it("the kubeconfig Secret's `value`, restricted as kapp gets it; its values masked", async () => {
    const mask = new SecretMask();
    const yaml = await destinationKubeconfig(
      app({ cluster: { kubeconfigSecretRef: { name: 'kc' } } }),
      reader({ kc: secret({ value: KUBECONFIG }) }),
      mask,
    );
    const doc = parse(yaml ?? '') as { clusters: { cluster: Record<string, unknown> }[]; users: { user: object }[] };
    expect(doc.clusters[0]?.cluster.server).toBe('https://127.0.0.1:6443');
    expect(doc.users[0]?.user).toEqual({ token: 'destination-token-1234' });
    expect(mask.text(`kapp saw:\n${KUBECONFIG}`)).not.toContain('destination-token-1234');
  });

  it('a custom key', async () => {
    const yaml = await destinationKubeconfig(
      app({ cluster: { kubeconfigSecretRef: { name: 'kc', key: 'cfg' } } }),
      reader({ kc: secret({ cfg: KUBECONFIG }) }),
    );
    expect(yaml).toContain('https://127.0.0.1:6443');
  });

  it.each([
    ['neither', {}, 'Expected service account or cluster specified'],
    [
      'cluster without a Secret',
      { cluster: { namespace: 'c' } },
      'Expected kubeconfig secret reference to be specified',
    ],
    [
      'a missing Secret',
      { cluster: { kubeconfigSecretRef: { name: 'gone' } } },
      'Getting kubeconfig secret: secrets "gone" not found',
    ],
    [
      'a missing key',
      { cluster: { kubeconfigSecretRef: { name: 'kc' } } },
      "Expected to find key 'value' in secret (keys: other)",
    ],
  ])("%s: upstream's ClusterAccess text, without the deploy's prefix", async (_what, spec, message) => {
    await expect(destinationKubeconfig(app(spec), reader({ kc: secret({ other: 'x' }) }))).rejects.toThrowError(
      new KappControllerError(message),
    );
  });
});

describe('policedKubeconfig', () => {
  const restricted = 'clusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\n';

  it('no policy or policy off: the kubeconfig as is', async () => {
    await expect(policedKubeconfig(restricted, undefined)).resolves.toBe(restricted);
    await expect(policedKubeconfig(restricted, { mode: 'off', allow: [] })).resolves.toBe(restricted);
  });

  it('enforced: a loopback server is refused', async () => {
    await expect(policedKubeconfig(restricted, { mode: 'enforce', allow: [] })).rejects.toBeInstanceOf(UrlPolicyError);
  });

  it('enforced and allowed: every cluster goes through the egress proxy', async () => {
    const out = await policedKubeconfig(
      restricted,
      { mode: 'enforce', allow: ['127.0.0.1:6443'] },
      async () => 'http://127.0.0.1:3128',
    );
    const doc = parse(out) as { clusters: { cluster: Record<string, unknown> }[] };
    expect(doc.clusters[0]?.cluster).toEqual({
      server: 'https://127.0.0.1:6443',
      'proxy-url': 'http://127.0.0.1:3128',
    });
  });
});

/** A REST transport serving discovery answers, or failing every request with `fail`. */
function discovery(version: string, groups: string[], fail?: Error): RestTransport & { paths: string[] } {
  const paths: string[] = [];
  return {
    paths,
    async send(req: RestRequest): Promise<RestResponse> {
      paths.push(req.path);
      if (fail) throw fail;
      if (req.path === '/version') return { statusCode: 200, body: { gitVersion: version } };
      if (req.path === '/api') return { statusCode: 200, body: { versions: ['v1'] } };
      return {
        statusCode: 200,
        body: { groups: groups.map((g) => ({ name: g.split('/')[0], versions: [{ groupVersion: g }] })) },
      };
    },
  };
}

describe('clusterInfoSource: the destination cluster', () => {
  const home = {
    serverVersion: async () => '1.30.0',
    apiGroupVersions: async () => ['v1', 'kappctrl.k14s.io/v1alpha1'],
  };
  const registry = { client: (id: string) => (id === 'c1' ? home : undefined) } as unknown as ClusterRegistry;
  const all = { kubernetesVersion: true, kubernetesAPIs: true, kappControllerVersion: true };

  it("no destination kubeconfig: the App's own cluster", async () => {
    const source = clusterInfoSource(registry, '0.53.1', () => {
      throw new Error('no transport expected');
    });
    await expect(source('c1', all)).resolves.toEqual({
      kubernetesVersion: '1.30.0',
      kubernetesAPIs: ['v1', 'kappctrl.k14s.io/v1alpha1'],
      kappControllerVersion: '0.53.1',
    });
  });

  it('a destination kubeconfig: version and group/versions of the cluster it names (build metadata stripped)', async () => {
    const made: string[] = [];
    const rest = discovery('v1.34.4+k3s1', ['apps/v1', 'widgets.example/v1']);
    const source = clusterInfoSource(registry, '0.53.1', (yaml) => {
      made.push(yaml);
      return rest;
    });
    await expect(source('c1', all, 'kubeconfig-yaml')).resolves.toEqual({
      kubernetesVersion: '1.34.4',
      kubernetesAPIs: ['v1', 'apps/v1', 'widgets.example/v1'],
      kappControllerVersion: '0.53.1',
    });
    expect(made).toEqual(['kubeconfig-yaml', 'kubeconfig-yaml']);
    expect(rest.paths.sort()).toEqual(['/api', '/apis', '/version']);
  });

  it('only what is needed is looked up', async () => {
    const rest = discovery('v1.34.4', []);
    const source = clusterInfoSource(registry, '0.53.1', () => rest);
    const info = await source(
      'c1',
      { kubernetesVersion: true, kubernetesAPIs: false, kappControllerVersion: false },
      'y',
    );
    expect(info).toEqual({ kubernetesVersion: '1.34.4', kubernetesAPIs: undefined, kappControllerVersion: '0.53.1' });
    expect(rest.paths).toEqual(['/version']);
  });

  it("an unreachable destination: each value is the failure with upstream's prefix", async () => {
    const refused = new Error('connect ECONNREFUSED 127.0.0.1:1');
    const source = clusterInfoSource(registry, '0.53.1', () => discovery('', [], refused));
    const info = await source('c1', all, 'y');
    expect((info.kubernetesVersion as Error).message).toBe(
      `${KUBERNETES_VERSION_ERROR_PREFIX}getting server version: connect ECONNREFUSED 127.0.0.1:1`,
    );
    expect((info.kubernetesAPIs as Error).message).toBe(
      `${KUBERNETES_APIS_ERROR_PREFIX}getting api group versions: connect ECONNREFUSED 127.0.0.1:1`,
    );
  });

  it('no destination to be had (the error as value): each needed value is that error, prefixed; nothing is called', async () => {
    const source = clusterInfoSource(registry, '0.53.1', () => {
      throw new Error('no transport expected');
    });
    const info = await source('c1', all, new KappControllerError('Getting kubeconfig secret: secrets "kc" not found'));
    expect((info.kubernetesVersion as Error).message).toBe(
      'Unable to get kubernetes version: Getting kubeconfig secret: secrets "kc" not found',
    );
    expect((info.kubernetesAPIs as Error).message).toBe(
      'Unable to list all server apigroups/version: Getting kubeconfig secret: secrets "kc" not found',
    );
  });
});

describe('the template stage reads the destination of an App with a kubeconfig Secret', () => {
  const spec = {
    serviceAccountName: undefined,
    cluster: { kubeconfigSecretRef: { name: 'kc' } },
    template: [{ ytt: { valuesFrom: [{ downwardAPI: { items: [{ name: 'v', kubernetesVersion: {} }] } }] } }],
  };

  async function run(secrets: Record<string, string> | undefined) {
    const calls: Parameters<ClusterInfoSource>[] = [];
    const real = clusterInfoSource({} as ClusterRegistry, '0.53.1', () => discovery('v1.34.4', []));
    const clusterInfo: ClusterInfoSource = async (...args) => {
      calls.push(args);
      return await real(...args);
    };
    const w = appWorld({
      app: appObject({ spec }),
      tmpRoot: path.join(tempDir(), 'scratch'),
      extra: { clusterInfo } as never,
    });
    if (secrets) w.cluster.secrets.set(`${REF.namespace}/kc`, secret(secrets));
    const values: string[] = [];
    w.runner.on('ytt', async (req) => {
      for (const arg of req.args.filter((a) => a.endsWith('downwardapi_0.yaml'))) {
        values.push(await readFile(arg.replace(/^--data-values-file=/, ''), 'utf8'));
      }
      return { stdout: 'kind: ConfigMap\n' };
    });
    const fetchKey = await putFetchArtifact(w.store, tempDir());
    const data = { object: REF, run: RUN, artifacts: { fetchKey }, fetchStatus: { exitCode: 0, updatedAt: NOW } };
    await dispatchEvent(templateEvent(data, { time: new Date(NOW) }), w.deps);
    return { w, calls, values };
  }

  it("the Secret's restricted kubeconfig is handed over; the value reaches ytt", async () => {
    const { calls, w, values } = await run({ value: KUBECONFIG });
    expect(calls).toHaveLength(1);
    const [clusterId, needs, destination] = calls[0]!;
    expect(clusterId).toBe(REF.clusterId);
    expect(needs).toEqual({ kubernetesVersion: true, kubernetesAPIs: false, kappControllerVersion: false });
    expect(typeof destination).toBe('string');
    expect(destination as string).toContain('https://127.0.0.1:6443');
    expect(destination as string).not.toContain('/bin/steal');
    expect(values).toEqual(['v: 1.34.4\n']);
    expect(w.tools()).toEqual(['ytt']);
  });

  it("a missing Secret: upstream's text in the template failure, ytt not run", async () => {
    const { calls, w } = await run(undefined);
    expect((calls[0]![2] as Error).message).toBe('Getting kubeconfig secret: secrets "kc" not found');
    const last = w.statuses().at(-1) as { conditions?: { message?: string }[] };
    expect(last.conditions).toEqual([
      {
        type: 'ReconcileFailed',
        status: 'True',
        message:
          'Preparing template values: Unable to get kubernetes version: Getting kubeconfig secret: secrets "kc" not found',
      },
    ]);
    expect(w.tools()).toEqual([]);
  });
});
