/**
 * `npm run receipts -- <command>`: an App's reconcile receipts (`functions/lib/receipt/receipt.ts`)
 * and the rollback to one of them (`functions/lib/pipeline/app/rollback.ts`).
 *
 * ```
 * npm run receipts -- list <namespace>/<app> [--cluster <id>] [-o json|yaml]
 * npm run receipts -- rollback <namespace>/<app> <receipt-id> [--cluster <id>]
 * npm run receipts -- rollback <namespace>/<app> --clear
 * ```
 *
 * The store is the runtime's: `--store s3://<bucket>/<prefix>` or `file:///<dir>`; default
 * `s3://$KAPP_LAMBDA_BUCKET/$KAPP_LAMBDA_BUCKET_PREFIX` when `KAPP_LAMBDA_BUCKET` is set (the
 * functions' variables; S3 reached as `npm run cluster` does), else the embedded runtime's
 * directory (`$KAPP_LAMBDA_STORE`, default `~/.cache/kapp-lambda/store`). The App is reached as
 * kubectl does (`--kubeconfig`, else `$KUBECONFIG`, else `~/.kube/config`; `--context`); the
 * cluster id defaults to the context's name, which is the embedded runtime's id of that cluster.
 *
 * `rollback` checks that the receipt exists and its render is stored, then annotates the App
 * (`kapp-lambda.carvel.dev/rollback-to: <id>`, `…/rollback-generation: <its generation>`, a
 * merge patch fenced on the App's resourceVersion). The forwarder turns the change into a run that
 * deploys that render; a later spec change (a new generation) ends the rollback, and `--clear`
 * removes the annotations, which runs the App from its spec again.
 *
 * @module
 */
import { existsSync } from 'node:fs';
import { stat } from 'node:fs/promises';
import { homedir } from 'node:os';
import path from 'node:path';
import { parseArgs } from 'node:util';
import { KubeConfig } from '@kubernetes/client-node';
import { parseRegistryLocation } from '../functions/lib/kube/cluster-doc.js';
import { ClientNodeRestTransport, type RestTransport } from '../functions/lib/kube/transport.js';
import { ROLLBACK_GENERATION_ANNOTATION, ROLLBACK_TO_ANNOTATION } from '../functions/lib/pipeline/app/index.js';
import { listReceipts, type Receipt, type ReceiptOwner, readReceipt } from '../functions/lib/receipt/receipt.js';
import type { ObjectStore } from '../functions/lib/store/port.js';
import { cacheRoot } from '../layers/gobuild.js';
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
import { kubeSourceOf } from './start-settings.js';

/** Where the fleet CLIs' store is when `--store` is absent ({@link defaultStoreLocation}), for their help. */
export const STORE_DEFAULT_HELP =
  "default s3://$KAPP_LAMBDA_BUCKET/$KAPP_LAMBDA_BUCKET_PREFIX when KAPP_LAMBDA_BUCKET is set,\n        else the directory $KAPP_LAMBDA_STORE, else npm start's (~/.cache/kapp-lambda/store)";

const USAGE = `usage:
  npm run receipts -- list <namespace>/<app> [--cluster <id>] [-o json|yaml] (default: a table; --json: -o json)
  npm run receipts -- rollback <namespace>/<app> <receipt-id> [--cluster <id>]
  npm run receipts -- rollback <namespace>/<app> --clear
  (all: --store s3://<bucket>/<prefix> | file:///<dir>, ${STORE_DEFAULT_HELP};
        --kubeconfig <file> [--context <name>], default as kubectl; -h, --help: this text)
${exitCodesHelp('no such receipt, its render gone, the App not patched, the store or API server unreachable')}`;

/** The store location of the runtime: see the module comment. */
export function defaultStoreLocation(env: NodeJS.ProcessEnv = process.env): string {
  if (env.KAPP_LAMBDA_BUCKET) return `s3://${env.KAPP_LAMBDA_BUCKET}/${env.KAPP_LAMBDA_BUCKET_PREFIX ?? ''}`;
  return `file://${path.resolve(env.KAPP_LAMBDA_STORE ?? path.join(cacheRoot(), 'store'))}`;
}

/**
 * Whether `location` is a `file:///` store whose directory does not exist (`false` for S3): no
 * runtime wrote it, so the CLIs say so instead of showing an empty store.
 */
export async function storeDirMissing(location: string): Promise<boolean> {
  const loc = parseRegistryLocation(location);
  return loc.kind === 'dir' && !(await stat(loc.root).catch(() => undefined))?.isDirectory();
}

/** The line a fleet CLI prints for a {@link storeDirMissing} store (`cli` its name, e.g. `fleet`). */
export function missingStoreLine(cli: string, location: string): string {
  return `${cli}: --store ${location}: no such directory (no runtime has written it: npm start keeps its store there; the demo removes its own when it ends)\n`;
}

/** Short form of a sha256 hex (its first 12 characters), `-` when absent. */
function short(hex: string | undefined): string {
  return hex ? hex.slice(0, 12) : '-';
}

