/**
 * The template stage (`pkg/app/app_template.go`): unpack the fetch artifact, run the
 * `spec.template` steps (ytt, kbld, helm template, cue, sops, kustomize) piping each step's stdout into
 * the next (§3.7), store the manifest by content hash and hand the deploy stage its key.
 *
 * Same inputs are not rendered twice: the render-input hash covers the fetch artifact's
 * digest, `spec.template`, digests of every values source (Secret/ConfigMap data, App
 * metadata for the downward API, live cluster values) and the tool versions; when a render
 * for that hash exists, no tool runs (outcome `cached`).
 *
 * Template holds only a {@link FetchView}: tools get no kubeconfig. For an App deploying
 * through its kubeconfig Secret, the stage itself reads the destination cluster's version and
 * API groups (discovery only) with that kubeconfig, under the URL policy. The steps are planned in
 * `../../template/plan.ts` and run by `../../template/execute.ts`; this file decides the inputs, the
 * cache and what the result means for the App.
 */
import { createHash } from 'node:crypto';
import path from 'node:path';
import type { TemplateStageData } from '../../../../events/schema.js';
import {
  type App,
  type AppTemplate,
  type RefObjects,
  referencedConfigMaps,
  referencedSecrets,
  templateIsPrivate,
} from '../../api/index.js';
import {
  canonicalJson,
  PRIVATE_TEMPLATE_KEY_PATTERN,
  parseArtifactKey,
  renderCacheKey,
  renderInputHash,
  renderToolVersions,
  sha256Hex,
  TEMPLATE_KEY_PATTERN,
  templateArtifactKey,
} from '../../artifact/keys.js';
import { type ArtifactScope, isPrivateKey, type PrivateArtifacts } from '../../artifact/sealed.js';
import type { FlightRun } from '../../artifact/single-flight.js';
import { inspectsAfterFailure } from '../../deploy/kapp.js';
import { destinationKubeconfig } from '../../deploy/run.js';
import { DEFAULT_MAX_INLINE_BYTES, referencedLimit } from '../../fetch/inline-limit.js';
import { templateRootOf } from '../../fetch/vendir.js';
import type { FetchView } from '../../kube/port.js';
import { KappControllerError, resultFromError, type StageResult } from '../../reconcile/result.js';
import type { SecretMask } from '../../reconcile/secret-mask.js';
import { fromEventPart, type StagePart, templatePart, toEventPart } from '../../reconcile/status.js';
import { absentIfUnreadable } from '../../store/port.js';
import type { ClusterInfo } from '../../template/downward-api.js';
import { runTemplateSteps } from '../../template/execute.js';
import { planTemplate, requiredClusterInfo } from '../../template/plan.js';
import {
  type CachedStageOutcome,
  cachedStageRun,
  logTampered,
  manifestHasSecret,
  PRIVATE_REUSE_MARGIN_MS,
  parseCacheRecord,
  privateArtifacts,
  readArtifact,
  scopeOf,
  unpackArtifact,
} from '../artifacts.js';
import type { ClusterInfoSource, PipelineDeps, StageOutput } from '../deps.js';
import { infraStep } from '../retry-bound.js';
import { closeHandingOn, openHandOff, type StageFrame } from '../stage.js';
import { makeScratch, objectKey, readRefs, removeScratch } from '../stage-inputs.js';
import { APP_KIND } from './kind.js';
import { policedKubeconfig } from './kubeconfig-policy.js';
import { receiptOnEnd, trailWith } from './receipts.js';

/** A render's outcome: the tools' result (or the cache record's) and the manifest, on success. */
type Rendered = { result: StageResult; manifestKey?: string };

/**
 * The App's destination for {@link ClusterInfoSource}: `undefined` for its own cluster (a
 * ServiceAccount), the policed kubeconfig of its kubeconfig Secret, or the user-fixable error
 * (missing Secret or key, bad kubeconfig, refused by the URL policy) as a value.
 * @throws on infrastructure failures (the Secret could not be read): the transport retries.
 */
