/**
 * Secret detection in a render reads the manifest as kapp does (documents cut at `---` lines,
 * each read as YAML), not by pattern: every spelling below is a Secret for kapp v0.64.2 (checked
 * against its own reader, `k8s.io/apimachinery` YAMLReader plus sigs.k8s.io/yaml), and the
 * regular expressions this replaced took most of them for Secret-free renders, which were then
 * stored unsealed and shared by the fleet.
 */
import { describe, expect, it } from 'vitest';
import { manifestHasSecret } from '../../functions/lib/pipeline/artifacts.js';

describe('manifestHasSecret reads every YAML spelling of kind: Secret', () => {
  it.each<[string, string]>([
    ['flow style', '{kind: Secret, apiVersion: v1, metadata: {name: s}}\n'],
    ['a space before the colon', 'apiVersion: v1\nkind : Secret\n'],
    ['a !!str tag', 'kind: !!str Secret\n'],
    ['a verbatim tag', 'kind: !<tag:yaml.org,2002:str> Secret\n'],
    ['a quoted key', '"kind": Secret\n'],
    ['single-quoted key and value', "'kind': 'Secret'\n"],
    ['an alias value', 'a: &s Secret\nkind: *s\n'],
    ['an alias key', 'x: &k kind\n*k : Secret\n'],
    ['a plain value on the next line', 'kind:\n  Secret\n'],
    ['a value after a comment line', 'kind: # the kind\n  Secret\n'],
    ['a folded block scalar', 'kind: >-\n  Secret\n'],
    ['a literal block scalar', 'kind: |-\n  Secret\n'],
    ['a List item', 'kind: List\nitems:\n- apiVersion: v1\n  kind: Secret\n'],
    ['a flow List item', 'kind: List\nitems: [{kind: ConfigMap}, {kind: Secret}]\n'],
    ['JSON', '{"apiVersion":"v1","kind":"Secret"}'],
    ['JSON over two lines', '{"kind":\n  "Secret"}'],
    ['a document after a directive', 'kind: ConfigMap\n---\n%YAML 1.1\n---\nkind: Secret\n'],
    ['a tab after the colon', 'kind:\tSecret\n'],
    ['hex escapes', 'kind: "\\x53ecret"\n'],
    ['unicode escapes', 'kind: "S\\u0065cr\\U00000065t"\n'],
    ['an escaped key', '"k\\x69nd": Secret\n'],
    ['an escaped line break', 'kind: "Sec\\\n  ret"\n'],
    ['!!binary', 'kind: !!binary U2VjcmV0\n'],
    ['!!binary over lines', 'kind: !!binary |\n  U2Vj\n  cmV0\n'],
    ['a %-escaped binary tag', 'kind: !<tag:yaml.org,2002:%62inary> U2VjcmV0\n'],
    ['an explicit key', '? kind\n: Secret\n'],
    ['? glued to a flow key', '{?kind: Secret}\n'],
    ['? glued to a JSON key', '{?"kind":"Secret"}\n'],
    ['a duplicate kind (go-yaml keeps the last)', 'kind: ConfigMap\nkind: Secret\n'],
    ['a merge key', '<<: {kind: Secret}\n'],
    ['after a comment ended by U+2028', 'x: y # \u2028kind: Secret\n'],
    ['after a comment ended by NEL', 'x: y # \u0085kind: Secret\n'],
    ['after a comment ended by a bare CR', 'x: y # \rkind: Secret\n'],
    ['CRLF line ends', 'apiVersion: v1\r\nkind: Secret\r\n'],
    ['byte-order marks', '\uFEFF\uFEFFkind: Secret\n'],
    ['a trailing comment', 'kind: Secret # a comment\n'],
    ['the last of many documents', `${'---\nkind: ConfigMap\ndata: {a: b}\n'.repeat(50)}---\nkind: Secret\n`],
  ])('%s', (_name, manifest) => {
    expect(manifestHasSecret(manifest)).toBe(true);
  });
});

describe('manifestHasSecret leaves public renders shared', () => {
  it.each<[string, string]>([
    // Chosen: a string value is not a kind key. kapp deploys the ConfigMap with that text as
    // data; no Secret object is made from it.
    [
      'a ConfigMap whose data mentions kind: Secret in a block string',
      'kind: ConfigMap\ndata:\n  x: |\n    kind: Secret\n',
    ],
    ['a ConfigMap whose data mentions it in a quoted string', 'kind: ConfigMap\ndata: {x: "kind: Secret"}\n'],
    ['a kind that only starts with Secret', 'kind: ConfigMap\ndata:\n  kind: SecretStore\n'],
    ['a description naming a Secret', "description: the Secret containing ('Secret', 'ConfigMap') keys\nkind: X\n"],
    ['an enum of kinds', 'kind: CustomResourceDefinition\nenum:\n- Secret\n- ConfigMap\n'],
    ['a kind key whose value is a sequence', 'kind:\n- Secret\n'],
    ['Secret as a key', 'kind: ConfigMap\ndata: {Secret: kind}\n'],
    ['in flow style, kind:Secret without a space is one scalar', '{kind:Secret}\n'],
    ['a lowercase kind', 'kind: secret\n'],
    ['empty', ''],
  ])('%s', (_name, manifest) => {
    expect(manifestHasSecret(manifest)).toBe(false);
  });

  it('counts a document that may spell a Secret but does not parse as YAML as secret', () => {
    expect(manifestHasSecret('kind: ConfigMap\n---\nkind: Secret\n\tbad: [\n')).toBe(true);
    expect(manifestHasSecret('{kind: Secret\n')).toBe(true);
  });

  it('does not parse a document where no scalar can resolve to Secret, valid or not', () => {
    expect(manifestHasSecret('kind: ConfigMap\n\tbad: [\n')).toBe(false);
  });

  it('reads a render of a few MB (only its candidate documents are parsed)', () => {
    const doc = (i: number) =>
      `---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app-${i}\n  labels: {app: a${i}}\nspec:\n  template:\n    spec:\n      containers:\n      - name: c\n        image: registry.example/app:${i}\n        env:\n        - {name: A, valueFrom: {secretKeyRef: {name: s, key: k}}}\n      volumes:\n      - {name: v, secret: {secretName: the Secret of ${i}}}\n`;
    const render = Array.from({ length: 12_000 }, (_, i) => doc(i)).join('');
    expect(render.length).toBeGreaterThan(3_000_000);
    expect(manifestHasSecret(render)).toBe(false);
    expect(manifestHasSecret(`${render}---\n{kind: Secret}\n`)).toBe(true);
  });
});