/** Tools of a receipt as `tool×n` (in order of first run), `-` when none ran. */
function toolsOf(r: Receipt): string {
  const counts = new Map<string, number>();
  for (const t of r.tools) counts.set(t.tool, (counts.get(t.tool) ?? 0) + 1);
  return counts.size === 0 ? '-' : [...counts].map(([t, n]) => (n > 1 ? `${t}×${n}` : t)).join(',');
}

/** Digest (or, for a sealed artifact, `sealed`) of a receipt's input, short. */
function digestOf(a: Receipt['inputs']['render']): string {
  return a ? (a.private ? 'sealed' : short(a.digest)) : '-';
}

/**
 * The `list` table, newest first: id, time (the run's start, UTC), generation, outcome, fetch
 * and render digests (12 characters), tools, duration (start to end, s) and estimated cost (USD).
 * `active` names the receipt the App is rolled back to, marked `*`.
 */
export function formatReceipts(receipts: readonly Receipt[], active?: string): string {
  const rows = [...receipts]
    .sort((a, b) => (a.id < b.id ? 1 : -1))
    .map((r) => [
      `${r.id === active ? '*' : ''}${r.id}`,
      r.startedAt.replace(/\.\d+Z$/, 'Z'),
      String(r.generation),
      r.rollbackOf ? `${r.outcome} (rollback to ${r.rollbackOf})` : r.outcome,
      digestOf(r.inputs.fetch),
      digestOf(r.inputs.render),
      toolsOf(r),
      `${((Date.parse(r.endedAt) - Date.parse(r.startedAt)) / 1000).toFixed(1)}s`,
      `$${r.cost.usd.toFixed(7)}`,
    ]);
  const head = ['RECEIPT', 'TIME', 'GEN', 'OUTCOME', 'FETCH', 'RENDER', 'TOOLS', 'DURATION', 'COST'];
  const table = formatTable(head, rows);
  const failed = receipts.filter((r) => r.error);
  const errors = failed.length
    ? `\nerrors:\n${failed.map((r) => `  ${r.id}: ${r.error?.split('\n')[0] ?? ''}`).join('\n')}\n`
    : '';
  return `${table}${errors}`;
}

/** The App's `metadata` as the API server has it (annotations, generation, resourceVersion). */
interface AppMeta {
  generation?: number;
  resourceVersion?: string;
  annotations?: Record<string, string>;
}

function appPath(ns: string, name: string): string {
  return `/apis/kappctrl.k14s.io/v1alpha1/namespaces/${encodeURIComponent(ns)}/apps/${encodeURIComponent(name)}`;
}

/** Reads the App's metadata. @throws Error when the App cannot be read. */
async function readApp(kube: RestTransport, ns: string, name: string): Promise<AppMeta> {
  const res = await kube.send({ method: 'GET', path: appPath(ns, name) });
  if (res.statusCode !== 200) throw new Error(`reading App ${ns}/${name}: HTTP ${res.statusCode}`);
  return (res.body as { metadata: AppMeta }).metadata;
}

/**
 * The merge patch that rolls an App back to receipt `id` at `meta.generation` (or, `id`
 * undefined, clears the rollback: `rollback-to` becomes `""` and the generation is removed),
 * fenced on `meta.resourceVersion`.
 */
export function rollbackPatch(meta: AppMeta, id: string | undefined): Record<string, unknown> {
  return {
    metadata: {
      resourceVersion: meta.resourceVersion,
      annotations: {
        // Cleared as "" (not removed): the reconcile step runs a `modified` event at once only
        // for an App carrying this key, so a duplicated event of any other App stays a no-op.
        [ROLLBACK_TO_ANNOTATION]: id ?? '',
        [ROLLBACK_GENERATION_ANNOTATION]: id ? String(meta.generation ?? 0) : null,
      },
    },
  };
}

/** What {@link main} runs against: the store and the App's API server (tests inject both). */
export interface ReceiptsIo {
  store: (location: string) => ObjectStore;
  kube: (kubeconfig: string | undefined, context: string | undefined) => { rest: RestTransport; context: string };
  /** Whether a `file:///` store's directory is missing; default {@link storeDirMissing}. */
  missingDir?: (location: string) => Promise<boolean>;
  out: (text: string) => void;
  err: (text: string) => void;
}

/** The real store and API server (S3 or a directory; the kubeconfig kubectl would use). */
export const REAL_IO: ReceiptsIo = {
  store: (location) => registryStore(location),
  kube: (kubeconfig, context) => {
    // `npm start`'s choice (controller-runtime's order): with none, client-node's loadFromDefault
    // would make up a `loaded-context` on http://localhost:8080, whose errors name neither.
    if (!kubeconfig && kubeSourceOf(process.env, homedir(), existsSync).kind === 'local') {
      throw new Error(
        'no kubeconfig: pass --kubeconfig <file> (npm start prints its path) or set KUBECONFIG; list --cluster <id> reads the store without one',
      );
    }
    const kc = new KubeConfig();
    if (kubeconfig) kc.loadFromFile(kubeconfig);
    else kc.loadFromDefault();
    if (context) kc.setCurrentContext(context);
    return { rest: kc.makeApiClient(ClientNodeRestTransport), context: kc.getCurrentContext() };
  },
  out: (t) => process.stdout.write(t),
  err: (t) => process.stderr.write(t),
};

