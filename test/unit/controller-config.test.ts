import { describe, expect, it } from 'vitest';
import { proxyEnv, proxyFor } from '../../functions/lib/fetch/cluster-trust.js';
import type { KubeConfigMap, KubeSecret } from '../../functions/lib/kube/port.js';
import { ClusterRateLimits } from '../../functions/lib/kube/rate-limit.js';
import { withClusterConfig } from '../../functions/lib/pipeline/cluster-config.js';
import type { PipelineDeps } from '../../functions/lib/pipeline/deps.js';
import {
  ControllerConfigCache,
  ControllerConfigError,
  describeControllerConfig,
  EMPTY_CONTROLLER_CONFIG,
  fetchConfigDigest,
  parseControllerConfigData,
  readControllerConfig,
} from '../../functions/lib/reconcile/controller-config.js';
import { SecretMask } from '../../functions/lib/reconcile/secret-mask.js';

const meta = (rv: string) => ({
  name: 'kapp-controller-config',
  namespace: 'kapp-lambda',
  uid: 'u',
  resourceVersion: rv,
});

function reader(secret?: Record<string, string>, cm?: Record<string, string>) {
  const calls: string[] = [];
  return {
    calls,
    async getSecret(ns: string, name: string): Promise<KubeSecret | undefined> {
      calls.push(`secret ${ns}/${name}`);
      if (!secret) return undefined;
      const data = Object.fromEntries(Object.entries(secret).map(([k, v]) => [k, Buffer.from(v)]));
      return { metadata: meta('7'), type: 'Opaque', data } as KubeSecret;
    },
    async getConfigMap(ns: string, name: string): Promise<KubeConfigMap | undefined> {
      calls.push(`configmap ${ns}/${name}`);
      return cm ? ({ metadata: meta('9'), data: cm, binaryData: {} } as KubeConfigMap) : undefined;
    },
  };
}

describe('parseControllerConfigData (Config.addDataToConfig)', () => {
  it('parses every key; empty values are unset; noProxy placeholder replaced once', () => {
    const c = parseControllerConfigData(
      {
        caCerts: 'PEM',
        httpProxy: 'http://proxy:3128',
        httpsProxy: '',
        noProxy: 'KAPPCTRL_KUBERNETES_SERVICE_HOST,.svc',
        dangerousSkipTLSVerify: 'reg.local',
        kappDeployRawOptions: '["--wait-timeout=2m"]',
        appDefaultSyncPeriod: '1m',
        appMinimumSyncPeriod: '',
        packageInstallDefaultSyncPeriod: '20m',
      },
      '10.96.0.1',
    );
    expect(c).toEqual({
      caCerts: 'PEM',
      proxy: { httpProxy: 'http://proxy:3128', noProxy: '10.96.0.1,.svc' },
      dangerousSkipTLSVerify: 'reg.local',
      kappDeployRawOptions: ['--wait-timeout=2m'],
      timer: { appDefaultSyncPeriodMs: 60_000, packageInstallDefaultSyncPeriodMs: 1_200_000 },
    });
  });

  it.each([
    [{ appMinimumSyncPeriod: 'soon' }, /^Unmarshaling appMinimumSyncPeriod as duration: /],
    [{ kappDeployRawOptions: '--diff' }, /^Unmarshaling kappDeployRawOptions as JSON: /],
    [{ kappDeployRawOptions: '[1]' }, /^Unmarshaling kappDeployRawOptions as JSON: /],
    [{ kappLambdaKubeAPIQPS: '-1' }, /^Parsing kappLambdaKubeAPIQPS: /],
    [{ kappLambdaKubeAPIQPS: 'fast' }, /^Parsing kappLambdaKubeAPIQPS: /],
    [{ kappLambdaKubeAPIBurst: '0' }, /^Parsing kappLambdaKubeAPIBurst: /],
    [{ kappLambdaKubeAPIBurst: '2.5' }, /^Parsing kappLambdaKubeAPIBurst: /],
    // A rate whose wait outlasts a function invocation: on Lambda one record of the cluster then
    // holds the invocation to its time limit, and the other clusters' records in its batch with it.
    [{ kappLambdaKubeAPIQPS: '0.001' }, /^Parsing kappLambdaKubeAPIQPS: /],
    [{ kappLambdaKubeAPIQPS: '1e-300' }, /^Parsing kappLambdaKubeAPIQPS: /],
    // Digits only, yet Infinity: the bucket refuses it (a RangeError on every event of the cluster).
    [{ kappLambdaKubeAPIBurst: '9'.repeat(400) }, /^Parsing kappLambdaKubeAPIBurst: /],
  ])('%j is refused with upstream’s error', (data, message) => {
    expect(() => parseControllerConfigData(data)).toThrow(ControllerConfigError);
    expect(() => parseControllerConfigData(data)).toThrow(message);
  });
});

