/**
 * Scenario 6, bundles: each Lambda function (`functions/<stage>/index.ts`) bundled by esbuild
 * by `layers/bundle.ts` exactly as `layers/build.ts` does (bundle, minify, ESM, node20, `require`
 * shim), its size in bytes, and two start-up figures, each the median of `runs` fresh `node`
 * processes (`bench/cold-start.mjs`) timed by the parent from spawn to the handler's return:
 *
 * - `init`, every function: the handler called with an empty SQS batch. The function's ports are
 *   built but nothing is contacted, so the AWS SDK never loads: the figure this scenario gave
 *   as `coldStart` until issue 24, which flattered a cold start by the SDK's load.
 * - `firstInvocation`, the fetch function (the one that takes the forwarder's App events): the
 *   handler called with one real SQS record, the `object` event (reason `added`) a forwarder
 *   sends for a freshly created App, its `MessageGroupId` the event's ordering key. The child
 *   reads the App from the benchmark's control plane, writes its status, reads and writes the
 *   store (an S3-compatible server, versitygw) and sends the template event to a FIFO queue
 *   (moto's SQS server): the SDK loads on its first command, as on Lambda. Every sample is a new
 *   App (a new uid and resourceVersion) with the same inline source, so each does the same work:
 *   an inline source is never pinned (`functions/lib/fetch/pinned.ts`), so vendir runs once per
 *   sample; its time (the stage-run log line's `tools.ms`) is taken off in `outsideTools`, the
 *   function's own share. Beside it, `sdkLoad`: a fresh process that only loads the S3 and SQS
 *   clients.
 *
 * @module
 */
import { spawn } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { stringify } from 'yaml';
import { objectEvent } from '../../events/schema.js';
import { pinnedToolVersions } from '../../functions/embedded/runtime.js';
import { PIPELINE_STAGES, type PipelineStage, queueUrlEnv } from '../../functions/lib/api/functions.js';
import { bundleFunction, runtimeNodePath } from '../../layers/bundle.js';
import { hardenAddonPath } from '../../layers/native.js';
import { firstReceive, functionLayer } from '../../test/harness/lambda.js';
import { createFifoQueue, startS3Server, startSqsServer } from '../../test/harness/servers.js';
import { type BenchContext, clusterOf, contextOf, scratchDir } from '../lib/context.js';
import { collectionPath, createTenants, inlineApp } from '../lib/kube.js';
import { type Summary, summarize } from '../lib/stats.js';

/** A real first invocation's figures (medians of the counted processes unless said). */
export interface FirstInvocationFigures {
  /** What the handler got: one SQS record holding this event. */
  event: string;
  /** Parent-measured spawn → handler returned, ms. */
  wall: Summary;
  /** Child-side: process start → bundle imported, ms. */
  importMs: number;
  /** Child-side: process start → handler returned, ms. */
  calledMs: number;
  /** The stage-run log line's `durationMs`: the stage's own timer, ms. */
  stageMs: number;
  /** Tool processes started, the most in any counted sample (vendir: an inline source is never pinned). */
  toolRuns: number;
  /** The stage-run log line's time inside tools (`tools.ms`: spawn → exit of each), ms. */
  toolMs: number;
  /** Spawn → handler returned less the sample's own time inside tools: the function's own cold start, ms. */
  outsideTools: Summary;
  /** The stage-run outcomes seen, e.g. `['cached']`. */
  outcomes: string[];
  /** A fresh `node` that only loads the S3 and SQS clients from `NODE_PATH`: process start → loaded, ms. */
  sdkLoad: Summary;
}

/** One function's figures. */
export interface BundleFigures {
  stage: string;
  bytes: number;
  /** Parent-measured spawn → handler returned on an empty SQS batch (no SDK load), ms. */
  init: Summary;
  /** Child-side: process start → bundle imported, ms (median of the `init` processes). */
  importMs: number;
  /** Child-side: process start → empty-batch call returned, ms (median). */
  initCallMs: number;
  /** The real first invocation, for the functions that take the forwarder's events (fetch). */
  firstInvocation?: FirstInvocationFigures;
}

/** Every Lambda function. */
const STAGES = PIPELINE_STAGES;

/** What one child process reported: its `coldStart` line and the function's log lines. */
interface ChildRun {
  wallMs: number;
  importMs: number;
  calledMs: number;
  sdkMs: number;
  failures: number;
  logs: Record<string, unknown>[];
}

