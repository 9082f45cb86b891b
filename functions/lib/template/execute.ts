/**
 * Runs a planned template (upstream `pkg/template/*.go` `TemplateDir`/`TemplateStream`, and
 * `sops.go` `Decrypt`): each tool step in order, piping a step's stdout into the next, and the
 * sops step decrypting `*.sops.y(a)ml` in place. The planners (`./plan.ts`, `./sops.ts`, ...)
 * decide the argv, files and environment; this module only writes those files and runs the
 * tools. The template stage (`../pipeline/app/template.ts`) decides when, with which inputs, and
 * what the result means for the App.
 *
 * @module
 */
import { chmod, mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { type CommandRunner, DEFAULT_MAX_OUTPUT_BYTES } from '../exec/runner.js';
import { attachError, errorMessage, resultFromError, type StageResult } from '../reconcile/result.js';
import { markTruncated } from '../reconcile/status-budget.js';
import { checkKustomizeTree } from './kustomize.js';
import { sopsDecryptCommand, sopsDecryptedPath, sopsDecryptFailureMessage, sopsInputError } from './sops.js';
import type { RunStep, SopsStep, TemplateStep } from './step.js';
import type { PlannedFile } from './values.js';

/** What running template steps uses of the stage's dependencies (a `PipelineDeps` fits). */
export interface TemplateRunDeps {
  /** The one command runner (allow-listed tools). */
  runner: CommandRunner;
  config: {
    /** Kill a tool after this long, ms. Default: the runner's default. */
    toolTimeoutMs?: number;
    /** Bound of each tool's stdout, bytes. Default `DEFAULT_MAX_OUTPUT_BYTES` (64 MiB). */
    maxTemplateOutputBytes?: number;
  };
}

/** The result of {@link runTemplateSteps}. */
export interface TemplateRun {
  /** The run's result (`stdout` is always empty: the manifest is {@link TemplateRun.manifest}). */
  result: StageResult;
  /** The last step's stdout on success; `''` after a failure. */
  manifest: string;
  /** Total tool time, ms. */
  ms: number;
  /** Number of tool processes started. */
  runs: number;
}

async function writePlanned(files: readonly PlannedFile[]): Promise<void> {
  for (const f of files) {
    await mkdir(path.dirname(f.path), { recursive: true });
    await writeFile(f.path, f.content, { mode: f.sensitive ? 0o600 : 0o644 });
  }
}

async function walkSops(target: string, out: string[]): Promise<void> {
  const st = await stat(target);
  if (!st.isDirectory()) {
    if (sopsDecryptedPath(target)) out.push(target);
    return;
  }
  for (const entry of (await readdir(target)).sort()) await walkSops(path.join(target, entry), out);
}

/** Runs one sops step: decrypt every `*.sops.y(a)ml` in place (upstream `pkg/template/sops.go`). */
async function runSops(
  step: SopsStep,
  deps: TemplateRunDeps,
  work: string,
  signal?: AbortSignal,
): Promise<{ result: StageResult; ms: number; runs: number }> {
  await writePlanned(step.files);
  const files: string[] = [];
  let ms = 0;
  let runs = 0;
  for (const target of step.targets) {
    try {
      await walkSops(target, files);
    } catch (err) {
      return { result: resultFromError(err, step.errorPrefix), ms, runs };
    }
  }
  for (const file of files) {
    // A file naming a remote master key (hc_vault, kms, ...) would make sops contact it; one
    // not in UTF-8 would hide that key from our reading but not from sops's.
    const refused = sopsInputError(await readFile(file));
    if (refused !== undefined) {
      return {
        result: resultFromError(new Error(`Decrypting file '${file}': ${refused}`), step.errorPrefix),
        ms,
        runs,
      };
    }
    const cmd = sopsDecryptCommand(step, file);
    const run = await deps.runner.run({
      cmd: cmd.bin,
      args: cmd.args,
      env: cmd.env,
      timeoutMs: deps.config.toolTimeoutMs,
      writable: [work],
      maxOutputBytes: templateOutputBound(deps),
      signal,
    });
    ms += run.durationMs;
    runs++;
    if (!run.error && run.truncated.stdout) {
      return {
        result: outputExceeded(step.errorPrefix, cmd.bin, templateOutputBound(deps)),
        ms,
        runs,
      };
    }
    if (run.error) {
      return {
        result: {
          stdout: '',
          stderr: run.stderr,
          exitCode: run.exitCode,
          error: sopsDecryptFailureMessage(file, run.stderr, run.error.message),
          finished: true,
        },
        ms,
        runs,
      };
    }
    const dest = sopsDecryptedPath(file)!;
    await writeFile(dest, run.stdout, { mode: 0o600 });
    await chmod(dest, 0o600);
    await rm(file);
  }
  return { result: { stdout: '', stderr: '', exitCode: 0, finished: true }, ms, runs };
}

/**
 * Runs planned template steps in order, piping each step's stdout into the next; stops at the
 * first failure. A `fail` step (a planning error, e.g. a refused helm release name) ends the run
 * with its message before any later tool starts; a kustomize step whose tree
 * `checkKustomizeTree` refuses fails with `Templating dir: <refusal>` before kustomize starts.
 *
 * @param steps - from `planTemplate`
 * @param deps - the command runner and `config.toolTimeoutMs` are used
 * @param work - the stage's scratch directory, which the tools may use (handed to their uid)
 * @param signal - kills the running tool when aborted (the App was deleted or canceled)
 * @param input - the stream a first `stdin: 'previous'` step reads (the output of steps run
 *   before, in an earlier call); default `''`
 * @returns the stage result, the manifest (last stream) on success, tool time (ms) and run count
 */
export async function runTemplateSteps(
  steps: readonly TemplateStep[],
  deps: TemplateRunDeps,
  work: string,
  signal?: AbortSignal,
  input = '',
): Promise<TemplateRun> {
  let stream = input;
  let last: StageResult = { stdout: '', stderr: '', exitCode: 0, finished: true };
  let ms = 0;
  let runs = 0;
  for (const step of steps) {
    if (step.kind === 'fail') {
      return { result: resultFromError(step.message), manifest: '', ms, runs };
    }
    if (step.kind === 'sops') {
      const r = await runSops(step, deps, work, signal);
      ms += r.ms;
      runs += r.runs;
      if (r.result.error) return { result: r.result, manifest: '', ms, runs };
      stream = '';
      last = r.result;
      continue;
    }
    if (step.kustomizeRoot !== undefined) {
      // A file error while checking (the root missing, a file gone) is the App's: a status, not a retry.
      const refused = await checkKustomizeTree(step.kustomizeRoot).catch((err: unknown) => errorMessage(err));
      if (refused !== undefined) {
        return { result: resultFromError(new Error(refused), step.errorPrefix), manifest: '', ms, runs };
      }
    }
    const run = await runTool(step, stream, deps, work, signal);
    ms += run.durationMs;
    runs++;
    last = attachError(step.errorPrefix, { ...run, stderr: markTruncated(run.stderr, run.truncated.stderr) });
    if (last.error && step.failureHint && run.stderr.includes(step.failureHint.stderrIncludes)) {
      last.error = step.errorPrefix + step.failureHint.message;
    }
    if (last.error) return { result: last, manifest: '', ms, runs };
    if (run.truncated.stdout) {
      // The runner kept only the tail: deploying it would make kapp delete what is missing.
      const failed = outputExceeded(step.errorPrefix, step.bin, templateOutputBound(deps));
      return { result: failed, manifest: '', ms, runs };
    }
    stream = run.stdout;
  }
  return { result: { ...last, stdout: '' }, manifest: stream, ms, runs };
}

/** The bound of each templating tool's stdout, bytes ({@link TemplateRunDeps} `maxTemplateOutputBytes`). */
function templateOutputBound(deps: TemplateRunDeps): number {
  return deps.config.maxTemplateOutputBytes ?? DEFAULT_MAX_OUTPUT_BYTES;
}

/**
 * The failure of a templating step whose stdout exceeded the output bound. Upstream
 * (kapp-controller) buffers a tool's output without a bound and hands all of it to kapp; here
 * the runner keeps a bounded tail, and a cut manifest must never reach kapp (it would prune
 * every resource that fell off the head), so the stage fails instead.
 *
 * @param prefix - The step's error prefix (`Templating dir: `, `Templating helm chart: `, ...).
 * @param bin - The tool that printed too much.
 * @param maxBytes - The bound.
 * @returns A failed result without stderr, so usefulErrorMessage shows this error rather than
 *   the tool's warnings.
 */
export function outputExceeded(prefix: string, bin: string, maxBytes: number): StageResult {
  return {
    stdout: '',
    stderr: '',
    exitCode: -1,
    error: `${prefix}${bin} output exceeded ${maxBytes} bytes (the limit of a rendered manifest); nothing was deployed`,
    finished: true,
  };
}

/** Runs one tool step; `work` is the stage's scratch directory, which the run may use. */
async function runTool(step: RunStep, stream: string, deps: TemplateRunDeps, work: string, signal?: AbortSignal) {
  for (const d of step.dirs) await mkdir(d, { recursive: true });
  await writePlanned(step.files);
  return await deps.runner.run({
    cmd: step.bin,
    args: step.args,
    env: step.env,
    cwd: step.cwd,
    stdin: step.stdin === 'previous' ? stream : undefined,
    timeoutMs: deps.config.toolTimeoutMs,
    writable: [work],
    maxOutputBytes: templateOutputBound(deps),
    signal,
  });
}