describe('the recorded uid of the packaging global namespace (ours)', () => {
  it('kappLambdaPackagingGlobalNamespaceUID: trimmed; empty is unset; named by describeControllerConfig', () => {
    const uid = '3f0c2a4e-1b2c-4d5e-8f90-0123456789ab';
    const c = parseControllerConfigData({ kappLambdaPackagingGlobalNamespaceUID: ` ${uid}\n` });
    expect(c.packagingGlobalNamespaceUid).toBe(uid);
    expect(describeControllerConfig(c).keys).toEqual(['kappLambdaPackagingGlobalNamespaceUID']);
    expect(parseControllerConfigData({ kappLambdaPackagingGlobalNamespaceUID: '' })).toEqual({ timer: {} });
  });
});

describe('the client-side limit keys (ours)', () => {
  it('parse each key alone', () => {
    expect(parseControllerConfigData({ kappLambdaKubeAPIQPS: '7.5' }).kubeApi).toEqual({ qps: 7.5 });
    expect(parseControllerConfigData({ kappLambdaKubeAPIBurst: '12' }).kubeApi).toEqual({ burst: 12 });
    expect(parseControllerConfigData({ kappLambdaKubeAPIQPS: '' }).kubeApi).toBeUndefined();
    expect(parseControllerConfigData({ kappLambdaKubeAPIQPS: '0' }).kubeApi).toEqual({ qps: 0 });
    expect(parseControllerConfigData({ kappLambdaKubeAPIQPS: '1' }).kubeApi).toEqual({ qps: 1 });
  });

  it("set the cluster's bucket per key over the runtime-wide rate, else kapp-controller's 20 / 30", async () => {
    const limits = new ClusterRateLimits();
    const deps = (kubeApi?: { qps: number; burst: number }, cc?: Record<string, string>) =>
      ({
        config: { tmpRoot: '/tmp', toolVersions: {}, controllerVersion: '0', ...(kubeApi ? { kubeApi } : {}) },
        ...(cc ? { controllerConfig: async () => parseControllerConfigData(cc) } : {}),
      }) as unknown as PipelineDeps;
    await withClusterConfig(deps(), 'a', limits);
    expect(limits.bucket('a').rate).toEqual({ qps: 20, burst: 30 });
    await withClusterConfig(deps({ qps: 50, burst: 100 }, { kappLambdaKubeAPIQPS: '5' }), 'b', limits);
    expect(limits.bucket('b').rate).toEqual({ qps: 5, burst: 100 });
    await withClusterConfig(deps({ qps: 50, burst: 100 }, {}), 'b', limits);
    expect(limits.bucket('b').rate).toEqual({ qps: 50, burst: 100 });
    expect(limits.bucket('a').rate).toEqual({ qps: 20, burst: 30 });
  });
});

describe('readControllerConfig (Config.Reload)', () => {
  it('the Secret wins; the ConfigMap is not read then', async () => {
    const r = reader({ caCerts: 'A' }, { caCerts: 'B' });
    const c = await readControllerConfig(r, 'ns');
    expect(c.caCerts).toBe('A');
    expect(c.source).toBe('Secret/7');
    expect(r.calls).toEqual(['secret ns/kapp-controller-config']);
  });

  it('the ConfigMap when the Secret is absent; neither: every setting cleared', async () => {
    expect((await readControllerConfig(reader(undefined, { caCerts: 'B' }), 'ns')).source).toBe('ConfigMap/9');
    expect(await readControllerConfig(reader(), 'ns')).toBe(EMPTY_CONTROLLER_CONFIG);
  });

  it('describeControllerConfig names keys, never values', () => {
    const c = parseControllerConfigData({ httpProxy: 'http://user:hunter2@proxy:3128', caCerts: 'PEM' });
    const d = JSON.stringify(describeControllerConfig({ ...c, source: 'Secret/1' }));
    expect(d).toBe('{"source":"Secret/1","keys":["caCerts","httpProxy"]}');
  });
});

