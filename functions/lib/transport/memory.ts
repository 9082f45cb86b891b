/**
 * An {@link EventSender} that keeps what it is given, for tests and local runs.
 *
 * @module
 */
import type { KappEvent } from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import type { EventSender } from './port.js';

/** One accepted event. */
export interface SentEvent {
  stage: PipelineStage;
  event: KappEvent;
}

/** Records every event in {@link MemoryEventSender.sent}, in order. */
export class MemoryEventSender implements EventSender {
  /** Accepted events, oldest first. */
  readonly sent: SentEvent[] = [];

  /**
   * @param fail - when set, `send` rejects with what it returns for an event instead of
   *   recording it (simulates a transport outage); return `undefined` to accept.
   */
  constructor(private readonly fail?: (stage: PipelineStage, event: KappEvent) => Error | undefined) {}

  /** {@inheritDoc EventSender.send} */
  async send(stage: PipelineStage, event: KappEvent): Promise<void> {
    const err = this.fail?.(stage, event);
    if (err) throw err;
    this.sent.push({ stage, event });
  }
}
