/**
 * Issue 7 §4 for deploy: the URLs of an App's kubeconfig Secret (`spec.cluster.kubeconfigSecretRef`)
 * obey the URL policy when it is enforced. Hostile values tried, each with the exact refusal; the
 * allowed cases; and through the deploy and delete stages: the refusal in status, kapp never
 * started. Faked at the ports: a fixed resolver, the fake cluster and runner.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { deleteEvent, deployEvent } from '../../events/schema.js';
import { Finalizer } from '../../functions/lib/api/index.js';
import { fetchArtifactKey, sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import { kubeconfigUrls, restrictKubeconfig } from '../../functions/lib/deploy/kubeconfig-restrict.js';
import {
  parseUrlPolicy,
  type UrlPolicy,
  UrlPolicyChecker,
  UrlPolicyError,
} from '../../functions/lib/fetch/url-policy.js';
import {
  checkKubeconfigUrls,
  KUBECONFIG_PROXY_REFUSED,
  REFRESHING_AUTH_PROVIDER_REFUSED,
} from '../../functions/lib/pipeline/app/kubeconfig-policy.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { appObject, appWorld, NOW, REF, RUN, SUCCEEDED_BEFORE } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('kubeconfig-policy-');

/** A resolver with fixed answers: names not listed fail like an unknown host. */
const DNS: Record<string, string[]> = {
  'api.prod.example.com': ['93.184.216.34'],
  'proxy.example.com': ['93.184.216.40'],
  'loop.example.com': ['127.0.0.1'],
  'rebind.example.com': ['93.184.216.34', '127.0.0.1'],
  'kube.corp': ['10.20.3.4'],
};
const resolver = async (host: string) => {
  const a = DNS[host];
  if (!a) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: 'ENOTFOUND' });
  return a;
};
const ENFORCE: UrlPolicy = { mode: 'enforce', allow: [] };

/** A kubeconfig with one cluster and one user, restricted as kapp gets it. */
function kubeconfig(cluster: Record<string, unknown>, user: Record<string, unknown> = { token: 't0ken' }): string {
  return stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'c', cluster }],
    users: [{ name: 'u', user }],
    contexts: [{ name: 'ctx', context: { cluster: 'c', user: 'u' } }],
    'current-context': 'ctx',
  });
}

async function refusal(yaml: string, policy: UrlPolicy = ENFORCE): Promise<string | undefined> {
  try {
    await checkKubeconfigUrls(restrictKubeconfig(yaml).yaml, new UrlPolicyChecker(policy, resolver));
    return undefined;
  } catch (err) {
    expect(err).toBeInstanceOf(UrlPolicyError);
    return (err as Error).message;
  }
}

const SERVER = 'kubeconfig clusters[0].cluster.server';
const PROXY = 'kubeconfig clusters[0].cluster.proxy-url';
const NOT_ALLOWED = 'which this deployment does not allow';
const LINK_LOCAL = 'a link-local address (instance and container credential endpoints)';