describe('ControllerConfigCache', () => {
  it('reads once per ttl, again after invalidate; a bad config keeps the last good one', async () => {
    let now = 0;
    let data: Record<string, string> = { caCerts: 'one' };
    let reads = 0;
    const invalid: string[] = [];
    const cache = new ControllerConfigCache({
      ttlMs: 1000,
      now: () => now,
      read: async () => {
        reads++;
        return parseControllerConfigData(data);
      },
      onInvalid: (id, err) => invalid.push(`${id}: ${err.message}`),
    });
    expect((await cache.get('a')).caCerts).toBe('one');
    data = { caCerts: 'two' };
    now = 999;
    expect((await cache.get('a')).caCerts).toBe('one');
    cache.invalidate('a');
    expect((await cache.get('a')).caCerts).toBe('two');
    expect(reads).toBe(2);
    data = { appDefaultSyncPeriod: 'x' };
    now = 5000;
    expect((await cache.get('a')).caCerts).toBe('two');
    expect(invalid).toEqual(['a: Unmarshaling appDefaultSyncPeriod as duration: time: invalid duration "x"']);
    expect(await cache.get('b')).toBe(EMPTY_CONTROLLER_CONFIG);
  });

  it('API errors propagate (the event is retried)', async () => {
    const cache = new ControllerConfigCache({
      ttlMs: 1000,
      read: async () => {
        throw new Error('GET secrets: 500');
      },
    });
    await expect(cache.get('a')).rejects.toThrow('GET secrets: 500');
  });
});

describe('withClusterConfig', () => {
  const base = {
    config: {
      tmpRoot: '/tmp',
      toolVersions: {},
      controllerVersion: '0',
      kappDeployRawOptions: ['--x'],
      timer: { appMinimumSyncPeriodMs: 60_000 },
    },
  } as unknown as PipelineDeps;

  it('lays the cluster’s keys over the runtime-wide ones and masks the proxy password', async () => {
    const mask = new SecretMask();
    const cc = parseControllerConfigData({
      httpsProxy: 'http://u:s3cret-pass@proxy:3128',
      appDefaultSyncPeriod: '2m',
      dangerousSkipTLSVerify: 'reg',
    });
    const d = await withClusterConfig({ ...base, secretMask: mask, controllerConfig: async () => cc }, 'c1');
    expect(d.clusterConfig).toBe(cc);
    expect(d.config.kappDeployRawOptions).toEqual(['--x']);
    expect(d.config.dangerousSkipTLSVerify).toBe('reg');
    expect(d.config.timer).toEqual({ appMinimumSyncPeriodMs: 60_000, appDefaultSyncPeriodMs: 120_000 });
    expect(mask.redact('proxy said s3cret-pass')).not.toContain('s3cret-pass');
  });

  it('without a source the deps are unchanged', async () => {
    expect(await withClusterConfig(base, 'c1')).toBe(base);
  });
});

describe('fetch trust and proxy', () => {
  it('fetchConfigDigest: empty for no fetch setting, differs per CA', () => {
    expect(fetchConfigDigest({})).toBe('');
    expect(fetchConfigDigest({ caCerts: 'a' })).not.toBe(fetchConfigDigest({ caCerts: 'b' }));
  });

  it('proxyEnv sets the lower and upper case variables of the keys set', () => {
    expect(proxyEnv({ httpProxy: 'http://p:1', noProxy: '.svc' })).toEqual({
      http_proxy: 'http://p:1',
      HTTP_PROXY: 'http://p:1',
      no_proxy: '.svc',
      NO_PROXY: '.svc',
    });
    expect(proxyEnv(undefined)).toEqual({});
  });

  it.each([
    ['http://a.example/x', 'http://p:1/'],
    ['https://a.example/x', 'http://s:2/'],
    ['http://127.0.0.1:8080/x', undefined],
    ['http://localhost/x', undefined],
    ['http://in.svc/x', undefined],
    ['http://svc/x', 'http://p:1/'],
    ['http://10.1.2.3/x', undefined],
    ['http://port.example:8080/x', undefined],
    ['http://port.example/x', 'http://p:1/'],
  ])('proxyFor(%s) = %s', (url, expected) => {
    const p = proxyFor(new URL(url), {
      httpProxy: 'http://p:1',
      httpsProxy: 's:2',
      noProxy: '.svc, 10.0.0.0/8, port.example:8080',
    });
    expect(p?.href).toBe(expected);
  });
});
