/**
 * A kubeconfig Secret holding kapp's `${KAPP_KUBERNETES_SERVICE_HOST_PORT}` placeholder is
 * refused under an enforced URL policy (s19): kapp replaces it over the whole kubeconfig (with an
 * empty value for a Secret), so the policy would check another URL than the one kapp uses.
 * Through the deploy stage with the fake cluster and runner; the policy off keeps
 * kapp-controller's behaviour.
 */
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import { stringify } from 'yaml';
import { deployEvent } from '../../events/schema.js';
import { fetchArtifactKey, sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import { restrictKubeconfig } from '../../functions/lib/deploy/kubeconfig-restrict.js';
import { type UrlPolicy, UrlPolicyError } from '../../functions/lib/fetch/url-policy.js';
import {
  refuseServiceHostPlaceholder,
  SERVICE_HOST_PLACEHOLDER_REFUSED,
} from '../../functions/lib/pipeline/app/kubeconfig-policy.js';
import { dispatchEvent } from '../../functions/lib/pipeline/dispatch.js';
import { appObject, appWorld, NOW, REF, RUN, SUCCEEDED_BEFORE } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

const tempDir = useTempDir('kubeconfig-placeholder-');
// biome-ignore lint/suspicious/noTemplateCurlyInString: the literal placeholder kapp expands.
const PLACEHOLDER = '${KAPP_KUBERNETES_SERVICE_HOST_PORT}';
const kubeconfig = (server: string) =>
  stringify({
    apiVersion: 'v1',
    kind: 'Config',
    clusters: [{ name: 'c', cluster: { server } }],
    users: [{ name: 'u', user: { token: 't0ken' } }],
    contexts: [{ name: 'ctx', context: { cluster: 'c', user: 'u' } }],
    'current-context': 'ctx',
  });

describe('refuseServiceHostPlaceholder', () => {
  it.each([`https://${PLACEHOLDER}@169.254.169.254`, `https://${PLACEHOLDER}`, `https://x${PLACEHOLDER}.example.com`])(
    'refuses server %s',
    (server) => {
      const yaml = restrictKubeconfig(kubeconfig(server)).yaml;
      expect(() => refuseServiceHostPlaceholder(yaml)).toThrow(UrlPolicyError);
      expect(() => refuseServiceHostPlaceholder(yaml)).toThrow(
        `URL policy refused kubeconfig Secret: ${SERVICE_HOST_PLACEHOLDER_REFUSED}`,
      );
    },
  );
  it('passes a kubeconfig without it (a $ alone is not the placeholder)', () => {
    expect(() =>
      refuseServiceHostPlaceholder(restrictKubeconfig(kubeconfig('https://api.example.com/$KAPP')).yaml),
    ).not.toThrow();
  });
});

describe('deploy stage with a kubeconfig Secret holding the placeholder', () => {
  const MANIFEST = 'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: cm\n';
  const MANIFEST_KEY = templateArtifactKey(sha256Hex(MANIFEST));
  const spec = { serviceAccountName: undefined, cluster: { kubeconfigSecretRef: { name: 'target' } } };

  async function deploy(policy: UrlPolicy) {
    const w = appWorld({
      app: appObject({ status: SUCCEEDED_BEFORE, spec } as never),
      tmpRoot: path.join(tempDir(), 'scratch'),
      config: { urlPolicy: policy },
    });
    w.cluster.secrets.set(`${REF.namespace}/target`, {
      metadata: { name: 'target', namespace: REF.namespace, uid: 'uid-target', resourceVersion: '1' },
      type: 'Opaque',
      data: { value: Buffer.from(kubeconfig(`https://${PLACEHOLDER}@169.254.169.254`)) },
    } as never);
    w.runner.on('kapp', { stdout: 'Succeeded' });
    await w.store.putIfAbsent(MANIFEST_KEY, Buffer.from(MANIFEST));
    const data = {
      object: REF,
      run: RUN,
      artifacts: { fetchKey: fetchArtifactKey('f'.repeat(64)), manifestKey: MANIFEST_KEY },
    };
    await dispatchEvent(deployEvent(data, { time: new Date(NOW) }), w.deps);
    return w;
  }

  it('enforced: fails with the refusal in status, kapp never started', async () => {
    const w = await deploy({ mode: 'enforce', allow: [] });
    expect(w.tools()).toEqual([]);
    expect(w.outcomes()).toEqual([['deploy', 'failed']]);
    expect(w.statuses().at(-1)?.usefulErrorMessage).toBe(
      `Deploying: URL policy refused kubeconfig Secret: ${SERVICE_HOST_PLACEHOLDER_REFUSED}`,
    );
  });

  it('policy off: kapp runs, as kapp-controller', async () => {
    const w = await deploy({ mode: 'off', allow: [] });
    expect(w.tools()).toEqual(['kapp']);
  });
});
