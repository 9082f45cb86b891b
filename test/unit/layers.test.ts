import { describe, expect, it } from 'vitest';
import { layerTools } from '../../layers/build.js';
import { componentKey, wrapperDirectives } from '../../layers/gobuild.js';
import { COMPONENTS, component } from '../../layers/manifest.js';

describe('wrapperDirectives', () => {
  it('maps k8s staging replaces to the staging version and keeps godebug', () => {
    const gomod = [
      'module k8s.io/kubernetes',
      'go 1.24.0',
      'godebug default=go1.24',
      'require (',
      '\tk8s.io/api v0.0.0',
      ')',
      'replace (',
      '\tk8s.io/api => ./staging/src/k8s.io/api',
      '\tgithub.com/x/y => github.com/x/y v1.2.3 // pinned',
      ')',
      'replace go.etcd.io/etcd => ./FORBIDDEN_DEPENDENCY',
    ].join('\n');
    expect(wrapperDirectives(gomod, 'v0.34.4')).toEqual([
      'godebug default=go1.24',
      'replace k8s.io/api => k8s.io/api v0.34.4',
      'replace github.com/x/y => github.com/x/y v1.2.3',
    ]);
  });

  it('drops local replaces when no version is given', () => {
    expect(wrapperDirectives('replace go.etcd.io/etcd/api/v3 => ../api\n')).toEqual([]);
  });

  it('reads godebug blocks', () => {
    expect(wrapperDirectives('godebug (\n\tx509negativeserial=1\n\tdefault=go1.23\n)\n')).toEqual([
      'godebug x509negativeserial=1',
      'godebug default=go1.23',
    ]);
  });
});

describe('manifest', () => {
  it('gives each layer only what its stage runs', () => {
    expect(layerTools('fetch').map((t) => t.bin)).toEqual(['vendir', 'imgpkg', 'helm']);
    expect(layerTools('template').map((t) => t.bin)).toEqual([
      'ytt',
      'kbld',
      'helm',
      'sops',
      'age',
      'age-keygen',
      'cue',
    ]);
    expect(layerTools('deploy').map((t) => t.bin)).toEqual(['kapp']);
  });

  it('keys caches by name, version and recipe', () => {
    const ytt = component('ytt');
    expect(componentKey(ytt)).toMatch(/^ytt-v0\.55\.3-[0-9a-f]{10}$/);
    expect(componentKey({ ...ytt, stamps: [] })).not.toEqual(componentKey(ytt));
    expect(new Set(COMPONENTS.map(componentKey)).size).toBe(COMPONENTS.length);
  });
});
