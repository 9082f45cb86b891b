/**
 * List-then-watch for one resource in one scope (all namespaces, or one namespace), without a
 * cache: what client-go's Reflector does, minus the store.
 *
 * - List in pages of `pageSize`, then watch from the list's resourceVersion with bookmarks.
 * - A watch that ends (server timeout, dropped connection, error) resumes from the last
 *   resourceVersion it saw (an event's or a bookmark's), so nothing is replayed or skipped.
 * - 410 Gone (from the watch, or an expired `continue` token) means the resourceVersion is too
 *   old: list again (`relist`); the handler diffs the list against what it already forwarded.
 * - A watchdog ends a watch that delivered nothing, not even a bookmark, for `stallTimeoutMs`
 *   (a half-open connection looks exactly like a quiet one), and the watch resumes at once.
 * - Other failures retry with exponential backoff and jitter ({@link backoffDelay}); the
 *   attempt counter resets once a list completes or a watch delivers something. A watch that
 *   ends without delivering anything also backs off, so a server that closes every watch at
 *   once cannot make the loop spin.
 *
 * Mirrors the behaviour of client-go `tools/cache/reflector.go` (`ListAndWatch`, randomized
 * watch timeouts, `isExpiredError` → relist).
 *
 * @module
 */
import {
  type KubeObject,
  type ObjectWatcher,
  type ResourceKind,
  type WatchEvent,
  WatchGoneError,
} from '../../functions/lib/kube/port.js';
import { type BackoffOptions, backoffDelay } from './backoff.js';
import { type Clock, sleep, type TimerHandle } from './clock.js';
import type { ForwarderLogger } from './log.js';

/** `initial`: the first list of this reflector (nothing forwarded yet); `relist`: after 410. */
export type ListMode = 'initial' | 'relist';

/** Receives what a {@link Reflector} sees. Must not throw. */
export interface ReflectorHandler {
  /** A full list starts (it may restart after a failed page: then `listStart` comes again). */
  listStart(mode: ListMode): void;
  /** One listed object, page by page, in server order. */
  listItem(obj: KubeObject, mode: ListMode): void;
  /** The list completed: objects not seen since `listStart` are gone. */
  listEnd(mode: ListMode): void;
  /** One watch event (never `BOOKMARK`). */
  event(event: WatchEvent): void;
  /**
   * The loop's health changed: `false` when a list or watch failed (other than 410) or the
   * watchdog ended a stalled watch, so changes may be going unseen; `true` again once a list
   * completes or a watch delivers something (an event or a bookmark). Called on changes only;
   * the loop starts healthy.
   */
  health?(healthy: boolean): void;
}

/** Counters of one reflector; the forwarder sums them. */
export interface ReflectorCounters {
  /** Completed lists (initial and relists). */
  lists: number;
  /** 410 Gone seen (each leads to a relist). */
  gone: number;
  /** Watches started. */
  watches: number;
  /** Watches ended by the watchdog. */
  stalls: number;
  /** Failed list or watch calls (other than 410). */
  errors: number;
}

/** Options of {@link Reflector}. Times in milliseconds unless named otherwise. */
export interface ReflectorOptions {
  /** The list/watch port. */
  watcher: ObjectWatcher;
  /** What to watch. */
  resource: ResourceKind;
  /** One namespace, or `undefined` for all. */
  namespace?: string;
  /** Field selector of the list and the watch (e.g. `metadata.name=<name>`), or none. */
  fieldSelector?: string;
  /** Label selector of the list and the watch (e.g. `kapp.k14s.io/app`), or none. */
  labelSelector?: string;
  /** Ask for metadata only (`PartialObjectMetadata`); the handler then sees no spec or status. */
  metadataOnly?: boolean;
  /** List page size (`limit`). */
  pageSize: number;
  /**
   * Server-side watch timeout in seconds; each watch asks for a uniform value in `[t, 2t)`
   * so many watches do not end together (client-go does the same).
   */
  watchTimeoutSeconds: number;
  /** Watchdog: end a watch that delivered nothing for this long. */
  stallTimeoutMs: number;
  /** Retry backoff. */
  backoff?: BackoffOptions;
  /** Time and timers. */
  clock: Clock;
  /** Uniform `[0, 1)` source (backoff jitter, watch timeout spread). */
  random: () => number;
  /** Logger. */
  logger: ForwarderLogger;
}

function isGone(err: unknown): boolean {
  return err instanceof WatchGoneError || (err as { statusCode?: unknown } | null)?.statusCode === 410;
}

/** See the module comment. */
export class Reflector {
  /** Last resourceVersion seen (list, event or bookmark); `undefined` before the first list or after 410. */
  resourceVersion: string | undefined;
  /** Counters. */
  readonly counters: ReflectorCounters = { lists: 0, gone: 0, watches: 0, stalls: 0, errors: 0 };
  /** Resolves when the first list completed. */
  readonly listed: Promise<void>;
  private resolveListed!: () => void;

  constructor(
    private readonly opts: ReflectorOptions,
    private readonly handler: ReflectorHandler,
  ) {
    this.listed = new Promise((resolve) => {
      this.resolveListed = resolve;
    });
  }

  /** `<apiVersion>/<kind>` plus the namespace, for logs. */
  get name(): string {
    return `${this.opts.resource.apiVersion}/${this.opts.resource.kind}${this.opts.namespace ? ` in ${this.opts.namespace}` : ''}`;
  }

