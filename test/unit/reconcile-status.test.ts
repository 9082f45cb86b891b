import { describe, expect, it } from 'vitest';
import { BLOCKING_FOR_DEPLOY_PREFIX, KAPP_ERROR_PREFIX } from '../../functions/lib/deploy/kapp.js';
import { PREPARING_KAPP_PREFIX } from '../../functions/lib/deploy/kubeconfig.js';
import {
  CommandCanceledError,
  CommandExitError,
  CommandStartError,
  CommandTimeoutError,
} from '../../functions/lib/exec/runner.js';
import { FETCH_RUN_ERROR_PREFIX } from '../../functions/lib/fetch/vendir.js';
import {
  boundedStatusText,
  MAX_STATUS_TEXT_BYTES,
  redactSecrets,
  TRUNCATION_PREFIX,
  truncateTail,
} from '../../functions/lib/reconcile/redact.js';
import {
  attachError,
  CA_HINT,
  GENERIC_ERROR_DETAIL,
  resultFromError,
  type StageResult,
  withCAHint,
  withFriendlyYAMLStrings,
} from '../../functions/lib/reconcile/result.js';
import {
  deployStatus,
  fetchStatus,
  formatStatusTime,
  inspectStatus,
  markDeleteCompleted,
  markDeleteFailed,
  markDeleting,
  markFailed,
  markPausedOrCanceled,
  markReconcileCompleted,
  markReconciling,
  markSucceeded,
  summarizeStatus,
  templateStatus,
  unchangedButRunTimes,
  usefulErrorMessage,
} from '../../functions/lib/reconcile/status.js';
import type { AppStatusLike } from '../../functions/lib/reconcile/types.js';
import { TEMPLATING_DIR_ERROR_PREFIX, TEMPLATING_HELM_ERROR_PREFIX } from '../../functions/lib/template/step.js';

const T1 = new Date('2024-05-01T10:00:01.250Z');
const T2 = new Date('2024-05-01T10:00:02Z');
const T3 = new Date('2024-05-01T10:00:03Z');
const GENERIC = 'Error (see .status.usefulErrorMessage for details)';
const EMPTY: AppStatusLike = {};

const ok = (stdout = '', stderr = ''): StageResult => attachError('', { stdout, stderr });

describe('strings', () => {
  it('has the upstream generic detail and prefixes', () => {
    expect(GENERIC_ERROR_DETAIL).toBe(GENERIC);
  });

  it('formats metav1.Time with whole seconds in UTC', () => {
    expect(formatStatusTime(T1)).toBe('2024-05-01T10:00:01Z');
  });
});

describe('attachError (AttachErrorf)', () => {
  it.each([
    [
      'exit status 1 becomes the generic detail',
      KAPP_ERROR_PREFIX.deploy,
      new CommandExitError('kapp', 1),
      1,
      `Deploying: ${GENERIC}`,
    ],
    [
      'another exit status is quoted',
      TEMPLATING_DIR_ERROR_PREFIX,
      new CommandExitError('ytt', 2),
      2,
      'Templating dir: exit status 2',
    ],
    [
      'a signal has exit code -1',
      FETCH_RUN_ERROR_PREFIX,
      new CommandExitError('vendir', -1, 'SIGKILL'),
      -1,
      'Fetching resources: signal: killed',
    ],
    [
      'cancellation during the run',
      KAPP_ERROR_PREFIX.deploy,
      new CommandCanceledError('kapp', true, undefined),
      -1,
      'Deploying: Process was canceled',
    ],
    [
      'cancellation before the run',
      KAPP_ERROR_PREFIX.deploy,
      new CommandCanceledError('kapp', false, undefined),
      -1,
      'Deploying: Already canceled',
    ],
    [
      'timeout',
      TEMPLATING_HELM_ERROR_PREFIX,
      new CommandTimeoutError('helm', 5000),
      -1,
      'Templating helm chart: Process timed out after 5000ms',
    ],
    [
      'spawn failure',
      KAPP_ERROR_PREFIX.inspect,
      new CommandStartError('kapp', Object.assign(new Error('spawn x ENOENT'), { code: 'ENOENT' })),
      -1,
      'Inspecting: failed to start kapp: ENOENT',
    ],
    ['a plain error has no exit code', KAPP_ERROR_PREFIX.delete, new Error('boom'), -1, 'Deleting: boom'],
  ] as const)('%s', (_name, prefix, error, exitCode, message) => {
    expect(attachError(prefix, { stdout: 'out', stderr: 'err', error })).toEqual({
      stdout: 'out',
      stderr: 'err',
      exitCode,
      error: message,
      finished: true,
    });
  });

  it('a successful run is finished with exit code 0 and no error', () => {
    expect(attachError(KAPP_ERROR_PREFIX.deploy, { stdout: 'Succeeded', stderr: '', error: undefined })).toEqual({
      stdout: 'Succeeded',
      stderr: '',
      exitCode: 0,
      finished: true,
    });
  });

  it('resultFromError (NewCmdRunResultWithErr)', () => {
    expect(resultFromError(new Error('Getting service account: not found'), PREPARING_KAPP_PREFIX)).toEqual({
      stdout: '',
      stderr: '',
      exitCode: -1,
      error: 'Preparing kapp: Getting service account: not found',
      finished: true,
    });
    expect(resultFromError('Expected exactly one deploy option').error).toBe('Expected exactly one deploy option');
  });
});

