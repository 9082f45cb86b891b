/**
 * Issue 7, item 1: no user value reaches a tool where it could be read as an option. For each
 * tool, the hostile values tried and the exact status error each gets; where the value is refused,
 * the (fake) command runner is never called. Values that stay allowed are shown reaching the tool
 * as a single argument that cannot be a flag.
 */
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { type App, type AppFetch, type AppTemplate, refObjectsFrom } from '../../functions/lib/api/index.js';
import { kappDeleteCommand, kappDeployCommand, kappInspectCommand } from '../../functions/lib/deploy/kapp.js';
import type { ClusterAccess } from '../../functions/lib/deploy/kubeconfig.js';
import { FakeCommandRunner } from '../../functions/lib/exec/fake.js';
import { fetchWithVendir } from '../../functions/lib/fetch/run.js';
import type { FetchView } from '../../functions/lib/kube/port.js';
import { type PipelineDeps, secretMaskOf } from '../../functions/lib/pipeline/deps.js';
import { MemoryStore } from '../../functions/lib/store/memory.js';
import { runTemplateSteps } from '../../functions/lib/template/execute.js';
import { planTemplate, type RunStep } from '../../functions/lib/template/index.js';

const ROOT = '/w/fetch/0';
const SCRATCH = '/w/scratch';
const KUBECONFIG = '/var/task/.kube/config';

const HELM_NAME_RULE =
  'invalid release name, must match regex ^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$ and the length must not be longer than 53';
const DNS_LABEL_RULE =
  "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
const OPTION_RULE = 'it must not begin with "-" (a tool would read it as an option)';

function deps(runner: FakeCommandRunner, tmpRoot = '/nonexistent/tmp'): PipelineDeps {
  // Only the ports the functions under test use: the runner, the store and the config.
  return {
    runner,
    store: new MemoryStore(),
    config: { tmpRoot, toolVersions: {}, controllerVersion: 'test' },
  } as unknown as PipelineDeps;
}

function plan(template: AppTemplate[], metadata = { name: 'app', namespace: 'ns' }) {
  return planTemplate({
    app: { metadata, spec: { template } },
    templateRoot: ROOT,
    scratchRoot: SCRATCH,
    refs: refObjectsFrom({}),
  });
}

/** Plans and runs the template steps with a fake runner; returns the status error and the runner. */
async function renderError(template: AppTemplate[], metadata?: { name: string; namespace: string }) {
  const runner = new FakeCommandRunner({ fallback: { stdout: 'kind: ConfigMap\n' } });
  const r = await runTemplateSteps(plan(template, metadata).steps, deps(runner), ROOT);
  return { error: r.result.error, runner };
}

function runStep(step: unknown): RunStep {
  expect((step as RunStep).kind).toBe('run');
  return step as RunStep;
}

