/**
 * `npm run fleet -- <command>`: the fleet's rollouts (issue 28; `functions/lib/rollout/`).
 *
 * ```
 * npm run fleet -- status [-o json|yaml]
 * npm run fleet -- serve [--listen <host:port>]
 * npm run fleet -- rollout apply -f <policy.yml>
 * npm run fleet -- rollout list [-o json|yaml]
 * npm run fleet -- rollout pause|resume|abort <policy> --package <refName>
 * npm run fleet -- rollout delete <policy>
 * ```
 *
 * `status` prints the fleet at a glance (`../functions/lib/fleet/view.ts`, `./fleet-status.ts`);
 * `serve` serves the fleet page of the store, read-only, until stopped (`./fleet-serve.ts`).
 * `apply` validates a RolloutPolicy file and stores it (`state/rollout-policies/<name>.json`,
 * replacing the one of that name); install runs read it within 2 s. `list` prints the policies
 * and their rollouts. `pause` stops releasing waves (released ones go on), `resume` releases
 * again, `abort` freezes the rollout for good (a newer version starts a new one); each is a
 * compare-and-swap of the rollout record. `delete` aborts the policy's moving rollouts (so the
 * runtimes poke their members to select again) and removes the policy: its refNames are no
 * longer gated; its records stay for `list` and the page.
 *
 * The store is the runtime's, as `npm run receipts` finds it: `--store s3://<bucket>/<prefix>` or
 * `file:///<dir>`, default `s3://$KAPP_LAMBDA_BUCKET/…` when set, else the embedded runtime's
 * directory. No cluster is reached.
 *
 * @module
 */
import { readFile } from 'node:fs/promises';
import { parseArgs } from 'node:util';
import { type MetricsServer, parseListenAddress } from '../functions/embedded/metrics-server.js';
import { buildFleetView } from '../functions/lib/fleet/view.js';
import { parseRegistryLocation } from '../functions/lib/kube/cluster-doc.js';
import { commandRollout, type RolloutCommand, RolloutCommandError } from '../functions/lib/rollout/evaluate.js';
import { parseRolloutPolicy, RolloutPolicyError } from '../functions/lib/rollout/policy.js';
import {
  casRollout,
  deletePolicy,
  isFinal,
  listPolicies,
  listRollouts,
  putPolicy,
  type RolloutRecord,
} from '../functions/lib/rollout/state.js';
import type { ObjectStore } from '../functions/lib/store/port.js';
import {
  EXIT,
  exitCodesHelp,
  formatOutput,
  formatTable,
  isUsageError,
  OUTPUT_OPTION,
  type OutputFormat,
  parseOutputFormat,
  runIfEntry,
  usageFailure,
} from './cli.js';
import { registryStore } from './cluster-registry.js';
import { DEFAULT_FLEET_SERVE_ADDRESS, FleetServeError, serveFleet } from './fleet-serve.js';
import { formatFleetStatus } from './fleet-status.js';
import { defaultStoreLocation, missingStoreLine, STORE_DEFAULT_HELP, storeDirMissing } from './receipts.js';

const USAGE = `usage:
  npm run fleet -- status [-o json|yaml]                (default: a table: clusters × PackageInstalls)
  npm run fleet -- serve [--listen <host:port>]         the fleet page and /api/fleet of the store, read-only,
                                                        until Ctrl-C (default ${DEFAULT_FLEET_SERVE_ADDRESS}; another
                                                        host than loopback is served unauthenticated, with a warning)
  npm run fleet -- rollout apply -f <policy.yml>
  npm run fleet -- rollout list [-o json|yaml]          (default: a table)
  npm run fleet -- rollout pause|resume|abort <policy> --package <refName>
  npm run fleet -- rollout delete <policy>               abort its moving rollouts, then remove it (no longer gated)
  (all: --store s3://<bucket>/<prefix> | file:///<dir>, ${STORE_DEFAULT_HELP};
        -h, --help: this text)
${exitCodesHelp('an invalid policy file, no such rollout, a command its status refuses, the store unreachable or (serve) not a directory, the address taken')}`;

/** What {@link main} runs against (tests inject a memory store). */
export interface FleetIo {
  store: (location: string) => ObjectStore;
  readFile: (file: string) => Promise<string>;
  out: (text: string) => void;
  err: (text: string) => void;
  now: () => Date;
  /** Resolves when `serve` should stop; default: on SIGINT or SIGTERM. */
  untilStopped?: () => Promise<void>;
  /**
   * Whether a `file:///` store's directory exists (`undefined` for another store): a command
   * that reads (all but `apply`) stops on a missing one rather than show an empty fleet. Default
   * none: no check. An `io` that replaces `store` replaces (or drops) this too: it checks the
   * location, not the store `store` returns.
   */
  missingDir?: (location: string) => Promise<boolean>;
}