describe('withFriendlyYAMLStrings', () => {
  it.each([
    ['  a  \n b\t\n\nc  \n', 'a\n b\nc'],
    ['Changes\n\nNamespace  Name  \nOp:      0 create\n', 'Changes\nNamespace  Name\nOp:      0 create'],
    ['plain', 'plain'],
    ['\n\n', ''],
  ])('%j -> %j', (input, expected) => {
    const r = withFriendlyYAMLStrings({ stdout: input, stderr: input, exitCode: 3, error: 'e', finished: true });
    expect(r).toEqual({ stdout: expected, stderr: expected, exitCode: 3, error: 'e', finished: true });
  });
});

describe('withCAHint', () => {
  it('appends the hint to a failed fetch with an unknown CA', () => {
    const r = attachError(FETCH_RUN_ERROR_PREFIX, {
      stderr:
        'vendir: Error: Syncing directory \'0\':\n  Get "https://registry.local/v2/": x509: certificate signed by unknown authority',
      error: new CommandExitError('vendir', 1),
    });
    expect(withCAHint(r).stderr).toBe(
      'vendir: Error: Syncing directory \'0\':\n  Get "https://registry.local/v2/": x509: certificate signed by unknown authority\n' +
        '(hint: The CA Certificate from URL is unknown/invalid. Add valid CA certificate to the kapp-controller configuration to reconcile successfully)',
    );
    expect(withCAHint({ ...r, stderr: `${r.stderr}\n` }).stderr.endsWith(`authority\n${CA_HINT}`)).toBe(true);
  });

  it('leaves other failures and successes alone', () => {
    const failed = attachError(FETCH_RUN_ERROR_PREFIX, { stderr: 'no such host', error: new CommandExitError('v', 1) });
    expect(withCAHint(failed)).toBe(failed);
    const succeeded = ok('', 'x509: certificate signed by unknown authority');
    expect(withCAHint(succeeded)).toBe(succeeded);
  });
});

describe('truncateTail (PR #1840)', () => {
  it('leaves text within the bound unchanged', () => {
    expect(truncateTail('hello')).toBe('hello');
    const exact = 'x'.repeat(MAX_STATUS_TEXT_BYTES);
    expect(truncateTail(exact)).toBe(exact);
  });

  it('keeps the tail, prefixed, within 1 MiB in total', () => {
    const text = `${'a'.repeat(600_000)}${'b'.repeat(600_000)}THE END`;
    const out = truncateTail(text);
    expect(out.startsWith(TRUNCATION_PREFIX)).toBe(true);
    expect(out.endsWith('bTHE END')).toBe(true);
    expect(Buffer.byteLength(out)).toBe(MAX_STATUS_TEXT_BYTES);
    expect(out).toBe(TRUNCATION_PREFIX + text.slice(text.length - (MAX_STATUS_TEXT_BYTES - TRUNCATION_PREFIX.length)));
  });

  it('never splits a multi-byte character', () => {
    // 'é' is 2 bytes: a 5-byte tail would start mid-character, so only 2 characters are kept.
    const out = truncateTail('ééééééééééééééé', TRUNCATION_PREFIX.length + 5);
    expect(out).toBe(`${TRUNCATION_PREFIX}éé`);
  });
});