async function destinationOf(app: App, kube: FetchView, mask: SecretMask, deps: PipelineDeps) {
  try {
    const yaml = await destinationKubeconfig(app, kube, mask);
    return yaml === undefined ? undefined : await policedKubeconfig(yaml, deps.config.urlPolicy, deps.egressProxyUrl);
  } catch (err) {
    if (err instanceof KappControllerError) return err;
    throw err;
  }
}

/**
 * Digest of the App metadata a render can depend on: name and namespace when a helm step is
 * present (its release name and namespace default to them); uid, labels and annotations too
 * when a downward API item can read them; nothing otherwise (ytt, kbld, cue, sops and kustomize never
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

/**
 * What one template run works from, decided before any tool runs: the steps of
 * {@link runTemplate} share it.
 */
interface TemplateRun {
  /** The hand-off from fetch. */
  data: TemplateStageData;
  deps: PipelineDeps;
  /** The open stage (the App as read, its view, mask and log line). */
  frame: StageFrame<FetchView>;
  /** `spec.template` of the App as read (`[]` when absent). */
  templates: readonly AppTemplate[];
  /** The Secrets and ConfigMaps the steps read (sops keys included), with their digests. */
  refs: RefObjects & { digests: Record<string, string> };
  /** The live cluster values the spec asks for (`{}` when none). */
  cluster: ClusterInfo;
  /** The render-input hash (see the module comment). */
  hash: string;
  /** Key of the fleet-wide render cache record for {@link hash}. */
  cacheKey: string;
  /** The App's cluster and namespace: the scope of a sealed render. */
  scope: ArtifactScope;
  /** A Secret is among the inputs (a private fetch or a Secret values source): the render is sealed. */
  inputsPrivate: boolean;
  /** The sealed store, when the inputs are private or a keyring may seal a render holding a Secret. */
  priv?: PrivateArtifacts;
  /** Key of this scope's sealed render cache record, with {@link priv}. */
  privateCacheKey?: string;
  /** Tool runs and time, for the log line (set once the tools ran). */
  tools: { runs: number; ms: number };
  /**
   * The Secrets and ConfigMaps the steps name are over the referenced cap (`referencedLimit`):
   * the run ends with this error as its result, no tool and no cache (its inputs are unknown).
   */
  refused?: KappControllerError;
}

/**
 * Runs the template stage for a hand-off from fetch: decides the inputs
 * ({@link prepareRender}), renders once for them ({@link renderOnce}), closes the stage and hands
 * deploy its manifest or the failure ({@link templateOutput}).
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
  const opened = await openHandOff(deps, 'template', data, (id) => deps.clusters.fetchView(id), APP_KIND);
  if (opened.stop) return {};
  const { frame } = opened;
  const templateStartedAt = deps.now();
  const run = await prepareRender(data, deps, frame, clusterInfo);
  const cache = await renderOnce(run);
  if (cache.kind === 'aborted') {
    frame.done('stale', { tools: run.tools });
    return {};
  }
  const cached = cache.kind === 'found';
  const { result, manifestKey } = cache.value;
  const part = templatePart(result, deps.now());
  frame.observe.phase('template', frame.secondsSince(templateStartedAt));
  const next = await closeHandingOn(frame, {
    parts: { fetch: fromEventPart(data.fetchStatus), template: part },
    own: part,
    result,
    artifactKey: manifestKey,
    cached,
    tools: run.tools,
    receipt: receiptOnEnd(deps, {
      object: data.object,
      run: data.run,
      stage: 'template',
      ...(data.receipt ? { trail: data.receipt } : {}),
      fetchKey: data.artifacts.fetchKey,
      ...(manifestKey ? { manifestKey } : {}),
      ...(run.inputsPrivate ? {} : { renderInputHash: run.hash }),
    }),
    inspectAfter: inspectsAfterFailure(frame.loaded.app),
  });
  return templateOutput(run, part, next, manifestKey);
}

/**
 * Decides what the render depends on, in order: reads the Secrets and ConfigMaps the steps
 * name (their values join the mask), asks for the live cluster values the spec needs, hashes the
 * render inputs, and chooses where the render is cached.
 *
 * Private renders (any Secret input, a private fetch, or a manifest holding a Secret) are
 * sealed for this cluster and namespace and cached there only; all others are shared by the
 * fleet. Inputs without a Secret may still have rendered a Secret: such a render is found in
 * this scope's private cache.
 *
 * @throws on infrastructure failures (API reads, the destination's kubeconfig Secret).
 */
