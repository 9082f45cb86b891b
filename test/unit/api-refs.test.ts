import { describe, expect, it } from 'vitest';
import { type AppRefsSpec, referencedConfigMaps, referencedSecrets } from '../../functions/lib/api/refs.js';

const spec: AppRefsSpec = {
  fetch: [
    { inline: { pathsFrom: [{ secretRef: { name: 'inline-s' } }, { configMapRef: { name: 'inline-cm' } }] } },
    { image: { url: 'i', secretRef: { name: 'image-s' } } },
    { imgpkgBundle: { image: 'b', secretRef: { name: 'bundle-s' } } },
    { http: { url: 'h', secretRef: { name: 'http-s' } } },
    { git: { url: 'g', secretRef: { name: 'git-s' } } },
    { helmChart: { name: 'c', repository: { url: 'r', secretRef: { name: 'helm-repo-s' } } } },
  ],
  template: [
    {
      ytt: {
        inline: { pathsFrom: [{ secretRef: { name: 'ytt-inline-s' } }, { configMapRef: { name: 'ytt-inline-cm' } }] },
        valuesFrom: [
          { secretRef: { name: 'ytt-values-s' } },
          { configMapRef: { name: 'ytt-values-cm' } },
          { path: 'x' },
        ],
      },
    },
    { helmTemplate: { valuesFrom: [{ secretRef: { name: 'helm-s' } }, { configMapRef: { name: 'helm-cm' } }] } },
    { cue: { valuesFrom: [{ secretRef: { name: 'cue-s' } }, { configMapRef: { name: 'cue-cm' } }] } },
    { sops: { age: { privateKeysSecretRef: { name: 'sops-keys' } } } },
    { kbld: {} },
  ],
};

describe('referencedSecrets / referencedConfigMaps (pkg/app/app.go SecretRefs, ConfigMapRefs)', () => {
  it('lists fetch and template Secret references, sorted, without sops keys', () => {
    expect(referencedSecrets(spec)).toEqual([
      'bundle-s',
      'cue-s',
      'git-s',
      'helm-repo-s',
      'helm-s',
      'http-s',
      'image-s',
      'inline-s',
      'ytt-inline-s',
      'ytt-values-s',
    ]);
  });

  it('lists ConfigMap references', () => {
    expect(referencedConfigMaps(spec)).toEqual(['cue-cm', 'helm-cm', 'inline-cm', 'ytt-inline-cm', 'ytt-values-cm']);
  });

  it('does not track the kubeconfig Secret or ServiceAccount, and deduplicates', () => {
    const s = {
      fetch: [{ git: { secretRef: { name: 'a' } } }, { http: { secretRef: { name: 'a' } } }],
      template: [],
      cluster: { kubeconfigSecretRef: { name: 'kubeconfig' } },
      serviceAccountName: 'sa',
    };
    expect(referencedSecrets(s)).toEqual(['a']);
  });

  it('follows upstream switch order for an entry with two sources', () => {
    // inline with pathsFrom wins over image: the image secret is not tracked.
    expect(
      referencedSecrets({ fetch: [{ inline: { pathsFrom: [] }, image: { secretRef: { name: 'img' } } }] }),
    ).toEqual([]);
    // inline without pathsFrom does not match its case, so the image case applies.
    expect(referencedSecrets({ fetch: [{ inline: {}, image: { secretRef: { name: 'img' } } }] })).toEqual(['img']);
  });

  it('is empty for an empty spec', () => {
    expect(referencedSecrets({})).toEqual([]);
    expect(referencedConfigMaps({})).toEqual([]);
  });
});
