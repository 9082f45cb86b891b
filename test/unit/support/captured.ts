/**
 * Runs a command line's main with process.stdout and process.stderr captured (the cluster CLI
 * writes to them).
 *
 * @returns its exit code and what it wrote on each stream
 */
export async function captured(fn: () => Promise<number>): Promise<{ code: number; out: string; err: string }> {
  const out: string[] = [];
  const err: string[] = [];
  const write = process.stdout.write.bind(process.stdout);
  const errWrite = process.stderr.write.bind(process.stderr);
  process.stdout.write = ((s: string) => out.push(s) > 0) as typeof process.stdout.write;
  process.stderr.write = ((s: string) => err.push(s) > 0) as typeof process.stderr.write;
  try {
    const code = await fn();
    return { code, out: out.join(''), err: err.join('') };
  } finally {
    process.stdout.write = write;
    process.stderr.write = errWrite;
  }
}