/** Runs one child (`cold-start.mjs <args>`); the wall time stops at its `coldStart` line. */
function once(args: readonly string[], env: NodeJS.ProcessEnv, script: string): Promise<ChildRun> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    // BENCH_CPU_PROF_DIR: a V8 CPU profile of every child there (for finding what a cold start spends).
    const prof = process.env.BENCH_CPU_PROF_DIR
      ? ['--cpu-prof', `--cpu-prof-dir=${process.env.BENCH_CPU_PROF_DIR}`]
      : [];
    const child = spawn(process.execPath, [...prof, script, ...args], { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    let wallMs = 0;
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (!wallMs && out.includes('{"coldStart":')) wallMs = performance.now() - t0;
    });
    child.stderr.on('data', (d: Buffer) => {
      err = (err + d.toString()).slice(-4000);
    });
    child.on('error', reject);
    child.on('close', (code) => {
      const lines = out
        .split('\n')
        .filter((l) => l.startsWith('{'))
        .map((l) => JSON.parse(l) as Record<string, unknown>);
      const mine = lines.find((l) => 'coldStart' in l)?.coldStart as Partial<ChildRun> | undefined;
      if (code !== 0 || !wallMs || !mine) {
        reject(
          new Error(`cold start ${args.join(' ').slice(0, 200)} exited ${code}: ${err.trim() || out.slice(-2000)}`),
        );
        return;
      }
      resolve({
        wallMs,
        importMs: mine.importMs ?? 0,
        calledMs: mine.calledMs ?? 0,
        sdkMs: mine.sdkMs ?? 0,
        failures: mine.failures ?? 0,
        logs: lines.filter((l) => !('coldStart' in l)),
      });
    });
  });
}

const median = (xs: readonly number[]) => summarize(xs).median;

/** The servers and objects a real first invocation of the fetch function talks to. */
interface Backends {
  /** Environment of the functions' processes: the servers, queues, cluster and layer. */
  env: NodeJS.ProcessEnv;
  /** A fresh App (same inline source every time), and the SQS event (JSON) of its `added` object event. */
  nextEvent: () => Promise<string>;
  stop: () => Promise<void>;
}

/**
 * Starts the S3 (versitygw) and SQS (moto) servers the e2e tests use, creates the bucket and
 * the five function queues, lays out the fetch function's layer (vendir, the launcher) and a
 * namespace on the benchmark's control plane.
 */
