/**
 * The Lambda functions as they ship, on this machine: each function's esbuild bundle (the
 * project's one recipe, `layers/bundle.ts`) as its own bootstrap under the AWS Lambda Runtime
 * Interface Emulator (`aws-lambda-rie`, built by `npm run setup`), with its layer laid out as
 * `layers/build.ts` lays it (its tools and the launcher flat in `<layer>/bin`).
 *
 * With `isolate`, the emulator runs in a private mount namespace (`unshare`, root) in which the
 * host's tool directories (`/usr/bin`, `/usr/local/bin`, `/usr/sbin`) are empty
 * (`lambda-sandbox.ts`) and node is where Lambda's Node runtime keeps it
 * (`<root>/var/lang/bin/node`): a function finds only its own layer's tools, so one that would
 * need a host tool (git for vendir, kubectl) fails here as it would on Lambda. Directories of
 * credentials a function must not hold (an admin kubeconfig, other functions' tokens) can be
 * hidden the same way.
 *
 * @module
 */
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { mkdir, stat, symlink, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { type KappEvent, objectRefOf, orderingKey, serializeEvent } from '../../events/schema.js';
import { PIPELINE_STAGES, type PipelineStage, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { parseLambdaEnv } from '../../functions/lib/entry/config.js';
import type { SqsRecord } from '../../functions/lib/entry/handler.js';
import {
  type AwsClients,
  artifactKeyringFromEnv,
  createLambdaDeps,
  type LambdaDepsOverrides,
} from '../../functions/lib/entry/lambda.js';
import { createSecretsManagerClient } from '../../functions/lib/entry/secrets-client.js';
import type { EntryDeps } from '../../functions/lib/entry/stage-handler.js';
import { layerTools, layerToolVersions } from '../../layers/build.js';
import { bundleEntry, runtimeNodePath } from '../../layers/bundle.js';
import { addGitToLayer, GIT_LAYER_STAGES } from '../../layers/git.js';
import { binPath } from '../../layers/gobuild.js';
import { component } from '../../layers/manifest.js';
import { buildConnector, CONNECTOR_NAME, hardenAddonPath, LAUNCHER_NAME, launcherPath } from '../../layers/native.js';
import { freePort, httpAnswers, LOOPBACK, type ServerProcess, startProcess, withFreePort } from './servers/process.js';
import type { S3Info } from './servers/s3.js';

/** Path of the emulator binary (`npm run setup` builds it). */
export const rieBin = (): string => binPath(component('aws-lambda-rie'), 'aws-lambda-rie');

/** Host directories a sandboxed function does not see (Lambda's image has none of their tools). */
export const HIDDEN_HOST_DIRS = ['/usr/local/bin', '/usr/bin', '/usr/sbin'] as const;

/** A function's layer laid out on disk. */
export interface FunctionLayer {
  /** `<root>/opt/<stage>/bin`: its tools and the launcher (`KAPP_LAMBDA_BIN_DIR`). */
  readonly binDir: string;
  /** The binaries in it (tools in manifest order, the launcher when there are tools, then git). */
  readonly bins: readonly string[];
  /** What the deployed layer weighs: its binaries plus the hardening addon, bytes. */
  readonly bytes: number;
}

/**
 * The deps factory of `stage`'s function run in the test's own process (`makeSqsHandler`), built
 * as its Lambda entry builds them: configuration and artifact keyring from `env` at once (a bad
 * environment throws here), `createLambdaDeps` with `overrides` on the handler's first call.
 */
export function inProcessDepsFactory(
  stage: PipelineStage,
  env: Record<string, string>,
  clients: AwsClients,
  overrides: LambdaDepsOverrides,
): () => EntryDeps {
  const config = parseLambdaEnv(stage, env);
  const keyring = artifactKeyringFromEnv(stage, env, createSecretsManagerClient(config));
  return () => createLambdaDeps(config, clients, { keyring, ...overrides });
}

/** Where a function run in the test's own process keeps its things ({@link inProcessFunctionEnv}). */
export interface InProcessFunction {
  /** The S3-compatible server holding the artifact bucket. */
  readonly s3: S3Info;
  /** Key prefix of the function's artifacts in the bucket (`KAPP_LAMBDA_BUCKET_PREFIX`). */
  readonly bucketPrefix: string;
  /** Kubeconfig of the clusters the function serves. */
  readonly kubeconfigPath: string;
  /** Its `/tmp` (`KAPP_LAMBDA_TMP_DIR`). */
  readonly tmpDir: string;
  /** Its layer's tools ({@link FunctionLayer.binDir}). */
  readonly binDir: string;
}

/**
 * The environment the stack gives `stage`'s function, for a test that runs the function's
 * handler in its own process (`createLambdaDeps`, `makeSqsHandler`) over the test servers: the
 * queue URLs are placeholders (an in-memory sender stands in for SQS), the artifact root key a
 * fixed test key in a file beside `tmpDir` (named `file://...`, as local setups do), the tool versions those of the stage's layer.
 */
export function inProcessFunctionEnv(stage: PipelineStage, f: InProcessFunction): Record<string, string> {
  const rootKeyFile = path.join(path.dirname(f.tmpDir), 'artifact-root.key');
  mkdirSync(path.dirname(rootKeyFile), { recursive: true });
  writeFileSync(rootKeyFile, Buffer.alloc(32, 9).toString('base64'), { mode: 0o600 });
  return {
    AWS_REGION: f.s3.region,
    KAPP_LAMBDA_BUCKET: f.s3.bucket ?? 'kapp-lambda',
    KAPP_LAMBDA_BUCKET_PREFIX: f.bucketPrefix,
    KAPP_LAMBDA_S3_ENDPOINT: f.s3.endpoint,
    ...Object.fromEntries(PIPELINE_STAGES.map((s) => [queueUrlEnv(s), `http://127.0.0.1:9/000000000000/${s}.fifo`])),
    KAPP_LAMBDA_KUBECONFIG: f.kubeconfigPath,
    KAPP_LAMBDA_TMP_DIR: f.tmpDir,
    KAPP_LAMBDA_BIN_DIR: f.binDir,
    KAPP_LAMBDA_HARDEN_ADDON: hardenAddonPath(),
    KAPP_LAMBDA_TOOL_VERSIONS: JSON.stringify(layerToolVersions(stage)),
    // The root key as a file secret (the stack names a Secrets Manager secret instead).
    KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: `file://${rootKeyFile}`,
  };
}

/**
 * `event` as its function's FIFO queue delivers it the first time: the body, its object as the
 * message group, receive count 1.
 */
export function firstReceive(event: KappEvent, messageId: string): SqsRecord {
  const ref = objectRefOf(event);
  return {
    messageId,
    body: serializeEvent(event),
    attributes: {
      MessageGroupId: orderingKey(ref),
      ApproximateReceiveCount: '1',
    },
  };
}

/**
 * Lays out `stage`'s layer under `root` as `layers/build.ts` does (symlinks to the cached tool
 * builds; the launcher only for a function with tools; git, copied with its libraries, and the
 * egress connector for the functions that ship git, `layers/git.ts`) and measures it.
 */
export async function functionLayer(root: string, stage: PipelineStage): Promise<FunctionLayer> {
  const binDir = path.join(root, 'opt', stage, 'bin');
  await mkdir(binDir, { recursive: true });
  const bins: string[] = [];
  let bytes = (await stat(hardenAddonPath())).size;
  const tools = layerTools(stage).map(({ component: c, bin }) => ({ bin, src: binPath(c, bin) }));
  if (tools.length > 0) tools.push({ bin: LAUNCHER_NAME, src: launcherPath() });
  for (const { bin, src } of tools) {
    await symlink(src, path.join(binDir, bin));
    bytes += (await stat(src)).size;
    bins.push(bin);
  }
  if (GIT_LAYER_STAGES.includes(stage)) {
    bytes += (await addGitToLayer(path.dirname(binDir), () => {})).bytes;
    bins.push('git');
    const connector = buildConnector(() => {});
    for (const name of [CONNECTOR_NAME, 'ssh']) {
      await symlink(connector, path.join(binDir, name));
      bytes += (await stat(connector)).size;
    }
  }
  return { binDir, bins, bytes };
}

/** A running emulator serving one function. */
export interface Rie {
  readonly proc: ServerProcess;
  /** RIE's invoke endpoint (`POST` an event). */
  readonly invokeUrl: string;
}

/** Options of {@link startRie}. */
export interface RieOptions {
  /** The function's bundle (`node <bundle>` is the bootstrap). */
  readonly bundle: string;
  /** The function's environment (RIE passes its whole environment on: nothing else is given). */
  readonly env: Record<string, string>;
  /** Working directory and `HOME`. */
  readonly cwd: string;
  /** Lambda's time limit of one invocation, seconds (`AWS_LAMBDA_FUNCTION_TIMEOUT`; default 120). */
  readonly timeoutSeconds?: number;
  /** Memory size reported to the function, MiB (`AWS_LAMBDA_FUNCTION_MEMORY_SIZE`). */
  readonly memoryMiB?: number;
  /**
   * Hide {@link HIDDEN_HOST_DIRS} (see the module comment); `bundles` is where the sandbox
   * program's own bundle is written. Default: the host's directories stay visible.
   */
  readonly isolate?: {
    readonly bundles: string;
    /**
     * More directories the function must not see (absolute, existing), e.g. the control
     * plane's work directory with its admin kubeconfig, or other functions' credentials: what
     * a Lambda sandbox would not hold either. Default none.
     */
    readonly hide?: readonly string[];
  };
}

const SANDBOX_ENTRY = fileURLToPath(new URL('./lambda-sandbox.ts', import.meta.url));

/** Bundles `lambda-sandbox.ts` into `dir` once; returns its path. */
async function sandboxProgram(dir: string): Promise<string> {
  const out = path.join(dir, 'lambda-sandbox.mjs');
  if (!existsSync(out)) await bundleEntry(SANDBOX_ENTRY, out);
  return out;
}

/**
 * Starts RIE on two loopback ports (invoke API and Runtime API) with `node <bundle>` as the
 * bootstrap, and waits until the invoke API answers. The function initializes on the first
 * invoke (its cold start), as on Lambda.
 * @throws Error when the emulator is not built (`npm run setup`) or does not start (on three pairs of ports).
 */
export async function startRie(opts: RieOptions): Promise<Rie> {
  const rie = rieBin();
  if (!existsSync(rie)) throw new Error(`aws-lambda-rie is not built at ${rie}: run npm run setup`);
  let node = process.execPath;
  let prefix: string[] = [];
  const pathDirs = ['/usr/local/bin', '/usr/bin', '/bin'];
  if (opts.isolate) {
    const langBin = path.join(opts.cwd, 'var', 'lang', 'bin');
    await mkdir(langBin, { recursive: true });
    node = path.join(langBin, 'node');
    if (!existsSync(node)) await writeFile(node, '');
    const hide = [...HIDDEN_HOST_DIRS.filter((d) => existsSync(d)), ...(opts.isolate.hide ?? [])].flatMap((d) => [
      '--hide',
      d,
    ]);
    // Lambda's image has a /bin/sh (git's submodule script needs one); here /bin is /usr/bin.
    const keep = existsSync('/usr/bin/sh') ? ['--keep', '/usr/bin/sh'] : [];
    prefix = [
      'unshare',
      '--mount',
      '--propagation',
      'private',
      process.execPath,
      await sandboxProgram(opts.isolate.bundles),
      '--bind',
      process.execPath,
      node,
      ...hide,
      ...keep,
      '--',
    ];
    pathDirs.unshift(langBin);
  }
  // Both ports are picked before RIE binds them: one taken meanwhile (another file's server,
  // under load) makes RIE exit before it is ready, and the start is tried again on new ports.
  return await withFreePort(async (invokePort) => {
    const apiPort = await freePort();
    const argv = [
      ...prefix,
      rie,
      '--runtime-interface-emulator-address',
      `${LOOPBACK}:${invokePort}`,
      '--runtime-api-address',
      `${LOOPBACK}:${apiPort}`,
      node,
      opts.bundle,
    ];
    const proc = await startProcess('aws-lambda-rie', argv, {
      cwd: opts.cwd,
      env: {
        PATH: pathDirs.join(':'),
        HOME: opts.cwd,
        // The AWS SDK, which the function bundles leave to the runtime: Lambda's Node runtime has
        // it on NODE_PATH (/var/runtime/node_modules); here the project's own node_modules.
        NODE_PATH: runtimeNodePath(),
        AWS_LAMBDA_FUNCTION_TIMEOUT: String(opts.timeoutSeconds ?? 120),
        ...(opts.memoryMiB ? { AWS_LAMBDA_FUNCTION_MEMORY_SIZE: String(opts.memoryMiB) } : {}),
        ...opts.env,
      },
      ready: () => httpAnswers(`http://${LOOPBACK}:${invokePort}/`),
    });
    return { proc, invokeUrl: `http://${LOOPBACK}:${invokePort}/2015-03-31/functions/function/invocations` };
  });
}

/**
 * Starts `count` instances of one function, each its own emulator (its own RIE process, ports
 * and runtime process), as Lambda runs a function's concurrent invocations in separate
 * execution environments: an instance serves one invocation at a time, so a poller with
 * `maxConcurrency` n needs n of them (`sqs-poller.ts`). Instance `i` works in `<cwd>/<i>` (its
 * `HOME`), and its environment is `env` with `instanceEnv(i)` over it: give each its own
 * `KAPP_LAMBDA_TMP_DIR`, as each environment on Lambda has its own `/tmp`. Each starts cold.
 * What an instance weighs, idle after its cold start (the fetch bundle, an empty batch): RSS
 * about 67 MiB (the emulator 11, the function's Node runtime 56) and 108 MiB with `isolate`
 * (the sandbox's own Node process 42 more); the share of pages not shared with other Node
 * processes (PSS) about 37 MiB isolated. A running stage adds its tools' processes.
 * @throws RangeError when `count` is not a positive integer; the error of the first instance
 *   that did not start ({@link startRie}), after stopping the others.
 */
export async function startRieInstances(
  opts: RieOptions,
  count: number,
  instanceEnv: (index: number) => Record<string, string> = () => ({}),
): Promise<Rie[]> {
  if (!Number.isInteger(count) || count < 1) throw new RangeError(`instance count ${count}: needs a positive integer`);
  const started = await Promise.allSettled(
    Array.from({ length: count }, async (_, i) => {
      const cwd = path.join(opts.cwd, String(i));
      await mkdir(cwd, { recursive: true });
      return await startRie({ ...opts, cwd, env: { ...opts.env, ...instanceEnv(i) } });
    }),
  );
  const failed = started.find((r) => r.status === 'rejected');
  const ries = started.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  if (failed) {
    await Promise.allSettled(ries.map((r) => r.proc.stop()));
    throw failed.reason;
  }
  return ries;
}

/** What one invoke returned. */
export interface InvokeResult {
  /** HTTP status of RIE's answer (200 also for a function error; 502 for a failed init). */
  readonly status: number;
  /** The answer, parsed when it is JSON. */
  readonly body: unknown;
  /** Round trip, ms. */
  readonly ms: number;
}

/**
 * Invokes the function once with `payload` (RIE runs one invocation at a time).
 * @throws Error when RIE does not answer (e.g. the emulator is gone).
 */
export async function invokeRie(rie: Rie, payload: unknown): Promise<InvokeResult> {
  const t0 = performance.now();
  const res = await fetch(rie.invokeUrl, { method: 'POST', body: JSON.stringify(payload) });
  const text = await res.text();
  const ms = performance.now() - t0;
  let body: unknown = text;
  try {
    body = JSON.parse(text);
  } catch {
    // not JSON: keep the text
  }
  return { status: res.status, body, ms };
}

/** The function's JSON log lines (pino) among RIE's output (the last 64 KiB). */
export function rieLogLines(rie: Rie): Record<string, unknown>[] {
  return rie.proc
    .output()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .flatMap((l) => {
      try {
        return [JSON.parse(l) as Record<string, unknown>];
      } catch {
        return [];
      }
    });
}

/** argv of a live process, `undefined` when it is gone. */
function argvOf(pid: number | string): string[] | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
  } catch {
    return undefined;
  }
}