/** The command line's options (`node:util` `parseArgs`, strict: an unknown option throws). */
function parseReceiptsArgs(argv: string[]) {
  return parseArgs({
    args: argv,
    allowPositionals: true,
    strict: true,
    options: {
      cluster: { type: 'string' },
      store: { type: 'string' },
      kubeconfig: { type: 'string' },
      context: { type: 'string' },
      clear: { type: 'boolean' },
      json: { type: 'boolean' },
      ...OUTPUT_OPTION,
      help: { type: 'boolean', short: 'h' },
    },
  });
}

/**
 * Runs the command line.
 *
 * @returns the exit code ({@link EXIT}): 0 (`--help` too, on stdout), 1 (no such receipt, render
 *   gone, App not patched), 2 (usage: an unknown command or option, a malformed argument).
 */
export async function main(argv: string[], env: NodeJS.ProcessEnv = process.env, io: ReceiptsIo = REAL_IO) {
  const usage = (problem: string) => usageFailure('receipts', USAGE, problem, io.err);
  let parsed: ReturnType<typeof parseReceiptsArgs>;
  let format: OutputFormat | undefined;
  try {
    parsed = parseReceiptsArgs(argv);
    format = parseOutputFormat(parsed.values.output) ?? (parsed.values.json ? 'json' : undefined);
  } catch (err) {
    if (!isUsageError(err)) throw err;
    return usage(err.message);
  }
  const { values: v, positionals } = parsed;
  if (v.help) {
    io.out(USAGE);
    return EXIT.ok;
  }
  const [command, target, id] = positionals;
  if (command !== 'list' && command !== 'rollback') {
    return usage(command ? `unknown command ${JSON.stringify(command)}` : 'a command is required');
  }
  if (format && command !== 'list') return usage(`-o applies to list, not ${command}`);
  const m = /^([a-z0-9][a-z0-9.-]*)\/([a-z0-9][a-z0-9.-]*)$/.exec(target ?? '');
  const ns = m?.[1];
  const name = m?.[2];
  if (!ns || !name) return usage(`expected <namespace>/<app>, not ${JSON.stringify(target ?? '')}`);
  const wellFormed = (command === 'list' && !id) || (command === 'rollback' && (v.clear ? !id : Boolean(id)));
  if (!wellFormed) {
    return usage(
      command === 'list' ? `unexpected argument ${JSON.stringify(id)}` : 'rollback takes a <receipt-id> or --clear',
    );
  }
  const location = v.store ?? defaultStoreLocation(env);
  if (await (io.missingDir ?? storeDirMissing)(location)) {
    io.err(missingStoreLine('receipts', location));
    return EXIT.failure;
  }
  const store = io.store(location);
  // The App's API server is needed for a rollback, and for the default cluster id.
  const kube = command === 'rollback' || !v.cluster ? io.kube(v.kubeconfig, v.context) : undefined;
  const owner: ReceiptOwner = { clusterId: v.cluster ?? kube?.context ?? '', namespace: ns, name };
  if (command === 'list') {
    const receipts = await listReceipts(store, owner);
    if (format) {
      io.out(formatOutput(receipts, format));
      return EXIT.ok;
    }
    const active = kube ? (await readApp(kube.rest, ns, name).catch(() => undefined))?.annotations : undefined;
    if (receipts.length === 0) {
      io.err(`no receipts of App ${ns}/${name} in cluster ${owner.clusterId}\n`);
      return 0;
    }
    io.out(formatReceipts(receipts, active?.[ROLLBACK_TO_ANNOTATION]));
    return 0;
  }
  const rest = (kube as { rest: RestTransport }).rest;
  const meta = await readApp(rest, ns, name);
  if (id) {
    const receipt = await readReceipt(store, owner, id).catch(() => undefined);
    const render = receipt?.inputs.render?.key;
    if (!receipt || !render) {
      io.err(`receipt ${id} of App ${ns}/${name} ${receipt ? 'has no rendered manifest' : 'not found'}\n`);
      return 1;
    }
    if (!(await store.head(render))) {
      io.err(`the rendered manifest of receipt ${id} is no longer stored (${render})\n`);
      return 1;
    }
  }
  const res = await rest.send({
    method: 'PATCH',
    path: appPath(ns, name),
    body: rollbackPatch(meta, id),
    contentType: 'application/merge-patch+json',
  });
  if (res.statusCode !== 200) {
    io.err(`annotating App ${ns}/${name}: HTTP ${res.statusCode} (retry: it changed meanwhile)\n`);
    return 1;
  }
  io.out(
    id
      ? `App ${ns}/${name} rolls back to receipt ${id} at generation ${meta.generation ?? 0} (until its spec changes or --clear)\n`
      : `App ${ns}/${name}: rollback cleared\n`,
  );
  return 0;
}

runIfEntry(import.meta.filename, 'receipts', (argv) => main(argv));