describe('redactSecrets', () => {
  it.each([
    ['https://user:pass@github.com/org/repo.git', 'https://***@github.com/org/repo.git'],
    ['git clone https://x-access-token:ghp_abc123@github.com/o/r', 'git clone https://***@github.com/o/r'],
    ['https://token@host/x and http://a:b@c:8080/', 'https://***@host/x and http://***@c:8080/'],
    ['https://user:p@ss@host/path', 'https://***@host/path'],
    ['oci://u:p@registry.local/pkg', 'oci://***@registry.local/pkg'],
    ['https://github.com/org/repo.git', 'https://github.com/org/repo.git'],
    ['mail admin@example.com at https://example.com/a@b', 'mail admin@example.com at https://example.com/a@b'],
    ['token: abc.def-123', 'token: ***'],
    ['token=abc123&page=2', 'token=***&page=2'],
    ['?access_token=xyz&x=1', '?access_token=***&x=1'],
    ['password=hunter2', 'password=***'],
    ['passwd: hunter2', 'passwd: ***'],
    ['  passwd: hunter2\n', '  passwd: ***\n'],
    ['--passwd=hunter2', '--passwd=***'],
    ['https://host/api/token=abc123', 'https://host/api/token=***'],
    ['{"path": "/etc/passwd", "passwd": "x"}', '{"path": "/etc/passwd", "passwd": "***"}'],
    ['Password: hunter2 next', 'Password: *** next'],
    ['{"password":"hunter2","user":"bob"}', '{"password":"***","user":"bob"}'],
    ["{'apiKey': 'k-123'}", "{'apiKey': '***'}"],
    ['client_secret=s3cr3t', 'client_secret=***'],
    ['AWS_SECRET_ACCESS_KEY=wJalrXUtnFEMI', 'AWS_SECRET_ACCESS_KEY=***'],
    ['accessToken: eyJhbGciOi', 'accessToken: ***'],
    ['Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.e30.sig', 'Authorization: Bearer ***'],
    ['authorization: Basic dXNlcjpwYXNz', 'authorization: Basic ***'],
    ['"Authorization": "token ghp_123456"', '"Authorization": "token ***"'],
    ['Authorization: abcdef', 'Authorization: ***'],
    ['sent Bearer abcdefgh12345678 to server', 'sent Bearer *** to server'],
    ['"auths":{"r.io":{"auth":"dXNlcjpwYXNz"}}', '"auths":{"r.io":{"auth":"***"}}'],
    ['helm repo add --password s3cret --username u', 'helm repo add --password *** --username u'],
    ['docker login --password-stdin', 'docker login --password-stdin'],
    [
      'key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIabc\ndef\n-----END RSA PRIVATE KEY-----\nafter',
      'key:\n-----BEGIN RSA PRIVATE KEY-----\n***\n-----END RSA PRIVATE KEY-----\nafter',
    ],
    ['-----BEGIN PRIVATE KEY-----\nMIIcut', '-----BEGIN PRIVATE KEY-----\n***\n-----END PRIVATE KEY-----'],
    ['AGE-SECRET-KEY-1QQPZ7XJ3', 'AGE-SECRET-KEY-***'],
    // Not secrets: left alone.
    [
      'Error: open /tmp/run/chart/etc/passwd: No such file or directory',
      'Error: open /tmp/run/chart/etc/passwd: No such file or directory',
    ],
    [
      'open /var/run/secrets/kubernetes.io/serviceaccount/token: permission denied',
      'open /var/run/secrets/kubernetes.io/serviceaccount/token: permission denied',
    ],
    ['open C:\\etc\\passwd: access is denied', 'open C:\\etc\\passwd: access is denied'],
    ['secretRef:\n  name: my-creds', 'secretRef:\n  name: my-creds'],
    ['Fetching: Getting secret: secrets "x" not found', 'Fetching: Getting secret: secrets "x" not found'],
    ['Bearer token expired', 'Bearer token expired'],
    ['kind: Secret', 'kind: Secret'],
    ['', ''],
  ])('%j', (input, expected) => {
    expect(redactSecrets(input)).toBe(expected);
  });

  it('scans megabytes of adversarial text quickly', () => {
    const inputs = ['a'.repeat(2_000_000), 'a-'.repeat(1_000_000), 'https:'.repeat(300_000), 'x@'.repeat(1_000_000)];
    const started = performance.now();
    for (const s of inputs) redactSecrets(s);
    expect(performance.now() - started).toBeLessThan(5_000);
  });

  it('boundedStatusText redacts before truncating', () => {
    // Truncating first would keep a tail of the password ('ppp… xxx…'), no longer recognizable.
    const text = `password=${'p'.repeat(40)} ${'x'.repeat(10)}`;
    const bound = TRUNCATION_PREFIX.length + 30;
    expect(truncateTail(text, bound)).toBe(`${TRUNCATION_PREFIX}${'p'.repeat(19)} ${'x'.repeat(10)}`);
    expect(boundedStatusText(text, bound)).toBe(`password=*** ${'x'.repeat(10)}`);
    expect(boundedStatusText(`token=${'t'.repeat(60)} ${'y'.repeat(60)}`, bound)).toBe(
      `${TRUNCATION_PREFIX}${'y'.repeat(30)}`,
    );
  });
});