/** Resolves on the first SIGINT or SIGTERM. */
function untilSignal(): Promise<void> {
  return new Promise((resolve) => {
    const stop = () => {
      process.off('SIGINT', stop);
      process.off('SIGTERM', stop);
      resolve();
    };
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
  });
}

/** The real store, files and clock. */
export const REAL_IO: FleetIo = {
  store: (location) => registryStore(location),
  readFile: (file) => readFile(file, 'utf8'),
  out: (t) => process.stdout.write(t),
  err: (t) => process.stderr.write(t),
  now: () => new Date(),
  missingDir: storeDirMissing,
};

function parseFleetArgs(argv: string[]) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      file: { type: 'string', short: 'f' },
      package: { type: 'string' },
      store: { type: 'string' },
      listen: { type: 'string' },
      ...OUTPUT_OPTION,
      help: { type: 'boolean', short: 'h' },
    },
  });
}

/** The wave a rollout has reached: the last released one's name. */
function currentWave(r: RolloutRecord): string {
  return r.waves.findLast((w) => w.releasedAt !== undefined)?.name ?? '-';
}

/** The `rollout list` table: one line per rollout (policies without one show `-`). */
export function formatRollouts(policies: readonly { name: string; packages: string[] }[], rollouts: RolloutRecord[]) {
  const rows = rollouts.map((r) => [
    r.policy,
    r.refName,
    r.from ?? '-',
    r.target,
    r.status,
    `${currentWave(r)} (${r.waves.filter((w) => w.releasedAt).length}/${r.waves.length})`,
    r.cause ?? '',
  ]);
  for (const p of policies) {
    if (!rollouts.some((r) => r.policy === p.name)) rows.push([p.name, p.packages.join(','), '-', '-', '-', '-', '']);
  }
  return formatTable(['POLICY', 'PACKAGE', 'FROM', 'TARGET', 'STATUS', 'WAVE', 'CAUSE'], rows);
}

/**
 * Runs the command line.
 *
 * @returns the exit code ({@link EXIT}): 0, 1 (invalid policy, no such rollout, a refused
 *   command), 2 (usage)
 */
