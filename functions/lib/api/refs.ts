/**
 * What an App references: the Secrets and ConfigMaps of its namespace that `spec.fetch` and
 * `spec.template` name, the shapes the planners read them in, and the lookup the stages hand to
 * the planners. Used by every stage and by the forwarder's change tracking (a change to a
 * referenced object re-reconciles the App at once, bypassing the sync timer).
 *
 * Mirrors kapp-controller `pkg/app/app.go` `SecretRefs` / `ConfigMapRefs` (kept on the App, as
 * here with the API types), including what they leave out: sops private-key Secrets,
 * `cluster.kubeconfigSecretRef` and ServiceAccounts are not tracked, so changing them waits for
 * the next sync.
 *
 * Also whether a fetch or a render uses a Secret at all ({@link fetchIsPrivate},
 * {@link templateIsPrivate}): what it makes is then private, sealed for its cluster and never
 * shared with the fleet (`../artifact/sealed.ts`).
 * Also the Secret a PackageInstall's or PackageRepository's `image`/`imgpkgBundle` fetch without
 * a `secretRef` reads: its placeholder `<owner>-fetch-<i>` ({@link placeholderSecretName},
 * {@link wantsPlaceholder}), which the install and index-repo functions create
 * (`packaging/placeholder-secrets.ts`) and the forwarder tracks.
 *
 * @module
 */
import type { AppFetch } from './fetch.js';
import type { AppTemplate } from './template.js';

/**
 * A Secret as the planners read it: the part of the kube port's decoded `KubeSecret`
 * (`functions/lib/kube/port.ts`) they use, so a Secret read by a stage is handed over as is.
 */
export interface SecretLike {
  /** Object metadata; `name` identifies the Secret. */
  metadata?: { name?: string; namespace?: string };
  /** Secret type, e.g. `kubernetes.io/dockerconfigjson`. */
  type?: string;
  /** Key to value, already base64-decoded. */
  data?: Readonly<Record<string, Buffer>>;
}

/** A ConfigMap as the planners read it: the part of the kube port's `KubeConfigMap` they use. */
export interface ConfigMapLike {
  /** Object metadata; `name` identifies the ConfigMap. */
  metadata?: { name?: string; namespace?: string };
  /** Key to UTF-8 value. */
  data?: Readonly<Record<string, string>>;
  /** Key to decoded value (forwarded to vendir, never used for template values, as upstream). */
  binaryData?: Readonly<Record<string, Buffer>>;
}

/**
 * Secrets and ConfigMaps of the App's namespace, looked up by name. `undefined` means not found
 * (the planners then fail with the API server's text, e.g. `secrets "x" not found`).
 */
export interface RefObjects {
  /** Looks up a Secret by name. */
  secret(name: string): SecretLike | undefined;
  /** Looks up a ConfigMap by name. */
  configMap(name: string): ConfigMapLike | undefined;
}

/**
 * Builds a {@link RefObjects} from lists of objects (keyed by `metadata.name`; later duplicates
 * win). Lookups use a `Map`, so names like `__proto__` are safe.
 *
 * @param objects - the Secrets and ConfigMaps the caller fetched
 * @returns a lookup over them
 */
export function refObjectsFrom(objects: { secrets?: SecretLike[]; configMaps?: ConfigMapLike[] }): RefObjects {
  const secrets = new Map<string, SecretLike>();
  const configMaps = new Map<string, ConfigMapLike>();
  for (const s of objects.secrets ?? []) if (s.metadata?.name !== undefined) secrets.set(s.metadata.name, s);
  for (const c of objects.configMaps ?? []) if (c.metadata?.name !== undefined) configMaps.set(c.metadata.name, c);
  return {
    secret: (name) => secrets.get(name),
    configMap: (name) => configMaps.get(name),
  };
}

/** The API server's NotFound text for a Secret: `secrets "<name>" not found`. */
export function secretNotFoundMessage(name: string): string {
  return `secrets "${name}" not found`;
}

/** The API server's NotFound text for a ConfigMap: `configmaps "<name>" not found`. */
export function configMapNotFoundMessage(name: string): string {
  return `configmaps "${name}" not found`;
}

/** The part of an App the reference walk reads. */
export interface AppRefsSpec {
  /** `spec.fetch`. */
  fetch?: readonly AppFetch[];
  /** `spec.template`. */
  template?: readonly AppTemplate[];
}

function sorted(names: Set<string>): string[] {
  return [...names].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
}

/**
 * Names of the Secrets (in the App's namespace) an App references, sorted and unique.
 *
 * Tracked: `fetch[].inline.pathsFrom[].secretRef`, `fetch[].{image,imgpkgBundle,http,git}.secretRef`,
 * `fetch[].helmChart.repository.secretRef`, `template[].ytt.inline.pathsFrom[].secretRef` and
 * `template[].{ytt,helmTemplate,cue}.valuesFrom[].secretRef`. Each entry is read with upstream's
 * `switch` (first matching source only), so an invalid entry with two sources contributes what
 * upstream's would.
 *
 * @param spec - the App's spec (`fetch`, `template`)
 */