describe('helm template', () => {
  it.each([
    ['--post-renderer=sh', 'runs a program'],
    [`--set-file=cfg=${KUBECONFIG}`, 'renders a local file into the output'],
    ['-h', 'a short flag'],
    ['--', 'the end-of-options marker'],
    ['Rel', 'upper case'],
    ['rel_1', 'underscore'],
    ['rel;sh', 'shell metacharacter'],
    ['a'.repeat(54), 'one over helm’s 53'],
  ])('refuses helmTemplate.name %j (%s)', async (name) => {
    const { error, runner } = await renderError([{ helmTemplate: { name } }]);
    expect(error).toBe(`helmTemplate.name ${JSON.stringify(name)} is not a valid release name: ${HELM_NAME_RULE}`);
    expect(runner.calls).toEqual([]);
  });

  it('refuses an App name that helm would refuse as the default release name', async () => {
    const name = 'a'.repeat(54);
    const { error, runner } = await renderError([{ helmTemplate: {} }], { name, namespace: 'ns' });
    expect(error).toBe(
      `metadata.name (the default helmTemplate.name) "${name}" is not a valid release name: ${HELM_NAME_RULE}`,
    );
    expect(runner.calls).toEqual([]);
  });

  it.each([
    ['--kubeconfig=/x', DNS_LABEL_RULE],
    ['-n', DNS_LABEL_RULE],
    ['Upper', DNS_LABEL_RULE],
    ['a.b', DNS_LABEL_RULE],
    ['a'.repeat(64), 'must be no more than 63 characters'],
    ['-'.repeat(64), `must be no more than 63 characters; ${DNS_LABEL_RULE}`],
  ])('refuses helmTemplate.namespace %j', async (namespace, rule) => {
    const { error, runner } = await renderError([{ helmTemplate: { name: 'rel', namespace } }]);
    expect(error).toBe(`helmTemplate.namespace ${JSON.stringify(namespace)} is not a valid namespace: ${rule}`);
    expect(runner.calls).toEqual([]);
  });

  it('quotes a refused value as JSON, cut to 128 characters', async () => {
    const name = `--x\n${'y'.repeat(300)}`;
    const { error } = await renderError([{ helmTemplate: { name } }]);
    expect(error).toBe(
      `helmTemplate.name ${JSON.stringify(`${name.slice(0, 128)}...`)} is not a valid release name: ${HELM_NAME_RULE}`,
    );
  });

  it('stops before any tool when a later step is refused, after running the earlier ones', async () => {
    const { error, runner } = await renderError([{ ytt: {} }, { helmTemplate: { name: '--post-renderer=sh' } }]);
    expect(error).toContain('helmTemplate.name "--post-renderer=sh"');
    expect(runner.argv()).toEqual([['ytt', '-f', ROOT]]);
  });

  it('attaches other user values with "=" and passes the positionals after "--"', async () => {
    const runner = new FakeCommandRunner({ fallback: { stdout: 'kind: ConfigMap\n' } });
    const steps = plan([
      {
        helmTemplate: {
          name: 'rel',
          namespace: 'target',
          kubernetesVersion: { version: '--post-renderer=sh' },
          kubernetesAPIs: { groupVersions: ['--set-file=x=/etc/passwd'] },
        },
      },
    ]).steps;
    const r = await runTemplateSteps(steps, deps(runner), ROOT);
    expect(r.result.error).toBeUndefined();
    expect(runner.argv()).toEqual([
      [
        'helm',
        'template',
        '--namespace=target',
        '--include-crds',
        '--kube-version=--post-renderer=sh',
        '--api-versions=--set-file=x=/etc/passwd',
        '--',
        'rel',
        ROOT,
      ],
    ]);
  });
});

describe('cue export', () => {
  it.each([['--outfile=/x'], ['-e'], ['--inject=x=y'], ['-']])('refuses cue.paths entry %j', async (p) => {
    const runner = new FakeCommandRunner({ fallback: {} });
    const r = await runTemplateSteps(plan([{ cue: { paths: ['ok.cue', p] } }]).steps, deps(runner), ROOT);
    expect(r.result.error).toBe(`cue.paths[1] ${JSON.stringify(p)} is not a valid path: ${OPTION_RULE}`);
    expect(runner.calls).toEqual([]);
  });

  it('attaches the expressions with "=" and passes paths and values files after "--"', () => {
    const step = runStep(
      plan([
        {
          cue: {
            paths: ['app.cue', './-x.cue'],
            inputExpression: '--outfile=/x',
            outputExpression: '--force',
          },
        },
      ]).steps[0],
    );
    expect(step.args).toEqual([
      'export',
      '--out',
      'yaml',
      '--path=--outfile=/x',
      '--expression=--force',
      '--',
      'app.cue',
      './-x.cue',
    ]);
  });
});