describe('stage status blocks', () => {
  it('fetchStatus stores stdout and stderr (with the CA hint), redacted', () => {
    const r = attachError(FETCH_RUN_ERROR_PREFIX, {
      stdout: 'kind: LockConfig\nurl: https://u:p@h/x\n',
      stderr: 'x509: certificate signed by unknown authority',
      error: new CommandExitError('vendir', 1),
    });
    expect(fetchStatus(r, { startedAt: T1, updatedAt: T2 })).toEqual({
      stdout: 'kind: LockConfig\nurl: https://***@h/x\n',
      stderr: `x509: certificate signed by unknown authority\n${CA_HINT}`,
      exitCode: 1,
      error: `Fetching resources: ${GENERIC}`,
      startedAt: '2024-05-01T10:00:01Z',
      updatedAt: '2024-05-01T10:00:02Z',
    });
  });

  it('fetchStatus omits empty strings and keeps a string startedAt', () => {
    expect(fetchStatus(ok(), { startedAt: '2024-05-01T09:00:00Z', updatedAt: T2 })).toEqual({
      exitCode: 0,
      startedAt: '2024-05-01T09:00:00Z',
      updatedAt: '2024-05-01T10:00:02Z',
    });
  });

  it('templateStatus never stores stdout', () => {
    expect(templateStatus(ok('apiVersion: v1\nkind: ConfigMap\n', 'warn'), { updatedAt: T3 })).toEqual({
      stderr: 'warn',
      exitCode: 0,
      updatedAt: '2024-05-01T10:00:03Z',
    });
  });

  it('deployStatus applies friendly YAML strings, keeps finished and exitCode, and kapp metadata', () => {
    const kapp = {
      associatedResources: {
        label: 'kapp.k14s.io/app=1700000000',
        namespaces: ['kappctrl-test'],
        groupKinds: [{ group: 'rbac.authorization.k8s.io', kind: 'Role' }],
      },
    };
    const running: StageResult = { stdout: 'Target cluster  \n\n', stderr: '', exitCode: 0, finished: false };
    expect(deployStatus(running, { startedAt: T1, updatedAt: T2 }, kapp)).toEqual({
      stdout: 'Target cluster',
      finished: false,
      exitCode: 0,
      startedAt: '2024-05-01T10:00:01Z',
      updatedAt: '2024-05-01T10:00:02Z',
      kapp,
    });
  });

  it('deployStatus bounds stdout to 1 MiB', () => {
    const big = ok(`${'line \n'.repeat(300_000)}Succeeded`);
    const d = deployStatus(big, { startedAt: T1, updatedAt: T2 });
    expect(Buffer.byteLength(d.stdout ?? '')).toBe(MAX_STATUS_TEXT_BYTES);
    expect(d.stdout?.startsWith(`${TRUNCATION_PREFIX}`)).toBe(true);
    expect(d.stdout?.endsWith('line\nSucceeded')).toBe(true);
  });

  it('inspectStatus is null for an empty result and friendly otherwise', () => {
    expect(inspectStatus({ stdout: '', stderr: '', exitCode: 0, finished: false }, { updatedAt: T3 })).toBeUndefined();
    expect(inspectStatus(ok("Resources in app 'simple-app.app'  \n\n"), { updatedAt: T3 })).toEqual({
      stdout: "Resources in app 'simple-app.app'",
      exitCode: 0,
      updatedAt: '2024-05-01T10:00:03Z',
    });
  });
});

