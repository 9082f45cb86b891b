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
  referencedConfigMaps,
  referencedSecrets,
  templateIsPrivate,
} from '../../api/index.js';
import {
  canonicalJson,
  parseArtifactKey,
  renderCacheKey,
  renderInputHash,
  renderToolVersions,
  sha256Hex,
  templateArtifactKey,
} from '../../artifact/keys.js';
import { isPrivateKey } from '../../artifact/sealed.js';
import { unpackTarball } from '../../artifact/tarball.js';
import { inspectsAfterFailure } from '../../deploy/kapp.js';
import { destinationKubeconfig } from '../../deploy/run.js';
import { templateRootOf } from '../../fetch/vendir.js';
import type { FetchView } from '../../kube/port.js';
import { KappControllerError, MissingArtifactError, type StageResult } from '../../reconcile/result.js';
import type { SecretMask } from '../../reconcile/secret-mask.js';
import { fromEventPart, templatePart, toEventPart } from '../../reconcile/status.js';
import type { ClusterInfo } from '../../template/downward-api.js';
import { runTemplateSteps } from '../../template/execute.js';
import { planTemplate, requiredClusterInfo } from '../../template/plan.js';
import {
  cachedStageRun,
  manifestHasSecret,
  PRIVATE_REUSE_MARGIN_MS,
  privateArtifacts,
  readArtifact,
  scopeOf,
} from '../artifacts.js';
import type { ClusterInfoSource, PipelineDeps, StageOutput } from '../deps.js';
import { infraStep } from '../retry-bound.js';
import { closeHandingOn, openHandOff } from '../stage.js';
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
  const opened = await openHandOff(deps, 'template', data, (id) => deps.clusters.fetchView(id), APP_KIND);
  if (opened.stop) return {};
  const { frame } = opened;
  const templateStartedAt = deps.now();
  const { kube, mask } = frame;
  const { app } = frame.loaded;
  const ns = app.metadata.namespace ?? '';
  const templates = app.spec.template ?? [];
  const sopsKeySecrets = templates.flatMap((t) => [
    t.sops?.pgp?.privateKeysSecretRef?.name ?? '',
    t.sops?.age?.privateKeysSecretRef?.name ?? '',
  ]);
  const refs = await readRefs(
    kube,
    ns,
    [...referencedSecrets(app.spec), ...sopsKeySecrets],
    referencedConfigMaps(app.spec),
    mask,
  );
  const needs = requiredClusterInfo(templates);
  const cluster: ClusterInfo =
    needs.kubernetesAPIs || needs.kubernetesVersion
      ? await clusterInfo(ref.clusterId, needs, await destinationOf(app, kube, mask, deps))
      : needs.kappControllerVersion
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
    tools: renderToolVersions(deps.config.toolVersions),
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

  let tools = { runs: 0, ms: 0 };
  /** The render a cache record names, when the manifest it names exists. */
  const fromRecord = async (hit: Buffer | undefined, sealed: boolean): Promise<Rendered | undefined> => {
    if (!hit) return undefined;
    const rec = JSON.parse(hit.toString('utf8')) as { manifestKey?: unknown; stderr?: string };
    const key = rec.manifestKey;
    // A shared record never names a private artifact (not even a forged one).
    if (typeof key !== 'string' || (!sealed && isPrivateKey(key))) return undefined;
    if (!(await infraStep('reading the render cache', () => deps.store.head(key)))) return undefined;
    return {
      manifestKey: key,
      result: { stdout: '', stderr: mask.text(rec.stderr ?? ''), exitCode: 0, finished: true },
    };
  };
  const readShared = async () =>
    await fromRecord(await infraStep('reading the render cache', () => deps.store.get(cacheKey)), false);
  const cache = await cachedStageRun<Rendered>(deps, {
    // A render of shared inputs runs once for the fleet: the same render elsewhere waits for it.
    ...(inputsPrivate ? {} : { shared: { key: cacheKey, read: readShared } }),
    ...(priv && privateCacheKey
      ? {
          sealed: async () =>
            await fromRecord(
              await infraStep('reading the render cache', () =>
                priv.get(scope, privateCacheKey, PRIVATE_REUSE_MARGIN_MS),
              ),
              true,
            ),
        }
      : {}),
    // Deleting the App kills the templating tools; canceling does not: the run goes on to kapp's
    // `Already canceled`.
    watch: { kube, ref: frame.ref, uid: ref.uid },
    runId: data.run.runId,
    run: async (signal) => {
      const tgz = await infraStep('reading the fetch artifact', () =>
        readArtifact(deps, scope, data.artifacts.fetchKey),
      );
      if (!tgz) throw new MissingArtifactError('fetch artifact', data.artifacts.fetchKey);
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
          cluster: {
            ...cluster,
            kappControllerVersion: cluster.kappControllerVersion ?? deps.config.controllerVersion,
          },
        });
        for (const w of plan.warnings) deps.log.warn({ object: objectKey(ref), stage: 'template' }, w);
        const r = await runTemplateSteps(plan.steps, deps, work, signal);
        tools = { runs: r.runs, ms: r.ms };
        // Masked as soon as the tools return (a ytt fail() message may quote a Secret's value),
        // before the render cache or status sees it. The manifest itself is not touched.
        const out = mask.result(r.result);
        if (out.error || signal.aborted) return { result: { result: out }, shared: false };
        const manifest = Buffer.from(r.manifest, 'utf8');
        const digest = createHash('sha256').update(manifest).digest('hex');
        const record = (key: string) => JSON.stringify({ manifestKey: key, stderr: out.stderr });
        if (inputsPrivate || manifestHasSecret(r.manifest)) {
          const p = privateArtifacts(deps);
          const key = await p.keyFor(scope, 'template', digest);
          await infraStep('storing the rendered manifest', () => p.put(scope, key, manifest));
          const recKey = privateCacheKey ?? (await p.keyFor(scope, 'render-cache', hash));
          await infraStep('storing the render cache record', () => p.put(scope, recKey, record(key)));
          // Sealed for this cluster: the fleet's waiters render for themselves.
          return { result: { result: out, manifestKey: key }, shared: false };
        }
        const key = templateArtifactKey(digest);
        await infraStep('storing the rendered manifest', () => deps.store.putIfAbsent(key, manifest));
        await infraStep('storing the render cache record', () => deps.store.put(cacheKey, record(key)));
        return { result: { result: out, manifestKey: key }, shared: true };
      } finally {
        await removeScratch(work);
      }
    },
  });
  if (cache.kind === 'aborted') {
    frame.done('stale', { tools });
    return {};
  }
  const cached = cache.kind === 'found';
  const { result, manifestKey } = cache.value;
  const part = templatePart(result, now());
  frame.observe.phase('template', frame.secondsSince(templateStartedAt));
  const next = await closeHandingOn(frame, {
    parts: { fetch: fromEventPart(data.fetchStatus), template: part },
    own: part,
    result,
    artifactKey: manifestKey,
    cached,
    tools,
    receipt: receiptOnEnd(deps, {
      object: ref,
      run: data.run,
      stage: 'template',
      ...(data.receipt ? { trail: data.receipt } : {}),
      fetchKey: data.artifacts.fetchKey,
      ...(manifestKey ? { manifestKey } : {}),
      ...(inputsPrivate ? {} : { renderInputHash: hash }),
    }),
    inspectAfter: inspectsAfterFailure(frame.loaded.app),
  });
  // The render-input hash of a private render is not carried (receipts hold no digest of Secrets).
  const receipt = trailWith(deps, data.receipt, 'template', inputsPrivate ? {} : { renderInputHash: hash });
  if (next === 'failure') {
    // The deploy function inspects and ends the run (upstream inspects after any failure once deployed).
    return {
      deploy: {
        object: ref,
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
      object: ref,
      run: data.run,
      artifacts: { fetchKey: data.artifacts.fetchKey, manifestKey },
      fetchStatus: data.fetchStatus,
      templateStatus: toEventPart(part),
      ...(receipt ? { receipt } : {}),
    },
  };
}
