/**
 * sops step planning: key material, the empty sops config, which paths to walk, and the per-file
 * decrypt command. Mirrors kapp-controller `pkg/template/sops.go`.
 *
 * @module
 */

import { posix } from 'node:path';
import { parseAllDocuments } from 'yaml';
import { type RefObjects, secretNotFoundMessage } from '../api/refs.js';
import type { AppTemplateSops } from '../api/template.js';
import { InvalidPathError, scopedPath } from '../paths.js';
import { KappControllerError } from '../reconcile/result.js';
import { DEAD_PROXY_ENV, DECRYPTING_DIR_ERROR_PREFIX, type SopsStep, type StepContext } from './step.js';
import type { PlannedFile } from './values.js';

/** Upstream's text when sops would have to read a stream. */
export const SOPS_STREAM_UNSUPPORTED_MESSAGE = 'Templating data is not supported';

/** Upstream's text for a sops step with neither `pgp` nor `age`. */
export const UNSUPPORTED_SOPS_STRATEGY_MESSAGE = 'Unsupported SOPS strategy';

/** Prefix for key-material errors (`AttachErrorf("Building config: %s")`). */
export const SOPS_BUILD_CONFIG_PREFIX = 'Building config: ';

const SOPS_EXTENSIONS: ReadonlyArray<[string, string]> = [
  ['.sops.yml', '.yml'],
  ['.sops.yaml', '.yaml'],
];

/**
 * Where a sops file decrypts to: `x.sops.yml` becomes `x.yml`, `x.sops.yaml` becomes `x.yaml`;
 * any other file is not a sops file (`undefined`).
 *
 * @param path - a file path
 */
export function sopsDecryptedPath(path: string): string | undefined {
  for (const [ext, repl] of SOPS_EXTENSIONS) {
    if (path.endsWith(ext)) return path.slice(0, -ext.length) + repl;
  }
  return undefined;
}

/** sops metadata fields naming keys decrypted here, by the key material the App's Secret holds. */
const LOCAL_SOPS_KEY_TYPES = new Set(['pgp', 'age']);

/**
 * Why a sops YAML file is refused before sops runs, or `undefined`: its `sops` metadata (of any
 * document) lists a master key other than `pgp` or `age` (`hc_vault`, `kms`, `gcp_kms`,
 * `azure_kv`, ... at the top level or in `key_groups`), or it does not parse. sops tries every
 * master key in order, and for `hc_vault` it sends `PUT <vault_address>/v1/<engine>/decrypt/<key>`
 * to whatever address the file names and prints the response into its error (sops 3.13.3 did so for
 * `vault_address: http://127.0.0.1:...`): a request from the template function to an address of
 * the App author's choosing, which the URL policy never sees. kapp-controller only ever gives
 * sops pgp or age keys, so a file needing another key type could not be decrypted anyway. Files
 * that do not parse are refused rather than left to sops's parser.
 *
 * @param text - the file's content
 * @returns the reason, e.g. `its sops metadata names a hc_vault key (only pgp and age keys are used)`
 */
export function sopsRemoteKeyError(text: string): string | undefined {
  let docs: unknown[];
  try {
    docs = parseAllDocuments(text, { merge: true }).map((d) => {
      if ('errors' in d && d.errors.length > 0) throw d.errors[0];
      return d.toJS({ maxAliasCount: 64 });
    });
  } catch {
    return 'it is not valid YAML';
  }
  const foreign = (group: unknown): string | undefined => {
    if (group === null || typeof group !== 'object' || Array.isArray(group)) return undefined;
    for (const [k, v] of Object.entries(group)) {
      if (k === 'key_groups' || LOCAL_SOPS_KEY_TYPES.has(k) || !Array.isArray(v) || v.length === 0) continue;
      return k;
    }
    return undefined;
  };
  for (const doc of docs) {
    if (doc === null || typeof doc !== 'object' || Array.isArray(doc)) continue;
    const meta = (doc as Record<string, unknown>).sops;
    if (meta === undefined) continue;
    const groups = meta !== null && typeof meta === 'object' ? (meta as Record<string, unknown>).key_groups : undefined;
    for (const g of [meta, ...(Array.isArray(groups) ? groups : [])]) {
      const k = foreign(g);
      if (k !== undefined) return `its sops metadata names a ${k} key (only pgp and age keys are used)`;
    }
  }
  return undefined;
}

/** Byte-order marks sops's YAML reader (go-yaml v3) decodes or skips: UTF-32 BE/LE, UTF-8, UTF-16 BE/LE. */
const BYTE_ORDER_MARKS: readonly (readonly number[])[] = [
  [0x00, 0x00, 0xfe, 0xff],
  [0xff, 0xfe, 0x00, 0x00],
  [0xef, 0xbb, 0xbf],
  [0xfe, 0xff],
  [0xff, 0xfe],
];