describe('transitions', () => {
  it('markReconciling sets observedGeneration, one condition and the friendly text', () => {
    const prev: AppStatusLike = {
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileFailed', status: 'True', message: 'x' }],
      friendlyDescription: 'Reconcile failed: x',
      usefulErrorMessage: 'x',
      consecutiveReconcileFailures: 2,
    };
    const next = markReconciling(prev, 2);
    expect(next).toEqual({
      observedGeneration: 2,
      conditions: [{ type: 'Reconciling', status: 'True' }],
      friendlyDescription: 'Reconciling',
      usefulErrorMessage: 'x',
      consecutiveReconcileFailures: 2,
    });
    expect(prev.observedGeneration).toBe(1);
  });

  it('markSucceeded counts and clears the error', () => {
    const s = markSucceeded(markFailed(markReconciling(undefined, 1), 'Deploying: boom'));
    expect(s).toEqual({
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
      friendlyDescription: 'Reconcile succeeded',
      usefulErrorMessage: '',
      consecutiveReconcileSuccesses: 1,
      consecutiveReconcileFailures: 0,
    });
    expect(markSucceeded(s).consecutiveReconcileSuccesses).toBe(2);
  });

  it('markFailed: usefulErrorMessage is stderr, else the error', () => {
    const withStderr = markFailed(EMPTY, `Templating dir: ${GENERIC}`, 'ytt: Error: \n- undefined: data\n');
    expect(withStderr.usefulErrorMessage).toBe('ytt: Error: \n- undefined: data\n');
    const withoutStderr = markFailed<AppStatusLike>({ consecutiveReconcileSuccesses: 4 }, 'Preparing kapp: no SA');
    expect(withoutStderr).toEqual({
      conditions: [{ type: 'ReconcileFailed', status: 'True', message: 'Preparing kapp: no SA' }],
      friendlyDescription: 'Reconcile failed: Preparing kapp: no SA',
      usefulErrorMessage: 'Preparing kapp: no SA',
      consecutiveReconcileFailures: 1,
      consecutiveReconcileSuccesses: 0,
    });
  });

  it('markFailed redacts the condition, friendly text and useful message', () => {
    const s = markFailed(EMPTY, 'Fetching resources: Get "https://u:p@h": refused', 'password=hunter2');
    expect(s.conditions).toEqual([
      { type: 'ReconcileFailed', status: 'True', message: 'Fetching resources: Get "https://***@h": refused' },
    ]);
    expect(s.friendlyDescription).toBe('Reconcile failed: Fetching resources: Get "https://***@h": refused');
    expect(s.usefulErrorMessage).toBe('password=***');
    expect(usefulErrorMessage('e', '')).toBe('e');
  });

  it('delete transitions', () => {
    const deleting = markDeleting({ observedGeneration: 1, usefulErrorMessage: 'old' }, 2);
    expect(deleting).toEqual({
      observedGeneration: 2,
      conditions: [{ type: 'Deleting', status: 'True' }],
      friendlyDescription: 'Deleting',
      usefulErrorMessage: 'old',
    });
    const failed = markDeleteFailed(deleting, `Deleting: ${GENERIC}`, 'kapp: Error: timed out');
    expect(failed).toEqual({
      observedGeneration: 2,
      conditions: [{ type: 'DeleteFailed', status: 'True', message: `Deleting: ${GENERIC}` }],
      friendlyDescription: `Delete failed: Deleting: ${GENERIC}`,
      usefulErrorMessage: 'kapp: Error: timed out',
      consecutiveReconcileFailures: 1,
      consecutiveReconcileSuccesses: 0,
    });
    expect(markDeleteCompleted(deleting, ok())).toEqual(deleting);
    expect(markDeleteCompleted(deleting, resultFromError('x', 'Unblocking for deploy: '))).toEqual(
      markDeleteFailed(deleting, 'Unblocking for deploy: x'),
    );
  });

  it('paused or canceled keeps the conditions', () => {
    const prev: AppStatusLike = {
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileSucceeded', status: 'True' }],
      friendlyDescription: 'Reconcile succeeded',
    };
    expect(markPausedOrCanceled(prev, 2)).toEqual({
      ...prev,
      observedGeneration: 2,
      friendlyDescription: 'Canceled/paused',
    });
    expect(markPausedOrCanceled(prev, 2, 'PackageRepository').friendlyDescription).toBe('Paused');
    expect(markPausedOrCanceled(undefined, 1)).toEqual({
      observedGeneration: 1,
      friendlyDescription: 'Canceled/paused',
    });
  });
});

