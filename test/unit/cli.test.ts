/**
 * The command lines' shared behaviour (`scripts/cli.ts`): `--help` on stdout with exit 0, a
 * usage error as a message on stderr with exit 2, and `-o json|yaml` output that parses, for
 * `npm run cluster` (against a directory registry) and `npm start`'s argument check
 * (`scripts/start-args.ts`). `npm run receipts` has the same cases in `receipts.test.ts`.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parse as parseYaml } from 'yaml';
import { LocalDirStore } from '../../functions/lib/store/local.js';
import { EXIT, errorHint, formatOutput, isUsageError, parseOutputFormat, UsageError } from '../../scripts/cli.js';
import { main as cluster, clusterDocOf, putCluster } from '../../scripts/cluster-registry.js';
import { START_USAGE, startCommandLine } from '../../scripts/start-args.js';
import { captured } from './support/captured.js';

const CA_PEM = `-----BEGIN CERTIFICATE-----
MIIBdzCCAR2gAwIBAgIUQm9ndXNDZXJ0aWZpY2F0ZUZvclRlc3RzMAoGCCqGSM49BAMCMA8xDTALBgNVBAMMBHRl
-----END CERTIFICATE-----
`;

describe('the shared command-line helpers', () => {
  it('formats data as JSON or YAML that parse back to it, and refuses another -o', () => {
    const data = [{ id: 'a', forwarderRoleId: null, auth: { kind: 'eks', region: 'eu-west-1' } }];
    expect(JSON.parse(formatOutput(data, 'json'))).toEqual(data);
    expect(parseYaml(formatOutput(data, 'yaml'))).toEqual(data);
    expect(formatOutput(data, 'json').endsWith('\n')).toBe(true);
    expect(parseOutputFormat(undefined)).toBeUndefined();
    expect(parseOutputFormat('yaml')).toBe('yaml');
    expect(() => parseOutputFormat('table')).toThrow(UsageError);
  });

  it("counts parseArgs's errors and UsageError as usage errors, nothing else", () => {
    let parseError: unknown;
    try {
      parseArgs({ args: ['--nope'], strict: true, options: {} });
    } catch (e) {
      parseError = e;
    }
    expect(isUsageError(parseError)).toBe(true);
    expect(isUsageError(new UsageError('x'))).toBe(true);
    expect(isUsageError(new Error('ENOENT'))).toBe(false);
    expect(EXIT).toEqual({ ok: 0, failure: 1, usage: 2 });
  });
});

describe('npm run cluster', () => {
  let dir: string;
  let registry: string;
  beforeAll(async () => {
    dir = await mkdtemp(path.join(tmpdir(), 'cli-unit-'));
    registry = `file://${dir}`;
    const store = new LocalDirStore(dir);
    await putCluster(
      store,
      clusterDocOf({
        id: 'prod-eu-1',
        endpoint: 'https://abc.example',
        caPem: CA_PEM,
        auth: { kind: 'eks', clusterName: 'prod', region: 'eu-west-1' },
        forwarderRoleId: 'AROAEXAMPLEID1234567',
      }),
    );
    await putCluster(
      store,
      clusterDocOf({ id: 'lab', endpoint: 'https://lab.example', caPem: CA_PEM, auth: { kind: 'token' } }),
    );
  });
  afterAll(async () => {
    await rm(dir, { recursive: true, force: true });
  });

  it('--help and -h print the usage with the exit codes on stdout and exit 0', async () => {
    for (const argv of [['--help'], ['-h'], ['list', '--help']]) {
      const r = await captured(() => cluster(argv, {}));
      expect(r).toMatchObject({ code: 0, err: '' });
      expect(r.out).toMatch(/^usage:\n {2}npm run cluster -- add /);
      expect(r.out).toContain('npm run cluster -- list [-o json|yaml]');
      expect(r.out).toContain('exit codes: 0 success; 1 failure (');
      expect(r.out).toContain('2 usage error');
    }
  });

  it('exits 2 with the reason and the usage on stderr for a usage error, printing nothing on stdout', async () => {
    for (const [argv, reason] of [
      [['list', '--nope', '--registry', registry], "cluster: Unknown option '--nope'"],
      [['list', '-o', 'table', '--registry', registry], 'cluster: -o expects json or yaml, not "table"'],
      [['remove', 'lab', '-o', 'json', '--registry', registry], 'cluster: -o applies to list, not remove'],
      [['frobnicate', '--registry', registry], 'cluster: unknown command "frobnicate"'],
      [['--registry', registry], 'cluster: a command is required'],
      [['list'], 'cluster: --registry (or KAPP_LAMBDA_CLUSTER_REGISTRY) is required'],
    ] as const) {
      const r = await captured(() => cluster([...argv], {}));
      expect(r.code).toBe(2);
      expect(r.out).toBe('');
      expect(r.err.startsWith(`${reason}`)).toBe(true);
      expect(r.err).toContain('\nusage:\n');
    }
  });

  it('list -o json and -o yaml print every cluster without its CA; the default stays one line each', async () => {
    const expected = [
      {
        id: 'lab',
        endpoint: 'https://lab.example',
        auth: {
          kind: 'token',
          secrets: {
            fetch: 'kapp-lambda/lab/fetch',
            template: 'kapp-lambda/lab/template',
            deploy: 'kapp-lambda/lab/deploy',
            'index-repo': 'kapp-lambda/lab/index-repo',
            install: 'kapp-lambda/lab/install',
          },
        },
        forwarderRoleId: null,
      },
      {
        id: 'prod-eu-1',
        endpoint: 'https://abc.example',
        auth: { kind: 'eks', clusterName: 'prod', region: 'eu-west-1' },
        forwarderRoleId: 'AROAEXAMPLEID1234567',
      },
    ];
    const json = await captured(() => cluster(['list', '-o', 'json', '--registry', registry], {}));
    expect(json).toMatchObject({ code: 0, err: '' });
    expect(JSON.parse(json.out)).toEqual(expected);
    const yaml = await captured(() => cluster(['list', '--output=yaml'], { KAPP_LAMBDA_CLUSTER_REGISTRY: registry }));
    expect(yaml).toMatchObject({ code: 0, err: '' });
    expect(parseYaml(yaml.out)).toEqual(expected);
    expect(json.out).not.toContain('caData');
    const text = await captured(() => cluster(['list', '--registry', registry], {}));
    expect(text.out).toBe(
      'lab\thttps://lab.example\ttoken\tforwarder none\n' +
        'prod-eu-1\thttps://abc.example\teks prod eu-west-1\tforwarder AROAEXAMPLEID1234567\n',
    );
  });
});

describe('npm start', () => {
  function io() {
    const out: string[] = [];
    const err: string[] = [];
    return { out, err, io: { out: (t: string) => out.push(t), err: (t: string) => err.push(t) } };
  }

  it('--help and -h print the usage with the exit codes on stdout and exit 0', () => {
    for (const flag of ['--help', '-h']) {
      const t = io();
      expect(startCommandLine([flag], t.io)).toBe(0);
      expect(t.out).toEqual([START_USAGE]);
      expect(t.err).toEqual([]);
    }
    expect(START_USAGE).toMatch(/^usage: npm start /);
    expect(START_USAGE).toContain(
      'exit codes: 0 success; 1 failure (the local control plane could not start); 2 usage error',
    );
  });

  it('starts with no arguments and refuses any other, exit 2 with the reason on stderr', () => {
    expect(startCommandLine([], io().io)).toBeUndefined();
    expect(startCommandLine(['--controller-config-namespace', 'kapp-controller'], io().io)).toBeUndefined();
    const bad = io();
    expect(startCommandLine([], bad.io, { KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: 'Not_A_Namespace' })).toBe(2);
    expect(bad.err.join('')).toContain('KAPP_LAMBDA_CONTROLLER_CONFIG_NAMESPACE: expected a namespace name');
    for (const [argv, reason] of [
      [['--port', '9'], "start: Unknown option '--port'"],
      [['now'], 'start: unexpected argument "now"'],
    ] as const) {
      const t = io();
      expect(startCommandLine([...argv], t.io)).toBe(2);
      expect(t.out).toEqual([]);
      expect(t.err.join('').startsWith(reason)).toBe(true);
      expect(t.err.join('')).toContain('\nusage: npm start');
    }
  });
});

describe('errorHint', () => {
  it("names AWS_REGION for the SDK's 'Region is missing', wherever it is in the cause chain, and nothing else", () => {
    const hint = " (set AWS_REGION to the bucket's region)";
    expect(errorHint(new Error('Region is missing'))).toBe(hint);
    expect(
      errorHint(new Error('failed to list objects under "state/fleet/"', { cause: new Error('Region is missing') })),
    ).toBe(hint);
    expect(errorHint(new Error('NoSuchBucket'))).toBe('');
    expect(errorHint('Region is missing')).toBe('');
  });
});
