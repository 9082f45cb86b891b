/**
 * What the project's command lines share (`npm run cluster`, `npm run receipts`, `npm start`):
 * the exit codes, the `-o json|yaml` output of the commands that print data, the usage-error
 * path (message and usage on stderr, exit 2; `--help` prints the usage on stdout, exit 0, as
 * kubectl and kctrl do) and the entry that runs `main` when the script is the process's entry
 * file. A thrown error prints as `<name>: <message>[: <cause>]` with exit code 1: the cause (an
 * S3, filesystem or API error) is what tells a user why (no credentials, no network).
 *
 * The options are parsed with Node's own `node:util` `parseArgs` (strict: an unknown option or
 * a missing value throws a `TypeError` with an `ERR_PARSE_ARGS_*` code, here a usage error): it
 * covers these flat command lines without another dependency.
 *
 * @module
 */
import path from 'node:path';
import { stringify } from 'yaml';

/** Exit codes of every command line: 0 success, 1 failure (the command ran and failed), 2 usage error. */
export const EXIT = Object.freeze({ ok: 0, failure: 1, usage: 2 });

/** The exit-code paragraph each command's usage ends with (`--help`); `failure` says what fails. */
export function exitCodesHelp(failure: string): string {
  return `exit codes: 0 success; 1 failure (${failure}); 2 usage error (unknown command or option, missing or invalid argument: the message is on stderr)\n`;
}

/** Formats of `-o`/`--output`; without it a command prints its human output (lines or a table). */
export const OUTPUT_FORMATS = ['json', 'yaml'] as const;

/** One of {@link OUTPUT_FORMATS}. */
export type OutputFormat = (typeof OUTPUT_FORMATS)[number];

/** The `-o`/`--output` option, for `parseArgs`'s `options`. */
export const OUTPUT_OPTION = { output: { type: 'string', short: 'o' } } as const;

/** A command line the command cannot run: exit code 2, the message on stderr with the usage. */
export class UsageError extends Error {}

/**
 * The `-o` value as a format.
 *
 * @returns `undefined` when absent (the human output)
 * @throws {UsageError} for another value
 */
export function parseOutputFormat(value: string | undefined): OutputFormat | undefined {
  if (value === undefined) return undefined;
  if ((OUTPUT_FORMATS as readonly string[]).includes(value)) return value as OutputFormat;
  throw new UsageError(`-o expects ${OUTPUT_FORMATS.join(' or ')}, not ${JSON.stringify(value)}`);
}

/** `data` as the text `-o <format>` prints: indented JSON, or one YAML document; ends with a newline. */
export function formatOutput(data: unknown, format: OutputFormat): string {
  return format === 'json' ? `${JSON.stringify(data, null, 2)}\n` : stringify(data);
}

/** Whether `err` is a usage error: a {@link UsageError} or `parseArgs`'s (`ERR_PARSE_ARGS_*`). */
export function isUsageError(err: unknown): err is Error {
  if (err instanceof UsageError) return true;
  const code = (err as { code?: unknown } | null)?.code;
  return err instanceof Error && typeof code === 'string' && code.startsWith('ERR_PARSE_ARGS_');
}

/**
 * The usage-error path: `<name>: <message>` and the usage on stderr. Node's `parseArgs` text for
 * an unknown option ends in advice to place it after `--`, which under `npm run x -- …` reads as
 * nonsense: it is cut to `Unknown option '<opt>'`.
 *
 * @returns {@link EXIT}.usage
 */
export function usageFailure(name: string, usage: string, message: string, err: (t: string) => void): number {
  const shown = message.replace(/^(Unknown option '[^']*')\. To specify a positional argument.*$/s, '$1');
  err(`${name}: ${shown}\n${usage}`);
  return EXIT.usage;
}

/**
 * What to do about an error a user can fix from the shell, as a clause to append (`''` when none
 * is known): the AWS SDK's `Region is missing` (no `AWS_REGION`, no profile region) names no
 * variable.
 */
export function errorHint(err: unknown): string {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 5; e = e.cause, depth++) {
    if (/Region is missing/.test(e.message)) return " (set AWS_REGION to the bucket's region)";
  }
  return '';
}

/**
 * Runs `main(process.argv.slice(2))` when `filename` (the caller's `import.meta.filename`) is
 * the entry file, and sets the exit code it returns: 1 for a thrown error, 2 for a thrown
 * usage error ({@link isUsageError}).
 *
 * @param filename - the calling module's `import.meta.filename`
 * @param name - prefix of the error line, e.g. `cluster`
 * @param main - the command; resolves to the exit code
 */
export function runIfEntry(filename: string, name: string, main: (argv: string[]) => Promise<number>): void {
  if (!process.argv[1] || path.resolve(process.argv[1]) !== filename) return;
  // The pinned AWS SDK works on Node 20; its notice about future releases is noise on stderr.
  process.env.AWS_SDK_JS_NODE_VERSION_SUPPORT_WARNING_DISABLED ??= 'true';
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : '';
      process.stderr.write(`${name}: ${err instanceof Error ? err.message : String(err)}${cause}${errorHint(err)}\n`);
      process.exitCode = isUsageError(err) ? EXIT.usage : EXIT.failure;
    },
  );
}

/**
 * A plain-text table: `head` and `rows` in columns two spaces apart, each as wide as its widest
 * cell, trailing blanks trimmed; one line each, ending in a newline.
 */
export function formatTable(head: readonly string[], rows: readonly (readonly string[])[]): string {
  const table = [head, ...rows];
  const widths = head.map((_, i) => Math.max(...table.map((row) => (row[i] ?? '').length)));
  return table
    .map((row) =>
      row
        .map((c, i) => c.padEnd(widths[i] ?? 0))
        .join('  ')
        .trimEnd(),
    )
    .map((line) => `${line}\n`)
    .join('');
}
