/**
 * Scenario 6, bundles: each Lambda function (`functions/<stage>/index.ts`) bundled by esbuild
 * by `layers/bundle.ts` exactly as `layers/build.ts` does (bundle, minify, ESM, node20, `require`
 * shim), its size in
 * bytes, and its cold start: the time from spawning a fresh `node` process (which imports the
 * bundle and calls the handler once with an empty SQS batch, `bench/cold-start.mjs`) to that
 * first call returning, measured by the parent; median of `runs` processes per function.
 * The process gets the environment a deployed function has (region, bucket, queue URLs,
 * kubeconfig path, tool versions); nothing is contacted.
 *
 * @module
 */
import { spawn } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { stringify } from 'yaml';
import { pinnedToolVersions } from '../../functions/embedded/runtime.js';
import { PIPELINE_STAGES } from '../../functions/lib/api/functions.js';
import { bundleFunction, runtimeNodePath } from '../../layers/bundle.js';
import { hardenAddonPath } from '../../layers/native.js';
import { type BenchContext, scratchDir } from '../lib/context.js';
import { type Summary, summarize } from '../lib/stats.js';

/** One function's figures. */
export interface BundleFigures {
  stage: string;
  bytes: number;
  /** Parent-measured spawn → first handler call returned, ms. */
  coldStart: Summary;
  /** Child-side: process start → bundle imported, ms (median). */
  importMs: number;
  /** Child-side: process start → first call returned, ms (median). */
  firstCallMs: number;
}

/** Every Lambda function. */
const STAGES = PIPELINE_STAGES;

function once(
  bundle: string,
  env: NodeJS.ProcessEnv,
  script: string,
): Promise<{ wallMs: number; importMs: number; firstCallMs: number }> {
  return new Promise((resolve, reject) => {
    const t0 = performance.now();
    const child = spawn(process.execPath, [script, pathToFileURL(bundle).href], {
      env,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    let wallMs = 0;
    child.stdout.on('data', (d: Buffer) => {
      if (!wallMs && d.includes(10)) wallMs = performance.now() - t0;
      out += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => {
      err = (err + d.toString()).slice(-4000);
    });
    child.on('error', reject);
    child.on('close', (code) => {
      if (code !== 0 || !wallMs) {
        reject(new Error(`cold start of ${path.basename(bundle)} exited ${code}: ${err.trim()}`));
        return;
      }
      const j = JSON.parse(out.trim().split('\n')[0]!) as { importMs: number; firstCallMs: number };
      resolve({ wallMs, importMs: j.importMs, firstCallMs: j.firstCallMs });
    });
  });
}

/**
 * Builds every function bundle (`PIPELINE_STAGES`) and measures size and cold start.
 * @throws Error when a bundle does not build or a cold start fails.
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
  const out: BundleFigures[] = [];
  for (const stage of STAGES) {
    const outfile = path.join(dir, stage, 'index.mjs');
    const bytes = await bundleFunction(stage, outfile);
    await once(outfile, env, script); // page cache warm-up, not counted
    const samples: { wallMs: number; importMs: number; firstCallMs: number }[] = [];
    for (let i = 0; i < runs; i++) samples.push(await once(outfile, env, script));
    const f: BundleFigures = {
      stage,
      bytes,
      coldStart: summarize(samples.map((s) => s.wallMs)),
      importMs: summarize(samples.map((s) => s.importMs)).median,
      firstCallMs: summarize(samples.map((s) => s.firstCallMs)).median,
    };
    ctx.say(
      `bundles: ${stage} ${(bytes / 1024).toFixed(0)} KiB, cold start ${f.coldStart.median.toFixed(0)} ms (import ${f.importMs.toFixed(0)} ms, first call ${f.firstCallMs.toFixed(0)} ms after process start)`,
    );
    out.push(f);
  }
  return out;
}