describe('kubeconfig Secret under an enforced URL policy: hostile values', () => {
  it.each<[string, Record<string, unknown>, Record<string, unknown> | undefined, string]>([
    [
      'server: the Lambda Runtime API',
      { server: 'https://127.0.0.1:9001' },
      undefined,
      `URL policy refused ${SERVER} https://127.0.0.1:9001: 127.0.0.1, a loopback address, ${NOT_ALLOWED}`,
    ],
    [
      'server: the instance metadata endpoint',
      { server: 'http://169.254.169.254' },
      undefined,
      `URL policy refused ${SERVER} http://169.254.169.254: 169.254.169.254, ${LINK_LOCAL}, ${NOT_ALLOWED}`,
    ],
    [
      'server: a private address',
      { server: 'https://10.0.12.7:6443' },
      undefined,
      `URL policy refused ${SERVER} https://10.0.12.7:6443: 10.0.12.7, a private address, ${NOT_ALLOWED}`,
    ],
    [
      'server: a name resolving to loopback',
      { server: 'https://loop.example.com:9001' },
      undefined,
      `URL policy refused ${SERVER} https://loop.example.com:9001: loop.example.com resolves to 127.0.0.1, a loopback address, ${NOT_ALLOWED}`,
    ],
    [
      'server: a name with one public and one loopback address',
      { server: 'https://rebind.example.com' },
      undefined,
      `URL policy refused ${SERVER} https://rebind.example.com: rebind.example.com resolves to 127.0.0.1, a loopback address, ${NOT_ALLOWED}`,
    ],
    [
      'server: host:port without a scheme (client-go adds one)',
      { server: '127.0.0.1:9001' },
      undefined,
      `URL policy refused ${SERVER} https://127.0.0.1:9001: 127.0.0.1, a loopback address, ${NOT_ALLOWED}`,
    ],
    [
      'server: IPv6 loopback',
      { server: 'https://[::1]:6443' },
      undefined,
      `URL policy refused ${SERVER} https://[::1]:6443: ::1, a loopback address, ${NOT_ALLOWED}`,
    ],
    [
      'server: credentials, path and query are not echoed',
      { server: 'https://admin:hunter2@127.0.0.1:9001/api?token=abc' },
      undefined,
      `URL policy refused ${SERVER} https://127.0.0.1:9001: 127.0.0.1, a loopback address, ${NOT_ALLOWED}`,
    ],
    [
      'server: a backslash before the path (parsers disagree on the host)',
      { server: 'https://api.prod.example.com\\@127.0.0.1:9001/' },
      undefined,
      `URL policy refused ${SERVER}: a "\\" before the path is not allowed (URL parsers disagree on which host it names)`,
    ],
    [
      'server: a scheme client-go does not speak',
      { server: 'ssh://api.prod.example.com' },
      undefined,
      `URL policy refused ${SERVER} ssh://api.prod.example.com: scheme ssh is not allowed`,
    ],
    [
      'server: the placeholder kapp expands (to nothing: its environment has no KUBERNETES_SERVICE_HOST)',
      // biome-ignore lint/suspicious/noTemplateCurlyInString: the literal kapp expands
      { server: 'https://${KAPP_KUBERNETES_SERVICE_HOST_PORT}' },
      undefined,
      `URL policy refused ${SERVER} https://${'$'}{kapp_kubernetes_service_host_port}: host ${'$'}{kapp_kubernetes_service_host_port} does not resolve (ENOTFOUND)`,
    ],
    [
      'proxy-url: link-local, with a public server',
      { server: 'https://api.prod.example.com', 'proxy-url': 'http://169.254.170.2:80' },
      undefined,
      `URL policy refused ${PROXY}: ${KUBECONFIG_PROXY_REFUSED}`,
    ],
    [
      'proxy-url: socks5 to loopback',
      { server: 'https://api.prod.example.com', 'proxy-url': 'socks5://127.0.0.1:1080' },
      undefined,
      `URL policy refused ${PROXY}: ${KUBECONFIG_PROXY_REFUSED}`,
    ],
    [
      'proxy-url: a local file',
      { server: 'https://api.prod.example.com', 'proxy-url': 'file:///var/task/x' },
      undefined,
      `URL policy refused ${PROXY}: ${KUBECONFIG_PROXY_REFUSED}`,
    ],
    [
      'proxy-url: a public proxy (kapp goes through the egress proxy instead; proxies are not chained)',
      { server: 'https://api.prod.example.com', 'proxy-url': 'http://proxy.example.com:3128' },
      undefined,
      `URL policy refused ${PROXY}: ${KUBECONFIG_PROXY_REFUSED}`,
    ],
    [
      'auth-provider oidc: a refresh token sent to the issuer on the metadata endpoint',
      { server: 'https://api.prod.example.com' },
      {
        'auth-provider': {
          name: 'oidc',
          config: { 'client-id': 'k', 'idp-issuer-url': 'http://169.254.169.254', 'refresh-token': 'r' },
        },
      },
      `URL policy refused kubeconfig users[0].user.auth-provider.config.idp-issuer-url: ${REFRESHING_AUTH_PROVIDER_REFUSED}`,
    ],
    [
      'auth-provider oidc: a refreshing provider on a public issuer (its token endpoint is unchecked)',
      { server: 'https://api.prod.example.com' },
      {
        'auth-provider': {
          name: 'oidc',
          config: { 'client-id': 'k', 'idp-issuer-url': 'https://api.prod.example.com', 'refresh-token': 'r' },
        },
      },
      `URL policy refused kubeconfig users[0].user.auth-provider.config.idp-issuer-url: ${REFRESHING_AUTH_PROVIDER_REFUSED}`,
    ],
  ])('%s', async (_name, cluster, user, message) => {
    expect(await refusal(kubeconfig(cluster, user))).toBe(message);
  });

  it('checks every cluster, not only the current context', async () => {
    const yaml = stringify({
      clusters: [
        { name: 'ok', cluster: { server: 'https://api.prod.example.com' } },
        { name: 'other', cluster: { server: 'https://169.254.169.254' } },
      ],
      contexts: [{ name: 'ctx', context: { cluster: 'ok', user: '' } }],
      'current-context': 'ctx',
    });
    expect(await refusal(yaml)).toBe(
      `URL policy refused kubeconfig clusters[1].cluster.server https://169.254.169.254: 169.254.169.254, ${LINK_LOCAL}, ${NOT_ALLOWED}`,
    );
  });
});

