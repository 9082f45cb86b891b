/**
 * The template stage (`pkg/app/app_template.go`): unpack the fetch artifact, run the
 * `spec.template` steps (ytt, kbld, helm template, cue, sops) piping each step's stdout into
 * the next (§3.7), store the manifest by content hash and hand the deploy stage its key.
 *
 * Same inputs are not rendered twice: the render-input hash covers the fetch artifact's
 * digest, `spec.template`, digests of every values source (Secret/ConfigMap data, App
 * metadata for the downward API, live cluster values) and the tool versions; when a render
 * for that hash exists, no tool runs (outcome `cached`).
 *
 * Template holds only a {@link FetchView}: tools get no kubeconfig.
 */
import { createHash } from 'node:crypto';
import { chmod, mkdir, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import path from 'node:path';
import type { TemplateStageData } from '../../../events/schema.js';
import { type App, type AppTemplate, referencedConfigMaps, referencedSecrets } from '../api/index.js';
import {
  canonicalJson,
  parseArtifactKey,
  renderCacheKey,
  renderInputHash,
  sha256Hex,
  templateArtifactKey,
} from '../artifact/keys.js';
import { isPrivateKey } from '../artifact/sealed.js';
import { unpackTarball } from '../artifact/tarball.js';
import { DEFAULT_MAX_OUTPUT_BYTES } from '../exec/runner.js';
import { templateRootOf } from '../fetch/vendir.js';
import { attachError, resultFromError, type StageResult } from '../reconcile/status.js';
import { markTruncated } from '../reconcile/status-budget.js';
import type { ClusterInfo } from '../template/downward-api.js';
import { planTemplate, requiredClusterInfo } from '../template/plan.js';
import {
  sopsDecryptCommand,
  sopsDecryptedPath,
  sopsDecryptFailureMessage,
  sopsRemoteKeyError,
} from '../template/sops.js';
import type { RunStep, SopsStep } from '../template/step.js';
import type { PlannedFile } from '../template/values.js';
import {
  manifestHasSecret,
  PRIVATE_REUSE_MARGIN_MS,
  privateArtifacts,
  readArtifact,
  scopeOf,
  templateIsPrivate,
} from './artifacts.js';
import {
  appRef,
  loadFenced,
  makeScratch,
  objectKey,
  partFromSummary,
  readRefs,
  removeScratch,
  stageTimer,
  summarize,
  summarizeStatus,
  templatePart,
  watchForAbort,
  writeAppStatus,
  writesImmediately,
} from './common.js';
import { type PipelineDeps, secretMaskOf } from './deps.js';
import type { StageOutput } from './fetch.js';
import { infraStep } from './retry-bound.js';

/** Live cluster values the template stage may need (helm `--kube-version`, downward API). */
export type ClusterInfoSource = (
  clusterId: string,
  needs: ReturnType<typeof requiredClusterInfo>,
) => Promise<ClusterInfo>;

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
  deps: PipelineDeps,
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
    // A file naming a remote master key (hc_vault, kms, ...) would make sops contact it.
    const refused = sopsRemoteKeyError(await readFile(file, 'utf8'));
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
 * with its message before any later tool starts.
 *
 * @param steps - from `planTemplate`
 * @param deps - the command runner and `config.toolTimeoutMs` are used
 * @param work - the stage's scratch directory, which the tools may use (handed to their uid)
 * @returns the stage result, the manifest (last stream) on success, tool time (ms) and run count
 */
export async function runTemplateSteps(
  steps: ReturnType<typeof planTemplate>['steps'],
  deps: PipelineDeps,
  work: string,
  signal?: AbortSignal,
): Promise<{ result: StageResult; manifest: string; ms: number; runs: number }> {
  let stream = '';
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
    const run = await runTool(step, stream, deps, work, signal);
    ms += run.durationMs;
    runs++;
    last = attachError(step.errorPrefix, { ...run, stderr: markTruncated(run.stderr, run.truncated.stderr) });
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

/** The bound of each templating tool's stdout, bytes ({@link PipelineDeps} `maxTemplateOutputBytes`). */
function templateOutputBound(deps: PipelineDeps): number {
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
async function runTool(step: RunStep, stream: string, deps: PipelineDeps, work: string, signal?: AbortSignal) {
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

/**
 * Digest of the App metadata a render can depend on: name and namespace when a helm step is
 * present (its release name and namespace default to them); uid, labels and annotations too
 * when a downward API item can read them; nothing otherwise (ytt, kbld, cue and sops never
 * see the App). Leaving them out lets the same App in any namespace of any cluster of the
 * fleet share one render.
 */
function metadataDigest(app: App, templates: readonly AppTemplate[]): string {
  const m = app.metadata;
  const usesDownwardApi = templates.some((t) =>
    [t.ytt?.valuesFrom, t.helmTemplate?.valuesFrom, t.cue?.valuesFrom].some((v) => v?.some((x) => x.downwardAPI)),
  );
  const usesHelm = templates.some((t) => t.helmTemplate);
  const id = usesDownwardApi || usesHelm ? [m.name ?? '', m.namespace ?? ''] : [];
  const parts = usesDownwardApi ? [...id, m.uid ?? '', m.labels ?? {}, m.annotations ?? {}] : id;
  return sha256Hex(canonicalJson(parts));
}

/** Tool versions the render depends on (every templating tool; cheap to over-include). */
function renderTools(deps: PipelineDeps): Record<string, string> {
  const v = deps.config.toolVersions;
  return { ytt: v.ytt ?? '', kbld: v.kbld ?? '', helm: v.helm ?? '', cue: v.cue ?? '', sops: v.sops ?? '' };
}

/**
 * Runs the template stage for a hand-off from fetch.
 *
 * @param clusterInfo - live cluster values provider (only called when the spec needs them).
 * @returns the deploy stage's input on success; nothing after a failure (final status written
 *   here), or when the run went stale or the App is gone.
 * @throws on infrastructure failures: the transport retries the event.
 */
export async function runTemplate(
  data: TemplateStageData,
  deps: PipelineDeps,
  clusterInfo: ClusterInfoSource,
): Promise<StageOutput> {
  const ref = data.object;
  const kube = deps.clusters.fetchView(ref.clusterId);
  const kref = appRef(ref);
  const fence = { uid: ref.uid, generation: data.run.generation };
  const done = stageTimer(deps, 'template', objectKey(ref), data.run.generation);
  const fenced = await loadFenced(kube, kref, fence);
  if (fenced.stop) {
    done(fenced.stop);
    return {};
  }
  const { app } = fenced.loaded;
  const ns = app.metadata.namespace ?? '';
  const templates = app.spec.template ?? [];
  const sopsKeySecrets = templates.flatMap((t) => [
    t.sops?.pgp?.privateKeysSecretRef?.name ?? '',
    t.sops?.age?.privateKeysSecretRef?.name ?? '',
  ]);
  const mask = secretMaskOf(deps);
  const refs = await readRefs(
    kube,
    ns,
    [...referencedSecrets(app.spec), ...sopsKeySecrets],
    referencedConfigMaps(app.spec),
    mask,
  );
  const needs = requiredClusterInfo(templates);
  const cluster: ClusterInfo =
    needs.kubernetesAPIs || needs.kubernetesVersion || needs.kappControllerVersion
      ? await clusterInfo(ref.clusterId, needs)
      : {};
  const fetchSha = parseArtifactKey(data.artifacts.fetchKey)?.sha256 ?? data.artifacts.fetchKey;
  const hash = renderInputHash({
    inputs: { fetch: fetchSha },
    template: JSON.parse(JSON.stringify(templates)),
    values: {
      ...refs.digests,
      metadata: metadataDigest(app, templates),
      cluster: sha256Hex(
        JSON.stringify([cluster.kubernetesVersion, cluster.kubernetesAPIs, cluster.kappControllerVersion].map(String)),
      ),
      fetchLayout: sha256Hex(templateRootOf(app.spec.fetch ?? [])),
    },
    tools: renderTools(deps),
  });
  const cacheKey = renderCacheKey(hash);
  const now = () => deps.now();
  // Private renders (any Secret input, a private fetch, or a manifest holding a Secret) are
  // sealed for this cluster and namespace and cached there only; all others are shared by
  // the fleet. Inputs without a Secret may still have rendered a Secret: such a render is
  // found in this scope's private cache.
  const scope = scopeOf(ref);
  const inputsPrivate = isPrivateKey(data.artifacts.fetchKey) || templateIsPrivate(templates);
  const priv = inputsPrivate || deps.keyring ? privateArtifacts(deps) : undefined;
  const privateCacheKey = priv ? await priv.keyFor(scope, 'render-cache', hash) : undefined;

  let manifestKey: string | undefined;
  let result: StageResult | undefined;
  let tools = { runs: 0, ms: 0 };
  const useRecord = async (hit: Buffer | undefined): Promise<void> => {
    if (!hit || manifestKey) return;
    const rec = JSON.parse(hit.toString('utf8')) as { manifestKey?: string; stderr?: string };
    if (rec.manifestKey && (await infraStep('reading the render cache', () => deps.store.head(rec.manifestKey!)))) {
      manifestKey = rec.manifestKey;
      result = { stdout: '', stderr: mask.text(rec.stderr ?? ''), exitCode: 0, finished: true };
    }
  };
  if (!inputsPrivate) {
    const hit = await infraStep('reading the render cache', () => deps.store.get(cacheKey));
    // A shared record never names a private artifact (not even a forged one).
    if (hit && !isPrivateKey(String((JSON.parse(hit.toString('utf8')) as { manifestKey?: unknown }).manifestKey))) {
      await useRecord(hit);
    }
  }
  if (!manifestKey && priv && privateCacheKey) {
    await useRecord(
      await infraStep('reading the render cache', () => priv.get(scope, privateCacheKey, PRIVATE_REUSE_MARGIN_MS)),
    );
  }
  const cached = manifestKey !== undefined;
  if (!cached) {
    const tgz = await infraStep('reading the fetch artifact', () => readArtifact(deps, scope, data.artifacts.fetchKey));
    if (!tgz) throw new Error(`fetch artifact ${data.artifacts.fetchKey} is missing from the object store`);
    const work = await makeScratch(deps, 'template');
    try {
      const src = path.join(work, 'src');
      await unpackTarball(tgz, src);
      const templateRoot = path.resolve(src, templateRootOf(app.spec.fetch ?? []));
      const plan = planTemplate({
        app: { metadata: app.metadata, spec: { template: templates } },
        templateRoot,
        scratchRoot: path.join(work, 'scratch'),
        refs,
        cluster: { ...cluster, kappControllerVersion: cluster.kappControllerVersion ?? deps.config.controllerVersion },
      });
      for (const w of plan.warnings) deps.log.warn({ object: objectKey(ref), stage: 'template' }, w);
      // Deleting (or canceling) the App kills the templating tools, as it kills kapp.
      const watch = watchForAbort(kube, kref, ref.uid, deps);
      let r: Awaited<ReturnType<typeof runTemplateSteps>>;
      try {
        r = await runTemplateSteps(plan.steps, deps, work, watch.signal);
      } finally {
        await watch.stop();
      }
      if (watch.signal.aborted) {
        done('stale', { tools: { runs: r.runs, ms: r.ms } });
        return {};
      }
      // Masked as soon as the tools return (a ytt fail() message may quote a Secret's value),
      // before the render cache or status sees it. The manifest itself is not touched.
      result = mask.result(r.result);
      tools = { runs: r.runs, ms: r.ms };
      if (!result.error) {
        const manifest = Buffer.from(r.manifest, 'utf8');
        const digest = createHash('sha256').update(manifest).digest('hex');
        const record = (key: string) => JSON.stringify({ manifestKey: key, stderr: result?.stderr ?? '' });
        if (inputsPrivate || manifestHasSecret(r.manifest)) {
          const p = privateArtifacts(deps);
          const key = await p.keyFor(scope, 'template', digest);
          await infraStep('storing the rendered manifest', () => p.put(scope, key, manifest));
          const recKey = privateCacheKey ?? (await p.keyFor(scope, 'render-cache', hash));
          await infraStep('storing the render cache record', () => p.put(scope, recKey, record(key)));
          manifestKey = key;
        } else {
          const key = templateArtifactKey(digest);
          await infraStep('storing the rendered manifest', () => deps.store.putIfAbsent(key, manifest));
          await infraStep('storing the render cache record', () => deps.store.put(cacheKey, record(key)));
          manifestKey = key;
        }
      }
    } finally {
      await removeScratch(work);
    }
  }
  const part = templatePart(result!, now());
  const fetchPartCarried = partFromSummary(data.fetchStatus);
  if (result!.error || !manifestKey) {
    const w = await writeAppStatus(
      kube,
      kref,
      fence,
      (cur) => summarizeStatus(cur, fence.generation, { fetch: fetchPartCarried, template: part }, result),
      mask,
    );
    done(w.outcome === 'stale' || w.outcome === 'gone' ? w.outcome : 'failed', {
      error: result!.error && mask.redact(result!.error),
      tools,
    });
    return {};
  }
  if (writesImmediately(app.status)) {
    const w = await writeAppStatus(
      kube,
      kref,
      fence,
      (cur) => summarizeStatus(cur, fence.generation, { template: part }),
      mask,
    );
    if (w.outcome === 'stale' || w.outcome === 'gone') {
      done(w.outcome, { tools });
      return {};
    }
  }
  done(cached ? 'cached' : 'succeeded', { tools });
  return {
    deploy: {
      object: ref,
      run: data.run,
      artifacts: { fetchKey: data.artifacts.fetchKey, manifestKey },
      fetchStatus: data.fetchStatus,
      templateStatus: summarize(part),
    },
  };
}
