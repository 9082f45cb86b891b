/**
 * An {@link EventSender} and a {@link MessageRequeuer} that keep what they are given, for tests
 * and local runs.
 *
 * @module
 */
import type { KappEvent } from '../../../events/schema.js';
import type { PipelineStage } from '../api/functions.js';
import type { EventSender, MessageRequeuer, RequeuedMessage } from './port.js';

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

/** Records every requeue call's messages in {@link MemoryMessageRequeuer.calls}, in order. */
export class MemoryMessageRequeuer implements MessageRequeuer {
  /** The messages of each accepted call, oldest first. */
  readonly calls: RequeuedMessage[][] = [];

  /**
   * @param fail - when set, `requeue` rejects with what it returns for a call's messages instead
   *   of recording them (simulates a transport outage); return `undefined` to accept.
   */
  constructor(private readonly fail?: (messages: readonly RequeuedMessage[]) => Error | undefined) {}

  /** {@inheritDoc MessageRequeuer.requeue} */
  async requeue(messages: readonly RequeuedMessage[]): Promise<void> {
    const err = this.fail?.(messages);
    if (err) throw err;
    this.calls.push([...messages]);
  }
}