describe('kubeconfig Secret under the URL policy: allowed', () => {
  it.each<[string, Record<string, unknown>, Record<string, unknown>?]>([
    ['a public API server', { server: 'https://api.prod.example.com:6443' }],
    [
      'an oidc provider with an id-token and no refresh token (it sends nothing)',
      { server: 'https://api.prod.example.com' },
      {
        'auth-provider': {
          name: 'oidc',
          config: { 'client-id': 'k', 'idp-issuer-url': 'http://169.254.169.254', 'id-token': 'x.y.z' },
        },
      },
    ],
    ['an empty server (client-go refuses the config before any request)', { server: '' }],
  ])('%s', async (_name, cluster, user) => {
    expect(await refusal(kubeconfig(cluster, user))).toBeUndefined();
  });

  it('lets the fleet allow-list name a private API server: a CIDR, a host, or host:port with the default port', async () => {
    const policy = parseUrlPolicy('enforce', 'kube.corp:443, 10.50.0.0/16', 'enforce');
    expect(await refusal(kubeconfig({ server: 'https://kube.corp' }), policy)).toBeUndefined();
    expect(await refusal(kubeconfig({ server: 'https://10.50.1.1:6443' }), policy)).toBeUndefined();
    // Same host, another port: refused.
    expect(await refusal(kubeconfig({ server: 'https://kube.corp:6443' }), policy)).toBe(
      `URL policy refused ${SERVER} https://kube.corp:6443: kube.corp resolves to 10.20.3.4, a private address, ${NOT_ALLOWED}`,
    );
  });

  it('checks nothing when the policy is off (the embedded default, as kapp-controller)', async () => {
    expect(await refusal(kubeconfig({ server: 'https://127.0.0.1:9001' }), { mode: 'off', allow: [] })).toBeUndefined();
  });

  it('lists a server without a scheme as both https and http', () => {
    expect(kubeconfigUrls(restrictKubeconfig(kubeconfig({ server: 'kube.corp:6443' })).yaml)).toEqual([
      { label: SERVER, kind: 'server', url: 'https://kube.corp:6443' },
      { label: SERVER, kind: 'server', url: 'http://kube.corp:6443' },
    ]);
  });
});

