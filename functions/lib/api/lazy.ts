/**
 * Values built on first use instead of at import (issue 24 item 7): what a module builds at its
 * top level every cold start pays for before the handler runs, needed or not. Zod schemas are the
 * costly kind (zod's classic API binds every method to every schema it constructs); the schema
 * of a path an invocation rarely takes (a cluster document read from the fleet registry, a stored
 * receipt read back) is built by the first call that parses with it. No imports: any module may
 * use it.
 *
 * @module
 */

/**
 * Wraps `build` so that it runs on the first call only; later calls return the same value.
 * A `build` that throws is called again on the next call (nothing is kept).
 *
 * @param build - makes the value; called at most once when it succeeds.
 * @returns a getter of the value.
 */
export function lazily<T>(build: () => T): () => T {
  let made = false;
  let value: T | undefined;
  return () => {
    if (!made) {
      value = build();
      made = true;
    }
    return value as T;
  };
}