export function referencedSecrets(spec: AppRefsSpec): string[] {
  const names = new Set<string>();
  const add = (name: string | undefined): void => {
    names.add(name ?? '');
  };
  for (const f of spec.fetch ?? []) {
    if (f.inline?.pathsFrom) {
      for (const p of f.inline.pathsFrom) if (p.secretRef) add(p.secretRef.name);
    } else if (f.image?.secretRef) add(f.image.secretRef.name);
    else if (f.imgpkgBundle?.secretRef) add(f.imgpkgBundle.secretRef.name);
    else if (f.http?.secretRef) add(f.http.secretRef.name);
    else if (f.git?.secretRef) add(f.git.secretRef.name);
    else if (f.helmChart?.repository) {
      if (f.helmChart.repository.secretRef) add(f.helmChart.repository.secretRef.name);
    }
  }
  for (const t of spec.template ?? []) {
    if (t.ytt) {
      for (const p of t.ytt.inline?.pathsFrom ?? []) if (p.secretRef) add(p.secretRef.name);
      for (const v of t.ytt.valuesFrom ?? []) if (v.secretRef) add(v.secretRef.name);
    } else if (t.helmTemplate?.valuesFrom) {
      for (const v of t.helmTemplate.valuesFrom) if (v.secretRef) add(v.secretRef.name);
    } else if (t.cue?.valuesFrom) {
      for (const v of t.cue.valuesFrom) if (v.secretRef) add(v.secretRef.name);
    }
  }
  return sorted(names);
}

/**
 * Names of the ConfigMaps (in the App's namespace) an App references, sorted and unique.
 *
 * Tracked: `fetch[].inline.pathsFrom[].configMapRef`, `template[].ytt.inline.pathsFrom[].configMapRef`
 * and `template[].{ytt,helmTemplate,cue}.valuesFrom[].configMapRef`.
 *
 * @param spec - the App's spec (`fetch`, `template`)
 */
export function referencedConfigMaps(spec: AppRefsSpec): string[] {
  const names = new Set<string>();
  const add = (name: string | undefined): void => {
    names.add(name ?? '');
  };
  for (const f of spec.fetch ?? []) {
    if (f.inline?.pathsFrom) {
      for (const p of f.inline.pathsFrom) if (p.configMapRef) add(p.configMapRef.name);
    }
  }
  for (const t of spec.template ?? []) {
    if (t.ytt) {
      for (const p of t.ytt.inline?.pathsFrom ?? []) if (p.configMapRef) add(p.configMapRef.name);
      for (const v of t.ytt.valuesFrom ?? []) if (v.configMapRef) add(v.configMapRef.name);
    } else if (t.helmTemplate?.valuesFrom) {
      for (const v of t.helmTemplate.valuesFrom) if (v.configMapRef) add(v.configMapRef.name);
    } else if (t.cue?.valuesFrom) {
      for (const v of t.cue.valuesFrom) if (v.configMapRef) add(v.configMapRef.name);
    }
  }
  return sorted(names);
}

/**
 * True when a fetch uses a Secret: a source with a `secretRef` (credentials of a private
 * source) or an inline `pathsFrom` Secret. ConfigMaps alone keep a fetch shared.
 */
export function fetchIsPrivate(fetch: readonly AppFetch[]): boolean {
  return referencedSecrets({ fetch }).length > 0 || namesSecret(fetch);
}

/**
 * True when any object in `value` has a `secretRef` (or `...SecretRef`) field: the
 * conservative net under the upstream-shaped walk of `referencedSecrets`, which reads only
 * the first source of an entry.
 */
function namesSecret(value: unknown): boolean {
  if (Array.isArray(value)) return value.some(namesSecret);
  if (value === null || typeof value !== 'object') return false;
  return Object.entries(value).some(
    ([k, v]) => ((k === 'secretRef' || k.endsWith('SecretRef')) && v != null) || namesSecret(v),
  );
}

/**
 * True when a render's own inputs include a Secret: a ytt inline `pathsFrom` Secret, a
 * `valuesFrom` Secret of ytt, helmTemplate or cue, or any sops step (its output is decrypted
 * secret material). A private fetch artifact makes the render private too (checked by the caller).
 */
export function templateIsPrivate(templates: readonly AppTemplate[]): boolean {
  return (
    templates.some((t) => t.sops) || referencedSecrets({ template: templates }).length > 0 || namesSecret(templates)
  );
}

/** `<owner>-fetch-<i>`: the placeholder Secret of fetch step `i` (upstream `placeHolderSecretName`). */
export function placeholderSecretName(ownerName: string, index: number): string {
  return `${ownerName}-fetch-${index}`;
}

/**
 * True for a fetch step that gets a placeholder Secret: `image` or `imgpkgBundle` without
 * `secretRef`. Safe on unvalidated shapes (the forwarder reads watched objects with it).
 */
export function wantsPlaceholder(fetch: AppFetch | undefined): boolean {
  if (fetch === null || typeof fetch !== 'object') return false;
  return Boolean((fetch.imgpkgBundle && !fetch.imgpkgBundle.secretRef) || (fetch.image && !fetch.image.secretRef));
}