describe('deploy and delete stages with a refused kubeconfig Secret', () => {
  const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
  const MANIFEST_KEY = templateArtifactKey(sha256Hex(MANIFEST));
  const REFUSED = `Deploying: URL policy refused ${SERVER} https://127.0.0.1:9001: 127.0.0.1, a loopback address, ${NOT_ALLOWED}`;
  const spec = { serviceAccountName: undefined, cluster: { kubeconfigSecretRef: { name: 'target' } } };

  function world(metadata: Record<string, unknown> = {}, policy: UrlPolicy = ENFORCE) {
    const w = appWorld({
      app: appObject({ status: SUCCEEDED_BEFORE, spec, metadata } as never),
      tmpRoot: path.join(tempDir(), 'scratch'),
      config: { urlPolicy: policy },
    });
    w.cluster.secrets.set(`${REF.namespace}/target`, {
      metadata: { name: 'target', namespace: REF.namespace, uid: 'uid-target', resourceVersion: '1' },
      type: 'Opaque',
      data: { value: Buffer.from(kubeconfig({ server: 'https://127.0.0.1:9001' })) },
    } as never);
    w.runner.on('kapp', { stdout: 'Succeeded' });
    return w;
  }

  async function deploy(w: ReturnType<typeof world>) {
    await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
    const data = {
      object: REF,
      run: RUN,
      artifacts: { fetchKey: fetchArtifactKey('f'.repeat(64)), manifestKey: MANIFEST_KEY },
    };
    return await dispatchEvent(deployEvent(data, { time: new Date(NOW) }), w.deps);
  }

  it('deploy: fails with the refusal in status, kapp never started', async () => {
    const w = world();
    await deploy(w);
    expect(w.tools()).toEqual([]);
    expect(w.outcomes()).toEqual([['deploy', 'failed']]);
    const status = w.statuses().at(-1);
    expect(status?.usefulErrorMessage).toBe(REFUSED);
    expect(status?.deploy).toMatchObject({ exitCode: -1, error: REFUSED, finished: true });
    expect(status?.conditions).toEqual([
      expect.objectContaining({ type: 'ReconcileFailed', status: 'True', message: REFUSED }),
    ]);
  });

  it('deploy: the same Secret runs kapp when the policy is off', async () => {
    const w = world({}, { mode: 'off', allow: [] });
    await deploy(w);
    expect(w.tools()).toEqual(['kapp']);
    expect(w.outcomes()).toEqual([['deploy', 'succeeded']]);
  });

  it('deploy: an allowed server is reached through the egress proxy (every cluster proxy-url set)', async () => {
    const w = world({}, parseUrlPolicy('enforce', '127.0.0.1:9001', 'enforce'));
    w.deps.egressProxyUrl = async () => 'http://127.0.0.1:41234';
    await deploy(w);
    expect(w.tools()).toEqual(['kapp']);
    const yaml = w.runner.calls[0]?.env?.KAPP_KUBECONFIG_YAML ?? '';
    expect(kubeconfigUrls(yaml)).toEqual([
      { label: SERVER, kind: 'server', url: 'https://127.0.0.1:9001' },
      { label: PROXY, kind: 'proxy', url: 'http://127.0.0.1:41234' },
    ]);
  });

  it('delete: fails with the refusal (Deleting: ...), kapp never started, the finalizer stays', async () => {
    const w = world({ finalizers: [Finalizer.App], deletionTimestamp: NOW });
    await dispatchEvent(deleteEvent({ object: REF, run: RUN }, { time: new Date(NOW) }), w.deps);
    expect(w.tools()).toEqual([]);
    expect(w.app()?.metadata.finalizers).toEqual([Finalizer.App]);
    expect(w.statuses().at(-1)?.usefulErrorMessage).toBe(REFUSED.replace(/^Deploying: /, 'Deleting: '));
  });
});