/** Whether `argv` is a function runtime of `bundle` (`<node> <bundle>`). */
const isRuntimeOf = (argv: string[] | undefined, bundle: string) =>
  argv?.length === 2 && path.basename(argv[0] ?? '') === 'node' && argv[1] === bundle;

/**
 * The pid of the function's runtime process under an emulator (argv `<node> <bundle>`), found
 * through /proc; `undefined` while none runs (before its first invoke, after a crash). With
 * several instances of the function, any one of them.
 */
export function runtimePid(bundle: string): number | undefined {
  for (const pid of readdirSync('/proc')) {
    if (/^\d+$/.test(pid) && isRuntimeOf(argvOf(pid), bundle)) return Number(pid);
  }
  return undefined;
}

/**
 * The pid of the runtime of `bundle` that process `pid` (a tool a stage runs) descends from: the
 * instance running that stage, among several (`startRieInstances`). `undefined` when `pid` is
 * gone or runs under no runtime of `bundle`.
 */
export function runtimePidOf(bundle: string, pid: number): number | undefined {
  let at = pid;
  for (let depth = 0; depth < 16 && at > 1; depth++) {
    if (isRuntimeOf(argvOf(at), bundle)) return at;
    let stat: string;
    try {
      stat = readFileSync(`/proc/${at}/stat`, 'utf8');
    } catch {
      return undefined;
    }
    // `<pid> (<comm>) <state> <ppid> …`: comm may hold spaces, so read after its last ')'.
    at = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1]);
  }
  return undefined;
}
