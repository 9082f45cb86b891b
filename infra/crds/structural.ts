/**
 * Converts the JSON Schema that zod 4 emits (`z.toJSONSchema`, target `openapi-3.0`, io `input`)
 * into a Kubernetes structural `openAPIV3Schema` (apiextensions.k8s.io/v1).
 *
 * Structural rules kept (k8s.io/apiextensions-apiserver `pkg/apiserver/schema/validation.go`):
 * every node has a `type` (unless it preserves unknown fields); no `$ref`, `allOf`, `oneOf`,
 * `anyOf` or `not`; `additionalProperties` never next to `properties`; a free-form object is
 * `type: object` + `x-kubernetes-preserve-unknown-fields: true`. Value constraints zod adds on its
 * own (safe-integer `minimum`/`maximum`, the RFC 3339 `pattern`) are dropped, so the CRD accepts
 * what upstream's CRD accepts; `maxLength` (from zod `.max()`) is kept; `format` survives only for `int32`, `int64`, `date-time` and `byte`.
 * Any other keyword is an error rather than silently dropped, so a new zod construct cannot leak
 * into a CRD unnoticed.
 *
 * @module
 */

/** A JSON Schema node, as produced by `z.toJSONSchema` or as written into a CRD. */
export type JsonSchema = { [keyword: string]: unknown };

/** `format` values kept in the CRD (the ones upstream uses, plus `int32`/`byte`). */
const KEPT_FORMATS = new Set(['int32', 'int64', 'date-time', 'byte']);

/** Keywords zod emits that the CRD deliberately leaves out (upstream has no such constraints). */
const DROPPED = new Set(['$schema', 'minimum', 'maximum', 'pattern', 'propertyNames']);

/** Keywords handled explicitly below. */
const HANDLED = new Set([
  'type',
  'description',
  'format',
  'nullable',
  'enum',
  'properties',
  'required',
  'items',
  'additionalProperties',
  'maxLength',
]);

const PRESERVE = 'x-kubernetes-preserve-unknown-fields';

function isSchema(value: unknown): value is JsonSchema {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function fail(path: string, message: string): never {
  throw new Error(`structural schema at ${path || '<root>'}: ${message}`);
}

/**
 * Returns the structural form of `schema` (a new object, keys in insertion order; the YAML writer
 * sorts them).
 *
 * @param path Where `schema` sits, for error messages (e.g. `spec.fetch[]`).
 * @throws {Error} `structural schema at <path>: <problem>` for a construct Kubernetes rejects or
 *   this converter does not know (`$ref`, unions other than nullable, `additionalProperties` next
 *   to `properties` without preserve-unknown-fields, a node without `type`, unknown keywords).
 */
export function toStructuralSchema(schema: JsonSchema, path = ''): JsonSchema {
  for (const keyword of ['$ref', 'allOf', 'anyOf', 'oneOf', 'not', '$defs', 'definitions']) {
    if (keyword in schema) fail(path, `unsupported keyword ${keyword}`);
  }
  const out: JsonSchema = {};
  for (const [keyword, value] of Object.entries(schema)) {
    if (HANDLED.has(keyword) || DROPPED.has(keyword)) continue;
    if (keyword.startsWith('x-kubernetes-')) out[keyword] = value;
    else fail(path, `unsupported keyword ${keyword}`);
  }
  const preserve = schema[PRESERVE] === true;

  if (typeof schema.description === 'string') out.description = schema.description;
  if (schema.type !== undefined) {
    if (typeof schema.type !== 'string' || schema.type === 'null')
      fail(path, `unsupported type ${JSON.stringify(schema.type)}`);
    out.type = schema.type;
  } else if (!preserve && schema['x-kubernetes-int-or-string'] !== true) {
    fail(path, 'missing type');
  }
  if (typeof schema.format === 'string' && KEPT_FORMATS.has(schema.format)) out.format = schema.format;
  if (schema.nullable === true) out.nullable = true;
  if (Array.isArray(schema.enum)) out.enum = schema.enum;
  // Bounds the CEL cost estimate of string rules (Package refName/version); upstream has no other.
  if (typeof schema.maxLength === 'number') out.maxLength = schema.maxLength;

  if (schema.properties !== undefined) {
    if (!isSchema(schema.properties)) fail(path, 'properties is not an object');
    const entries = Object.entries(schema.properties);
    if (entries.length > 0) {
      const properties: JsonSchema = {};
      for (const [name, child] of entries) {
        if (!isSchema(child)) fail(`${path}.${name}`, 'not a schema');
        properties[name] = toStructuralSchema(child, path ? `${path}.${name}` : name);
      }
      out.properties = properties;
    }
  }
  if (Array.isArray(schema.required) && schema.required.length > 0) {
    out.required = [...(schema.required as string[])].sort();
  }
  if (schema.items !== undefined) {
    if (!isSchema(schema.items)) fail(path, 'items must be a single schema');
    out.items = toStructuralSchema(schema.items, `${path}[]`);
  }

  const additional = schema.additionalProperties;
  if (additional !== undefined && additional !== false) {
    const freeForm = additional === true || (isSchema(additional) && Object.keys(additional).length === 0);
    if (freeForm) {
      // Unknown keys are only kept when the schema says so; otherwise the API server would prune them.
      if (!preserve) fail(path, `free-form object needs ${PRESERVE}`);
    } else if (out.properties !== undefined) {
      fail(path, 'additionalProperties next to properties');
    } else if (isSchema(additional)) {
      out.additionalProperties = toStructuralSchema(additional, `${path}{}`);
    }
  }
  return out;
}