describe('ytt and kbld', () => {
  it('turns every path into an absolute -f value and attaches file marks with "="', () => {
    const step = runStep(
      plan([
        {
          ytt: {
            paths: ['--output-files=/tmp/x', '-'.repeat(3)],
            fileMarks: ['--dangerous-emptied-output-directory=/tmp', '-v'],
          },
        },
      ]).steps[0],
    );
    expect(step.args).toEqual([
      '-f',
      `${ROOT}/--output-files=/tmp/x`,
      '-f',
      `${ROOT}/---`,
      '--file-mark=--dangerous-emptied-output-directory=/tmp',
      '--file-mark=-v',
    ]);
    const kbld = runStep(plan([{ kbld: { paths: ['--build=true', '--imgpkg-lock-output=/x'] } }]).steps[0]);
    expect(kbld.args).toEqual(['-f', `${ROOT}/--build=true`, '-f', `${ROOT}/--imgpkg-lock-output=/x`, '--build=false']);
  });
});

describe('kapp', () => {
  const access: ClusterAccess = {
    name: 'app',
    namespace: '--kubeconfig-context=admin',
    deployNamespace: '-n',
    kubeconfigYaml: 'KC',
  };

  it('passes an allowed raw option as one argument, whatever its value holds', () => {
    const cmd = kappDeployCommand({
      kapp: { rawOptions: ['--wait=true --kubeconfig=/x'] },
      access,
      metadataFile: '/m',
      globalRawOptions: null,
    });
    expect(cmd.args).toContain('--wait=true --kubeconfig=/x');
    expect(cmd.args).not.toContain('--kubeconfig=/x');
  });

  it('attaches intoNs, mapNs and the namespaces with "=", so none is a flag of its own', () => {
    const cmd = kappDeployCommand({
      kapp: { intoNs: '--dangerous-override-ownership-of-existing-resources', mapNs: ['--kubeconfig=/x'] },
      access,
      metadataFile: '/m',
      globalRawOptions: null,
    });
    expect(cmd.args).toEqual([
      'deploy',
      '--app-metadata-file-output',
      '/m',
      '--prev-app',
      'app-ctrl',
      '-f',
      '-',
      '--into-ns=--dangerous-override-ownership-of-existing-resources',
      '--map-ns=--kubeconfig=/x',
      '--app',
      'app.app',
      '--namespace=--kubeconfig-context=admin',
      '--app-namespace=-n',
      '--kubeconfig=/dev/null',
      '--yes',
    ]);
  });

  it.each([
    ['--kubeconfig=/var/task/.kube/config', "Unexpected flag '--kubeconfig' specified (either forbidden or unknown)"],
    ['--app=other', "Unexpected flag '--app' specified (either forbidden or unknown)"],
    ['--diff-changes', "Expected flag '--diff-changes' to be in '--name=val' format"],
    ['--wait-timeout', "Expected flag '--wait-timeout' to be in '--name=val' format"],
    ['-y=true', "Expected flag '-y=true' to be in '--name=val' format"],
  ])('refuses raw option %j for deploy, delete and inspect', (option, message) => {
    expect(() =>
      kappDeployCommand({ kapp: { rawOptions: [option] }, access, metadataFile: '/m', globalRawOptions: null }),
    ).toThrow(message);
    expect(() => kappDeleteCommand({ kapp: { delete: { rawOptions: [option] } }, access })).toThrow(message);
    expect(() => kappInspectCommand({ kapp: { inspect: { rawOptions: [option] } }, access })).toThrow(message);
  });
});

