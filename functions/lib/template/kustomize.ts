/**
 * `kustomize build` step planning, and the check of a kustomization tree before kustomize runs.
 *
 * kapp-controller has the `kustomize` field (`AppTemplateKustomize`, an empty struct) but fails
 * the reconcile with `Unsupported way to template`; kapp-lambda implements it. The step consumes
 * a directory like cue (the template root: the fetched files, rewritten in place by a sops step
 * before it) and produces a stream for the steps after it, like helmTemplate. It cannot read a
 * stream (a kustomization is a directory), so after a stream-producing step it fails with
 * upstream's cue text, `Templating stream is not supported`.
 *
 * Security: kustomize can load remote bases and files (git clones through the `git` program, http
 * GETs) and run plugins. kapp-lambda refuses remote references before kustomize starts (fetch
 * remote sources with `spec.fetch`, which goes through the egress policy), refuses local bases
 * outside the template root, and runs kustomize with `--load-restrictor=LoadRestrictionsRootOnly`,
 * without `--enable-alpha-plugins`, `--enable-exec` or `--enable-helm` (kustomize then refuses
 * exec/KRM function plugins and `helmCharts` itself), with no `git` on its `PATH` and with an
 * unreachable http proxy, so a reference the check missed still cannot reach the network (a
 * loopback address too: kustomize is built with the patched httpproxy and gets
 * `KL_PROXY_LOOPBACK=1`, `layers/gobuild.ts`; stock Go never proxies loopback).
 *
 * @module
 */
import { readFile, realpath, stat } from 'node:fs/promises';
import { posix } from 'node:path';
import { parse } from 'yaml';
import type { AppTemplateKustomize } from '../api/template.js';
import { quoteValue } from '../argv-values.js';
import { DEAD_PROXY, DEAD_PROXY_ENV, type RunStep, type StepContext, TEMPLATING_DIR_ERROR_PREFIX } from './step.js';

/**
 * The file names kustomize reads as a kustomization, in its own order
 * (`konfig.RecognizedKustomizationFileNames`).
 */
export const KUSTOMIZATION_FILE_NAMES: readonly string[] = ['kustomization.yaml', 'kustomization.yml', 'Kustomization'];

/** The proxy kustomize's http client is pointed at (`DEAD_PROXY` of `./step.ts`). */
export const KUSTOMIZE_DEAD_PROXY = DEAD_PROXY;

/**
 * Plans a kustomize step:
 * `kustomize build --load-restrictor=LoadRestrictionsRootOnly -- <templateRoot>`, with `PATH` an
 * empty directory (`<scratchDir>/no-tools`: no `git`, so no remote base can be cloned) and the
 * http(s) proxy variables set to {@link KUSTOMIZE_DEAD_PROXY}. No user value reaches the argv:
 * the only positional is the template root, which kapp-lambda chose. `RunStep.kustomizeRoot`
 * asks the executor to run {@link checkKustomizeTree} on the root first (after the steps before
 * it, e.g. sops, rewrote it).
 *
 * @param _opts - the step's `kustomize` spec (no fields; upstream's type has none)
 * @param ctx - step context (must not have stdin; the pipeline turns that case into
 *   `Templating stream is not supported`)
 * @returns the run step
 */
export function planKustomize(_opts: AppTemplateKustomize, ctx: StepContext): RunStep {
  const noTools = posix.join(ctx.scratchDir, 'no-tools');
  return {
    kind: 'run',
    index: ctx.index,
    templater: 'kustomize',
    bin: 'kustomize',
    args: ['build', '--load-restrictor=LoadRestrictionsRootOnly', '--', ctx.templateRoot],
    env: {
      PATH: noTools,
      // kustomize is built with the patched httpproxy (layers/gobuild.ts): loopback URLs go to
      // the dead proxy too, rather than straight to e.g. the Lambda Runtime API.
      ...DEAD_PROXY_ENV,
    },
    stdin: 'none',
    files: [],
    dirs: [noTools],
    errorPrefix: TEMPLATING_DIR_ERROR_PREFIX,
    kustomizeRoot: ctx.templateRoot,
  };
}

