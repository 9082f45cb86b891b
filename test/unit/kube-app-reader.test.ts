/**
 * The deploy stage's App-identity transports (`restTransportForKubeconfig`): one per kubeconfig,
 * kept (with its connections) while the same kubeconfig comes back, bounded.
 */
import { describe, expect, it } from 'vitest';
import { APP_READER_TRANSPORTS, restTransportForKubeconfig } from '../../functions/lib/kube/registry.js';

const kubeconfig = (token: string) =>
  JSON.stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:6443' } }],
    users: [{ name: 'u', user: { token } }],
    contexts: [{ name: 'x', context: { cluster: 'c', user: 'u', namespace: 'ns' } }],
    'current-context': 'x',
  });

describe('restTransportForKubeconfig', () => {
  it('gives the same kubeconfig the same transport, another token another one', () => {
    const a = restTransportForKubeconfig(kubeconfig('t1'));
    expect(restTransportForKubeconfig(kubeconfig('t1'))).toBe(a);
    expect(restTransportForKubeconfig(kubeconfig('t2'))).not.toBe(a);
  });

  it('keeps at most APP_READER_TRANSPORTS, dropping the least recently asked for', () => {
    const first = restTransportForKubeconfig(kubeconfig('first'));
    const recent = restTransportForKubeconfig(kubeconfig('recent'));
    for (let i = 0; i < APP_READER_TRANSPORTS - 1; i++) {
      restTransportForKubeconfig(kubeconfig(`other-${i}`));
      expect(restTransportForKubeconfig(kubeconfig('recent'))).toBe(recent);
    }
    expect(restTransportForKubeconfig(kubeconfig('first'))).not.toBe(first);
  });

  it('refuses a text that is not a kubeconfig without quoting it', () => {
    expect(() => restTransportForKubeconfig('{ secret-token: [')).toThrow(
      /^the App kubeconfig is not a valid kubeconfig$/,
    );
  });
});
