/**
 * The kapp-controller API as zod schemas and inferred types: App (`kappctrl.k14s.io`),
 * PackageInstall and PackageRepository (`packaging.carvel.dev`), Package and PackageMetadata
 * (`data.packaging.carvel.dev`), all `v1alpha1`. These schemas are the single source of truth:
 * the CRDs in `infra/crds/` are generated from them (`npm run gen:crds`).
 *
 * @module
 */
export * from './app.js';
export * from './common.js';
export * from './constants.js';
export * from './datapackaging.js';
export * from './defaults.js';
export * from './deploy.js';
export * from './duration.js';
export * from './fetch.js';
export * from './issue-path.js';
export * from './packaging.js';
export * from './parse.js';
export * from './refs.js';
export * from './resources.js';
export * from './status.js';
export * from './template.js';