describe('upstream status examples, end to end', () => {
  it('app_reconcile_test Test_NoInspectReconcile_IfNoDeployAttempted (fetch failure)', () => {
    let s = markReconciling(undefined, 0);
    const stderr =
      'vendir: Error: Syncing directory \'0\':\n  Syncing directory \'.\' with HTTP contents:\n    Downloading URL:\n      Initiating URL download:\n        Get "i-dont-exist": unsupported protocol scheme ""\n';
    const fetch = attachError(FETCH_RUN_ERROR_PREFIX, { stderr, error: new CommandExitError('vendir', 1) });
    s = { ...s, fetch: fetchStatus(fetch, { startedAt: T1, updatedAt: T2 }) };
    s = markReconcileCompleted(s, fetch);
    expect(s).toEqual({
      observedGeneration: 0,
      conditions: [{ type: 'ReconcileFailed', status: 'True', message: `Fetching resources: ${GENERIC}` }],
      friendlyDescription: `Reconcile failed: Fetching resources: ${GENERIC}`,
      usefulErrorMessage: stderr,
      fetch: {
        stderr,
        error: `Fetching resources: ${GENERIC}`,
        exitCode: 1,
        startedAt: '2024-05-01T10:00:01Z',
        updatedAt: '2024-05-01T10:00:02Z',
      },
      consecutiveReconcileFailures: 1,
      consecutiveReconcileSuccesses: 0,
    });
  });

  it('Test_NoInspectReconcile_IfInspectNotEnabled (Blocking for deploy)', () => {
    const lock =
      'apiVersion: vendir.k14s.io/v1alpha1\ndirectories:\n- contents:\n  - inline: {}\n    path: .\n  path: "0"\nkind: LockConfig\n';
    let s = markReconciling(undefined, 0);
    s = { ...s, fetch: fetchStatus(ok(lock), { startedAt: T1, updatedAt: T1 }) };
    s = { ...s, template: templateStatus(ok('---\n'), { updatedAt: T2 }) };
    const deploy = resultFromError(
      new Error('Updating app: apps.kappctrl.k14s.io "simple-app" not found'),
      BLOCKING_FOR_DEPLOY_PREFIX,
    );
    s = { ...s, deploy: deployStatus(deploy, { startedAt: T2, updatedAt: T3 }) };
    s = markReconcileCompleted(s, deploy);
    const inspect = inspectStatus({ stdout: '', stderr: '', exitCode: 0, finished: false }, { updatedAt: T3 });
    s = { ...s, inspect };
    const msg = 'Blocking for deploy: Updating app: apps.kappctrl.k14s.io "simple-app" not found';
    expect(s).toEqual({
      observedGeneration: 0,
      conditions: [{ type: 'ReconcileFailed', status: 'True', message: msg }],
      friendlyDescription: `Reconcile failed: ${msg}`,
      usefulErrorMessage: msg,
      fetch: { stdout: lock, exitCode: 0, startedAt: '2024-05-01T10:00:01Z', updatedAt: '2024-05-01T10:00:01Z' },
      template: { exitCode: 0, updatedAt: '2024-05-01T10:00:02Z' },
      deploy: {
        finished: true,
        exitCode: -1,
        error: msg,
        startedAt: '2024-05-01T10:00:02Z',
        updatedAt: '2024-05-01T10:00:03Z',
      },
      inspect: undefined,
      consecutiveReconcileFailures: 1,
      consecutiveReconcileSuccesses: 0,
    });
  });

  it('Test_TemplateError_DisplayedInStatus_UsefulErrorMessageProperty', () => {
    const stderr = 'ytt: Error: \n- undefined: data\n    file.yml:1 | foo: #@ data.values.nothere\n';
    const tpl = attachError(TEMPLATING_DIR_ERROR_PREFIX, { stderr, error: new CommandExitError('ytt', 1) });
    const s = markReconcileCompleted(
      { ...markReconciling(undefined, 0), template: templateStatus(tpl, { updatedAt: T2 }) },
      tpl,
    );
    expect(s.conditions).toEqual([{ type: 'ReconcileFailed', status: 'True', message: `Templating dir: ${GENERIC}` }]);
    expect(s.friendlyDescription).toBe(`Reconcile failed: Templating dir: ${GENERIC}`);
    expect(s.usefulErrorMessage).toBe(stderr);
    expect(s.template).toEqual({
      stderr,
      error: `Templating dir: ${GENERIC}`,
      exitCode: 1,
      updatedAt: '2024-05-01T10:00:02Z',
    });
  });

  it('app_status_test deploy failure and cancel_test', () => {
    const kappErr =
      'kapp: Error: Checking existence of resource configmap/configmap (v1) namespace: does-not-exist:\n  API server says: ...';
    const deploy = attachError(KAPP_ERROR_PREFIX.deploy, {
      stderr: `${kappErr}\n`,
      error: new CommandExitError('kapp', 1),
    });
    const friendly = withFriendlyYAMLStrings(deploy);
    const s = markReconcileCompleted(markReconciling(undefined, 1), friendly);
    expect(s).toEqual({
      observedGeneration: 1,
      conditions: [{ type: 'ReconcileFailed', status: 'True', message: `Deploying: ${GENERIC}` }],
      friendlyDescription: `Reconcile failed: Deploying: ${GENERIC}`,
      usefulErrorMessage: kappErr,
      consecutiveReconcileSuccesses: 0,
      consecutiveReconcileFailures: 1,
    });
    const canceled = attachError(KAPP_ERROR_PREFIX.deploy, {
      error: new CommandCanceledError('kapp', true, undefined),
    });
    const d = deployStatus(canceled, { startedAt: T1, updatedAt: T2 });
    expect([d.finished, d.exitCode, d.error]).toEqual([true, -1, 'Deploying: Process was canceled']);
    expect(markReconcileCompleted(EMPTY, canceled).conditions).toEqual([
      { type: 'ReconcileFailed', status: 'True', message: 'Deploying: Process was canceled' },
    ]);
  });
});

