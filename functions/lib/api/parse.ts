/**
 * Validation at the edge: turn an untyped object (from the API server, a YAML file or a
 * repository bundle) into a typed resource, or an error naming the bad field by its path in the
 * whole object (`spec.fetch[0].git.url`).
 *
 * Before validating, `null` values of object fields are dropped, as the API server prunes nulls
 * of non-nullable CRD fields (apiextensions v1 "Defaulting and Nullable"); fields upstream marks
 * `nullable` (Package `spec.releasedAt`, `spec.valuesSchema.openAPIv3`) keep them. Unknown fields
 * are dropped (the API server prunes them too), except inside `metadata`.
 *
 * @module
 */
import type { z } from 'zod';
import { type App, AppSchema } from './app.js';
import { type Package, type PackageMetadata, PackageMetadataSchema, PackageSchema } from './datapackaging.js';
import { formatPath } from './issue-path.js';
import {
  type PackageInstall,
  PackageInstallSchema,
  type PackageRepository,
  PackageRepositorySchema,
} from './packaging.js';
import {
  AppResource,
  PackageInstallResource,
  PackageMetadataResource,
  PackageRepositoryResource,
  PackageResource,
} from './resources.js';

/** One problem found while parsing. */
export interface ApiIssue {
  /** Path of the bad field in the whole object, e.g. `spec.fetch[0].git.url`; `""` for the object itself. */
  readonly path: string;
  /** zod's message, e.g. `Invalid input: expected string, received number`. */
  readonly message: string;
  /** zod's issue code, e.g. `invalid_type`. */
  readonly code: string;
}

/**
 * Thrown or returned when an object does not match its kind's schema. The message lists every
 * issue as `<path>: <message>`, joined by `; `, after `invalid <Kind> <namespace>/<name>: `.
 */
export class ApiValidationError extends Error {
  /** The kind that was expected, e.g. `App`. */
  readonly kind: string;
  /** Every issue, in zod's order. */
  readonly issues: readonly ApiIssue[];

  /** Builds the error for `kind`; `objectName` is `<namespace>/<name>` or `<name>` when known. */
  constructor(kind: string, issues: readonly ApiIssue[], objectName?: string) {
    const subject = objectName ? `${kind} ${objectName}` : kind;
    super(`invalid ${subject}: ${issues.map((i) => `${i.path || '(root)'}: ${i.message}`).join('; ')}`);
    this.name = 'ApiValidationError';
    this.kind = kind;
    this.issues = issues;
  }
}

/** Outcome of a `parse*` helper: the typed object, or the validation error. Never throws. */
export type ParseResult<T> = { success: true; data: T } | { success: false; error: ApiValidationError };

function isPlainObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value) && !(value instanceof Date);
}

/**
 * Returns a copy of `value` without `null` object-field values (array elements are kept), leaving
 * the values at `keepPaths` (dotted object paths such as `spec.releasedAt`) untouched, subtree
 * included. Mirrors the API server's pruning of nulls in non-nullable CRD fields.
 */
export function pruneNulls(value: unknown, keepPaths: readonly string[] = [], path = ''): unknown {
  if (path !== '' && keepPaths.includes(path)) return value;
  if (Array.isArray(value)) return value.map((item) => pruneNulls(item, keepPaths, `${path}[]`));
  if (!isPlainObject(value)) return value;
  const out: Record<string, unknown> = {};
  for (const [key, child] of Object.entries(value)) {
    const childPath = path === '' ? key : `${path}.${key}`;
    if (child === null && !keepPaths.includes(childPath)) continue;
    out[key] = pruneNulls(child, keepPaths, childPath);
  }
  return out;
}

function objectName(input: unknown): string | undefined {
  if (!isPlainObject(input) || !isPlainObject(input.metadata)) return undefined;
  const { name, namespace } = input.metadata;
  if (typeof name !== 'string' || name === '') return undefined;
  return typeof namespace === 'string' && namespace !== '' ? `${namespace}/${name}` : name;
}

/**
 * Parses `input` with `schema` after {@link pruneNulls}; the generic form of {@link parseApp} and
 * friends, for other schemas of this module.
 */
export function parseWith<S extends z.ZodType>(
  schema: S,
  kind: string,
  input: unknown,
  keepNullPaths: readonly string[] = [],
): ParseResult<z.output<S>> {
  const result = schema.safeParse(pruneNulls(input, keepNullPaths));
  if (result.success) return { success: true, data: result.data };
  const issues = result.error.issues.map((issue) => ({
    path: formatPath(issue.path),
    message: issue.message,
    code: issue.code,
  }));
  return { success: false, error: new ApiValidationError(kind, issues, objectName(input)) };
}

/** Parses an App (`kappctrl.k14s.io/v1alpha1`); `apiVersion` and `kind` must match. */
export function parseApp(input: unknown): ParseResult<App> {
  return parseWith(AppSchema, AppResource.kind, input);
}

/** Parses a PackageInstall (`packaging.carvel.dev/v1alpha1`); `apiVersion` and `kind` must match. */
export function parsePackageInstall(input: unknown): ParseResult<PackageInstall> {
  return parseWith(PackageInstallSchema, PackageInstallResource.kind, input);
}

/** Parses a PackageRepository (`packaging.carvel.dev/v1alpha1`); `spec.fetch` is required. */
export function parsePackageRepository(input: unknown): ParseResult<PackageRepository> {
  return parseWith(PackageRepositorySchema, PackageRepositoryResource.kind, input);
}

/** Paths of a Package where `null` is a stored value (upstream marks them `nullable`). */
const PACKAGE_NULLABLE_PATHS = ['spec.releasedAt', 'spec.valuesSchema.openAPIv3'] as const;

/** Parses a Package (`data.packaging.carvel.dev/v1alpha1`). Shape only; see `./datapackaging.js`. */
export function parsePackage(input: unknown): ParseResult<Package> {
  return parseWith(PackageSchema, PackageResource.kind, input, PACKAGE_NULLABLE_PATHS);
}

/** Parses a PackageMetadata (`data.packaging.carvel.dev/v1alpha1`). */
export function parsePackageMetadata(input: unknown): ParseResult<PackageMetadata> {
  return parseWith(PackageMetadataSchema, PackageMetadataResource.kind, input);
}
