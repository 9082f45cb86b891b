import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import {
  canonicalJson,
  fetchArtifactKey,
  isSha256Hex,
  parseArtifactKey,
  renderCacheKey,
  renderInputHash,
  repoIndexKey,
  repoIndexManifestKey,
  repoIndexRecordKey,
  sha256Hex,
  templateArtifactKey,
} from '../../functions/lib/artifact/index.js';
import { keyProblem } from '../../functions/lib/store/index.js';

const A = 'a'.repeat(64);
const B = 'b'.repeat(64);

describe('artifact keys', () => {
  it.each([
    [fetchArtifactKey(A), `artifacts/fetch/sha256/${A}.tgz`, 'fetch'],
    [templateArtifactKey(A), `artifacts/template/sha256/${A}.yaml`, 'template'],
    [repoIndexKey(A), `artifacts/index/sha256/${A}.json`, 'index'],
    [repoIndexManifestKey(A), `artifacts/index/sha256/${A}.yaml`, 'index-manifest'],
    [repoIndexRecordKey(A), `cache/index/sha256/${A}.json`, 'index-record'],
    [renderCacheKey(A), `cache/render/sha256/${A}.json`, 'render-cache'],
  ])('%s', (key, expected, kind) => {
    expect(key).toBe(expected);
    expect(parseArtifactKey(key)).toEqual({ kind, sha256: A });
    expect(keyProblem(key)).toBeUndefined();
  });

  it.each(['', 'abc', A.toUpperCase(), `sha256:${A}`, `${A}0`, `${'g'.repeat(64)}`])('refuses digest %j', (hex) => {
    expect(() => fetchArtifactKey(hex)).toThrow(
      new TypeError('invalid fetch digest: expected 64 lowercase hex characters'),
    );
    expect(isSha256Hex(hex)).toBe(false);
  });

  it('does not parse foreign keys', () => {
    expect(parseArtifactKey(`artifacts/fetch/sha256/${A}.yaml`)).toBeUndefined();
    expect(parseArtifactKey(`x/artifacts/fetch/sha256/${A}.tgz`)).toBeUndefined();
    expect(parseArtifactKey('receipts/x.json')).toBeUndefined();
  });

  it('hashes strings as UTF-8', () => {
    expect(sha256Hex('abc')).toBe('ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad');
    expect(sha256Hex(Buffer.from('abc'))).toBe(sha256Hex('abc'));
  });
});

describe('canonicalJson', () => {
  it('sorts keys at every level and drops undefined properties', () => {
    expect(canonicalJson({ b: 1, a: { d: [3, { z: null, y: 'x' }], c: true }, u: undefined })).toBe(
      '{"a":{"c":true,"d":[3,{"y":"x","z":null}]},"b":1}',
    );
  });

  it('gives the same text whatever the insertion order', () => {
    expect(canonicalJson({ x: 1, y: { b: 2, a: 1 } })).toBe(canonicalJson({ y: { a: 1, b: 2 }, x: 1 }));
  });

  it('escapes like JSON.stringify and sorts by code unit', () => {
    expect(canonicalJson({ é: '"\n', B: 1, a: 2 })).toBe('{"B":1,"a":2,"é":"\\"\\n"}');
  });

  it.each<[string, unknown, string]>([
    ['undefined', undefined, 'canonical json: (root): unsupported undefined'],
    ['NaN', { a: [1, Number.NaN] }, 'canonical json: a[1]: non-finite number'],
    ['a bigint', { a: { b: 1n } }, 'canonical json: a.b: unsupported bigint'],
    ['a function', [() => 1], 'canonical json: (root)[0]: unsupported function'],
    ['undefined in an array', [1, undefined], 'canonical json: (root)[1]: undefined in array'],
    ['a Date', { t: new Date(0) }, 'canonical json: t: not a plain object'],
    ['a Map', new Map(), 'canonical json: (root): not a plain object'],
  ])('refuses %s', (_name, value, message) => {
    expect(() => canonicalJson(value)).toThrow(new TypeError(message));
  });

  it('refuses cycles but accepts shared (acyclic) references', () => {
    const shared = { k: 1 };
    expect(canonicalJson({ a: shared, b: shared })).toBe('{"a":{"k":1},"b":{"k":1}}');
    const cyc: Record<string, unknown> = {};
    cyc.self = { back: cyc };
    expect(() => canonicalJson(cyc)).toThrow(new TypeError('canonical json: self.back: cycle'));
  });
});

describe('renderInputHash', () => {
  const inputs = {
    inputs: { fetch: A },
    template: [{ ytt: { paths: ['config'] } }, { kbld: {} }],
    values: { 'secret/default/values': B },
    tools: { ytt: '0.55.3', kbld: '0.46.0' },
  };

  it('is sha256 over the canonical JSON of {v: 2, inputs, template, values, tools}', () => {
    const canonical =
      `{"inputs":{"fetch":"${A}"},"template":[{"ytt":{"paths":["config"]}},{"kbld":{}}],` +
      `"tools":{"kbld":"0.46.0","ytt":"0.55.3"},"v":2,"values":{"secret/default/values":"${B}"}}`;
    expect(renderInputHash(inputs)).toBe(createHash('sha256').update(canonical).digest('hex'));
  });

  it('ignores key order and changes with any input', () => {
    const h = renderInputHash(inputs);
    expect(
      renderInputHash({
        tools: { kbld: '0.46.0', ytt: '0.55.3' },
        values: inputs.values,
        template: inputs.template,
        inputs: inputs.inputs,
      }),
    ).toBe(h);
    expect(renderInputHash({ ...inputs, tools: { ...inputs.tools, ytt: '0.55.4' } })).not.toBe(h);
    expect(renderInputHash({ ...inputs, inputs: { fetch: B } })).not.toBe(h);
    expect(renderInputHash({ ...inputs, values: {} })).not.toBe(h);
    // Template steps are ordered: swapping them is a different render.
    expect(renderInputHash({ ...inputs, template: [...inputs.template].reverse() })).not.toBe(h);
  });
});