describe('unchangedButRunTimes: a run that changed nothing', () => {
  const run = (at: Date, stdout = 'Succeeded') => ({
    fetch: fetchStatus(ok('lock'), { startedAt: at, updatedAt: at }),
    template: templateStatus(ok(), { updatedAt: at }),
    deploy: deployStatus({ ...ok(stdout), finished: true }, { startedAt: at, updatedAt: at }),
  });
  const last = summarizeStatus(undefined, 1, run(T1), ok());

  it('differs only in stage times and consecutiveReconcileSuccesses: unchanged', () => {
    const next = summarizeStatus(last, 1, run(T3), ok());
    expect(next.consecutiveReconcileSuccesses).toBe(2);
    expect(unchangedButRunTimes(last, next)).toBe(true);
  });

  it('a first reconcile, a new generation, new output or a failure is a change', () => {
    expect(unchangedButRunTimes(undefined, last)).toBe(false);
    expect(unchangedButRunTimes(last, summarizeStatus(last, 2, run(T3), ok()))).toBe(false);
    expect(unchangedButRunTimes(last, summarizeStatus(last, 1, run(T3, 'applying 1 changes'), ok()))).toBe(false);
    const failed = attachError('Deploying: ', { stdout: '', stderr: 'boom', error: new Error('exit 1') });
    expect(unchangedButRunTimes(last, summarizeStatus(last, 1, run(T3), failed))).toBe(false);
    // the last reconcile failed: the same success now is a change (conditions, counts)
    const lastFailed = summarizeStatus(last, 1, run(T2), failed);
    expect(unchangedButRunTimes(lastFailed, summarizeStatus(lastFailed, 1, run(T3), ok()))).toBe(false);
    // Reconciling left by a run that did not end
    expect(unchangedButRunTimes(markReconciling(last, 1), summarizeStatus(last, 1, run(T3), ok()))).toBe(false);
  });
});
