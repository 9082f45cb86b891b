/**
 * The values of the Secrets a stage read for an App never reach what is written for it: the
 * SecretMask itself (exact, base64, JSON-escaped and per-line forms; short values; a value cut
 * by truncation), and the fetch, template and deploy stages faked at the ports (a fake cluster, runner,
 * store) with tools that echo the values.
 */

import { mkdtemp, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { describe, expect, it } from 'vitest';
import type { App } from '../../functions/lib/api/index.js';
import { DerivedKeyring } from '../../functions/lib/artifact/keyring.js';
import { fetchArtifactKey, sha256Hex, templateArtifactKey } from '../../functions/lib/artifact/keys.js';
import { packDir } from '../../functions/lib/artifact/tarball.js';
import { exitWith } from '../../functions/lib/exec/fake.js';
import { runDeploy } from '../../functions/lib/pipeline/app/deploy.js';
import { runFetch } from '../../functions/lib/pipeline/app/fetch.js';
import { runTemplate } from '../../functions/lib/pipeline/app/template.js';
import { TRUNCATION_PREFIX, truncateTail } from '../../functions/lib/reconcile/redact.js';
import { MASKED, MIN_MASKED_CHARS, SecretMask } from '../../functions/lib/reconcile/secret-mask.js';
import type { MemoryStore } from '../../functions/lib/store/memory.js';
import { appObject, appWorld, REF } from './support/app-world.js';
import { useTempDir } from './support/stage-deps.js';

describe('SecretMask', () => {
  const maskOf = (...values: string[]) => {
    const m = new SecretMask();
    for (const v of values) m.addValue(Buffer.from(v));
    return m;
  };

  it('masks the exact value wherever it appears, whatever surrounds it', () => {
    const m = maskOf('hunter2-swordfish');
    expect(m.text('fail: the value was hunter2-swordfish!')).toBe(`fail: the value was ${MASKED}!`);
    expect(m.text('xhunter2-swordfishxhunter2-swordfish')).toBe(`x${MASKED}x${MASKED}`);
    expect(m.text('nothing here')).toBe('nothing here');
  });

  it('masks the base64 forms (padded and not) and the JSON-escaped form', () => {
    const m = maskOf('pa"ss\\word');
    const b64 = Buffer.from('pa"ss\\word').toString('base64');
    expect(b64.endsWith('=')).toBe(true);
    expect(m.text(`data: {k: ${b64}}`)).toBe(`data: {k: ${MASKED}}`);
    expect(m.text(`k=${b64.replace(/=+$/, '')}`)).toBe(`k=${MASKED}`);
    expect(m.text(`{"k":"pa\\"ss\\\\word"}`)).toBe(`{"k":"${MASKED}"}`);
  });

  it('masks each line of a multi-line value, also when printed indented or alone', () => {
    const key = '-----BEGIN SOMETHING-----\nAAAAbbbbCCCCdddd\n  EEEEffffGGGG  \n-----END SOMETHING-----\n';
    const m = maskOf(key);
    expect(m.text(`got ${key}`)).toBe(`got ${MASKED}`);
    expect(m.text('line 3:     EEEEffffGGGG\nok')).toBe(`line 3:     ${MASKED}\nok`);
    expect(m.text('AAAAbbbbCCCCdddd')).toBe(MASKED);
  });

  it(`leaves values shorter than ${MIN_MASKED_CHARS} characters alone (masking them would reveal them)`, () => {
    const m = maskOf('abc', '1', 'no', '');
    expect(m.size).toBe(0);
    expect(m.text('abc 1 no')).toBe('abc 1 no');
    expect(maskOf('abcd').text('xabcdx')).toBe(`x${MASKED}x`);
  });

  it('masks the tail of a value whose head was cut off by truncation', () => {
    const secret = 'S3CRET-0123456789-abcdefghij';
    const m = maskOf(secret);
    const text = `${'x'.repeat(100)}${secret}\nafter\n`;
    // Keep a tail that starts in the middle of the value.
    const cut = truncateTail(text, Buffer.byteLength(`${TRUNCATION_PREFIX}56789-abcdefghij\nafter\n`));
    expect(cut).toBe(`${TRUNCATION_PREFIX}56789-abcdefghij\nafter\n`);
    expect(m.text(cut)).toBe(`${TRUNCATION_PREFIX}${MASKED}\nafter\n`);
    // A cut that leaves fewer than MIN_MASKED_CHARS of the value, or unrelated text, is kept.
    expect(m.text(`${TRUNCATION_PREFIX}hij\nafter`)).toBe(`${TRUNCATION_PREFIX}hij\nafter`);
    expect(m.text(`${TRUNCATION_PREFIX}unrelated`)).toBe(`${TRUNCATION_PREFIX}unrelated`);
  });

  it('masks the leaves of a YAML/JSON values file and the values of env lines, not the keys', () => {
    const m = maskOf('db:\n  password: "s3cr3t-pw"\n  port: 54321\nlist: [alpha-one]\n');
    expect(m.text('ytt: fail: s3cr3t-pw on 54321, alpha-one; db.password')).toBe(
      `ytt: fail: ${MASKED} on ${MASKED}, ${MASKED}; db.password`,
    );
    expect(m.text(Buffer.from('s3cr3t-pw').toString('base64'))).toBe(MASKED);
    const env = maskOf('API_KEY=abcd-efgh\nexport OTHER="quoted-value"\n');
    expect(env.text('abcd-efgh quoted-value API_KEY')).toBe(`${MASKED} ${MASKED} API_KEY`);
  });

  it('masks the leaves of a value added again to another mask (a token every resync masks)', () => {
    const value = 'db:\n  password: "again-pw-1"\n';
    for (const m of [maskOf(value), maskOf(value)]) {
      expect(m.text('fail: again-pw-1')).toBe(`fail: ${MASKED}`);
    }
    expect(maskOf('db:\n  password: "again-pw-2"\n').text('again-pw-1 again-pw-2')).toBe(`again-pw-1 ${MASKED}`);
  });

  it('a kubeconfig added unstructured does not mask its common words (kind: Config)', () => {
    const kubeconfig = 'apiVersion: v1\nkind: Config\nusers:\n- name: u\n  user:\n    token: tok-0123456789\n';
    const m = new SecretMask();
    m.addSecretData({ value: Buffer.from(kubeconfig) }, { structured: false });
    expect(m.text('configmap/x ConfigMap Config')).toBe('configmap/x ConfigMap Config');
    expect(m.text(kubeconfig)).toBe(MASKED);
    expect(m.text('    token: tok-0123456789')).toBe(`    ${MASKED}`);
  });

  it('masks every string of a JSON value, and leaves other values', () => {
    const m = maskOf('topsecret');
    expect(m.deep({ a: ['x topsecret', 1, true, null], b: { c: 'topsecret' } })).toEqual({
      a: [`x ${MASKED}`, 1, true, null],
      b: { c: MASKED },
    });
  });

  it('values of a non-UTF-8 binary secret are masked in base64', () => {
    const m = new SecretMask();
    const bin = Buffer.from([0xff, 0xfe, 0x00, 0x41, 0x42, 0x43, 0x44]);
    m.addValue(bin);
    expect(m.text(bin.toString('base64'))).toBe(MASKED);
  });

  it('a non-UTF-8 value is masked as a tool prints it decoded: lossy (U+FFFD) and its valid runs', () => {
    const value = Buffer.concat([Buffer.from('db-password-S3cr3t!'), Buffer.from([0xff]), Buffer.from('tail-part')]);
    const m = new SecretMask();
    m.addSecretData({ password: value.toString('base64') }, { base64: true });
    expect(m.text(`tool: ${value.toString('utf8')} end`)).toBe(`tool: ${MASKED} end`);
    // A decoder that drops the invalid byte instead still shows each valid run.
    expect(m.text('tool: db-password-S3cr3t! end')).toBe(`tool: ${MASKED} end`);
    expect(m.text('tool: db-password-S3cr3t!tail-part end')).toBe(`tool: ${MASKED}${MASKED} end`);
    expect(m.text(value.toString('base64'))).toBe(MASKED);
  });
});

// ---------------------------------------------------------------------------------------------
// The stages

const SECRET_VALUE = 'Zq8#tenant-db-password-91x';
const SECRET_MULTILINE = 'first-line-of-key-AAAA\nsecond-line-of-key-BBBB\n';
const TOKEN = 'eyJhbGciOiJSUzI1NiJ9.minted-sa-token.signature';

const RUN = { generation: 1, runId: 'r1', startedAt: '2025-01-01T00:00:00Z' };

/** The table App fetching one inline file, changed by `spec`. */
const appWith = (spec: Record<string, unknown>): App =>
  appObject({ spec: { fetch: [{ inline: { paths: { 'a.yml': 'a: 1\n' } } }], ...spec } });

const tempDir = useTempDir('secret-mask-');

/**
 * `app` in the table world with one Secret `creds` holding `secret`, the ServiceAccount token
 * {@link TOKEN}, and a keyring (content made from Secrets is sealed per cluster).
 */
function worldWith(app: App, secret: Record<string, string>, store?: MemoryStore) {
  const w = appWorld({
    app,
    store,
    tmpRoot: path.join(tempDir(), 'scratch'),
    extra: { keyring: new DerivedKeyring(Buffer.alloc(32, 7)) },
  });
  const data = Object.fromEntries(Object.entries(secret).map(([k, v]) => [k, Buffer.from(v)]));
  w.cluster.secrets.set('ns/creds', {
    metadata: { name: 'creds', namespace: 'ns', uid: 's1', resourceVersion: '1' },
    type: 'Opaque',
    data,
  });
  w.cluster.saToken = TOKEN;
  return w;
}

/** Every form of the Secret values a tool could print. */
const LEAKS = [
  SECRET_VALUE,
  Buffer.from(SECRET_VALUE).toString('base64'),
  'first-line-of-key-AAAA',
  'second-line-of-key-BBBB',
];

function expectNoLeak(what: unknown) {
  const text = JSON.stringify(what);
  for (const leak of LEAKS) expect(text).not.toContain(leak);
}

describe('a Secret value echoed by a tool never reaches status', () => {
  it('template: a ytt fail() message built from a valuesFrom Secret value', async () => {
    const dir = await mkdtemp(path.join(tempDir(), 'src-'));
    await writeFile(path.join(dir, 'a.yml'), 'a: 1\n');
    const packed = await packDir(dir);
    const fetchKey = fetchArtifactKey(packed.sha256);
    const app = appWith({ template: [{ ytt: { valuesFrom: [{ secretRef: { name: 'creds' } }] } }] });
    const { deps, log, store, runner, statuses } = worldWith(app, {
      'values.yml': `password: ${SECRET_VALUE}\n`,
      key: SECRET_MULTILINE,
    });
    const stderr = [
      'ytt: Error: ',
      `- fail: bad password ${SECRET_VALUE} (base64 ${Buffer.from(SECRET_VALUE).toString('base64')})`,
      '    in <toplevel>',
      '      a.yml:3 | #@ fail("bad key " + data.values.key)',
      '',
      '    reason:',
      `     - bad key first-line-of-key-AAAA`,
      `       second-line-of-key-BBBB`,
    ].join('\n');
    runner.on('ytt', exitWith(1, stderr));
    await store.put(fetchKey, packed.tgz);
    const out = await runTemplate({ object: REF, run: RUN, artifacts: { fetchKey } }, deps, async () => ({}));
    expect(out).toEqual({});
    // The Secret really reached ytt (so the echo above is realistic) ...
    expect(runner.calls).toHaveLength(1);
    const last = statuses().at(-1) as { usefulErrorMessage?: string; template?: { stderr?: string } };
    // ... and the failure is reported with the values masked, the rest kept.
    expect(last.usefulErrorMessage).toBe(
      [
        'ytt: Error: ',
        `- fail: bad password ${MASKED} (base64 ${MASKED})`,
        '    in <toplevel>',
        '      a.yml:3 | #@ fail("bad key " + data.values.key)',
        '',
        '    reason:',
        `     - bad key ${MASKED}`,
        `       ${MASKED}`,
      ].join('\n'),
    );
    expect(last.template?.stderr).toBe(last.usefulErrorMessage);
    expectNoLeak(statuses());
    expectNoLeak(log.records);
  });

  it('fetch: vendir echoing a git secretRef password (not in a credential-looking shape)', async () => {
    const app = appWith({
      fetch: [{ git: { url: 'https://git.example/r', ref: 'origin/main', secretRef: { name: 'creds' } } }],
    });
    const { deps, log, runner, statuses } = worldWith(app, { username: 'git-user', password: SECRET_VALUE });
    runner.on(
      'vendir',
      exitWith(1, `vendir: Error: Syncing directory '0': fatal: could not read ${SECRET_VALUE} from remote\n`),
    );
    const out = await runFetch({ clusterId: 'c1', ref: REF, run: RUN }, { raw: app as never, app }, deps);
    expect(out).toEqual({});
    const last = statuses().at(-1) as { fetch?: { stderr?: string }; usefulErrorMessage?: string };
    expect(last.fetch?.stderr).toBe(
      `vendir: Error: Syncing directory '0': fatal: could not read ${MASKED} from remote\n`,
    );
    expectNoLeak(statuses());
    expectNoLeak(log.records);
  });

  it('deploy: kapp output quoting the minted ServiceAccount token', async () => {
    const app = appWith({ serviceAccountName: 'sa' });
    const { deps, store, runner, statuses } = worldWith(app, {});
    const manifestKey = templateArtifactKey(sha256Hex('kind: ConfigMap\n'));
    await store.put(manifestKey, 'kind: ConfigMap\n');
    runner.on('kapp', exitWith(1, `kapp: Error: token ${TOKEN} rejected\n`));
    await runDeploy({ object: REF, run: RUN, artifacts: { manifestKey } }, deps);
    const text = JSON.stringify(statuses());
    expect(text).not.toContain(TOKEN);
    // friendly (trimmed) as upstream's updateLastDeploy leaves a deploy result
    expect((statuses().at(-1) as { usefulErrorMessage?: string }).usefulErrorMessage).toBe(
      `kapp: Error: token ${MASKED} rejected`,
    );
  });
});

describe('SecretMask.addScratchRoot', () => {
  const mask = new SecretMask();
  mask.addScratchRoot('/tmp/kapp-lambda-Ab12Cd/');
  it.each([
    [
      'open /tmp/kapp-lambda-Ab12Cd/template-Xy34Zw/src/0/x.yml: no such file',
      'open /tmp/kapp-lambda-template/src/0/x.yml: no such file',
    ],
    ["'/tmp/kapp-lambda-Ab12Cd/fetch-http-Qq11Ww'", "'/tmp/kapp-lambda-fetch-http'"],
    ['HOME=/tmp/kapp-lambda-Ab12Cd/run-Zz99Yy/home', 'HOME=/tmp/kapp-lambda-run/home'],
    // Not a directory this runtime makes, or not under its root: unchanged.
    ['/tmp/kapp-lambda-Ab12Cd/bin/ytt', '/tmp/kapp-lambda-Ab12Cd/bin/ytt'],
    ['/tmp/kapp-lambda-Ab12Cd/template-Xy34Zw7/a', '/tmp/kapp-lambda-Ab12Cd/template-Xy34Zw7/a'],
    ['/var/tmp/kapp-lambda-Ab12Cd/deploy-Xy34Zw', '/var/tmp/kapp-lambda-Ab12Cd/deploy-Xy34Zw'],
    ['/tmp/template-Xy34Zw/a', '/tmp/template-Xy34Zw/a'],
  ])('%j', (input, expected) => {
    expect(mask.text(input)).toBe(expected);
    expect(mask.result({ stdout: '', stderr: input, error: input })).toEqual({
      stdout: '',
      stderr: expected,
      error: expected,
    });
  });

  it('rewrites before Secret values are masked, and a mask without a root leaves paths alone', () => {
    const both = new SecretMask();
    both.addScratchRoot('/tmp');
    both.addValue('hunter2-secret');
    expect(both.deep({ m: ['/tmp/deploy-Ab12Cd/f: hunter2-secret'] })).toEqual({
      m: ['/tmp/kapp-lambda-deploy/f: ***'],
    });
    expect(new SecretMask().text('/tmp/deploy-Ab12Cd/f')).toBe('/tmp/deploy-Ab12Cd/f');
  });
});
