/**
 * Zod pieces for settings read from an environment map, shared by the Lambda functions'
 * configuration (`../entry/config.ts`) and the forwarder's (`events/forwarder/config.ts`).
 * A blank value (empty or whitespace) counts as unset everywhere. Problems name the variable;
 * values are not echoed unless a helper says so (a misplaced secret stays out of logs).
 *
 * @module
 */
import { isAbsolute } from 'node:path';
import * as z from 'zod';

/** `undefined` for a blank string (empty or whitespace only), anything else unchanged. */
export const blankToUndefined = (v: unknown): unknown => (typeof v === 'string' && v.trim() === '' ? undefined : v);

/**
 * `s`, or `undefined` when the variable is unset or blank.
 *
 * @param s - The schema of a set value.
 */
export const optional = <T extends z.ZodType>(s: T) => z.preprocess(blankToUndefined, s.optional());

/**
 * `s`, with a blank value handled as unset (so `s` reports it as missing).
 *
 * @param s - The schema of the value; its `invalid_type` error is the "required" message.
 */
export const required = <T extends z.ZodType>(s: T) => z.preprocess(blankToUndefined, s);

/**
 * Splits a comma list, trimming each entry and dropping empty ones; unset is `[]`.
 *
 * @param v - e.g. `" a, b,,c "` → `['a', 'b', 'c']`.
 */
export function commaList(v: string | undefined): string[] {
  return (v ?? '')
    .split(',')
    .map((s) => s.trim())
    .filter((s) => s.length > 0);
}

/**
 * An integer in `[min, max]` written as text. Problem: `expected an integer in [<min>, <max>]`,
 * followed by `, received "<text>"` when `echo` is set (for knobs that can never hold a secret).
 *
 * @param min - Smallest accepted value.
 * @param max - Largest accepted value.
 * @param echo - Whether the problem quotes the text. Default false.
 */
export function intText(min: number, max: number, echo = false) {
  return z.string().transform((v, ctx) => {
    const n = Number(v);
    if (!Number.isInteger(n) || n < min || n > max) {
      const received = echo ? `, received ${JSON.stringify(v)}` : '';
      ctx.addIssue({ code: 'custom', message: `expected an integer in [${min}, ${max}]${received}` });
      return z.NEVER;
    }
    return n;
  });
}

/** An `http://` or `https://` URL with a host. Problems: `required`, `expected an http:// or https:// URL`. */
export const httpUrl = z
  .string({ error: 'required' })
  .refine((v) => /^https?:\/\/[^\s/]+/.test(v) && URL.canParse(v), { error: 'expected an http:// or https:// URL' });

/**
 * An absolute path without `..` segments, `dflt` when unset or blank. Problem:
 * `expected an absolute path without ..`.
 *
 * @param dflt - The default path.
 */
export const absPath = (dflt: string) =>
  z.preprocess(
    blankToUndefined,
    z
      .string()
      .refine((v) => isAbsolute(v) && !v.split('/').includes('..'), { error: 'expected an absolute path without ..' })
      .default(dflt),
  );

/**
 * JSON text whose value matches `inner`. Problems: `expected JSON (<what>)` when it does not
 * parse, `expected <what>` when it does not match (the text is not quoted).
 *
 * @param inner - Schema of the decoded value.
 * @param what - What the value should be, e.g. `an array of strings`.
 */
export const json = <T extends z.ZodType>(inner: T, what: string) =>
  z.string().transform((v, ctx) => {
    let parsed: unknown;
    try {
      parsed = JSON.parse(v);
    } catch {
      ctx.addIssue({ code: 'custom', message: `expected JSON (${what})` });
      return z.NEVER;
    }
    const r = inner.safeParse(parsed);
    if (!r.success) {
      ctx.addIssue({ code: 'custom', message: `expected ${what}` });
      return z.NEVER;
    }
    return r.data as z.infer<T>;
  });

/**
 * One problem line of an environment schema issue: `<VAR>: <message>` (`(env)` when the issue is
 * about the whole map).
 *
 * @param issue - An issue of a schema over the environment object.
 */
export function envProblem(issue: z.core.$ZodIssue): string {
  return `${String(issue.path[0] ?? '(env)')}: ${issue.message}`;
}

/**
 * One row of the configuration reference: an environment variable (or a `kapp-controller-config`
 * key) as documented next to the code that reads it. `docs/configuration.md`'s tables are
 * generated from these rows (`npm run gen:config`, `scripts/gen-config.ts`), and
 * `test/unit/config-reference.test.ts` fails when a variable the code reads has no row.
 */
export interface SettingDoc {
  /** The variable or key, e.g. `KAPP_LAMBDA_BUCKET`; several when they are documented together. */
  readonly name: string | readonly string[];
  /** Marks a `kapp-controller-config` key kapp-lambda added (rendered `(ours)`). */
  readonly ours?: boolean;
  /** The value when unset, as prose (Markdown): `required`, `30s`, `none`, … */
  readonly default: string;
  /** What it does (Markdown, one line). */
  readonly meaning: string;
  /** Which program or function reads it (Markdown). */
  readonly readBy: string;
}
