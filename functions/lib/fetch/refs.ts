/**
 * The Secrets and ConfigMaps an App references, for change tracking: a change to one of them
 * re-reconciles the App at once (bypassing the sync timer).
 *
 * Mirrors kapp-controller `pkg/app/app.go` `SecretRefs` / `ConfigMapRefs`, including what they leave
 * out: sops private-key Secrets, `cluster.kubeconfigSecretRef` and ServiceAccounts are not tracked,
 * so changing them waits for the next sync.
 *
 * @module
 */
import type { AppTemplate } from '../template/types.js';
import type { AppFetch } from './types.js';

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