/**
 * Whether kustomize would load `ref` from the network: a URL with a scheme (`https://`, `ssh://`,
 * `file://` clones, ...), after the `git::` prefix kustomize strips; an scp-style git address
 * (`user@host:org/repo`); or a `github.com/` / `github.com:` path (kustomize's
 * `git.NewRepoSpecFromURL`, whose prefixes are matched ignoring case).
 *
 * @param ref - one reference of a kustomization
 */
export function isRemoteReference(ref: string): boolean {
  const s = ref.trim().replace(/^git::/i, '');
  return /^[a-z][a-z0-9+.-]*:\/\//i.test(s) || /^[a-z][a-z0-9-]*@/i.test(s) || /^github\.com[/:]/i.test(s);
}

/** One reference a kustomization makes: where it is (`resources[0]`) and its value. */
export interface KustomizationReference {
  /** Field path in the kustomization, e.g. `resources[0]` or `configMapGenerator[1].files[0]`. */
  field: string;
  /** The reference as written (for `files`, the path after an optional `key=`). */
  value: string;
  /** Whether kustomize may read it as a directory (another kustomization): `resources`, `bases`, ... */
  directory: boolean;
}

/** Lists of references that may name a directory (a base, a component, a plugin kustomization). */
const DIRECTORY_LISTS = ['resources', 'bases', 'components', 'generators', 'transformers', 'validators'];

/** Lists of file references (or inline documents, which are never remote). */
const FILE_LISTS = ['crds', 'configurations', 'patchesStrategicMerge'];

/** Lists of objects whose `path` names a file. */
const PATH_OBJECT_LISTS = ['patches', 'patchesJson6902', 'replacements'];

/** Generator lists whose `files`, `envs` and `env` name files. */
const GENERATOR_LISTS = ['configMapGenerator', 'secretGenerator'];

/**
 * `key` folded as Go's `encoding/json` matches field names (`bytes.EqualFold`, Unicode simple
 * folding): besides ASCII case, `ſ` (U+017F) is an `s` and the Kelvin sign `K` (U+212A) a `k`
 * (`toLowerCase` already maps that one). Without it `reſources: [http://127.0.0.1:…]` was no
 * `resources` to the check while kustomize fetched the URL.
 */
function goFold(key: string): string {
  return key.replace(/\u017f/g, 's').toLowerCase();
}

/**
 * Values of `obj` under `key`, matching keys ignoring case: kustomize decodes a kustomization
 * with Go's `encoding/json`, which matches field names that way (`Resources:` is `resources`,
 * {@link goFold}).
 */
function fieldValues(obj: unknown, key: string): unknown[] {
  if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) return [];
  const folded = goFold(key);
  return Object.entries(obj)
    .filter(([k]) => goFold(k) === folded)
    .map(([, v]) => v);
}

function listOf(value: unknown): unknown[] {
  return Array.isArray(value) ? value : [];
}

/**
 * Every file or directory reference of a parsed kustomization, in the fields kustomize loads
 * from (`resources`, `bases`, `components`, `generators`, `transformers`, `validators`, `crds`,
 * `configurations`, `patchesStrategicMerge`, `patches[].path`, `patchesJson6902[].path`,
 * `replacements[].path`, `openapi.path`, and `configMapGenerator`/`secretGenerator` `files`,
 * `envs` and `env`). Non-string entries are skipped (kustomize rejects them itself).
 *
 * @param doc - the parsed kustomization
 */
export function kustomizationReferences(doc: unknown): KustomizationReference[] {
  const out: KustomizationReference[] = [];
  const add = (field: string, value: unknown, directory: boolean) => {
    if (typeof value === 'string') out.push({ field, value, directory });
  };
  const addList = (field: string, list: unknown, directory: boolean) => {
    for (const [i, v] of listOf(list).entries()) add(`${field}[${i}]`, v, directory);
  };
  for (const name of DIRECTORY_LISTS) for (const list of fieldValues(doc, name)) addList(name, list, true);
  for (const name of FILE_LISTS) for (const list of fieldValues(doc, name)) addList(name, list, false);
  for (const name of PATH_OBJECT_LISTS) {
    for (const list of fieldValues(doc, name)) {
      for (const [i, item] of listOf(list).entries()) {
        for (const p of fieldValues(item, 'path')) add(`${name}[${i}].path`, p, false);
      }
    }
  }
  for (const openapi of fieldValues(doc, 'openapi')) {
    for (const p of fieldValues(openapi, 'path')) add('openapi.path', p, false);
  }
  for (const name of GENERATOR_LISTS) {
    for (const list of fieldValues(doc, name)) {
      for (const [i, gen] of listOf(list).entries()) {
        for (const files of fieldValues(gen, 'files')) {
          for (const [j, f] of listOf(files).entries()) {
            // `key=path` or `path` (kustomize's `kv.ParseFileSource`)
            if (typeof f === 'string') add(`${name}[${i}].files[${j}]`, f.slice(f.indexOf('=') + 1), false);
          }
        }
        for (const envs of fieldValues(gen, 'envs')) addList(`${name}[${i}].envs`, envs, false);
        for (const env of fieldValues(gen, 'env')) add(`${name}[${i}].env`, env, false);
      }
    }
  }
  return out;
}

