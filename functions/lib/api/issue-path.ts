/**
 * The one formatter of zod issue paths, for the API objects (`./parse.ts`) and the event contract
 * (`events/schema.ts`). A leaf: the event contract imports it without the API schemas.
 *
 * @module
 */

const IDENTIFIER = /^[A-Za-z_$][A-Za-z0-9_$]*$/;

/**
 * Formats a zod issue path as a JS-like accessor: `spec.fetch[0].git.url`, `data.items[2]`; keys
 * that are not identifiers are quoted, e.g. `spec.fetch[0].inline.paths[".imgpkg/images.yml"]`,
 * `["weird key"]`. The empty path (the object itself) is `""`: callers that print it say `(root)`.
 */
export function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const key of path) {
    if (typeof key === 'number') out += `[${key}]`;
    else if (typeof key === 'string' && IDENTIFIER.test(key)) out += out === '' ? key : `.${key}`;
    else out += `[${JSON.stringify(String(key))}]`;
  }
  return out;
}