async function startBackends(ctx: BenchContext, dir: string, base: NodeJS.ProcessEnv): Promise<Backends> {
  const { cluster, rest } = clusterOf(ctx);
  const s3 = await startS3Server({ bucket: 'kapp-lambda-bench' });
  const sqs = await startSqsServer().catch(async (e: unknown) => {
    await s3.stop();
    throw e;
  });
  const stop = async () => {
    await Promise.allSettled([s3.stop(), sqs.stop()]);
  };
  try {
    const queues: Record<string, string> = {};
    for (const st of PIPELINE_STAGES) queues[queueUrlEnv(st)] = (await createFifoQueue(sqs, `bench-${st}`)).url;
    const layer = await functionLayer(path.join(dir, 'layer'), 'fetch');
    const ns = 'bench-cold-start';
    await createTenants(rest, [ns]);
    const clusterId = contextOf(cluster);
    let n = 0;
    const env: NodeJS.ProcessEnv = {
      ...base,
      ...queues,
      AWS_REGION: s3.region,
      AWS_ACCESS_KEY_ID: s3.accessKeyId,
      AWS_SECRET_ACCESS_KEY: s3.secretAccessKey,
      AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED: 'true',
      KAPP_LAMBDA_BUCKET: s3.bucket,
      KAPP_LAMBDA_S3_ENDPOINT: s3.endpoint,
      KAPP_LAMBDA_SQS_ENDPOINT: sqs.endpoint,
      // The benchmark's control plane, its context named by the cluster id (no sender check:
      // none is configured, as in local setups).
      KAPP_LAMBDA_KUBECONFIG: cluster.kubeconfigPath,
      KAPP_LAMBDA_BIN_DIR: layer.binDir,
      // The stage-run line (info) says how many tools ran; a deployed function logs at info too.
      KAPP_LAMBDA_LOG_LEVEL: 'info',
    };
    const nextEvent = async () => {
      n += 1;
      const app = inlineApp(ns, `cold-${n}`, 'cold start');
      const created = await rest.send({ method: 'POST', path: collectionPath('App', ns), body: app });
      const meta = (created.body as { metadata?: { uid?: string; resourceVersion?: string; generation?: number } })
        ?.metadata;
      if (created.statusCode !== 201 || !meta?.uid || !meta.resourceVersion) {
        throw new Error(`create App ${ns}/cold-${n}: ${created.statusCode}`);
      }
      const ev = objectEvent(
        {
          clusterId,
          kind: 'App',
          apiVersion: app.apiVersion as string,
          namespace: ns,
          name: app.metadata.name,
          uid: meta.uid,
          generation: meta.generation ?? 1,
          resourceVersion: meta.resourceVersion,
        },
        'added',
        { time: new Date() },
      );
      // What the fetch queue delivers: body = serializeEvent, MessageGroupId = orderingKey.
      return JSON.stringify({ Records: [firstReceive(ev, `cold-${n}`)] });
    };
    return { env, nextEvent, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

/** `runs` real first invocations of `stage` (each a fresh process and a fresh App), after one warm-up. */
async function firstInvocations(
  stage: PipelineStage,
  bundle: string,
  backends: Backends,
  dir: string,
  script: string,
  runs: number,
): Promise<FirstInvocationFigures> {
  let k = 0;
  const invoke = async () => {
    const event = await backends.nextEvent();
    // A fresh /tmp per process, as a new Lambda sandbox has.
    const tmp = path.join(dir, `tmp-${stage}-${k++}`);
    await mkdir(tmp, { recursive: true });
    const r = await once([pathToFileURL(bundle).href, event], { ...backends.env, KAPP_LAMBDA_TMP_DIR: tmp }, script);
    const run = r.logs.find((l) => l.msg === 'stage run' && l.stage === stage);
    if (r.failures !== 0 || !run) {
      const errs = r.logs.filter((l) => Number(l.level) >= 40).map((l) => `${l.msg} ${l.err ?? l.error ?? ''}`);
      throw new Error(
        `${stage} first invocation: ${r.failures} failures, stage run ${JSON.stringify(run)}; ${errs.join('; ')}`,
      );
    }
    return { ...r, run };
  };
  const sdk = () => once(['--sdk'], backends.env, script);
  await invoke(); // page cache warm-up: not counted
  await sdk();
  const samples: Awaited<ReturnType<typeof invoke>>[] = [];
  const sdkSamples: ChildRun[] = [];
  for (let i = 0; i < runs; i++) {
    samples.push(await invoke());
    sdkSamples.push(await sdk());
  }
  return {
    event: 'one `dev.kapp-lambda.object.v1` event, reason `added`, of a new inline-source App',
    wall: summarize(samples.map((s) => s.wallMs)),
    importMs: median(samples.map((s) => s.importMs)),
    calledMs: median(samples.map((s) => s.calledMs)),
    stageMs: median(samples.map((s) => Number(s.run.durationMs ?? 0))),
    toolRuns: Math.max(...samples.map((s) => toolsOf(s.run).runs)),
    toolMs: median(samples.map((s) => toolsOf(s.run).ms)),
    outsideTools: summarize(samples.map((s) => s.wallMs - toolsOf(s.run).ms)),
    outcomes: [...new Set(samples.map((s) => String(s.run.outcome)))],
    sdkLoad: summarize(sdkSamples.map((s) => s.sdkMs)),
  };
}

/** The stage-run log line's `tools` (runs and ms inside them; zero when absent). */
function toolsOf(run: Record<string, unknown>): { runs: number; ms: number } {
  const t = run.tools as { runs?: number; ms?: number } | undefined;
  return { runs: Number(t?.runs ?? 0), ms: Number(t?.ms ?? 0) };
}

/** The functions whose first invocation is measured with a real record. */
const REAL_FIRST_INVOCATION: readonly PipelineStage[] = ['fetch'];

/**
 * Builds every function bundle (`PIPELINE_STAGES`) and measures size, `init` and, for the fetch
 * function, a real first invocation.
 * @throws Error when a bundle does not build, a server does not start or a cold start fails.
 */
export async function bundles(ctx: BenchContext, runs = 7): Promise<BundleFigures[]> {
  const dir = await scratchDir(ctx, 'bundles');
  const kubeconfig = path.join(dir, 'kubeconfig.yaml');
  await writeFile(
    kubeconfig,
    stringify({
      apiVersion: 'v1',
      kind: 'Config',
      clusters: [{ name: 'c', cluster: { server: 'https://127.0.0.1:9' } }],
      users: [{ name: 'u', user: { token: 'not-a-token' } }],
      contexts: [{ name: 'fleet-1', context: { cluster: 'c', user: 'u' } }],
      'current-context': 'fleet-1',
    }),
    { mode: 0o600 },
  );
  const rootKey = path.join(dir, 'artifact-root-key');
  await writeFile(rootKey, Buffer.alloc(32, 6).toString('base64'), { mode: 0o600 });
  const env: NodeJS.ProcessEnv = {
    PATH: process.env.PATH,
    AWS_REGION: 'us-east-1',
    AWS_ACCESS_KEY_ID: 'bench',
    AWS_SECRET_ACCESS_KEY: 'bench',
    KAPP_LAMBDA_BUCKET: 'kapp-lambda-bench',
    KAPP_LAMBDA_QUEUE_URL_FETCH: 'http://127.0.0.1:9/000000000000/fetch.fifo',
    KAPP_LAMBDA_QUEUE_URL_TEMPLATE: 'http://127.0.0.1:9/000000000000/template.fifo',
    KAPP_LAMBDA_QUEUE_URL_DEPLOY: 'http://127.0.0.1:9/000000000000/deploy.fifo',
    KAPP_LAMBDA_QUEUE_URL_INSTALL: 'http://127.0.0.1:9/000000000000/install.fifo',
    KAPP_LAMBDA_QUEUE_URL_INDEX_REPO: 'http://127.0.0.1:9/000000000000/index-repo.fifo',
    KAPP_LAMBDA_KUBECONFIG: kubeconfig,
    KAPP_LAMBDA_TMP_DIR: dir,
    KAPP_LAMBDA_TOOL_VERSIONS: JSON.stringify(pinnedToolVersions()),
    KAPP_LAMBDA_LOG_LEVEL: 'warn',
    // Loaded at init as on Lambda (the layer's `/opt/lib` copy there); built by `npm run setup`.
    KAPP_LAMBDA_HARDEN_ADDON: hardenAddonPath(),
    // Where the fixed bench-only root key is (the functions with the artifact store do not start
    // without one; deployed, a Secrets Manager secret, read on first use, not at cold start).
    KAPP_LAMBDA_ARTIFACT_ROOT_KEY_SECRET: pathToFileURL(rootKey).href,
    // The AWS SDK the Lambda runtime provides (not in the bundles), as its NODE_PATH gives it.
    NODE_PATH: runtimeNodePath(),
  };
  const script = path.join(import.meta.dirname, '..', 'cold-start.mjs');
  const backends = await startBackends(ctx, dir, env);
  const out: BundleFigures[] = [];
  try {
    for (const stage of STAGES) {
      const outfile = path.join(dir, stage, 'index.mjs');
      const bytes = await bundleFunction(stage, outfile);
      const emptyBatch = [pathToFileURL(outfile).href];
      await once(emptyBatch, env, script); // page cache warm-up, not counted
      const samples: ChildRun[] = [];
      for (let i = 0; i < runs; i++) samples.push(await once(emptyBatch, env, script));
      const f: BundleFigures = {
        stage,
        bytes,
        init: summarize(samples.map((s) => s.wallMs)),
        importMs: median(samples.map((s) => s.importMs)),
        initCallMs: median(samples.map((s) => s.calledMs)),
      };
      ctx.say(
        `bundles: ${stage} ${(bytes / 1024).toFixed(0)} KiB, init (empty batch) ${f.init.median.toFixed(0)} ms (import ${f.importMs.toFixed(0)} ms, call ${f.initCallMs.toFixed(0)} ms after process start)`,
      );
      if (REAL_FIRST_INVOCATION.includes(stage)) {
        const first = await firstInvocations(stage, outfile, backends, dir, script, runs);
        f.firstInvocation = first;
        ctx.say(
          `bundles: ${stage} first invocation ${first.wall.median.toFixed(0)} ms (import ${first.importMs.toFixed(0)} ms, returned ${first.calledMs.toFixed(0)} ms after process start, stage ${first.stageMs} ms, ${first.toolRuns} tool run(s) ${first.toolMs.toFixed(0)} ms, outside tools ${first.outsideTools.median.toFixed(0)} ms, ${first.outcomes.join('/')}); SDK alone ${first.sdkLoad.median.toFixed(0)} ms`,
        );
      }
      out.push(f);
    }
  } finally {
    await backends.stop();
  }
  return out;
}
