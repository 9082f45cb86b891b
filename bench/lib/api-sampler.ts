/**
 * The API server's request counter read about once a second through a window, for the mean and
 * peak request rate of each side (`apiRates` in `./steady.ts`): issue 24's "report API requests
 * per second and the peak on the API server for both sides". The readings are taken by a child
 * process (`../api-sampler.ts`), so parsing the server's metrics text each second is not in the
 * benchmark process's CPU-seconds (kapp-lambda's side); call {@link ApiSampler.stop} after the
 * window's last CPU reading, so the child's CPU, reaped then, stays out of it too.
 *
 * @module
 */
import { type ChildProcess, spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { ApiSample } from './steady.js';

/** Sampling interval of the API server's request counter, ms. */
export const API_SAMPLE_INTERVAL_MS = 1000;

const SCRIPT = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'api-sampler.ts');

/** A running sampler. */
export interface ApiSampler {
  /** Takes a last reading, ends the child and returns every reading in order. @throws Error when the child failed. */
  stop(): Promise<ApiSample[]>;
}

/**
 * Starts sampling the API server of `kubeconfigPath` (its current context); resolves once the
 * first reading is in.
 * @throws Error when the child cannot start or its first reading fails (its stderr in the message).
 */
export async function startApiSampler(
  kubeconfigPath: string,
  intervalMs = API_SAMPLE_INTERVAL_MS,
): Promise<ApiSampler> {
  const child: ChildProcess = spawn(process.execPath, ['--import', 'tsx', SCRIPT, kubeconfigPath, String(intervalMs)], {
    stdio: ['ignore', 'pipe', 'pipe'],
    cwd: path.join(path.dirname(SCRIPT), '..'),
  });
  const samples: ApiSample[] = [];
  let stderr = '';
  let partial = '';
  let first: (() => void) | undefined;
  const firstIn = new Promise<void>((resolve) => {
    first = resolve;
  });
  child.stdout?.setEncoding('utf8').on('data', (chunk: string) => {
    const lines = (partial + chunk).split('\n');
    partial = lines.pop() ?? '';
    for (const line of lines) {
      const [at, total] = line.trim().split(' ').map(Number);
      if (Number.isFinite(at) && Number.isFinite(total)) samples.push({ atMs: at as number, total: total as number });
    }
    if (samples.length > 0) first?.();
  });
  child.stderr?.setEncoding('utf8').on('data', (chunk: string) => {
    stderr = (stderr + chunk).slice(-2000);
  });
  const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
  const failed = (code: number | null) => new Error(`api-sampler exited ${code}: ${stderr.trim()}`);
  const code = await Promise.race([firstIn.then(() => 'ok' as const), exited]);
  if (code !== 'ok') throw failed(code);
  return {
    async stop() {
      if (child.exitCode === null) child.kill('SIGTERM');
      const end = await exited;
      if (end !== 0) throw failed(end);
      return samples;
    },
  };
}