async function prepareRender(
  data: TemplateStageData,
  deps: PipelineDeps,
  frame: StageFrame<FetchView>,
  clusterInfo: ClusterInfoSource,
): Promise<TemplateRun> {
  const ref = data.object;
  const { kube, mask } = frame;
  const { app } = frame.loaded;
  const templates = app.spec.template ?? [];
  const sopsKeySecrets = templates.flatMap((t) => [
    t.sops?.pgp?.privateKeysSecretRef?.name ?? '',
    t.sops?.age?.privateKeysSecretRef?.name ?? '',
  ]);
  let refs: TemplateRun['refs'];
  try {
    refs = await readRefs(
      kube,
      app.metadata.namespace ?? '',
      [...referencedSecrets(app.spec), ...sopsKeySecrets],
      referencedConfigMaps(app.spec),
      mask,
      referencedLimit('Templating', deps.config.maxInlineBytes ?? DEFAULT_MAX_INLINE_BYTES),
    );
  } catch (err) {
    if (!(err instanceof KappControllerError)) throw err;
    // Private, so no render-input hash is carried on; nothing is cached under the empty keys.
    const none = { secret: () => undefined, configMap: () => undefined, digests: {} };
    const scope = scopeOf(data.object);
    return {
      data,
      deps,
      frame,
      templates,
      refs: none,
      cluster: {},
      hash: '',
      cacheKey: '',
      scope,
      inputsPrivate: true,
      tools: { runs: 0, ms: 0 },
      refused: err,
    };
  }
  const needs = requiredClusterInfo(templates);
  const cluster: ClusterInfo =
    needs.kubernetesAPIs || needs.kubernetesVersion
      ? await clusterInfo(ref.clusterId, needs, await destinationOf(app, kube, mask, deps))
      : needs.kappControllerVersion
        ? await clusterInfo(ref.clusterId, needs)
        : {};
  const hash = renderHashOf(data, deps, app, refs.digests, cluster);
  const scope = scopeOf(ref);
  const inputsPrivate = isPrivateKey(data.artifacts.fetchKey) || templateIsPrivate(templates);
  const priv = inputsPrivate || deps.keyring ? privateArtifacts(deps) : undefined;
  const privateCacheKey = priv ? await priv.keyFor(scope, 'render-cache', hash) : undefined;
  return {
    data,
    deps,
    frame,
    templates,
    refs,
    cluster,
    hash,
    cacheKey: renderCacheKey(hash),
    scope,
    inputsPrivate,
    ...(priv ? { priv } : {}),
    ...(privateCacheKey ? { privateCacheKey } : {}),
    tools: { runs: 0, ms: 0 },
  };
}

/** The render-input hash: the fetch artifact's digest, `spec.template`, every values source's digest and the tool versions. */
function renderHashOf(
  data: TemplateStageData,
  deps: PipelineDeps,
  app: App,
  digests: Record<string, string>,
  cluster: ClusterInfo,
): string {
  const templates = app.spec.template ?? [];
  const fetchSha = parseArtifactKey(data.artifacts.fetchKey)?.sha256 ?? data.artifacts.fetchKey;
  return renderInputHash({
    inputs: { fetch: fetchSha },
    template: JSON.parse(JSON.stringify(templates)),
    values: {
      ...digests,
      metadata: metadataDigest(app, templates),
      cluster: sha256Hex(
        JSON.stringify([cluster.kubernetesVersion, cluster.kubernetesAPIs, cluster.kappControllerVersion].map(String)),
      ),
      fetchLayout: sha256Hex(templateRootOf(app.spec.fetch ?? [])),
    },
    tools: renderToolVersions(deps.config.toolVersions),
  });
}

/**
 * Renders once for the run's inputs: a cached render (shared, then sealed) when its manifest
 * exists, else the tools run ({@link render}), through the fleet single-flight for shared inputs.
 * Deleting the App kills the templating tools; canceling does not: the run goes on to kapp's
 * `Already canceled`.
 */
