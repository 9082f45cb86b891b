import { describe, expect, it } from 'vitest';
import { LEASE_ACQUIRED_MESSAGE } from '../../events/forwarder/leader.js';
import {
  inClusterToolIsolation,
  kubeSourceOf,
  readStartSettings,
  SHARED_TOOL_UID_SETTING,
  startBanner,
} from '../../scripts/start-settings.js';

describe('npm start settings', () => {
  it('leaves the kapp-controller-config namespace to the runtime default when unset or blank', () => {
    expect(readStartSettings([], {})).toEqual({});
    expect(readStartSettings([], { KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: ' ' })).toEqual({});
  });

  it('reads the namespace from the Lambda functions’ variable, as kapp-controller users keep it', () => {
    expect(readStartSettings([], { KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: 'kapp-controller' })).toEqual({
      controllerConfigNamespace: 'kapp-controller',
    });
  });

  it('takes the flag over the variable', () => {
    expect(
      readStartSettings(['--controller-config-namespace', 'kapp-controller'], {
        KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: 'other',
      }),
    ).toEqual({ controllerConfigNamespace: 'kapp-controller' });
    expect(readStartSettings(['--controller-config-namespace=kc'], {})).toEqual({ controllerConfigNamespace: 'kc' });
  });

  it('refuses a name that is not a namespace, naming where it came from', () => {
    expect(() => readStartSettings(['--controller-config-namespace', 'Kapp_Controller'], {})).toThrow(
      /--controller-config-namespace: expected a namespace name/,
    );
    expect(() => readStartSettings([], { KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: 'x'.repeat(64) })).toThrow(
      /KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: expected a namespace name/,
    );
  });

  it('reads the inline fetch cap as the Lambda functions do, refusing what they refuse', () => {
    expect(readStartSettings([], { KAPP_LAMBDA_MAX_INLINE_BYTES: '1048576' })).toEqual({ maxInlineBytes: 1_048_576 });
    expect(readStartSettings([], { KAPP_LAMBDA_MAX_INLINE_BYTES: ' ' })).toEqual({});
    expect(() => readStartSettings([], { KAPP_LAMBDA_MAX_INLINE_BYTES: '64Mi' })).toThrow(
      'KAPP_LAMBDA_MAX_INLINE_BYTES: expected an integer in [1, 1073741824], received "64Mi"',
    );
    expect(() => readStartSettings([], { KAPP_LAMBDA_MAX_INLINE_BYTES: String(2 ** 30 + 1) })).toThrow(
      /^KAPP_LAMBDA_MAX_INLINE_BYTES: expected an integer in \[1, 1073741824\]/,
    );
  });

  it('reads the fetch stall rule as the Lambda functions do, a value unset taking its default', () => {
    expect(readStartSettings([], { KAPP_LAMBDA_FETCH_STALL_MIN_BYTES: '1024' })).toEqual({
      fetchStall: { windowMs: 60_000, minBytes: 1024 },
    });
    expect(readStartSettings([], { KAPP_LAMBDA_FETCH_STALL_SECONDS: '30' })).toEqual({
      fetchStall: { windowMs: 30_000, minBytes: 4096 },
    });
    expect(() => readStartSettings([], { KAPP_LAMBDA_FETCH_STALL_SECONDS: '901' })).toThrow(
      /^KAPP_LAMBDA_FETCH_STALL_SECONDS: expected an integer in \[1, 900\]/,
    );
  });

  it('refuses an unknown option and answers --help', () => {
    expect(() => readStartSettings(['--controller-config-ns', 'x'], {})).toThrow();
    expect(readStartSettings(['-h'], {})).toEqual({ help: true });
  });
});

describe('npm start banner', () => {
  it('tells what to wait for without being the line itself, so a grep for it waits', () => {
    const banner = startBanner(true);
    expect(banner).not.toContain(LEASE_ACQUIRED_MESSAGE);
    // The pattern the banner quotes finds the real log line, and not the banner.
    const quoted = /grep '([^']+)'/.exec(banner)?.[1];
    expect(quoted).toBeDefined();
    const pattern = new RegExp(quoted as string);
    expect(pattern.test(`{"level":30,"msg":"${LEASE_ACQUIRED_MESSAGE}"}`)).toBe(true);
    expect(pattern.test(banner)).toBe(false);
  });

  it('says nothing of a lease without leader election', () => {
    expect(startBanner(false)).not.toMatch(/lease/);
  });

  it('serves the kubeconfig first, the cluster it runs in next, then ~/.kube/config, else a local control plane', () => {
    const files = new Set(['/k/one', '/home/u/.kube/config']);
    const exists = (f: string) => files.has(f);
    const pod = { KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' };
    expect(kubeSourceOf({ ...pod, KUBECONFIG: '/k/one:/k/two' }, '/home/u', exists)).toEqual({
      kind: 'kubeconfig',
      path: '/k/one',
    });
    expect(kubeSourceOf(pod, '/home/u', exists)).toEqual({
      kind: 'in-cluster',
      serviceAccountDir: '/var/run/secrets/kubernetes.io/serviceaccount',
    });
    expect(
      kubeSourceOf({ ...pod, KUBECONFIG: '/k/missing', KAPP_LAMBDA_SERVICEACCOUNT_DIR: '/t/sa' }, '/h', exists),
    ).toEqual({ kind: 'in-cluster', serviceAccountDir: '/t/sa' });
    expect(kubeSourceOf({}, '/home/u', exists)).toEqual({ kind: 'kubeconfig', path: '/home/u/.kube/config' });
    expect(kubeSourceOf({ KUBERNETES_SERVICE_HOST: ' ' }, '/elsewhere', exists)).toEqual({ kind: 'local' });
  });

  it('refuses to serve its cluster as a non-root user, whose tools would read its token, unless allowed', () => {
    const pod = { kind: 'in-cluster', serviceAccountDir: '/sa' } as const;
    expect(inClusterToolIsolation(pod, true, {})).toBeUndefined();
    expect(inClusterToolIsolation({ kind: 'kubeconfig', path: '/k' }, false, {})).toBeUndefined();
    expect(inClusterToolIsolation(pod, false, {})).toEqual({
      message: expect.stringMatching(/^refusing to serve the cluster as a non-root user: .*ServiceAccount token/),
      exit: true,
    });
    expect(inClusterToolIsolation(pod, false, { [SHARED_TOOL_UID_SETTING]: 'yes' })?.exit).toBe(true);
    expect(inClusterToolIsolation(pod, false, { [SHARED_TOOL_UID_SETTING]: 'allow' })).toEqual({
      message: expect.stringMatching(/^WARNING: not root/),
      exit: false,
    });
  });
});