export async function main(argv: string[], env: NodeJS.ProcessEnv = process.env, io: FleetIo = REAL_IO) {
  const usage = (problem: string) => usageFailure('fleet', USAGE, problem, io.err);
  let parsed: ReturnType<typeof parseFleetArgs>;
  let format: OutputFormat | undefined;
  try {
    parsed = parseFleetArgs(argv);
    format = parseOutputFormat(parsed.values.output);
  } catch (err) {
    if (!isUsageError(err)) throw err;
    return usage(err.message);
  }
  const { values: v, positionals } = parsed;
  if (v.help) {
    io.out(USAGE);
    return EXIT.ok;
  }
  const [group, command, policy, extra] = positionals;
  // A malformed --store is a usage error naming the value, before anything is read.
  if (v.store !== undefined) {
    try {
      parseRegistryLocation(v.store);
    } catch (err) {
      return usage(`--store ${JSON.stringify(v.store)}: ${(err as Error).message}`);
    }
  }
  const location = v.store ?? defaultStoreLocation(env);
  const store = () => io.store(location);
  if (v.listen !== undefined && group !== 'serve') return usage('--listen applies to serve only');
  // A directory no runtime has written is no fleet: said, not shown as an empty one (apply creates it).
  if (group !== 'serve' && command !== 'apply' && (await io.missingDir?.(location))) {
    io.err(missingStoreLine('fleet', location));
    return EXIT.failure;
  }
  if (group === 'serve') {
    if (command) return usage(`unexpected argument ${JSON.stringify(command)}`);
    if (format) return usage('-o applies to status and list, not serve');
    const listen = v.listen ?? DEFAULT_FLEET_SERVE_ADDRESS;
    try {
      parseListenAddress(listen);
    } catch {
      return usage(`--listen ${JSON.stringify(listen)}: expected host:port (e.g. 127.0.0.1:8090)`);
    }
    let server: MetricsServer;
    try {
      server = await serveFleet(store(), { location, listen, out: io.out, err: io.err });
    } catch (err) {
      const how = v.listen === undefined ? ' (the default; choose another with --listen <host:port>)' : '';
      io.err(
        `fleet: ${err instanceof FleetServeError ? err.message : `cannot listen on ${listen}${how}: ${(err as Error).message}`}\n`,
      );
      return EXIT.failure;
    }
    await (io.untilStopped ?? untilSignal)();
    await server.close();
    return EXIT.ok;
  }
  if (group === 'status') {
    if (command) return usage(`unexpected argument ${JSON.stringify(command)}`);
    const view = await buildFleetView(store(), {
      now: () => io.now().getTime(),
    });
    io.out(format ? formatOutput(view, format) : formatFleetStatus(view));
    return EXIT.ok;
  }
  if (group !== 'rollout') return usage(group ? `unknown command ${JSON.stringify(group)}` : 'a command is required');
  if (format && command !== 'list') return usage(`-o applies to list, not ${command}`);
  if (command === 'apply') {
    if (!v.file || policy) return usage('apply takes -f <policy.yml> and nothing else');
    let text: string;
    try {
      text = await io.readFile(v.file);
    } catch (err) {
      io.err(`fleet: cannot read ${v.file}: ${err instanceof Error ? err.message : String(err)}\n`);
      return EXIT.failure;
    }
    try {
      const p = parseRolloutPolicy(text);
      await putPolicy(store(), p);
      io.out(
        `rollout policy ${p.metadata.name} applied: ${p.spec.packages.join(', ')} in ${p.spec.waves.length} waves (${p.spec.waves.map((w) => w.name).join(' → ')}), in ${location}\n`,
      );
      return EXIT.ok;
    } catch (err) {
      if (!(err instanceof RolloutPolicyError)) throw err;
      io.err(`fleet: ${v.file}: ${err.message}\n`);
      return EXIT.failure;
    }
  }
  if (command === 'list') {
    if (policy) return usage(`unexpected argument ${JSON.stringify(policy)}`);
    const s = store();
    const [policies, rollouts] = await Promise.all([listPolicies(s), listRollouts(s)]);
    if (format) io.out(formatOutput({ policies, rollouts }, format));
    else
      io.out(
        formatRollouts(
          policies.map((p) => ({ name: p.metadata.name, packages: p.spec.packages })),
          rollouts,
        ),
      );
    return EXIT.ok;
  }
  if (command === 'delete') {
    if (!policy || extra || v.package) return usage('delete takes <policy> and nothing else');
    const s = store();
    if (!(await listPolicies(s)).some((p) => p.metadata.name === policy)) {
      io.err(`fleet: no rollout policy ${policy} (see rollout list)\n`);
      return EXIT.failure;
    }
    const aborted: string[] = [];
    for (const r of await listRollouts(s)) {
      if (r.policy !== policy || isFinal(r.status)) continue;
      const { written } = await casRollout(s, policy, r.refName, (cur) =>
        cur && !isFinal(cur.status) ? commandRollout(cur, 'abort', io.now()) : undefined,
      );
      if (written) aborted.push(`${r.refName} (${r.target})`);
    }
    await deletePolicy(s, policy);
    io.out(
      `rollout policy ${policy} deleted${aborted.length > 0 ? `; aborted: ${aborted.join(', ')}` : ''}: its packages are no longer gated\n`,
    );
    return EXIT.ok;
  }
  if (command !== 'pause' && command !== 'resume' && command !== 'abort') {
    return usage(command ? `unknown rollout command ${JSON.stringify(command)}` : 'a rollout command is required');
  }
  if (!policy || extra || !v.package) return usage(`${command} takes <policy> --package <refName>`);
  const refName = v.package;
  if (!(await listPolicies(store())).some((p) => p.metadata.name === policy)) {
    io.err(`fleet: no rollout policy ${policy} (see rollout list)\n`);
    return EXIT.failure;
  }
  let missing = false;
  try {
    const { record, written } = await casRollout(store(), policy, refName, (r) => {
      missing = !r;
      return r ? commandRollout(r, command as RolloutCommand, io.now()) : undefined;
    });
    if (missing || !record) {
      io.err(`fleet: no rollout of ${refName} under policy ${policy} (see rollout list)\n`);
      return EXIT.failure;
    }
    io.out(`rollout ${policy}/${refName} (${record.target}): ${record.status}${written ? '' : ' (unchanged)'}\n`);
    return EXIT.ok;
  } catch (err) {
    if (!(err instanceof RolloutCommandError)) throw err;
    io.err(`fleet: ${err.message}\n`);
    return EXIT.failure;
  }
}

runIfEntry(import.meta.filename, 'fleet', (argv) => main(argv));
