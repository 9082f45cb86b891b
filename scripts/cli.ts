/**
 * The entry shared by the project's command-line scripts (`npm run cluster`, `npm run receipts`):
 * runs `main` when the script is the process's entry file (not when a test imports it), sets
 * the exit code it returns, and prints a thrown error as `<name>: <message>[: <cause>]` with
 * exit code 1. The cause (an S3, filesystem or API error) is what tells a user why: no
 * credentials, no network.
 *
 * @module
 */
import path from 'node:path';

/**
 * Runs `main(process.argv.slice(2))` when `filename` (the caller's `import.meta.filename`) is
 * the entry file.
 *
 * @param filename - the calling module's `import.meta.filename`
 * @param name - prefix of the error line, e.g. `cluster`
 * @param main - the command; resolves to the exit code
 */
export function runIfEntry(filename: string, name: string, main: (argv: string[]) => Promise<number>): void {
  if (!process.argv[1] || path.resolve(process.argv[1]) !== filename) return;
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (err: unknown) => {
      const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : '';
      process.stderr.write(`${name}: ${err instanceof Error ? err.message : String(err)}${cause}\n`);
      process.exitCode = 1;
    },
  );
}
