/**
 * A hostile `*.sops.yaml` in the fetched content whose metadata names an `hc_vault` master key:
 * sops 3.13.3 `--decrypt` sent `PUT http://127.0.0.1:18777/v1/transit/decrypt/k` to the address
 * the file named and printed the response into its error (so into status), a request from the
 * template function that the URL policy never sees. Such files are now refused before sops runs.
 */
import { describe, expect, it } from 'vitest';
import { sopsInputError, sopsRemoteKeyError } from '../../functions/lib/template/sops.js';

const ENC = 'ENC[AES256_GCM,data:aGVsbG8=,iv:AAAAAAAAAAAAAAAAAAAAAA==,tag:AAAAAAAAAAAAAAAAAAAAAA==,type:str]';
const file = (meta: string) =>
  `a: ${ENC}\nsops:\n${meta}    lastmodified: "2024-01-01T00:00:00Z"\n    mac: ${ENC}\n    version: 3.8.1\n`;

describe('sops files naming remote master keys', () => {
  it.each<[string, string, string]>([
    [
      'hc_vault at the top level',
      '    hc_vault:\n        - vault_address: http://127.0.0.1:9001\n          engine_path: transit\n          key_name: k\n          enc: vault:v1:x\n',
      'hc_vault',
    ],
    ['aws kms', '    kms:\n        - arn: arn:aws:kms:us-east-1:1:key/x\n          enc: x\n', 'kms'],
    [
      'azure_kv',
      '    azure_kv:\n        - vault_url: https://169.254.169.254\n          name: k\n          version: v\n',
      'azure_kv',
    ],
    [
      'hc_vault inside key_groups, after an age key',
      '    key_groups:\n        - age:\n            - recipient: age1x\n              enc: x\n          hc_vault:\n            - vault_address: http://127.0.0.1:9001\n              enc: x\n',
      'hc_vault',
    ],
  ])('%s is refused', (_n, meta, kind) => {
    expect(sopsRemoteKeyError(file(meta))).toBe(
      `its sops metadata names a ${kind} key (only pgp and age keys are used)`,
    );
  });

  it('a file hiding its metadata from our parser is refused, not left to sops', () => {
    expect(sopsRemoteKeyError(`sops: {}\nsops:\n    hc_vault: [{vault_address: "http://127.0.0.1:9001"}]\n`)).toBe(
      'it is not valid YAML',
    );
    expect(
      sopsRemoteKeyError(
        `x: &m\n    hc_vault: [{vault_address: "http://127.0.0.1:9001"}]\nsops:\n    <<: *m\n    version: 3.8.1\n`,
      ),
    ).toBe('its sops metadata names a hc_vault key (only pgp and age keys are used)');
  });

  it('pgp and age files pass', () => {
    expect(sopsRemoteKeyError(file('    age:\n        - recipient: age1x\n          enc: x\n'))).toBeUndefined();
    expect(sopsRemoteKeyError(file('    pgp:\n        - fp: ABC\n          enc: x\n    kms: []\n'))).toBeUndefined();
    expect(sopsRemoteKeyError('plain: yaml\n')).toBeUndefined();
  });
});

/**
 * The same file in another encoding: sops's YAML reader decodes UTF-16 after its byte-order mark
 * (and skips a UTF-8 one), while the check above read the bytes as UTF-8 and, for UTF-16, found
 * no metadata at all, so the file passed and sops contacted the vault address it names.
 */
describe('sops files not in plain UTF-8', () => {
  const hostile = file(
    '    hc_vault:\n        - vault_address: http://127.0.0.1:9001\n          engine_path: transit\n          key_name: k\n          enc: vault:v1:x\n',
  );
  const utf16be = (t: string) => Buffer.from(t, 'utf16le').swap16();
  it.each<[string, Buffer]>([
    ['UTF-16 LE with its mark', Buffer.concat([Buffer.from([0xff, 0xfe]), Buffer.from(hostile, 'utf16le')])],
    ['UTF-16 BE with its mark', Buffer.concat([Buffer.from([0xfe, 0xff]), utf16be(hostile)])],
    ['UTF-8 with a mark', Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), Buffer.from(hostile)])],
    ['UTF-32 LE with its mark', Buffer.from([0xff, 0xfe, 0x00, 0x00, 0x61, 0, 0, 0])],
    ['UTF-32 BE with its mark', Buffer.from([0x00, 0x00, 0xfe, 0xff, 0, 0, 0, 0x61])],
  ])('%s is refused', (_n, bytes) => {
    expect(sopsInputError(bytes)).toBe('it starts with a byte-order mark (only UTF-8 without one is read)');
  });

  it('bytes that are not UTF-8 are refused (a mark-less UTF-16 file, Latin-1, a lone continuation byte)', () => {
    expect(sopsInputError(Buffer.from(`\u00e9${hostile}`, 'latin1'))).toBe('it is not valid UTF-8');
    expect(sopsInputError(Buffer.from([0x61, 0x3a, 0x20, 0x80, 0x0a]))).toBe('it is not valid UTF-8');
    expect(sopsInputError(Buffer.from('\ud800a: b\n', 'utf16le'))).toBe('it is not valid UTF-8');
  });

  it('plain UTF-8 is read as before: the remote key is refused, an age file passes', () => {
    expect(sopsInputError(Buffer.from(hostile))).toBe(
      'its sops metadata names a hc_vault key (only pgp and age keys are used)',
    );
    expect(
      sopsInputError(Buffer.from(file('    age:\n        - recipient: age1x\n          enc: x\n'))),
    ).toBeUndefined();
  });
});
