/**
 * parseLambdaEnv: defaults, per-stage required queues, and exact error messages that never
 * echo values.
 */
import { describe, expect, it } from 'vitest';
import { PIPELINE_STAGES, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { ConfigError, type LambdaConfig, parseLambdaEnv } from '../../functions/lib/entry/config.js';

const Q = (s: string) => `https://sqs.eu-west-1.amazonaws.com/123456789012/kapp-lambda-${s}.fifo`;

const base: Record<string, string> = {
  AWS_REGION: 'eu-west-1',
  KAPP_LAMBDA_BUCKET: 'kapp-lambda-artifacts',
  KAPP_LAMBDA_QUEUE_URL_FETCH: Q('fetch'),
  KAPP_LAMBDA_QUEUE_URL_TEMPLATE: Q('template'),
  KAPP_LAMBDA_QUEUE_URL_DEPLOY: Q('deploy'),
  KAPP_LAMBDA_KUBECONFIG: '/var/task/kubeconfig.yaml',
  KAPP_LAMBDA_TOOL_VERSIONS: '{"vendir":"0.44.0","imgpkg":"0.46.1","helm":"3.22.0"}',
};

function problems(
  stage: 'fetch' | 'template' | 'deploy' | 'index-repo' | 'install',
  env: Record<string, string | undefined>,
): string[] {
  try {
    parseLambdaEnv(stage, env);
  } catch (e) {
    expect(e).toBeInstanceOf(ConfigError);
    return [...(e as ConfigError).problems];
  }
  throw new Error('expected a ConfigError');
}

describe('parseLambdaEnv', () => {
  it('fills defaults', () => {
    const want: LambdaConfig = {
      stage: 'fetch',
      region: 'eu-west-1',
      bucket: 'kapp-lambda-artifacts',
      bucketPrefix: '',
      queueUrls: { fetch: Q('fetch'), template: Q('template'), deploy: Q('deploy') },
      kubeconfigPath: '/var/task/kubeconfig.yaml',
      tmpDir: '/tmp',
      binDir: '/opt/bin',
      hardenAddon: '/opt/lib/kapp-lambda-harden.node',
      toolVersions: { vendir: '0.44.0', imgpkg: '0.46.1', helm: '3.22.0' },
      kappDeployRawOptions: [],
      kubeApi: { qps: 20, burst: 30 },
      timer: {},
      logLevel: 'info',
      metrics: 'cluster',
      urlPolicy: { mode: 'enforce', allow: [] },
      maxReceiveCount: 5,
      recordConcurrency: 1,
    };
    expect(parseLambdaEnv('fetch', base)).toEqual(want);
  });

  it('reads every optional variable', () => {
    const c = parseLambdaEnv('deploy', {
      ...base,
      KAPP_LAMBDA_BUCKET_PREFIX: 'kapp-lambda/',
      KAPP_LAMBDA_S3_ENDPOINT: 'http://127.0.0.1:7070',
      KAPP_LAMBDA_SQS_ENDPOINT: 'http://127.0.0.1:9324',
      KAPP_LAMBDA_QUEUE_URL_FETCH: Q('fetch'),
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: Q('index-repo'),
      KAPP_LAMBDA_QUEUE_URL_INSTALL: Q('install'),
      KAPP_LAMBDA_CLUSTERS: 'prod-eu-1, prod-us-1,',
      KAPP_LAMBDA_TMP_DIR: '/mnt/scratch',
      KAPP_LAMBDA_BIN_DIR: '/opt/tools/bin',
      KAPP_LAMBDA_TOOL_TIMEOUT_MS: '600000',
      KAPP_LAMBDA_MAX_INLINE_BYTES: '1048576',
      KAPP_LAMBDA_FETCH_STALL_SECONDS: '120',
      KAPP_LAMBDA_KAPP_DEPLOY_RAW_OPTIONS: '["--wait-timeout=2m"]',
      KAPP_LAMBDA_DANGEROUS_SKIP_TLS_VERIFY: 'registry.local,10.0.0.1',
      KAPP_LAMBDA_APP_DEFAULT_SYNC_PERIOD: '5m',
      KAPP_LAMBDA_APP_MINIMUM_SYNC_PERIOD: '1m',
      KAPP_LAMBDA_LOG_LEVEL: 'debug',
      KAPP_LAMBDA_METRICS: 'object',
      KAPP_LAMBDA_URL_POLICY: 'off',
      KAPP_LAMBDA_URL_ALLOW: 'registry.corp:5000, 10.20.0.0/16,',
      KAPP_LAMBDA_MAX_RECEIVE_COUNT: '3',
      KAPP_LAMBDA_RECORD_CONCURRENCY: '2',
      KAPP_LAMBDA_KUBE_API_QPS: '50',
      KAPP_LAMBDA_KUBE_API_BURST: '100',
    });
    expect(c).toEqual({
      stage: 'deploy',
      region: 'eu-west-1',
      bucket: 'kapp-lambda-artifacts',
      bucketPrefix: 'kapp-lambda/',
      s3Endpoint: 'http://127.0.0.1:7070',
      sqsEndpoint: 'http://127.0.0.1:9324',
      queueUrls: {
        fetch: Q('fetch'),
        template: Q('template'),
        deploy: Q('deploy'),
        'index-repo': Q('index-repo'),
        install: Q('install'),
      },
      kubeconfigPath: '/var/task/kubeconfig.yaml',
      clusterContexts: ['prod-eu-1', 'prod-us-1'],
      tmpDir: '/mnt/scratch',
      binDir: '/opt/tools/bin',
      hardenAddon: '/opt/lib/kapp-lambda-harden.node',
      toolVersions: { vendir: '0.44.0', imgpkg: '0.46.1', helm: '3.22.0' },
      toolTimeoutMs: 600_000,
      maxInlineBytes: 1_048_576,
      fetchStall: { windowMs: 120_000, minBytes: 4096 },
      kappDeployRawOptions: ['--wait-timeout=2m'],
      kubeApi: { qps: 50, burst: 100 },
      dangerousSkipTLSVerify: 'registry.local,10.0.0.1',
      timer: { appDefaultSyncPeriodMs: 300_000, appMinimumSyncPeriodMs: 60_000 },
      logLevel: 'debug',
      metrics: 'object',
      urlPolicy: { mode: 'off', allow: ['registry.corp:5000', '10.20.0.0/16'] },
      maxReceiveCount: 3,
      recordConcurrency: 2,
    } satisfies LambdaConfig);
  });

  it('names each queue variable after its function, a hyphen as an underscore', () => {
    expect(PIPELINE_STAGES.map(queueUrlEnv)).toEqual([
      'KAPP_LAMBDA_QUEUE_URL_FETCH',
      'KAPP_LAMBDA_QUEUE_URL_TEMPLATE',
      'KAPP_LAMBDA_QUEUE_URL_DEPLOY',
      'KAPP_LAMBDA_QUEUE_URL_INDEX_REPO',
      'KAPP_LAMBDA_QUEUE_URL_INSTALL',
    ]);
    // The hyphenated spelling is no variable of ours: it is ignored, not read.
    const c = parseLambdaEnv('index-repo', {
      ...base,
      KAPP_LAMBDA_QUEUE_URL_INSTALL: Q('install'),
      KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: Q('index-repo'),
      'KAPP_LAMBDA_QUEUE_URL_INDEX-REPO': Q('x'),
    });
    expect(c.stage).toBe('index-repo');
    expect(c.queueUrls).toEqual({
      fetch: Q('fetch'),
      template: Q('template'),
      deploy: Q('deploy'),
      install: Q('install'),
      'index-repo': Q('index-repo'),
    });
  });

  it('reads the fair shares: none unset, the namespace share half the cluster share by default and never above it', () => {
    expect(parseLambdaEnv('fetch', base).shares).toBeUndefined();
    expect(parseLambdaEnv('fetch', { ...base, KAPP_LAMBDA_CLUSTER_SHARE: '5' }).shares).toEqual({
      cluster: 5,
      namespace: 3,
    });
    expect(
      parseLambdaEnv('fetch', { ...base, KAPP_LAMBDA_CLUSTER_SHARE: '2', KAPP_LAMBDA_NAMESPACE_SHARE: '9' }).shares,
    ).toEqual({ cluster: 2, namespace: 2 });
    expect(problems('fetch', { ...base, KAPP_LAMBDA_CLUSTER_SHARE: '0' })).toHaveLength(1);
  });

  it('treats blank values as unset', () => {
    const c = parseLambdaEnv('deploy', {
      ...base,
      KAPP_LAMBDA_S3_ENDPOINT: '',
      KAPP_LAMBDA_TMP_DIR: ' ',
      KAPP_LAMBDA_LOG_LEVEL: '',
    });
    expect(c.s3Endpoint).toBeUndefined();
    expect(c.tmpDir).toBe('/tmp');
    expect(c.logLevel).toBe('info');
  });

  it('names every missing variable in one error', () => {
    expect(() => parseLambdaEnv('fetch', {})).toThrow(
      'invalid configuration of the fetch function: AWS_REGION: required; KAPP_LAMBDA_BUCKET: required; ' +
        'KAPP_LAMBDA_KUBECONFIG: required (path of a kubeconfig file); ' +
        'KAPP_LAMBDA_TOOL_VERSIONS: required (JSON object of tool versions); ' +
        'KAPP_LAMBDA_QUEUE_URL_TEMPLATE: required (the fetch function sends to it); ' +
        'KAPP_LAMBDA_QUEUE_URL_DEPLOY: required (the fetch function sends to it); ' +
        'KAPP_LAMBDA_QUEUE_URL_FETCH: required (the fetch function sends to it)',
    );
  });

  it('needs no tool versions for install, which runs no tool; every other function does', () => {
    const { KAPP_LAMBDA_TOOL_VERSIONS: _, ...noVersions } = base;
    const c = parseLambdaEnv('install', { ...noVersions, KAPP_LAMBDA_QUEUE_URL_INSTALL: Q('install') });
    expect(c.toolVersions).toEqual({});
    expect(parseLambdaEnv('install', { ...base, KAPP_LAMBDA_QUEUE_URL_INSTALL: Q('install') }).toolVersions).toEqual({
      vendir: '0.44.0',
      imgpkg: '0.46.1',
      helm: '3.22.0',
    });
    expect(
      problems('install', {
        ...noVersions,
        KAPP_LAMBDA_QUEUE_URL_INSTALL: Q('install'),
        KAPP_LAMBDA_TOOL_VERSIONS: '[]',
      }),
    ).toEqual(['KAPP_LAMBDA_TOOL_VERSIONS: expected an object of tool → version strings']);
    for (const stage of ['fetch', 'template', 'deploy'] as const) {
      expect(problems(stage, noVersions)).toEqual([
        'KAPP_LAMBDA_TOOL_VERSIONS: required (JSON object of tool versions)',
      ]);
    }
  });

  it('reads the cluster registry instead of a kubeconfig', () => {
    const { KAPP_LAMBDA_KUBECONFIG: _, ...noKube } = base;
    const c = parseLambdaEnv('deploy', {
      ...noKube,
      KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/kapp-lambda',
      KAPP_LAMBDA_CLUSTER_REGISTRY_TTL_SECONDS: '30',
    });
    expect(c.kubeconfigPath).toBe('');
    expect(c.clusterRegistry).toEqual({
      location: { kind: 's3', bucket: 'fleet-registry', prefix: 'kapp-lambda/' },
      secrets: { kind: 'aws-secretsmanager' },
      ttlMs: 30_000,
    });
    const d = parseLambdaEnv('deploy', {
      ...noKube,
      KAPP_LAMBDA_CLUSTER_REGISTRY: 'file:///srv/registry',
      KAPP_LAMBDA_CLUSTER_SECRETS: 'file:///srv/tokens',
    });
    expect(d.clusterRegistry).toEqual({
      location: { kind: 'dir', root: '/srv/registry' },
      secrets: { kind: 'dir', root: '/srv/tokens' },
      ttlMs: 60_000,
    });
  });

  it('checks senders against the registry when asked, with each function role id named by its function', () => {
    const { KAPP_LAMBDA_KUBECONFIG: _, ...noKube } = base;
    const fleet = { ...noKube, KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/' };
    expect(parseLambdaEnv('deploy', fleet).senderCheck).toBeUndefined();
    expect(
      parseLambdaEnv('deploy', {
        ...fleet,
        KAPP_LAMBDA_SENDER_CHECK: 'registry',
        KAPP_LAMBDA_FUNCTION_SENDERS:
          'fetch=AROAFETCHFUNCTION0001, template=AROATEMPLATEFUNCTION1,deploy=AROADEPLOYFUNCTION001',
      }).senderCheck,
    ).toEqual({
      functionSenders: [
        { stage: 'fetch', roleId: 'AROAFETCHFUNCTION0001' },
        { stage: 'template', roleId: 'AROATEMPLATEFUNCTION1' },
        { stage: 'deploy', roleId: 'AROADEPLOYFUNCTION001' },
      ],
    });
    expect(parseLambdaEnv('deploy', { ...fleet, KAPP_LAMBDA_SENDER_CHECK: 'registry' }).senderCheck).toEqual({
      functionSenders: [],
    });
    expect(problems('deploy', { ...base, KAPP_LAMBDA_SENDER_CHECK: 'registry' })).toEqual([
      'KAPP_LAMBDA_SENDER_CHECK: registry needs KAPP_LAMBDA_CLUSTER_REGISTRY (the forwarders are named there)',
    ]);
    const format =
      'KAPP_LAMBDA_FUNCTION_SENDERS: expected a comma list of <function>=<IAM role id> entries, e.g. fetch=AROA…,template=AROA… (function: fetch, template, deploy, index-repo, install)';
    for (const bad of [
      'fetch=AIDAUSERKEYS00000001',
      'forwarder=AROAFETCHFUNCTION0001',
      'fetch=',
      '=AROAFETCHFUNCTION0001',
    ]) {
      expect(problems('deploy', { ...fleet, KAPP_LAMBDA_FUNCTION_SENDERS: bad }), bad).toEqual([format]);
    }
  });

  it('refuses the bare role ids of the format before, naming the new one (they would take any event from the role)', () => {
    const { KAPP_LAMBDA_KUBECONFIG: _, ...noKube } = base;
    const fleet = {
      ...noKube,
      KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/',
      KAPP_LAMBDA_SENDER_CHECK: 'registry',
    };
    const message =
      'KAPP_LAMBDA_FUNCTION_SENDERS: expected a comma list of <function>=<IAM role id> entries, e.g. fetch=AROA…,template=AROA… (function: fetch, template, deploy, index-repo, install); bare role ids are no longer accepted: name the function each role belongs to (the CDK app does)';
    for (const old of [
      'AROAFETCHFUNCTION0001,AROATEMPLATEFUNCTION1',
      'fetch=AROAFETCHFUNCTION0001,AROATEMPLATEFUNCTION1',
    ]) {
      expect(problems('deploy', { ...fleet, KAPP_LAMBDA_FUNCTION_SENDERS: old }), old).toEqual([message]);
      expect(() => parseLambdaEnv('deploy', { ...fleet, KAPP_LAMBDA_FUNCTION_SENDERS: old })).toThrow(ConfigError);
    }
  });

  it('takes the one cluster of a cell as part of the sender check, and refuses it without the check', () => {
    const { KAPP_LAMBDA_KUBECONFIG: _, ...noKube } = base;
    const fleet = {
      ...noKube,
      KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/',
      KAPP_LAMBDA_SENDER_CHECK: 'registry',
    };
    expect(parseLambdaEnv('deploy', { ...fleet, KAPP_LAMBDA_CELL_CLUSTER: 'prod-eu-1' }).senderCheck).toEqual({
      functionSenders: [],
      cell: 'prod-eu-1',
    });
    expect(
      problems('deploy', { ...fleet, KAPP_LAMBDA_SENDER_CHECK: 'off', KAPP_LAMBDA_CELL_CLUSTER: 'prod-eu-1' }),
    ).toEqual([
      'KAPP_LAMBDA_CELL_CLUSTER: needs KAPP_LAMBDA_SENDER_CHECK=registry (the check that refuses other clusters)',
    ]);
    expect(problems('deploy', { ...fleet, KAPP_LAMBDA_CELL_CLUSTER: 'Prod_EU' })).toEqual([
      'KAPP_LAMBDA_CELL_CLUSTER: expected a cluster id (a DNS-1123 label)',
    ]);
  });

  it('wants exactly one cluster source, and a registry location it understands', () => {
    expect(problems('deploy', { ...base, KAPP_LAMBDA_CLUSTER_REGISTRY: 's3://fleet-registry/' })).toEqual([
      'KAPP_LAMBDA_CLUSTER_REGISTRY: set either it or KAPP_LAMBDA_KUBECONFIG, not both',
    ]);
    const { KAPP_LAMBDA_KUBECONFIG: _, ...noKube } = base;
    expect(problems('deploy', noKube)).toEqual(['KAPP_LAMBDA_KUBECONFIG: required (path of a kubeconfig file)']);
    expect(problems('deploy', { ...noKube, KAPP_LAMBDA_CLUSTER_REGISTRY: 'https://fleet-registry/x' })).toEqual([
      'KAPP_LAMBDA_CLUSTER_REGISTRY: expected s3://bucket/prefix or file:///absolute/dir',
    ]);
    expect(
      problems('deploy', {
        ...noKube,
        KAPP_LAMBDA_CLUSTER_REGISTRY: 'file:///srv/registry',
        KAPP_LAMBDA_CLUSTER_SECRETS: 's3://tokens/x',
      }),
    ).toEqual(['KAPP_LAMBDA_CLUSTER_SECRETS: expected aws-secretsmanager or file:///absolute/dir']);
  });

  it.each([
    ['fetch', ['KAPP_LAMBDA_QUEUE_URL_TEMPLATE', 'KAPP_LAMBDA_QUEUE_URL_DEPLOY', 'KAPP_LAMBDA_QUEUE_URL_FETCH']],
    ['template', ['KAPP_LAMBDA_QUEUE_URL_DEPLOY', 'KAPP_LAMBDA_QUEUE_URL_FETCH']],
    ['deploy', ['KAPP_LAMBDA_QUEUE_URL_DEPLOY', 'KAPP_LAMBDA_QUEUE_URL_FETCH']],
    [
      'index-repo',
      ['KAPP_LAMBDA_QUEUE_URL_INSTALL', 'KAPP_LAMBDA_QUEUE_URL_INDEX_REPO', 'KAPP_LAMBDA_QUEUE_URL_FETCH'],
    ],
    ['install', ['KAPP_LAMBDA_QUEUE_URL_INSTALL']],
  ] as const)('the %s function requires the queues it sends to: %j', (stage, want) => {
    const env = {
      ...base,
      KAPP_LAMBDA_QUEUE_URL_FETCH: undefined,
      KAPP_LAMBDA_QUEUE_URL_TEMPLATE: undefined,
      KAPP_LAMBDA_QUEUE_URL_DEPLOY: undefined,
    };
    // Every function sends somewhere (deploy: its continuation and the run lease's follow-up).
    expect(problems(stage, env)).toEqual(want.map((v) => `${v}: required (the ${stage} function sends to it)`));
  });

  it.each([
    ['AWS_REGION', 'EU West', 'AWS_REGION: expected a region name'],
    ['KAPP_LAMBDA_BUCKET', 'My_Bucket', 'KAPP_LAMBDA_BUCKET: expected an S3 bucket name'],
    ['KAPP_LAMBDA_S3_ENDPOINT', 'localhost:7070', 'KAPP_LAMBDA_S3_ENDPOINT: expected an http:// or https:// URL'],
    ['KAPP_LAMBDA_QUEUE_URL_DEPLOY', 'sqs://q', 'KAPP_LAMBDA_QUEUE_URL_DEPLOY: expected an http:// or https:// URL'],
    [
      'KAPP_LAMBDA_QUEUE_URL_INDEX_REPO',
      'sqs://q',
      'KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: expected an http:// or https:// URL',
    ],
    ['KAPP_LAMBDA_KUBECONFIG', 'kubeconfig', 'KAPP_LAMBDA_KUBECONFIG: expected an absolute path'],
    ['KAPP_LAMBDA_TMP_DIR', '/tmp/../etc', 'KAPP_LAMBDA_TMP_DIR: expected an absolute path without ..'],
    ['KAPP_LAMBDA_BIN_DIR', 'opt/bin', 'KAPP_LAMBDA_BIN_DIR: expected an absolute path without ..'],
    ['KAPP_LAMBDA_URL_POLICY', 'audit', 'KAPP_LAMBDA_URL_POLICY: Invalid option: expected one of "enforce"|"off"'],
    [
      'KAPP_LAMBDA_URL_ALLOW',
      'http://registry/x',
      'KAPP_LAMBDA_URL_ALLOW: expected a comma list of host, host:port or CIDR entries',
    ],
    [
      'KAPP_LAMBDA_TOOL_VERSIONS',
      '{vendir',
      'KAPP_LAMBDA_TOOL_VERSIONS: expected JSON (an object of tool → version strings)',
    ],
    [
      'KAPP_LAMBDA_TOOL_VERSIONS',
      '{"vendir":1}',
      'KAPP_LAMBDA_TOOL_VERSIONS: expected an object of tool → version strings',
    ],
    ['KAPP_LAMBDA_TOOL_TIMEOUT_MS', '10s', 'KAPP_LAMBDA_TOOL_TIMEOUT_MS: expected an integer in [1000, 900000]'],
    ['KAPP_LAMBDA_TOOL_TIMEOUT_MS', '900001', 'KAPP_LAMBDA_TOOL_TIMEOUT_MS: expected an integer in [1000, 900000]'],
    [
      'KAPP_LAMBDA_MAX_INLINE_BYTES',
      '64Mi',
      'KAPP_LAMBDA_MAX_INLINE_BYTES: expected an integer in [1, 1073741824], received "64Mi"',
    ],
    [
      'KAPP_LAMBDA_MAX_INLINE_BYTES',
      '0',
      'KAPP_LAMBDA_MAX_INLINE_BYTES: expected an integer in [1, 1073741824], received "0"',
    ],
    [
      'KAPP_LAMBDA_FETCH_STALL_SECONDS',
      '0',
      'KAPP_LAMBDA_FETCH_STALL_SECONDS: expected an integer in [1, 900], received "0"',
    ],
    [
      'KAPP_LAMBDA_FETCH_STALL_MIN_BYTES',
      '4KiB',
      'KAPP_LAMBDA_FETCH_STALL_MIN_BYTES: expected an integer in [1, 1048576], received "4KiB"',
    ],
    ['KAPP_LAMBDA_MAX_RECEIVE_COUNT', '0', 'KAPP_LAMBDA_MAX_RECEIVE_COUNT: expected an integer in [1, 1000]'],
    ['KAPP_LAMBDA_MAX_RECEIVE_COUNT', 'five', 'KAPP_LAMBDA_MAX_RECEIVE_COUNT: expected an integer in [1, 1000]'],
    [
      'KAPP_LAMBDA_KAPP_DEPLOY_RAW_OPTIONS',
      '["--a",2]',
      'KAPP_LAMBDA_KAPP_DEPLOY_RAW_OPTIONS: expected an array of strings',
    ],
    ['KAPP_LAMBDA_CLUSTERS', ' , ', 'KAPP_LAMBDA_CLUSTERS: expected a comma list of kubeconfig contexts'],
    [
      'KAPP_LAMBDA_APP_DEFAULT_SYNC_PERIOD',
      'soon',
      'KAPP_LAMBDA_APP_*_SYNC_PERIOD: Unmarshaling appDefaultSyncPeriod as duration: time: invalid duration "soon"',
    ],
  ])('%s=%j → %s', (name, value, want) => {
    expect(problems('fetch', { ...base, [name]: value })).toEqual([want]);
  });

  it('rejects an unknown log level', () => {
    const [p] = problems('deploy', { ...base, KAPP_LAMBDA_LOG_LEVEL: 'trace' });
    expect(p).toMatch(/^KAPP_LAMBDA_LOG_LEVEL: /);
    expect(p).toContain('"debug"|"info"|"warn"|"error"');
  });

  it('never echoes a value in its message', () => {
    const secretish = 'AKIAEXAMPLESECRET';
    const err = (() => {
      try {
        parseLambdaEnv('fetch', {
          ...base,
          KAPP_LAMBDA_BUCKET: secretish,
          KAPP_LAMBDA_S3_ENDPOINT: secretish,
          KAPP_LAMBDA_TOOL_VERSIONS: secretish,
          KAPP_LAMBDA_KUBECONFIG: secretish,
        });
      } catch (e) {
        return e as Error;
      }
      throw new Error('expected a ConfigError');
    })();
    expect(err.message).not.toContain(secretish);
    expect(err.message).toBe(
      'invalid configuration of the fetch function: KAPP_LAMBDA_BUCKET: expected an S3 bucket name; ' +
        'KAPP_LAMBDA_S3_ENDPOINT: expected an http:// or https:// URL; ' +
        'KAPP_LAMBDA_KUBECONFIG: expected an absolute path; ' +
        'KAPP_LAMBDA_TOOL_VERSIONS: expected JSON (an object of tool → version strings)',
    );
  });
});