describe('vendir (git, helm run by vendir)', () => {
  const kube = {
    getSecret: async () => undefined,
    getConfigMap: async () => undefined,
  } as unknown as FetchView;
  const app = (fetch: AppFetch[]) =>
    ({
      apiVersion: 'kappctrl.k14s.io/v1alpha1',
      kind: 'App',
      metadata: { name: 'a', namespace: 'ns', uid: 'u1' },
      spec: { fetch },
    }) as unknown as App;

  async function fetchError(fetch: AppFetch[]) {
    const runner = new FakeCommandRunner({ fallback: {} });
    const r = await fetchWithVendir(
      app(fetch),
      deps(runner),
      kube,
      undefined,
      secretMaskOf(deps(runner)),
      new AbortController().signal,
    );
    return { error: r.result.error, runner };
  }

  const REF_OPTION = 'a "/"-separated part must not begin with "-" (git would read it as an option)';
  const REF_CHARS = 'it must not contain control characters, space or any of ~ ^ : ? * [ \\';
  it.each([
    ['origin/--upload-pack=/tmp/x.sh', REF_OPTION],
    ['origin/-b', REF_OPTION],
    ['--upload-pack=sh', REF_OPTION],
    ['-q', REF_OPTION],
    ['refs/heads/-x', REF_OPTION],
    ['origin/--upload-pack=touch /tmp/pwned', REF_CHARS],
    ['HEAD~1', REF_CHARS],
    ['v1^{}', REF_CHARS],
    ['a:b', REF_CHARS],
    ['main\n--upload-pack=x', REF_CHARS],
    ['a*', REF_CHARS],
    ['a\\b', REF_CHARS],
    ['a..b', 'it must not contain ".."'],
    ['main@{1}', 'it must not contain "@{"'],
    ['@', 'it must not be "@"'],
    ['main.', 'it must not end with "."'],
    ['origin/', 'it must not begin or end with "/" or contain "//"'],
    ['a//b', 'it must not begin or end with "/" or contain "//"'],
    ['/main', 'it must not begin or end with "/" or contain "//"'],
    ['origin/.hidden', 'a "/"-separated part must not begin with "."'],
    ['refs/heads/x.lock', 'a "/"-separated part must not end with ".lock"'],
  ])('refuses git.ref %j', async (ref, reason) => {
    const { error, runner } = await fetchError([{ git: { url: 'https://example.com/r.git', ref } }]);
    expect(error).toBe(`Fetching (0): git.ref ${JSON.stringify(ref)} is not a valid git ref: ${reason}`);
    expect(runner.calls).toEqual([]);
  });

  const HOST_OPTION = 'its host must not begin with "-" (ssh would read it as an option)';
  const SHELL_HOST = 'its host must be a DNS name or an IP address (letters, digits, ".", "-", "_"; IPv6 in brackets)';
  it.each([
    ['--upload-pack=touch /tmp/pwned', OPTION_RULE],
    ['-oProxyCommand=sh', OPTION_RULE],
    ['ext::sh', 'remote helper transports ("<transport>::<address>") are not allowed'],
    ['fd::3', 'remote helper transports ("<transport>::<address>") are not allowed'],
    ['ssh://-oProxyCommand=sh/repo', HOST_OPTION],
    ['ssh://git@-oProxyCommand=sh/repo', HOST_OPTION],
    ['git@-oProxyCommand=sh:repo', HOST_OPTION],
    ['ssh://[-oProxyCommand=sh]/repo', HOST_OPTION],
    ['ssh://git@h$(touch$HOME)/repo', SHELL_HOST],
    ['git@a;sh:repo', SHELL_HOST],
    ['git://h`id`:9418/repo', SHELL_HOST],
    ['ssh://[::1;x]/repo', SHELL_HOST],
    // git takes a bracketed host after any "@[" (the path too) and percent-decodes a URL first:
    // each of these reaches ssh as the host `evil;id`, whatever the authority says.
    ['u@good.example:x@[evil;id]:path', SHELL_HOST],
    ['ssh://u@good.example/x@[evil;id]/path', SHELL_HOST],
    ['ssh://good.example/x%40%5Bevil%3Bid%5D/path', SHELL_HOST],
    ['git+ssh://good.example/x@[evil$(id)]/path', SHELL_HOST],
    ['git://good.example/x@[evil]/path', SHELL_HOST],
    [':x@[evil;id]:path', SHELL_HOST],
    // ... or a clean host other than the one the URL policy checks.
    [
      'u@good.example:x@[127.0.0.1]:path',
      'git would connect to "127.0.0.1", not to the host it names ("good.example")',
    ],
    [
      'ssh://good.example/x@[169.254.169.254]/p',
      'git would connect to "169.254.169.254", not to the host it names ("good.example")',
    ],
    ['a@b@c:path', 'git would connect to "c", not to the host it names ("b@c")'],
    ['https://example.com/r.git\n--upload-pack=sh', 'it must not contain control characters or whitespace'],
    ['https://example.com/r .git', 'it must not contain control characters or whitespace'],
  ])('refuses git.url %j', async (url, reason) => {
    const { error, runner } = await fetchError([{ git: { url, ref: 'origin/main' } }]);
    expect(error).toBe(`Fetching (0): git.url ${JSON.stringify(url)} is not a valid git URL: ${reason}`);
    expect(runner.calls).toEqual([]);
  });

  it.each([
    [
      { name: '--post-renderer=sh' },
      'helmChart.name',
      'chart name',
      'a "/"-separated part must not begin with "-" (helm would read it as an option)',
    ],
    [
      { name: 'stable/--devel' },
      'helmChart.name',
      'chart name',
      'a "/"-separated part must not begin with "-" (helm would read it as an option)',
    ],
    [{ name: 'a b' }, 'helmChart.name', 'chart name', 'it must not contain control characters or whitespace'],
    [{ name: 'c', version: '--devel' }, 'helmChart.version', 'chart version', OPTION_RULE],
    [{ name: 'c', version: '1.0\n' }, 'helmChart.version', 'chart version', 'it must not contain control characters'],
    [
      { name: 'c', repository: { url: '--insecure-skip-tls-verify' } },
      'helmChart.repository.url',
      'repository URL',
      OPTION_RULE,
    ],
    [
      { name: 'c', repository: { url: 'oci://--password-stdin' } },
      'helmChart.repository.url',
      'repository URL',
      'the part after "oci://" must not begin with "-" (helm would read it as an option)',
    ],
  ] as const)('refuses helmChart %j', async (helmChart, field, what, reason) => {
    const { error, runner } = await fetchError([{ inline: { paths: { 'a.yml': 'a' } } }, { helmChart }]);
    const value =
      field === 'helmChart.name'
        ? helmChart.name
        : field === 'helmChart.version'
          ? (helmChart as { version: string }).version
          : (helmChart as { repository: { url: string } }).repository.url;
    expect(error).toBe(`Fetching (1): ${field} ${JSON.stringify(value)} is not a valid ${what}: ${reason}`);
    expect(runner.calls).toEqual([]);
  });

  describe('allowed values reach vendir', () => {
    let tmp: string | undefined;
    afterEach(async () => {
      if (tmp) await rm(tmp, { recursive: true, force: true });
      tmp = undefined;
    });

    it.each([
      ['https://github.com/org/repo.git', 'origin/main'],
      ['git@github.com:org/repo.git', 'origin/feature/x-y'],
      ['ssh://git@host:2222/repo', 'v1.2.3'],
      ['ssh://git@[::1]:2222/repo', 'v1.2.3'],
      ['git://git.example.org:9418/repo', 'origin/main'],
      ['file:///srv/repo', 'refs/tags/v1.0.0'],
      ['https://h/r', 'a'.repeat(40)],
      ['https://h/r', '1a2b3c4'],
      ['https://h/r', 'HEAD'],
    ])('git %s at %s', async (url, ref) => {
      tmp = await mkdtemp(path.join(tmpdir(), 'argv-'));
      const runner = new FakeCommandRunner({ fallback: {} });
      const r = await fetchWithVendir(
        app([{ git: { url, ref } }]),
        deps(runner, tmp),
        kube,
        undefined,
        secretMaskOf(deps(runner, tmp)),
        new AbortController().signal,
      );
      expect(r.result.error).toBeUndefined();
      expect(runner.calls).toHaveLength(1);
      expect(runner.calls[0]!.cmd).toBe('vendir');
      expect(runner.calls[0]!.stdin).toContain(`ref: ${ref}`);
    });
  });
});