/**
 * Why a sops file is refused before sops runs, or `undefined`: it starts with a byte-order mark,
 * is not valid UTF-8, or {@link sopsRemoteKeyError} refuses its text. sops's YAML reader decodes
 * UTF-16 after its mark, so a UTF-16 file naming a `hc_vault` key read here as UTF-8 showed no
 * key at all and passed, and sops then sent its request to the address the file names. Refused
 * rather than decoded as sops would: sops itself writes UTF-8 without a mark, and one encoding
 * read the same way on both sides leaves no second reading to get wrong.
 *
 * @param bytes - the file's content
 * @returns the reason, e.g. `it starts with a byte-order mark (only UTF-8 without one is read)`
 */
export function sopsInputError(bytes: Uint8Array): string | undefined {
  if (BYTE_ORDER_MARKS.some((m) => m.every((b, i) => bytes[i] === b))) {
    return 'it starts with a byte-order mark (only UTF-8 without one is read)';
  }
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true, ignoreBOM: true }).decode(bytes);
  } catch {
    return 'it is not valid UTF-8';
  }
  return sopsRemoteKeyError(text);
}

/**
 * The sops command for one file: `sops --config=<cfg> --decrypt <file>` with the step's env; its
 * stdout is written to {@link sopsDecryptedPath} (mode 0600) and the encrypted file removed.
 *
 * @param step - the planned sops step
 * @param file - absolute path of a sops file
 */
export function sopsDecryptCommand(
  step: SopsStep,
  file: string,
): { bin: 'sops'; args: string[]; env: Record<string, string> } {
  return { bin: 'sops', args: [...step.args, '--decrypt', file], env: { ...step.env } };
}

/**
 * The step error for a failed per-file decryption, exactly upstream's
 * `Decrypting dir: Decrypting file '<file>': Running sops: <stderr>, <process error>`.
 *
 * @param file - the sops file
 * @param stderr - sops' stderr
 * @param processError - Go-style process error text, e.g. `exit status 1`
 */
export function sopsDecryptFailureMessage(file: string, stderr: string, processError: string): string {
  return `${DECRYPTING_DIR_ERROR_PREFIX}Decrypting file '${file}': Running sops: ${stderr}, ${processError}`;
}

const CRC24_INIT = 0xb704ce;
const CRC24_POLY = 0x1864cfb;

function crc24(data: Uint8Array): number {
  let crc = CRC24_INIT;
  for (const byte of data) {
    crc ^= byte << 16;
    for (let i = 0; i < 8; i++) {
      crc <<= 1;
      if (crc & 0x1000000) crc ^= CRC24_POLY;
    }
  }
  return crc & 0xffffff;
}

/**
 * The binary keyring (`secring.gpg`) for the first ASCII-armored block in `armored`: the
 * dearmored packet stream, which is what upstream's `gpgKeyring.Write` re-serialises (private key,
 * user ids with self-signatures, subkeys with their signatures).
 *
 * @param armored - the concatenated Secret values
 * @returns the keyring bytes
 * @throws {Error} `openpgp: invalid argument: no armored data found`,
 *   `openpgp: invalid data: armor invalid` (bad base64 or checksum),
 *   `openpgp: invalid argument: expected public or private key block, got: <type>`, or
 *   `Expected to find private key within entity` (a public key block)
 */
export function dearmorPrivateKeyBlock(armored: string): Uint8Array {
  const lines = armored.split(/\r?\n/);
  // As Go's armor.Decode: a BEGIN line, optional "Key: value" headers, then a blank line; a block
  // without that shape is skipped in favour of the next BEGIN line.
  let begin = -1;
  let i = 0;
  for (let b = 0; b < lines.length && begin < 0; b++) {
    if (!/^-----BEGIN [^-]+-----\s*$/.test(lines[b]!)) continue;
    let j = b + 1;
    while (j < lines.length && lines[j]!.trim() !== '' && lines[j]!.includes(': ')) j++;
    if (j < lines.length && lines[j]!.trim() === '') {
      begin = b;
      i = j + 1;
    }
  }
  if (begin < 0) throw new Error('openpgp: invalid argument: no armored data found');
  const type = /^-----BEGIN ([^-]+)-----/.exec(lines[begin]!)![1]!;
  const endLine = `-----END ${type}-----`;
  let body = '';
  let checksum: string | undefined;
  for (; i < lines.length; i++) {
    const line = lines[i]!.trim();
    if (line === endLine) break;
    if (line.startsWith('=')) {
      checksum = line.slice(1);
      continue;
    }
    if (line !== '') body += line;
  }
  if (i >= lines.length || !/^[A-Za-z0-9+/]*={0,2}$/.test(body))
    throw new Error('openpgp: invalid data: armor invalid');
  const bytes = new Uint8Array(Buffer.from(body, 'base64'));
  if (checksum !== undefined) {
    const expected = Buffer.from(checksum, 'base64');
    const got = crc24(bytes);
    if (expected.length !== 3 || ((expected[0]! << 16) | (expected[1]! << 8) | expected[2]!) !== got) {
      throw new Error('openpgp: invalid data: armor invalid');
    }
  }
  if (type === 'PGP PUBLIC KEY BLOCK') throw new Error('Expected to find private key within entity');
  if (type !== 'PGP PRIVATE KEY BLOCK') {
    throw new Error(`openpgp: invalid argument: expected public or private key block, got: ${type}`);
  }
  return bytes;
}