  /**
   * Lists and watches until `signal` aborts. Never rejects: every failure is retried.
   *
   * @param signal - Stops the loop (and the current list or watch).
   */
  async run(signal: AbortSignal): Promise<void> {
    let attempt = 0;
    let goneStreak = 0;
    let listedOnce = false;
    this.healthy = true;
    const backoff = async (err: unknown, what: string) => {
      const delay = backoffDelay(attempt++, this.opts.random, this.opts.backoff);
      this.opts.logger.warn({ err, resource: this.name, attempt, retryInMs: delay }, `${what} failed; retrying`);
      await sleep(this.opts.clock, delay, signal);
    };
    while (!signal.aborted) {
      try {
        if (this.resourceVersion === undefined) {
          const mode: ListMode = listedOnce ? 'relist' : 'initial';
          const rv = await this.listAll(mode, signal);
          if (signal.aborted) break;
          this.resourceVersion = rv;
          this.counters.lists++;
          this.setHealthy(true);
          attempt = 0;
          if (!listedOnce) {
            listedOnce = true;
            this.resolveListed();
          }
          this.opts.logger.info({ resource: this.name, mode, resourceVersion: rv }, 'list done');
        }
        const { delivered, stalled } = await this.watchOnce(signal);
        if (signal.aborted) break;
        // The watch was established and ended without 410: the resourceVersion was good.
        goneStreak = 0;
        if (delivered > 0) attempt = 0;
        if (stalled) {
          this.counters.stalls++;
          this.setHealthy(false);
          this.opts.logger.warn(
            { resource: this.name, stallTimeoutMs: this.opts.stallTimeoutMs, resourceVersion: this.resourceVersion },
            'watch stalled; restarting it',
          );
        } else if (delivered === 0) {
          await backoff(undefined, 'watch ended with no event');
        }
      } catch (err) {
        if (signal.aborted) break;
        if (isGone(err)) {
          this.counters.gone++;
          this.opts.logger.info(
            { resource: this.name, resourceVersion: this.resourceVersion },
            'resourceVersion expired (410); relisting',
          );
          // The first 410 relists at once; 410s in a row (no watch established between) back off.
          this.resourceVersion = undefined;
          if (goneStreak++ > 0) await backoff(err, 'relist');
          continue;
        }
        this.counters.errors++;
        this.setHealthy(false);
        await backoff(err, this.resourceVersion === undefined ? 'list' : 'watch');
      }
    }
  }

  private healthy = true;

  private setHealthy(healthy: boolean): void {
    if (this.healthy === healthy) return;
    this.healthy = healthy;
    this.handler.health?.(healthy);
  }

  /** The selectors and the metadata-only ask, shared by the list and the watch it resumes. */
  private selection(): { fieldSelector?: string; labelSelector?: string; metadataOnly?: boolean } {
    const { fieldSelector, labelSelector, metadataOnly } = this.opts;
    return {
      ...(fieldSelector === undefined ? {} : { fieldSelector }),
      ...(labelSelector === undefined ? {} : { labelSelector }),
      ...(metadataOnly ? { metadataOnly } : {}),
    };
  }

  private async listAll(mode: ListMode, signal: AbortSignal): Promise<string> {
    const { watcher, resource, namespace, pageSize } = this.opts;
    this.handler.listStart(mode);
    let cont: string | undefined;
    let rv = '';
    do {
      const page = await watcher.list(resource, {
        ...(namespace === undefined ? {} : { namespace }),
        ...this.selection(),
        limit: pageSize,
        ...(cont === undefined ? {} : { continue: cont }),
      });
      if (signal.aborted) return rv;
      // Every page of a paginated list is served from one snapshot with one resourceVersion.
      rv = page.resourceVersion;
      for (const item of page.items) this.handler.listItem(item, mode);
      cont = page.continue || undefined;
    } while (cont !== undefined);
    this.handler.listEnd(mode);
    return rv;
  }

  private async watchOnce(signal: AbortSignal): Promise<{ delivered: number; stalled: boolean }> {
    const { watcher, resource, namespace, clock, stallTimeoutMs } = this.opts;
    const ac = new AbortController();
    const onAbort = () => ac.abort();
    signal.addEventListener('abort', onAbort, { once: true });
    let last = clock.now();
    let delivered = 0;
    let stalled = false;
    let timer: TimerHandle | undefined;
    const check = () => {
      const idle = clock.now() - last;
      if (idle >= stallTimeoutMs) {
        timer = undefined;
        stalled = true;
        ac.abort();
      } else {
        timer = clock.setTimeout(check, stallTimeoutMs - idle);
      }
    };
    timer = clock.setTimeout(check, stallTimeoutMs);
    const t = this.opts.watchTimeoutSeconds;
    const timeoutSeconds = Math.max(1, Math.floor(t + t * this.opts.random()));
    this.counters.watches++;
    try {
      await watcher.watch(
        resource,
        {
          resourceVersion: this.resourceVersion!,
          allowWatchBookmarks: true,
          timeoutSeconds,
          ...(namespace === undefined ? {} : { namespace }),
          ...this.selection(),
        },
        (event) => {
          if (ac.signal.aborted) return;
          last = clock.now();
          delivered++;
          this.setHealthy(true);
          if (event.type !== 'BOOKMARK') this.handler.event(event);
          const rv = event.object?.metadata?.resourceVersion;
          if (rv) this.resourceVersion = rv;
        },
        ac.signal,
      );
    } catch (err) {
      // An adapter may reject on abort instead of resolving; that is not a failure here.
      if (!ac.signal.aborted) throw err;
    } finally {
      if (timer !== undefined) clock.clearTimeout(timer);
      signal.removeEventListener('abort', onAbort);
    }
    return { delivered, stalled };
  }
}