async function renderOnce(run: TemplateRun): Promise<CachedStageOutcome<Rendered>> {
  const { data, deps, frame, priv, privateCacheKey, scope } = run;
  if (run.refused) return { kind: 'ran', value: { result: frame.mask.result(resultFromError(run.refused)) } };
  // A record over the read bound (any run of the fleet may write it, fleet sharing) is a miss.
  const cached = () =>
    absentIfUnreadable(
      () => deps.store.get(run.cacheKey),
      () => logTampered(deps, run.cacheKey),
    );
  const readShared = async () => await fromRecord(run, await infraStep('reading the render cache', cached), false);
  return await cachedStageRun<Rendered>(deps, {
    // A render of shared inputs runs once for the fleet: the same render elsewhere waits for it.
    ...(run.inputsPrivate ? {} : { shared: { key: run.cacheKey, read: readShared } }),
    ...(priv && privateCacheKey
      ? {
          sealed: async () =>
            await fromRecord(
              run,
              await infraStep('reading the render cache', () =>
                priv.get(scope, privateCacheKey, PRIVATE_REUSE_MARGIN_MS),
              ),
              true,
            ),
        }
      : {}),
    watch: { kube: frame.kube, ref: frame.ref, uid: data.object.uid },
    runId: data.run.runId,
    run: (signal) => render(run, signal),
  });
}

/**
 * The render a cache record names, when the manifest it names exists. Any run of the fleet may
 * write the shared records and manifests, so: a record that does not parse, or names anything
 * but a rendered manifest (a shared record: a shared manifest key only; a sealed one: a shared
 * or a private manifest key), is a miss, and a shared manifest is read and must hash to its key
 * (`readArtifact`): a tampered one is a miss too, so this run renders again and keeps its own
 * copy ({@link storeRender}) rather than handing deploy what deploy would refuse, run after run.
 */
async function fromRecord(run: TemplateRun, hit: Buffer | undefined, sealed: boolean): Promise<Rendered | undefined> {
  const rec = parseCacheRecord(hit);
  const key = rec?.manifestKey;
  if (typeof key !== 'string') return undefined;
  const shared = TEMPLATE_KEY_PATTERN.test(key);
  if (!shared && !(sealed && PRIVATE_TEMPLATE_KEY_PATTERN.test(key))) return undefined;
  const there = shared
    ? (await infraStep('reading the rendered manifest', () => readArtifact(run.deps, run.scope, key))) !== undefined
    : await infraStep('reading the render cache', () => run.deps.store.head(key));
  if (!there) return undefined;
  const stderr = typeof rec?.stderr === 'string' ? rec.stderr : '';
  return { manifestKey: key, result: { stdout: '', stderr: run.frame.mask.text(stderr), exitCode: 0, finished: true } };
}

/**
 * Runs the planned steps on the unpacked fetch artifact in a scratch directory (removed after)
 * and stores a successful render ({@link storeRender}).
 * @throws MissingArtifactError when the fetch artifact is gone or tampered with; infrastructure
 *   failures as they come.
 */
async function render(run: TemplateRun, signal: AbortSignal): Promise<FlightRun<Rendered>> {
  const { data, deps, frame } = run;
  const { app } = frame.loaded;
  const work = await makeScratch(deps, 'template');
  try {
    const src = path.join(work, 'src');
    // A shared tarball is checked against its key as it is unpacked: a tampered one never renders.
    await unpackArtifact(deps, run.scope, data.artifacts.fetchKey, src, 'fetch artifact');
    const templateRoot = path.resolve(src, templateRootOf(app.spec.fetch ?? []));
    const plan = planTemplate({
      app: { metadata: app.metadata, spec: { template: run.templates } },
      templateRoot,
      scratchRoot: path.join(work, 'scratch'),
      refs: run.refs,
      cluster: {
        ...run.cluster,
        kappControllerVersion: run.cluster.kappControllerVersion ?? deps.config.controllerVersion,
      },
    });
    for (const w of plan.warnings) deps.log.warn({ object: objectKey(data.object), stage: 'template' }, w);
    const r = await runTemplateSteps(plan.steps, deps, work, signal);
    run.tools = { runs: r.runs, ms: r.ms };
    // Masked as soon as the tools return (a ytt fail() message may quote a Secret's value),
    // before the render cache or status sees it. The manifest itself is not touched.
    const out = frame.mask.result(r.result);
    if (out.error || signal.aborted) return { result: { result: out }, shared: false };
    return await storeRender(run, r.manifest, out);
  } finally {
    await removeScratch(work);
  }
}