/** All values of the keys Secret, each followed by `\n` (keys sorted; upstream's order is random). */
function secretContents(refs: RefObjects, name: string): string {
  const secret = refs.secret(name);
  if (!secret) throw new Error(secretNotFoundMessage(name));
  const data = secret.data ?? {};
  return Object.keys(data)
    .sort((a, b) => (a < b ? -1 : a > b ? 1 : 0))
    .map((k) => `${data[k]!.toString('utf8')}\n`)
    .join('');
}

/**
 * Plans a sops step (directory input only).
 *
 * Writes to `<scratchDir>/sops/`: `.sops.yml` containing `{}` (passed as `--config=`, so sops never
 * searches for a config), and the keys: `secring.gpg` with `GNUPGHOME=<dir>` for pgp, `key.txt`
 * with `SOPS_AGE_KEY_FILE=<dir>/key.txt` for age. With only pgp and age keys sops needs no
 * network, so it gets none: its proxy is the dead one (`DEAD_PROXY_ENV` of `./step.ts`; sops is
 * built with the loopback patch, so `http://127.0.0.1:…` goes there too) and no `--keyservice`
 * (its key services are in-process); a key service a file might still reach past
 * {@link sopsInputError} gets `connection refused`, not the URL policy's judgement.
 *
 * Two upstream panics become errors here: no strategy (`Unsupported SOPS strategy`) and a strategy
 * without `privateKeysSecretRef`.
 *
 * @param opts - the step's `sops` spec
 * @param ctx - step context
 * @throws {KappControllerError} `Building config: Getting private keys secret: secrets "x" not found`,
 *   `Building config: Generating secring.gpg: Reading private keys: <reason>`,
 *   {@link UNSUPPORTED_SOPS_STRATEGY_MESSAGE}, `Decrypting dir: Checking path: Invalid path: <p>`
 */
export function planSops(opts: AppTemplateSops, ctx: StepContext): SopsStep {
  const strategy = opts.pgp ? 'pgp' : opts.age ? 'age' : undefined;
  if (!strategy) throw new KappControllerError(UNSUPPORTED_SOPS_STRATEGY_MESSAGE);
  const ref = strategy === 'pgp' ? opts.pgp?.privateKeysSecretRef : opts.age?.privateKeysSecretRef;
  const dir = posix.join(ctx.scratchDir, 'sops');
  const configPath = posix.join(dir, '.sops.yml');
  const files: PlannedFile[] = [{ path: configPath, content: '{}', sensitive: false }];
  let contents: string;
  try {
    if (!ref) throw new Error('Expected privateKeysSecretRef to be specified');
    contents = secretContents(ctx.refs, ref.name ?? '');
  } catch (err) {
    throw new KappControllerError(`${SOPS_BUILD_CONFIG_PREFIX}Getting private keys secret: ${(err as Error).message}`, {
      cause: err,
    });
  }
  let env: Record<string, string>;
  if (strategy === 'pgp') {
    let keyring: Uint8Array;
    try {
      keyring = dearmorPrivateKeyBlock(contents);
    } catch (err) {
      throw new KappControllerError(
        `${SOPS_BUILD_CONFIG_PREFIX}Generating secring.gpg: Reading private keys: ${(err as Error).message}`,
        { cause: err },
      );
    }
    files.push({ path: posix.join(dir, 'secring.gpg'), content: keyring, sensitive: true });
    env = { GNUPGHOME: dir, ...DEAD_PROXY_ENV };
  } else {
    files.push({ path: posix.join(dir, 'key.txt'), content: contents, sensitive: true });
    env = { SOPS_AGE_KEY_FILE: posix.join(dir, 'key.txt'), ...DEAD_PROXY_ENV };
  }
  let targets: string[];
  const explicitPaths = (opts.paths?.length ?? 0) > 0;
  if (explicitPaths) {
    targets = opts.paths!.map((p) => {
      try {
        return scopedPath(ctx.templateRoot, p);
      } catch (err) {
        if (err instanceof InvalidPathError) {
          throw new KappControllerError(`${DECRYPTING_DIR_ERROR_PREFIX}Checking path: ${err.message}`, { cause: err });
        }
        throw err;
      }
    });
  } else {
    targets = [ctx.templateRoot];
  }
  return {
    kind: 'sops',
    index: ctx.index,
    bin: 'sops',
    targets,
    explicitPaths,
    args: [`--config=${configPath}`],
    env,
    files,
    errorPrefix: DECRYPTING_DIR_ERROR_PREFIX,
  };
}
