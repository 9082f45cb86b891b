/**
 * The embedded runtime's in-process pipeline driver.
 *
 * {@link EmbeddedPipeline} runs the stages of one object back to back on a
 * {@link KeyedQueue}, so one object has at most one run at a time, events that arrive
 * meanwhile coalesce into one follow-up ({@link coalesceEvents}), and a crashed stage is
 * retried from that stage. Each stage runs through `dispatchWithRetryBound`: `dispatchEvent`,
 * the routing every Lambda function entry uses, with the same retry bound.
 */
import { type KappEvent, objectRefOf, orderingKey } from '../../events/schema.js';
import { coalesceEvents } from '../lib/lease/coalesce.js';
import { type DispatchDeps, dispatchWithRetryBound } from '../lib/pipeline/dispatch.js';
import { DEFAULT_MAX_ATTEMPTS } from '../lib/pipeline/retry-bound.js';
import { KeyedQueue, RetryFrom } from './keyed-queue.js';

/** The coalescing rule, shared with the Lambda run lease (`../lib/lease/`). */
export { coalesceEvents };

/** Options of {@link EmbeddedPipeline}. */
export interface EmbeddedPipelineOptions {
  /** Objects reconciled at once. Default 4 (packaged kapp-controller's `-concurrency`). */
  concurrency?: number;
  /** First retry delay after a crash, ms. Default 500. */
  baseRetryMs?: number;
  /** Retry delay cap, ms. Default 30 000. */
  maxRetryMs?: number;
  /**
   * Attempts of a run before it ends with a final failed status (`retry-bound.ts`). Default
   * {@link DEFAULT_MAX_ATTEMPTS}.
   */
  maxAttempts?: number;
}

/**
 * The embedded default's transport and driver: accepts forwarder events (it implements the
 * forwarder's `Transport`) and runs each object's stages in process.
 */
export class EmbeddedPipeline {
  private readonly queue: KeyedQueue<KappEvent>;
  private readonly maxAttempts: number;

  constructor(
    private readonly deps: DispatchDeps,
    opts: EmbeddedPipelineOptions = {},
  ) {
    this.maxAttempts = opts.maxAttempts ?? DEFAULT_MAX_ATTEMPTS;
    this.queue = new KeyedQueue<KappEvent>((_key, item, attempt) => this.run(item, attempt), {
      concurrency: opts.concurrency ?? 4,
      baseRetryMs: opts.baseRetryMs,
      maxRetryMs: opts.maxRetryMs,
      coalesce: coalesceEvents,
      onError: (key, err, attempt) =>
        deps.log.error(
          { object: key, attempt, error: err instanceof Error ? err.message : String(err) },
          'stage crashed; retrying',
        ),
    });
  }

  /** Accepts a batch of events (the forwarder's `Transport.send`). Never rejects. */
  async send(events: readonly KappEvent[]): Promise<void> {
    for (const e of events) this.queue.add(orderingKey(objectRefOf(e)), e);
  }

  /** Resolves when no object runs or waits (crash retries included). */
  async idle(): Promise<void> {
    await this.queue.idle();
  }

  /** Stops accepting events; running stages finish. */
  close(): void {
    this.queue.close();
  }

  /** Objects running now and waiting. */
  get stats(): { running: number; waiting: number } {
    return { running: this.queue.running, waiting: this.queue.waiting };
  }

  private async run(first: KappEvent, attempt: number): Promise<void> {
    let ev: KappEvent | undefined = first;
    while (ev) {
      const current: KappEvent = ev;
      try {
        ev = (await dispatchWithRetryBound(current, this.deps, { attempt, maxAttempts: this.maxAttempts })).next;
      } catch (err) {
        throw new RetryFrom(current, err);
      }
    }
  }
}
