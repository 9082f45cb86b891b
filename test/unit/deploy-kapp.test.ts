import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { parseAllDocuments } from 'yaml';
import type { AppDeployKapp } from '../../functions/lib/api/index.js';
import {
  appKappDeploy,
  associatedResources,
  type ClusterAccess,
  KAPP_ALLOWED_DELETE_FLAGS,
  KAPP_ALLOWED_DEPLOY_FLAGS,
  KAPP_ALLOWED_INSPECT_FLAGS,
  kappDeleteCommand,
  kappDeployCommand,
  kappInspectCommand,
  packageRepositoryDeleteCommand,
  packageRepositoryDeployCommand,
  parseKappAppMeta,
  parseRawFlag,
  validateRawOptions,
  wantsInspect,
} from '../../functions/lib/deploy/index.js';
import { KappControllerError } from '../../functions/lib/reconcile/result.js';
import { fixturePath } from '../harness/fixtures.js';

const saAccess: ClusterAccess = {
  name: 'simple-app',
  namespace: '',
  deployNamespace: 'default',
  kubeconfigYaml: 'KUBECONFIG',
};
// User-supplied values (namespaces, intoNs, mapNs) are attached with `=` (upstream passes them as
// separate arguments) so that none can be read as a kapp flag.
const generic = ['--app', 'simple-app.app', '--app-namespace=default', '--kubeconfig=/dev/null', '--yes'];

describe('kapp deploy (pkg/deploy/kapp.go Deploy)', () => {
  it('builds the exact App deploy command', () => {
    const cmd = kappDeployCommand({
      kapp: { intoNs: 'target', mapNs: ['a:b', 'c:d'], rawOptions: ['--wait-timeout=1m', '--apply-timeout=10m'] },
      access: saAccess,
      metadataFile: '/tmp/m/app-metadata.yml',
      controllerRawOptions: ['--kube-api-qps=50'],
    });
    expect(cmd).toEqual({
      bin: 'kapp',
      args: [
        'deploy',
        '--app-metadata-file-output',
        '/tmp/m/app-metadata.yml',
        '--prev-app',
        'simple-app-ctrl',
        '-f',
        '-',
        '--into-ns=target',
        '--map-ns=a:b',
        '--map-ns=c:d',
        '--app-changes-max-to-keep=5',
        '--apply-timeout=5m',
        '--kube-api-qps=50',
        '--wait-timeout=1m',
        '--apply-timeout=10m',
        ...generic,
      ],
      env: { KAPP_KUBECONFIG_YAML: 'KUBECONFIG' },
      sensitiveEnv: ['KAPP_KUBECONFIG_YAML'],
    });
  });

  it('passes --namespace (defaultNamespace or cluster namespace) before --app-namespace', () => {
    const cmd = kappDeployCommand({
      kapp: {},
      access: { ...saAccess, namespace: 'resources-ns' },
      metadataFile: '/m',
    });
    expect(cmd.args.slice(-6)).toEqual([
      '--app',
      'simple-app.app',
      '--namespace=resources-ns',
      '--app-namespace=default',
      '--kubeconfig=/dev/null',
      '--yes',
    ]);
  });

  it('omits empty namespaces and, for the runtime identity, the kubeconfig', () => {
    const cmd = kappDeployCommand({
      kapp: {},
      access: { name: 'x', namespace: '', deployNamespace: '', dangerousUsePodServiceAccount: true },
      metadataFile: '/m',
      globalRawOptions: null,
    });
    expect(cmd.args).toEqual([
      'deploy',
      '--app-metadata-file-output',
      '/m',
      '--prev-app',
      'x-ctrl',
      '-f',
      '-',
      '--app',
      'x.app',
      '--yes',
    ]);
    expect(cmd.env).toEqual({});
    expect(cmd.sensitiveEnv).toEqual([]);
  });

  it('refuses an access without credentials (upstream panics)', () => {
    expect(() =>
      kappDeployCommand({ kapp: {}, access: { name: 'x', namespace: '', deployNamespace: '' }, metadataFile: '/m' }),
    ).toThrow('Internal inconsistency: Unknown kapp service account configuration');
  });

  it.each([
    [{ rawOptions: ['--x=1'] }, [], "Unexpected flag '--x' specified (either forbidden or unknown)"],
    [{ rawOptions: ['--raw=true'] }, [], "Unexpected flag '--raw' specified (either forbidden or unknown)"],
    [
      { rawOptions: ['--kubeconfig=/etc/x'] },
      [],
      "Unexpected flag '--kubeconfig' specified (either forbidden or unknown)",
    ],
    [{ rawOptions: ['--wait'] }, [], "Expected flag '--wait' to be in '--name=val' format"],
    [{ rawOptions: ['--Wait=false'] }, [], "Expected flag '--Wait=false' to be in '--name=val' format"],
    [{ rawOptions: ['--wait =false'] }, [], "Expected flag '--wait =false' to be in '--name=val' format"],
    [{ rawOptions: ['-y=1'] }, [], "Expected flag '-y=1' to be in '--name=val' format"],
    [{ rawOptions: ['--wait='] }, [], "Expected flag '--wait=' to be in '--name=val' format"],
    [{ rawOptions: ['--labels=a=b\nc'] }, [], "Expected flag '--labels=a=b\nc' to be in '--name=val' format"],
    // global options are validated first
    [{ rawOptions: ['--x=1'] }, ['--y=2'], "Unexpected flag '--y' specified (either forbidden or unknown)"],
  ] as Array<[AppDeployKapp, string[], string]>)(
    'rejects raw options %#: %s',
    (kapp, controllerRawOptions, message) => {
      expect(() =>
        kappDeployCommand({ kapp, access: saAccess, metadataFile: '/m', controllerRawOptions }),
      ).toThrowError(new KappControllerError(message));
    },
  );

  it('accepts values with "=" and spaces, and the --labels / --patch deploy flags', () => {
    expect(parseRawFlag('--labels=a=b c')).toEqual({ name: '--labels', value: 'a=b c' });
    expect(
      validateRawOptions(['--labels=x=y', '--patch=true', '--diff-anchored=true'], KAPP_ALLOWED_DEPLOY_FLAGS),
    ).toEqual(['--labels=x=y', '--patch=true', '--diff-anchored=true']);
  });
});