/**
 * Stores a successful render by content hash with its cache record: sealed for this scope when
 * the inputs or the manifest hold a Secret (the fleet's waiters then render for themselves),
 * else shared by the fleet. A shared manifest already there is read back and must be these
 * bytes: one replaced under its key (other bytes, or more of them than the render's: tampering,
 * logged) is not named, the render is kept sealed for this scope instead, so a run of another
 * cluster costs this one a private copy, never the manifest it deploys.
 */
async function storeRender(run: TemplateRun, rendered: string, out: StageResult): Promise<FlightRun<Rendered>> {
  const { deps, scope } = run;
  const manifest = Buffer.from(rendered, 'utf8');
  const digest = createHash('sha256').update(manifest).digest('hex');
  const record = (key: string) => JSON.stringify({ manifestKey: key, stderr: out.stderr });
  const sealed = async (): Promise<FlightRun<Rendered>> => {
    const p = privateArtifacts(deps);
    const key = await p.keyFor(scope, 'template', digest);
    await infraStep('storing the rendered manifest', () => p.put(scope, key, manifest));
    const recKey = run.privateCacheKey ?? (await p.keyFor(scope, 'render-cache', run.hash));
    await infraStep('storing the render cache record', () => p.put(scope, recKey, record(key)));
    // Sealed for this cluster: the fleet's waiters render for themselves.
    return { result: { result: out, manifestKey: key }, shared: false };
  };
  if (run.inputsPrivate || manifestHasSecret(rendered)) return await sealed();
  const key = templateArtifactKey(digest);
  const put = await infraStep('storing the rendered manifest', () => deps.store.putIfAbsent(key, manifest));
  if (put === 'exists') {
    // Not trusted: a manifest replaced under its key keeps this run's own copy, sealed.
    // Read within this render's size: a larger object is not it (and is not read whole).
    const there = await infraStep('reading the rendered manifest back', () =>
      absentIfUnreadable(() => deps.store.get(key, { maxBytes: manifest.length })),
    );
    if (!there?.equals(manifest)) {
      logTampered(deps, key);
      return await sealed();
    }
  }
  await infraStep('storing the render cache record', () => deps.store.put(run.cacheKey, record(key)));
  return { result: { result: out, manifestKey: key }, shared: true };
}

/**
 * The deploy stage's input once the stage closed: the manifest on success, the failure for the
 * deploy function's inspect when `next` hands it on, else nothing (the run ended here).
 */
function templateOutput(
  run: TemplateRun,
  part: StagePart,
  next: 'artifact' | 'failure' | undefined,
  manifestKey: string | undefined,
): StageOutput {
  const { data, deps } = run;
  // The render-input hash of a private render is not carried (receipts hold no digest of Secrets).
  const receipt = trailWith(deps, data.receipt, 'template', run.inputsPrivate ? {} : { renderInputHash: run.hash });
  if (next === 'failure') {
    // The deploy function inspects and ends the run (upstream inspects after any failure once deployed).
    return {
      deploy: {
        object: data.object,
        run: data.run,
        artifacts: { fetchKey: data.artifacts.fetchKey },
        ...(data.fetchStatus ? { fetchStatus: data.fetchStatus } : {}),
        templateStatus: toEventPart(part),
        afterFailure: 'template',
        ...(receipt ? { receipt } : {}),
      },
    };
  }
  if (!next || !manifestKey) return {};
  return {
    deploy: {
      object: data.object,
      run: data.run,
      artifacts: { fetchKey: data.artifacts.fetchKey, manifestKey },
      fetchStatus: data.fetchStatus,
      templateStatus: toEventPart(part),
      ...(receipt ? { receipt } : {}),
    },
  };
}