/**
 * YAML's `!!binary` as kustomize's decoder (sigs.k8s.io/yaml over go-yaml v2) reads it: the
 * base64-decoded bytes as a string. The `yaml` package's own tag gives a `Buffer`, which
 * {@link kustomizationReferences} skips as a non-string, so `resources: [!!binary <base64 of
 * http://127.0.0.1:9001/…>]` passed the check while kustomize fetched the URL (loopback, which
 * Go never proxies, so not even the dead proxy stopped it).
 */
const BINARY_AS_GO_READS_IT = {
  tag: 'tag:yaml.org,2002:binary',
  resolve: (src: string) => Buffer.from(src.replace(/\s+/g, ''), 'base64').toString('utf8'),
};

/** The real path of `p`, or `undefined` when it does not exist (kustomize then reports it). */
async function realOrUndefined(p: string): Promise<string | undefined> {
  try {
    return await realpath(p);
  } catch {
    return undefined;
  }
}

function within(root: string, p: string): boolean {
  const rel = posix.relative(root, p);
  return rel === '' || (!rel.startsWith('..') && !posix.isAbsolute(rel));
}

/**
 * Checks the kustomization at `root` and every local kustomization it reaches (bases, components,
 * plugin directories) before kustomize runs. Reads files only; no network.
 *
 * @param root - absolute template root (the directory `kustomize build` gets)
 * @returns `undefined` when kustomize may run, else the refusal (without the step's prefix), e.g.
 *   `kustomization.yaml: resources[0] "https://example.com/x.yaml" is a remote resource: ...`,
 *   `overlay/kustomization.yaml: resources[0] "../../x" is outside the fetched directory`, or a
 *   kustomization that is not YAML (`<file>: <parser error>`: what is not parsed is not checked)
 */
export async function checkKustomizeTree(root: string): Promise<string | undefined> {
  const realRoot = await realpath(root);
  const seen = new Set<string>();
  const visit = async (dir: string): Promise<string | undefined> => {
    if (seen.has(dir)) return undefined;
    seen.add(dir);
    for (const name of KUSTOMIZATION_FILE_NAMES) {
      const file = posix.join(dir, name);
      let text: string;
      try {
        text = await readFile(file, 'utf8');
      } catch {
        continue;
      }
      const shown = posix.relative(realRoot, file);
      let doc: unknown;
      try {
        doc = parse(text, { merge: true, maxAliasCount: 1000, customTags: [BINARY_AS_GO_READS_IT] });
      } catch (err) {
        return `${shown}: ${err instanceof Error ? err.message : String(err)}`;
      }
      for (const ref of kustomizationReferences(doc)) {
        if (ref.value.includes('\n')) continue; // an inline document, not a path
        if (isRemoteReference(ref.value)) {
          return (
            `${shown}: ${ref.field} ${quoteValue(ref.value)} is a remote resource: the kustomize step builds ` +
            'only the fetched files (fetch remote sources with spec.fetch)'
          );
        }
        const real = await realOrUndefined(posix.resolve(dir, ref.value));
        if (real === undefined) continue;
        if (!within(realRoot, real)) {
          return `${shown}: ${ref.field} ${quoteValue(ref.value)} is outside the fetched directory`;
        }
        if (ref.directory && (await stat(real)).isDirectory()) {
          const refused = await visit(real);
          if (refused !== undefined) return refused;
        }
      }
    }
    return undefined;
  };
  return await visit(realRoot);
}