describe('kapp inspect and delete', () => {
  it('builds inspect with the PodMetrics filter and inspect raw options', () => {
    const kapp: AppDeployKapp = {
      inspect: { rawOptions: ['--raw=true', '--tree=false'] },
      rawOptions: ['--into-ns=x'],
    };
    expect(wantsInspect(kapp)).toBe(true);
    expect(wantsInspect({})).toBe(false);
    expect(wantsInspect({ inspect: {} })).toBe(true);
    expect(kappInspectCommand({ kapp, access: saAccess }).args).toEqual([
      'inspect',
      '--filter',
      '{"not":{"resource":{"kinds":["PodMetrics"]}}}',
      '--tty',
      '--raw=true',
      '--tree=false',
      ...generic,
    ]);
    expect(() => kappInspectCommand({ kapp: { inspect: { rawOptions: ['--wait=false'] } }, access: saAccess })).toThrow(
      "Unexpected flag '--wait' specified (either forbidden or unknown)",
    );
  });

  it('builds delete from the redis example (delete raw options only, no deploy or global options)', () => {
    const app = parseAllDocuments(readFileSync(fixturePath('kapp-controller', 'examples', 'redis-helm.yml'), 'utf8'))
      .map((d) => d.toJS())
      .find((d) => d.kind === 'App');
    const kapp = appKappDeploy(app.spec);
    const cmd = kappDeleteCommand({
      kapp: { ...kapp, rawOptions: ['--logs=false'] },
      access: { ...saAccess, name: 'redis' },
    });
    expect(cmd.args).toEqual([
      'delete',
      '--prev-app',
      'redis-ctrl',
      '--apply-ignored=true',
      '--app',
      'redis.app',
      '--app-namespace=default',
      '--kubeconfig=/dev/null',
      '--yes',
    ]);
    expect(() => kappDeleteCommand({ kapp: { delete: { rawOptions: ['--into-ns=x'] } }, access: saAccess })).toThrow(
      "Unexpected flag '--into-ns' specified (either forbidden or unknown)",
    );
  });

  it('splits the allow-lists as upstream', () => {
    expect(KAPP_ALLOWED_DELETE_FLAGS.has('--wait-timeout')).toBe(true);
    expect(KAPP_ALLOWED_DELETE_FLAGS.has('--app-changes-max-to-keep')).toBe(false);
    expect(KAPP_ALLOWED_INSPECT_FLAGS.has('--status')).toBe(true);
    expect(KAPP_ALLOWED_INSPECT_FLAGS.has('--apply-timeout')).toBe(false);
    expect(KAPP_ALLOWED_DEPLOY_FLAGS.size).toBe(16 + 20 + 11);
  });

  it.each([
    [{}, 'Expected exactly one deploy option'],
    [{ deploy: [{ kapp: {} }, { kapp: {} }] }, 'Expected exactly one deploy option'],
    [{ deploy: [{}] }, 'Unsupported way to deploy'],
  ])('appKappDeploy fails %#: %s', (spec, message) => {
    expect(() => appKappDeploy(spec)).toThrowError(new KappControllerError(message));
  });
});

describe('PackageRepository kapp (pkg/pkgrepository/package_repo_app.go)', () => {
  // Upstream's --kube-api-qps=30 --kube-api-burst=40 (PKGR_KAPP_RATE_LIMIT).
  const shared = [
    '--kube-api-qps=30',
    '--kube-api-burst=40',
    '--dangerous-scope-to-fallback-allowed-namespaces=true',
    '--wait=false',
  ];

  it('deploys with the fixed flags, no global options, as the runtime identity', () => {
    expect(packageRepositoryDeployCommand({ name: 'repo', namespace: 'pkgs', metadataFile: '/m' })).toEqual({
      bin: 'kapp',
      args: [
        'deploy',
        '--app-metadata-file-output',
        '/m',
        '--prev-app',
        'repo-ctrl',
        '-f',
        '-',
        '--logs=false',
        '--app-changes-max-to-keep=5',
        '--dangerous-override-ownership-of-existing-resources=true',
        '--existing-non-labeled-resources-check=false',
        ...shared,
        '--app',
        'repo.pkgr',
        '--namespace=pkgs',
        '--yes',
      ],
      env: {},
      sensitiveEnv: [],
    });
  });

  it('deletes with the shared flags, and adds --debug=true when asked', () => {
    expect(packageRepositoryDeleteCommand({ name: 'repo', namespace: 'pkgs', debug: true }).args).toEqual([
      'delete',
      '--prev-app',
      'repo-ctrl',
      ...shared,
      '--debug=true',
      '--app',
      'repo.pkgr',
      '--namespace=pkgs',
      '--yes',
    ]);
  });

  it('can run with a given kubeconfig instead of the runtime identity', () => {
    const cmd = packageRepositoryDeleteCommand({ name: 'repo', namespace: 'pkgs', kubeconfigYaml: 'KC' });
    expect(cmd.args.slice(-5)).toEqual(['--app', 'repo.pkgr', '--namespace=pkgs', '--kubeconfig=/dev/null', '--yes']);
    expect(cmd.env).toEqual({ KAPP_KUBECONFIG_YAML: 'KC' });
  });
});

describe('app metadata -> status.deploy.kapp.associatedResources', () => {
  const META = `labelKey: kapp.k14s.io/app
labelValue: "1692981540474432000"
lastChangeName: simple-app.app-change-abc
lastChange:
  startedAt: "2024-01-01T00:00:00Z"
  successful: true
  description: 'update: Op: 1 create, 0 delete, 0 update, 0 noop, 0 exists / Wait to: 1 reconcile, 0 delete, 0 noop'
  namespaces:
  - kappctrl-test
  - (cluster)
usedGVs:
- Group: rbac.authorization.k8s.io
  Version: v1
usedGKs:
- Group: ""
  Kind: ConfigMap
- Group: rbac.authorization.k8s.io
  Kind: Role
`;

  it('parses kapp metadata and builds associatedResources', () => {
    const meta = parseKappAppMeta(META);
    expect(associatedResources(meta)).toEqual({
      label: 'kapp.k14s.io/app=1692981540474432000',
      namespaces: ['kappctrl-test', '(cluster)'],
      groupKinds: [
        { group: '', kind: 'ConfigMap' },
        { group: 'rbac.authorization.k8s.io', kind: 'Role' },
      ],
    });
  });

  it('matches keys case-insensitively, as Go encoding/json', () => {
    const meta = parseKappAppMeta(
      'LabelKey: k\nlabelvalue: v\nLASTCHANGE: {Namespaces: [ns]}\nusedgks: [{group: g, kind: K}]\n',
    );
    expect(associatedResources(meta)).toEqual({
      label: 'k=v',
      namespaces: ['ns'],
      groupKinds: [{ group: 'g', kind: 'K' }],
    });
  });

  it.each([
    ['labelKey: k\nlabelValue: v\nlastChange: {namespaces: []}\n', 'no namespaces'],
    ['{{{', 'invalid YAML'],
    ['labelKey: [1]\n', 'wrong type'],
    ['- a\n', 'not a mapping'],
  ])('yields nothing for %j (%s)', (text) => {
    expect(associatedResources(parseKappAppMeta(text))).toBeUndefined();
  });
});
